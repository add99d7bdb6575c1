//! Query analysis: KeyMem's recall phase 1 (keywords, answer direction, entities, time hint,
//! query type) with the same rules and normalisation the store side used, so that query
//! keys meet stored keys.

use chrono::{DateTime, NaiveDate, Utc};
use once_cell::sync::Lazy;
use recollect_model::{Field, Keyword, Reference, ReferenceState};
use serde::{Deserialize, Serialize};

use crate::bm25;
use crate::lexicon::{ambiguous_place, gazetteer_match, is_gazetteer_place, is_place_noun};
use crate::names::name_runs;
use crate::resolve::{eq_ci, Resolver, KIND_ENTITY, KIND_LOCATION, KIND_TIME};
use crate::rules::{is_content, location_cue_before};
use crate::text::{stem, tokenize, TokKind, Token};
use crate::time::{scan, Gran, TimeMatch};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryAnalysis {
    /// Content words of the question (and multiword names), keyed like stored keywords.
    pub keywords: Vec<Keyword>,
    /// Words that point at the kind of answer ("date", "place"), from the wh-word.
    pub answer_keywords: Vec<Keyword>,
    pub entities: Vec<String>,
    /// Lower case, like stored locations.
    pub locations: Vec<String>,
    pub time_hint: Option<TimeHint>,
    pub query_type: QueryType,
    /// Stemmed BM25 terms, question scaffolding removed.
    pub lexical_terms: Vec<String>,
    pub wants: Option<Want>,
    /// Pronouns resolved against the caller's attention state.
    pub references: Vec<Reference>,
    /// The kind of thing a list question asks for ("activities" in "What activities has
    /// Melanie done?"), whose instances the answer names in words of their own ("camping"):
    /// recall's category term reads the turns' keywords against it ([`category_phrase`]).
    pub category: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryType {
    Factual,
    /// Hypothetical or inferential ("would", "why", "likely"): weighs keywords more in scoring.
    Reasoning,
}

/// The answer lies in the closed range `start..=end`. Open sides are `NaiveDate::MIN` /
/// `NaiveDate::MAX`, so a containment test works for every kind; `kind` says how it was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeHint {
    pub kind: TimeHintKind,
    pub start: NaiveDate,
    pub end: NaiveDate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeHintKind {
    /// One day.
    Exact,
    Before,
    After,
    /// A span: a week, month, season, year, or "between X and Y".
    Range,
}

/// The answer's direction, from the wh-word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    Time,
    Place,
    Person,
    Reason,
    Count,
    Thing,
}

/// Question scaffolding: says what kind of question it is, not what it is about.
fn is_question_generic(base: &str) -> bool {
    matches!(
        base,
        "did"
            | "does"
            | "do"
            | "like"
            | "likes"
            | "liked"
            | "kind"
            | "kinds"
            | "type"
            | "types"
            | "sort"
            | "sorts"
            | "think"
            | "thinks"
            | "mention"
            | "mentioned"
            | "mentions"
            | "tell"
            | "told"
            | "talk"
            | "talked"
            | "name"
            | "names"
            | "describe"
            | "described"
            | "happen"
            | "happened"
            | "often"
            | "many"
            | "much"
            | "long"
            | "ever"
            | "way"
            | "ways"
            | "according"
            | "specific"
            | "specifically"
            | "particular"
            | "exactly"
            | "likely"
            | "would"
            | "could"
            | "might"
            | "probably"
            | "possibly"
            | "consider"
            | "considered"
            | "reason"
            | "reasons"
            | "date"
            | "time"
            | "year"
            | "month"
            | "day"
            | "place"
            | "location"
            | "person"
            | "number"
            | "come"
            | "times"
    )
}

/// Stems of question scaffolding, removed from the query's BM25 terms.
static GENERIC_STEMS: Lazy<Vec<String>> = Lazy::new(|| {
    bm25::terms(
        "like kind type sort mention tell talk name describe happen often way according specific times",
    )
});

fn answer_words(w: Want) -> &'static [&'static str] {
    match w {
        Want::Time => &["date", "time", "day"],
        Want::Place => &["place", "location"],
        Want::Person => &["person"],
        Want::Count => &["number"],
        Want::Reason => &["because", "reason"],
        Want::Thing => &[],
    }
}

fn word<'t>(toks: &'t [Token<'_>], i: usize) -> Option<&'t str> {
    toks.get(i)
        .filter(|t| t.kind != TokKind::Punct)
        .map(|t| t.lower.as_str())
}

/// Answer direction from the first wh-word (not necessarily the first word:
/// "Caroline moved from which country?").
fn detect_want(toks: &[Token<'_>]) -> Option<Want> {
    for i in 0..toks.len() {
        let Some(w) = word(toks, i) else { continue };
        let next = word(toks, i + 1);
        let want = match w {
            "when" => Want::Time,
            "where" => Want::Place,
            "who" | "whom" | "whose" => Want::Person,
            "why" => Want::Reason,
            "how" => match next {
                Some("come") => Want::Reason,
                Some("many" | "much" | "often" | "frequently") => Want::Count,
                Some("long") => Want::Time,
                _ => continue,
            },
            "what" | "which" => match next {
                Some("time" | "date" | "year" | "month" | "day" | "week" | "season") => Want::Time,
                Some(
                    "city" | "country" | "place" | "state" | "town" | "location" | "places"
                    | "cities" | "countries",
                ) => Want::Place,
                Some("person" | "people") => Want::Person,
                Some("reason" | "reasons") => Want::Reason,
                Some("number") => Want::Count,
                _ => Want::Thing,
            },
            _ => continue,
        };
        return Some(want);
    }
    None
}

fn detect_type(toks: &[Token<'_>]) -> QueryType {
    for i in 0..toks.len() {
        let Some(w) = word(toks, i) else { continue };
        let reasoning = match w {
            "would" | "could" | "might" | "likely" | "unlikely" | "probably" | "possibly"
            | "why" | "should" | "wouldn't" | "couldn't" | "potentially" | "infer" | "suggest"
            | "if" => true,
            "how" => word(toks, i + 1) == Some("come"),
            _ => false,
        };
        if reasoning {
            return QueryType::Reasoning;
        }
    }
    QueryType::Factual
}

/// Turns the question's time expressions into one hint; without `now`, only expressions
/// with an explicit year count.
fn time_hint(toks: &[Token<'_>], matches: &[TimeMatch]) -> Option<TimeHint> {
    let first = matches.first()?;
    let before = |m: &TimeMatch, k: usize| m.first.checked_sub(k).and_then(|j| word(toks, j));
    let b1 = before(first, 1);
    let b2 = before(first, 2);
    // "between X and Y", "from X to Y"
    if let Some(second) = matches.get(1) {
        let joined = second.first >= 1
            && word(toks, second.first - 1)
                .is_some_and(|w| matches!(w, "and" | "to" | "until" | "till"))
            && second.first - 1 == first.last + 1;
        if joined && matches!(b1, Some("between" | "from")) {
            return Some(TimeHint {
                kind: TimeHintKind::Range,
                start: first.start,
                end: second.end,
            });
        }
    }
    let (kind, start, end) = match (b2, b1) {
        (_, Some("before")) | (Some("prior"), Some("to")) | (Some("earlier"), Some("than")) => (
            TimeHintKind::Before,
            NaiveDate::MIN,
            first.start.pred_opt()?,
        ),
        (_, Some("until" | "till" | "by")) => (TimeHintKind::Before, NaiveDate::MIN, first.end),
        (_, Some("after")) | (Some("later"), Some("than")) => {
            (TimeHintKind::After, first.end.succ_opt()?, NaiveDate::MAX)
        }
        (_, Some("since")) => (TimeHintKind::After, first.start, NaiveDate::MAX),
        _ => {
            let kind = if first.gran == Gran::Day && first.start == first.end {
                TimeHintKind::Exact
            } else {
                TimeHintKind::Range
            };
            (kind, first.start, first.end)
        }
    };
    Some(TimeHint { kind, start, end })
}

fn push_kw(out: &mut Vec<Keyword>, key: String, text: String) {
    if !out.iter().any(|k| k.key == key) {
        out.push(Keyword { key, text });
    }
}

fn push_unique(v: &mut Vec<String>, s: String) {
    if !s.is_empty() && !v.iter().any(|x| eq_ci(x, &s)) {
        v.push(s);
    }
}

/// Analyses a recall query. `now` anchors relative times ("last week"); `attention` is the
/// caller's reference state, used to resolve pronouns in the query.
pub fn analyse_query(
    query: &str,
    now: Option<DateTime<Utc>>,
    attention: Option<&ReferenceState>,
) -> QueryAnalysis {
    let toks = tokenize(query);
    let n = toks.len();
    let wants = detect_want(&toks);
    let query_type = detect_type(&toks);

    // Without a clock, relative expressions are dropped, so any anchor will do.
    let anchor = now.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
    let matches: Vec<TimeMatch> = scan(&toks, anchor.date_naive())
        .into_iter()
        .filter(|m| now.is_some() || m.absolute)
        .collect();
    let mut in_time = vec![false; n];
    for m in scan(&toks, anchor.date_naive()) {
        in_time[m.first..=m.last].iter_mut().for_each(|x| *x = true);
    }
    let mut time_hint = time_hint(&toks, &matches);

    let known = |w: &str| attention.is_some_and(|a| a.entities.iter().any(|e| eq_ci(e, w)));
    let mut entities = Vec::new();
    // (position, place): sorted at the end so places come in text order.
    let mut locs: Vec<(usize, String)> = Vec::new();
    let mut keywords = Vec::new();
    let mut in_name = vec![false; n];
    for run in name_runs(&toks, &known, true) {
        if in_time[run.first..=run.last].iter().any(|x| *x) {
            continue;
        }
        // Capitalised question scaffolding ("What", "Did") never names anything.
        let words: Vec<&Token<'_>> = toks[run.first..=run.last]
            .iter()
            .filter(|t| t.is_word())
            .collect();
        if words.len() == 1 && is_question_generic(words[0].base()) {
            continue;
        }
        in_name[run.first..=run.last]
            .iter_mut()
            .for_each(|x| *x = true);
        let cue = location_cue_before(&toks, run.first);
        let gaz = is_gazetteer_place(&run.lower);
        let place = !known(&run.lower)
            && !run.possessive
            && ((gaz && (!ambiguous_place(&run.lower) || cue)) || (cue && !run.all_caps(&toks)));
        if place {
            locs.push((run.first, run.lower.clone()));
        } else {
            push_unique(&mut entities, run.text.clone());
        }
        if words.len() >= 2 {
            let key = words
                .iter()
                .map(|t| stem(t.base()))
                .collect::<Vec<_>>()
                .join(" ");
            let text = words.iter().map(|t| t.base()).collect::<Vec<_>>().join(" ");
            push_kw(&mut keywords, key, text);
        }
    }
    // Names written in lower case that the attention state knows.
    if let Some(a) = attention {
        for t in toks.iter().filter(|t| t.kind == TokKind::Word) {
            if let Some(e) = a.entities.iter().find(|e| eq_ci(e, t.base())) {
                push_unique(&mut entities, e.clone());
            }
        }
    }
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
        let len = gazetteer_match(|k| word_at(i + k));
        if len > 0 {
            let phrase = toks[i..i + len]
                .iter()
                .map(|t| t.base())
                .collect::<Vec<_>>()
                .join(" ");
            if !ambiguous_place(&phrase) || (t.cap() && location_cue_before(&toks, i)) {
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

    for (i, t) in toks.iter().enumerate() {
        if !t.is_word() || in_time[i] {
            continue;
        }
        let base = t.base();
        if !is_content(base) || is_question_generic(base) {
            continue;
        }
        let key = if t.kind == TokKind::Num {
            base.to_string()
        } else {
            stem(base)
        };
        push_kw(&mut keywords, key, base.to_string());
    }
    let mut answer_keywords = Vec::new();
    if let Some(w) = wants {
        for a in answer_words(w) {
            push_kw(&mut answer_keywords, stem(a), a.to_string());
        }
    }

    let lexical = bm25::terms(query)
        .into_iter()
        .filter(|t| !GENERIC_STEMS.contains(t))
        .collect();

    locs.sort_by_key(|(p, _)| *p);
    let mut locations = Vec::new();
    for (_, l) in locs {
        push_unique(&mut locations, l);
    }
    let mut references = Vec::new();
    if let Some(a) = attention {
        let refs = Resolver
            .resolve_tokens(
                &toks,
                query,
                Field::User,
                None,
                None,
                a,
                now.unwrap_or(DateTime::<Utc>::MAX_UTC),
            )
            .refs;
        for r in refs {
            match r.kind.as_str() {
                KIND_ENTITY => push_unique(&mut entities, r.resolved.clone()),
                KIND_LOCATION => push_unique(&mut locations, r.resolved.to_lowercase()),
                KIND_TIME if time_hint.is_none() => {
                    if let Some(t) = a.times.iter().find(|t| t.key() == r.resolved) {
                        let kind = if t.start == t.end {
                            TimeHintKind::Exact
                        } else {
                            TimeHintKind::Range
                        };
                        time_hint = Some(TimeHint {
                            kind,
                            start: t.start,
                            end: t.end,
                        });
                    }
                }
                _ => {}
            }
            references.push(r);
        }
    }

    QueryAnalysis {
        keywords,
        answer_keywords,
        entities,
        locations,
        time_hint,
        query_type,
        lexical_terms: lexical,
        wants,
        references,
        category: category_phrase(query),
    }
}

/// Words between a question's *what*/*which* (and *kind of*, *type of*, *sort of*) or *how
/// many* and its auxiliary verb: "What video games does Nate play?" → "video games", "Which
/// kind of classes has James joined?" → "classes", "How many pets does Nate have?" → "pets".
/// None for every other shape, for a phrase of more than four words, and for one that only
/// asks when ("what time", "which year", "how many times").
pub fn category_phrase(query: &str) -> Option<String> {
    const AUX: [&str; 14] = [
        "has", "have", "does", "do", "did", "is", "are", "was", "were", "had", "can", "could",
        "would", "will",
    ];
    const KIND: [&str; 6] = ["kind", "kinds", "type", "types", "sort", "sorts"];
    const WHEN: [&str; 7] = ["time", "times", "day", "date", "month", "year", "years"];
    let words: Vec<&str> = query
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '+' && c != '-'))
        .filter(|w| !w.is_empty())
        .collect();
    let (first, mut rest) = words.split_first()?;
    if first.eq_ignore_ascii_case("how") {
        match rest.split_first() {
            Some((many, more)) if many.eq_ignore_ascii_case("many") => rest = more,
            _ => return None,
        }
    } else if !(first.eq_ignore_ascii_case("what") || first.eq_ignore_ascii_case("which")) {
        return None;
    }
    if let [k, of, more @ ..] = rest {
        if KIND.iter().any(|x| k.eq_ignore_ascii_case(x)) && of.eq_ignore_ascii_case("of") {
            rest = more;
        }
    }
    let end = rest
        .iter()
        .position(|w| AUX.iter().any(|a| w.eq_ignore_ascii_case(a)))?;
    let phrase = &rest[..end];
    let single_when = phrase.len() == 1 && WHEN.iter().any(|x| phrase[0].eq_ignore_ascii_case(x));
    if phrase.is_empty() || phrase.len() > 4 || single_when || phrase[0].eq_ignore_ascii_case("of")
    {
        return None;
    }
    Some(phrase.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use recollect_model::TimeRef;

    fn d(y: i32, m: u32, dd: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, dd).unwrap()
    }

    fn now() -> Option<DateTime<Utc>> {
        Some(Utc.with_ymd_and_hms(2023, 5, 8, 12, 0, 0).unwrap())
    }

    fn texts(k: &[Keyword]) -> Vec<&str> {
        k.iter().map(|k| k.text.as_str()).collect()
    }

    #[test]
    fn support_group_question() {
        let q = analyse_query(
            "When did Caroline go to the LGBTQ support group?",
            None,
            None,
        );
        assert!(q.entities.contains(&"Caroline".to_string()));
        assert!(q.entities.contains(&"LGBTQ".to_string()));
        assert_eq!(q.wants, Some(Want::Time));
        assert_eq!(q.query_type, QueryType::Factual);
        let kw = texts(&q.keywords);
        assert!(
            kw.contains(&"support") && kw.contains(&"group") && kw.contains(&"caroline"),
            "{kw:?}"
        );
        assert!(!kw.contains(&"when") && !kw.contains(&"did"));
        assert_eq!(texts(&q.answer_keywords), vec!["date", "time", "day"]);
        assert!(q.lexical_terms.contains(&"support".to_string()));
        assert!(q.lexical_terms.contains(&"carolin".to_string()));
        assert!(!q.lexical_terms.iter().any(|t| t == "when" || t == "did"));
        assert!(q.time_hint.is_none());
        assert!(q.locations.is_empty());
    }

    #[test]
    fn wants_and_types() {
        let w = |s: &str| analyse_query(s, None, None).wants;
        assert_eq!(w("Where did Melanie go camping?"), Some(Want::Place));
        assert_eq!(w("Who gave Jon the guitar?"), Some(Want::Person));
        assert_eq!(w("Why did Gina quit her job?"), Some(Want::Reason));
        assert_eq!(w("How come Gina quit?"), Some(Want::Reason));
        assert_eq!(w("How many kids does Melanie have?"), Some(Want::Count));
        assert_eq!(w("How often does Jon run?"), Some(Want::Count));
        assert_eq!(w("What did Melanie paint?"), Some(Want::Thing));
        assert_eq!(w("Which city did Jon visit?"), Some(Want::Place));
        assert_eq!(w("In what year did Jon move?"), Some(Want::Time));
        assert_eq!(w("Did Jon move?"), None);
        let t = |s: &str| analyse_query(s, None, None).query_type;
        assert_eq!(
            t("Would Caroline pursue writing as a career?"),
            QueryType::Reasoning
        );
        assert_eq!(t("What might Melanie enjoy?"), QueryType::Reasoning);
        assert_eq!(t("Is it likely that Jon moves?"), QueryType::Reasoning);
        assert_eq!(t("Why did Gina quit?"), QueryType::Reasoning);
        assert_eq!(t("What did Melanie paint?"), QueryType::Factual);
        let q = analyse_query("Where did Melanie go camping?", None, None);
        assert_eq!(texts(&q.answer_keywords), vec!["place", "location"]);
        assert_eq!(texts(&q.keywords), vec!["melanie", "camping"]);
    }

    #[test]
    fn time_hints() {
        let h = |s: &str, now: Option<DateTime<Utc>>| analyse_query(s, now, None).time_hint;
        let r = h("What did Jon do in 2022?", None).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::Range, d(2022, 1, 1), d(2022, 12, 31))
        );
        let r = h("What happened on 8 May 2023?", None).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::Exact, d(2023, 5, 8), d(2023, 5, 8))
        );
        let r = h("Where did Jon live before 2020?", None).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::Before, NaiveDate::MIN, d(2019, 12, 31))
        );
        let r = h("What has Jon done since May 2023?", None).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::After, d(2023, 5, 1), NaiveDate::MAX)
        );
        let r = h("What did Jon do after June 2022?", None).unwrap();
        assert_eq!((r.kind, r.start), (TimeHintKind::After, d(2022, 7, 1)));
        let r = h("What did Jon read between 2019 and 2021?", None).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::Range, d(2019, 1, 1), d(2021, 12, 31))
        );
        // Relative times need a clock.
        assert!(h("What did Jon do last week?", None).is_none());
        let r = h("What did Jon do last week?", now()).unwrap();
        assert_eq!(
            (r.kind, r.start, r.end),
            (TimeHintKind::Range, d(2023, 5, 1), d(2023, 5, 7))
        );
        let r = h("What did Jon do yesterday?", now()).unwrap();
        assert_eq!((r.kind, r.start), (TimeHintKind::Exact, d(2023, 5, 7)));
        // Time words are not keywords.
        let q = analyse_query("What did Jon do last week?", now(), None);
        assert!(!texts(&q.keywords).contains(&"week"));
    }

    #[test]
    fn locations_and_names() {
        let q = analyse_query("What did Caroline see at the museum in Paris?", None, None);
        assert_eq!(q.locations, vec!["museum", "paris"]);
        assert_eq!(q.entities, vec!["Caroline"]);
        let q = analyse_query(
            "Melanie and Caroline went to which beach in New York City?",
            None,
            None,
        );
        assert_eq!(q.entities, vec!["Melanie", "Caroline"]);
        assert_eq!(q.locations, vec!["beach", "new york city"]);
        assert_eq!(q.wants, Some(Want::Thing));
        assert!(q.keywords.iter().any(|k| k.text == "new york city"));
    }

    #[test]
    fn attention_resolves_pronouns() {
        let mut st = ReferenceState::default();
        Resolver.update(
            &mut st,
            &recollect_model::Extraction {
                entities: vec!["Melanie".into(), "Oscar".into()],
                locations: vec!["lake".into()],
                times: vec![TimeRef {
                    text: "last summer".into(),
                    start: d(2022, 6, 1),
                    end: d(2022, 8, 31),
                    granularity: "season".into(),
                }],
                ..Default::default()
            },
        );
        let q = analyse_query("What did he do there back then?", now(), Some(&st));
        assert_eq!(q.entities, vec!["Oscar"]);
        assert_eq!(q.locations, vec!["lake"]);
        let h = q.time_hint.unwrap();
        assert_eq!(
            (h.kind, h.start, h.end),
            (TimeHintKind::Range, d(2022, 6, 1), d(2022, 8, 31))
        );
        assert_eq!(q.references.len(), 3);
        // Known names are found even in lower case.
        let q = analyse_query("what did melanie paint", None, Some(&st));
        assert_eq!(q.entities, vec!["Melanie"]);
    }

    #[test]
    fn a_list_question_names_the_kind_of_thing_it_asks_for() {
        let cases = [
            (
                "What activities has Melanie done with her family?",
                Some("activities"),
            ),
            ("What video games does Nate play?", Some("video games")),
            ("Which kind of classes has James joined?", Some("classes")),
            ("What types of yoga has Maria practiced?", Some("yoga")),
            (
                "What LGBTQ+ events has Caroline participated in?",
                Some("LGBTQ+ events"),
            ),
            ("What does Joanna do to remember happy memories?", None),
            ("What is Joanna allergic to?", None),
            ("Which of Joanna's screenplays were rejected?", None),
            ("What time did the train leave?", None),
            ("When did Nate get Tilly?", None),
            ("How many turtles does Nate have?", Some("turtles")),
            ("How many times has Nate won?", None),
            ("How long has Nate had them?", None),
            (
                "What amazing things that I really liked have you seen?",
                None,
            ),
        ];
        for (q, want) in cases {
            assert_eq!(category_phrase(q).as_deref(), want, "{q}");
        }
        let qa = analyse_query("What pets does Nate have?", None, None);
        assert_eq!(qa.category.as_deref(), Some("pets"));
    }
}
