//! `recollect-query`: the stateless read path (recall, memories by id, conversation info) over
//! HTTP and gRPC on the shared serving layer. Any number of replicas behind a load balancer.

use std::sync::Arc;

use recollect_api::Auth;
use recollect_embed::{CachedEmbedder, CachedTokenEmbedder, TokenEmbedder};
use recollect_query::QueryState;
use recollect_recall::{Recall, RecallLimits};
use recollect_runtime::{
    graph_check, load_embedder, load_reranker, load_token_embedder, start, token_embedder_for,
    vectors_check,
};
use recollect_serve::Roles;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (settings, _telemetry) = start("query")?;
    let dir = settings.storage.data_dir.clone();
    let embedder = load_embedder(&settings)?;
    let graph = recollect_storage::open_graph(&settings, &dir).await?;
    let vectors = recollect_storage::open_vectors(&settings, &dir, embedder.dim()).await?;
    // The question's token vectors cached by its text, as its embeddings are.
    let tokens = token_embedder_for(&settings, load_token_embedder(&settings)?, vectors.as_ref())
        .map(|t| Arc::new(CachedTokenEmbedder::new(t)) as Arc<dyn TokenEmbedder>);
    let checks = vec![graph_check(graph.clone()), vectors_check(vectors.clone())];
    let recall = Arc::new(
        Recall::new(
            graph,
            vectors,
            Arc::new(CachedEmbedder::new(embedder)),
            settings.recall.clone(),
            RecallLimits::from(&settings.server),
        )
        .with_reranker(load_reranker(&settings)?)
        .with_token_embedder(tokens),
    );
    let roles = Roles {
        gateway: None,
        query: Some(Arc::new(QueryState {
            recall,
            auth: Auth::new(settings.api_keys()),
            raw: None,
        })),
    };
    recollect_serve::serve(&settings, roles, checks).await?;
    Ok(())
}
