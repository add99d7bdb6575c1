//! Capitalised-name detection shared by the turn extractor, the resolver and query analysis.
//!
//! Without a tagger, capitalisation is the only signal for names; the rules here exist to stop
//! sentence-initial words, interjections and calendar words from becoming entities.

use std::collections::HashSet;

use crate::lexicon::{is_calendar_word, is_gazetteer_place, is_interjection};
use crate::text::{is_stopword, TokKind, Token};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameRun {
    pub first: usize,
    pub last: usize,
    /// As written, single-spaced, possessive dropped ("Central Park", "LGBTQ").
    pub text: String,
    pub lower: String,
    /// Ends in a possessive ("Caroline's"): a person or organisation, never a place.
    pub possessive: bool,
}

impl NameRun {
    pub fn all_caps(&self, toks: &[Token<'_>]) -> bool {
        toks[self.first..=self.last]
            .iter()
            .filter(|t| t.is_word())
            .all(|t| t.all_caps())
    }
}

fn connector(lower: &str) -> bool {
    matches!(
        lower,
        "of" | "the"
            | "de"
            | "da"
            | "del"
            | "della"
            | "van"
            | "von"
            | "la"
            | "le"
            | "du"
            | "der"
            | "di"
            | "al"
            | "y"
    )
}

/// Sentence-initial words that look like names only because they are capitalised.
fn common_shape(lower: &str) -> bool {
    lower.len() > 4
        && (lower.ends_with("ing")
            || lower.ends_with("ed")
            || lower.ends_with("ly")
            || lower.ends_with("tion")
            || lower.ends_with("ness")
            || lower.ends_with("ful"))
}

fn is_name_token(t: &Token<'_>, shouting: bool, known: &dyn Fn(&str) -> bool) -> bool {
    if t.kind != TokKind::Word || !t.cap() {
        return false;
    }
    let base = t.base();
    if base == "i" || base.len() > 40 || is_calendar_word(base) || is_interjection(base) {
        return false;
    }
    if shouting {
        return known(base);
    }
    if is_stopword(base) && !t.all_caps() {
        return false;
    }
    true
}

fn has_possessive(t: &Token<'_>) -> bool {
    t.lower.ends_with("'s") || t.surface.ends_with('\'')
}

/// Capitalised runs that plausibly name something. `known` says whether a lower-case word is
/// an entity already in the conversation's state (so it counts even at sentence start);
/// `lenient_initial` accepts unknown sentence-initial words too (questions start with names).
pub(crate) fn name_runs(
    toks: &[Token<'_>],
    known: &dyn Fn(&str) -> bool,
    lenient_initial: bool,
) -> Vec<NameRun> {
    let mut words = 0usize;
    let mut caps = 0usize;
    for t in toks.iter().filter(|t| t.kind == TokKind::Word) {
        words += 1;
        if t.all_caps() {
            caps += 1;
        }
    }
    let shouting = words >= 3 && caps * 2 > words;
    let cap_elsewhere: HashSet<&str> = toks
        .iter()
        .filter(|t| t.kind == TokKind::Word && t.cap() && !t.sent_start)
        .map(|t| t.base())
        .collect();

    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if !is_name_token(&toks[i], shouting, known) {
            i += 1;
            continue;
        }
        let first = i;
        let mut last = i;
        while !has_possessive(&toks[last]) {
            let k = last + 1;
            let Some(next) = toks.get(k) else { break };
            if is_name_token(next, shouting, known) {
                last = k;
                continue;
            }
            // "Jean-Luc", "Coca-Cola"
            if next.is_punct("-")
                && toks[last].end == next.start
                && toks
                    .get(k + 1)
                    .is_some_and(|n| n.start == next.end && is_name_token(n, shouting, known))
            {
                last = k + 1;
                continue;
            }
            // "Dr. Smith"
            if next.is_punct(".")
                && matches!(
                    toks[last].lower.as_str(),
                    "mr" | "mrs" | "ms" | "dr" | "st" | "prof" | "mt"
                )
                && toks
                    .get(k + 1)
                    .is_some_and(|n| is_name_token(n, shouting, known))
            {
                last = k + 1;
                continue;
            }
            // "Museum of Modern Art", "Lord of the Rings"
            if next.kind == TokKind::Word && !next.cap() && connector(&next.lower) {
                let mut m = k + 1;
                if toks
                    .get(m)
                    .is_some_and(|t| t.kind == TokKind::Word && t.lower == "the")
                {
                    m += 1;
                }
                if toks
                    .get(m)
                    .is_some_and(|t| is_name_token(t, shouting, known))
                {
                    last = m;
                    continue;
                }
            }
            break;
        }
        i = last + 1;

        let mut start = first;
        let t0 = &toks[start];
        if t0.sent_start && !t0.all_caps() {
            let base = t0.base();
            let single = start == last;
            let accept = known(base)
                || is_gazetteer_place(base)
                || cap_elsewhere.contains(base)
                || (!common_shape(base) && (lenient_initial || has_possessive(t0) || !single));
            if !accept {
                if single {
                    continue;
                }
                start += 1;
                while start <= last && toks[start].kind != TokKind::Word {
                    start += 1;
                }
                while start <= last && connector(&toks[start].lower) && !toks[start].cap() {
                    start += 1;
                }
                if start > last {
                    continue;
                }
            }
        }
        let mut text = String::new();
        for k in start..=last {
            let t = &toks[k];
            if k > start && t.start > toks[k - 1].end {
                text.push(' ');
            }
            text.push_str(if k == last {
                t.surface_base()
            } else {
                t.surface
            });
        }
        let lower = crate::text::lower_normalised(&text);
        out.push(NameRun {
            first: start,
            last,
            text,
            lower,
            possessive: has_possessive(&toks[last]),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenize;

    fn names(text: &str, known: &[&str]) -> Vec<String> {
        let toks = tokenize(text);
        let k = |w: &str| known.contains(&w);
        name_runs(&toks, &k, false)
            .into_iter()
            .map(|r| r.text)
            .collect()
    }

    #[test]
    fn finds_names_and_skips_sentence_starts() {
        assert_eq!(
            names(
                "I went to the LGBTQ support group with Melanie's sister.",
                &[]
            ),
            vec!["LGBTQ", "Melanie"]
        );
        assert_eq!(
            names("Painting is fun. Hiking too!", &[]),
            Vec::<String>::new()
        );
        assert_eq!(
            names("Caroline said hi. I told Caroline no.", &[]),
            vec!["Caroline", "Caroline"]
        );
        assert_eq!(names("Melanie is here.", &["melanie"]), vec!["Melanie"]);
        assert_eq!(
            names("We saw the Museum of Modern Art in New York", &[]),
            vec!["Museum of Modern Art", "New York"]
        );
        assert_eq!(
            names("Hey Jon, Thanks! On Friday in May I met Dr. Smith.", &[]),
            vec!["Jon", "Dr. Smith"]
        );
        assert_eq!(names("THIS IS SO COOL", &[]), Vec::<String>::new());
    }
}
