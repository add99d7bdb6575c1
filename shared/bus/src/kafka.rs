//! The `Bus` on Kafka (rdkafka). Delivery rules:
//! - the producer is idempotent with `acks=all`, and `publish` returns only once every message is
//!   acknowledged, so a stage commits its input only after its outputs are durable;
//! - offsets are stored by `commit` (after the downstream effect) and committed by librdkafka's
//!   auto-commit, synchronously on partition revocation and on close, so a rebalance or a
//!   shutdown never commits work that was not done, and redelivers at most the batch in hand;
//! - consumer lag per topic and partition comes from librdkafka's statistics, without extra
//!   broker round trips.

use std::collections::HashMap;
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
use recollect_telemetry as metrics;

use crate::{Bus, BusError, Delivery, Message, Subscription};

/// How the bus reaches the brokers.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub brokers: String,
    /// Names this process in broker logs and metrics.
    pub client_id: String,
    pub partitions: i32,
    pub replication: i32,
}

pub struct KafkaBus {
    settings: KafkaSettings,
    producer: FutureProducer,
}

fn unavailable(e: impl std::fmt::Display) -> BusError {
    BusError::Unavailable(e.to_string())
}

impl KafkaBus {
    pub fn connect(settings: KafkaSettings) -> Result<Arc<Self>, BusError> {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &settings.brokers)
            .set("client.id", &settings.client_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", "30000")
            .create()
            .map_err(unavailable)?;
        Ok(Arc::new(Self { settings, producer }))
    }

    /// Whether the brokers answer (readiness).
    pub async fn ping(&self) -> bool {
        let p = self.producer.clone();
        tokio::task::spawn_blocking(move || {
            p.client()
                .fetch_metadata(None, Duration::from_secs(3))
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }
}

#[async_trait]
impl Bus for KafkaBus {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    async fn ensure_topics(&self, names: &[&str]) -> Result<(), BusError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.settings.brokers)
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
        let sends = messages.iter().map(|m| {
            let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
            for (k, v) in &m.headers {
                headers = headers.insert(Header {
                    key: k,
                    value: Some(v.as_bytes()),
                });
            }
            let record = FutureRecord::to(&m.topic)
                .key(&m.key)
                .payload(&m.payload)
                .headers(headers);
            self.producer.send(record, Duration::from_secs(30))
        });
        for r in futures::future::join_all(sends).await {
            r.map_err(|(e, _)| unavailable(e))?;
        }
        Ok(())
    }

    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError> {
        let consumer: StreamConsumer<GroupContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.settings.brokers)
            .set("client.id", &self.settings.client_id)
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            // Offsets are stored by `commit`, after the downstream effect, never on receipt.
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("statistics.interval.ms", "2000")
            .create_with_context(GroupContext)
            .map_err(unavailable)?;
        consumer.subscribe(&[topic]).map_err(unavailable)?;
        Ok(Box::new(KafkaSubscription {
            consumer: Arc::new(consumer),
            topic: topic.to_string(),
            unassigned_since: None,
        }))
    }
}

/// Commits stored offsets before partitions move to another member, and publishes lag.
struct GroupContext;

impl ClientContext for GroupContext {
    fn stats(&self, stats: Statistics) {
        for (topic, t) in &stats.topics {
            for (partition, p) in &t.partitions {
                // -1 is librdkafka's "internal" partition and unassigned partitions report -1 lag.
                if *partition < 0 || p.consumer_lag < 0 {
                    continue;
                }
                metrics::CONSUMER_LAG
                    .with_label_values(&[topic, &partition.to_string()])
                    .set(p.consumer_lag);
            }
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
    /// Since when this member has held no partition (see `rejoin_if_starved`).
    unassigned_since: Option<std::time::Instant>,
}

/// A member left without partitions this long rejoins the group.
const STARVED_REJOIN: Duration = Duration::from_secs(15);

impl KafkaSubscription {
    /// Seen with tansu: after a member is killed, the replacement's rejoin can end in a formed
    /// group with an empty assignment, and nothing triggers another rebalance. A member that
    /// holds no partition for a while rejoins. (With more members than partitions, an idle
    /// member rejoins every `STARVED_REJOIN`, which costs one rebalance and is harmless.)
    fn rejoin_if_starved(&mut self) -> Result<(), BusError> {
        let assigned = self
            .consumer
            .assignment()
            .map(|a| a.count() > 0)
            .unwrap_or(false);
        if assigned {
            self.unassigned_since = None;
            return Ok(());
        }
        let since = *self
            .unassigned_since
            .get_or_insert_with(std::time::Instant::now);
        if since.elapsed() >= STARVED_REJOIN {
            tracing::warn!(topic = %self.topic, "no partition assigned for 15 s: rejoining the group");
            self.consumer.unsubscribe();
            self.consumer
                .subscribe(&[&self.topic])
                .map_err(unavailable)?;
            self.unassigned_since = None;
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
        message: Message {
            topic: m.topic().to_string(),
            key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
            payload: m.payload().unwrap_or_default().to_vec(),
            headers,
        },
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
                self.rejoin_if_starved()?;
                return Ok(out);
            }
            Ok(Err(e)) => return Err(unavailable(e)),
            Ok(Ok(m)) => out.push(delivery(&m)),
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
