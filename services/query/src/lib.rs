//! The query service: stateless recall over the stores (`POST /v1/recall`), reads of single
//! memories (`GET /v1/memories/{id}`), where a conversation stands
//! (`GET /v1/conversations/{id}`) and paged listings of a tenant's conversations and of a
//! conversation's turns. Any number of replicas can run behind a load balancer.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use recollect_api::{ApiError, Auth, HasAuth, Json, PathParam, Tenant};
use recollect_model::{request, Extraction, MemoryId, RecollectError, TenantId, Turn};
use recollect_recall::{Recall, RecallError, RecallRequest, RecallResponse};
use recollect_storage::RawStore;

#[derive(Clone)]
pub struct QueryState {
    pub recall: Arc<Recall>,
    pub auth: Auth,
    /// Embedded mode: the raw store answers for turns not yet enriched.
    pub raw: Option<RawStore>,
}

impl HasAuth for QueryState {
    fn auth(&self) -> &Auth {
        &self.auth
    }
}

impl QueryState {
    /// Recall for the caller's tenant: what `POST /v1/recall` and gRPC `Recall` answer.
    pub async fn recall_for(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<RecallResponse, RecollectError> {
        match self.recall.recall(tenant, req).await {
            Ok(memories) => Ok(RecallResponse { memories }),
            // A conversation whose turns are stored but not yet enriched exists: it has nothing to recall yet.
            Err(RecallError::UnknownConversation(c))
                if self
                    .raw
                    .as_ref()
                    .is_some_and(|r| r.conversation_exists(tenant, &c).unwrap_or(false)) =>
            {
                Ok(RecallResponse { memories: vec![] })
            }
            Err(e) => Err(RecollectError::from_classified(e)),
        }
    }

    /// Where a conversation stands: what `GET /v1/conversations/{id}` answers. Embedded, the raw
    /// store counts stored and pending turns; distributed, the query service sees only the
    /// stores, so `turns` counts the turns that reached the graph and `pending` is 0 (turns still
    /// on the bus are not visible to it).
    pub async fn conversation_info(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationInfo, RecollectError> {
        request::validate_conversation_id(conversation)
            .map_err(|r| RecollectError::Invalid(r.message))?;
        let not_found =
            || RecollectError::NotFound(format!("conversation {conversation:?} not found"));
        let recallable = self
            .recall
            .graph()
            .conversation_turns(tenant, conversation, 0, u64::MAX)
            .await
            .map_err(RecollectError::from_classified)?
            .len() as u64;
        let Some(raw) = self.raw.clone() else {
            if recallable == 0 {
                return Err(not_found());
            }
            return Ok(ConversationInfo {
                conversation_id: conversation.to_string(),
                turns: recallable,
                pending: 0,
                recallable,
            });
        };
        let (t, c) = (tenant.clone(), conversation.to_string());
        let r = raw.clone();
        let turns = tokio::task::spawn_blocking(move || r.conversation_turns(&t, &c))
            .await
            .map_err(RecollectError::internal)?
            .map_err(RecollectError::from_classified)?;
        if turns.is_empty() {
            return Err(not_found());
        }
        let mut pending = 0;
        for t in &turns {
            if raw
                .is_pending(t.memory_id)
                .map_err(RecollectError::from_classified)?
            {
                pending += 1;
            }
        }
        Ok(ConversationInfo {
            conversation_id: conversation.to_string(),
            turns: turns.len() as u64,
            pending,
            recallable,
        })
    }

    /// One page of the tenant's conversation ids in ascending order, after `cursor`; with
    /// `user_id`/`agent_id`, only the conversations with a turn of that end user/agent. Embedded,
    /// conversations whose turns are stored but not yet enriched are listed too (by participant:
    /// once their turns are enriched, since the graph indexes participants).
    pub async fn list_conversations(
        &self,
        tenant: &TenantId,
        q: &ConversationParams,
    ) -> Result<ConversationPage, RecollectError> {
        let page = PageParams {
            limit: q.limit,
            cursor: q.cursor.clone(),
        };
        let limit = page.limit()?;
        let after = page.decode(Cursor::Conversation)?;
        let users: Vec<String> = q.user_id.iter().cloned().collect();
        let agents: Vec<String> = q.agent_id.iter().cloned().collect();
        for (field, v) in [("user_id", &q.user_id), ("agent_id", &q.agent_id)] {
            if let Some(v) = v {
                recollect_model::filter::validate_scope_id(field, v)
                    .map_err(RecollectError::Invalid)?;
            }
        }
        // Embedded, the raw store holds every conversation the graph has and those not
        // enriched yet; distributed, the graph is what the query service can see. Either reads
        // one page.
        let mut ids = match self.raw.clone() {
            _ if !users.is_empty() || !agents.is_empty() => self
                .recall
                .graph()
                .conversations_of(tenant, &users, &agents)
                .await
                .map_err(RecollectError::from_classified)?,
            Some(raw) => {
                let (t, after) = (tenant.clone(), after.clone());
                tokio::task::spawn_blocking(move || {
                    raw.conversations_after(&t, after.as_deref(), limit + 1)
                })
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?
            }
            None => self
                .recall
                .graph()
                .conversations_after(tenant, after.as_deref(), limit + 1)
                .await
                .map_err(RecollectError::from_classified)?,
        };
        ids.sort_unstable();
        ids.dedup();
        // A key cursor, not an offset: conversations created meanwhile never shift a page.
        let mut rest: Vec<String> = ids
            .into_iter()
            .filter(|c| after.as_ref().is_none_or(|a| c > a))
            .take(limit + 1)
            .collect();
        let next_cursor = (rest.len() > limit).then(|| {
            rest.truncate(limit);
            Cursor::Conversation.encode(rest.last().map(String::as_str).unwrap_or_default())
        });
        Ok(ConversationPage {
            conversations: rest,
            next_cursor,
        })
    }

    /// One page of a conversation's turns in position order, each with what the extractor found
    /// and the fragments it belongs to (none yet while its enrichment is pending).
    pub async fn list_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        page: &PageParams,
    ) -> Result<TurnPage, RecollectError> {
        request::validate_conversation_id(conversation)
            .map_err(|r| RecollectError::Invalid(r.message))?;
        let limit = page.limit()?;
        let from = match page.decode(Cursor::Turn)? {
            None => 0,
            Some(p) => p
                .parse::<u64>()
                .map_err(|_| RecollectError::invalid("cursor: not a cursor of this listing"))?,
        };
        let to = from.saturating_add(limit as u64 + 1);
        let enriched = self
            .recall
            .graph()
            .conversation_turns(tenant, conversation, from, to)
            .await
            .map_err(RecollectError::from_classified)?;
        let mut turns: Vec<TurnView> = enriched
            .into_iter()
            .map(|r| TurnView {
                turn: r.turn,
                extraction: Some(r.extraction),
                fragments: r.fragments,
            })
            .collect();
        let mut exists = !turns.is_empty();
        if let Some(raw) = self.raw.clone() {
            // Embedded: the raw store is the source of truth; pending turns show without
            // extraction. Positions are dense from 0, so the page is a position range.
            let (t, c) = (tenant.clone(), conversation.to_string());
            let all = tokio::task::spawn_blocking(move || raw.conversation_turns(&t, &c))
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?;
            exists = !all.is_empty();
            let known: std::collections::HashSet<MemoryId> =
                turns.iter().map(|v| v.turn.memory_id).collect();
            turns.extend(
                all.into_iter()
                    .filter(|t| t.position >= from && t.position < to)
                    .filter(|t| !known.contains(&t.memory_id))
                    .map(|turn| TurnView {
                        turn,
                        extraction: None,
                        fragments: Vec::new(),
                    }),
            );
            turns.sort_by_key(|v| v.turn.position);
        } else if from > 0 && !exists {
            // Past the end of a conversation that exists: an empty last page, not a 404.
            exists = !self
                .recall
                .graph()
                .conversation_turns(tenant, conversation, 0, 1)
                .await
                .map_err(RecollectError::from_classified)?
                .is_empty();
        }
        if !exists {
            return Err(RecollectError::NotFound(format!(
                "conversation {conversation:?} not found"
            )));
        }
        let next_cursor = (turns.len() > limit).then(|| {
            turns.truncate(limit);
            let next = turns.last().map(|v| v.turn.position + 1).unwrap_or(to);
            Cursor::Turn.encode(&next.to_string())
        });
        Ok(TurnPage { turns, next_cursor })
    }

    /// One memory with what enrichment made of it (none yet while it is pending).
    /// One memory with its extraction and fragments; with `as_of`, the version held then.
    pub async fn memory_view(
        &self,
        tenant: &TenantId,
        id: &str,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<TurnView, RecollectError> {
        if let Some(at) = as_of {
            let rec = self.record(tenant, id).await?;
            return match rec.and_then(|r| r.as_of(at)) {
                Some(r) => Ok(TurnView {
                    turn: r.turn,
                    extraction: Some(r.extraction),
                    fragments: r.fragments,
                }),
                None => Err(RecollectError::NotFound(format!(
                    "memory {id} not found as of {}",
                    at.to_rfc3339()
                ))),
            };
        }
        // The graph's record carries the turn too: one read for an enriched turn.
        if let Some(r) = self.record(tenant, id).await? {
            // Embedded: an edit not yet enriched is already the current version.
            let newer = match &self.raw {
                Some(_) => Some(self.memory(tenant, id).await?)
                    .filter(|t| t.recorded_at > r.turn.recorded_at),
                None => None,
            };
            return Ok(match newer {
                Some(turn) => TurnView {
                    turn,
                    extraction: None,
                    fragments: r.fragments,
                },
                None => TurnView {
                    turn: r.turn,
                    extraction: Some(r.extraction),
                    fragments: r.fragments,
                },
            });
        }
        // Pending (embedded: only in the raw store yet), unknown or not an id: `memory` says which.
        Ok(TurnView {
            turn: self.memory(tenant, id).await?,
            extraction: None,
            fragments: Vec::new(),
        })
    }

    /// The graph's record of a memory of `tenant` (None: unknown, pending, erased, another
    /// tenant's); 400 for what is no memory id.
    async fn record(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<recollect_storage::TurnRecord>, RecollectError> {
        let Some(mid) = MemoryId::parse(id) else {
            return Err(RecollectError::invalid(format!(
                "{id:?} is not a memory id"
            )));
        };
        Ok(self
            .recall
            .graph()
            .turns(tenant, &[mid])
            .await
            .map_err(RecollectError::from_classified)?
            .into_iter()
            .next())
    }

    /// Every version of a memory, oldest first, the current one last (`GET
    /// /v1/memories/{id}/history`). Embedded: from the raw store, so an edit still being
    /// enriched is listed; distributed: the versions that reached the graph.
    pub async fn history(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<MemoryHistory, RecollectError> {
        let not_found = || RecollectError::NotFound(format!("memory {id} not found"));
        let versions = match &self.raw {
            Some(raw) => {
                let Some(mid) = MemoryId::parse(id) else {
                    return Err(RecollectError::invalid(format!(
                        "{id:?} is not a memory id"
                    )));
                };
                let (r, t) = (raw.clone(), tenant.clone());
                tokio::task::spawn_blocking(move || r.versions(&t, mid))
                    .await
                    .map_err(RecollectError::internal)?
                    .map_err(RecollectError::from_classified)?
            }
            None => self
                .record(tenant, id)
                .await?
                .map(|r| r.versions())
                .unwrap_or_default(),
        };
        let current = versions.last().ok_or_else(not_found)?;
        Ok(MemoryHistory {
            memory_id: current.memory_id,
            versions,
        })
    }

    /// One memory by id, tenant-checked: another tenant's id is simply not found.
    pub async fn memory(&self, tenant: &TenantId, id: &str) -> Result<Turn, RecollectError> {
        let Some(mid) = MemoryId::parse(id) else {
            return Err(RecollectError::invalid(format!(
                "{id:?} is not a memory id"
            )));
        };
        let not_found = || RecollectError::NotFound(format!("memory {id} not found"));
        if let Some(raw) = &self.raw {
            let r = raw.clone();
            let turn = tokio::task::spawn_blocking(move || r.get(mid))
                .await
                .map_err(RecollectError::internal)?
                .map_err(RecollectError::from_classified)?;
            return match turn {
                Some(t) if &t.tenant == tenant => Ok(t),
                _ => Err(not_found()),
            };
        }
        let recs = self
            .recall
            .graph()
            .turns(tenant, &[mid])
            .await
            .map_err(RecollectError::from_classified)?;
        recs.into_iter()
            .next()
            .map(|r| r.turn)
            .ok_or_else(not_found)
    }
}

/// Recall memories for a query, with why each was returned (sources and score parts).
#[utoipa::path(
    post,
    path = "/v1/recall",
    tag = "query",
    request_body = RecallRequest,
    responses(
        (status = 200, description = "memories, best first", body = RecallResponse),
        (status = 400, description = "bad input; names the field", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "unknown conversation", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = []))
)]
#[tracing::instrument(name = "http.recall", skip_all, fields(tenant = %tenant))]
pub async fn recall(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    Json(req): Json<RecallRequest>,
) -> Result<axum::Json<RecallResponse>, ApiError> {
    Ok(axum::Json(s.recall_for(&tenant, &req).await?))
}

/// One stored turn by memory id.
#[utoipa::path(
    get,
    path = "/v1/memories/{id}",
    tag = "query",
    params(("id" = String, Path, description = "memory id (UUID)"), MemoryParams),
    responses(
        (status = 200, description = "the stored turn, with its extraction once enriched", body = TurnView),
        (status = 400, description = "not a memory id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such memory for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = []))
)]
#[tracing::instrument(name = "http.get_memory", skip_all, fields(tenant = %tenant, memory = %id))]
pub async fn get_memory(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(id): PathParam,
    q: Result<axum::extract::Query<MemoryParams>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<TurnView>, ApiError> {
    let q = q
        .map_err(|e| RecollectError::invalid(format!("invalid query string: {}", e.body_text())))?
        .0;
    Ok(axum::Json(s.memory_view(&tenant, &id, q.as_of).await?))
}

/// `GET /v1/memories/{id}` query.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MemoryParams {
    /// RFC 3339 transaction time: the version Recollect held then (404 if none yet).
    pub as_of: Option<DateTime<Utc>>,
}

/// Every version of a memory.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct MemoryHistory {
    #[schema(value_type = String)]
    pub memory_id: MemoryId,
    /// Oldest first, the current one last; each earlier one has `expired_at`.
    pub versions: Vec<Turn>,
}

/// Every version of a memory: what each edit replaced, when, and what is current.
#[utoipa::path(
    get,
    path = "/v1/memories/{id}/history",
    tag = "query",
    params(("id" = String, Path, description = "memory id (UUID)")),
    responses(
        (status = 200, description = "the versions, oldest first", body = MemoryHistory),
        (status = 400, description = "not a memory id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such memory for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = []))
)]
#[tracing::instrument(
    name = "http.memory_history",
    skip_all,
    fields(tenant = %tenant, memory = %id)
)]
pub async fn memory_history(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(id): PathParam,
) -> Result<axum::Json<MemoryHistory>, ApiError> {
    Ok(axum::Json(s.history(&tenant, &id).await?))
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ConversationInfo {
    pub conversation_id: String,
    /// Turns stored durably (distributed: turns that reached the graph).
    pub turns: u64,
    /// Turns whose enrichment has not finished (distributed: always 0, the bus is not visible here).
    pub pending: u64,
    /// Turns in the graph, recallable.
    pub recallable: u64,
}

/// Where a conversation stands: stored, pending and recallable turn counts.
#[utoipa::path(get, path = "/v1/conversations/{id}", tag = "store",
    params(("id" = String, Path, description = "conversation id")),
    responses(
        (status = 200, description = "turn counts", body = ConversationInfo),
        (status = 400, description = "bad conversation id", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such conversation for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = [])))]
#[tracing::instrument(
    name = "http.conversation_info",
    skip_all,
    fields(tenant = %tenant, conversation = %conversation)
)]
pub async fn conversation_info(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(conversation): PathParam,
) -> Result<axum::Json<ConversationInfo>, ApiError> {
    Ok(axum::Json(
        s.conversation_info(&tenant, &conversation).await?,
    ))
}

/// Items per page of a listing when the request names none, and the most it may ask for.
pub const DEFAULT_PAGE: usize = 50;
pub const MAX_PAGE: usize = 500;

/// Paging of a listing: `?limit=&cursor=`.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 500 (default 50).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent for the first one.
    pub cursor: Option<String>,
}

/// `GET /v1/conversations` query: paging, and optionally one end user's or agent's.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ConversationParams {
    /// Items per page, 1 to 500 (default 50).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; absent for the first one.
    pub cursor: Option<String>,
    /// Only conversations with a turn of this end user.
    pub user_id: Option<String>,
    /// Only conversations with a turn of this agent (with `user_id`: of both).
    pub agent_id: Option<String>,
}

/// What a cursor points into; a cursor of one listing is refused by the other.
#[derive(Clone, Copy)]
enum Cursor {
    Conversation,
    Turn,
}

impl Cursor {
    fn tag(self) -> &'static str {
        match self {
            Cursor::Conversation => "c:",
            Cursor::Turn => "t:",
        }
    }

    /// Opaque to clients: the key to continue after, tagged and base64url-encoded.
    fn encode(self, key: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{}{key}", self.tag()))
    }
}

impl PageParams {
    fn limit(&self) -> Result<usize, RecollectError> {
        match self.limit {
            None => Ok(DEFAULT_PAGE),
            Some(n) if (1..=MAX_PAGE as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(RecollectError::invalid(format!(
                "limit: must be 1 to {MAX_PAGE}, got {n}"
            ))),
        }
    }

    fn decode(&self, kind: Cursor) -> Result<Option<String>, RecollectError> {
        let Some(c) = &self.cursor else {
            return Ok(None);
        };
        let bad = || RecollectError::invalid("cursor: not a cursor of this listing");
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(c)
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        text.strip_prefix(kind.tag())
            .map(|k| Some(k.to_string()))
            .ok_or_else(bad)
    }
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ConversationPage {
    /// Conversation ids in ascending order.
    pub conversations: Vec<String>,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A stored turn with what enrichment made of it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TurnView {
    #[serde(flatten)]
    pub turn: Turn,
    /// Keywords, entities, locations, times and references; absent while enrichment is pending.
    pub extraction: Option<Extraction>,
    /// Ids of the topic fragments the turn belongs to.
    pub fragments: Vec<String>,
}

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TurnPage {
    /// Turns in position order.
    pub turns: Vec<TurnView>,
    /// Pass as `cursor` for the next page; absent on the last one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

type PageQuery = Result<axum::extract::Query<PageParams>, axum::extract::rejection::QueryRejection>;

fn page_params(q: PageQuery) -> Result<PageParams, RecollectError> {
    q.map(|q| q.0)
        .map_err(|e| RecollectError::invalid(format!("invalid query string: {}", e.body_text())))
}

/// The caller's conversations, a page at a time.
#[utoipa::path(get, path = "/v1/conversations", tag = "query",
    params(ConversationParams),
    responses(
        (status = 200, description = "one page of conversation ids", body = ConversationPage),
        (status = 400, description = "bad limit, cursor, user_id or agent_id; names it", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = [])))]
#[tracing::instrument(name = "http.list_conversations", skip_all, fields(tenant = %tenant))]
pub async fn list_conversations(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    q: Result<axum::extract::Query<ConversationParams>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<ConversationPage>, ApiError> {
    let q = q
        .map(|q| q.0)
        .map_err(|e| RecollectError::invalid(format!("invalid query string: {}", e.body_text())))?;
    Ok(axum::Json(s.list_conversations(&tenant, &q).await?))
}

/// A conversation's turns in order, a page at a time, with their extraction.
#[utoipa::path(get, path = "/v1/conversations/{id}/turns", tag = "query",
    params(("id" = String, Path, description = "conversation id"), PageParams),
    responses(
        (status = 200, description = "one page of turns", body = TurnPage),
        (status = 400, description = "bad conversation id, limit or cursor; names it", body = recollect_api::ErrorBody),
        (status = 401, description = "missing or unknown API key", body = recollect_api::ErrorBody),
        (status = 404, description = "no such conversation for this tenant", body = recollect_api::ErrorBody),
    ),
    security((), ("bearer" = [])))]
#[tracing::instrument(
    name = "http.list_turns",
    skip_all,
    fields(tenant = %tenant, conversation = %conversation)
)]
pub async fn list_turns(
    State(s): State<QueryState>,
    Tenant(tenant): Tenant,
    PathParam(conversation): PathParam,
    q: PageQuery,
) -> Result<axum::Json<TurnPage>, ApiError> {
    let page = page_params(q)?;
    Ok(axum::Json(
        s.list_turns(&tenant, &conversation, &page).await?,
    ))
}

pub fn router(state: QueryState) -> Router {
    Router::new()
        .route("/v1/recall", post(recall))
        .route("/v1/memories/{id}", get(get_memory))
        .route("/v1/memories/{id}/history", get(memory_history))
        .route("/v1/conversations", get(list_conversations))
        .route("/v1/conversations/{id}", get(conversation_info))
        .route("/v1/conversations/{id}/turns", get(list_turns))
        .with_state(state)
}

/// The OpenAPI paths of the read path.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        recall,
        get_memory,
        memory_history,
        conversation_info,
        list_conversations,
        list_turns
    ),
    components(schemas(recollect_model::TimeRef, recollect_model::Binding))
)]
pub struct QueryApi;

/// The query service as the shared serving layer (HTTP, gRPC) calls it.
#[async_trait::async_trait]
impl recollect_serve::QueryRole for QueryState {
    fn router(&self) -> Router {
        router(self.clone())
    }

    fn openapi(&self) -> utoipa::openapi::OpenApi {
        <QueryApi as utoipa::OpenApi>::openapi()
    }

    async fn recall(
        &self,
        tenant: &TenantId,
        req: &RecallRequest,
    ) -> Result<RecallResponse, RecollectError> {
        self.recall_for(tenant, req).await
    }

    async fn memory(
        &self,
        tenant: &TenantId,
        id: &str,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<Turn, RecollectError> {
        match as_of {
            None => QueryState::memory(self, tenant, id).await,
            Some(_) => Ok(self.memory_view(tenant, id, as_of).await?.turn),
        }
    }

    async fn memory_history(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Vec<Turn>, RecollectError> {
        Ok(self.history(tenant, id).await?.versions)
    }

    async fn conversations_page(
        &self,
        tenant: &TenantId,
        page: recollect_serve::ConversationPageRequest,
    ) -> Result<(Vec<String>, Option<String>), RecollectError> {
        let q = ConversationParams {
            limit: page.limit,
            cursor: page.cursor,
            user_id: page.user_id,
            agent_id: page.agent_id,
        };
        let p = self.list_conversations(tenant, &q).await?;
        Ok((p.conversations, p.next_cursor))
    }

    async fn turns_page(
        &self,
        tenant: &TenantId,
        conversation: &str,
        limit: Option<i64>,
        cursor: Option<String>,
    ) -> Result<(Vec<recollect_serve::ListedTurn>, Option<String>), RecollectError> {
        let p = self
            .list_turns(tenant, conversation, &PageParams { limit, cursor })
            .await?;
        Ok((
            p.turns
                .into_iter()
                .map(|v| (v.turn, v.extraction, v.fragments))
                .collect(),
            p.next_cursor,
        ))
    }
}
