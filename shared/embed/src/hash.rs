//! A deterministic feature-hashing embedder: lexical only, not semantic.

use crate::{l2_normalize, EmbedError, Embedder};

/// Default dimension of [`HashEmbedder`], equal to all-MiniLM-L6-v2's so the two are
/// interchangeable in a vector store's schema.
pub const HASH_DIM: usize = 384;

/// Weight of a whole-word feature.
const WORD_WEIGHT: f32 = 1.0;
/// Weight of one character trigram (a word of n characters yields n trigrams).
const TRIGRAM_WEIGHT: f32 = 0.5;

/// A deterministic feature-hashing embedder ("the hashing trick").
///
/// Text is lower-cased and split into words on every non-alphanumeric character. Each word
/// contributes itself (weight 1.0) and its character trigrams over `^word$` (weight 0.5 each),
/// every feature hashed (FNV-1a + a 64-bit mixer, stable across platforms, runs and releases)
/// into one of `dim` buckets with a pseudo-random sign; the sum is L2-normalised.
///
/// **Lexical only, not semantic**: texts score as similar when they share words or word
/// fragments ("puppy"/"puppies"), never because they mean the same thing ("puppy"/"dog"). It
/// needs no model files and embeds tens of thousands of short texts per second, which makes it
/// the embedder for fast tests and the explicit `embedder = "hash"` option.
///
/// A text with no alphanumeric character (e.g. `""`) has no features and embeds as the zero
/// vector, whose cosine with anything is 0.
#[derive(Debug, Clone)]
pub struct HashEmbedder {
    dim: usize,
    name: String,
}

impl Default for HashEmbedder {
    fn default() -> Self {
        Self::new(HASH_DIM)
    }
}

impl HashEmbedder {
    /// A hashing embedder with `dim` buckets (must be > 0).
    pub fn new(dim: usize) -> Self {
        assert!(dim > 0, "HashEmbedder dimension must be positive");
        Self {
            dim,
            name: format!("hash-{dim}"),
        }
    }

    /// Embeds one text (the allocation-free core of [`Embedder::embed`]).
    pub fn embed_one(&self, text: &str) -> Vec<f32> {
        let mut v = vec![0.0f32; self.dim];
        let mut word: Vec<char> = Vec::with_capacity(32);
        let lower = text.to_lowercase();
        let mut chars = lower.chars().peekable();
        loop {
            word.clear();
            while let Some(&c) = chars.peek() {
                if c.is_alphanumeric() {
                    break;
                }
                chars.next();
            }
            while let Some(&c) = chars.peek() {
                if !c.is_alphanumeric() {
                    break;
                }
                word.push(c);
                chars.next();
            }
            if word.is_empty() {
                break;
            }
            self.add_word(&mut v, &word);
        }
        l2_normalize(&mut v);
        v
    }

    fn add_word(&self, v: &mut [f32], word: &[char]) {
        let mut h = Fnv::new(b'w');
        for &c in word {
            h.push_char(c);
        }
        self.add_feature(v, h.finish(), WORD_WEIGHT);

        // Trigrams over ^word$ ('^'/'$' cannot occur inside a word: words are alphanumeric).
        let padded_len = word.len() + 2;
        let at = |i: usize| -> char {
            if i == 0 {
                '^'
            } else if i == padded_len - 1 {
                '$'
            } else {
                word[i - 1]
            }
        };
        for start in 0..padded_len.saturating_sub(2) {
            let mut h = Fnv::new(b't');
            for i in start..start + 3 {
                h.push_char(at(i));
            }
            self.add_feature(v, h.finish(), TRIGRAM_WEIGHT);
        }
    }

    fn add_feature(&self, v: &mut [f32], hash: u64, weight: f32) {
        let bucket = (hash % self.dim as u64) as usize;
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        v[bucket] += sign * weight;
    }
}

impl Embedder for HashEmbedder {
    fn model_name(&self) -> &str {
        &self.name
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts.iter().map(|t| self.embed_one(t)).collect())
    }
}

/// FNV-1a over UTF-8 bytes, with a kind tag so words and trigrams never collide, finished by
/// the splitmix64 mixer so bucket and sign bits are well spread.
struct Fnv(u64);

impl Fnv {
    fn new(tag: u8) -> Self {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        h.push_byte(tag);
        h
    }

    fn push_byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
    }

    fn push_char(&mut self, c: char) {
        let mut buf = [0u8; 4];
        for &b in c.encode_utf8(&mut buf).as_bytes() {
            self.push_byte(b);
        }
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cosine;

    #[test]
    fn deterministic_and_normalised() {
        let e = HashEmbedder::default();
        let a = e.embed(&["Hello, World! héllo wörld 42"]).unwrap();
        let b = e.embed(&["Hello, World! héllo wörld 42"]).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].len(), HASH_DIM);
        let norm: f32 = a[0].iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
        // Stable across runs and releases: a pinned value guards against hash changes, which
        // would silently invalidate stored vectors.
        // "hello" = the word (1.0) + ^he hel ell llo lo$ (0.5 each), norm 1.5.
        let v = e.embed_one("hello");
        let nonzero: Vec<(usize, f32)> = v
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, x)| *x != 0.0)
            .collect();
        let (t, w) = (0.5 / 1.5, 1.0 / 1.5);
        let want = [(13, t), (19, t), (84, -t), (208, -t), (264, w), (270, -t)];
        assert_eq!(nonzero.len(), want.len(), "{nonzero:?}");
        for ((i, x), (wi, wx)) in nonzero.iter().zip(want) {
            assert_eq!(*i, wi, "{nonzero:?}");
            assert!((x - wx).abs() < 1e-6, "{nonzero:?}");
        }
        assert_eq!(e.model_name(), "hash-384");
    }

    #[test]
    fn case_and_punctuation_insensitive() {
        let e = HashEmbedder::default();
        let a = e.embed_one("I adopted a puppy.");
        let b = e.embed_one("i ADOPTED a puppy");
        assert!((cosine(&a, &b) - 1.0).abs() < 1e-5);
    }

    #[test]
    fn similar_texts_closer_than_unrelated() {
        let e = HashEmbedder::default();
        let q = e.embed_one("I adopted a puppy last week");
        let near = e.embed_one("we adopted two puppies this week");
        let far = e.embed_one("The quarterly tax filing is due");
        let (cn, cf) = (cosine(&q, &near), cosine(&q, &far));
        assert!(cn > cf + 0.2, "near {cn} far {cf}");
    }

    #[test]
    fn empty_text_is_zero_vector() {
        let e = HashEmbedder::default();
        let v = e.embed(&["", "  ,;  "]).unwrap();
        assert!(v
            .iter()
            .all(|v| v.len() == HASH_DIM && v.iter().all(|x| *x == 0.0)));
    }

    #[test]
    fn custom_dim() {
        let e = HashEmbedder::new(64);
        assert_eq!(e.dim(), 64);
        assert_eq!(e.embed_one("abc def").len(), 64);
    }
}
