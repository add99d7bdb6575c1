//! Tokenisation shared by BM25 (`bm25.rs`), keyword keys and the rule extractors.
//!
//! Everything here must agree between store time and query time, so the same
//! normalisation (lower case, clitic stripping, Snowball English stems) is used everywhere.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use once_cell::sync::Lazy;
use rust_stemmers::{Algorithm, Stemmer};

/// One stemmer for the process: creating one per call would dominate short texts.
static STEMMER: Lazy<Stemmer> = Lazy::new(|| Stemmer::create(Algorithm::English));

/// Function words and chat filler. Lexical matching on these only adds noise, and the
/// keyword graph would merge unrelated turns on them.
#[rustfmt::skip]
const STOPWORDS: &[&str] = &[
    // pronouns
    "i", "me", "my", "mine", "myself", "we", "us", "our", "ours", "ourselves", "you", "your",
    "yours", "yourself", "yourselves", "he", "him", "his", "himself", "she", "her", "hers",
    "herself", "it", "its", "itself", "they", "them", "their", "theirs", "themselves", "ya", "u",
    "ur", "y'all", "yall", "one's",
    // wh-words
    "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "whatever",
    "whenever", "wherever", "whoever", "however",
    // determiners and quantifiers
    "this", "that", "these", "those", "a", "an", "the", "some", "any", "each", "every", "either",
    "neither", "both", "all", "another", "other", "others", "such", "no", "nor", "not", "only",
    "own", "same", "more", "most", "much", "many", "lot", "lots", "bit", "thing", "things",
    "stuff", "something", "anything", "everything", "nothing", "someone", "anyone", "everyone",
    "somebody", "anybody", "everybody", "nobody", "somewhere", "anywhere", "everywhere", "etc",
    // auxiliaries and modals
    "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "having", "do",
    "does", "did", "doing", "will", "would", "shall", "should", "can", "could", "may", "might",
    "must", "ought", "gonna", "wanna", "gotta", "let", "lets",
    // contractions (the tokenizer strips most clitics, these are the whole forms)
    "i'm", "i've", "i'll", "i'd", "you're", "you've", "you'll", "you'd", "he's", "he'll", "he'd",
    "she's", "she'll", "she'd", "it's", "it'll", "it'd", "we're", "we've", "we'll", "we'd",
    "they're", "they've", "they'll", "they'd", "that's", "there's", "here's", "what's", "who's",
    "where's", "when's", "why's", "how's", "let's", "isn't", "aren't", "wasn't", "weren't",
    "don't", "doesn't", "didn't", "haven't", "hasn't", "hadn't", "won't", "wouldn't", "can't",
    "cannot", "couldn't", "shouldn't", "mustn't", "ain't", "needn't", "im", "ive", "dont",
    "didnt", "doesnt", "cant", "wont", "isnt", "wasnt", "thats", "youre",
    // prepositions
    "about", "above", "across", "after", "against", "along", "among", "around", "as", "at",
    "before", "behind", "below", "beneath", "beside", "besides", "between", "beyond", "by",
    "down", "during", "except", "for", "from", "in", "inside", "into", "near", "of", "off", "on",
    "onto", "out", "outside", "over", "since", "through", "throughout", "till", "to", "toward",
    "towards", "under", "underneath", "until", "up", "upon", "with", "within", "without", "via",
    "per",
    // conjunctions
    "and", "but", "or", "so", "because", "cause", "cuz", "if", "then", "than", "though",
    "although", "while", "whereas", "unless", "whether", "yet", "also", "too",
    // adverbs and filler
    "just", "really", "very", "quite", "even", "still", "already", "again", "ever", "maybe",
    "perhaps", "actually", "basically", "literally", "totally", "definitely", "here", "there",
    "now", "well", "anyway", "anyways", "oh", "ah", "ahh", "aw", "aww", "wow", "hey", "hi",
    "hello", "yeah", "yes", "yep", "yup", "no", "nope", "nah", "ok", "okay", "um", "umm", "uh",
    "hmm", "huh", "lol", "haha", "hahaha", "omg", "btw", "kinda", "sorta", "please", "yay", "ooh",
    "oops", "ago", "recently", "lately", "soon", "s", "t",
    // light verbs: present in almost every turn, they link nothing
    "go", "goes", "going", "went", "gone", "get", "gets", "getting", "got", "gotten", "come",
    "comes", "came", "say", "says", "said", "know", "knew", "known", "think", "guess", "mean",
    "means", "seem", "seems", "seemed", "make", "makes", "made", "making", "take", "takes",
    "took", "taken", "taking", "done", "sounds", "thanks", "thank", "cool", "awesome",
];

pub(crate) static STOPSET: Lazy<HashSet<&'static str>> =
    Lazy::new(|| STOPWORDS.iter().copied().collect());

/// The BM25 tokeniser and term ids under their former names: branches written before
/// `bm25.rs` (and builds sharing a target directory with them) still call these.
pub use crate::bm25::{term_id, terms as lexical_terms};

/// Whether `word` (any case) is a function word or chat filler.
pub fn is_stopword(word: &str) -> bool {
    if word
        .chars()
        .any(|c| c.is_uppercase() || is_apostrophe(c) && c != '\'')
    {
        let lower = lower_normalised(word);
        STOPSET.contains(strip_clitic(&lower)) || STOPSET.contains(lower.as_str())
    } else {
        STOPSET.contains(word) || STOPSET.contains(strip_clitic(word))
    }
}

/// Snowball English stem of a word, lower-cased first.
pub fn stem(word: &str) -> String {
    if word.chars().any(char::is_uppercase) {
        stem_lower(&word.to_lowercase())
    } else {
        stem_lower(word)
    }
}

/// How many words each thread remembers the stem of. Chat reuses a small vocabulary: at this
/// size the look-ups hit for nearly every word, in about 1 MB a thread.
const STEMS_REMEMBERED: usize = 16_384;

thread_local! {
    static STEMS: RefCell<HashMap<Box<str>, Box<str>>> = RefCell::new(HashMap::new());
}

/// Snowball English stem of a lower-case word. The stemmer's suffix search costs several times
/// a hash look-up, and the extractor, the embedder's BM25 vectors and every question stem the
/// same words over and over, so each thread keeps the stems it made (all forgotten at once when
/// full: no bookkeeping on the hot path).
pub(crate) fn stem_lower(word: &str) -> String {
    STEMS.with(|cell| {
        let mut stems = cell.borrow_mut();
        if let Some(s) = stems.get(word) {
            return s.to_string();
        }
        let s = STEMMER.stem(word);
        if stems.len() >= STEMS_REMEMBERED {
            stems.clear();
        }
        stems.insert(word.into(), (*s).into());
        s.into_owned()
    })
}

pub(crate) fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}' | '\u{02bc}')
}

pub(crate) fn push_lower(buf: &mut String, c: char) {
    if c.is_ascii() {
        buf.push(c.to_ascii_lowercase());
    } else {
        buf.extend(c.to_lowercase());
    }
}

/// Lower case with every apostrophe variant folded to `'`.
pub(crate) fn lower_normalised(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_apostrophe(c) {
            out.push('\'');
        } else {
            push_lower(&mut out, c);
        }
    }
    out
}

/// Drops a trailing clitic ("caroline's" → "caroline", "i'm" → "i"); negations stay whole so
/// they hit the stopword list.
pub(crate) fn strip_clitic(w: &str) -> &str {
    if let Some((head, tail)) = w.rsplit_once('\'') {
        if !head.is_empty() && matches!(tail, "s" | "m" | "re" | "ve" | "ll" | "d") {
            return head;
        }
    }
    w
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokKind {
    Word,
    Num,
    Punct,
}

/// A token with enough layout information for the rule extractors: where it is, whether it
/// starts a sentence, and its normalised lower-case form.
#[derive(Debug, Clone)]
pub(crate) struct Token<'a> {
    pub surface: &'a str,
    /// Lower case, apostrophes folded; empty for punctuation (use `surface`).
    pub lower: String,
    pub start: usize,
    pub end: usize,
    pub kind: TokKind,
    pub sent_start: bool,
}

impl Token<'_> {
    pub fn is_word(&self) -> bool {
        self.kind != TokKind::Punct
    }

    /// Lower-case form without a clitic ("caroline's" → "caroline").
    pub fn base(&self) -> &str {
        strip_clitic(&self.lower)
    }

    /// The surface form without a possessive ("Caroline's" → "Caroline").
    pub fn surface_base(&self) -> &str {
        for suffix in ["'s", "\u{2019}s", "'", "\u{2019}"] {
            if let Some(s) = self.surface.strip_suffix(suffix) {
                if !s.is_empty() {
                    return s;
                }
            }
        }
        self.surface
    }

    pub fn cap(&self) -> bool {
        self.kind == TokKind::Word && self.surface.chars().next().is_some_and(char::is_uppercase)
    }

    /// An acronym such as "LGBTQ" or "NYC": two or more letters, all upper case.
    pub fn all_caps(&self) -> bool {
        let mut letters = 0;
        for c in self.surface_base().chars() {
            if c.is_alphabetic() {
                if !c.is_uppercase() {
                    return false;
                }
                letters += 1;
            }
        }
        letters >= 2
    }

    pub fn is_punct(&self, s: &str) -> bool {
        self.kind == TokKind::Punct && self.surface == s
    }

    /// Punctuation that ends a sentence (or a line, which chat uses the same way).
    pub fn ends_sentence(&self) -> bool {
        self.kind == TokKind::Punct
            && matches!(self.surface, "." | "!" | "?" | "\n" | "\u{2026}" | ";")
    }
}

/// Titles whose trailing full stop does not end a sentence.
fn is_title_abbrev(lower: &str) -> bool {
    matches!(
        lower,
        "mr" | "mrs" | "ms" | "dr" | "st" | "jr" | "sr" | "prof" | "mt" | "vs" | "e.g" | "i.e"
    )
}

/// Splits text into word, number and punctuation tokens. Linear in the input; never panics.
pub(crate) fn tokenize(text: &str) -> Vec<Token<'_>> {
    let mut toks: Vec<Token<'_>> = Vec::with_capacity(text.len() / 5 + 4);
    let mut pending_sent = true;
    let mut iter = text.char_indices().peekable();
    while let Some((i, c)) = iter.next() {
        if c.is_alphanumeric() {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = iter.peek() {
                if d.is_alphanumeric() {
                    end = j + d.len_utf8();
                    iter.next();
                } else if is_apostrophe(d) {
                    let after = j + d.len_utf8();
                    if text[after..]
                        .chars()
                        .next()
                        .is_some_and(char::is_alphanumeric)
                    {
                        end = after;
                        iter.next();
                    } else {
                        break;
                    }
                } else {
                    break;
                }
            }
            let surface = &text[i..end];
            let kind = if surface.bytes().all(|b| b.is_ascii_digit()) {
                TokKind::Num
            } else {
                TokKind::Word
            };
            toks.push(Token {
                surface,
                lower: lower_normalised(surface),
                start: i,
                end,
                kind,
                sent_start: pending_sent,
            });
            pending_sent = false;
        } else if c.is_whitespace() {
            if c == '\n' {
                toks.push(Token {
                    surface: &text[i..i + 1],
                    lower: String::new(),
                    start: i,
                    end: i + 1,
                    kind: TokKind::Punct,
                    sent_start: false,
                });
                pending_sent = true;
            }
        } else {
            let end = i + c.len_utf8();
            if matches!(c, '.' | '!' | '?' | '\u{2026}') {
                let prev = toks.last();
                let abbrev = c == '.'
                    && prev.is_some_and(|p| {
                        p.end == i && p.kind == TokKind::Word && is_title_abbrev(&p.lower)
                    });
                let decimal = c == '.'
                    && prev.is_some_and(|p| p.end == i && p.kind == TokKind::Num)
                    && text[end..].starts_with(|d: char| d.is_ascii_digit());
                if !abbrev && !decimal {
                    pending_sent = true;
                }
            }
            toks.push(Token {
                surface: &text[i..end],
                lower: String::new(),
                start: i,
                end,
                kind: TokKind::Punct,
                sent_start: false,
            });
        }
    }
    toks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_and_stems() {
        assert!(is_stopword("The"));
        assert!(is_stopword("don’t"));
        assert!(is_stopword("gonna"));
        assert!(!is_stopword("museum"));
        assert_eq!(stem("Running"), "run");
        assert_eq!(stem("groups"), "group");
    }

    #[test]
    fn remembered_stems_are_the_stemmers_before_and_after_the_memory_fills() {
        let words: Vec<String> = (0..STEMS_REMEMBERED + 500)
            .map(|i| format!("walking{i}s"))
            .chain(["running", "groups", "café", "caroline's"].map(String::from))
            .collect();
        for _ in 0..2 {
            for w in &words {
                assert_eq!(stem_lower(w), STEMMER.stem(w), "{w}");
            }
        }
        assert!(STEMS.with(|s| s.borrow().len()) <= STEMS_REMEMBERED);
    }

    #[test]
    fn tokenizer_marks_sentences_and_keeps_clitics() {
        let toks = tokenize("Dr. Smith met Caroline's mom. Then they left!\nOk");
        let words: Vec<&str> = toks
            .iter()
            .filter(|t| t.is_word())
            .map(|t| t.surface)
            .collect();
        assert_eq!(
            words,
            vec![
                "Dr",
                "Smith",
                "met",
                "Caroline's",
                "mom",
                "Then",
                "they",
                "left",
                "Ok"
            ]
        );
        let starts: Vec<&str> = toks
            .iter()
            .filter(|t| t.sent_start)
            .map(|t| t.surface)
            .collect();
        assert_eq!(starts, vec!["Dr", "Then", "Ok"]);
        let c = toks.iter().find(|t| t.surface == "Caroline's").unwrap();
        assert_eq!(c.base(), "caroline");
        assert_eq!(c.surface_base(), "Caroline");
    }
}
