//! The API suites in both deployment modes: the embedded `recollect serve`, or the distributed
//! pair (recollect-gateway + recollect-query) over a tansu broker with the recollect-store
//! service and one worker of each kind. In distributed mode a small reverse proxy plays the
//! ingress: the store path (store turns, erase a conversation, erase the tenant) goes to the
//! gateway, everything else to the query service, so a suite talks to one URL either way.

use std::net::SocketAddr;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::{start_store, tansu, Broker, Server};

/// Which deployment a suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    Distributed,
}

impl Mode {
    /// The modes this machine can run: distributed needs tansu (`make test` installs it and
    /// sets REQUIRE_KAFKA, which turns its absence into a failure instead of a skip).
    pub fn available() -> Vec<Mode> {
        if tansu().is_some() {
            return vec![Mode::Embedded, Mode::Distributed];
        }
        assert!(
            std::env::var("REQUIRE_KAFKA").is_err(),
            "tansu is required here (scripts/setup-kafka.sh installs it)"
        );
        eprintln!("distributed mode skipped: tansu is not installed (scripts/setup-kafka.sh)");
        vec![Mode::Embedded]
    }

    /// True when tansu is installed; otherwise says why the distributed run is skipped (and
    /// fails under REQUIRE_KAFKA).
    pub fn distributed_available() -> bool {
        Self::available().contains(&Mode::Distributed)
    }
}

/// True when a request goes to the gateway: the ingress rule of a distributed deployment.
pub fn is_store_path(method: &Method, path: &str) -> bool {
    let conversation = path.strip_prefix("/v1/conversations/");
    path == "/v1/tenant"
        || path == "/v1/reindex"
        || path == "/v1/admin/backup"
        || (method == Method::POST && conversation.is_some_and(|c| c.ends_with("/turns")))
        || (method == Method::DELETE && conversation.is_some())
        || ((method == Method::DELETE || method == Method::PATCH)
            && path.starts_with("/v1/memories/"))
}

/// The pieces of a distributed deployment beside its front door; killed on drop.
pub struct Pipeline {
    pub gateway: Server,
    pub query_direct_url: String,
    pub store: Server,
    pub workers: Vec<Server>,
    pub broker: Broker,
    proxy: Option<(tokio::runtime::Runtime, String)>,
    _data: tempfile::TempDir,
}

/// A running deployment in either mode. Derefs to the front `Server`: in embedded mode the
/// server itself; in distributed mode the query service with its URL replaced by the proxy's
/// (its `grpc_url` is the query service's gRPC; the gateway's is [`Deployment::grpc_store_url`]).
pub struct Deployment {
    pub mode: Mode,
    pub front: Server,
    pub pipeline: Option<Pipeline>,
}

impl Deref for Deployment {
    type Target = Server;
    fn deref(&self) -> &Server {
        &self.front
    }
}

impl Deployment {
    /// Starts `mode` with the suite's environment (API keys, limits, embedder). Embedded mode
    /// keeps its data in `data_dir`; distributed mode in a directory of its own.
    pub fn start(mode: Mode, data_dir: &Path, env: &[(&str, &str)]) -> Deployment {
        match mode {
            Mode::Embedded => Deployment {
                mode,
                front: Server::start(data_dir, env),
                pipeline: None,
            },
            Mode::Distributed => start_distributed(env),
        }
    }

    /// The gRPC endpoint of the store path (the gateway's, or the embedded server's).
    pub fn grpc_store_url(&self) -> String {
        match &self.pipeline {
            Some(p) => p.gateway.grpc_url.clone(),
            None => self.front.grpc_url.clone(),
        }
    }

    /// Every process of the deployment is still running.
    pub fn all_alive(&mut self) -> bool {
        let mut alive = matches!(self.front.child.try_wait(), Ok(None));
        if let Some(p) = &mut self.pipeline {
            for s in std::iter::once(&mut p.gateway)
                .chain(std::iter::once(&mut p.store))
                .chain(p.workers.iter_mut())
            {
                alive &= matches!(s.child.try_wait(), Ok(None));
            }
        }
        alive
    }

    /// Every turn stored for `tenant` (open mode: "default"), counted in the stores: the raw
    /// store in embedded mode (stop the server first: it holds the file), the graph of the
    /// store service in distributed mode.
    pub fn stored_turns(&self, data_dir: &Path, tenant: &str) -> u64 {
        match &self.pipeline {
            None => {
                let raw = recollect_storage::RawStore::open(&data_dir.join("raw.redb"))
                    .expect("open the raw store");
                raw.count().expect("count")
            }
            Some(p) => {
                let call = |body: Value| -> Value {
                    let r = p
                        .store
                        .client
                        .post(format!("{}/v1/store/graph", p.store.url))
                        .bearer_auth(STORE_TOKEN)
                        .json(&body)
                        .send()
                        .expect("store service call");
                    assert!(r.status().is_success(), "store call: {}", r.status());
                    r.json().expect("store reply")
                };
                let convs = call(json!({"op": "conversations", "tenant": tenant}));
                convs
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .iter()
                    .map(|c| {
                        call(json!({"op": "conversation_turns", "tenant": tenant,
                                     "conversation": c, "from": 0, "to": u64::MAX}))
                        .as_array()
                        .map_or(0, |a| a.len() as u64)
                    })
                    .sum()
            }
        }
    }

    /// SIGTERM to every process (graceful), front door last but one, broker last on drop.
    pub fn stop(&mut self) {
        if let Some(p) = &mut self.pipeline {
            p.gateway.stop();
        }
        self.front.stop();
    }
}

const STORE_TOKEN: &str = "harness-store-token";

fn start_distributed(env: &[(&str, &str)]) -> Deployment {
    let tansu = tansu().expect("tansu is installed (Mode::available checked)");
    let broker = Broker::start(&tansu);
    let data = tempfile::tempdir().unwrap();
    let mut all: Vec<(String, String)> = [
        ("RECOLLECT__BUS__KIND", "kafka".to_string()),
        ("RECOLLECT__BUS__BROKERS", broker.addr.clone()),
        ("RECOLLECT__BUS__PARTITIONS", "2".into()),
        ("RECOLLECT__GRAPH__KIND", "remote".into()),
        ("RECOLLECT__VECTORS__KIND", "remote".into()),
        ("RECOLLECT__REMOTE__TOKEN", STORE_TOKEN.into()),
        (
            "RECOLLECT__STORAGE__DATA_DIR",
            data.path().display().to_string(),
        ),
        ("RECOLLECT__EMBEDDER__KIND", "hash".into()),
        ("RECOLLECT__TELEMETRY__LOG_LEVEL", "warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // The suite's own settings win (they are later in the environment list).
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let store = start_store(&all);
    all.push(("RECOLLECT__REMOTE__URL".into(), store.url.clone()));
    let workers: Vec<Server> = [
        "recollect-extractor",
        "recollect-embedder",
        "recollect-graph-writer",
        "recollect-consolidator",
    ]
    .iter()
    .map(|name| Server::service(name, &all, true))
    .collect();
    let gateway = Server::service("recollect-gateway", &all, true);
    let mut query = Server::service("recollect-query", &all, true);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let proxy_url = rt.block_on(start_proxy(gateway.url.clone(), query.url.clone()));
    let query_direct_url = std::mem::replace(&mut query.url, proxy_url.clone());
    Deployment {
        mode: Mode::Distributed,
        front: query,
        pipeline: Some(Pipeline {
            gateway,
            query_direct_url,
            store,
            workers,
            broker,
            proxy: Some((rt, proxy_url)),
            _data: data,
        }),
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Some((rt, _)) = self.proxy.take() {
            rt.shutdown_background();
        }
    }
}

struct Upstreams {
    gateway: String,
    query: String,
    client: reqwest::Client,
}

/// The ingress: listens on a free loopback port and forwards each request, body and headers
/// untouched, to the gateway or the query service.
async fn start_proxy(gateway: String, query: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let up = Arc::new(Upstreams {
        gateway,
        query,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .build()
            .unwrap(),
    });
    let app = axum::Router::new().fallback(forward).with_state(up);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

const HOP_BY_HOP: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
];

async fn forward(State(up): State<Arc<Upstreams>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let target = if is_store_path(&parts.method, parts.uri.path()) {
        &up.gateway
    } else {
        &up.query
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return (StatusCode::BAD_GATEWAY, "proxy: could not read the body").into_response();
    };
    let mut rb = up
        .client
        .request(parts.method.clone(), format!("{target}{path}"));
    for (k, v) in &parts.headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            rb = rb.header(k, v);
        }
    }
    let resp = match rb.body(bytes).send().await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("proxy: {e}")).into_response(),
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.unwrap_or_default();
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    for (k, v) in &headers {
        if !HOP_BY_HOP.contains(&k.as_str()) {
            out.headers_mut().append(k.clone(), v.clone());
        }
    }
    out
}

/// gRPC in either mode: the store path (Store, StoreStream, Delete) on the gateway's channel,
/// the read path (Recall, Get) on the query service's; one channel to the embedded server.
pub struct GrpcClients {
    pub store_path: recollect_proto::v1::memory_client::MemoryClient<tonic::transport::Channel>,
    pub read_path: recollect_proto::v1::memory_client::MemoryClient<tonic::transport::Channel>,
}

impl GrpcClients {
    pub async fn connect(d: &Deployment) -> GrpcClients {
        use recollect_proto::v1::memory_client::MemoryClient;
        GrpcClients {
            store_path: MemoryClient::connect(d.grpc_store_url()).await.unwrap(),
            read_path: MemoryClient::connect(d.front.grpc_url.clone())
                .await
                .unwrap(),
        }
    }

    pub async fn store(
        &mut self,
        r: tonic::Request<recollect_proto::v1::StoreRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::StoreResponse>, tonic::Status> {
        self.store_path.store(r).await
    }

    pub async fn store_stream(
        &mut self,
        r: impl tonic::IntoStreamingRequest<Message = recollect_proto::v1::StoreRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::StoreResponse>, tonic::Status> {
        self.store_path.store_stream(r).await
    }

    pub async fn delete(
        &mut self,
        r: tonic::Request<recollect_proto::v1::DeleteRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::DeleteResponse>, tonic::Status> {
        self.store_path.delete(r).await
    }

    pub async fn recall(
        &mut self,
        r: tonic::Request<recollect_proto::v1::RecallRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::RecallResponse>, tonic::Status> {
        self.read_path.recall(r).await
    }

    pub async fn get(
        &mut self,
        r: tonic::Request<recollect_proto::v1::GetRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::Turn>, tonic::Status> {
        self.read_path.get(r).await
    }

    pub async fn edit_memory(
        &mut self,
        r: tonic::Request<recollect_proto::v1::EditMemoryRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::Turn>, tonic::Status> {
        self.store_path.edit_memory(r).await
    }

    pub async fn reindex(
        &mut self,
        r: tonic::Request<recollect_proto::v1::ReindexRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::ReindexResponse>, tonic::Status> {
        self.store_path.reindex(r).await
    }

    pub async fn memory_history(
        &mut self,
        r: tonic::Request<recollect_proto::v1::MemoryHistoryRequest>,
    ) -> Result<tonic::Response<recollect_proto::v1::MemoryHistoryResponse>, tonic::Status> {
        self.read_path.memory_history(r).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_path_goes_to_the_gateway() {
        assert!(is_store_path(&Method::POST, "/v1/conversations/c1/turns"));
        assert!(is_store_path(&Method::DELETE, "/v1/conversations/c1"));
        assert!(is_store_path(&Method::DELETE, "/v1/tenant"));
        assert!(!is_store_path(&Method::GET, "/v1/conversations/c1"));
        assert!(!is_store_path(&Method::POST, "/v1/recall"));
        assert!(!is_store_path(&Method::GET, "/v1/memories/x"));
        assert!(is_store_path(&Method::PATCH, "/v1/memories/x"));
        assert!(!is_store_path(&Method::GET, "/v1/memories/x/history"));
        assert!(!is_store_path(&Method::GET, "/healthz"));
    }
}
