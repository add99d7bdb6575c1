//! The wire protocol of the `recollect-store` service: the embedded stores served over HTTP,
//! and the HTTP client that [`crate::graph::remote`] and [`crate::vector::remote`] implement
//! [`Graph`] and [`VectorIndex`] with. For distributed deployments that do not
//! run Neo4j and Qdrant: every worker and query replica shares one store service.
//!
//! One request type per seam (`GraphCall`, `VectorCall`), one endpoint each, JSON bodies; the
//! server dispatches to the embedded implementation, so behaviour is the embedded one exactly.

#[cfg(feature = "remote")]
use std::sync::Arc;
#[cfg(feature = "remote")]
use std::time::Duration;

#[cfg(feature = "remote")]
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, KeywordVector, MemoryId, TenantId, Turn};
#[cfg(feature = "remote")]
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::graph::{ConversationState, TurnErasure};
use crate::vector::{KeywordSet, ReplacedVersion};
use crate::{Graph, NodeKind, Scope, StoreError, TurnPoint, VectorIndex, VectorQuery};

pub const GRAPH_PATH: &str = "/v1/store/graph";
pub const VECTORS_PATH: &str = "/v1/store/vectors";

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GraphCall {
    WriteTurns {
        turns: Vec<(Turn, Extraction)>,
    },
    WriteFragments {
        fragments: Vec<Fragment>,
    },
    Turns {
        tenant: TenantId,
        ids: Vec<MemoryId>,
    },
    ConversationTurns {
        tenant: TenantId,
        conversation: String,
        from: u64,
        to: u64,
    },
    Conversations {
        tenant: TenantId,
    },
    ConversationsAfter {
        tenant: TenantId,
        after: Option<String>,
        limit: usize,
    },
    KnownConversations {
        tenant: TenantId,
        conversations: Vec<String>,
    },
    ConversationsOf {
        tenant: TenantId,
        user_ids: Vec<String>,
        agent_ids: Vec<String>,
    },
    Vocabulary {
        tenant: TenantId,
        scope: Scope,
        kind: NodeKind,
    },
    LinkedTurns {
        tenant: TenantId,
        scope: Scope,
        kind: NodeKind,
        names: Vec<String>,
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    },
    DocumentFrequencies {
        tenant: TenantId,
        scope: Scope,
        kind: NodeKind,
        names: Vec<String>,
    },
    Fragments {
        tenant: TenantId,
        ids: Vec<String>,
    },
    ConversationState {
        tenant: TenantId,
        conversation: String,
    },
    SaveConversationState {
        tenant: TenantId,
        conversation: String,
        state: ConversationState,
    },
    AdvanceConsolidatedUntil {
        tenant: TenantId,
        conversation: String,
        until: u64,
    },
    DeleteConversation {
        tenant: TenantId,
        conversation: String,
    },
    RecordErasure {
        tenant: TenantId,
        conversation: Option<String>,
        at: DateTime<Utc>,
    },
    RecordTurnErasure {
        tenant: TenantId,
        conversation: String,
        id: MemoryId,
        erasure: TurnErasure,
    },
    Erasures {
        tenant: TenantId,
        conversations: Vec<String>,
    },
    PurgeErased {
        tenant: TenantId,
        conversation: String,
    },
    RestartDerivation {
        tenant: TenantId,
        conversation: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum VectorCall {
    UpsertTurns {
        points: Vec<TurnPoint>,
    },
    Search {
        tenant: TenantId,
        scope: Scope,
        query: VectorQuery,
        limit: usize,
    },
    FieldVectors {
        tenant: TenantId,
        ids: Vec<MemoryId>,
    },
    LateScores {
        tenant: TenantId,
        question: recollect_model::TokenVectors,
        ids: Vec<MemoryId>,
    },
    SentenceScores {
        tenant: TenantId,
        question: recollect_model::TokenVectors,
        ids: Vec<MemoryId>,
    },
    KeepVersions {
        tenant: TenantId,
        versions: Vec<ReplacedVersion>,
    },
    VersionVectors {
        tenant: TenantId,
        versions: Vec<(MemoryId, chrono::DateTime<chrono::Utc>)>,
    },
    UpsertKeywords {
        tenant: TenantId,
        conversation: String,
        keywords: Vec<KeywordVector>,
    },
    UpsertKeywordSets {
        sets: Vec<KeywordSet>,
    },
    SearchKeywords {
        tenant: TenantId,
        scope: Scope,
        vector: Vec<f32>,
        limit: usize,
        min_score: f32,
    },
    DeleteConversation {
        tenant: TenantId,
        conversation: String,
    },
    DeleteTurns {
        tenant: TenantId,
        conversation: String,
        ids: Vec<MemoryId>,
        keywords: Vec<String>,
    },
    Count {
        tenant: TenantId,
        scope: Scope,
    },
    Optimize,
}

/// An error as it crosses the wire: its class survives, so a client retries only what is
/// transient and reports bad input as bad input.
#[derive(Debug, Serialize, Deserialize)]
pub struct WireError {
    pub class: String,
    pub message: String,
}

impl From<&StoreError> for WireError {
    fn from(e: &StoreError) -> Self {
        let (class, message) = match e {
            StoreError::Backend { message: m, .. } => ("backend", m),
            StoreError::Corrupt { message: m, .. } => ("corrupt", m),
            StoreError::Invalid(m) => ("invalid", m),
            StoreError::Conflict(m) => ("conflict", m),
        };
        Self {
            class: class.into(),
            message: message.clone(),
        }
    }
}

impl From<WireError> for StoreError {
    fn from(w: WireError) -> Self {
        match w.class.as_str() {
            "corrupt" => StoreError::corrupt_msg(w.message),
            "invalid" => StoreError::Invalid(w.message),
            "conflict" => StoreError::Conflict(w.message),
            _ => StoreError::backend_msg(w.message),
        }
    }
}

fn json<T: Serialize>(v: T) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::corrupt("", e))
}

/// Server side: runs one call on the hosted graph.
pub async fn dispatch_graph(
    g: &dyn Graph,
    call: GraphCall,
) -> Result<serde_json::Value, StoreError> {
    match call {
        GraphCall::WriteTurns { turns } => json(g.write_turns(&turns).await?),
        GraphCall::WriteFragments { fragments } => json(g.write_fragments(&fragments).await?),
        GraphCall::Turns { tenant, ids } => json(g.turns(&tenant, &ids).await?),
        GraphCall::ConversationTurns {
            tenant,
            conversation,
            from,
            to,
        } => json(
            g.conversation_turns(&tenant, &conversation, from, to)
                .await?,
        ),
        GraphCall::Conversations { tenant } => json(g.conversations(&tenant).await?),
        GraphCall::ConversationsAfter {
            tenant,
            after,
            limit,
        } => json(
            g.conversations_after(&tenant, after.as_deref(), limit)
                .await?,
        ),
        GraphCall::KnownConversations {
            tenant,
            conversations,
        } => json(g.known_conversations(&tenant, &conversations).await?),
        GraphCall::ConversationsOf {
            tenant,
            user_ids,
            agent_ids,
        } => json(g.conversations_of(&tenant, &user_ids, &agent_ids).await?),
        GraphCall::Vocabulary {
            tenant,
            scope,
            kind,
        } => json(g.vocabulary(&tenant, &scope, kind).await?),
        GraphCall::LinkedTurns {
            tenant,
            scope,
            kind,
            names,
            recorded_by,
            valid_at,
        } => json(
            g.linked_turns(&tenant, &scope, kind, &names, recorded_by, valid_at)
                .await?,
        ),
        GraphCall::DocumentFrequencies {
            tenant,
            scope,
            kind,
            names,
        } => json(
            g.document_frequencies(&tenant, &scope, kind, &names)
                .await?,
        ),
        GraphCall::Fragments { tenant, ids } => json(g.fragments(&tenant, &ids).await?),
        GraphCall::ConversationState {
            tenant,
            conversation,
        } => json(g.conversation_state(&tenant, &conversation).await?),
        GraphCall::SaveConversationState {
            tenant,
            conversation,
            state,
        } => json(
            g.save_conversation_state(&tenant, &conversation, &state)
                .await?,
        ),
        GraphCall::AdvanceConsolidatedUntil {
            tenant,
            conversation,
            until,
        } => json(
            g.advance_consolidated_until(&tenant, &conversation, until)
                .await?,
        ),
        GraphCall::DeleteConversation {
            tenant,
            conversation,
        } => json(g.delete_conversation(&tenant, &conversation).await?),
        GraphCall::RecordErasure {
            tenant,
            conversation,
            at,
        } => json(
            g.record_erasure(&tenant, conversation.as_deref(), at)
                .await?,
        ),
        GraphCall::RecordTurnErasure {
            tenant,
            conversation,
            id,
            erasure,
        } => json(
            g.record_turn_erasure(&tenant, &conversation, id, erasure)
                .await?,
        ),
        GraphCall::Erasures {
            tenant,
            conversations,
        } => json(g.erasures(&tenant, &conversations).await?),
        GraphCall::PurgeErased {
            tenant,
            conversation,
        } => json(g.purge_erased(&tenant, &conversation).await?),
        GraphCall::RestartDerivation {
            tenant,
            conversation,
        } => json(g.restart_derivation(&tenant, &conversation).await?),
    }
}

/// Server side: runs one call on the hosted vector index.
pub async fn dispatch_vectors(
    v: &dyn VectorIndex,
    call: VectorCall,
) -> Result<serde_json::Value, StoreError> {
    match call {
        VectorCall::UpsertTurns { points } => json(v.upsert_turns(points).await?),
        VectorCall::Search {
            tenant,
            scope,
            query,
            limit,
        } => json(v.search(&tenant, &scope, &query, limit).await?),
        VectorCall::FieldVectors { tenant, ids } => {
            // JSON maps need string keys: ship pairs.
            let m = v.field_vectors(&tenant, &ids).await?;
            json(m.into_iter().collect::<Vec<_>>())
        }
        VectorCall::LateScores {
            tenant,
            question,
            ids,
        } => {
            let m = v.late_scores(&tenant, &question, &ids).await?;
            json(m.into_iter().collect::<Vec<_>>())
        }
        VectorCall::SentenceScores {
            tenant,
            question,
            ids,
        } => {
            let m = v.sentence_scores(&tenant, &question, &ids).await?;
            json(m.into_iter().collect::<Vec<_>>())
        }
        VectorCall::KeepVersions { tenant, versions } => {
            json(v.keep_versions(&tenant, &versions).await?)
        }
        VectorCall::VersionVectors { tenant, versions } => {
            let m = v.version_vectors(&tenant, &versions).await?;
            json(m.into_iter().collect::<Vec<_>>())
        }
        VectorCall::UpsertKeywords {
            tenant,
            conversation,
            keywords,
        } => json(v.upsert_keywords(&tenant, &conversation, keywords).await?),
        VectorCall::UpsertKeywordSets { sets } => json(v.upsert_keyword_sets(sets).await?),
        VectorCall::SearchKeywords {
            tenant,
            scope,
            vector,
            limit,
            min_score,
        } => json(
            v.search_keywords(&tenant, &scope, &vector, limit, min_score)
                .await?,
        ),
        VectorCall::DeleteConversation {
            tenant,
            conversation,
        } => json(v.delete_conversation(&tenant, &conversation).await?),
        VectorCall::DeleteTurns {
            tenant,
            conversation,
            ids,
            keywords,
        } => json(
            v.delete_turns(&tenant, &conversation, &ids, &keywords)
                .await?,
        ),
        VectorCall::Count { tenant, scope } => json(v.count(&tenant, &scope).await?),
        VectorCall::Optimize => json(v.optimize().await?),
    }
}

/// HTTP client shared by both seams.
#[cfg(feature = "remote")]
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    token: Arc<str>,
}

#[cfg(feature = "remote")]
impl Client {
    pub(crate) fn new(base: &str, token: &str) -> Result<Self, StoreError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(32)
            .build()
            .map_err(|e| StoreError::backend("store service client", e))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').into(),
            token: token.into(),
        })
    }

    async fn once<C: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        call: &C,
    ) -> Result<T, StoreError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&*self.token)
            .json(call)
            .send()
            .await
            .map_err(|e| StoreError::backend("store service unreachable", e))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| StoreError::backend("store service", e))?;
        if status.is_success() {
            serde_json::from_slice(&body).map_err(|e| StoreError::corrupt("store service reply", e))
        } else {
            // A refusal (bad token, bad request) is not worth retrying; anything else may pass.
            let class = if status.is_client_error() {
                "invalid"
            } else {
                "backend"
            };
            let w: WireError = serde_json::from_slice(&body).unwrap_or(WireError {
                class: class.into(),
                message: format!(
                    "store service answered {status}: {}",
                    String::from_utf8_lossy(&body)
                ),
            });
            Err(w.into())
        }
    }

    /// Every call is idempotent, so transient failures (connection, backend) are retried.
    pub(crate) async fn call<C: Serialize + Sync, T: DeserializeOwned>(
        &self,
        path: &str,
        call: &C,
    ) -> Result<T, StoreError> {
        (|| self.once(path, call))
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(50))
                    .with_max_delay(Duration::from_secs(2))
                    .with_max_times(5),
            )
            .when(StoreError::is_transient)
            .notify(|e, d| tracing::warn!(error = %e, retry_in = ?d, "store service call failed, retrying"))
            .await
    }
}
