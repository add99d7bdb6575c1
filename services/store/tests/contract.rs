//! The store contract suite, run through the store service: `RemoteGraph` and
//! `RemoteVectorIndex` over HTTP against embedded stores hosted by the service's router.

use std::sync::Arc;

use recollect_storage::contract::{graph_contract, vector_contract, Residue};
use recollect_storage::{EdgeVectorIndex, EmbeddedGraph, RemoteGraph, RemoteVectorIndex};
use recollect_store_service::{router, Hosted};

/// The service on a free port. Stop it (`stop`) before the temp dir goes: the vector engine
/// flushes its files when the last handle drops.
async fn serve(
    dir: &std::path::Path,
    dim: usize,
    token: &str,
) -> (String, tokio::task::JoinHandle<()>) {
    serve_graph(
        EmbeddedGraph::open(&dir.join("graph.redb")).unwrap(),
        dir,
        dim,
        token,
    )
    .await
}

async fn serve_graph(
    graph: EmbeddedGraph,
    dir: &std::path::Path,
    dim: usize,
    token: &str,
) -> (String, tokio::task::JoinHandle<()>) {
    let hosted = Hosted {
        graph: Arc::new(graph),
        vectors: Arc::new(EdgeVectorIndex::open(&dir.join("vectors"), dim).unwrap()),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(hosted, token.to_string());
    let h = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), h)
}

async fn stop(h: tokio::task::JoinHandle<()>) {
    h.abort();
    let _ = h.await;
}

/// Runs `f` on its own runtime and shuts the runtime down (dropping every connection task and
/// with it the hosted stores, which flush) while the temp dir still exists.
fn with_dir<F, Fut>(f: F)
where
    F: FnOnce(std::path::PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(f(dir.path().to_path_buf()));
    drop(rt);
    drop(dir);
}

#[test]
fn graph_contract_through_the_store_service() {
    with_dir(|dir| async move {
        let hosted = EmbeddedGraph::open(&dir.join("graph.redb")).unwrap();
        // Residue is checked in the hosted store itself, not through the service.
        let direct = hosted.clone();
        let residue: Residue = Arc::new(move |t, c| {
            let g = direct.clone();
            Box::pin(async move { g.residue(&t, &c).unwrap() })
        });
        let (url, h) = serve_graph(hosted, &dir, 32, "s3cret").await;
        graph_contract(Arc::new(RemoteGraph::new(&url, "s3cret").unwrap()), residue).await;
        stop(h).await;
    });
}

#[test]
fn vector_contract_through_the_store_service() {
    with_dir(|dir| async move {
        let (url, h) = serve(&dir, 32, "").await;
        let v = Arc::new(RemoteVectorIndex::new(&url, "").unwrap());
        vector_contract(v.clone(), 32).await;
        recollect_storage::contract::plain_index_ignores_token_vectors(v, 32).await;
        stop(h).await;
    });
}

#[test]
fn late_interaction_through_the_store_service() {
    with_dir(|dir| async move {
        let hosted = Hosted {
            graph: Arc::new(EmbeddedGraph::open(&dir.join("graph.redb")).unwrap()),
            vectors: Arc::new(
                EdgeVectorIndex::open_shaped(
                    &dir.join("vectors"),
                    32,
                    Some(16),
                    recollect_storage::Flushes::EachWrite,
                )
                .unwrap(),
            ),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(hosted, String::new());
        let h = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let v = Arc::new(RemoteVectorIndex::new(&format!("http://{addr}"), "").unwrap());
        recollect_storage::contract::late_contract(v, 32, 16).await;
        stop(h).await;
    });
}

#[test]
fn a_wrong_token_is_refused_and_not_retried_as_transient_forever() {
    with_dir(|dir| async move {
        let (url, h) = serve(&dir, 32, "right").await;
        let g = RemoteGraph::new(&url, "wrong").unwrap();
        let err =
            recollect_storage::GraphRead::conversations(&g, &recollect_model::TenantId("t".into()))
                .await
                .unwrap_err();
        assert!(err.to_string().contains("401"), "{err}");
        stop(h).await;
    });
}
