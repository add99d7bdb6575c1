//! Recall, written once against the seams and readable beside the KeyMem paper
//! (../shared/RECALL.md §1): Phase 1 analyse the query, Phase 2 run Path B and Path C (when
//! `recall.path_c` is on; off by default, docs/RECALL.md) beside the dense field max-sim and
//! BM25 retrievers, Phase 3 in three steps: fetch the candidates
//! (every store read, `fetch.rs`), score them as KeyMem does (a pure function, `keymem.rs`),
//! fuse with the lexical and time evidence and rank (a pure function, `fuse.rs`). Every
//! returned memory says which paths found it and how its score was made.

pub mod category;
mod config;
pub mod fetch;
pub mod fuse;
pub mod keymem;
mod path_b;
mod path_c;
pub mod softtfidf;
#[cfg(test)]
mod testing;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use recollect_embed::{Embedder, Reranker, TokenEmbedder};
use recollect_extract::{analyse_query, QueryAnalysis};
use recollect_model::{
    Classify, ErrorKind, MemoryId, RecalledMemory, ReferenceState, TenantId, TurnFilter,
};
use recollect_storage::{
    Graph, NodeKind, Scope, StoreError, VectorField, VectorIndex, VectorQuery,
};
use recollect_telemetry::events::{
    InternalEvent, RecallCandidatesFound, RecallCompleted, RecallPhase, RecallPhaseCompleted,
    RecallReranked, RerankOutcome,
};
use serde::{Deserialize, Serialize};

pub use config::{Ablation, Component, RecallConfig, RecallLimits};
pub use fetch::{Candidate, Candidates, Found, Retrieved};
pub use keymem::{KeyMemQuery, KeyMemScore};
pub use path_b::PathB;
pub use path_c::PathC;

#[derive(Debug, thiserror::Error)]
pub enum RecallError {
    #[error("{0}")]
    Invalid(String),
    #[error("unknown conversation {0:?}")]
    UnknownConversation(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("query embedding failed: {0}")]
    Embed(String),
}

impl Classify for RecallError {
    fn kind(&self) -> ErrorKind {
        match self {
            RecallError::Invalid(_) => ErrorKind::InvalidArgument,
            RecallError::UnknownConversation(_) => ErrorKind::NotFound,
            RecallError::Store(e) => e.kind(),
            RecallError::Embed(_) => ErrorKind::Unavailable,
        }
    }
}

/// `POST /v1/recall` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallRequest {
    pub query: String,
    #[serde(default)]
    pub conversation_ids: Option<Vec<String>>,
    /// 1..1000; default 30.
    #[serde(default)]
    pub k: Option<i64>,
    /// The application's reference state, to resolve pronouns in the query.
    #[serde(default)]
    pub attention_state: Option<ReferenceState>,
    /// Anchor for relative times in the query ("last week"); absent: only absolute dates count.
    #[serde(default)]
    pub now: Option<DateTime<Utc>>,
    /// Only turns of these end users (any of them).
    #[serde(default)]
    pub user_ids: Option<Vec<String>>,
    /// Only turns of these agents (any of them).
    #[serde(default)]
    pub agent_ids: Option<Vec<String>>,
    /// Only turns whose timestamp is at or after this.
    #[serde(default)]
    pub from: Option<DateTime<Utc>>,
    /// Only turns whose timestamp is before this.
    #[serde(default)]
    pub to: Option<DateTime<Utc>>,
    /// Only turns where one of these spoke (exact match on either speaker).
    #[serde(default)]
    pub speakers: Option<Vec<String>>,
    /// Only turns whose metadata has each of these keys equal to the value given (string,
    /// number or boolean; keys of letters, digits, _ and -).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<BTreeMap<String, serde_json::Value>>,
    /// Transaction time: recall what Recollect held then (each turn's version current at that
    /// time; nothing recorded later). An erased turn is never returned, whatever the time.
    #[serde(default)]
    pub as_of: Option<DateTime<Utc>>,
}

impl RecallRequest {
    /// The turn-level part of the request's scope.
    pub fn filter(&self) -> TurnFilter {
        TurnFilter {
            user_ids: self.user_ids.clone().unwrap_or_default(),
            agent_ids: self.agent_ids.clone().unwrap_or_default(),
            speakers: self.speakers.clone().unwrap_or_default(),
            from: self.from,
            to: self.to,
            metadata: self.metadata.clone().unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecallResponse {
    pub memories: Vec<RecalledMemory>,
}

pub struct Recall {
    graph: Arc<dyn Graph>,
    vectors: Arc<dyn VectorIndex>,
    embedder: Arc<dyn Embedder>,
    /// The cross-encoder `recall.rerank_model` names, if any.
    reranker: Option<Arc<dyn Reranker>>,
    /// The late-interaction model `embedder.late_model` names, if any (the question's token
    /// vectors; the turns' were made at ingest).
    tokens: Option<Arc<dyn TokenEmbedder>>,
    config: RecallConfig,
    limits: RecallLimits,
}

/// The query's embeddings: the whole question, one per query/answer keyword, and the category
/// phrase's when the category term reads one.
pub(crate) struct QueryVectors {
    pub query: Vec<f32>,
    pub keywords: Vec<(String, Vec<f32>)>,
    pub category: Option<Vec<f32>>,
}

impl Recall {
    pub fn new(
        graph: Arc<dyn Graph>,
        vectors: Arc<dyn VectorIndex>,
        embedder: Arc<dyn Embedder>,
        config: RecallConfig,
        limits: RecallLimits,
    ) -> Self {
        Self {
            graph,
            vectors,
            embedder,
            reranker: None,
            tokens: None,
            config,
            limits,
        }
    }

    /// The same recall, re-reading its top `recall.rerank_depth` results with `reranker`.
    pub fn with_reranker(self, reranker: Option<Arc<dyn Reranker>>) -> Self {
        Self { reranker, ..self }
    }

    pub fn reranker(&self) -> Option<&Arc<dyn Reranker>> {
        self.reranker.as_ref()
    }

    /// The same recall, re-scoring its top `recall.late_depth` results by late interaction
    /// with `tokens` (the model the turns' token vectors were made with).
    pub fn with_token_embedder(self, tokens: Option<Arc<dyn TokenEmbedder>>) -> Self {
        Self { tokens, ..self }
    }

    pub fn token_embedder(&self) -> Option<&Arc<dyn TokenEmbedder>> {
        self.tokens.as_ref()
    }

    pub fn config(&self) -> &RecallConfig {
        &self.config
    }

    /// The same recall over the same stores and embedder, with other constants (an evaluation
    /// comparing configurations on one ingest).
    pub fn with_config(&self, config: RecallConfig) -> Self {
        Self {
            graph: self.graph.clone(),
            vectors: self.vectors.clone(),
            embedder: self.embedder.clone(),
            reranker: self.reranker.clone(),
            tokens: self.tokens.clone(),
            config,
            limits: self.limits,
        }
    }

    pub fn limits(&self) -> &RecallLimits {
        &self.limits
    }

    pub fn graph(&self) -> &Arc<dyn Graph> {
        &self.graph
    }

    pub fn vectors(&self) -> &Arc<dyn VectorIndex> {
        &self.vectors
    }

    /// Embeds `texts[0]` as the query and the rest (the query's keywords, matched against the
    /// keywords stored with the turns) as documents; one batch when the model makes no
    /// difference between the two.
    async fn embed_query_and(&self, texts: Vec<String>) -> Result<Vec<Vec<f32>>, RecallError> {
        let e = self.embedder.clone();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            if !e.is_asymmetric() {
                return e.embed(&refs);
            }
            let (query, keywords) = refs.split_at(refs.len().min(1));
            let mut out = e.embed_queries(query)?;
            out.extend(e.embed(keywords)?);
            Ok(out)
        })
        .await
        .map_err(|e| RecallError::Embed(e.to_string()))?
        .map_err(|e| RecallError::Embed(e.to_string()))
    }

    /// Phase 1 (KeyMem §1 Recall): query analysis without an LLM, plus its embeddings.
    async fn analyse(
        &self,
        req: &RecallRequest,
        ablation: &Ablation,
    ) -> Result<(QueryAnalysis, QueryVectors), RecallError> {
        let qa = analyse_query(&req.query, req.now, req.attention_state.as_ref());
        let mut kw_texts: Vec<String> = Vec::new();
        for k in qa.keywords.iter().chain(qa.answer_keywords.iter()) {
            if !kw_texts.contains(&k.text) {
                kw_texts.push(k.text.clone());
            }
        }
        let keys: Vec<String> = kw_texts.clone();
        let mut texts = vec![req.query.clone()];
        texts.extend(kw_texts);
        // The category phrase is matched against stored keywords, so it is embedded as they are.
        let category = qa.category.clone().filter(|_| {
            self.config.category_weight > 0.0 && !ablation.without(Component::Category)
        });
        let with_category = category.is_some();
        texts.extend(category);
        let mut vecs: Vec<Vec<f32>> = self.embed_query_and(texts).await?;
        let category = if with_category { vecs.pop() } else { None };
        let mut vecs = vecs.into_iter();
        let query = vecs.next().unwrap_or_default();
        Ok((
            qa,
            QueryVectors {
                query,
                keywords: keys.into_iter().zip(vecs).collect(),
                category,
            },
        ))
    }

    /// Dense field max-sim retrieval: search each field, keep the best field score per turn.
    async fn dense(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        q: &[f32],
        limit: usize,
    ) -> Result<HashMap<MemoryId, f32>, RecallError> {
        let user = VectorQuery::Dense {
            field: VectorField::User,
            vector: q.to_vec(),
        };
        let assistant = VectorQuery::Dense {
            field: VectorField::Assistant,
            vector: q.to_vec(),
        };
        let (u, a) = tokio::join!(
            self.vectors.search(tenant, scope, &user, limit),
            self.vectors.search(tenant, scope, &assistant, limit),
        );
        let mut out: HashMap<MemoryId, f32> = HashMap::new();
        for (id, s) in u?.into_iter().chain(a?) {
            let e = out.entry(id).or_insert(f32::MIN);
            *e = e.max(s);
        }
        Ok(out)
    }

    /// BM25 over the scope, without the names of the question that most of the scope's turns
    /// carry (`recall.lexical_common_name_share`).
    async fn lexical(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        query: &str,
        names: &[String],
        entities: &ScopeEntities<'_>,
        limit: usize,
    ) -> Result<HashMap<MemoryId, f32>, RecallError> {
        let common = self.common_names(entities, names).await?;
        let q = recollect_extract::bm25::query_without(query, &common);
        if q.indices.is_empty() {
            return Ok(HashMap::new());
        }
        Ok(self
            .vectors
            .search(tenant, scope, &VectorQuery::Lexical(q), limit)
            .await?
            .into_iter()
            .collect())
    }

    /// The question's names (entities) linked to at least `lexical_common_name_share` of the
    /// scope's turns: a conversation's speakers, who are on every turn. The vector index's
    /// IDF counts the whole index, where such a name is rare, so left in the BM25 query it
    /// would add to every turn of the scope, the short ones most.
    async fn common_names(
        &self,
        entities: &ScopeEntities<'_>,
        names: &[String],
    ) -> Result<Vec<String>, RecallError> {
        let share = f64::from(self.config.lexical_common_name_share);
        if names.is_empty() || share <= 0.0 {
            return Ok(Vec::new());
        }
        // The question may spell a name in another case than the graph keeps it in.
        let wanted: Vec<String> = names.iter().map(|n| n.to_lowercase()).collect();
        let stored: Vec<String> = entities
            .names()
            .await?
            .iter()
            .filter(|n| wanted.contains(&n.to_lowercase()))
            .cloned()
            .collect();
        if stored.is_empty() {
            return Ok(Vec::new());
        }
        let (turns, dfs) = self
            .graph
            .document_frequencies(entities.tenant, &entities.scope, NodeKind::Entity, &stored)
            .await?;
        Ok(stored
            .into_iter()
            .zip(dfs)
            .filter(|&(_, df)| turns > 0 && df as f64 >= share * turns as f64)
            .map(|(name, _)| name)
            .collect())
    }

    /// Checks the request and the caller's conversations; returns the scope and k.
    pub async fn validate(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<(Scope, usize), RecallError> {
        if req.query.trim().is_empty() {
            return Err(RecallError::Invalid("query is empty or whitespace".into()));
        }
        if req.query.len() > self.limits.max_query_bytes {
            return Err(RecallError::Invalid(format!(
                "query is {} bytes, the limit is {}",
                req.query.len(),
                self.limits.max_query_bytes
            )));
        }
        if let Some(c) = req
            .query
            .chars()
            .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        {
            return Err(RecallError::Invalid(format!(
                "query contains the control character U+{:04X}; only tab, CR and LF are allowed",
                c as u32
            )));
        }
        if let Some(now) = req.now {
            let year = chrono::Datelike::year(&now);
            if !(1900..=2200).contains(&year) {
                return Err(RecallError::Invalid(format!(
                    "now: year {year} is out of range"
                )));
            }
        }
        if let Some(st) = &req.attention_state {
            st.check_client_supplied().map_err(RecallError::Invalid)?;
        }
        if let Some(at) = req.as_of {
            let year = chrono::Datelike::year(&at);
            if !(1900..=2200).contains(&year) {
                return Err(RecallError::Invalid(format!(
                    "as_of: year {year} is out of range"
                )));
            }
        }
        let k = req.k.unwrap_or(self.limits.default_k as i64);
        if k <= 0 || k > self.limits.max_k as i64 {
            return Err(RecallError::Invalid(format!(
                "k must be in 1..={}, got {k}",
                self.limits.max_k
            )));
        }
        for (field, list) in [
            ("user_ids", &req.user_ids),
            ("agent_ids", &req.agent_ids),
            ("speakers", &req.speakers),
        ] {
            if list.as_ref().is_some_and(Vec::is_empty) {
                return Err(RecallError::Invalid(format!(
                    "{field}, when given, must not be empty"
                )));
            }
        }
        let filter = req.filter();
        filter.validate().map_err(RecallError::Invalid)?;
        if let Some(convs) = &req.conversation_ids {
            if convs.is_empty() {
                return Err(RecallError::Invalid(
                    "conversation_ids, when given, must not be empty".into(),
                ));
            }
            if convs.len() > 1000 {
                return Err(RecallError::Invalid("at most 1000 conversation_ids".into()));
            }
            let known: HashSet<String> = self
                .graph
                .known_conversations(tenant, convs)
                .await?
                .into_iter()
                .collect();
            if let Some(unknown) = convs.iter().find(|c| !known.contains(*c)) {
                return Err(RecallError::UnknownConversation(unknown.clone()));
            }
        }
        let mut conversations = req.conversation_ids.clone();
        // An end user's or agent's turns live in their conversations: every path, Path B's
        // keyword and graph lookups included, searches just those.
        if filter.has_participants() {
            let theirs = self
                .graph
                .conversations_of(tenant, &filter.user_ids, &filter.agent_ids)
                .await?;
            conversations = Some(match conversations {
                Some(asked) => asked.into_iter().filter(|c| theirs.contains(c)).collect(),
                None => theirs,
            });
        }
        Ok((
            Scope {
                conversations,
                filter,
                as_of: req.as_of,
            },
            k as usize,
        ))
    }

    /// The whole recall: validate, analyse, retrieve along every path, score, top k.
    pub async fn recall(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<Vec<RecalledMemory>, RecallError> {
        self.recall_with(tenant, req, &Ablation::default()).await
    }

    /// The span names the tenant and how many conversations the request was limited to (never
    /// the query); `k` and `results` are filled in as they become known.
    #[tracing::instrument(
        name = "recall",
        skip_all,
        fields(
            tenant = %tenant,
            conversations = req.conversation_ids.as_ref().map_or(0, Vec::len),
            k = tracing::field::Empty,
            results = tracing::field::Empty,
        )
    )]
    pub async fn recall_with(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
        ablation: &Ablation,
    ) -> Result<Vec<RecalledMemory>, RecallError> {
        let started = Instant::now();
        let (scope, k) = self.validate(tenant, req).await?;
        tracing::Span::current().record("k", k);
        if scope.conversations.as_ref().is_some_and(Vec::is_empty) {
            // The users or agents asked for have no conversations (or none of those named).
            return Ok(vec![]);
        }
        // The question's token vectors, made on another thread from the start, and the late
        // retriever's scan as soon as they are: both beside the analysis and Phase 2. Not as of
        // an earlier time: kept versions are not re-scored, so the present's turns would be
        // favoured.
        let late = self
            .tokens
            .clone()
            .filter(|_| !ablation.without(Component::Late) && scope.as_of.is_none())
            .map(|model| {
                let scan = self.late_scan(tenant, &scope, ablation);
                let task = late_retrieve(model, req.query.clone(), scan);
                AbortOnDrop(tokio::spawn(tracing::Instrument::in_current_span(task)))
            });
        let (qa, qv) = self.analyse(req, ablation).await?;
        RecallPhaseCompleted {
            phase: RecallPhase::Analyse,
            elapsed: started.elapsed(),
        }
        .emit();

        // Phase 2: Path B then Path C (from B's lookups; only with `recall.path_c`), beside the
        // dense and lexical retrievers: four retrievers, each timed on its own, overlapping.
        let cfg = &self.config;
        let depth = cfg.retrieve_depth.max(k);
        let phase = Instant::now();
        let entities = ScopeEntities::new(self, tenant, &scope);
        let graph_paths = async {
            let b = timed(RecallPhase::PathB, async {
                path_b::run(self, tenant, &scope, &qa, &qv, &entities, ablation).await
            })
            .await?;
            let c = timed(RecallPhase::PathC, async {
                if !cfg.path_c || ablation.without(Component::PathC) {
                    Ok(PathC::default())
                } else {
                    path_c::run(self, tenant, &scope, &b).await
                }
            })
            .await?;
            Ok::<_, RecallError>((b, c))
        };
        let dense = timed(RecallPhase::Dense, async {
            if ablation.without(Component::Dense) {
                return Ok(HashMap::new());
            }
            self.dense(tenant, &scope, &qv.query, depth).await
        });
        let lexical = timed(RecallPhase::Lexical, async {
            if ablation.without(Component::Lexical) {
                return Ok(HashMap::new());
            }
            self.lexical(tenant, &scope, &req.query, &qa.entities, &entities, depth)
                .await
        });
        let late = async {
            let Some(mut task) = late else {
                return (None, HashMap::new());
            };
            (&mut task.0).await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "the late retriever stopped; ranking left as fused");
                (None, HashMap::new())
            })
        };
        // The category term's keywords: the scope's nearest to the question's category phrase.
        // A term added on top of the ranking: an index that fails leaves the ranking without it.
        let category = async {
            let v = qv.category.as_ref()?;
            let hits = self
                .vectors
                .search_keywords(tenant, &scope, v, cfg.category_neighbours, -1.0)
                .await
                .inspect_err(|e| {
                    tracing::warn!(error = %e, "category keywords unreadable; ranking left without the term");
                })
                .ok()?;
            let scale = self.embedder.cosine_scale();
            let hits = hits
                .into_iter()
                .map(|(name, c)| (name, scale.keyword(c)))
                .collect();
            category::CategoryQuery::new(hits, &req.query)
        };
        let (bc, dense, lexical, (question_tokens, late), category) =
            tokio::join!(graph_paths, dense, lexical, late, category);
        let ((b, c), dense, lexical) = (bc?, dense?, lexical?);
        RecallPhaseCompleted {
            phase: RecallPhase::Retrieve,
            elapsed: phase.elapsed(),
        }
        .emit();
        RecallCandidatesFound {
            reached: b.reached.len(),
            path_b: b.result.len(),
            path_c: c.turns.len(),
            dense: dense.len(),
            lexical: lexical.len(),
            late: late.len(),
        }
        .emit();

        // Phase 3: fetch the candidates (every store read), then two pure steps: KeyMem's
        // source-aware scoring, and the fusion with the lexical and time evidence.
        let phase = Instant::now();
        let mut retrieved = Retrieved {
            b,
            c,
            dense,
            lexical,
            late,
        };
        let candidates = fetch::fetch(
            self.graph.as_ref(),
            self.vectors.as_ref(),
            tenant,
            &scope,
            &mut retrieved,
        )
        .await?;
        let query = KeyMemQuery {
            vector: &qv.query,
            neighbours: &retrieved.b.neighbours,
            idf: &retrieved.b.idf,
            weights: keymem::weights(cfg, qa.query_type),
            scale: self.embedder.cosine_scale(),
            fields: cfg.field_cosine,
        };
        let scores = keymem::score(&candidates.items, &query, ablation);
        let evidence = category
            .as_ref()
            .map(|q| category::evidences(&candidates.items, q));
        // Late interaction re-scores the top `late_depth`, the cross-encoder re-reads the top
        // `rerank_depth`: either may be more than k.
        let mut take = k;
        if question_tokens.is_some() {
            take = take.max(cfg.late_depth);
            if !retrieved.late.is_empty() {
                // The late retriever's finds are re-scored wherever the fusion put them.
                take = usize::MAX;
            }
        }
        if self.reranker.is_some() {
            take = take.max(cfg.rerank_depth);
        }
        let mut out = fuse::fuse(candidates, &scores, (&qa).into(), cfg, take);
        if let Some(evidence) = &evidence {
            for m in &mut out {
                m.score_parts.category = evidence.get(&m.memory_id).copied();
            }
        }
        RecallPhaseCompleted {
            phase: RecallPhase::Rank,
            elapsed: phase.elapsed(),
        }
        .emit();
        if let Some(question) = &question_tokens {
            out = self
                .late(tenant, question, out, &retrieved.late, ablation)
                .await?;
        }
        if evidence.is_some() {
            // After late interaction, over what it re-scored (or the top k without it).
            let head = if question_tokens.is_some() {
                cfg.late_depth.max(k)
            } else {
                k
            };
            category::apply(&mut out, head, cfg.category_weight);
        }
        if let Some(reranker) = &self.reranker {
            out = rerank(reranker.clone(), &req.query, out, cfg).await?;
        }
        out.truncate(k);
        tracing::Span::current().record("results", out.len());
        RecallCompleted {
            results: out.len(),
            elapsed: started.elapsed(),
        }
        .emit();
        Ok(out)
    }
}

impl Recall {
    /// What the late retriever scans, when it runs: with `late_candidates` on and the scan not
    /// ablated (recall asks only where late interaction itself runs: a model, not ablated, the
    /// present asked about).
    fn late_scan(&self, tenant: &TenantId, scope: &Scope, ablation: &Ablation) -> Option<LateScan> {
        let cfg = &self.config;
        let wanted = cfg.late_candidates > 0 && !ablation.without(Component::LateScan);
        wanted.then(|| LateScan {
            vectors: self.vectors.clone(),
            tenant: tenant.clone(),
            scope: scope.clone(),
            candidates: cfg.late_candidates,
            max_turns: cfg.late_scan_max_turns,
        })
    }

    /// Late interaction: the first `late_depth` of `ranked`, and every turn the late retriever
    /// found (`known`, its MaxSim already read), each get `late_weight × MaxSim` of the
    /// question's token vectors against the turn's added to their score, and their score parts
    /// re-weighted by `late_shift` (MaxSim stands in for much of what the cosine and the
    /// keyword similarity said), and are sorted again, above the rest; then the first
    /// `sentence_depth` of them get the sentence term ([`Self::sentence_term`]). A turn stored
    /// without token vectors gets the others' mean, so it is neither favoured nor buried; a
    /// vector index that fails leaves the ranking as fused.
    async fn late(
        &self,
        tenant: &TenantId,
        question: &recollect_model::TokenVectors,
        ranked: Vec<RecalledMemory>,
        known: &HashMap<MemoryId, f32>,
        ablation: &Ablation,
    ) -> Result<Vec<RecalledMemory>, RecallError> {
        let cfg = &self.config;
        let n = ranked.len().min(cfg.late_depth);
        let (head, rest): (Vec<_>, Vec<_>) = ranked
            .into_iter()
            .enumerate()
            .partition(|(i, m)| *i < n || known.contains_key(&m.memory_id));
        let mut head: Vec<RecalledMemory> = head.into_iter().map(|(_, m)| m).collect();
        let rest = rest.into_iter().map(|(_, m)| m);
        let scores = if head.len() < 2 {
            None
        } else {
            self.head_scores(tenant, question, &head, known).await
        };
        if let Some(scores) = scores {
            let mean = scores.values().sum::<f32>() / scores.len() as f32;
            let shift = if ablation.without(Component::LateShift) {
                recollect_config::LateShift::default()
            } else {
                cfg.late_shift
            };
            for m in &mut head {
                let s = scores.get(&m.memory_id).copied();
                m.score_parts.late = s;
                let p = &m.score_parts;
                m.score += cfg.late_weight * s.unwrap_or(mean)
                    + shift.dense * p.dense
                    + shift.keyword * p.keyword
                    + shift.lexical * p.lexical
                    + shift.time * p.time;
            }
            // Stable: equal scores keep the fused order.
            head.sort_by(|a, b| b.score.total_cmp(&a.score));
            if cfg.sentence_weight > 0.0 && !ablation.without(Component::Sentence) {
                self.sentence_term(tenant, question, &mut head).await;
            }
        }
        head.extend(rest);
        Ok(head)
    }

    /// The sentence term over the first `recall.sentence_depth` of the re-scored `head`: each
    /// gets `sentence_weight ×` its best sentence's MaxSim (a turn stored without sentences,
    /// the others' mean) and they are sorted again, above the rest. Left as it is where no turn
    /// has sentences or the index cannot read them.
    async fn sentence_term(
        &self,
        tenant: &TenantId,
        question: &recollect_model::TokenVectors,
        head: &mut [RecalledMemory],
    ) {
        let cfg = &self.config;
        let n = head.len().min(cfg.sentence_depth);
        let ids: Vec<MemoryId> = head[..n].iter().map(|m| m.memory_id).collect();
        let scores = match self.vectors.sentence_scores(tenant, question, &ids).await {
            Ok(s) if !s.is_empty() => s,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "sentence scores unreadable; the sentence term is left out");
                return;
            }
        };
        let mean = scores.values().sum::<f32>() / scores.len() as f32;
        for m in &mut head[..n] {
            let s = scores.get(&m.memory_id).copied();
            m.score_parts.sentence = s;
            m.score += cfg.sentence_weight * s.unwrap_or(mean);
        }
        head[..n].sort_by(|a, b| b.score.total_cmp(&a.score));
    }

    /// The MaxSim of each turn of `head` that has token vectors: `known`'s, the rest read from
    /// the vector index. None (the ranking left as fused) where none has them or the read fails.
    async fn head_scores(
        &self,
        tenant: &TenantId,
        question: &recollect_model::TokenVectors,
        head: &[RecalledMemory],
        known: &HashMap<MemoryId, f32>,
    ) -> Option<HashMap<MemoryId, f32>> {
        let phase = Instant::now();
        let unread: Vec<MemoryId> = head
            .iter()
            .map(|m| m.memory_id)
            .filter(|id| !known.contains_key(id))
            .collect();
        let mut scores = if unread.is_empty() {
            HashMap::new()
        } else {
            match self.vectors.late_scores(tenant, question, &unread).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "late-interaction scores unreadable; ranking left as fused");
                    return None;
                }
            }
        };
        RecallPhaseCompleted {
            phase: RecallPhase::Late,
            elapsed: phase.elapsed(),
        }
        .emit();
        scores.extend(
            head.iter()
                .filter_map(|m| known.get(&m.memory_id).map(|s| (m.memory_id, *s))),
        );
        (!scores.is_empty()).then_some(scores)
    }
}

/// The text a cross-encoder reads for a result: its round as the conversation has it, each
/// side after its speaker's name when known.
fn round_text(m: &RecalledMemory) -> String {
    let mut out = String::new();
    for (speaker, text) in [
        (&m.user_speaker, &m.user),
        (&m.assistant_speaker, &m.assistant),
    ] {
        if text.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        if let Some(s) = speaker {
            out.push_str(s);
            out.push_str(": ");
        }
        out.push_str(text);
    }
    out
}

/// Re-reads the first `rerank_depth` of `ranked` with the cross-encoder: each gets
/// `rerank_weight × logit` added to its score and they are sorted again, above the rest (whose
/// order stays). A first result that leads the second by `rerank_gap` or more is left as fused,
/// unread: the cross-encoder rarely overturns a clear first, and most of its cost is saved. A
/// cross-encoder that fails leaves the ranking as it was (logged): the fused ranking is a
/// complete answer on its own.
async fn rerank(
    reranker: Arc<dyn Reranker>,
    query: &str,
    mut ranked: Vec<RecalledMemory>,
    cfg: &RecallConfig,
) -> Result<Vec<RecalledMemory>, RecallError> {
    let n = ranked.len().min(cfg.rerank_depth);
    let clear_first = match ranked.as_slice() {
        [first, second, ..] => first.score - second.score >= cfg.rerank_gap,
        _ => true,
    };
    if n < 2 || clear_first {
        RecallReranked {
            outcome: RerankOutcome::Skipped,
        }
        .emit();
        return Ok(ranked);
    }
    // Timed here, past the gap check: the phase histogram holds the recalls it re-read.
    let phase = Instant::now();
    let texts: Vec<String> = ranked[..n].iter().map(round_text).collect();
    let question = query.to_string();
    let logits = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        reranker.score(&question, &refs)
    })
    .await
    .map_err(|e| RecallError::Embed(e.to_string()))?;
    RecallPhaseCompleted {
        phase: RecallPhase::Rerank,
        elapsed: phase.elapsed(),
    }
    .emit();
    let logits = match logits {
        Ok(l) if l.len() == n => l,
        Ok(l) => {
            tracing::warn!(
                got = l.len(),
                want = n,
                "the cross-encoder returned another number of scores; ranking left as fused"
            );
            RecallReranked {
                outcome: RerankOutcome::Failed,
            }
            .emit();
            return Ok(ranked);
        }
        Err(e) => {
            tracing::warn!(error = %e, "the cross-encoder failed; ranking left as fused");
            RecallReranked {
                outcome: RerankOutcome::Failed,
            }
            .emit();
            return Ok(ranked);
        }
    };
    RecallReranked {
        outcome: RerankOutcome::Reread,
    }
    .emit();
    for (m, l) in ranked[..n].iter_mut().zip(logits) {
        m.score_parts.rerank = Some(l);
        m.score += cfg.rerank_weight * l;
    }
    // Stable: equal scores keep the fused order.
    ranked[..n].sort_by(|a, b| b.score.total_cmp(&a.score));
    Ok(ranked)
}

/// The late retriever's scan: the scope's best `candidates` turns by MaxSim, where it holds at
/// most `max_turns`.
struct LateScan {
    vectors: Arc<dyn VectorIndex>,
    tenant: TenantId,
    scope: Scope,
    candidates: usize,
    max_turns: u64,
}

/// A task stopped when its recall is dropped (a failed or abandoned request scans no further).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The question's token vectors, and the late retriever's finds (`scan`; the scope's size
/// counted beside the question's encoding). A scan that fails is logged and skipped: the other
/// retrievers' candidates are a complete answer on their own.
async fn late_retrieve(
    model: Arc<dyn TokenEmbedder>,
    question: String,
    scan: Option<LateScan>,
) -> (
    Option<recollect_model::TokenVectors>,
    HashMap<MemoryId, f32>,
) {
    let encode = tokio::task::spawn_blocking(move || model.embed_tokens(&[&question]));
    let size = async {
        match &scan {
            Some(s) => Some(s.vectors.count(&s.tenant, &s.scope).await),
            None => None,
        }
    };
    let (encoded, size) = tokio::join!(encode, size);
    let question = match encoded {
        Ok(Ok(mut v)) if v.len() == 1 => v.pop(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the question's token vectors failed; ranking left as fused");
            None
        }
        _ => None,
    };
    let Some(question) = question else {
        return (None, HashMap::new());
    };
    let Some(scan) = scan else {
        return (Some(question), HashMap::new());
    };
    match size {
        Some(Ok(n)) if n <= scan.max_turns => {}
        Some(Err(e)) => {
            tracing::warn!(error = %e, "the scope's size unreadable; late retriever skipped");
            return (Some(question), HashMap::new());
        }
        _ => return (Some(question), HashMap::new()),
    }
    let query = VectorQuery::Late(question.clone());
    let found = timed(RecallPhase::LateScan, async {
        Ok(scan
            .vectors
            .search(&scan.tenant, &scan.scope, &query, scan.candidates)
            .await?)
    })
    .await;
    match found {
        Ok(found) => (Some(question), found.into_iter().collect()),
        Err(e) => {
            tracing::warn!(error = %e, "the late retriever failed; candidates from the others");
            (Some(question), HashMap::new())
        }
    }
}

/// Runs one of Phase 2's retrievers and records how long it took.
async fn timed<T>(
    phase: RecallPhase,
    retriever: impl std::future::Future<Output = Result<T, RecallError>>,
) -> Result<T, RecallError> {
    let at = Instant::now();
    let out = retriever.await;
    RecallPhaseCompleted {
        phase,
        elapsed: at.elapsed(),
    }
    .emit();
    out
}

/// The entity names of a recall's conversations, read from the graph at most once: Path B's
/// entity lookup and the lexical retriever's common names both need them, side by side.
pub(crate) struct ScopeEntities<'a> {
    recall: &'a Recall,
    tenant: &'a TenantId,
    /// Only the conversations: the names do not depend on the scope's time or filters.
    scope: Scope,
    names: tokio::sync::OnceCell<Vec<String>>,
}

impl<'a> ScopeEntities<'a> {
    pub(crate) fn new(recall: &'a Recall, tenant: &'a TenantId, scope: &Scope) -> Self {
        Self {
            recall,
            tenant,
            scope: scope.conversations_only(),
            names: tokio::sync::OnceCell::new(),
        }
    }

    pub(crate) async fn names(&self) -> Result<&[String], RecallError> {
        let names = self
            .names
            .get_or_try_init(|| async {
                self.recall
                    .graph
                    .vocabulary(self.tenant, &self.scope, NodeKind::Entity)
                    .await
            })
            .await?;
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recollect_embed::{EmbedError, HashEmbedder};
    use recollect_storage::{EdgeVectorIndex, EmbeddedGraph};

    /// An asymmetric model in miniature: queries are embedded as "q " + the text.
    struct Prefixing(HashEmbedder);

    impl Embedder for Prefixing {
        fn model_name(&self) -> &str {
            "prefixing"
        }
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.0.embed(texts)
        }
        fn embed_queries(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let q: Vec<String> = texts.iter().map(|t| format!("q {t}")).collect();
            let q: Vec<&str> = q.iter().map(String::as_str).collect();
            self.0.embed(&q)
        }
        fn is_asymmetric(&self) -> bool {
            true
        }
    }

    /// Scores a passage by how often it says "answer"; fails on a passage saying "boom".
    #[derive(Default)]
    struct Counting {
        /// Passages read so far.
        read: std::sync::atomic::AtomicUsize,
    }

    impl Reranker for Counting {
        fn model_name(&self) -> &str {
            "counting"
        }
        fn score(&self, _question: &str, passages: &[&str]) -> Result<Vec<f32>, EmbedError> {
            self.read
                .fetch_add(passages.len(), std::sync::atomic::Ordering::SeqCst);
            if passages.iter().any(|p| p.contains("boom")) {
                return Err(EmbedError::Runtime("boom".into()));
            }
            Ok(passages
                .iter()
                .map(|p| p.matches("answer").count() as f32)
                .collect())
        }
    }

    use crate::testing::memory;

    #[tokio::test]
    async fn the_cross_encoder_reorders_the_top_depth_and_says_so() {
        let cfg = RecallConfig {
            rerank_depth: 3,
            rerank_weight: 0.5,
            rerank_gap: 1.0,
            ..RecallConfig::default()
        };
        let ranked = vec![
            memory(0, "nothing", 3.0),
            memory(1, "an answer", 2.8),
            memory(2, "answer answer answer", 2.0),
            memory(3, "answer answer answer answer", 1.0),
        ];
        let out = rerank(Arc::new(Counting::default()), "q", ranked, &cfg)
            .await
            .unwrap();
        let users: Vec<&str> = out.iter().map(|m| m.user.as_str()).collect();
        // 2.0 + 1.5 = 3.5 > 2.8 + 0.5 = 3.3 > 3.0; the fourth is below the depth and stays last
        // whatever the cross-encoder would have said of it.
        assert_eq!(
            users,
            [
                "answer answer answer",
                "an answer",
                "nothing",
                "answer answer answer answer"
            ]
        );
        assert_eq!(out[0].score_parts.rerank, Some(3.0));
        assert!((out[0].score - 3.5).abs() < 1e-6);
        assert_eq!(
            out[0].score_parts.fused, 2.0,
            "the fused score is kept beside it"
        );
        assert_eq!(out[3].score_parts.rerank, None);
        assert_eq!(round_text(&out[1]), "Ann: an answer ok");
    }

    #[tokio::test]
    async fn a_failing_cross_encoder_leaves_the_fused_ranking() {
        let cfg = RecallConfig {
            rerank_depth: 10,
            ..RecallConfig::default()
        };
        let ranked = vec![memory(0, "boom", 2.0), memory(1, "answer", 1.95)];
        let reranker = Arc::new(Counting::default());
        let out = rerank(reranker.clone(), "q", ranked.clone(), &cfg)
            .await
            .unwrap();
        assert_eq!(out, ranked);
        assert_eq!(reranker.read.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_clear_first_result_is_left_unread() {
        let cfg = RecallConfig {
            rerank_depth: 10,
            rerank_weight: 1.0,
            rerank_gap: 0.1,
            ..RecallConfig::default()
        };
        // 3.0 leads 2.8 by more than the gap: nothing is read, whatever the cross-encoder
        // would say.
        let clear = vec![memory(0, "nothing", 3.0), memory(1, "answer answer", 2.8)];
        let reranker = Arc::new(Counting::default());
        let out = rerank(reranker.clone(), "q", clear.clone(), &cfg)
            .await
            .unwrap();
        assert_eq!(out, clear);
        assert!(out.iter().all(|m| m.score_parts.rerank.is_none()));
        assert_eq!(reranker.read.load(std::sync::atomic::Ordering::SeqCst), 0);
        // 3.0 against 2.95 is close: both are read and the second overtakes.
        let close = vec![memory(0, "nothing", 3.0), memory(1, "answer answer", 2.95)];
        let out = rerank(reranker.clone(), "q", close, &cfg).await.unwrap();
        assert_eq!(reranker.read.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(out[0].user, "answer answer");
        assert_eq!(out[1].score_parts.rerank, Some(0.0));
        // A single result has nothing to be reordered against.
        let one = vec![memory(0, "answer", 3.0)];
        assert_eq!(
            rerank(reranker.clone(), "q", one.clone(), &cfg)
                .await
                .unwrap(),
            one
        );
        assert_eq!(reranker.read.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    /// An embedded vector index in `dir` with room for the hash token embedder's vectors.
    fn index_with_token_vectors(dir: &std::path::Path, dim: usize) -> EdgeVectorIndex {
        EdgeVectorIndex::open_shaped(
            &dir.join("v"),
            dim,
            Some(recollect_embed::HASH_TOKEN_DIM),
            recollect_storage::Flushes::EachWrite,
        )
        .unwrap()
    }

    /// Late interaction re-scores the top `late_depth` by MaxSim of the turns' token vectors
    /// (made at ingest) against the question's, says so in `score_parts.late`, gives a turn
    /// stored without them the others' mean, and leaves the rest below in their order.
    #[tokio::test]
    async fn late_interaction_reorders_the_top_depth_by_max_sim() {
        use recollect_embed::HashTokenEmbedder;
        use recollect_storage::vector::TurnPoint;
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let vectors = index_with_token_vectors(dir.path(), hash.dim());
        let texts = [
            "we talked about the weather",
            "Caroline went camping by the lake",
            "nothing here either",
            "camping again, lake and tent",
            "below the depth: camping lake Caroline",
        ];
        let tokens = HashTokenEmbedder;
        let mut points = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let t = crate::testing::turn("a", i as u64);
            points.push(TurnPoint {
                // Turn 2 was stored before token vectors were made.
                late: (i != 2).then(|| tokens.embed_tokens(&[text]).unwrap().remove(0)),
                ..crate::testing::point(&t, hash.embed(&[text]).unwrap().remove(0), None)
            });
        }
        let tenant = points[0].tenant.clone();
        vectors.upsert_turns(points).await.unwrap();
        let graph = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let recall = Recall::new(
            Arc::new(graph),
            Arc::new(vectors),
            Arc::new(hash),
            RecallConfig {
                late_depth: 4,
                late_weight: 10.0,
                late_candidates: 10,
                ..RecallConfig::default()
            },
            RecallLimits::from(&recollect_config::Settings::defaults().server),
        )
        .with_token_embedder(Some(Arc::new(tokens)));
        let ranked: Vec<RecalledMemory> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| memory(i as u64, t, 4.0 - i as f32 * 0.5))
            .collect();
        let question = tokens
            .embed_tokens(&["Where did Caroline go camping?"])
            .unwrap()
            .remove(0);
        let out = recall
            .late(
                &tenant,
                &question,
                ranked.clone(),
                &HashMap::new(),
                &Ablation::default(),
            )
            .await
            .unwrap();
        let order: Vec<u64> = out.iter().map(|m| m.turn_id.parse().unwrap()).collect();
        assert_eq!(&order[..2], &[1, 3], "{order:?}");
        assert_eq!(order[4], 4, "below the depth, left where it was");
        let by_id = |id: u64| out.iter().find(|m| m.turn_id == id.to_string()).unwrap();
        let (one, zero, two) = (by_id(1), by_id(0), by_id(2));
        assert!(one.score_parts.late.unwrap() > zero.score_parts.late.unwrap());
        assert_eq!(two.score_parts.late, None, "no token vectors");
        let present: Vec<f32> = [0, 1, 3]
            .iter()
            .map(|&i| by_id(i).score_parts.late.unwrap())
            .collect();
        let mean = present.iter().sum::<f32>() / 3.0;
        assert!(
            (two.score - (3.0 + 10.0 * mean)).abs() < 1e-4,
            "{}",
            two.score
        );
        assert_eq!(by_id(4).score_parts.late, None);
        assert_eq!(by_id(4).score, 2.0);

        // The late retriever scans the scope: every turn with token vectors, best first, the
        // scores `late_scores` gives.
        let scope = Scope::of(&["a"]);
        // As recall runs it: the question encoded, then the scan.
        let scan = |recall: &Recall, ablation: &Ablation| {
            let plan = recall.late_scan(&tenant, &scope, ablation);
            let model = recall.tokens.clone().unwrap();
            late_retrieve(model, "Where did Caroline go camping?".into(), plan)
        };
        let (q, found) = scan(&recall, &Ablation::default()).await;
        assert_eq!(q.as_ref(), Some(&question));
        let ids: Vec<MemoryId> = out.iter().map(|m| m.memory_id).collect();
        let read = recall
            .vectors
            .late_scores(&tenant, &question, &ids)
            .await
            .unwrap();
        assert_eq!(found.len(), 4, "turn 2 has no token vectors: {found:?}");
        for (id, s) in &found {
            assert!((s - read[id]).abs() < 1e-3, "{found:?} vs {read:?}");
        }
        // What it found below the depth is re-scored with the top, its MaxSim not read again.
        let four = by_id(4).memory_id;
        let out = recall
            .late(
                &tenant,
                &question,
                ranked.clone(),
                &found,
                &Ablation::default(),
            )
            .await
            .unwrap();
        let order: Vec<u64> = out.iter().map(|m| m.turn_id.parse().unwrap()).collect();
        let at = |id: u64| order.iter().position(|&t| t == id).unwrap();
        assert!(at(4) < at(0), "found by the scan, it rises: {order:?}");
        let again = out.iter().find(|m| m.memory_id == four).unwrap();
        assert_eq!(again.score_parts.late, Some(found[&four]));
        // Off where the scope holds more turns than late_scan_max_turns, when ablated, and
        // when late_candidates is 0; the question's vectors are still handed on.
        let ablated = Ablation {
            off: Some(Component::LateScan),
        };
        let (q, none) = scan(&recall, &ablated).await;
        assert!(q.is_some() && none.is_empty());
        for config in [
            RecallConfig {
                late_scan_max_turns: 4,
                ..recall.config.clone()
            },
            RecallConfig {
                late_candidates: 0,
                ..recall.config.clone()
            },
        ] {
            let narrow = Recall {
                config,
                graph: recall.graph.clone(),
                vectors: recall.vectors.clone(),
                embedder: recall.embedder.clone(),
                reranker: None,
                tokens: recall.tokens.clone(),
                limits: recall.limits,
            };
            let (q, none) = scan(&narrow, &Ablation::default()).await;
            assert!(q.is_some() && none.is_empty());
        }
        // No question vectors (the model failed), no scan.
        struct Failing;
        impl TokenEmbedder for Failing {
            fn model_name(&self) -> &str {
                "failing"
            }
            fn dim(&self) -> usize {
                recollect_embed::HASH_TOKEN_DIM
            }
            fn embed_tokens(
                &self,
                _: &[&str],
            ) -> Result<Vec<recollect_model::TokenVectors>, recollect_embed::EmbedError>
            {
                Err(recollect_embed::EmbedError::Tokenizer("broken".into()))
            }
        }
        let plan = recall.late_scan(&tenant, &scope, &Ablation::default());
        assert!(plan.is_some());
        let (q, none) = late_retrieve(Arc::new(Failing), "camping?".into(), plan).await;
        assert!(q.is_none() && none.is_empty());
    }

    /// The sentence term: of two turns with the same words (the same MaxSim) and the same
    /// fused score, the one that says the question's words in one sentence goes first, its
    /// `score_parts.sentence` higher; weight 0 or the ablation keeps the fused order. (Turns
    /// stored without sentences change nothing: `late_shift_reweights_the_parts_of_the_turns_it_reads`
    /// stores its turns so and sees only the shift.)
    #[tokio::test]
    async fn the_sentence_term_prefers_the_question_said_in_one_sentence() {
        use recollect_embed::HashTokenEmbedder;
        use recollect_storage::vector::TurnPoint;
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let vectors = index_with_token_vectors(dir.path(), hash.dim());
        let tokens = HashTokenEmbedder;
        // Turn 0 has "Caroline" and "camping" apart; turn 1 in one sentence.
        let texts = [
            "Caroline was out. Camping by the lake was cold.",
            "Caroline was camping. Out by the lake was cold.",
        ];
        let mut points = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let t = crate::testing::turn("a", i as u64);
            let rows = tokens.embed_tokens(&[text]).unwrap().remove(0);
            let labels = tokens.sentences(text, 0, 0).unwrap();
            points.push(TurnPoint {
                late: Some(rows.with_segments(labels).unwrap()),
                ..crate::testing::point(&t, hash.embed(&[text]).unwrap().remove(0), None)
            });
        }
        let tenant = points[0].tenant.clone();
        vectors.upsert_turns(points).await.unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let vectors = Arc::new(vectors);
        let question = tokens
            .embed_tokens(&["Caroline camping"])
            .unwrap()
            .remove(0);
        let rescore = |weight: f32, ablation: Ablation| {
            let recall = Recall::new(
                graph.clone(),
                vectors.clone(),
                Arc::new(hash.clone()),
                RecallConfig {
                    sentence_weight: weight,
                    ..RecallConfig::default()
                },
                RecallLimits::from(&recollect_config::Settings::defaults().server),
            );
            let ranked = vec![memory(0, texts[0], 1.0), memory(1, texts[1], 1.0)];
            let (tenant, question) = (&tenant, &question);
            async move {
                recall
                    .late(tenant, question, ranked, &HashMap::new(), &ablation)
                    .await
                    .unwrap()
            }
        };
        let order = |out: &[RecalledMemory]| -> Vec<String> {
            out.iter().map(|m| m.turn_id.clone()).collect()
        };
        assert!(
            RecallConfig::default().sentence_weight > 0.0,
            "on by default"
        );
        let out = rescore(2.0, Ablation::default()).await;
        assert_eq!(order(&out), ["1", "0"]);
        assert_eq!(out[0].score_parts.late, out[1].score_parts.late);
        let (one, apart) = (
            out[0].score_parts.sentence.unwrap(),
            out[1].score_parts.sentence.unwrap(),
        );
        assert!(one > apart, "{one} vs {apart}");
        assert!((out[0].score - out[1].score - 2.0 * (one - apart)).abs() < 1e-4);
        for (weight, ablation) in [
            (0.0, Ablation::default()),
            (
                2.0,
                Ablation {
                    off: Some(Component::Sentence),
                },
            ),
        ] {
            let out = rescore(weight, ablation).await;
            assert_eq!(order(&out), ["0", "1"], "{weight} {ablation:?}");
            assert!(out.iter().all(|m| m.score_parts.sentence.is_none()));
        }
    }

    /// Where late interaction reads a turn, `late_shift` re-weights the parts of its fused
    /// score: of two turns with the same words and the same fused score, the one whose score
    /// came from the cosine and keywords falls below the one whose score came from time
    /// evidence; with no shift, or with it ablated, their fused order stays.
    #[tokio::test]
    async fn late_shift_reweights_the_parts_of_the_turns_it_reads() {
        use recollect_config::LateShift;
        use recollect_embed::HashTokenEmbedder;
        use recollect_storage::vector::TurnPoint;
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let vectors = index_with_token_vectors(dir.path(), hash.dim());
        let text = "Caroline went camping by the lake";
        let tokens = HashTokenEmbedder;
        let mut points = Vec::new();
        for i in 0..2u64 {
            let t = crate::testing::turn("a", i);
            points.push(TurnPoint {
                late: Some(tokens.embed_tokens(&[text]).unwrap().remove(0)),
                ..crate::testing::point(&t, hash.embed(&[text]).unwrap().remove(0), None)
            });
        }
        let tenant = points[0].tenant.clone();
        vectors.upsert_turns(points).await.unwrap();
        let graph = Arc::new(EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap());
        let vectors = Arc::new(vectors);
        let recall = |shift: LateShift| {
            Recall::new(
                graph.clone(),
                vectors.clone(),
                Arc::new(hash.clone()),
                RecallConfig {
                    late_shift: shift,
                    ..RecallConfig::default()
                },
                RecallLimits::from(&recollect_config::Settings::defaults().server),
            )
        };
        // Turn 0: fused 1.0 from its cosine and keywords; turn 1: fused 1.0 from time evidence.
        let mut from_cosine = memory(0, text, 1.0);
        from_cosine.score_parts.dense = 0.6;
        from_cosine.score_parts.keyword = 0.8;
        let mut from_time = memory(1, text, 1.0);
        from_time.score_parts.time = 1.0;
        from_time.score_parts.lexical = 0.2;
        let question = tokens
            .embed_tokens(&["Where did Caroline go camping?"])
            .unwrap()
            .remove(0);
        let order = |out: &[RecalledMemory]| -> Vec<String> {
            out.iter().map(|m| m.turn_id.clone()).collect()
        };

        let shift = LateShift {
            dense: -0.45,
            keyword: -0.35,
            lexical: -0.15,
            time: 0.1,
        };
        let rescore = |shift: LateShift, ablation: Ablation| {
            let recall = recall(shift);
            let ranked = vec![from_cosine.clone(), from_time.clone()];
            let (tenant, question) = (&tenant, &question);
            async move {
                recall
                    .late(tenant, question, ranked, &HashMap::new(), &ablation)
                    .await
                    .unwrap()
            }
        };
        let out = rescore(shift, Ablation::default()).await;
        assert_eq!(order(&out), ["1", "0"]);
        let late = out[0].score_parts.late.unwrap();
        assert_eq!(
            out[1].score_parts.late,
            Some(late),
            "the same words, the same MaxSim"
        );
        let base = 1.0 + RecallConfig::default().late_weight * late;
        assert!(
            (out[0].score - (base - 0.15 * 0.2 + 0.1)).abs() < 1e-5,
            "{}",
            out[0].score
        );
        assert!(
            (out[1].score - (base - 0.45 * 0.6 - 0.35 * 0.8)).abs() < 1e-5,
            "{}",
            out[1].score
        );

        // No shift, or the shift switched off by the ablation: equal scores keep the fused
        // order.
        for (shift, ablation) in [
            (LateShift::default(), Ablation::default()),
            (
                shift,
                Ablation {
                    off: Some(Component::LateShift),
                },
            ),
        ] {
            let out = rescore(shift, ablation).await;
            assert_eq!(order(&out), ["0", "1"], "{ablation:?}");
            assert_eq!(out[0].score, out[1].score);
        }
    }

    /// The late retriever end to end: a turn no other retriever returns is found by MaxSim,
    /// fused, re-scored and says `late` in its sources; with the retriever off it is not even a
    /// candidate.
    #[tokio::test]
    async fn the_late_retriever_brings_a_turn_the_others_miss() {
        use recollect_embed::HashTokenEmbedder;
        use recollect_storage::vector::TurnPoint;
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let graph = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let vectors = index_with_token_vectors(dir.path(), hash.dim());
        let texts = [
            "we talked about the weather",
            "the weather again, rain all week",
            "a long walk with the dog",
            "we went camping by the lake",
            "more weather talk",
        ];
        let tokens = HashTokenEmbedder;
        // Turn 0's dense vector is the question's, every other turn's the same unrelated
        // text's, so dense retrieval (one deep: k = 1) returns turn 0 alone; no lexical or
        // keyword vectors are stored.
        let flat = hash.embed(&["something else entirely"]).unwrap().remove(0);
        let asked = hash.embed(&["camping by a lake"]).unwrap().remove(0);
        let mut turns = Vec::new();
        let mut points = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let mut t = crate::testing::turn("a", i as u64);
            t.user = text.to_string();
            t.assistant = String::new();
            points.push(TurnPoint {
                late: Some(tokens.embed_tokens(&[text]).unwrap().remove(0)),
                ..crate::testing::point(&t, if i == 0 { asked.clone() } else { flat.clone() }, None)
            });
            // No extraction: Path B has nothing to reach it by.
            turns.push((t, Default::default()));
        }
        graph.write_turns(&turns).await.unwrap();
        vectors.upsert_turns(points).await.unwrap();
        let tenant = turns[0].0.tenant.clone();
        let camping = turns[3].0.memory_id;
        let asked_turn = turns[0].0.memory_id;
        let config = |late_candidates| RecallConfig {
            retrieve_depth: 1,
            late_candidates,
            ..RecallConfig::default()
        };
        let recall = Recall::new(
            Arc::new(graph),
            Arc::new(vectors),
            Arc::new(hash),
            config(10),
            RecallLimits::from(&recollect_config::Settings::defaults().server),
        )
        .with_token_embedder(Some(Arc::new(tokens)));
        let req = RecallRequest {
            query: "camping by a lake".into(),
            conversation_ids: Some(vec!["a".into()]),
            k: Some(1),
            ..Default::default()
        };
        let out = recall
            .recall_with(&tenant, &req, &Ablation::default())
            .await
            .unwrap();
        // MaxSim lifts it over the dense retriever's one turn.
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].memory_id, camping, "{out:?}");
        assert_eq!(out[0].sources, ["late"], "{out:?}");
        assert!(out[0].score_parts.late.is_some());
        let off = recall.with_config(config(0));
        let out = off
            .recall_with(&tenant, &req, &Ablation::default())
            .await
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].memory_id, asked_turn, "{out:?}");
        assert_eq!(out[0].sources, ["dense"], "{out:?}");
    }

    /// The category term end to end: a list question's category phrase is embedded, the
    /// scope's nearest keywords read, and each result's evidence (the best among the keywords
    /// its named speaker said) moves its score by `category_weight` around the head's median.
    #[tokio::test]
    async fn a_list_question_lifts_the_turns_whose_named_speaker_says_an_instance() {
        use recollect_model::KeywordVector;
        /// Hashed words, except that a turtle is a pet: the world knowledge a real encoder has.
        struct KnowsTurtles(HashEmbedder);
        impl Embedder for KnowsTurtles {
            fn model_name(&self) -> &str {
                self.0.model_name()
            }
            fn dim(&self) -> usize {
                self.0.dim()
            }
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
                let texts: Vec<String> =
                    texts.iter().map(|t| t.replace("turtles", "pets")).collect();
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                self.0.embed(&refs)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let model = KnowsTurtles(HashEmbedder::default());
        let graph = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let vectors = EdgeVectorIndex::open(&dir.path().join("v"), model.dim()).unwrap();
        let extractor = recollect_extract::RuleExtractor::new();
        let mut state = Default::default();
        // Ann speaks the user field, Bob the assistant's.
        let said = [
            ("I fed my turtles this morning.", "Sounds calm."),
            ("I washed my car this morning.", "Sounds calm."),
            ("Sounds calm.", "I fed my turtles this morning."),
        ];
        let mut turns = Vec::new();
        let mut points = Vec::new();
        let mut keywords: Vec<KeywordVector> = Vec::new();
        for (i, (user, assistant)) in said.iter().enumerate() {
            let mut t = crate::testing::turn("a", i as u64);
            t.user = user.to_string();
            t.assistant = assistant.to_string();
            let x = extractor.extract_sync(&t, &mut state);
            for k in &x.keywords {
                if !keywords.iter().any(|kv| kv.keyword == k.key) {
                    let v = model.embed(&[&k.text]).unwrap().remove(0);
                    keywords.push(KeywordVector {
                        keyword: k.key.clone(),
                        vector: v.into(),
                    });
                }
            }
            let v = model
                .embed(&[&format!("{user} {assistant}")])
                .unwrap()
                .remove(0);
            points.push(crate::testing::point(&t, v, None));
            turns.push((t, x));
        }
        graph.write_turns(&turns).await.unwrap();
        vectors.upsert_turns(points).await.unwrap();
        let tenant = turns[0].0.tenant.clone();
        vectors
            .upsert_keywords(&tenant, "a", keywords)
            .await
            .unwrap();
        let config = |w| RecallConfig {
            category_weight: w,
            ..RecallConfig::default()
        };
        let recall = Recall::new(
            Arc::new(graph),
            Arc::new(vectors),
            Arc::new(model),
            config(1.0),
            RecallLimits::from(&recollect_config::Settings::defaults().server),
        );
        let req = RecallRequest {
            query: "What pets does Ann have?".into(),
            conversation_ids: Some(vec!["a".into()]),
            k: Some(3),
            ..Default::default()
        };
        let on = recall
            .recall_with(&tenant, &req, &Ablation::default())
            .await
            .unwrap();
        let evidence = |out: &[RecalledMemory], turn: usize| {
            let id = turns[turn].0.memory_id;
            out.iter()
                .find(|m| m.memory_id == id)
                .and_then(|m| m.score_parts.category)
        };
        let (ann_turtles, ann_car, bob_turtles) = (
            evidence(&on, 0).unwrap(),
            evidence(&on, 1).unwrap(),
            evidence(&on, 2).unwrap(),
        );
        assert!(ann_turtles > 0.9, "{on:?}");
        assert!(ann_turtles > ann_car + 0.5, "{on:?}");
        assert_eq!(
            bob_turtles, ann_car,
            "Bob's turtles are not Ann's pets: {on:?}"
        );
        assert_eq!(on[0].memory_id, turns[0].0.memory_id, "{on:?}");

        // Off (weight 0, or ablated): no evidence, and each score is the term's less.
        let off = recall
            .with_config(config(0.0))
            .recall_with(&tenant, &req, &Ablation::default())
            .await
            .unwrap();
        assert!(off.iter().all(|m| m.score_parts.category.is_none()));
        let ablated = recall
            .recall_with(&tenant, &req, &Ablation::parse("category").unwrap())
            .await
            .unwrap();
        assert_eq!(ablated, off);
        let mut values: Vec<f32> = on.iter().filter_map(|m| m.score_parts.category).collect();
        values.sort_by(f32::total_cmp);
        let median = values[values.len() / 2];
        for m in &on {
            let before = off.iter().find(|o| o.memory_id == m.memory_id).unwrap();
            let e = m.score_parts.category.unwrap();
            assert!(
                (m.score - (before.score + (e - median))).abs() < 1e-5,
                "{m:?}"
            );
        }
    }

    #[tokio::test]
    async fn names_on_most_turns_of_the_scope_are_common_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let graph = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let extractor = recollect_extract::RuleExtractor::new();
        let mut state = Default::default();
        // Ann and Bob speak on every turn of "a"; Sarah is mentioned on one.
        let turns: Vec<_> = (0..4)
            .map(|p| {
                let mut t = crate::testing::turn("a", p);
                if p == 2 {
                    t.user = "I met Sarah at the museum yesterday.".into();
                }
                let x = extractor.extract_sync(&t, &mut state);
                (t, x)
            })
            .collect();
        graph.write_turns(&turns).await.unwrap();
        let tenant = turns[0].0.tenant.clone();
        let recall = Recall::new(
            Arc::new(graph),
            Arc::new(EdgeVectorIndex::open(&dir.path().join("v"), hash.dim()).unwrap()),
            Arc::new(hash),
            RecallConfig::default(),
            RecallLimits::from(&recollect_config::Settings::defaults().server),
        );
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let scope = Scope::of(&["a"]);
        let common = recall
            .common_names(
                &ScopeEntities::new(&recall, &tenant, &scope),
                &names(&["ann", "Sarah", "Zoe"]),
            )
            .await
            .unwrap();
        assert_eq!(
            common,
            names(&["ann"]),
            "matched in any case, named as the graph keeps it"
        );
        let off = Recall {
            config: RecallConfig {
                lexical_common_name_share: 0.0,
                ..RecallConfig::default()
            },
            ..recall
        };
        assert!(off
            .common_names(&ScopeEntities::new(&off, &tenant, &scope), &names(&["Ann"]))
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn the_question_is_embedded_as_a_query_and_its_keywords_as_documents() {
        let dir = tempfile::tempdir().unwrap();
        let hash = HashEmbedder::default();
        let graph = EmbeddedGraph::open(&dir.path().join("g.redb")).unwrap();
        let vectors = EdgeVectorIndex::open(&dir.path().join("v"), hash.dim()).unwrap();
        let recall = Recall::new(
            Arc::new(graph),
            Arc::new(vectors),
            Arc::new(Prefixing(HashEmbedder::default())),
            RecallConfig::default(),
            RecallLimits::from(&recollect_config::Settings::defaults().server),
        );
        let req = RecallRequest {
            query: "Where did Melanie go camping with her kids?".into(),
            ..Default::default()
        };
        let (_, qv) = recall.analyse(&req, &Ablation::default()).await.unwrap();
        let want = hash.embed(&[&format!("q {}", req.query)]).unwrap();
        assert_eq!(qv.query, want[0], "the question gets the query side");
        assert!(!qv.keywords.is_empty());
        for (k, v) in &qv.keywords {
            assert_eq!(
                v,
                &hash.embed(&[k]).unwrap()[0],
                "keyword {k} is a document"
            );
        }
    }
}
