//! The category term (docs/RECALL.md, departure 16): a list question names a kind of thing
//! ("What activities has Melanie done with her family?") whose instances the answers name in
//! words of their own ("we went camping"). The whole question's vectors read such a turn weakly;
//! its keywords, read one by one against the category phrase, do not. Two pure steps: each
//! candidate's evidence (its best keyword cosine, among the keywords its named speaker said),
//! then the term added across the head of the ranking.

use std::collections::HashMap;

use recollect_model::{MemoryId, RecalledMemory};

use crate::fetch::Candidate;

/// What the category term reads for one question.
#[derive(Debug, Clone, Default)]
pub struct CategoryQuery {
    /// The scope's keywords nearest to the category phrase: key → cosine.
    pub cosines: HashMap<String, f32>,
    /// What a keyword further away counts: the furthest of `cosines`.
    pub floor: f32,
    /// The question's words, lower case: a speaker among them is the one the question is about.
    pub words: Vec<String>,
}

impl CategoryQuery {
    /// From the keyword search's hits; None when it found none (nothing to read).
    pub fn new(hits: Vec<(String, f32)>, question: &str) -> Option<Self> {
        let floor = hits.iter().map(|(_, c)| *c).reduce(f32::min)?;
        let words = question
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect();
        Some(Self {
            cosines: hits.into_iter().collect(),
            floor,
            words,
        })
    }

    fn names(&self, speaker: Option<&str>) -> bool {
        speaker
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|first| self.words.contains(&first.to_lowercase()))
    }
}

/// Whether a keyword's text was said in `text` (lower case): each of its words stands there
/// whole, ignoring case. Word by word, not as one phrase: the extractor pairs adjacent words
/// across what it drops ("Caroline's art" → "caroline art", "hiking, camping" → "hiking
/// camping"), so a pair's exact text is often not in the field it came from.
fn says(text: &str, keyword: &str) -> bool {
    let mut words = keyword.split_whitespace().peekable();
    words.peek().is_some() && words.all(|w| says_word(text, w))
}

/// Whether `word` stands in `text` (lower case) as a whole word, ignoring case.
fn says_word(text: &str, word: &str) -> bool {
    let word = word.to_lowercase();
    text.match_indices(&word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// A candidate's evidence: the best cosine to the category phrase among its keywords that its
/// named speaker said (every keyword when the question names both speakers or neither; the
/// floor when none is near).
pub fn evidence(cand: &Candidate, q: &CategoryQuery) -> f32 {
    let t = &cand.turn;
    let (user, assistant) = (
        q.names(t.user_speaker.as_deref()),
        q.names(t.assistant_speaker.as_deref()),
    );
    let one = user != assistant;
    // Lower-cased once, and only the field whose keywords count.
    let field = |named: bool, text: &str| {
        if one && named {
            text.to_lowercase()
        } else {
            String::new()
        }
    };
    let (user_text, assistant_text) = (field(user, &t.user), field(assistant, &t.assistant));
    cand.keywords
        .iter()
        .zip(&cand.keyword_texts)
        .filter(|(_, text)| {
            !one || (user && says(&user_text, text)) || (assistant && says(&assistant_text, text))
        })
        .filter_map(|(key, _)| q.cosines.get(key).copied())
        .fold(q.floor, f32::max)
}

/// Every candidate's evidence, by memory id.
pub fn evidences(cands: &[Candidate], q: &CategoryQuery) -> HashMap<MemoryId, f32> {
    cands
        .iter()
        .map(|c| (c.turn.memory_id, evidence(c, q)))
        .collect()
}

/// Adds `weight` × (evidence − the head's median evidence) to each of the first `head`
/// results that has evidence, and sorts those again (stable: ties keep their order). Centred
/// on the median, the term moves results within the head without lifting or sinking the head
/// as a whole against the rest.
pub fn apply(ranked: &mut [RecalledMemory], head: usize, weight: f32) {
    let n = head.min(ranked.len());
    let head = &mut ranked[..n];
    let mut values: Vec<f32> = head.iter().filter_map(|m| m.score_parts.category).collect();
    if values.len() < 2 || weight == 0.0 {
        return;
    }
    values.sort_by(f32::total_cmp);
    let median = values[values.len() / 2];
    for m in head.iter_mut() {
        if let Some(e) = m.score_parts.category {
            m.score += weight * (e - median);
        }
    }
    head.sort_by(|a, b| b.score.total_cmp(&a.score));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::candidate;

    fn query(hits: &[(&str, f32)], question: &str) -> CategoryQuery {
        CategoryQuery::new(
            hits.iter().map(|(k, c)| (k.to_string(), *c)).collect(),
            question,
        )
        .unwrap()
    }

    fn said(position: u64, user: &str, assistant: &str, keywords: &[(&str, &str)]) -> Candidate {
        let mut c = candidate(position);
        c.turn.user = user.into();
        c.turn.assistant = assistant.into();
        c.keywords = keywords.iter().map(|(k, _)| k.to_string()).collect();
        c.keyword_texts = keywords.iter().map(|(_, t)| t.to_string()).collect();
        c
    }

    #[test]
    fn words_stand_whole() {
        assert!(says("we went camping, twice.", "Camping"));
        assert!(says("camping", "camping"));
        assert!(!says("campings", "camping"));
        assert!(!says("decamping", "camping"));
        assert!(says("new shoes and a hat", "new shoes"));
        assert!(says("caroline's art is lovely", "caroline art"));
        assert!(says("hiking, camping and more", "hiking camping"));
        assert!(!says("hiking and more", "hiking camping"));
        assert!(!says("anything", ""));
        assert!(!says("anything", "  "));
    }

    #[test]
    fn the_named_speakers_keywords_count_and_the_others_do_not() {
        // Ann speaks the user field, Bob the assistant's (testing::turn).
        let q = query(
            &[("camp", 0.6), ("paint", 0.5), ("weather", 0.2)],
            "What activities has Ann done?",
        );
        let ann_camps = said(
            1,
            "We went camping",
            "Nice weather",
            &[("camp", "camping"), ("weather", "weather")],
        );
        let bob_camps = said(
            2,
            "Nice weather",
            "We went camping",
            &[("camp", "camping"), ("weather", "weather")],
        );
        let far = said(3, "Taxes again", "", &[("tax", "Taxes")]);
        assert_eq!(evidence(&ann_camps, &q), 0.6);
        assert_eq!(evidence(&bob_camps, &q), 0.2);
        assert_eq!(
            evidence(&far, &q),
            0.2,
            "a keyword not among the nearest counts as the floor"
        );

        // Both named, or neither: every keyword counts.
        let both = query(
            &[("camp", 0.6), ("weather", 0.2)],
            "What do Ann and Bob like?",
        );
        assert_eq!(evidence(&bob_camps, &both), 0.6);
        let neither = query(
            &[("camp", 0.6), ("weather", 0.2)],
            "What activities are fun?",
        );
        assert_eq!(evidence(&bob_camps, &neither), 0.6);

        // A name outside ASCII is matched in any case too: Élodie's keywords only.
        let mut elodie_says_weather = bob_camps.clone();
        elodie_says_weather.turn.user_speaker = Some("Élodie".into());
        let elodie = query(
            &[("camp", 0.6), ("weather", 0.2)],
            "What activities has ÉLODIE done?",
        );
        assert_eq!(evidence(&elodie_says_weather, &elodie), 0.2);
    }

    #[test]
    fn no_hits_no_query() {
        assert!(CategoryQuery::new(vec![], "What pets?").is_none());
    }

    #[test]
    fn the_term_reorders_the_head_around_its_median_and_leaves_the_rest() {
        let mem = |id: u64, score: f32, e: Option<f32>| {
            let mut m = crate::testing::memory(id, "t", score);
            m.score_parts.category = e;
            m
        };
        let mut ranked = vec![
            mem(1, 3.0, Some(0.2)),
            mem(2, 2.9, Some(0.3)),
            mem(3, 2.8, Some(0.9)),
            mem(4, 5.0, Some(0.9)), // beyond the head: untouched
        ];
        apply(&mut ranked, 3, 0.5);
        let order: Vec<u64> = ranked.iter().map(|m| m.turn_id.parse().unwrap()).collect();
        assert_eq!(order, vec![3, 1, 2, 4]);
        // The median (0.3) result keeps its score; the others move by 0.5 × their distance.
        assert!((ranked[0].score - 3.1).abs() < 1e-6);
        assert!((ranked[1].score - 2.95).abs() < 1e-6);
        assert!((ranked[2].score - 2.9).abs() < 1e-6);
        assert_eq!(ranked[3].score, 5.0);

        let mut unchanged = ranked.clone();
        apply(&mut unchanged, 3, 0.0);
        assert_eq!(unchanged, ranked);
    }
}
