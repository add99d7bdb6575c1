//! BM25, in one place: the tokeniser, the sparse dimension of a term, a document's term weights
//! (the embedder's, at store time) and a query's (recall's). IDF is the vector index's part
//! (Qdrant's IDF modifier on the `lexical` vector), so neither side here applies it.
//!
//! Store and query time must tokenise alike, so both call [`terms`]; a change to it changes
//! every stored lexical vector (a reindex).

use std::collections::HashMap;

use recollect_model::SparseVector;

use crate::text::{is_apostrophe, push_lower, stem_lower, strip_clitic, STOPSET};

/// Term-frequency saturation.
pub const K1: f32 = 1.2;
/// How much of the length normalisation applies.
pub const B: f32 = 0.75;
/// Typical terms per turn after stop-word removal; documents are length-normalised against it.
pub const AVG_LEN: f32 = 24.0;

/// Tokens longer than this are treated as noise (URLs, base64, keyboard mashing): they would
/// only bloat the sparse vocabulary.
const MAX_TERM_BYTES: usize = 64;

/// Stemmed content terms: lower case, clitics stripped, stopwords dropped, numbers kept.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::with_capacity(32);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() {
            push_lower(&mut buf, c);
        } else if is_apostrophe(c)
            && !buf.is_empty()
            && chars.peek().is_some_and(|n| n.is_alphanumeric())
        {
            buf.push('\'');
        } else if !buf.is_empty() {
            emit_term(&buf, &mut out);
            buf.clear();
        }
    }
    if !buf.is_empty() {
        emit_term(&buf, &mut out);
    }
    out
}

fn emit_term(raw: &str, out: &mut Vec<String>) {
    if raw.len() > MAX_TERM_BYTES {
        return;
    }
    let w = strip_clitic(raw);
    if w.is_empty() || STOPSET.contains(w) || STOPSET.contains(raw) {
        return;
    }
    if w.bytes().all(|b| b.is_ascii_digit()) {
        out.push(w.to_string());
        return;
    }
    let mut it = w.chars();
    // A lone letter carries nothing for retrieval.
    if it.next().is_some() && it.next().is_none() {
        return;
    }
    out.push(stem_lower(w));
}

/// Stable 32-bit FNV-1a hash of a term: the sparse-vector dimension, identical across
/// processes and releases.
pub fn term_id(term: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in term.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A document's BM25 term weights `tf·(k1 + 1) / (tf + k1·(1 − b + b·len / AVG_LEN))`, by
/// term id in ascending order.
pub fn document(text: &str) -> SparseVector {
    let terms = terms(text);
    let len = terms.len() as f32;
    let mut tf: HashMap<u32, f32> = HashMap::new();
    for t in &terms {
        *tf.entry(term_id(t)).or_default() += 1.0;
    }
    let norm = K1 * (1.0 - B + B * len / AVG_LEN);
    let mut pairs: Vec<(u32, f32)> = tf
        .into_iter()
        .map(|(i, f)| (i, f * (K1 + 1.0) / (f + norm)))
        .collect();
    pairs.sort_by_key(|p| p.0);
    SparseVector {
        indices: pairs.iter().map(|p| p.0).collect(),
        values: pairs.iter().map(|p| p.1).collect(),
    }
}

/// A query's BM25 weights: each distinct term once, weight 1 (the index multiplies in IDF).
pub fn query(text: &str) -> SparseVector {
    query_without(text, &[])
}

/// [`query`] without the terms of `names` (names that tell turns of the scope apart no more
/// than a stopword does; see `recall.lexical_common_name_share`).
pub fn query_without(text: &str, names: &[String]) -> SparseVector {
    let left_out: Vec<u32> = names
        .iter()
        .flat_map(|n| terms(n))
        .map(|t| term_id(&t))
        .collect();
    let mut ids: Vec<u32> = terms(text)
        .iter()
        .map(|t| term_id(t))
        .filter(|id| !left_out.contains(id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    SparseVector {
        values: vec![1.0; ids.len()],
        indices: ids,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_drop_stopwords_and_stem() {
        let t =
            terms("Hey! I don't know, but Caroline's painting classes were really GREAT in 2023.");
        assert_eq!(t, vec!["carolin", "paint", "class", "great", "2023"]);
    }

    #[test]
    fn a_query_leaves_out_the_terms_of_the_names_given() {
        let all = query("What did Melanie Smith paint for Caroline's class?");
        let some = query_without(
            "What did Melanie Smith paint for Caroline's class?",
            &["melanie smith".into(), "Caroline".into()],
        );
        assert_eq!(all.indices.len(), 5);
        let want: Vec<u32> = {
            let mut v = vec![term_id("paint"), term_id("class")];
            v.sort_unstable();
            v
        };
        assert_eq!(some.indices, want);
        assert_eq!(some.values, vec![1.0; 2]);
        assert_eq!(
            query_without("Melanie?", &["Melanie".into()]).indices.len(),
            0
        );
    }

    #[test]
    fn terms_handle_curly_apostrophes_and_unicode() {
        let t = terms("Melanie’s café in Zürich — I’m sure it’s ÉNORME");
        assert_eq!(t[0], "melani");
        assert!(t.contains(&"café".to_string()));
        assert!(t.iter().any(|x| x.starts_with("zürich")));
        assert!(!t.iter().any(|x| x == "i" || x == "it"));
        assert!(t.iter().any(|x| x == "énorm"));
    }

    #[test]
    fn terms_drop_lone_letters_and_overlong_tokens_but_keep_numbers() {
        let long = "x".repeat(MAX_TERM_BYTES + 1);
        let ok = "k".repeat(MAX_TERM_BYTES);
        let t = terms(&format!("b 7 {long} {ok} dogs"));
        assert_eq!(t, vec!["7".to_string(), ok, "dog".to_string()]);
    }

    #[test]
    fn term_id_is_fnv1a() {
        assert_eq!(term_id(""), 0x811c_9dc5);
        assert_eq!(term_id("a"), 0xe40c_292c);
        assert_ne!(term_id("group"), term_id("groups"));
    }

    #[test]
    fn document_weights_saturate_and_normalise_by_length() {
        // "dogs", "dog" and "park" → dog ×2, park ×1; len 3:
        // norm = 1.2·(0.25 + 0.75·3/24) = 0.4125
        // dog  = 2·2.2 / (2 + 0.4125) = 1.823834
        // park = 1·2.2 / (1 + 0.4125) = 1.557522
        let v = document("Dogs, a dog and the park");
        let (dog, park) = (term_id("dog"), term_id("park"));
        let mut want = vec![(dog, 1.823_834f32), (park, 1.557_522f32)];
        want.sort_by_key(|p| p.0);
        assert_eq!(v.indices, want.iter().map(|p| p.0).collect::<Vec<_>>());
        for (got, (_, w)) in v.values.iter().zip(&want) {
            assert!((got - w).abs() < 1e-5, "{got} vs {w}");
        }
        assert_eq!(document("the and of"), SparseVector::default());
    }

    #[test]
    fn query_weights_each_distinct_term_once() {
        let q = query("Dogs or a dog in the park?");
        let mut ids = vec![term_id("dog"), term_id("park")];
        ids.sort_unstable();
        assert_eq!(q.indices, ids);
        assert_eq!(q.values, vec![1.0, 1.0]);
    }
}
