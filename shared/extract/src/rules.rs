//! The default extractor: KeyMem's store-time extraction step done with rules.
//!
//! It is deliberately cheap (one tokenisation per field, constant work per token) so the
//! extractor service keeps up with ingest without a model.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Field, Keyword, ReferenceState, TimeRef, Turn};

use crate::lexicon::{
    ambiguous_place, event_lemma, gazetteer_match, is_gazetteer_place, is_location_cue,
    is_motion_word, is_place_noun,
};
use crate::names::name_runs;
use crate::resolve::{
    eq_ci, push_stacks, Resolver, KIND_ENTITY, KIND_EVENT, KIND_LOCATION, KIND_TIME,
};
use crate::text::{is_stopword, stem, tokenize, TokKind, Token};
use crate::time::scan;
use crate::{ExtractError, Extractor};

/// Rule-based [`Extractor`]; stateless apart from the caller's [`ReferenceState`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleExtractor {
    resolver: Resolver,
}

impl RuleExtractor {
    pub fn new() -> Self {
        Self::default()
    }

    /// The synchronous core, for callers that batch on their own threads.
    pub fn extract_sync(&self, turn: &Turn, state: &mut ReferenceState) -> Extraction {
        let mut acc = Acc::default();
        for sp in [&turn.user_speaker, &turn.assistant_speaker]
            .into_iter()
            .flatten()
        {
            let sp = sp.trim();
            if !sp.is_empty() {
                acc.entity(sp);
            }
        }
        // The assistant field may refer to what the user field just introduced; it is resolved
        // against a copy of the state that already holds the user field's items.
        let mut scratch: Option<ReferenceState> = None;
        for (field, text) in turn.fields() {
            if text.trim().is_empty() {
                continue;
            }
            let (speaker, other) = match field {
                Field::User => (
                    turn.user_speaker.as_deref(),
                    turn.assistant_speaker.as_deref(),
                ),
                Field::Assistant => (
                    turn.assistant_speaker.as_deref(),
                    turn.user_speaker.as_deref(),
                ),
            };
            let st: &ReferenceState = scratch.as_ref().unwrap_or(state);
            self.extract_field(text, field, speaker, other, st, turn.timestamp, &mut acc);
            if field == Field::User && !turn.assistant.trim().is_empty() {
                let mut s = state.clone();
                push_stacks(&mut s, &acc.ex);
                scratch = Some(s);
            }
        }
        let mut ex = acc.ex;
        ex.event_time = Some(
            ex.times
                .first()
                .and_then(|t| t.start.and_hms_opt(0, 0, 0))
                .map(|d| d.and_utc())
                .unwrap_or(turn.timestamp),
        );
        ex.extractor = "rules".to_string();
        self.resolver.update(state, &ex);
        ex
    }

    #[allow(clippy::too_many_arguments)]
    fn extract_field(
        &self,
        text: &str,
        field: Field,
        speaker: Option<&str>,
        other: Option<&str>,
        st: &ReferenceState,
        anchor: DateTime<Utc>,
        acc: &mut Acc,
    ) {
        let toks = tokenize(text);
        let n = toks.len();
        let matches = scan(&toks, anchor.date_naive());
        let mut in_time = vec![false; n];
        for m in &matches {
            in_time[m.first..=m.last].iter_mut().for_each(|x| *x = true);
        }
        let resolved = self
            .resolver
            .resolve_tokens(&toks, text, field, speaker, other, st, anchor);
        // Anaphors ("back then", "there") are not content: keep them out of keywords.
        let mut in_ref = vec![false; n];
        for &(a, b) in &resolved.spans {
            in_ref[a..=b.min(n - 1)].iter_mut().for_each(|x| *x = true);
        }

        let known = |w: &str| {
            speaker.is_some_and(|s| eq_ci(s, w))
                || other.is_some_and(|s| eq_ci(s, w))
                || st.entities.iter().any(|e| eq_ci(e, w))
        };

        // Names: entities, or places when the gazetteer or a place cue says so. Places are
        // collected with their positions so they come out in text order.
        let mut locs: Vec<(usize, String)> = Vec::new();
        let mut in_name = vec![false; n];
        for run in name_runs(&toks, &known, false) {
            if in_time[run.first..=run.last].iter().any(|x| *x) {
                continue;
            }
            in_name[run.first..=run.last]
                .iter_mut()
                .for_each(|x| *x = true);
            let gaz = is_gazetteer_place(&run.lower);
            let is_known = known(&run.lower);
            let cue = location_cue_before(&toks, run.first);
            let place = !is_known
                && !run.possessive
                && ((gaz && (!ambiguous_place(&run.lower) || cue))
                    || (cue && !run.all_caps(&toks)));
            if place {
                locs.push((run.first, run.lower.clone()));
            } else {
                acc.entity(&run.text);
            }
            let words: Vec<&Token<'_>> = toks[run.first..=run.last]
                .iter()
                .filter(|t| t.is_word())
                .collect();
            if words.len() >= 2 {
                let key = words
                    .iter()
                    .map(|t| stem(t.base()))
                    .collect::<Vec<_>>()
                    .join(" ");
                let text = words.iter().map(|t| t.base()).collect::<Vec<_>>().join(" ");
                acc.keyword(key, text);
            }
        }

        // Lower-case gazetteer places ("we flew to paris") and generic place nouns.
        let word_at = |k: usize| {
            toks.get(k)
                .filter(|t| t.kind == TokKind::Word)
                .map(|t| t.base())
        };
        let mut i = 0;
        while i < n {
            let t = &toks[i];
            if t.kind != TokKind::Word || in_name[i] || in_time[i] {
                i += 1;
                continue;
            }
            let len = gazetteer_match(|k| {
                if k == 0 || !in_name.get(i + k).copied().unwrap_or(true) {
                    word_at(i + k)
                } else {
                    None
                }
            });
            if len > 0 {
                let phrase = toks[i..i + len]
                    .iter()
                    .map(|t| t.base())
                    .collect::<Vec<_>>()
                    .join(" ");
                let ok = if ambiguous_place(&phrase) {
                    t.cap() && location_cue_before(&toks, i)
                } else {
                    !known(&phrase)
                };
                if ok {
                    locs.push((i, phrase));
                    i += len;
                    continue;
                }
            }
            if is_place_noun(t.base()) {
                locs.push((i, t.base().to_string()));
            }
            i += 1;
        }
        locs.sort_by_key(|(p, _)| *p);
        for (_, l) in locs {
            acc.location(l);
        }

        // Events: a common event verb and the object that follows it.
        for i in 0..n {
            let t = &toks[i];
            if t.kind != TokKind::Word || in_time[i] {
                continue;
            }
            let Some(lemma) = event_lemma(&t.lower) else {
                continue;
            };
            let prev = i
                .checked_sub(1)
                .and_then(|k| toks.get(k))
                .filter(|p| p.is_word());
            if prev.is_some_and(|p| is_determiner(&p.lower)) {
                continue; // "my painting", "the run"
            }
            let mut k = i + 1;
            let mut skipped = 0;
            while k < n && skipped < 3 && toks[k].is_word() && is_object_skip(&toks[k].lower) {
                k += 1;
                skipped += 1;
            }
            let mut words: Vec<&str> = Vec::new();
            while k < n
                && words.len() < 3
                && toks[k].is_word()
                && !in_time[k]
                && is_content(toks[k].base())
            {
                let b = toks[k].base();
                // Past the head word, a participle or adverb starts a new phrase ("puppy named").
                if !words.is_empty()
                    && (b.ends_with("ed") || b.ends_with("ing") || b.ends_with("ly"))
                {
                    break;
                }
                words.push(b);
                k += 1;
            }
            if !words.is_empty() {
                acc.event(format!("{lemma} {}", words.join(" ")));
            }
        }

        // Keywords: content words and adjacent content-word pairs within a clause.
        let mut prev: Option<(String, &str)> = None;
        for i in 0..n {
            let t = &toks[i];
            if !t.is_word() || in_time[i] || in_ref[i] || !is_content(t.base()) {
                prev = None;
                continue;
            }
            let base = t.base();
            let key = if t.kind == TokKind::Num {
                base.to_string()
            } else {
                stem(base)
            };
            acc.keyword(key.clone(), base.to_string());
            if let Some((pk, pt)) = prev.take() {
                acc.keyword(format!("{pk} {key}"), format!("{pt} {base}"));
            }
            prev = Some((key, base));
        }

        // References: their targets join this turn's entities, places and times.
        for r in resolved.refs {
            match r.kind.as_str() {
                KIND_ENTITY => acc.entity(&r.resolved),
                KIND_LOCATION => acc.location(r.resolved.to_lowercase()),
                KIND_EVENT => acc.event(r.resolved.clone()),
                KIND_TIME => {
                    if let Some(t) = st.times.iter().find(|t| t.key() == r.resolved) {
                        acc.time(TimeRef {
                            text: r.mention.clone(),
                            ..t.clone()
                        });
                    }
                }
                _ => {}
            }
            acc.ex.references.push(r);
        }
        for m in &matches {
            acc.time(m.to_time_ref(&toks, text));
        }
    }
}

#[async_trait::async_trait]
impl Extractor for RuleExtractor {
    fn name(&self) -> &str {
        "rules"
    }

    async fn extract(
        &self,
        turn: &Turn,
        state: &mut ReferenceState,
    ) -> Result<Extraction, ExtractError> {
        Ok(self.extract_sync(turn, state))
    }
}

/// A word worth indexing: not a function word, not a lone letter, not noise.
pub(crate) fn is_content(base: &str) -> bool {
    if base.is_empty() || base.len() > 40 || is_stopword(base) {
        return false;
    }
    if base.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    base.chars().filter(|c| c.is_alphanumeric()).count() >= 3
}

fn is_determiner(lower: &str) -> bool {
    matches!(
        lower,
        "a" | "an"
            | "the"
            | "my"
            | "your"
            | "his"
            | "her"
            | "our"
            | "their"
            | "its"
            | "this"
            | "that"
            | "these"
            | "those"
            | "some"
            | "any"
            | "no"
            | "every"
    )
}

fn is_object_skip(lower: &str) -> bool {
    is_determiner(lower)
        || matches!(
            lower,
            "to" | "for" | "at" | "into" | "on" | "in" | "with" | "up" | "out" | "a" | "off"
        )
}

/// Whether the word before `first` (past an optional "the") puts a place there.
pub(crate) fn location_cue_before(toks: &[Token<'_>], first: usize) -> bool {
    let mut j = first;
    let word = |k: usize| {
        toks.get(k)
            .filter(|t| t.is_word())
            .map(|t| t.lower.as_str())
    };
    if j == 0 {
        return false;
    }
    j -= 1;
    if word(j) == Some("the") {
        if j == 0 {
            return false;
        }
        j -= 1;
    }
    let Some(p) = word(j) else { return false };
    if is_location_cue(p) {
        return true;
    }
    if p == "to" {
        return (1..=2).any(|b| j.checked_sub(b).and_then(word).is_some_and(is_motion_word));
    }
    false
}

/// The extraction under construction, with the dedupe sets that go with it.
#[derive(Default)]
struct Acc {
    ex: Extraction,
    kw_keys: HashSet<String>,
}

impl Acc {
    fn keyword(&mut self, key: String, text: String) {
        if !self.kw_keys.contains(&key) {
            self.kw_keys.insert(key.clone());
            self.ex.keywords.push(Keyword { key, text });
        }
    }

    fn entity(&mut self, e: &str) {
        if !e.is_empty() && !self.ex.entities.iter().any(|x| eq_ci(x, e)) {
            self.ex.entities.push(e.to_string());
        }
    }

    fn location(&mut self, l: String) {
        if !l.is_empty() && !self.ex.locations.contains(&l) {
            self.ex.locations.push(l);
        }
    }

    fn event(&mut self, e: String) {
        if !self.ex.events.contains(&e) {
            self.ex.events.push(e);
        }
    }

    fn time(&mut self, t: TimeRef) {
        if !self.ex.times.iter().any(|x| x.key() == t.key()) {
            self.ex.times.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, TimeZone};
    use recollect_model::{MemoryId, TenantId};

    fn turn(user: &str, assistant: &str, us: &str, asp: &str, pos: u64) -> Turn {
        let tenant = TenantId::default_tenant();
        let ts = Utc.with_ymd_and_hms(2023, 5, 8, 13, 56, 0).unwrap();
        Turn {
            memory_id: MemoryId::derive(&tenant, "c", &pos.to_string()),
            tenant,
            conversation_id: "c".into(),
            turn_id: pos.to_string(),
            position: pos,
            user: user.into(),
            assistant: assistant.into(),
            user_speaker: Some(us.into()),
            assistant_speaker: Some(asp.into()),
            timestamp: ts,
            recorded_at: ts,
            metadata: Default::default(),
            user_id: None,
            agent_id: None,
            version: 1,
            first_recorded_at: None,
            expired_at: None,
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
        }
    }

    fn keys(ex: &Extraction) -> Vec<&str> {
        ex.keywords.iter().map(|k| k.key.as_str()).collect()
    }

    #[test]
    fn support_group_turn() {
        let x = RuleExtractor::new();
        assert_eq!(x.name(), "rules");
        let mut st = ReferenceState::default();
        let t = turn(
            "I went to the LGBTQ support group yesterday and it was so powerful.",
            "Wow, that's amazing Caroline! What happened there?",
            "Caroline",
            "Melanie",
            1,
        );
        let ex = block_on(x.extract(&t, &mut st)).unwrap();
        assert_eq!(ex.extractor, "rules");
        assert_eq!(ex.entities, vec!["Caroline", "Melanie", "LGBTQ"]);
        let k = keys(&ex);
        for want in [
            "lgbtq",
            "support",
            "group",
            "power",
            "lgbtq support",
            "support group",
        ] {
            assert!(k.contains(&want), "missing {want} in {k:?}");
        }
        assert!(!k.contains(&"yesterday"));
        assert!(!k.iter().any(|k| *k == "went" || *k == "the" || *k == "wow"));
        assert_eq!(
            ex.keywords
                .iter()
                .find(|k| k.key == "support group")
                .unwrap()
                .text,
            "support group"
        );
        assert_eq!(ex.events, vec!["go lgbtq support group"]);
        assert_eq!(ex.times.len(), 1);
        assert_eq!(ex.times[0].text, "yesterday");
        assert_eq!(
            ex.times[0].start,
            NaiveDate::from_ymd_opt(2023, 5, 7).unwrap()
        );
        assert_eq!(
            ex.event_time,
            Some(Utc.with_ymd_and_hms(2023, 5, 7, 0, 0, 0).unwrap())
        );
        // State was updated with this turn.
        assert_eq!(st.turns_seen, 1);
        assert_eq!(st.entities[0], "LGBTQ");
        assert_eq!(st.times[0].key(), "2023-05-07");
        assert_eq!(st.events[0], "go lgbtq support group");
        assert!(st.bindings.contains_key("caroline"));
    }

    #[test]
    fn places_and_references_across_turns() {
        let x = RuleExtractor::new();
        let mut st = ReferenceState::default();
        let ex1 = x.extract_sync(
            &turn(
                "My sister Anna moved to Boston last month. She loves the beach.",
                "",
                "Jon",
                "Gina",
                1,
            ),
            &mut st,
        );
        assert!(ex1.entities.contains(&"Anna".to_string()));
        assert!(!ex1.entities.contains(&"Boston".to_string()));
        assert_eq!(ex1.locations, vec!["boston", "beach"]);
        assert!(ex1.events.contains(&"move boston".to_string()));
        assert_eq!(ex1.times[0].key(), "2023-04-01/2023-04-30");
        let ex2 = x.extract_sync(
            &turn(
                "Did she like it there? Back then I was in Rome.",
                "Yes, she went to the museum in Paris too.",
                "Gina",
                "Jon",
                2,
            ),
            &mut st,
        );
        let refs: Vec<(&str, &str, &str)> = ex2
            .references
            .iter()
            .map(|r| (r.mention.as_str(), r.kind.as_str(), r.resolved.as_str()))
            .collect();
        assert!(refs.contains(&("she", "entity", "Anna")), "{refs:?}");
        assert!(refs.contains(&("there", "location", "boston")), "{refs:?}");
        assert!(
            refs.contains(&("Back then", "time", "2023-04-01/2023-04-30")),
            "{refs:?}"
        );
        assert_eq!(
            ex2.references
                .iter()
                .filter(|r| r.field == Field::Assistant)
                .count(),
            1
        );
        assert!(ex2.entities.contains(&"Anna".to_string()));
        assert!(ex2.locations.contains(&"rome".to_string()));
        assert!(ex2.locations.contains(&"museum".to_string()));
        assert!(ex2.locations.contains(&"paris".to_string()));
        assert!(ex2.times.iter().any(|t| t.text == "Back then"));
        // The context-relative time is the turn's first time, so it sets event_time.
        assert_eq!(
            ex2.event_time,
            Some(Utc.with_ymd_and_hms(2023, 4, 1, 0, 0, 0).unwrap())
        );
    }

    #[test]
    fn no_time_means_turn_time() {
        let x = RuleExtractor::new();
        let mut st = ReferenceState::default();
        let t = turn("I adopted a puppy named Max!", "", "Jon", "Gina", 1);
        let ex = x.extract_sync(&t, &mut st);
        assert_eq!(ex.event_time, Some(t.timestamp));
        assert!(
            ex.events.contains(&"adopt puppy".to_string()),
            "{:?}",
            ex.events
        );
        assert!(ex.entities.contains(&"Max".to_string()));
    }

    #[test]
    fn empty_and_speakerless_turns() {
        let x = RuleExtractor::new();
        let mut st = ReferenceState::default();
        let mut t = turn("", "", "A", "B", 1);
        t.user_speaker = None;
        t.assistant_speaker = None;
        let ex = x.extract_sync(&t, &mut st);
        assert!(ex.entities.is_empty() && ex.keywords.is_empty() && ex.times.is_empty());
        assert_eq!(st.turns_seen, 1);
    }

    #[test]
    fn throughput() {
        let x = RuleExtractor::new();
        let mut st = ReferenceState::default();
        let users = [
            "Hey Melanie! I went to the LGBTQ support group yesterday and it was so powerful, honestly.",
            "Last Friday I took my kids to the beach near Santa Cruz; they built a huge sandcastle together.",
            "I've been painting a lot lately, mostly sunsets. Back then I never had the time for it.",
        ];
        let assistants = [
            "That's amazing, Caroline! I'm so proud of you for going. What did they talk about there?",
            "Sounds lovely! We're planning a camping trip next month in the mountains with the whole family.",
            "Your paintings are beautiful. She told me you started two weeks ago, is that right?",
        ];
        let turns: Vec<Turn> = (0..1000)
            .map(|i| {
                turn(
                    users[i % 3],
                    assistants[(i / 3) % 3],
                    "Caroline",
                    "Melanie",
                    i as u64,
                )
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut n = 0;
        for t in &turns {
            n += x.extract_sync(t, &mut st).keywords.len();
        }
        let dt = t0.elapsed().as_secs_f64();
        let rate = turns.len() as f64 / dt;
        println!("rule extractor: {rate:.0} turns/s ({n} keywords)");
        assert!(rate > 200.0, "{rate} turns/s");
    }
}
