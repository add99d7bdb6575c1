//! A bounded cache in front of any [`Embedder`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use recollect_model::{Segment, TokenVectors};

use crate::{EmbedError, Embedder, TokenEmbedder};

/// Default number of cached texts. At 384 dimensions a full cache holds about 160 MB of
/// vectors plus the keys; use [`CachedEmbedder::with_capacity`] to trade memory for hits.
pub const DEFAULT_CACHE_CAPACITY: usize = 100_000;

/// Hit/miss counters of a [`CachedEmbedder`], e.g. for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheStats {
    /// Texts not sent to the inner embedder (cached, or repeated within one call).
    pub hits: u64,
    /// Texts passed to the inner embedder.
    pub misses: u64,
    /// Texts currently cached.
    pub len: usize,
}

/// Texts and their vectors, the recently used kept.
type Generations = recollect_model::Generations<String, Arc<[f32]>>;

/// Wraps an [`Embedder`] with a bounded cache keyed by the exact text, for texts that repeat
/// (queries, keywords, entity names). [`Embedder::embed`] serves hits from the cache and sends
/// the distinct misses to the inner embedder in one batch, so one call costs at most one inner
/// call. Results are identical to the inner embedder's.
///
/// The lock is not held while the inner embedder runs: two threads missing the same text at
/// once may both embed it, which is harmless.
pub struct CachedEmbedder<E> {
    inner: E,
    cache: Mutex<Generations>,
    /// Queries apart: an asymmetric model embeds the same text differently as a query.
    queries: Mutex<Generations>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<E: Embedder> CachedEmbedder<E> {
    /// A cache of [`DEFAULT_CACHE_CAPACITY`] texts around `inner`.
    pub fn new(inner: E) -> Self {
        Self::with_capacity(inner, DEFAULT_CACHE_CAPACITY)
    }

    /// A cache of at most `capacity` texts (at least 2) around `inner`, and as many queries for
    /// an asymmetric model.
    pub fn with_capacity(inner: E, capacity: usize) -> Self {
        // Documents and queries get a cache each; the query one fills only for an asymmetric
        // model (the others serve queries from the document cache).
        let half = (capacity / 2).max(1);
        let generations = || Mutex::new(Generations::new(half));
        Self {
            inner,
            cache: generations(),
            queries: generations(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The wrapped embedder.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// Counters since creation, and the current size.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            len: self.cache.lock().len() + self.queries.lock().len(),
        }
    }

    /// Empties the cache (the counters are kept).
    pub fn clear(&self) {
        for cache in [&self.cache, &self.queries] {
            cache.lock().clear();
        }
    }

    /// Serves `texts` from `cache`, sending the distinct misses to `embed` in one call.
    fn cached(
        &self,
        cache: &Mutex<Generations>,
        texts: &[&str],
        embed: impl FnOnce(&[&str]) -> Result<Vec<Vec<f32>>, EmbedError>,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let counters = (&self.hits, &self.misses);
        let out = serve(cache, counters, texts, |misses| {
            Ok(embed(misses)?.into_iter().map(Arc::from).collect())
        })?;
        Ok(out.into_iter().map(|v: Arc<[f32]>| v.to_vec()).collect())
    }
}

/// Serves `texts` from `cache`, sending the distinct misses to `embed` in one call and keeping
/// what it gives. The lock is not held while `embed` runs.
fn serve<V: Clone>(
    cache: &Mutex<recollect_model::Generations<String, V>>,
    (hits, misses_counter): (&AtomicU64, &AtomicU64),
    texts: &[&str],
    embed: impl FnOnce(&[&str]) -> Result<Vec<V>, EmbedError>,
) -> Result<Vec<V>, EmbedError> {
    let mut out: Vec<Option<V>> = Vec::with_capacity(texts.len());
    // Distinct missing texts, and for each input slot the index of its miss.
    let mut misses: Vec<&str> = Vec::new();
    let mut miss_index: HashMap<&str, usize> = HashMap::new();
    let mut pending: Vec<(usize, usize)> = Vec::new();
    {
        let mut cache = cache.lock();
        for (slot, &text) in texts.iter().enumerate() {
            match cache.get(text) {
                Some(v) => out.push(Some(v)),
                None => {
                    let i = *miss_index.entry(text).or_insert_with(|| {
                        misses.push(text);
                        misses.len() - 1
                    });
                    pending.push((slot, i));
                    out.push(None);
                }
            }
        }
    }
    // Repeats of a miss within one call count as hits: they are not embedded again.
    hits.fetch_add((texts.len() - misses.len()) as u64, Ordering::Relaxed);

    if !misses.is_empty() {
        misses_counter.fetch_add(misses.len() as u64, Ordering::Relaxed);
        let fresh = embed(&misses)?;
        if fresh.len() != misses.len() {
            return Err(EmbedError::CountMismatch {
                expected: misses.len(),
                got: fresh.len(),
            });
        }
        {
            let mut cache = cache.lock();
            for (text, v) in misses.iter().zip(&fresh) {
                cache.insert((*text).to_owned(), v.clone());
            }
        }
        for (slot, i) in pending {
            out[slot] = Some(fresh[i].clone());
        }
    }
    // Every slot is either a hit or a miss filled above.
    Ok(out.into_iter().flatten().collect())
}

impl<E: Embedder> Embedder for CachedEmbedder<E> {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn runtime(&self) -> &str {
        self.inner.runtime()
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.cached(&self.cache, texts, |t| self.inner.embed(t))
    }

    fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        if !self.inner.is_asymmetric() {
            return self.embed(texts);
        }
        self.cached(&self.queries, texts, |t| self.inner.embed_queries(t))
    }

    fn is_asymmetric(&self) -> bool {
        self.inner.is_asymmetric()
    }

    fn cosine_scale(&self) -> crate::CosineScale {
        self.inner.cosine_scale()
    }
}

/// Default number of questions whose token vectors [`CachedTokenEmbedder`] keeps. A question
/// of 20 tokens at 384 dimensions is ~30 KB of f32, so a full cache is ~120 MB at most.
pub const DEFAULT_TOKEN_CACHE_CAPACITY: usize = 4_096;

/// Texts and their token vectors, the recently used kept.
type TokenGenerations = recollect_model::Generations<String, Arc<TokenVectors>>;

/// Wraps a [`TokenEmbedder`] with a bounded cache of [`TokenEmbedder::embed_tokens`] keyed by
/// the exact text: recall asks it for the question's token vectors, which a repeated question
/// would otherwise encode again (the late model is a recall's largest fixed cost once the
/// sentence encoder's vectors are cached). Token vectors read in context (a turn's, at ingest)
/// and sentence boundaries pass straight through: contexts do not repeat. Results are identical
/// to the inner model's.
pub struct CachedTokenEmbedder<T> {
    inner: T,
    cache: Mutex<TokenGenerations>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<T: TokenEmbedder> CachedTokenEmbedder<T> {
    /// A cache of [`DEFAULT_TOKEN_CACHE_CAPACITY`] texts around `inner`.
    pub fn new(inner: T) -> Self {
        Self::with_capacity(inner, DEFAULT_TOKEN_CACHE_CAPACITY)
    }

    /// A cache of at most `capacity` texts (at least 2) around `inner`.
    pub fn with_capacity(inner: T, capacity: usize) -> Self {
        Self {
            inner,
            cache: Mutex::new(TokenGenerations::new((capacity / 2).max(1))),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Counters since creation, and the current size.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            len: self.cache.lock().len(),
        }
    }

    /// Empties the cache (the counters are kept).
    pub fn clear(&self) {
        self.cache.lock().clear();
    }
}

impl<T: TokenEmbedder> TokenEmbedder for CachedTokenEmbedder<T> {
    fn model_name(&self) -> &str {
        self.inner.model_name()
    }

    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
        let counters = (&self.hits, &self.misses);
        let out = serve(&self.cache, counters, texts, |misses| {
            Ok(self
                .inner
                .embed_tokens(misses)?
                .into_iter()
                .map(Arc::new)
                .collect())
        })?;
        Ok(out.into_iter().map(|v| (*v).clone()).collect())
    }

    fn embed_tokens_in_context(
        &self,
        pairs: &[(&str, &str)],
    ) -> Result<Vec<TokenVectors>, EmbedError> {
        self.inner.embed_tokens_in_context(pairs)
    }

    fn sentences(&self, text: &str, shared: usize, part: u16) -> Option<Vec<Segment>> {
        self.inner.sentences(text, shared, part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HashEmbedder;
    use std::sync::atomic::AtomicUsize;

    /// Counts inner calls and texts.
    struct Counting {
        inner: HashEmbedder,
        calls: AtomicUsize,
        texts: AtomicUsize,
    }

    impl Embedder for Counting {
        fn model_name(&self) -> &str {
            "counting"
        }
        fn dim(&self) -> usize {
            self.inner.dim()
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.texts.fetch_add(texts.len(), Ordering::SeqCst);
            self.inner.embed(texts)
        }
    }

    fn counting() -> Counting {
        Counting {
            inner: HashEmbedder::default(),
            calls: AtomicUsize::new(0),
            texts: AtomicUsize::new(0),
        }
    }

    #[test]
    fn second_call_served_from_cache() {
        let c = CachedEmbedder::new(counting());
        let first = c.embed(&["alpha", "beta", "alpha"]).unwrap();
        assert_eq!(c.inner().calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            c.inner().texts.load(Ordering::SeqCst),
            2,
            "duplicates embedded once"
        );
        let second = c.embed(&["beta", "alpha"]).unwrap();
        assert_eq!(
            c.inner().calls.load(Ordering::SeqCst),
            1,
            "no inner call on all hits"
        );
        assert_eq!(second, vec![first[1].clone(), first[0].clone()]);
        assert_eq!(first[0], first[2]);

        // A mixed call embeds only the miss, in one batch, and keeps the order.
        let third = c.embed(&["alpha", "gamma", "beta"]).unwrap();
        assert_eq!(c.inner().calls.load(Ordering::SeqCst), 2);
        assert_eq!(c.inner().texts.load(Ordering::SeqCst), 3);
        assert_eq!(third[0], first[0]);
        assert_eq!(third[1], HashEmbedder::default().embed_one("gamma"));
        assert_eq!(third[2], first[1]);

        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.len),
            (5, 3, 3),
            "5 texts served without embedding"
        );
        assert_eq!(c.model_name(), "counting");
        assert!(c.embed(&[]).unwrap().is_empty());
    }

    #[test]
    fn bounded() {
        let c = CachedEmbedder::with_capacity(counting(), 10);
        for i in 0..100 {
            c.embed(&[&format!("text {i}")]).unwrap();
            assert!(c.stats().len <= 10);
        }
        // The most recent texts are still cached.
        let calls = c.inner().calls.load(Ordering::SeqCst);
        c.embed(&["text 99", "text 98"]).unwrap();
        assert_eq!(c.inner().calls.load(Ordering::SeqCst), calls);
    }

    #[test]
    fn hits_in_old_generation_survive_rotation() {
        let c = CachedEmbedder::with_capacity(counting(), 4);
        c.embed(&["keep", "a"]).unwrap(); // young = {keep, a}
        c.embed(&["b"]).unwrap(); // rotate: old = {keep, a}, young = {b}
        c.embed(&["keep"]).unwrap(); // promoted to young
        c.embed(&["c", "d"]).unwrap(); // rotations drop a
        let calls = c.inner().calls.load(Ordering::SeqCst);
        c.embed(&["keep"]).unwrap();
        assert_eq!(c.inner().calls.load(Ordering::SeqCst), calls);
    }

    /// Counts the token model's calls and texts, by kind.
    #[derive(Default)]
    struct CountingTokens {
        inner: crate::HashTokenEmbedder,
        questions: AtomicUsize,
        in_context: AtomicUsize,
    }

    impl TokenEmbedder for CountingTokens {
        fn model_name(&self) -> &str {
            "counting-tokens"
        }
        fn dim(&self) -> usize {
            self.inner.dim()
        }
        fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
            self.questions.fetch_add(texts.len(), Ordering::SeqCst);
            self.inner.embed_tokens(texts)
        }
        fn embed_tokens_in_context(
            &self,
            pairs: &[(&str, &str)],
        ) -> Result<Vec<TokenVectors>, EmbedError> {
            self.in_context.fetch_add(pairs.len(), Ordering::SeqCst);
            self.inner.embed_tokens_in_context(pairs)
        }
        fn sentences(&self, text: &str, shared: usize, part: u16) -> Option<Vec<Segment>> {
            self.inner.sentences(text, shared, part)
        }
    }

    #[test]
    fn a_repeated_question_is_encoded_once_and_turns_always() {
        let c = CachedTokenEmbedder::new(CountingTokens::default());
        let plain = crate::HashTokenEmbedder;
        let q = "What activities has Melanie done with her family?";
        let first = c.embed_tokens(&[q, "another", q]).unwrap();
        assert_eq!(
            c.inner.questions.load(Ordering::SeqCst),
            2,
            "repeats in one call once"
        );
        let again = c.embed_tokens(&[q]).unwrap();
        assert_eq!(
            c.inner.questions.load(Ordering::SeqCst),
            2,
            "served from the cache"
        );
        // What the cache gives is what the model gives.
        assert_eq!(again[0], plain.embed_tokens(&[q]).unwrap()[0]);
        assert_eq!(first[0], first[2]);
        assert_eq!(first[1], plain.embed_tokens(&["another"]).unwrap()[0]);
        assert_eq!((c.stats().hits, c.stats().misses, c.stats().len), (2, 2, 2));

        // A turn's tokens, read after its context, are never cached.
        for _ in 0..2 {
            let t = c.embed_tokens_in_context(&[("before", q)]).unwrap();
            assert_eq!(t, plain.embed_tokens_in_context(&[("before", q)]).unwrap());
        }
        assert_eq!(c.inner.in_context.load(Ordering::SeqCst), 2);
        assert_eq!(c.sentences(q, 0, 1), plain.sentences(q, 0, 1));
        assert_eq!((c.model_name(), c.dim()), ("counting-tokens", plain.dim()));

        c.clear();
        c.embed_tokens(&[q]).unwrap();
        assert_eq!(
            c.inner.questions.load(Ordering::SeqCst),
            3,
            "cleared, encoded again"
        );
    }

    #[test]
    fn the_token_cache_is_bounded() {
        let c = CachedTokenEmbedder::with_capacity(CountingTokens::default(), 8);
        for i in 0..50 {
            c.embed_tokens(&[&format!("question {i}")]).unwrap();
            assert!(c.stats().len <= 8);
        }
        c.embed_tokens(&["question 49"]).unwrap();
        assert_eq!(
            c.inner.questions.load(Ordering::SeqCst),
            50,
            "the latest kept"
        );
    }
}
