//! SoftTF-IDF (KeyMem §1, Path C): `Σ_i ŝ_i · IDF(k̂_i)` where ŝ_i is the best cosine between
//! query keyword i and a keyword of the set, terms below the floor dropped, and each set keyword
//! serving at most one query keyword.

use std::collections::HashMap;

/// Query keyword i's neighbours: keyword name → cosine (already ≥ the floor).
pub type Neighbours = Vec<HashMap<String, f32>>;

/// `IDF(k) = min(1, log(N / df(k)) / log N)`.
pub fn idf(n: u64, df: u64) -> f32 {
    if n <= 1 || df == 0 {
        return 1.0;
    }
    let (n, df) = (n as f32, df.min(n) as f32);
    ((n / df).ln() / n.ln()).min(1.0)
}

/// SoftTF-IDF of a keyword set against the query keywords' neighbour lists.
pub fn score<'a>(
    neighbours: &Neighbours,
    set: impl IntoIterator<Item = &'a String>,
    idf_of: &HashMap<String, f32>,
) -> f32 {
    let set: Vec<&String> = set.into_iter().collect();
    let mut pairs: Vec<(f32, usize, &String)> = Vec::new();
    for (i, n) in neighbours.iter().enumerate() {
        for k in &set {
            if let Some(&s) = n.get(k.as_str()) {
                pairs.push((s, i, k));
            }
        }
    }
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut used_q = vec![false; neighbours.len()];
    let mut used_k: Vec<&String> = Vec::new();
    let mut total = 0.0;
    for (s, i, k) in pairs {
        if used_q[i] || used_k.contains(&k) {
            continue;
        }
        used_q[i] = true;
        used_k.push(k);
        total += s * idf_of.get(k.as_str()).copied().unwrap_or(1.0);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idf_is_bounded_and_decreasing() {
        assert_eq!(idf(100, 1), 1.0);
        assert!(idf(100, 10) > idf(100, 50));
        assert_eq!(idf(100, 100), 0.0);
        assert_eq!(idf(1, 1), 1.0);
    }

    #[test]
    fn each_set_keyword_serves_one_query_keyword() {
        let n: Neighbours = vec![
            HashMap::from([("dog".to_string(), 0.9f32)]),
            HashMap::from([("dog".to_string(), 0.8f32), ("puppy".to_string(), 0.6f32)]),
        ];
        let idf = HashMap::new();
        let s = score(&n, [&"dog".to_string(), &"puppy".to_string()], &idf);
        assert!((s - 1.5).abs() < 1e-6, "{s}");
        let only_dog = score(&n, [&"dog".to_string()], &idf);
        assert!((only_dog - 0.9).abs() < 1e-6);
    }
}
