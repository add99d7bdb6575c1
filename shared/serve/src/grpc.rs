//! The gRPC `Memory` service (proto/recollect/v1/recollect.proto): the same library calls as
//! the HTTP handlers (gateway store and erase, query recall and get), the tenant from the
//! `authorization` metadata, errors through the one mapping in `recollect_api`, and the same
//! rate limit and in-flight bound as HTTP. A method of a role this process lacks answers
//! UNIMPLEMENTED naming the service that has it.

use std::sync::Arc;

use recollect_api::{grpc_status, Guard};
use recollect_model::{RecollectError, ReferenceState, TenantId};
use recollect_proto::v1::memory_server::{Memory, MemoryServer};
use recollect_proto::{parse_object, parse_time, v1};
use recollect_recall::RecallRequest;
use recollect_telemetry::events::{Api, GrpcRequestCompleted, InternalEvent, RecallServed};
use tonic::{Request, Response, Status, Streaming};

use crate::{QueryRole, Role, Roles, StoreRequest, StoreRole};

pub struct MemoryService {
    roles: Roles,
    guard: Arc<Guard>,
}

impl MemoryService {
    pub fn new(roles: Roles, guard: Arc<Guard>) -> Self {
        Self { roles, guard }
    }

    /// The tonic server for this service, accepting messages as large as an HTTP body.
    pub fn into_server(self, max_message_bytes: usize) -> MemoryServer<Self> {
        MemoryServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(usize::MAX)
    }

    fn tenant<T>(&self, req: &Request<T>) -> Result<TenantId, Status> {
        self.guard.auth().tenant_for_grpc(req.metadata())
    }

    /// The caller's tenant and a slot under the limits, for a method of `role`.
    fn admit<T>(
        &self,
        method: &str,
        role: Role,
        req: &Request<T>,
    ) -> Result<(TenantId, tokio::sync::OwnedSemaphorePermit), Status> {
        if !self.roles.has(role) {
            return Err(Status::unimplemented(format!(
                "{method} is served by {}, not by {}",
                role.service(),
                self.roles.service()
            )));
        }
        let tenant = self.tenant(req)?;
        // Every method's span has a tenant field, known only once the credential is checked.
        tracing::Span::current().record("tenant", tenant.as_str());
        let permit = self.guard.admit(&tenant).map_err(|s| s.status())?;
        Ok((tenant, permit))
    }

    fn gateway(&self) -> &dyn StoreRole {
        self.roles
            .gateway
            .as_deref()
            .expect("admitted for the gateway role")
    }

    fn query(&self) -> &dyn QueryRole {
        self.roles
            .query
            .as_deref()
            .expect("admitted for the query role")
    }

    async fn store_batch(
        &self,
        tenant: &TenantId,
        batch: v1::StoreRequest,
        wait: bool,
    ) -> Result<Vec<String>, RecollectError> {
        let (conversation, req) = store_request(batch, wait)?;
        let trace_id = uuid::Uuid::new_v4().to_string();
        let span = tracing::Span::current();
        span.record("conversation", conversation.as_str());
        span.record("trace_id", trace_id.as_str());
        let ids = self
            .gateway()
            .store(tenant, &conversation, req, &trace_id)
            .await?;
        Ok(ids.iter().map(ToString::to_string).collect())
    }
}

/// A proto batch as the gateway's request; bad timestamps or metadata name the field.
fn store_request(
    batch: v1::StoreRequest,
    wait: bool,
) -> Result<(String, StoreRequest), RecollectError> {
    let turns = batch
        .turns
        .iter()
        .enumerate()
        .map(|(i, t)| t.to_model(i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        batch.conversation_id,
        StoreRequest {
            turns,
            wait: Some(wait),
        },
    ))
}

fn recall_request(r: v1::RecallRequest) -> Result<RecallRequest, RecollectError> {
    let attention_state = r
        .attention_state_json
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            serde_json::from_str::<ReferenceState>(&s).map_err(|e| {
                RecollectError::invalid(format!(
                    "attention_state_json is not a reference state: {e}"
                ))
            })
        })
        .transpose()?;
    Ok(RecallRequest {
        query: r.query,
        conversation_ids: (!r.conversation_ids.is_empty()).then_some(r.conversation_ids),
        k: r.k,
        attention_state,
        now: r.now.map(|n| parse_time("now", &n)).transpose()?,
        user_ids: (!r.user_ids.is_empty()).then_some(r.user_ids),
        agent_ids: (!r.agent_ids.is_empty()).then_some(r.agent_ids),
        from: r.from.map(|t| parse_time("from", &t)).transpose()?,
        to: r.to.map(|t| parse_time("to", &t)).transpose()?,
        speakers: (!r.speakers.is_empty()).then_some(r.speakers),
        metadata: if r.metadata_json.trim().is_empty() {
            None
        } else {
            Some(
                parse_object("metadata_json", &r.metadata_json)?
                    .into_iter()
                    .collect(),
            )
        },
        as_of: r.as_of.map(|t| parse_time("as_of", &t)).transpose()?,
    })
}

/// Counts the call by method and outcome, like the HTTP request counter.
fn counted<T>(method: &'static str, r: Result<T, Status>) -> Result<T, Status> {
    let code = match &r {
        Ok(_) => "ok".to_string(),
        Err(s) => format!("{:?}", s.code()).to_lowercase(),
    };
    GrpcRequestCompleted {
        method,
        code: &code,
    }
    .emit();
    r
}

#[tonic::async_trait]
impl Memory for MemoryService {
    #[tracing::instrument(name = "grpc.Store", skip_all, fields(tenant = tracing::field::Empty, conversation = tracing::field::Empty, trace_id = tracing::field::Empty))]
    async fn store(
        &self,
        request: Request<v1::StoreRequest>,
    ) -> Result<Response<v1::StoreResponse>, Status> {
        let r: Result<Response<v1::StoreResponse>, Status> = async {
            let (tenant, _permit) = self.admit("Store", Role::Gateway, &request)?;
            let batch = request.into_inner();
            let wait = batch.wait;
            let memory_ids = self
                .store_batch(&tenant, batch, wait)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::StoreResponse { memory_ids }))
        }
        .await;
        counted("Store", r)
    }

    #[tracing::instrument(name = "grpc.StoreStream", skip_all, fields(tenant = tracing::field::Empty, conversation = tracing::field::Empty, trace_id = tracing::field::Empty))]
    async fn store_stream(
        &self,
        request: Request<Streaming<v1::StoreRequest>>,
    ) -> Result<Response<v1::StoreResponse>, Status> {
        let r: Result<Response<v1::StoreResponse>, Status> = async {
            let (tenant, _permit) = self.admit("StoreStream", Role::Gateway, &request)?;
            let mut stream = request.into_inner();
            let mut memory_ids = Vec::new();
            let mut wait = false;
            let mut n = 0usize;
            // Each batch is validated and stored as it arrives (bounded memory for bulk loads);
            // waiting, when asked, happens once at the end for every id.
            while let Some(batch) = stream.message().await? {
                wait |= batch.wait;
                let ids = self
                    .store_batch(&tenant, batch, false)
                    .await
                    .map_err(|e| match e {
                        RecollectError::Invalid(m) => {
                            RecollectError::Invalid(format!("batch {n}: {m}"))
                        }
                        other => other,
                    })
                    .map_err(grpc_status)?;
                memory_ids.extend(ids);
                n += 1;
            }
            if n == 0 {
                return Err(grpc_status(RecollectError::invalid(
                    "the stream held no batch",
                )));
            }
            if wait {
                let ids: Vec<_> = memory_ids
                    .iter()
                    .filter_map(|s| recollect_model::MemoryId::parse(s))
                    .collect();
                self.gateway()
                    .wait_stored(&tenant, &ids)
                    .await
                    .map_err(grpc_status)?;
            }
            Ok(Response::new(v1::StoreResponse { memory_ids }))
        }
        .await;
        counted("StoreStream", r)
    }

    #[tracing::instrument(name = "grpc.Recall", skip_all, fields(tenant = tracing::field::Empty))]
    async fn recall(
        &self,
        request: Request<v1::RecallRequest>,
    ) -> Result<Response<v1::RecallResponse>, Status> {
        let started = std::time::Instant::now();
        let r: Result<Response<v1::RecallResponse>, Status> = async {
            let (tenant, _permit) = self.admit("Recall", Role::Query, &request)?;
            let req = recall_request(request.into_inner()).map_err(grpc_status)?;
            let resp = self
                .query()
                .recall(&tenant, &req)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::RecallResponse {
                memories: resp.memories.into_iter().map(Into::into).collect(),
            }))
        }
        .await;
        RecallServed {
            api: Api::Grpc,
            elapsed: started.elapsed(),
        }
        .emit();
        counted("Recall", r)
    }

    #[tracing::instrument(name = "grpc.ListConversations", skip_all, fields(tenant = tracing::field::Empty))]
    async fn list_conversations(
        &self,
        request: Request<v1::ListConversationsRequest>,
    ) -> Result<Response<v1::ListConversationsResponse>, Status> {
        let r: Result<Response<v1::ListConversationsResponse>, Status> = async {
            let (tenant, _permit) = self.admit("ListConversations", Role::Query, &request)?;
            let q = request.into_inner();
            let (conversation_ids, next_cursor) = self
                .query()
                .conversations_page(
                    &tenant,
                    crate::ConversationPageRequest {
                        limit: q.limit,
                        cursor: q.cursor,
                        user_id: q.user_id,
                        agent_id: q.agent_id,
                    },
                )
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::ListConversationsResponse {
                conversation_ids,
                next_cursor,
            }))
        }
        .await;
        counted("ListConversations", r)
    }

    #[tracing::instrument(name = "grpc.ListTurns", skip_all, fields(tenant = tracing::field::Empty))]
    async fn list_turns(
        &self,
        request: Request<v1::ListTurnsRequest>,
    ) -> Result<Response<v1::ListTurnsResponse>, Status> {
        let r: Result<Response<v1::ListTurnsResponse>, Status> = async {
            let (tenant, _permit) = self.admit("ListTurns", Role::Query, &request)?;
            let q = request.into_inner();
            let (turns, next_cursor) = self
                .query()
                .turns_page(&tenant, &q.conversation_id, q.limit, q.cursor)
                .await
                .map_err(grpc_status)?;
            let turns = turns
                .into_iter()
                .map(|(turn, extraction, fragments)| v1::ListedTurn {
                    turn: Some(turn.into()),
                    extraction_json: extraction
                        .and_then(|x| serde_json::to_string(&x).ok())
                        .unwrap_or_default(),
                    fragments,
                })
                .collect();
            Ok(Response::new(v1::ListTurnsResponse { turns, next_cursor }))
        }
        .await;
        counted("ListTurns", r)
    }

    #[tracing::instrument(name = "grpc.Get", skip_all, fields(tenant = tracing::field::Empty))]
    async fn get(&self, request: Request<v1::GetRequest>) -> Result<Response<v1::Turn>, Status> {
        let r: Result<Response<v1::Turn>, Status> = async {
            let (tenant, _permit) = self.admit("Get", Role::Query, &request)?;
            let r = request.into_inner();
            let as_of = r
                .as_of
                .map(|t| parse_time("as_of", &t))
                .transpose()
                .map_err(grpc_status)?;
            let turn = self
                .query()
                .memory(&tenant, &r.memory_id, as_of)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(turn.into()))
        }
        .await;
        counted("Get", r)
    }

    #[tracing::instrument(name = "grpc.EditMemory", skip_all, fields(tenant = tracing::field::Empty, trace_id = tracing::field::Empty))]
    async fn edit_memory(
        &self,
        request: Request<v1::EditMemoryRequest>,
    ) -> Result<Response<v1::Turn>, Status> {
        let r: Result<Response<v1::Turn>, Status> = async {
            let (tenant, _permit) = self.admit("EditMemory", Role::Gateway, &request)?;
            let r = request.into_inner();
            let metadata = r
                .metadata_json
                .map(|m| parse_object("metadata_json", &m))
                .transpose()
                .map_err(grpc_status)?;
            let patch = recollect_model::TurnPatch {
                user: r.user,
                assistant: r.assistant,
                metadata,
                wait: Some(r.wait),
            };
            let trace_id = uuid::Uuid::new_v4().to_string();
            tracing::Span::current().record("trace_id", trace_id.as_str());
            let turn = self
                .gateway()
                .edit_memory(&tenant, &r.memory_id, patch, &trace_id)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(turn.into()))
        }
        .await;
        counted("EditMemory", r)
    }

    #[tracing::instrument(name = "grpc.Reindex", skip_all, fields(tenant = tracing::field::Empty, trace_id = tracing::field::Empty))]
    async fn reindex(
        &self,
        request: Request<v1::ReindexRequest>,
    ) -> Result<Response<v1::ReindexResponse>, Status> {
        let r: Result<Response<v1::ReindexResponse>, Status> = async {
            let (tenant, _permit) = self.admit("Reindex", Role::Gateway, &request)?;
            let trace_id = uuid::Uuid::new_v4().to_string();
            tracing::Span::current().record("trace_id", trace_id.as_str());
            let (conversations, turns) = self
                .gateway()
                .reindex(&tenant, &trace_id)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::ReindexResponse {
                conversations,
                turns,
            }))
        }
        .await;
        counted("Reindex", r)
    }

    #[tracing::instrument(name = "grpc.MemoryHistory", skip_all, fields(tenant = tracing::field::Empty))]
    async fn memory_history(
        &self,
        request: Request<v1::MemoryHistoryRequest>,
    ) -> Result<Response<v1::MemoryHistoryResponse>, Status> {
        let r: Result<Response<v1::MemoryHistoryResponse>, Status> = async {
            let (tenant, _permit) = self.admit("MemoryHistory", Role::Query, &request)?;
            let id = request.into_inner().memory_id;
            let versions = self
                .query()
                .memory_history(&tenant, &id)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::MemoryHistoryResponse {
                versions: versions.into_iter().map(Into::into).collect(),
            }))
        }
        .await;
        counted("MemoryHistory", r)
    }

    #[tracing::instrument(name = "grpc.Delete", skip_all, fields(tenant = tracing::field::Empty))]
    async fn delete(
        &self,
        request: Request<v1::DeleteRequest>,
    ) -> Result<Response<v1::DeleteResponse>, Status> {
        let r: Result<Response<v1::DeleteResponse>, Status> = async {
            let (tenant, _permit) = self.admit("Delete", Role::Gateway, &request)?;
            let conversation = request.into_inner().conversation_id;
            let turns_erased = self
                .gateway()
                .delete_conversation(&tenant, &conversation)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::DeleteResponse {
                conversation_id: conversation,
                turns_erased,
            }))
        }
        .await;
        counted("Delete", r)
    }

    #[tracing::instrument(name = "grpc.DeleteMemory", skip_all, fields(tenant = tracing::field::Empty))]
    async fn delete_memory(
        &self,
        request: Request<v1::DeleteMemoryRequest>,
    ) -> Result<Response<v1::DeleteMemoryResponse>, Status> {
        let r: Result<Response<v1::DeleteMemoryResponse>, Status> = async {
            let (tenant, _permit) = self.admit("DeleteMemory", Role::Gateway, &request)?;
            let memory_id = request.into_inner().memory_id;
            let (conversation_id, turn_id) = self
                .gateway()
                .delete_memory(&tenant, &memory_id)
                .await
                .map_err(grpc_status)?;
            Ok(Response::new(v1::DeleteMemoryResponse {
                memory_id,
                conversation_id,
                turn_id,
            }))
        }
        .await;
        counted("DeleteMemory", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_request_maps_fields_and_names_bad_ones() {
        let r = recall_request(v1::RecallRequest {
            query: "what did Melanie paint?".into(),
            conversation_ids: vec!["chat-1".into()],
            k: Some(5),
            attention_state_json: Some(r#"{"entities":["Melanie"],"locations":[],"events":[],"times":[],"bindings":{},"turns_seen":1}"#.into()),
            now: Some("2023-05-09T00:00:00Z".into()),
            user_ids: vec!["u1".into()],
            from: Some("2023-05-01T00:00:00Z".into()),
            metadata_json: r#"{"channel":"web"}"#.into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.user_ids, Some(vec!["u1".to_string()]));
        assert!(r.agent_ids.is_none() && r.speakers.is_none() && r.to.is_none());
        assert_eq!(r.from.unwrap().to_rfc3339(), "2023-05-01T00:00:00+00:00");
        assert_eq!(r.metadata.unwrap()["channel"], "web");
        assert_eq!(r.conversation_ids, Some(vec!["chat-1".to_string()]));
        assert_eq!(r.k, Some(5));
        assert_eq!(r.attention_state.unwrap().entities, vec!["Melanie"]);
        assert!(r.now.is_some());
        let all = recall_request(v1::RecallRequest {
            query: "x".into(),
            ..Default::default()
        })
        .unwrap();
        assert!(all.conversation_ids.is_none() && all.attention_state.is_none());
        let e = recall_request(v1::RecallRequest {
            query: "x".into(),
            now: Some("soon".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("now:"), "{e}");
        let e = recall_request(v1::RecallRequest {
            query: "x".into(),
            attention_state_json: Some("[]".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("attention_state_json"), "{e}");
        let e = recall_request(v1::RecallRequest {
            query: "x".into(),
            to: Some("later".into()),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("to:"), "{e}");
    }
}
