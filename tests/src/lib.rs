//! Helpers for end-to-end tests: start the real `recollect` binary on a free loopback port with
//! its own data directory, wait until it is ready, stop it by PID.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;
use serde_json::Value;

pub mod distributed;

/// The `recollect` binary built beside this test binary (target/<profile>/recollect).
pub fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("RECOLLECT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    dir.join("recollect")
}

/// A port free at the time of asking, for servers that cannot listen on port 0 and report
/// it (the broker); Recollect's own servers use [`AddressFile`].
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where a server started on port 0 reports the addresses it bound (`server.address_file`).
pub struct AddressFile(tempfile::TempDir);

impl AddressFile {
    pub fn new() -> Self {
        Self(tempfile::tempdir().expect("temp dir"))
    }

    pub fn path(&self) -> PathBuf {
        self.0.path().join("addresses.json")
    }

    /// The HTTP and gRPC addresses once written; None if the process exits first.
    pub fn wait(&self, child: &mut Child, what: &str) -> Option<(String, Option<String>)> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(body) = std::fs::read_to_string(self.path()) {
                let v: Value = serde_json::from_str(&body).expect("address file is JSON");
                let http = v["http"].as_str().expect("http address").to_string();
                return Some((http, v["grpc"].as_str().map(str::to_string)));
            }
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not listen within 120s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Default for AddressFile {
    fn default() -> Self {
        Self::new()
    }
}

/// Starts `recollect-store` with a deployment's settings. It always hosts the embedded stores;
/// the kinds are set here too because the others' `remote` kinds would need a URL the store
/// itself has no use for (it is the URL, known once it listens).
pub fn start_store(env: &[(String, String)]) -> Server {
    let mut env = env.to_vec();
    env.push(("RECOLLECT__GRAPH__KIND".into(), "embedded".into()));
    env.push(("RECOLLECT__VECTORS__KIND".into(), "embedded".into()));
    Server::service("recollect-store", &env, true)
}

/// A running server; killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
    /// The gRPC endpoint, e.g. http://127.0.0.1:PORT.
    pub grpc_url: String,
    pub data_dir: PathBuf,
    pub client: Client,
}

impl Server {
    /// Starts `recollect serve` on `data_dir` with extra environment, and waits for /readyz.
    pub fn start(data_dir: &Path, env: &[(&str, &str)]) -> Server {
        Self::start_logged(data_dir, env, None)
    }

    /// As [`Server::start`], with stdout and stderr appended to `log` when given.
    pub fn start_logged(data_dir: &Path, env: &[(&str, &str)], log: Option<&Path>) -> Server {
        Self::try_start(data_dir, env, log).expect("recollect serve exited during start")
    }

    fn try_start(data_dir: &Path, env: &[(&str, &str)], log: Option<&Path>) -> Option<Server> {
        let mut cmd = Command::new(binary());
        // Port 0 for both: the server reports what it bound (server.address_file), so no two
        // servers race for a port picked in advance.
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--grpc-listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(path) = log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("open server log");
            cmd.stdout(f.try_clone().expect("clone log handle"))
                .stderr(f);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let addresses = AddressFile::new();
        cmd.env("RECOLLECT__SERVER__ADDRESS_FILE", addresses.path());
        let mut child = cmd.spawn().expect("start recollect serve");
        let (http, grpc) = addresses.wait(&mut child, "recollect serve")?;
        let mut s = Server {
            child,
            url: format!("http://{http}"),
            grpc_url: grpc.map(|g| format!("http://{g}")).unwrap_or_default(),
            data_dir: data_dir.to_path_buf(),
            client: Client::builder()
                .timeout(Duration::from_secs(180))
                .build()
                .unwrap(),
        };
        let start = Instant::now();
        loop {
            if let Ok(Some(_)) = s.child.try_wait() {
                return None;
            }
            if let Ok(r) = s.client.get(format!("{}/readyz", s.url)).send() {
                if r.status().is_success() {
                    return Some(s);
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "server did not become ready within 120s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_ready(&self, limit: Duration) {
        let start = Instant::now();
        loop {
            if let Ok(r) = self.client.get(format!("{}/readyz", self.url)).send() {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(
                start.elapsed() < limit,
                "server did not become ready within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn post(&self, path: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
        let mut r = self.client.post(format!("{}{path}", self.url)).json(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    pub fn post_raw(
        &self,
        path: &str,
        key: Option<&str>,
        body: Vec<u8>,
        content_type: &str,
    ) -> (u16, Value) {
        let mut r = self
            .client
            .post(format!("{}{path}", self.url))
            .header("content-type", content_type)
            .body(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    /// Any method, raw body and headers; returns status, headers and the body text.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (u16, reqwest::header::HeaderMap, String) {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.client.request(m, format!("{}{path}", self.url));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        if let Some(b) = body {
            r = r.body(b);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        let h = resp.headers().clone();
        (status, h, resp.text().unwrap_or_default())
    }

    pub fn get(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut r = self.client.get(format!("{}{path}", self.url));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub fn patch(&self, path: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
        let mut r = self.client.patch(format!("{}{path}", self.url)).json(body);
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    pub fn delete(&self, path: &str, key: Option<&str>) -> (u16, Value) {
        let mut r = self.client.delete(format!("{}{path}", self.url));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let resp = r.send().expect("request");
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    /// SIGKILL: no chance to flush or drain.
    pub fn kill9(&mut self) {
        let _ = Command::new("kill")
            .arg("-9")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait: graceful shutdown.
    pub fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Skips (with a message) when the embedding model is not set up; `make test` always sets it up.
pub fn model_available() -> bool {
    let dir = std::env::var("RECOLLECT_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../models/all-MiniLM-L6-v2"
            ))
        });
    let ok = dir.join("model.safetensors").exists();
    if !ok {
        eprintln!(
            "skipping: no embedding model at {} (run `make setup`)",
            dir.display()
        );
    }
    ok
}

/// Environment for a server without the model: the lexical hash embedder, no rate limit.
pub fn hash_env() -> Vec<(&'static str, String)> {
    vec![
        ("RECOLLECT__EMBEDDER__KIND", "hash".to_string()),
        ("RECOLLECT__SERVER__RATE_LIMIT_PER_SEC", "0".to_string()),
    ]
}

pub fn env_refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, s)| (*k, s.as_str())).collect()
}

pub fn model_env() -> Vec<(&'static str, String)> {
    let dir = std::env::var("RECOLLECT_MODEL_DIR").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../models/all-MiniLM-L6-v2").to_string()
    });
    vec![("RECOLLECT_MODEL_DIR", dir)]
}

/// A binary built beside this test binary (target/<profile>/NAME).
pub fn binary_named(name: &str) -> PathBuf {
    binary().with_file_name(name)
}

impl Server {
    /// Starts one of the service binaries (`recollect-extractor`, …) on port 0 (and on port 0
    /// for gRPC, which the gateway and query services serve), with its configuration in `env`;
    /// the ports are what the service reports in its address file. Waits for /readyz when
    /// `wait` is set. As with [`hash_env`], no per-tenant rate limit unless `env` sets one (bulk
    /// tests read thousands of memories).
    pub fn service(name: &str, env: &[(String, String)], wait: bool) -> Server {
        let mut cmd = Command::new(binary_named(name));
        cmd.env("RECOLLECT__SERVER__LISTEN", "127.0.0.1:0")
            .env("RECOLLECT__SERVER__GRPC_LISTEN", "127.0.0.1:0")
            .env("RECOLLECT__SERVER__RATE_LIMIT_PER_SEC", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let addresses = AddressFile::new();
        cmd.env("RECOLLECT__SERVER__ADDRESS_FILE", addresses.path());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e} (build with `cargo build --workspace`)"));
        let (http, grpc) = addresses
            .wait(&mut child, name)
            .unwrap_or_else(|| panic!("{name} exited before it listened"));
        let s = Server {
            child,
            url: format!("http://{http}"),
            grpc_url: grpc.map(|g| format!("http://{g}")).unwrap_or_default(),
            data_dir: PathBuf::new(),
            client: Client::builder()
                .timeout(Duration::from_secs(180))
                .build()
                .unwrap(),
        };
        if wait {
            s.wait_ready(Duration::from_secs(120));
        }
        s
    }

    /// The values of a metric family's samples in this process's /metrics whose line contains
    /// `label_filter`.
    pub fn metric_values(&self, family: &str, label_filter: &str) -> Vec<f64> {
        let (_, body) = self.get("/metrics", None);
        let text = body.as_str().unwrap_or_default().to_string();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split(['{', ' ']).next() == Some(family) && l.contains(label_filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect()
    }

    pub fn metric_sum(&self, family: &str, label_filter: &str) -> f64 {
        self.metric_values(family, label_filter).iter().sum()
    }
}

/// A Kafka-protocol broker (tansu, sqlite storage) on a free loopback port; killed on drop.
pub struct Broker {
    pub child: Child,
    pub addr: String,
    tansu: PathBuf,
    dir: tempfile::TempDir,
}

/// The broker scripts/setup-kafka.sh builds: tansu 0.6.0 with its group-coordinator patch
/// (`RECOLLECT_TANSU`, which `make test` sets, else the newest build in the cache). An unpatched
/// tansu on PATH is not used: it never reassigns the partitions of a member that dies, which the
/// scale-out test would report as a hang. None when it is not built.
pub fn tansu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RECOLLECT_TANSU").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    let cache = std::env::var_os("RECOLLECT_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/recollect")))?;
    let mut builds: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(cache)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tansu-0.6.0-"))
        .map(|e| e.path().join("bin/tansu"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    builds.sort();
    builds.pop().map(|(_, p)| p)
}

impl Broker {
    pub fn start(tansu: &Path) -> Broker {
        let dir = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Self::spawn(tansu, &addr, dir.path());
        Broker {
            child,
            addr,
            tansu: tansu.to_path_buf(),
            dir,
        }
    }

    fn spawn(tansu: &Path, addr: &str, dir: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("broker.log"))
            .expect("broker log");
        let child = Command::new(tansu)
            .arg("broker")
            .arg("--listener-url")
            .arg(format!("tcp://{addr}"))
            .arg("--advertised-listener-url")
            .arg(format!("tcp://{addr}"))
            // tansu reads the sqlite path relative to its working directory.
            .arg("--storage-engine")
            .arg("sqlite://tansu.db")
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start tansu");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    }

    /// SIGKILL, as a crash or a node loss: the sqlite storage stays.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the broker again (after [`Broker::kill9`], or killing it first) on the same address
    /// and the same storage, so topics, messages and committed offsets survive; waits until it
    /// listens.
    pub fn restart(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
        self.child = Self::spawn(&self.tansu, &self.addr, self.dir.path());
    }

    /// The broker's log (stderr of every run).
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Distributed-mode checks on the stores themselves (kafka_erasure.rs).
// ---------------------------------------------------------------------------------------------

/// One call on a `recollect-store` service (`/v1/store/graph` or `/v1/store/vectors`), asserted
/// successful: the stores' own answer, not the query path's.
pub fn store_call(store: &Server, token: &str, path: &str, body: &Value) -> Value {
    let resp = store
        .client
        .post(format!("{}{path}", store.url))
        .bearer_auth(token)
        .json(body)
        .send()
        .expect("store service call");
    let status = resp.status();
    let text = resp.text().unwrap_or_default();
    assert!(status.is_success(), "store call failed: {status}: {text}");
    serde_json::from_str(&text).expect("store reply")
}

/// The largest consumer lag any of `workers` reports.
pub fn max_consumer_lag(workers: &[&Server]) -> f64 {
    workers
        .iter()
        .flat_map(|w| w.metric_values("recollect_bus_consumer_lag_messages", ""))
        .fold(0.0, f64::max)
}

/// Runs the CLI on a data dir with the lexical-only embedder and no API keys (the open,
/// single-tenant mode): (success, stdout, stderr).
pub fn cli(data: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(binary())
        .args(["--data-dir", data.to_str().expect("a UTF-8 path")])
        .args(args)
        .env("RECOLLECT__EMBEDDER__KIND", "hash")
        .env("RECOLLECT__TELEMETRY__LOG_LEVEL", "warn")
        .env_remove("RECOLLECT_API_KEYS")
        .output()
        .expect("the recollect binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
