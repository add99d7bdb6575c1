//! The embedder worker: `recollect.turns.extracted` → `recollect.turns.embedded`. One dense vector
//! per field (user, assistant: never their concatenation), a sparse BM25 lexical vector, and a
//! vector per keyword (each distinct keyword text embedded once, then served from the cache).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use recollect_bus::{Delivery, Message, Stage, StageError};
use recollect_embed::Embedder;
use recollect_extract::bm25;
use recollect_model::{
    bus_key, topics, EmbeddedTurn, Embeddings, Envelope, ExtractedTurn, KeywordVector,
    SparseVector, Turn,
};
use recollect_storage::{ErasureMap, Graph};
use recollect_telemetry::events::{EmbedderBatchCompleted, InternalEvent};

/// The text a field's vector and the lexical vector are made from: speaker and words.
pub fn field_text(speaker: Option<&str>, text: &str) -> String {
    match speaker {
        Some(s) if !text.is_empty() => format!("{s}: {text}"),
        _ => text.to_string(),
    }
}

/// BM25 document weights for the turn's text (both fields, with speakers).
pub fn lexical_document_vector(turn: &Turn) -> SparseVector {
    bm25::document(&format!(
        "{}\n{}",
        field_text(turn.user_speaker.as_deref(), &turn.user),
        field_text(turn.assistant_speaker.as_deref(), &turn.assistant)
    ))
}

pub struct EmbedderStage {
    embedder: Arc<dyn Embedder>,
    /// Where erasure markers are read: turns of a conversation erased while they were queued
    /// are not embedded (the graph-writer drops them in any case; this saves the model work).
    graph: Option<Arc<dyn Graph>>,
    /// Keyword texts → vectors: each distinct keyword is embedded once.
    keyword_cache: parking_lot::Mutex<HashMap<String, Vec<f32>>>,
    cache_limit: usize,
}

impl EmbedderStage {
    pub fn new(embedder: Arc<dyn Embedder>) -> Self {
        Self {
            embedder,
            graph: None,
            keyword_cache: Default::default(),
            cache_limit: 200_000,
        }
    }

    pub fn with_erasures(mut self, graph: Arc<dyn Graph>) -> Self {
        self.graph = Some(graph);
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

    fn embed_blocking(
        embedder: &Arc<dyn Embedder>,
        texts: Vec<String>,
    ) -> Result<Vec<Vec<f32>>, StageError> {
        if texts.is_empty() {
            return Ok(vec![]);
        }
        let started = Instant::now();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let out = embedder
            .embed(&refs)
            .map_err(|e| StageError::Transient(format!("embedding failed: {e}")))?;
        EmbedderBatchCompleted {
            model: embedder.model_name(),
            texts: texts.len(),
            elapsed: started.elapsed(),
        }
        .emit();
        Ok(out)
    }

    async fn embed(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, StageError> {
        let e = self.embedder.clone();
        tokio::task::spawn_blocking(move || Self::embed_blocking(&e, texts))
            .await
            .map_err(|e| StageError::Transient(e.to_string()))?
    }
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
        let mut new_keywords: Vec<String> = Vec::new();
        {
            let cache = self.keyword_cache.lock();
            for (env, _) in decoded.iter().zip(&skip).filter(|(_, s)| !**s) {
                let Ok(env) = env else { continue };
                let t = &env.body.turn;
                texts.push(field_text(t.user_speaker.as_deref(), &t.user));
                if !t.assistant.is_empty() {
                    texts.push(field_text(t.assistant_speaker.as_deref(), &t.assistant));
                }
                for k in &env.body.extraction.keywords {
                    if !cache.contains_key(&k.text) && !new_keywords.contains(&k.text) {
                        new_keywords.push(k.text.clone());
                    }
                }
            }
        }
        let n_fields = texts.len();
        texts.extend(new_keywords.iter().cloned());
        let vectors = match self.embed(texts).await {
            Ok(v) => v,
            Err(e) => return batch.iter().map(|_| Err(e.clone())).collect(),
        };
        let (field_vecs, kw_vecs) = vectors.split_at(n_fields);
        {
            let mut cache = self.keyword_cache.lock();
            if cache.len() + new_keywords.len() > self.cache_limit {
                cache.clear();
            }
            for (k, v) in new_keywords.iter().zip(kw_vecs) {
                cache.insert(k.clone(), v.clone());
            }
        }
        let cache = self.keyword_cache.lock();
        let mut fields = field_vecs.iter();
        decoded
            .drain(..)
            .zip(skip)
            .map(|(env, skip)| {
                let env = env?;
                if skip {
                    return Ok(Vec::new());
                }
                let ExtractedTurn { turn, extraction } = env.body;
                let user = fields.next().cloned().unwrap_or_default();
                let assistant = if turn.assistant.is_empty() {
                    vec![]
                } else {
                    fields.next().cloned().unwrap_or_default()
                };
                let keywords = extraction
                    .keywords
                    .iter()
                    .filter_map(|k| {
                        cache.get(&k.text).map(|v| KeywordVector {
                            keyword: k.key.clone(),
                            vector: v.clone(),
                        })
                    })
                    .collect();
                let embeddings = Embeddings {
                    user,
                    assistant,
                    lexical: lexical_document_vector(&turn),
                    keywords,
                    model: self.embedder.model_name().to_string(),
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
