//! What the Kafka end-to-end tests share: worker groups of several instances, a client that
//! behaves as a real one (request timeout, retries with the same turn ids), a lag probe that
//! reads every group's committed offsets from the broker, and the dead-letter reader.
// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use recollect_bus::{Bus, Delivery, GroupOffsets, KafkaBus, KafkaSettings, PartitionOffsets};
use recollect_model::topics;
use recollect_tests::Server;
use serde_json::{json, Value};

/// One worker kind: its consumer group, input topic and running instances.
pub struct Workers {
    pub kind: &'static str,
    pub group: String,
    pub topic: &'static str,
    pub instances: Vec<Server>,
}

/// The four pipeline stages in order, as `recollect-<kind>` binaries.
pub const STAGES: [(&str, &str); 4] = [
    ("extractor", topics::RAW),
    ("embedder", topics::EXTRACTED),
    ("graph-writer", topics::EMBEDDED),
    ("consolidator", topics::STORED),
];

pub fn start_service(name: &str, env: &[(String, String)]) -> Server {
    Server::service(name, env, true)
}

impl Workers {
    pub fn start(
        kind: &'static str,
        topic: &'static str,
        n: usize,
        env: &[(String, String)],
    ) -> Self {
        let instances = (0..n)
            .map(|_| start_service(&format!("recollect-{kind}"), env))
            .collect();
        Workers {
            kind,
            // run_workers: "{bus.group_prefix}-{stage name}"
            group: format!("recollect-{kind}"),
            topic,
            instances,
        }
    }

    /// kill -9 instance `i` and start a replacement in its place; returns the kill instant.
    pub fn kill_and_restart(&mut self, i: usize, env: &[(String, String)]) -> Instant {
        self.instances[i].kill9();
        let at = Instant::now();
        self.instances[i] = start_service(&format!("recollect-{}", self.kind), env);
        at
    }

    pub fn metric_sum(&self, family: &str, filter: &str) -> f64 {
        self.instances
            .iter()
            .map(|s| s.metric_sum(family, filter))
            .sum()
    }
}

pub fn kafka_bus(brokers: &str, partitions: i32) -> Arc<KafkaBus> {
    KafkaBus::connect(KafkaSettings {
        brokers: brokers.to_string(),
        client_id: "e2e-test".into(),
        partitions,
        replication: 1,
        security: Default::default(),
    })
    .expect("kafka client")
}

pub fn turn_text(c: usize, t: usize) -> (String, String) {
    (
        format!("conversation {c} turn {t}: I visited lighthouse{c}x{t} with my sister on Tuesday"),
        format!("That sounds lovely. What did you see at lighthouse{c}x{t}?"),
    )
}

/// Turns `from..to` of conversation `c`, with their ids (`t042` is turn 42).
pub fn turns_body(c: usize, from: usize, to: usize) -> Value {
    let turns: Vec<Value> = (from..to)
        .map(|t| {
            let (user, assistant) = turn_text(c, t);
            json!({"turn_id": format!("t{t:03}"), "user": user, "assistant": assistant,
                   "user_speaker": "Mel", "assistant_speaker": "Caroline",
                   "timestamp": format!("2024-05-{:02}T10:{:02}:00Z", 1 + t / 60, t % 60)})
        })
        .collect();
    json!({ "turns": turns })
}

/// Why a client resent a request.
#[derive(Debug, Default, Clone)]
pub struct Retries {
    /// 503 and other "try again" statuses (429, 502, 504).
    pub unavailable: usize,
    /// Request timeout or connection failure.
    pub transport: usize,
}

impl Retries {
    pub fn total(&self) -> usize {
        self.unavailable + self.transport
    }
}

/// A client as an application would write one: a request timeout, and on a timeout, a refused
/// connection or a "try again" status the same request again (same turn ids, so the same
/// memories) after a short backoff.
pub struct Client {
    http: reqwest::blocking::Client,
    pub retries: Retries,
    /// When each retried request finally got its 202 (after a fault).
    pub last_success: Option<Instant>,
}

impl Client {
    pub fn new(timeout: Duration) -> Self {
        Client {
            http: reqwest::blocking::Client::builder()
                .timeout(timeout)
                .build()
                .unwrap(),
            retries: Retries::default(),
            last_success: None,
        }
    }

    /// Stores the turns; returns their memory ids once the gateway answered 202.
    pub fn store(
        &mut self,
        gateway: &str,
        key: &str,
        conversation: &str,
        body: &Value,
    ) -> Vec<String> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            let r = self
                .http
                .post(format!("{gateway}/v1/conversations/{conversation}/turns"))
                .bearer_auth(key)
                .json(body)
                .send();
            match r {
                Ok(resp) if resp.status().as_u16() == 202 => {
                    let v: Value = resp.json().expect("store reply");
                    self.last_success = Some(Instant::now());
                    return v["memory_ids"]
                        .as_array()
                        .expect("memory_ids")
                        .iter()
                        .map(|i| i.as_str().unwrap().to_string())
                        .collect();
                }
                Ok(resp) if [429, 502, 503, 504].contains(&resp.status().as_u16()) => {
                    self.retries.unavailable += 1;
                }
                Ok(resp) => {
                    let status = resp.status();
                    panic!(
                        "store {conversation}: {status}: {}",
                        resp.text().unwrap_or_default()
                    )
                }
                Err(_) => self.retries.transport += 1,
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "store {conversation}: the gateway did not accept within 180 s"
            );
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}

/// One reading of a group's partitions.
#[derive(Clone)]
pub struct Sample {
    pub at: Instant,
    pub partitions: Vec<PartitionOffsets>,
}

impl Sample {
    pub fn lag(&self) -> i64 {
        self.partitions.iter().map(PartitionOffsets::lag).sum()
    }
}

/// Reads every stage group's committed offsets and high watermarks from the broker every 250 ms
/// (readings fail while the broker is down; those are skipped).
pub struct LagProbe {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<HashMap<String, Vec<Sample>>>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl LagProbe {
    pub fn start(bus: Arc<KafkaBus>, groups: Vec<(String, &'static str)>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples: Arc<Mutex<HashMap<String, Vec<Sample>>>> = Default::default();
        let handle = std::thread::spawn({
            let (stop, samples) = (stop.clone(), samples.clone());
            move || {
                let readers: Vec<(String, &str, GroupOffsets)> = groups
                    .into_iter()
                    .map(|(g, t)| {
                        let r = bus.group_offsets(&g).expect("offset reader");
                        (g, t, r)
                    })
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    for (group, topic, reader) in &readers {
                        if let Ok(p) = reader.read(topic, Duration::from_secs(2)) {
                            if !p.is_empty() {
                                samples
                                    .lock()
                                    .unwrap()
                                    .entry(group.clone())
                                    .or_default()
                                    .push(Sample {
                                        at: Instant::now(),
                                        partitions: p,
                                    });
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        });
        LagProbe {
            stop,
            samples,
            handle: Some(handle),
        }
    }

    pub fn latest(&self, group: &str) -> Option<Sample> {
        self.samples.lock().unwrap().get(group)?.last().cloned()
    }

    /// Every group read after `after` with lag 0 on every partition.
    pub fn drained_since(&self, groups: &[String], after: Instant) -> bool {
        groups
            .iter()
            .all(|g| self.latest(g).is_some_and(|s| s.at > after && s.lag() == 0))
    }

    pub fn max_lag(&self, group: &str) -> i64 {
        self.samples
            .lock()
            .unwrap()
            .get(group)
            .map(|v| v.iter().map(Sample::lag).max().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Time from `fault` until every partition of `group` is consumed again: each one has
    /// either committed past where it stood at the fault or has nothing to consume, at every
    /// reading for 2 s (so a partition of a dead member that happens to be idle for a moment
    /// does not count as recovered). None if that never happened.
    pub fn recovery(&self, group: &str, fault: Instant) -> Option<Duration> {
        let samples = self.samples.lock().unwrap();
        let v = samples.get(group)?;
        let base = v.iter().rev().find(|s| s.at <= fault)?;
        let at_fault: HashMap<i32, i64> = base
            .partitions
            .iter()
            .map(|p| (p.partition, p.committed))
            .collect();
        let ok = |s: &Sample| {
            s.partitions.iter().all(|p| {
                p.lag() == 0 || p.committed > at_fault.get(&p.partition).copied().unwrap_or(0)
            })
        };
        let after: Vec<&Sample> = v.iter().filter(|s| s.at > fault).collect();
        for (i, s) in after.iter().enumerate() {
            let window_end = s.at + Duration::from_secs(2);
            let window: Vec<&&Sample> = after[i..]
                .iter()
                .take_while(|x| x.at <= window_end)
                .collect();
            let spans = window
                .last()
                .is_some_and(|l| l.at + Duration::from_millis(600) >= window_end);
            if spans && window.iter().all(|x| ok(x)) {
                return Some(s.at - fault);
            }
        }
        None
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for LagProbe {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every message in the dead-letter topic (read from the start by a fresh group).
pub fn dead_letters(bus: &KafkaBus, rt: &tokio::runtime::Runtime) -> Vec<Delivery> {
    rt.block_on(async {
        let mut sub = bus
            .subscribe(topics::DLQ, &format!("e2e-dlq-reader-{}", uuid_like()))
            .await
            .unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        // Until something came and then nothing more for a few polls (the group must first
        // be assigned the partitions, which takes a rebalance).
        let mut quiet = 0;
        while Instant::now() < deadline && (got.is_empty() || quiet < 3) {
            let batch = sub.poll(100, Duration::from_secs(2)).await.unwrap();
            if batch.is_empty() {
                quiet += 1;
            } else {
                quiet = 0;
            }
            got.extend(batch);
        }
        sub.close().await;
        got
    })
}

fn uuid_like() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Produces a message no stage can decode straight onto the raw topic, as a misbehaving producer
/// would write it.
pub fn plant_poison(bus: &KafkaBus, rt: &tokio::runtime::Runtime, tenant: &str) {
    rt.block_on(bus.publish(vec![recollect_bus::Message::from_bytes(
        topics::RAW,
        format!("{tenant}/poison"),
        b"{\"schema_version\": 2, \"body\": {not json".to_vec(),
        vec![("trace_id".into(), "poison-trace".into())],
    )]))
    .unwrap();
}

pub fn secs(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.1} s", d.as_secs_f64()))
        .unwrap_or_else(|| "not recovered".into())
}

/// Waits until every turn is stored (`stored()` reaches `expected`) and a broker reading taken
/// after that shows each of `groups` committed to the end of its topic (the last stage's input
/// is produced after the store, so the order matters). Then keeps the probe reading 3 s more,
/// so a recovery that completed just before the drain spans the 2 s window
/// [`LagProbe::recovery`] asks for, and stops it. Returns when the drain was seen; `Err` with
/// the last count if `patience` runs out first. (Members' own lag gauges cannot say "drained": a partition no member holds
/// reports no lag at all.)
pub fn wait_drained(
    probe: &mut LagProbe,
    groups: &[String],
    expected: usize,
    patience: Duration,
    mut stored: impl FnMut() -> usize,
) -> Result<Instant, usize> {
    let deadline = Instant::now() + patience;
    let mut all_stored: Option<Instant> = None;
    loop {
        let n = stored();
        if n >= expected {
            let at = *all_stored.get_or_insert_with(Instant::now);
            if probe.drained_since(groups, at) {
                break;
            }
        }
        if Instant::now() >= deadline {
            return Err(n);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let drained = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    probe.stop();
    Ok(drained)
}

/// Distinct (conversation, turn id) pairs carried by every message of `topic`, read from the
/// start by a fresh group: shows at which stage turns went missing when a drain never ends.
pub fn topic_census(
    bus: &KafkaBus,
    rt: &tokio::runtime::Runtime,
    topic: &str,
) -> (usize, std::collections::HashSet<(String, String)>) {
    fn find<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
        match v {
            Value::Object(m) => m
                .get(key)
                .and_then(Value::as_str)
                .or_else(|| m.values().find_map(|x| find(x, key))),
            Value::Array(a) => a.iter().find_map(|x| find(x, key)),
            _ => None,
        }
    }
    rt.block_on(async {
        let mut sub = bus
            .subscribe(topic, &format!("e2e-census-{}", uuid_like()))
            .await
            .unwrap();
        let (mut messages, mut ids) = (0, std::collections::HashSet::new());
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut quiet = 0;
        while Instant::now() < deadline && (messages == 0 || quiet < 3) {
            let batch = sub.poll(1000, Duration::from_secs(2)).await.unwrap();
            quiet = if batch.is_empty() { quiet + 1 } else { 0 };
            for d in batch {
                messages += 1;
                if let Ok(v) = serde_json::from_slice::<Value>(&d.message.payload()) {
                    if let (Some(c), Some(t)) = (find(&v, "conversation_id"), find(&v, "turn_id")) {
                        ids.insert((c.to_string(), t.to_string()));
                    }
                }
            }
        }
        sub.close().await;
        (messages, ids)
    })
}

/// Where every stored turn of the test's conversations stands: turn `tNNN` belongs at position
/// NNN, once.
#[derive(Default)]
pub struct Placement {
    rows: usize,
    distinct: usize,
    misplaced: Vec<String>,
}

impl Placement {
    /// Adds one conversation's stored turns as (turn id, position) pairs.
    pub fn add(&mut self, conversation: &str, turns: &[(String, u64)]) {
        self.rows += turns.len();
        self.distinct += turns
            .iter()
            .map(|(id, _)| id)
            .collect::<std::collections::HashSet<_>>()
            .len();
        for (id, position) in turns {
            if id[1..].parse::<u64>().ok() != Some(*position) {
                self.misplaced
                    .push(format!("{conversation}/{id}@{position}"));
            }
        }
    }

    /// (lost, duplicated) against the `expected` number of turns.
    pub fn lost_and_duplicated(&self, expected: usize) -> (usize, usize) {
        (
            expected - self.distinct.min(expected),
            self.rows - self.distinct,
        )
    }

    /// Exactly once, in order; returns (lost, duplicated), both 0.
    pub fn assert_exactly_once(&self, expected: usize) -> (usize, usize) {
        let (lost, duplicated) = self.lost_and_duplicated(expected);
        assert_eq!(lost, 0, "lost turns");
        assert_eq!(duplicated, 0, "duplicated turns");
        assert!(
            self.misplaced.is_empty(),
            "{} turns not at their index, e.g. {:?}",
            self.misplaced.len(),
            &self.misplaced[..self.misplaced.len().min(10)]
        );
        (lost, duplicated)
    }
}

/// Recall through the query service finds turn t042 of each of `conversations` by its content
/// (`turn_text` puts `lighthouse{c}x{t}` in every turn).
pub fn assert_recall_finds_t042(
    query: &Server,
    key: &str,
    conversations: impl Iterator<Item = usize>,
) {
    for c in conversations {
        let (status, body) = query.post(
            "/v1/recall",
            Some(key),
            &json!({"query": format!("when did I visit lighthouse{c}x42?"), "conversation_ids": [format!("conv-{c:02}")], "k": 10}),
        );
        assert_eq!(status, 200, "{body}");
        let hits: Vec<&str> = body["memories"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["turn"]["turn_id"].as_str().or(m["turn_id"].as_str()))
            .collect();
        assert!(
            hits.contains(&"t042"),
            "conv-{c:02}: recall missed t042: {hits:?}"
        );
    }
}
