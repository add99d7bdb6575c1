//! The KeyMem reference-resolution state machine.
//!
//! Anaphors ("she", "there", "back then") carry no retrievable words; resolving them at store
//! time against recency stacks lets the turn be found by the entity, place or date it is about.
//! A resolution is only accepted when its target is in the matching stack, which keeps the
//! machine conservative: a wrong link is worse than none.

use chrono::{DateTime, Utc};
use recollect_model::{Binding, Extraction, Field, Reference, ReferenceState, TimeRef};

use crate::text::{is_stopword, tokenize, TokKind, Token};

pub const ENTITY_LIMIT: usize = 10;
pub const LOCATION_LIMIT: usize = 4;
pub const EVENT_LIMIT: usize = 4;
pub const TIME_LIMIT: usize = 4;
/// Turns a binding stays usable after the turn that made it.
pub const BINDING_TTL: u64 = 3;

pub const KIND_ENTITY: &str = "entity";
pub const KIND_LOCATION: &str = "location";
pub const KIND_EVENT: &str = "event";
pub const KIND_TIME: &str = "time";

/// Resolutions with the token spans of their mentions (so extractors can skip them).
pub(crate) struct Resolved {
    pub refs: Vec<Reference>,
    pub spans: Vec<(usize, usize)>,
}

/// Stateless: the state lives in the caller's [`ReferenceState`], one per conversation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Resolver;

pub(crate) fn eq_ci(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        a.eq_ignore_ascii_case(b)
    } else {
        a.to_lowercase() == b.to_lowercase()
    }
}

fn is_acronym(s: &str) -> bool {
    let mut letters = 0;
    for c in s.chars() {
        if c.is_alphabetic() {
            if !c.is_uppercase() {
                return false;
            }
            letters += 1;
        }
    }
    letters >= 2
}

/// Whether a binding made at some earlier turn is still alive for the next turn.
pub fn binding_alive(state: &ReferenceState, b: &Binding) -> bool {
    state.turns_seen < b.expires_after
}

const PERSONAL: &[&str] = &[
    "he", "him", "his", "himself", "she", "her", "hers", "herself",
];
const PLURAL: &[&str] = &["they", "them", "their", "theirs", "themselves"];

impl Resolver {
    /// Resolves the anaphors in `text` against `state` (which is not changed). `speaker` said
    /// the text; `other_speaker` is the interlocutor, a poor antecedent for "she"/"he".
    /// `anchor` is when the text was said: "back then" prefers a time not after it.
    pub fn resolve(
        &self,
        text: &str,
        field: Field,
        speaker: Option<&str>,
        other_speaker: Option<&str>,
        state: &ReferenceState,
        anchor: DateTime<Utc>,
    ) -> Vec<Reference> {
        let toks = tokenize(text);
        self.resolve_tokens(&toks, text, field, speaker, other_speaker, state, anchor)
            .refs
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn resolve_tokens(
        &self,
        toks: &[Token<'_>],
        text: &str,
        field: Field,
        speaker: Option<&str>,
        other_speaker: Option<&str>,
        state: &ReferenceState,
        anchor: DateTime<Utc>,
    ) -> Resolved {
        let mut out: Vec<Reference> = Vec::new();
        let mut spans: Vec<(usize, usize)> = Vec::new();
        if state.entities.is_empty()
            && state.locations.is_empty()
            && state.times.is_empty()
            && state.events.is_empty()
        {
            return Resolved { refs: out, spans };
        }
        let is_speaker = |e: &str| {
            speaker.is_some_and(|s| eq_ci(s, e)) || other_speaker.is_some_and(|s| eq_ci(s, e))
        };
        // Entities this text is about (named or pronoun-resolved), most recent last.
        let mut mentioned: Vec<String> = Vec::new();
        // The latest capitalised name so far: a following pronoun probably means it. `Some(None)`
        // is a name the state does not know, which blocks resolution rather than guess.
        let mut last_name: Option<Option<String>> = None;
        let anchor_day = anchor.date_naive();
        let mut i = 0;
        while i < toks.len() {
            let t = &toks[i];
            if t.kind != TokKind::Word {
                i += 1;
                continue;
            }
            let base = t.base();
            if t.cap() && base != "i" && !is_stopword(base) {
                if let Some(e) = state.entities.iter().find(|e| {
                    eq_ci(e, base) || e.split_whitespace().next().is_some_and(|f| eq_ci(f, base))
                }) {
                    if !is_speaker(e) {
                        mentioned.push(e.clone());
                        last_name = Some(Some(e.clone()));
                    }
                } else if !t.sent_start && !crate::lexicon::is_calendar_word(base) && !t.all_caps()
                {
                    last_name = Some(None);
                }
            }
            let lower = t.lower.as_str();
            let personal = PERSONAL.contains(&base);
            if personal || PLURAL.contains(&base) {
                let target = match &last_name {
                    Some(Some(named)) if can_be_pronoun(state, named, speaker, personal) => {
                        Some(named.clone())
                    }
                    Some(None) => None,
                    _ => pick_entity(state, speaker, other_speaker, personal).cloned(),
                };
                if let Some(e) = target {
                    mentioned.push(e.clone());
                    spans.push((i, i));
                    push_ref(&mut out, t.surface, KIND_ENTITY, e, field);
                }
                i += 1;
                continue;
            }
            let w = |k: usize| {
                toks.get(k)
                    .filter(|x| x.kind == TokKind::Word)
                    .map(|x| x.lower.as_str())
            };
            // Multi-word time anaphors.
            let time_span = match lower {
                "that" | "those"
                    if w(i + 1).is_some_and(|n| {
                        matches!(
                            n,
                            "day"
                                | "night"
                                | "morning"
                                | "afternoon"
                                | "evening"
                                | "week"
                                | "weekend"
                                | "month"
                                | "year"
                                | "time"
                                | "summer"
                                | "winter"
                                | "spring"
                                | "autumn"
                                | "days"
                        )
                    }) =>
                {
                    Some((i + 1, false))
                }
                "the" | "that"
                    if w(i + 1) == Some("same")
                        && w(i + 2)
                            .is_some_and(|n| matches!(n, "day" | "night" | "week" | "time")) =>
                {
                    Some((i + 2, false))
                }
                "at" if w(i + 1) == Some("the") && w(i + 2) == Some("time") => Some((i + 2, true)),
                "last" if w(i + 1) == Some("time") => Some((i + 1, true)),
                "back" if w(i + 1) == Some("then") => Some((i + 1, true)),
                "then" if then_is_anaphoric(toks, i) => Some((i, true)),
                _ => None,
            };
            if let Some((end, past)) = time_span {
                if let Some(tr) = pick_time(state, &mentioned, past.then_some(anchor_day)) {
                    let mention = text.get(t.start..toks[end].end).unwrap_or(t.surface);
                    spans.push((i, end));
                    push_ref(&mut out, mention, KIND_TIME, tr.key(), field);
                }
                i = end + 1;
                continue;
            }
            let place_span = match lower {
                "there" if there_is_place(toks, i) => Some(i),
                "that" if w(i + 1) == Some("place") => Some(i + 1),
                _ => None,
            };
            if let Some(end) = place_span {
                if let Some(loc) = pick_location(state, &mentioned) {
                    let mention = text.get(t.start..toks[end].end).unwrap_or(t.surface);
                    spans.push((i, end));
                    push_ref(&mut out, mention, KIND_LOCATION, loc.clone(), field);
                }
                i = end + 1;
                continue;
            }
            if lower == "that"
                && w(i + 1).is_some_and(|n| matches!(n, "event" | "trip" | "party" | "thing"))
            {
                if let Some(ev) = state.events.first() {
                    let mention = text.get(t.start..toks[i + 1].end).unwrap_or(t.surface);
                    spans.push((i, i + 1));
                    push_ref(&mut out, mention, KIND_EVENT, ev.clone(), field);
                }
                i += 2;
                continue;
            }
            i += 1;
        }
        Resolved { refs: out, spans }
    }

    /// Pushes this turn's items onto the stacks, binds entities to the turn's location, event
    /// and time, expires dead bindings, and counts the turn.
    pub fn update(&self, state: &mut ReferenceState, extraction: &Extraction) {
        state.turns_seen += 1;
        let now = state.turns_seen;
        state.bindings.retain(|_, b| b.expires_after > now);
        push_stacks(state, extraction);
        let location = extraction.locations.first().cloned();
        let event = extraction.events.first().cloned();
        let time = extraction.times.first().cloned();
        if location.is_none() && event.is_none() && time.is_none() {
            return;
        }
        for e in &extraction.entities {
            state.bindings.insert(
                e.to_lowercase(),
                Binding {
                    location: location.clone(),
                    event: event.clone(),
                    time: time.clone(),
                    expires_after: now + BINDING_TTL,
                },
            );
        }
    }
}

/// Stack pushes only: used between the two fields of one turn, before the turn is counted.
pub(crate) fn push_stacks(state: &mut ReferenceState, ex: &Extraction) {
    for e in &ex.entities {
        push_front(
            &mut state.entities,
            e.clone(),
            |a, b| eq_ci(a, b),
            ENTITY_LIMIT,
        );
    }
    for l in &ex.locations {
        push_front(
            &mut state.locations,
            l.clone(),
            |a, b| eq_ci(a, b),
            LOCATION_LIMIT,
        );
    }
    for ev in &ex.events {
        push_front(&mut state.events, ev.clone(), |a, b| a == b, EVENT_LIMIT);
    }
    for t in &ex.times {
        push_front(
            &mut state.times,
            t.clone(),
            |a, b| a.key() == b.key(),
            TIME_LIMIT,
        );
    }
}

fn push_front<T>(stack: &mut Vec<T>, item: T, same: impl Fn(&T, &T) -> bool, limit: usize) {
    if let Some(p) = stack.iter().position(|x| same(x, &item)) {
        stack.remove(p);
    }
    stack.insert(0, item);
    stack.truncate(limit);
}

fn push_ref(out: &mut Vec<Reference>, mention: &str, kind: &str, resolved: String, field: Field) {
    if out
        .iter()
        .any(|r| r.kind == kind && r.resolved == resolved && eq_ci(&r.mention, mention))
    {
        return;
    }
    out.push(Reference {
        mention: mention.to_string(),
        kind: kind.to_string(),
        resolved,
        field,
    });
}

/// Most recent entity that can be a third person here: never the speaker, preferably not
/// the interlocutor, and for he/she not an acronym or a place.
fn pick_entity<'s>(
    state: &'s ReferenceState,
    speaker: Option<&str>,
    other: Option<&str>,
    personal: bool,
) -> Option<&'s String> {
    let ok = |e: &String| can_be_pronoun(state, e, speaker, personal);
    let is_other = |e: &String| other.is_some_and(|o| eq_ci(o, e));
    state
        .entities
        .iter()
        .find(|e| ok(e) && !is_other(e))
        .or_else(|| {
            if personal {
                state.entities.iter().find(|e| ok(e))
            } else {
                None
            }
        })
}

fn can_be_pronoun(state: &ReferenceState, e: &str, speaker: Option<&str>, personal: bool) -> bool {
    !speaker.is_some_and(|s| eq_ci(s, e))
        && !state.locations.iter().any(|l| eq_ci(l, e))
        && (!personal || !is_acronym(e))
}

/// Live bindings of the entities this text mentions, most recently mentioned first.
fn live_bindings<'s>(state: &'s ReferenceState, mentioned: &[String]) -> Vec<&'s Binding> {
    mentioned
        .iter()
        .rev()
        .filter_map(|e| state.bindings.get(&e.to_lowercase()))
        .filter(|b| binding_alive(state, b))
        .collect()
}

fn pick_location<'s>(state: &'s ReferenceState, mentioned: &[String]) -> Option<&'s String> {
    for b in live_bindings(state, mentioned) {
        if let Some(loc) = &b.location {
            if let Some(s) = state.locations.iter().find(|l| *l == loc) {
                return Some(s);
            }
        }
    }
    state.locations.first()
}

fn pick_time<'s>(
    state: &'s ReferenceState,
    mentioned: &[String],
    not_after: Option<chrono::NaiveDate>,
) -> Option<&'s TimeRef> {
    let fits = |t: &TimeRef| not_after.is_none_or(|a| t.start <= a);
    for b in live_bindings(state, mentioned) {
        if let Some(bt) = &b.time {
            if let Some(s) = state.times.iter().find(|t| t.key() == bt.key() && fits(t)) {
                return Some(s);
            }
        }
    }
    state
        .times
        .iter()
        .find(|t| fits(t))
        .or_else(|| state.times.first())
}

/// "there" as a place adverb ("I've been there") rather than existential ("there was").
fn there_is_place(toks: &[Token<'_>], i: usize) -> bool {
    let prev = (0..i)
        .rev()
        .map(|k| &toks[k])
        .find(|t| t.kind != TokKind::Punct || t.ends_sentence());
    let prev_word = prev
        .filter(|t| t.kind != TokKind::Punct)
        .map(|t| t.lower.as_str());
    if prev_word
        .is_some_and(|p| matches!(p, "hi" | "hey" | "hello" | "so" | "oh" | "thanks" | "thank"))
    {
        return false;
    }
    let place_verb = prev_word.is_some_and(|p| {
        matches!(
            p,
            "been"
                | "go"
                | "went"
                | "going"
                | "goes"
                | "gone"
                | "get"
                | "got"
                | "getting"
                | "over"
                | "out"
                | "up"
                | "down"
                | "back"
                | "live"
                | "lived"
                | "living"
                | "stay"
                | "stayed"
                | "staying"
                | "move"
                | "moved"
                | "moving"
                | "be"
                | "being"
                | "visit"
                | "visited"
                | "it"
                | "from"
                | "in"
                | "here"
                | "work"
                | "worked"
                | "working"
                | "meet"
                | "met"
                | "was"
                | "were"
                | "is"
                | "am"
                | "are"
                | "arrived"
                | "fun"
                | "time"
        )
    });
    let next = toks.get(i + 1);
    let Some(next) = next else { return true };
    if next.kind == TokKind::Punct {
        return true;
    }
    let existential = matches!(
        next.lower.as_str(),
        "is" | "are"
            | "was"
            | "were"
            | "be"
            | "been"
            | "will"
            | "would"
            | "could"
            | "should"
            | "might"
            | "may"
            | "must"
            | "can"
            | "seem"
            | "seems"
            | "seemed"
            | "appear"
            | "appears"
            | "has"
            | "have"
            | "had"
            | "isn't"
            | "aren't"
            | "wasn't"
            | "weren't"
            | "won't"
            | "used"
            | "exists"
            | "remain"
            | "remains"
            | "you"
            | "we"
            | "it"
            | "goes"
            | "go"
            | "ain't"
            | "wouldn't"
            | "couldn't"
            | "shouldn't"
            | "hasn't"
            | "haven't"
            | "hadn't"
    );
    !existential || place_verb
}

/// "then" as "at that time" ("back then", "since then", "I was 10 then"), not "and then".
fn then_is_anaphoric(toks: &[Token<'_>], i: usize) -> bool {
    let prev = i.checked_sub(1).and_then(|k| toks.get(k));
    let prev_word = prev
        .filter(|t| t.kind != TokKind::Punct)
        .map(|t| t.lower.as_str());
    if prev_word.is_some_and(|p| matches!(p, "since" | "until" | "till" | "by" | "from" | "even")) {
        return true;
    }
    if toks[i].sent_start || prev_word.is_none() {
        return false;
    }
    if prev_word.is_some_and(|p| {
        matches!(
            p,
            "and"
                | "but"
                | "so"
                | "or"
                | "well"
                | "okay"
                | "ok"
                | "just"
                | "now"
                | "see"
                | "bye"
                | "right"
                | "only"
                | "did"
                | "was"
                | "is"
        )
    }) {
        return false;
    }
    match toks.get(i + 1) {
        None => true,
        Some(n) => {
            n.kind == TokKind::Punct && matches!(n.surface, "." | "!" | "," | "?" | "\n" | ";")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{NaiveDate, TimeZone};

    fn anchor() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2023, 5, 8, 12, 0, 0).unwrap()
    }

    fn tr(s: &str, y: i32, m: u32, d: u32) -> TimeRef {
        let date = NaiveDate::from_ymd_opt(y, m, d).unwrap();
        TimeRef {
            text: s.into(),
            start: date,
            end: date,
            granularity: "day".into(),
        }
    }

    fn ex(
        entities: &[&str],
        locations: &[&str],
        events: &[&str],
        times: Vec<TimeRef>,
    ) -> Extraction {
        Extraction {
            entities: entities.iter().map(|s| s.to_string()).collect(),
            locations: locations.iter().map(|s| s.to_string()).collect(),
            events: events.iter().map(|s| s.to_string()).collect(),
            times,
            ..Default::default()
        }
    }

    fn resolve(
        text: &str,
        speaker: &str,
        other: &str,
        state: &ReferenceState,
    ) -> Vec<(String, String, String)> {
        Resolver
            .resolve(
                text,
                Field::User,
                Some(speaker),
                Some(other),
                state,
                anchor(),
            )
            .into_iter()
            .map(|r| (r.mention, r.kind, r.resolved))
            .collect()
    }

    #[test]
    fn she_resolves_to_third_party_not_speakers() {
        let mut st = ReferenceState::default();
        Resolver.update(
            &mut st,
            &ex(&["Caroline", "Melanie", "Anna"], &[], &[], vec![]),
        );
        // Caroline and Melanie are talking; Anna is the third person.
        Resolver.update(&mut st, &ex(&["Melanie", "Caroline"], &[], &[], vec![]));
        assert_eq!(st.entities, vec!["Caroline", "Melanie", "Anna"]);
        let r = resolve(
            "I think she loved her new puppy.",
            "Caroline",
            "Melanie",
            &st,
        );
        assert_eq!(
            r,
            vec![
                ("she".into(), "entity".into(), "Anna".into()),
                ("her".into(), "entity".into(), "Anna".into()),
            ]
        );
        // A known name earlier in the text takes the pronoun.
        let r = resolve("Did Melanie say she liked it?", "Caroline", "Jon", &st);
        assert_eq!(r, vec![("she".into(), "entity".into(), "Melanie".into())]);
        // A fresh name in the same text takes the pronoun instead.
        assert!(resolve("I met Jon, he is nice", "Caroline", "Melanie", &st).is_empty());
        // Without third parties, "she" may mean the other speaker, never the speaker.
        let mut st2 = ReferenceState::default();
        Resolver.update(&mut st2, &ex(&["Caroline", "Melanie"], &[], &[], vec![]));
        let r = resolve("she said so", "Caroline", "Melanie", &st2);
        assert_eq!(r[0].2, "Melanie");
        let r = resolve("she said so", "Melanie", "Caroline", &st2);
        assert_eq!(r[0].2, "Caroline");
    }

    #[test]
    fn acronyms_and_places_are_not_she() {
        let mut st = ReferenceState::default();
        Resolver.update(
            &mut st,
            &ex(&["Dave", "LGBTQ", "Paris"], &["Paris"], &[], vec![]),
        );
        let r = resolve("she was there", "Caroline", "Melanie", &st);
        assert_eq!(
            r,
            vec![
                ("she".into(), "entity".into(), "Dave".into()),
                ("there".into(), "location".into(), "Paris".into()),
            ]
        );
        // Groups can be "they"; places cannot.
        let r = resolve("they were great", "Caroline", "Melanie", &st);
        assert_eq!(r[0].2, "LGBTQ");
    }

    #[test]
    fn there_as_place_only() {
        let mut st = ReferenceState::default();
        Resolver.update(&mut st, &ex(&[], &["beach", "paris"], &[], vec![]));
        assert_eq!(st.locations, vec!["paris", "beach"]);
        assert_eq!(
            resolve("I've been there twice!", "A", "B", &st)[0].2,
            "paris"
        );
        assert_eq!(resolve("We went there.", "A", "B", &st).len(), 1);
        assert!(resolve("There was a storm and there are kids", "A", "B", &st).is_empty());
        assert!(resolve("hi there!", "A", "B", &st).is_empty());
        assert_eq!(resolve("It was nice there", "A", "B", &st).len(), 1);
    }

    #[test]
    fn time_anaphors_use_time_stack() {
        let mut st = ReferenceState::default();
        Resolver.update(
            &mut st,
            &ex(&[], &[], &[], vec![tr("last Friday", 2023, 5, 5)]),
        );
        for text in [
            "That day was magical",
            "back then I was shy",
            "at the time it hurt",
            "I loved it then.",
            "since then, all good",
            "last time we spoke",
        ] {
            let r = resolve(text, "A", "B", &st);
            assert_eq!(r.len(), 1, "{text}");
            assert_eq!(r[0].1, "time");
            assert_eq!(r[0].2, "2023-05-05");
        }
        assert_eq!(
            resolve("That day was magical", "A", "B", &st)[0].0,
            "That day"
        );
        assert!(resolve("and then we left", "A", "B", &st).is_empty());
        assert!(resolve("Then we left", "A", "B", &st).is_empty());
        // "back then" skips a future time on the stack.
        Resolver.update(
            &mut st,
            &ex(&[], &[], &[], vec![tr("tomorrow", 2023, 5, 9)]),
        );
        assert_eq!(resolve("back then", "A", "B", &st)[0].2, "2023-05-05");
        assert_eq!(resolve("that day", "A", "B", &st)[0].2, "2023-05-09");
    }

    #[test]
    fn resolution_requires_stack_membership() {
        let st = ReferenceState::default();
        assert!(resolve("she went there back then", "A", "B", &st).is_empty());
    }

    #[test]
    fn bindings_prefer_the_mentioned_entity_and_expire() {
        let mut st = ReferenceState::default();
        Resolver.update(
            &mut st,
            &ex(
                &["Anna"],
                &["paris"],
                &["go paris"],
                vec![tr("x", 2023, 4, 1)],
            ),
        );
        assert_eq!(st.bindings["anna"].expires_after, 4);
        Resolver.update(&mut st, &ex(&["Ben"], &["rome"], &[], vec![]));
        // Top location is rome, but Anna is bound to paris.
        assert_eq!(resolve("Anna loved it there", "A", "B", &st)[0].2, "paris");
        assert_eq!(resolve("Ben loved it there", "A", "B", &st)[0].2, "rome");
        Resolver.update(&mut st, &ex(&[], &[], &[], vec![]));
        assert!(st.bindings.contains_key("anna"));
        assert_eq!(resolve("Anna loved it there", "A", "B", &st)[0].2, "paris");
        Resolver.update(&mut st, &ex(&[], &[], &[], vec![]));
        // Three turns after it was made, Anna's binding is gone.
        assert_eq!(st.turns_seen, 4);
        assert!(!st.bindings.contains_key("anna"));
        assert!(st.bindings.contains_key("ben"));
        assert_eq!(resolve("Anna loved it there", "A", "B", &st)[0].2, "rome");
    }

    #[test]
    fn stacks_are_bounded_and_most_recent_first() {
        let mut st = ReferenceState::default();
        for k in 0..15 {
            let e = format!("E{k}");
            let l = format!("l{k}");
            let v = format!("v{k}");
            Resolver.update(
                &mut st,
                &ex(
                    &[e.as_str()],
                    &[l.as_str()],
                    &[v.as_str()],
                    vec![tr("t", 2023, 1, k + 1)],
                ),
            );
        }
        assert_eq!(st.entities.len(), ENTITY_LIMIT);
        assert_eq!(st.entities[0], "E14");
        assert_eq!(st.locations, vec!["l14", "l13", "l12", "l11"]);
        assert_eq!(st.events.len(), EVENT_LIMIT);
        assert_eq!(st.times.len(), TIME_LIMIT);
        assert_eq!(
            st.times[0].start,
            NaiveDate::from_ymd_opt(2023, 1, 15).unwrap()
        );
        // Re-mentioning moves to the front without duplicating.
        Resolver.update(&mut st, &ex(&["e10"], &[], &[], vec![]));
        assert_eq!(st.entities[0], "e10");
        assert_eq!(st.entities.len(), ENTITY_LIMIT);
        assert_eq!(
            st.entities
                .iter()
                .filter(|e| e.eq_ignore_ascii_case("e10"))
                .count(),
            1
        );
        assert!(st.bindings.len() <= 4);
    }
}
