//! The embedder worker: `recollect.turns.extracted` → `recollect.turns.embedded`. One dense vector
//! per field (user, assistant: never their concatenation), a sparse BM25 lexical vector, and a
//! vector per keyword (each distinct keyword text embedded once, then served from the cache).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_embed::{pool_tokens, Embedder, TokenEmbedder};
use recollect_extract::bm25;
use recollect_model::{
    bus_key, last_words, topics, EmbeddedTurn, Embeddings, Envelope, ExtractedTurn, KeywordVector,
    SparseVector, TokenVectors, Turn,
};
use recollect_storage::{ErasureMap, Graph};
use recollect_telemetry::events::{EmbedderBatchCompleted, InternalEvent};

pub use recollect_model::field_text;

/// BM25 document weights for the turn's text (both fields, with speakers).
pub fn lexical_document_vector(turn: &Turn) -> SparseVector {
    bm25::document(&format!(
        "{}\n{}",
        field_text(turn.user_speaker.as_deref(), &turn.user),
        field_text(turn.assistant_speaker.as_deref(), &turn.assistant)
    ))
}

/// A field as the late-interaction model reads it: the words before it, its text (with the
/// speaker's name in front), and how many bytes that name takes (`field_text`'s `"name: "`),
/// which every sentence of the field shares.
struct TokenField {
    context: String,
    text: String,
    shared: usize,
}

/// A field's text for the token embedder, and where its own words begin.
#[derive(Clone, Copy)]
struct Field<'a> {
    text: &'a str,
    shared: usize,
}

impl<'a> Field<'a> {
    /// `text` is `field_text` of what was `said`: anything in front of it is the speaker's name.
    fn new(text: &'a str, said: &str) -> Self {
        let shared = text.len().saturating_sub(said.len());
        Self { text, shared }
    }
}

pub struct EmbedderStage {
    embedder: Arc<dyn Embedder>,
    /// The late-interaction model (`embedder.late_model`): each field's token vectors too.
    tokens: Option<Arc<dyn TokenEmbedder>>,
    /// Each field's token vectors pooled this many to one (`embedder.late_pool_factor`).
    pool_factor: usize,
    /// Each field read after this many words said before it (`embedder.late_context_words`).
    context_words: usize,
    /// Where erasure markers are read: turns of a conversation erased while they were queued
    /// are not embedded (the graph-writer drops them in any case; this saves the model work).
    graph: Option<Arc<dyn Graph>>,
    /// Keyword texts → vectors: each distinct keyword is embedded once.
    keyword_cache: parking_lot::Mutex<HashMap<String, Arc<[f32]>>>,
    cache_limit: usize,
}

impl EmbedderStage {
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            tokens: None,
            pool_factor: 1,
            context_words: 0,
            graph: None,
            keyword_cache: Default::default(),
            cache_limit: 200_000,
        }
    }

    /// Each field's token vectors too, from `tokens` (late interaction).
    pub fn with_token_embedder(mut self, tokens: Option<Arc<dyn TokenEmbedder>>) -> Self {
        self.tokens = tokens;
        self
    }

    /// Each field's token vectors pooled `factor` to one (`embedder.late_pool_factor`).
    pub fn with_token_pooling(mut self, factor: usize) -> Self {
        self.pool_factor = factor.max(1);
        self
    }

    /// Each field read after the last `words` words said before it in its sitting (the turn's
    /// [`ExtractedTurn::context`], then, for the assistant, the user's field): the turn's
    /// token vectors carry what it answers (docs/RECALL.md, departure 15).
    pub fn with_context_words(mut self, words: usize) -> Self {
        self.context_words = words;
        self
    }

    /// The fields' token vectors, in order, each row labelled with its sentence, pooled; none
    /// without a late-interaction model.
    async fn embed_tokens(&self, fields: Vec<TokenField>) -> Result<Vec<TokenVectors>, StageError> {
        let Some(model) = self.tokens.clone() else {
            return Ok(Vec::new());
        };
        let factor = self.pool_factor;
        let n = fields.len();
        run_model(
            model.model_name().to_string(),
            "token embedding",
            n,
            move || {
                let out = if fields.iter().all(|f| f.context.is_empty()) {
                    let texts: Vec<&str> = fields.iter().map(|f| f.text.as_str()).collect();
                    model.embed_tokens(&texts)?
                } else {
                    let pairs: Vec<(&str, &str)> = fields
                        .iter()
                        .map(|f| (f.context.as_str(), f.text.as_str()))
                        .collect();
                    model.embed_tokens_in_context(&pairs)?
                };
                // Each row's sentence, before pooling merges rows (recall's sentence term).
                let out: Vec<TokenVectors> = out
                    .into_iter()
                    .zip(&fields)
                    .map(|(mut t, f)| {
                        // A model that labels other rows than it gives leaves them unlabelled.
                        if let Some(s) = model.sentences(&f.text, f.shared, 0) {
                            if s.len() == t.len() {
                                t.segments = s;
                            }
                        }
                        t
                    })
                    .collect();
                Ok(if factor > 1 {
                    out.iter().map(|t| pool_tokens(t, factor)).collect()
                } else {
                    out
                })
            },
        )
        .await
    }

    /// A turn's fields, each with what the late-interaction model reads before it: the turn's
    /// context for the user's field; that and the user's field for the assistant's. Cut to
    /// the last `context_words` words (none when off).
    fn token_fields(
        &self,
        context: &str,
        user: Field<'_>,
        assistant: Option<Field<'_>>,
    ) -> Vec<TokenField> {
        let words = self.context_words;
        let context = last_words(context, words);
        let reply = assistant.map(|a| TokenField {
            context: last_words(&format!("{context} {}", user.text), words),
            text: a.text.to_string(),
            shared: a.shared,
        });
        let mut out = vec![TokenField {
            context,
            text: user.text.to_string(),
            shared: user.shared,
        }];
        out.extend(reply);
        out
    }

    pub fn with_erasures(mut self, graph: Arc<dyn Graph>) -> Self {
        self.graph = Some(graph);
        self
    }

    /// How many keyword vectors are kept between batches (all forgotten at once when full).
    pub fn with_keyword_cache_limit(mut self, limit: usize) -> Self {
        self.cache_limit = limit;
        self
    }

    /// Which turns of the batch an erasure marker covers (none when the markers are unreadable:
    /// the graph-writer checks again).
    async fn erased(&self, decoded: &[Result<Envelope<ExtractedTurn>, StageError>]) -> Vec<bool> {
        let Some(graph) = &self.graph else {
            return vec![false; decoded.len()];
        };
        let pairs = decoded.iter().flatten().map(|e| {
            (
                e.body.turn.tenant.clone(),
                e.body.turn.conversation_id.clone(),
            )
        });
        let m = match ErasureMap::read(graph.as_ref(), pairs).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "erasure markers unreadable; the graph-writer checks them");
                ErasureMap::default()
            }
        };
        decoded
            .iter()
            .map(|r| {
                r.as_ref().is_ok_and(|e| {
                    let t = &e.body.turn;
                    m.covers_turn(t)
                })
            })
            .collect()
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, StageError> {
        let e = self.embedder.clone();
        let n = texts.len();
        run_model(e.model_name().to_string(), "embedding", n, move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            e.embed(&refs)
        })
        .await
    }
}

/// `call` (a model over `texts` texts) on a blocking thread (the models are CPU-bound),
/// reported as one batch of `model`; a failure is transient (`what failed: …`): the batch is
/// retried.
async fn run_model<T: Default + Send + 'static>(
    model: String,
    what: &'static str,
    texts: usize,
    call: impl FnOnce() -> Result<T, recollect_embed::EmbedError> + Send + 'static,
) -> Result<T, StageError> {
    if texts == 0 {
        return Ok(T::default());
    }
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = call().map_err(|e| StageError::Transient(format!("{what} failed: {e}")))?;
        EmbedderBatchCompleted {
            model: &model,
            texts,
            elapsed: started.elapsed(),
        }
        .emit();
        Ok(out)
    })
    .await
    .map_err(|e| StageError::Transient(e.to_string()))?
}

#[async_trait]
impl Stage for EmbedderStage {
    fn name(&self) -> &'static str {
        "embedder"
    }

    fn input_topic(&self) -> &'static str {
        topics::EXTRACTED
    }

    fn max_batch(&self) -> usize {
        64
    }

    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
        let mut decoded: Vec<Result<Envelope<ExtractedTurn>, StageError>> = batch
            .iter()
            .map(|d| {
                d.message
                    .decode()
                    .map_err(|e| StageError::Permanent(format!("undecodable extracted turn: {e}")))
            })
            .collect();
        let skip = self.erased(&decoded).await;
        // One model call for every field text of the batch, one for the uncached keywords.
        let mut texts = Vec::new();
        let mut token_texts = Vec::new();
        let mut new_keywords: Vec<String> = Vec::new();
        {
            let cache = self.keyword_cache.lock();
            for (env, _) in decoded.iter().zip(&skip).filter(|(_, s)| !**s) {
                let Ok(env) = env else { continue };
                let t = &env.body.turn;
                let user = field_text(t.user_speaker.as_deref(), &t.user);
                let assistant = (!t.assistant.is_empty())
                    .then(|| field_text(t.assistant_speaker.as_deref(), &t.assistant));
                if self.tokens.is_some() {
                    let fields = self.token_fields(
                        &env.body.context,
                        Field::new(&user, &t.user),
                        assistant.as_deref().map(|a| Field::new(a, &t.assistant)),
                    );
                    token_texts.extend(fields);
                }
                texts.push(user);
                texts.extend(assistant);
                for k in &env.body.extraction.keywords {
                    if !cache.contains_key(&k.text) && !new_keywords.contains(&k.text) {
                        new_keywords.push(k.text.clone());
                    }
                }
            }
        }
        let n_fields = texts.len();
        texts.extend(new_keywords.iter().cloned());
        // Both encoders at once: each splits its texts over the cores, and one's tail overlaps
        // the other's.
        let (vectors, token_fields) =
            tokio::join!(self.embed(texts), self.embed_tokens(token_texts));
        let (vectors, mut token_fields) = match (vectors, token_fields) {
            (Ok(v), Ok(t)) => (v, t.into_iter()),
            (Err(e), _) | (_, Err(e)) => return batch.iter().map(|_| Err(e.clone())).collect(),
        };
        let with_tokens = self.tokens.is_some();
        let mut field_vecs = vectors;
        let fresh: HashMap<String, Arc<[f32]>> = new_keywords
            .into_iter()
            .zip(field_vecs.split_off(n_fields).into_iter().map(Arc::from))
            .collect();
        // Each turn's keyword vectors, this batch's new ones or the cache's, taken before the
        // cache may be emptied to make room (which used to drop a batch's cached keywords).
        let keyword_vectors: Vec<Vec<KeywordVector>> = {
            let mut cache = self.keyword_cache.lock();
            let per_turn = decoded
                .iter()
                .zip(&skip)
                .map(|(env, skip)| match env {
                    Ok(env) if !*skip => env
                        .body
                        .extraction
                        .keywords
                        .iter()
                        .filter_map(|k| {
                            let v = fresh.get(&k.text).or_else(|| cache.get(&k.text))?;
                            Some(KeywordVector {
                                keyword: k.key.clone(),
                                vector: Arc::clone(v),
                            })
                        })
                        .collect(),
                    _ => Vec::new(),
                })
                .collect();
            if cache.len() + fresh.len() > self.cache_limit {
                cache.clear();
            }
            cache.extend(fresh);
            per_turn
        };
        let mut fields = field_vecs.into_iter();
        decoded
            .drain(..)
            .zip(skip)
            .zip(keyword_vectors)
            .map(|((env, skip), keywords)| {
                let env = env?;
                if skip {
                    return Ok(Vec::new());
                }
                let ExtractedTurn {
                    turn, extraction, ..
                } = env.body;
                let user = fields.next().unwrap_or_default();
                let assistant = if turn.assistant.is_empty() {
                    vec![]
                } else {
                    fields.next().unwrap_or_default()
                };
                // The user field's token vectors, then the assistant's: MaxSim reads the turn.
                let tokens = with_tokens.then(|| {
                    let mut t = token_fields.next().unwrap_or_default();
                    if !turn.assistant.is_empty() {
                        t.extend(&token_fields.next().unwrap_or_default());
                    }
                    t
                });
                let embeddings = Embeddings {
                    user,
                    assistant,
                    lexical: lexical_document_vector(&turn),
                    keywords,
                    model: self.embedder.model_name().to_string(),
                    tokens: tokens.filter(|t| !t.is_empty()),
                };
                let key = bus_key(&turn.tenant, &turn.conversation_id);
                let out = EmbeddedTurn {
                    turn,
                    extraction,
                    embeddings,
                };
                Ok(vec![Message::json(
                    topics::EMBEDDED,
                    key,
                    Envelope::new(env.trace_id.clone(), out),
                    &env.trace_id,
                )])
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recollect_embed::{HashEmbedder, TokenEmbedder};
    use recollect_model::{Extraction, Keyword, Turn};
    use serde_json::json;

    /// A turn saying `keywords`, as the extractor hands it on in the single binary (a value,
    /// not bytes).
    fn delivery(i: usize, keywords: &[&str]) -> Delivery {
        let turn: Turn = serde_json::from_value(json!({"tenant": "acme", "conversation_id": "c",
            "turn_id": i.to_string(), "position": i, "user": format!("turn {i}"),
            "timestamp": "2024-05-01T10:00:00Z", "recorded_at": "2024-05-01T10:00:00Z"}))
        .unwrap();
        let extraction = Extraction {
            keywords: keywords
                .iter()
                .map(|k| Keyword {
                    key: k.to_string(),
                    text: k.to_string(),
                })
                .collect(),
            ..Default::default()
        };
        let body = Envelope::new(
            "tr",
            ExtractedTurn {
                turn,
                extraction,
                context: String::new(),
            },
        );
        Delivery {
            message: Message::json(topics::EXTRACTED, "acme/c".into(), body, "tr"),
            partition: 0,
            offset: i as i64,
            timestamp_ms: None,
        }
    }

    fn keywords_out(out: &[Result<Vec<Message>, StageError>]) -> Vec<Vec<(String, Vec<f32>)>> {
        out.iter()
            .map(|r| {
                let msgs = r.as_ref().unwrap();
                let e: Envelope<EmbeddedTurn> = msgs[0].decode().unwrap();
                e.body
                    .embeddings
                    .keywords
                    .iter()
                    .map(|k| (k.keyword.clone(), k.vector.to_vec()))
                    .collect()
            })
            .collect()
    }

    /// With a late-interaction model, each turn carries its fields' token vectors (the user
    /// field's rows, then the assistant's), on the bus as bytes; without one, none.
    #[tokio::test]
    async fn token_vectors_ride_with_the_turn_when_a_late_model_is_set() {
        use recollect_embed::HashTokenEmbedder;
        let tokens = Arc::new(HashTokenEmbedder);
        let stage = EmbedderStage::new(Arc::new(HashEmbedder::new(16)))
            .with_token_embedder(Some(tokens.clone()));
        let mut with_reply = delivery(1, &[]);
        let mut env: Envelope<ExtractedTurn> = with_reply.message.decode().unwrap();
        env.body.turn.assistant = "a reply".into();
        with_reply.message = Message::json(topics::EXTRACTED, "acme/c".into(), env, "tr");
        let out = stage.handle(&[delivery(0, &[]), with_reply]).await;
        let turns: Vec<EmbeddedTurn> = out
            .iter()
            .map(|r| {
                // Through the wire form, as Kafka carries it.
                let bytes = r.as_ref().unwrap()[0].payload().into_owned();
                serde_json::from_slice::<Envelope<EmbeddedTurn>>(&bytes)
                    .unwrap()
                    .body
            })
            .collect();
        let rows = |t: &str| tokens.embed_tokens(&[t]).unwrap().remove(0).len();
        let t0 = turns[0].embeddings.tokens.as_ref().unwrap();
        assert_eq!(t0.len(), rows("turn 0"));
        let t1 = turns[1].embeddings.tokens.as_ref().unwrap();
        assert_eq!(t1.len(), rows("turn 1") + rows("a reply"));
        // Each row's sentence rides with it: the user's field, then the reply's as a field of
        // its own.
        assert_eq!(t0.segments.len(), t0.len());
        let parts: Vec<u16> = t1.segments.iter().map(|s| s.part()).collect();
        let user_rows = rows("turn 1");
        assert!(parts[..user_rows].iter().all(|&p| p == 0), "{parts:?}");
        assert!(parts[user_rows..].iter().all(|&p| p == 1), "{parts:?}");
        assert!(t1.segments.iter().any(|s| s.sentence() == 1));
        let plain = EmbedderStage::new(Arc::new(HashEmbedder::new(16)));
        let out = plain.handle(&[delivery(0, &[])]).await;
        let e: Envelope<EmbeddedTurn> = out[0].as_ref().unwrap()[0].decode().unwrap();
        assert!(e.body.embeddings.tokens.is_none());
    }

    /// The late-interaction model reads each field after the turn's context (the user's), and
    /// after that and the user's field (the reply's), cut to the last words configured; with
    /// contexts off, or none given, each field alone.
    #[tokio::test]
    async fn token_vectors_read_each_field_after_the_words_before_it() {
        use recollect_embed::{EmbedError, HashTokenEmbedder};
        #[derive(Default)]
        struct Recorder(parking_lot::Mutex<Vec<(String, String)>>);
        impl TokenEmbedder for Recorder {
            fn model_name(&self) -> &str {
                "recorder"
            }
            fn dim(&self) -> usize {
                HashTokenEmbedder.dim()
            }
            fn embed_tokens(&self, texts: &[&str]) -> Result<Vec<TokenVectors>, EmbedError> {
                HashTokenEmbedder.embed_tokens(texts)
            }
            fn embed_tokens_in_context(
                &self,
                pairs: &[(&str, &str)],
            ) -> Result<Vec<TokenVectors>, EmbedError> {
                let mut seen = self.0.lock();
                seen.extend(pairs.iter().map(|(c, t)| (c.to_string(), t.to_string())));
                self.embed_tokens(&pairs.iter().map(|(_, t)| *t).collect::<Vec<_>>())
            }
        }
        let turn = |i: usize, reply: &str, context: &str| {
            let mut d = delivery(i, &[]);
            let mut env: Envelope<ExtractedTurn> = d.message.decode().unwrap();
            env.body.turn.assistant = reply.into();
            env.body.context = context.into();
            d.message = Message::json(topics::EXTRACTED, "acme/c".into(), env, "tr");
            d
        };
        let batch = [
            turn(0, "a reply", ""),
            turn(1, "", "Ann: so we went camping"),
        ];
        let recorder = Arc::new(Recorder::default());
        let stage = EmbedderStage::new(Arc::new(HashEmbedder::new(16)))
            .with_token_embedder(Some(recorder.clone()))
            .with_context_words(3);
        let out = stage.handle(&batch).await;
        assert!(out.iter().all(Result::is_ok));
        let pair = |c: &str, t: &str| (c.to_string(), t.to_string());
        assert_eq!(
            *recorder.0.lock(),
            vec![
                pair("", "turn 0"),
                pair("turn 0", "a reply"),
                pair("we went camping", "turn 1"),
            ]
        );
        // The model's rows are the field's own: as many as alone.
        let got: Envelope<EmbeddedTurn> = out[1].as_ref().unwrap()[0].decode().unwrap();
        let alone = HashTokenEmbedder
            .embed_tokens(&["turn 1"])
            .unwrap()
            .remove(0);
        assert_eq!(got.body.embeddings.tokens.unwrap(), alone);
        // Contexts off: each field alone, whatever the turn carries.
        let recorder = Arc::new(Recorder::default());
        let off = EmbedderStage::new(Arc::new(HashEmbedder::new(16)))
            .with_token_embedder(Some(recorder.clone()));
        assert!(off.handle(&batch).await.iter().all(Result::is_ok));
        assert!(recorder.0.lock().is_empty());
    }

    /// With pooling, each field is pooled on its own (so a user's words never merge with the
    /// reply's), and the turn carries the pooled rows.
    #[tokio::test]
    async fn token_vectors_are_pooled_field_by_field() {
        use recollect_embed::HashTokenEmbedder;
        let tokens = Arc::new(HashTokenEmbedder);
        let stage = EmbedderStage::new(Arc::new(HashEmbedder::new(16)))
            .with_token_embedder(Some(tokens.clone()))
            .with_token_pooling(2);
        let (user, reply) = ("we went camping by the lake", "a lovely reply");
        let mut d = delivery(0, &[]);
        let mut env: Envelope<ExtractedTurn> = d.message.decode().unwrap();
        env.body.turn.user = user.into();
        env.body.turn.assistant = reply.into();
        d.message = Message::json(topics::EXTRACTED, "acme/c".into(), env.clone(), "tr");
        let out = stage.handle(&[d]).await;
        let got: Envelope<EmbeddedTurn> = out[0].as_ref().unwrap()[0].decode().unwrap();
        let field = |speaker: &Option<String>, text: &str| {
            let t = tokens
                .embed_tokens(&[&field_text(speaker.as_deref(), text)])
                .unwrap()
                .remove(0);
            pool_tokens(&t, 2)
        };
        let mut want = field(&env.body.turn.user_speaker, user);
        want.extend(&field(&env.body.turn.assistant_speaker, reply));
        let got = got.body.embeddings.tokens.unwrap();
        assert_eq!(got.len(), want.len());
        let every = tokens.embed_tokens(&[user, reply]).unwrap();
        assert!(got.len() < every[0].len() + every[1].len());
        // One signed byte a component on the bus: equal to that precision.
        for (g, w) in got.rows().zip(want.rows()) {
            assert!(recollect_embed::cosine(g, w) > 0.999);
        }
    }

    #[tokio::test]
    async fn a_batch_keeps_its_cached_keywords_when_the_cache_is_emptied_for_new_ones() {
        let model = HashEmbedder::new(16);
        let want = |k: &str| model.embed(&[k]).unwrap().remove(0);
        let stage = EmbedderStage::new(Arc::new(HashEmbedder::new(16))).with_keyword_cache_limit(3);
        // "pottery" is cached by the first batch; the second brings three new keywords beside
        // it, more than the cache holds, so the cache is emptied to make room.
        let first = stage.handle(&[delivery(0, &["pottery"])]).await;
        assert_eq!(
            keywords_out(&first),
            vec![vec![("pottery".into(), want("pottery"))]]
        );
        let second = stage
            .handle(&[
                delivery(1, &["pottery", "kiln"]),
                delivery(2, &["glaze", "wheel", "pottery"]),
            ])
            .await;
        let got = keywords_out(&second);
        let names: Vec<Vec<&str>> = got
            .iter()
            .map(|t| t.iter().map(|(k, _)| k.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![vec!["pottery", "kiln"], vec!["glaze", "wheel", "pottery"]]
        );
        for (k, v) in got.iter().flatten() {
            assert_eq!(*v, want(k), "{k}");
        }
        // And the next batch still finds what the last one embedded.
        let third = stage.handle(&[delivery(3, &["kiln"])]).await;
        assert_eq!(
            keywords_out(&third),
            vec![vec![("kiln".into(), want("kiln"))]]
        );
    }
}
