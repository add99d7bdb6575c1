//! The `Bus` on Kafka (rdkafka). Delivery rules:
//! - the producer is idempotent with `acks=all`, and `publish` returns only once every message is
//!   acknowledged, so a stage commits its input only after its outputs are durable;
//! - offsets are stored by `commit` (after the downstream effect) and committed by librdkafka's
//!   auto-commit, synchronously on partition revocation and on close, so a rebalance or a
//!   shutdown never commits work that was not done, and redelivers at most the batch in hand;
//! - consumer lag per topic and partition comes from librdkafka's statistics, without extra
//!   broker round trips.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message as _, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientContext, Offset, Statistics, TopicPartitionList};
use recollect_telemetry::events::{ConsumerLagObserved, ConsumerLagReleased, InternalEvent};

use crate::{Bus, BusError, Delivery, Message, Subscription};

/// How the bus reaches the brokers.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub brokers: String,
    /// Names this process in broker logs and metrics.
    pub client_id: String,
    pub partitions: i32,
    pub replication: i32,
    /// TLS and SASL for managed brokers; the default is plaintext.
    pub security: KafkaSecurity,
}

/// librdkafka's security properties, set on every client (producer, consumers, admin). Values
/// are checked by the configuration (`bus.*`) before they get here.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaSecurity {
    /// `security.protocol`: plaintext, ssl, sasl_plaintext or sasl_ssl; empty means plaintext.
    pub protocol: String,
    /// `sasl.mechanism` (sasl_* protocols): PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    pub sasl_mechanism: String,
    pub sasl_username: String,
    /// Secret: redacted from `Debug`.
    pub sasl_password: String,
    /// `ssl.ca.location` (ssl, sasl_ssl): a PEM file; empty uses the system's CA store.
    pub ssl_ca_file: String,
}

impl std::fmt::Debug for KafkaSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSecurity")
            .field("protocol", &self.protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field(
                "sasl_password",
                &if self.sasl_password.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("ssl_ca_file", &self.ssl_ca_file)
            .finish()
    }
}

impl KafkaSecurity {
    /// The librdkafka properties, in the order they are set.
    pub fn client_entries(&self) -> Vec<(&'static str, String)> {
        let protocol = if self.protocol.is_empty() {
            "plaintext"
        } else {
            self.protocol.as_str()
        };
        let mut out = vec![("security.protocol", protocol.to_string())];
        if protocol.starts_with("sasl_") {
            out.push(("sasl.mechanism", self.sasl_mechanism.clone()));
            out.push(("sasl.username", self.sasl_username.clone()));
            out.push(("sasl.password", self.sasl_password.clone()));
        }
        if matches!(protocol, "ssl" | "sasl_ssl") {
            if !self.ssl_ca_file.is_empty() {
                out.push(("ssl.ca.location", self.ssl_ca_file.clone()));
            }
            // librdkafka's default since 1.9, set so no build or override can turn off the
            // broker host name check.
            out.push(("ssl.endpoint.identification.algorithm", "https".into()));
        }
        out
    }
}

pub struct KafkaBus {
    settings: KafkaSettings,
    /// Replaced when librdkafka reports a fatal error (see `publish`).
    producer: std::sync::RwLock<FutureProducer>,
}

fn unavailable(e: impl std::fmt::Display) -> BusError {
    BusError::Unavailable(e.to_string())
}

/// A client configuration reaching the brokers: bootstrap servers and security.
fn client_config(settings: &KafkaSettings) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &settings.brokers);
    for (k, v) in settings.security.client_entries() {
        c.set(k, v);
    }
    c
}

impl KafkaBus {
    pub fn connect(settings: KafkaSettings) -> Result<Arc<Self>, BusError> {
        let producer = Self::new_producer(&settings)?;
        Ok(Arc::new(Self {
            settings,
            producer: std::sync::RwLock::new(producer),
        }))
    }

    fn new_producer(settings: &KafkaSettings) -> Result<FutureProducer, BusError> {
        client_config(settings)
            .set("client.id", &settings.client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000")
            .create()
            .map_err(unavailable)
    }

    fn producer(&self) -> FutureProducer {
        self.producer
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// An idempotent producer that hits a fatal error (e.g. the broker lost its producer state
    /// in a restart and answers out-of-order sequence) fails every later send: replace it, so
    /// the caller's retry goes through a fresh producer id instead of failing forever.
    fn replace_if_fatal(&self, failed: &FutureProducer) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = self.producer.write().unwrap_or_else(|e| e.into_inner());
        // Another caller may have replaced it already.
        if current.client().fatal_error().is_none() {
            return;
        }
        match Self::new_producer(&self.settings) {
            Ok(p) => {
                tracing::warn!(%code, reason, "producer hit a fatal error: replaced it");
                *current = p;
            }
            Err(e) => tracing::warn!(error = %e, "producer hit a fatal error; replacing it failed"),
        }
    }

    /// Whether the brokers answer (readiness).
    pub async fn ping(&self) -> bool {
        let p = self.producer();
        tokio::task::spawn_blocking(move || {
            p.client()
                .fetch_metadata(None, Duration::from_secs(3))
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }
}

/// One partition of a topic as a consumer group stands on the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub partition: i32,
    /// The group's committed offset (0 before its first commit).
    pub committed: i64,
    /// The high watermark: the offset the next message will get.
    pub high: i64,
}

impl PartitionOffsets {
    pub fn lag(&self) -> i64 {
        (self.high - self.committed).max(0)
    }
}

/// Reads a group's committed offsets from the brokers without joining the group, as a lag
/// exporter does: unlike the members' own statistics it does not depend on who holds a
/// partition, nor go stale when a member dies. Its calls block.
pub struct GroupOffsets {
    consumer: BaseConsumer,
}

impl GroupOffsets {
    /// Committed offset and high watermark of every partition of `topic`, by partition.
    pub fn read(&self, topic: &str, timeout: Duration) -> Result<Vec<PartitionOffsets>, BusError> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(unavailable)?;
        let mut partitions: Vec<i32> = md
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        partitions.sort_unstable();
        let mut tpl = TopicPartitionList::with_capacity(partitions.len());
        for p in &partitions {
            tpl.add_partition(topic, *p);
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, timeout)
            .map_err(unavailable)?;
        partitions
            .into_iter()
            .map(|p| {
                let committed = match committed.find_partition(topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => 0,
                };
                let (_, high) = self
                    .consumer
                    .fetch_watermarks(topic, p, timeout)
                    .map_err(unavailable)?;
                Ok(PartitionOffsets {
                    partition: p,
                    committed,
                    high,
                })
            })
            .collect()
    }
}

impl KafkaBus {
    /// A reader of `group`'s committed offsets (see [`GroupOffsets`]).
    pub fn group_offsets(&self, group: &str) -> Result<GroupOffsets, BusError> {
        let consumer: BaseConsumer = client_config(&self.settings)
            .set("client.id", &self.settings.client_id)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(unavailable)?;
        Ok(GroupOffsets { consumer })
    }
}

#[async_trait]
impl Bus for KafkaBus {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    async fn ensure_topics(&self, names: &[&str]) -> Result<(), BusError> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.settings)
            .create()
            .map_err(unavailable)?;
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|n| {
                NewTopic::new(
                    n,
                    self.settings.partitions,
                    TopicReplication::Fixed(self.settings.replication),
                )
            })
            .collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics(&topics, &opts)
            .await
            .map_err(unavailable)?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(BusError::Unavailable(format!(
                        "creating topic {name}: {code}"
                    )))
                }
            }
        }
        Ok(())
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<(), BusError> {
        let producer = self.producer();
        // Serialised here, once: the records borrow their payloads until every send settles.
        let payloads: Vec<_> = messages.iter().map(Message::payload).collect();
        let sends = messages.iter().zip(&payloads).map(|(m, payload)| {
            let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
            for (k, v) in &m.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let record = FutureRecord::to(&m.topic)
                .key(&m.key)
                .payload(payload.as_ref())
                .headers(headers);
            producer.send(record, Duration::from_secs(30))
        });
        let mut failed = None;
        for r in futures::future::join_all(sends).await {
            if let Err((e, _)) = r {
                failed.get_or_insert(e);
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => {
                self.replace_if_fatal(&producer);
                Err(unavailable(e))
            }
        }
    }

    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError> {
        Ok(Box::new(KafkaSubscription {
            consumer: Arc::new(new_consumer(&self.settings, topic, group)?),
            topic: topic.to_string(),
            group: group.to_string(),
            settings: self.settings.clone(),
            idle_since: None,
        }))
    }
}

/// A group member subscribed to `topic`.
fn new_consumer(
    settings: &KafkaSettings,
    topic: &str,
    group: &str,
) -> Result<StreamConsumer<GroupContext>, BusError> {
    let consumer: StreamConsumer<GroupContext> = client_config(settings)
        .set("client.id", &settings.client_id)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        // Offsets are stored by `commit`, after the downstream effect, never on receipt.
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("statistics.interval.ms", "2000")
        .create_with_context(GroupContext::default())
        .map_err(unavailable)?;
    consumer.subscribe(&[topic]).map_err(unavailable)?;
    Ok(consumer)
}

/// Commits stored offsets before partitions move to another member, and publishes lag.
#[derive(Default)]
struct GroupContext {
    /// The (topic, partition) lag gauges this consumer set in its last statistics.
    reported: std::sync::Mutex<HashSet<(String, i32)>>,
    /// Messages this member's partitions hold beyond what it has been handed (high watermark
    /// minus the next offset to deliver), summed, in its last statistics: what a healthy
    /// fetch would be delivering. (Commit lag is no measure of that: it stays up while the
    /// last batch is being handled.)
    unread: std::sync::atomic::AtomicI64,
}

impl ClientContext for GroupContext {
    fn stats(&self, stats: Statistics) {
        let mut now = HashSet::new();
        let mut unread = 0;
        for (topic, t) in &stats.topics {
            for (partition, p) in &t.partitions {
                // -1 is librdkafka's "internal" partition, unassigned partitions report -1 lag,
                // and a partition revoked in a rebalance can linger in the statistics with its
                // last lag: only the partitions this member holds count.
                if *partition < 0 || p.consumer_lag < 0 || !p.desired {
                    continue;
                }
                ConsumerLagObserved {
                    topic,
                    partition: *partition,
                    lag: p.consumer_lag,
                }
                .emit();
                unread += if p.app_offset >= 0 && p.hi_offset >= 0 {
                    (p.hi_offset - p.app_offset).max(0)
                } else {
                    p.consumer_lag
                };
                now.insert((topic.clone(), *partition));
            }
        }
        // A partition that moved to another member after a rebalance is reported by that member
        // now: keeping our last value would show a lag that never drains.
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in reported.difference(&now) {
            ConsumerLagReleased {
                topic,
                partition: *partition,
            }
            .emit();
        }
        *reported = now;
        self.unread
            .store(unread, std::sync::atomic::Ordering::Relaxed);
    }
}

impl GroupContext {
    /// Releases every lag gauge this consumer set: it is being replaced, and the partitions it
    /// held may go to another member, which reports them from its own process.
    fn release_all(&self) {
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for (topic, partition) in reported.drain() {
            ConsumerLagReleased {
                topic: &topic,
                partition,
            }
            .emit();
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            // The batch in hand has been committed (stages poll only between batches): make
            // the stored offsets durable before another member takes these partitions.
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) => tracing::info!(
                    partitions = tpl.count(),
                    "partitions revoked, offsets committed"
                ),
                Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "commit on revoke failed; the batch in hand will be redelivered")
                }
            }
        }
    }
}

struct KafkaSubscription {
    consumer: Arc<StreamConsumer<GroupContext>>,
    topic: String,
    group: String,
    settings: KafkaSettings,
    /// Since when this member has received nothing while its partitions lag (see
    /// `reconnect_if_stalled`).
    idle_since: Option<std::time::Instant>,
}

/// A member that receives nothing this long while its partitions have messages to read is
/// replaced by a new consumer.
const STALLED_RECONNECT: Duration = Duration::from_secs(20);

impl KafkaSubscription {
    /// Seen with tansu restarted under running consumers, and after rebalances: a member keeps
    /// partitions that have messages to read, but its fetches never return one again. A member
    /// idle that long while its own partitions lag is replaced by a fresh consumer, which
    /// resumes from the committed offsets (at-least-once; every effect downstream is
    /// idempotent). With a healthy broker it never fires: an idle member has no lag.
    fn reconnect_if_stalled(&mut self) -> Result<(), BusError> {
        let lag = self
            .consumer
            .context()
            .unread
            .load(std::sync::atomic::Ordering::Relaxed);
        if lag <= 0 {
            self.idle_since = None;
            return Ok(());
        }
        let since = *self.idle_since.get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= STALLED_RECONNECT {
            tracing::warn!(topic = %self.topic, lag, "no message for 20 s while partitions lag: reconnecting the consumer");
            let fresh = new_consumer(&self.settings, &self.topic, &self.group)?;
            let stalled = std::mem::replace(&mut self.consumer, Arc::new(fresh));
            stalled.unsubscribe();
            // Its gauges would otherwise stay at the lag it last saw, for partitions it no
            // longer holds (seen in the kill -9 test: an extractor reporting 75 after the drain).
            stalled.context().release_all();
            self.idle_since = None;
        }
        Ok(())
    }
}

fn delivery(m: &rdkafka::message::BorrowedMessage<'_>) -> Delivery {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Delivery {
        message: Message::from_bytes(
            m.topic(),
            String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ),
        partition: m.partition(),
        offset: m.offset(),
        timestamp_ms: m.timestamp().to_millis(),
    }
}

#[async_trait]
impl Subscription for KafkaSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        let mut out = Vec::new();
        match tokio::time::timeout(wait, self.consumer.recv()).await {
            Err(_) => {
                self.reconnect_if_stalled()?;
                return Ok(out);
            }
            Ok(Err(e)) => return Err(unavailable(e)),
            Ok(Ok(m)) => {
                self.idle_since = None;
                out.push(delivery(&m));
            }
        }
        // Take what is already fetched without waiting again.
        while out.len() < max {
            match self.consumer.recv().now_or_never() {
                Some(Ok(m)) => out.push(delivery(&m)),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "consumer error while draining the fetch queue");
                    break;
                }
                None => break,
            }
        }
        Ok(out)
    }

    async fn commit(&mut self, done: &[Delivery]) -> Result<(), BusError> {
        let mut next: HashMap<(&str, i32), i64> = HashMap::new();
        for d in done {
            let e = next
                .entry((d.message.topic.as_str(), d.partition))
                .or_insert(0);
            *e = (*e).max(d.offset + 1);
        }
        let mut tpl = TopicPartitionList::with_capacity(next.len());
        for ((topic, partition), offset) in next {
            tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
                .map_err(unavailable)?;
        }
        if let Err(e) = self.consumer.store_offsets(&tpl) {
            // The partition moved to another member during the batch: it will redeliver, and
            // every effect is idempotent.
            tracing::warn!(error = %e, "could not store offsets (partition revoked?)");
        }
        Ok(())
    }

    async fn close(&mut self) {
        let c = self.consumer.clone();
        let r = tokio::task::spawn_blocking(move || {
            let r = c.commit_consumer_state(CommitMode::Sync);
            c.unsubscribe();
            r
        })
        .await;
        match r {
            Ok(Ok(())) | Ok(Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset))) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "final commit failed"),
            Err(e) => tracing::warn!(error = %e, "final commit panicked"),
        }
    }
}

#[cfg(test)]
mod security_tests {
    use super::*;

    fn settings(security: KafkaSecurity) -> KafkaSettings {
        KafkaSettings {
            brokers: "127.0.0.1:1".into(),
            client_id: "security-test".into(),
            partitions: 1,
            replication: 1,
            security,
        }
    }

    fn sasl_ssl() -> KafkaSecurity {
        KafkaSecurity {
            protocol: "sasl_ssl".into(),
            sasl_mechanism: "SCRAM-SHA-512".into(),
            sasl_username: "recollect".into(),
            sasl_password: "s3cret".into(),
            ssl_ca_file: "/etc/recollect/ca/ca.crt".into(),
        }
    }

    #[test]
    fn plaintext_sets_only_the_protocol() {
        let e = KafkaSecurity::default().client_entries();
        assert_eq!(e, vec![("security.protocol", "plaintext".to_string())]);
    }

    #[test]
    fn sasl_ssl_maps_every_property() {
        let e: HashMap<_, _> = sasl_ssl().client_entries().into_iter().collect();
        assert_eq!(e["security.protocol"], "sasl_ssl");
        assert_eq!(e["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(e["sasl.username"], "recollect");
        assert_eq!(e["sasl.password"], "s3cret");
        assert_eq!(e["ssl.ca.location"], "/etc/recollect/ca/ca.crt");
        assert_eq!(e["ssl.endpoint.identification.algorithm"], "https");
        assert_eq!(e.len(), 6);
    }

    #[test]
    fn sasl_plaintext_sends_no_tls_properties_and_ssl_no_credentials() {
        let mut s = sasl_ssl();
        s.protocol = "sasl_plaintext".into();
        s.ssl_ca_file.clear();
        let keys: Vec<_> = s.client_entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec![
                "security.protocol",
                "sasl.mechanism",
                "sasl.username",
                "sasl.password"
            ]
        );
        let ssl = KafkaSecurity {
            protocol: "ssl".into(),
            ..Default::default()
        };
        let keys: Vec<_> = ssl.client_entries().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            vec!["security.protocol", "ssl.endpoint.identification.algorithm"]
        );
    }

    #[test]
    fn the_password_never_reaches_debug_output() {
        let out = format!("{:?}", settings(sasl_ssl()));
        assert!(!out.contains("s3cret"), "{out}");
        assert!(
            out.contains("<redacted>") && out.contains("recollect"),
            "{out}"
        );
    }

    /// librdkafka refuses properties its build cannot honour when a client is created (no
    /// broker needed): SASL_SSL and SCRAM need its OpenSSL support.
    #[test]
    fn librdkafka_accepts_every_supported_combination() {
        // A CA file must exist and parse: use the system bundle when there is one.
        let ca = [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/cert.pem",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
        for protocol in ["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"] {
            for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
                let mut s = sasl_ssl();
                s.protocol = protocol.into();
                s.sasl_mechanism = mechanism.into();
                s.ssl_ca_file = ca.unwrap_or_default().into();
                let created: Result<BaseConsumer, _> = client_config(&settings(s))
                    .set("group.id", "security-test")
                    .create();
                if let Err(e) = created {
                    panic!("{protocol} with {mechanism}: {e}");
                }
            }
        }
    }
}
