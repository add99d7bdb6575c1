//! [`VectorIndex`] on a `recollect-store` service (the wire protocol is in [`crate::remote`]).

use std::collections::HashMap;

use async_trait::async_trait;
use recollect_model::{KeywordVector, MemoryId, TenantId, TokenVectors};
use serde::de::DeserializeOwned;

use crate::remote::{Client, VectorCall, VECTORS_PATH};
use crate::vector::{FieldVectors, KeywordSet, ReplacedVersion};
use crate::{Scope, StoreError, TurnPoint, VectorIndex, VectorQuery};

/// [`VectorIndex`] on a `recollect-store` service.
pub struct RemoteVectorIndex {
    client: Client,
}

impl RemoteVectorIndex {
    pub fn new(url: &str, token: &str) -> Result<Self, StoreError> {
        Ok(Self {
            client: Client::new(url, token)?,
        })
    }
    async fn call<T: DeserializeOwned>(&self, c: VectorCall) -> Result<T, StoreError> {
        self.client.call(VECTORS_PATH, &c).await
    }
    /// A call answered with a score per turn (JSON maps need string keys: pairs on the wire).
    async fn scores(&self, c: VectorCall) -> Result<HashMap<MemoryId, f32>, StoreError> {
        let pairs: Vec<(MemoryId, f32)> = self.call(c).await?;
        Ok(pairs.into_iter().collect())
    }
}

#[async_trait]
impl VectorIndex for RemoteVectorIndex {
    fn kind(&self) -> &'static str {
        "remote"
    }
    async fn upsert_turns(&self, points: Vec<TurnPoint>) -> Result<(), StoreError> {
        self.call(VectorCall::UpsertTurns { points }).await
    }
    async fn search(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        query: &VectorQuery,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, StoreError> {
        self.call(VectorCall::Search {
            tenant: tenant.clone(),
            scope: scope.clone(),
            query: query.clone(),
            limit,
        })
        .await
    }
    async fn field_vectors(
        &self,
        tenant: &TenantId,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        let pairs: Vec<(MemoryId, FieldVectors)> = self
            .call(VectorCall::FieldVectors {
                tenant: tenant.clone(),
                ids: ids.to_vec(),
            })
            .await?;
        Ok(pairs.into_iter().collect())
    }
    async fn late_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        self.scores(VectorCall::LateScores {
            tenant: tenant.clone(),
            question: question.clone(),
            ids: ids.to_vec(),
        })
        .await
    }

    async fn sentence_scores(
        &self,
        tenant: &TenantId,
        question: &TokenVectors,
        ids: &[MemoryId],
    ) -> Result<HashMap<MemoryId, f32>, StoreError> {
        self.scores(VectorCall::SentenceScores {
            tenant: tenant.clone(),
            question: question.clone(),
            ids: ids.to_vec(),
        })
        .await
    }

    async fn keep_versions(
        &self,
        tenant: &TenantId,
        versions: &[ReplacedVersion],
    ) -> Result<(), StoreError> {
        self.call(VectorCall::KeepVersions {
            tenant: tenant.clone(),
            versions: versions.to_vec(),
        })
        .await
    }
    async fn version_vectors(
        &self,
        tenant: &TenantId,
        versions: &[(MemoryId, chrono::DateTime<chrono::Utc>)],
    ) -> Result<HashMap<MemoryId, FieldVectors>, StoreError> {
        let pairs: Vec<(MemoryId, FieldVectors)> = self
            .call(VectorCall::VersionVectors {
                tenant: tenant.clone(),
                versions: versions.to_vec(),
            })
            .await?;
        Ok(pairs.into_iter().collect())
    }
    async fn upsert_keywords(
        &self,
        tenant: &TenantId,
        conversation: &str,
        keywords: Vec<KeywordVector>,
    ) -> Result<(), StoreError> {
        self.call(VectorCall::UpsertKeywords {
            tenant: tenant.clone(),
            conversation: conversation.into(),
            keywords,
        })
        .await
    }
    async fn upsert_keyword_sets(&self, sets: Vec<KeywordSet>) -> Result<(), StoreError> {
        // Sent by reference, so the batch is not copied for the rare fallback below.
        let call = VectorCall::UpsertKeywordSets { sets };
        match self.client.call(VECTORS_PATH, &call).await {
            // A store service older than this call refuses it as a bad request: one call per
            // conversation, as before (a rolling upgrade updates workers and the store apart).
            Err(StoreError::Invalid(_)) => {
                let VectorCall::UpsertKeywordSets { sets } = call else {
                    unreachable!("built above")
                };
                for set in sets {
                    self.upsert_keywords(&set.tenant, &set.conversation, set.keywords)
                        .await?;
                }
                Ok(())
            }
            r => r,
        }
    }
    async fn search_keywords(
        &self,
        tenant: &TenantId,
        scope: &Scope,
        vector: &[f32],
        limit: usize,
        min_score: f32,
    ) -> Result<Vec<(String, f32)>, StoreError> {
        self.call(VectorCall::SearchKeywords {
            tenant: tenant.clone(),
            scope: scope.clone(),
            vector: vector.to_vec(),
            limit,
            min_score,
        })
        .await
    }
    async fn delete_conversation(
        &self,
        tenant: &TenantId,
        conversation: &str,
    ) -> Result<u64, StoreError> {
        self.call(VectorCall::DeleteConversation {
            tenant: tenant.clone(),
            conversation: conversation.into(),
        })
        .await
    }
    async fn delete_turns(
        &self,
        tenant: &TenantId,
        conversation: &str,
        ids: &[MemoryId],
        keywords: &[String],
    ) -> Result<(), StoreError> {
        self.call(VectorCall::DeleteTurns {
            tenant: tenant.clone(),
            conversation: conversation.into(),
            ids: ids.to_vec(),
            keywords: keywords.to_vec(),
        })
        .await
    }
    async fn count(&self, tenant: &TenantId, scope: &Scope) -> Result<u64, StoreError> {
        self.call(VectorCall::Count {
            tenant: tenant.clone(),
            scope: scope.clone(),
        })
        .await
    }
    async fn optimize(&self) -> Result<(), StoreError> {
        self.call(VectorCall::Optimize).await
    }
}
