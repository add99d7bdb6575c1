//! [`Graph`] on a `recollect-store` service (the wire protocol is in [`crate::remote`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use recollect_model::{Extraction, Fragment, MemoryId, TenantId, Turn};
use serde::de::DeserializeOwned;

use crate::graph::{ConversationState, Erasures, TurnErasure};
use crate::remote::{Client, GraphCall, GRAPH_PATH};
use crate::{Graph, GraphRead, LinkedTurn, NodeKind, Scope, StoreError, TurnRecord};

/// [`Graph`] on a `recollect-store` service.
pub struct RemoteGraph {
    client: Client,
}

impl RemoteGraph {
    pub fn new(url: &str, token: &str) -> Result<Self, StoreError> {
        Ok(Self {
            client: Client::new(url, token)?,
        })
    }
    async fn call<T: DeserializeOwned>(&self, c: GraphCall) -> Result<T, StoreError> {
        self.client.call(GRAPH_PATH, &c).await
    }
}

#[async_trait]
impl GraphRead for RemoteGraph {
    fn kind(&self) -> &'static str {
        "remote"
    }
    async fn turns(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.call(GraphCall::Turns {
            tenant: tenant.clone(),
            ids: ids.to_vec(),
        })
        .await
    }
    async fn conversation_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        from: u64,
        to: u64,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.call(GraphCall::ConversationTurns {
            tenant: tenant.clone(),
            conversation: conversation.into(),
            from,
            to,
        })
        .await
    }
    async fn conversations(&self, tenant: &TenantId) -> Result<Vec<String>, StoreError> {
        self.call(GraphCall::Conversations {
            tenant: tenant.clone(),
        })
        .await
    }
    async fn conversations_after(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.call(GraphCall::ConversationsAfter {
            tenant: tenant.clone(),
            after: after.map(str::to_string),
            limit,
        })
        .await
    }
    async fn known_conversations(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Vec<String>, StoreError> {
        self.call(GraphCall::KnownConversations {
            tenant: tenant.clone(),
            conversations: conversations.to_vec(),
        })
        .await
    }
    async fn conversations_of(
        &self,
        tenant: &TenantId,
        user_ids: &[String],
        agent_ids: &[String],
    ) -> Result<Vec<String>, StoreError> {
        self.call(GraphCall::ConversationsOf {
            tenant: tenant.clone(),
            user_ids: user_ids.to_vec(),
            agent_ids: agent_ids.to_vec(),
        })
        .await
    }
    async fn vocabulary(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
    ) -> Result<Vec<String>, StoreError> {
        self.call(GraphCall::Vocabulary {
            tenant: tenant.clone(),
            scope: scope.clone(),
            kind,
        })
        .await
    }
    async fn linked_turns(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
        recorded_by: Option<DateTime<Utc>>,
        valid_at: Option<DateTime<Utc>>,
    ) -> Result<Vec<LinkedTurn>, StoreError> {
        self.call(GraphCall::LinkedTurns {
            tenant: tenant.clone(),
            scope: scope.clone(),
            kind,
            names: names.to_vec(),
            recorded_by,
            valid_at,
        })
        .await
    }
    async fn document_frequencies(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        kind: NodeKind,
        names: &[String],
    ) -> Result<(u64, Vec<u64>), StoreError> {
        self.call(GraphCall::DocumentFrequencies {
            tenant: tenant.clone(),
            scope: scope.clone(),
            kind,
            names: names.to_vec(),
        })
        .await
    }
    async fn fragments(
        &self,
        tenant: &TenantId,
        ids: &[String],
    ) -> Result<Vec<Fragment>, StoreError> {
        self.call(GraphCall::Fragments {
            tenant: tenant.clone(),
            ids: ids.to_vec(),
        })
        .await
    }
}

#[async_trait]
impl Graph for RemoteGraph {
    async fn write_turns(&self, turns: &[(Turn, Extraction)]) -> Result<(), StoreError> {
        self.call(GraphCall::WriteTurns {
            turns: turns.to_vec(),
        })
        .await
    }
    async fn write_fragments(&self, fragments: &[Fragment]) -> Result<(), StoreError> {
        self.call(GraphCall::WriteFragments {
            fragments: fragments.to_vec(),
        })
        .await
    }
    async fn conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<ConversationState, StoreError> {
        self.call(GraphCall::ConversationState {
            tenant: tenant.clone(),
            conversation: conversation.into(),
        })
        .await
    }
    async fn save_conversation_state(
        &self,
        tenant: &TenantId,
        conversation: &str,
        state: &ConversationState,
    ) -> Result<bool, StoreError> {
        self.call(GraphCall::SaveConversationState {
            tenant: tenant.clone(),
            conversation: conversation.into(),
            state: state.clone(),
        })
        .await
    }
    async fn advance_consolidated_until(
        &self,
        tenant: &TenantId,
        conversation: &str,
        until: u64,
    ) -> Result<(), StoreError> {
        self.call(GraphCall::AdvanceConsolidatedUntil {
            tenant: tenant.clone(),
            conversation: conversation.into(),
            until,
        })
        .await
    }
    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        self.call(GraphCall::DeleteConversation {
            tenant: tenant.clone(),
            conversation: conversation.into(),
        })
        .await
    }
    async fn record_erasure(
        &self,
        tenant: &TenantId,
        conversation: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        self.call(GraphCall::RecordErasure {
            tenant: tenant.clone(),
            conversation: conversation.map(String::from),
            at,
        })
        .await
    }
    async fn record_turn_erasure(
        &self,
        tenant: &TenantId,
        conversation: &str,
        id: MemoryId,
        erasure: TurnErasure,
    ) -> Result<(), StoreError> {
        self.call(GraphCall::RecordTurnErasure {
            tenant: tenant.clone(),
            conversation: conversation.to_string(),
            id,
            erasure,
        })
        .await
    }
    async fn erasures(
        &self,
        tenant: &TenantId,
        conversations: &[String],
    ) -> Result<Erasures, StoreError> {
        self.call(GraphCall::Erasures {
            tenant: tenant.clone(),
            conversations: conversations.to_vec(),
        })
        .await
    }
    async fn purge_erased(&self, tenant: &TenantId, conversation: &str) -> Result<u64, StoreError> {
        self.call(GraphCall::PurgeErased {
            tenant: tenant.clone(),
            conversation: conversation.into(),
        })
        .await
    }
    async fn restart_derivation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<(), StoreError> {
        self.call(GraphCall::RestartDerivation {
            tenant: tenant.clone(),
            conversation: conversation.into(),
        })
        .await
    }
}
