//! The `Bus` seam: topics between the workers. In-process queues for the single binary, Kafka for
//! separate services. Workers are written once as a [`Stage`] and driven by [`run_stage`], which
//! owns the delivery rules: publish outputs, then commit; retry transient failures a bounded
//! number of times; send what still fails to the dead-letter topic and move on.

use std::any::Any;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use recollect_model::topics;
use recollect_telemetry::events::{
    ConsumerLagObserved, InternalEvent, StageBatchHandled, StageMessageDeadLettered,
    StageMessageProcessed, StageMessageRetried,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch, Mutex};

#[cfg(feature = "testsuite")]
pub mod contract;
pub mod kafka;
pub use kafka::{GroupOffsets, KafkaBus, KafkaSecurity, KafkaSettings, PartitionOffsets};

#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("bus unavailable: {0}")]
    Unavailable(String),
    #[error("topic {0} has no queue")]
    UnknownTopic(String),
    #[error("topic {0} already has a consumer in this process")]
    AlreadySubscribed(String),
    #[error("bus is closed")]
    Closed,
}

impl recollect_model::Classify for BusError {
    fn kind(&self) -> recollect_model::ErrorKind {
        recollect_model::ErrorKind::Unavailable
    }
}

/// A message to publish. `key` keeps one conversation on one partition, in order.
///
/// A message made by [`Message::json`] keeps its body as the value it was made from and
/// serialises it only when it leaves the process (a Kafka producer, a dead letter): the
/// in-process bus hands the value itself to the next stage, so embedded mode spends nothing on
/// JSON between stages, while Kafka carries the same bytes as before.
#[derive(Clone)]
pub struct Message {
    pub topic: String,
    pub key: String,
    pub headers: Vec<(String, String)>,
    payload: Payload,
}

#[derive(Clone)]
enum Payload {
    Bytes(Vec<u8>),
    Value {
        value: Arc<dyn Any + Send + Sync>,
        encode: fn(&(dyn Any + Send + Sync)) -> Vec<u8>,
    },
}

fn encode_json<T: Serialize + 'static>(v: &(dyn Any + Send + Sync)) -> Vec<u8> {
    let v = v
        .downcast_ref::<T>()
        .expect("a message's encoder is made for its body's type");
    serde_json::to_vec(v).expect("bus messages serialise")
}

impl Message {
    /// A message whose wire form is `body` as JSON.
    pub fn json<T: Serialize + Send + Sync + 'static>(
        topic: &str,
        key: String,
        body: T,
        trace_id: &str,
    ) -> Self {
        Self {
            topic: topic.to_string(),
            key,
            headers: vec![("trace_id".to_string(), trace_id.to_string())],
            payload: Payload::Value {
                value: Arc::new(body),
                encode: encode_json::<T>,
            },
        }
    }

    /// A message of bytes as they came (a consumed Kafka record, a test's hand-made payload).
    pub fn from_bytes(
        topic: &str,
        key: String,
        payload: Vec<u8>,
        headers: Vec<(String, String)>,
    ) -> Self {
        Self {
            topic: topic.to_string(),
            key,
            headers,
            payload: Payload::Bytes(payload),
        }
    }

    /// The wire form: the bytes given, or the body serialised now.
    pub fn payload(&self) -> Cow<'_, [u8]> {
        match &self.payload {
            Payload::Bytes(b) => Cow::Borrowed(b),
            Payload::Value { value, encode } => Cow::Owned(encode(value.as_ref())),
        }
    }

    /// The body as `T`: a copy of the value when the message was made from one of that type
    /// and never left the process, otherwise parsed from the JSON bytes.
    pub fn decode<T: DeserializeOwned + Clone + 'static>(&self) -> Result<T, serde_json::Error> {
        self.decode_ref::<T>().map(Cow::into_owned)
    }

    /// The body as `T`, borrowed when the message was made from a value of that type and never
    /// left the process (a stage that only reads its input copies nothing), else parsed.
    pub fn decode_ref<T: DeserializeOwned + Clone + 'static>(
        &self,
    ) -> Result<Cow<'_, T>, serde_json::Error> {
        if let Payload::Value { value, .. } = &self.payload {
            if let Some(v) = value.downcast_ref::<T>() {
                return Ok(Cow::Borrowed(v));
            }
        }
        serde_json::from_slice(&self.payload()).map(Cow::Owned)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

impl PartialEq for Message {
    fn eq(&self, other: &Self) -> bool {
        self.topic == other.topic
            && self.key == other.key
            && self.headers == other.headers
            && self.payload() == other.payload()
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("topic", &self.topic)
            .field("key", &self.key)
            .field("headers", &self.headers)
            .field("payload", &String::from_utf8_lossy(&self.payload()))
            .finish()
    }
}

/// A consumed message with its position, to be committed once its effect is durable.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message: Message,
    pub partition: i32,
    pub offset: i64,
    /// When the message was produced, ms since the epoch (Kafka's message timestamp); None
    /// when the bus does not say.
    pub timestamp_ms: Option<i64>,
}

#[async_trait]
pub trait Bus: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    /// Create the topics if missing (brokers here have no auto-creation).
    async fn ensure_topics(&self, names: &[&str]) -> Result<(), BusError>;
    /// Returns once every message is acknowledged by the bus.
    async fn publish(&self, messages: Vec<Message>) -> Result<(), BusError>;
    async fn subscribe(&self, topic: &str, group: &str) -> Result<Box<dyn Subscription>, BusError>;
}

#[async_trait]
pub trait Subscription: Send {
    /// Up to `max` deliveries, waiting at most `wait` for the first; empty on timeout.
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError>;
    /// The downstream effects of `done` are durable: their offsets may be committed.
    async fn commit(&mut self, done: &[Delivery]) -> Result<(), BusError>;
    /// Leaves the group after making committed work durable (shutdown).
    async fn close(&mut self) {}
}

/// In-process topics: bounded queues (backpressure instead of unbounded memory), one consumer
/// each. Durability in embedded mode comes from the raw-turn store, which replays unfinished
/// turns at start, so commits here have nothing to do.
pub struct InProcessBus {
    capacity: usize,
    topics: std::sync::Mutex<HashMap<String, Arc<Queue>>>,
}

struct Queue {
    tx: mpsc::Sender<Delivery>,
    rx: Mutex<Option<mpsc::Receiver<Delivery>>>,
    next_offset: std::sync::atomic::AtomicI64,
}

impl InProcessBus {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            topics: Default::default(),
        })
    }

    fn queue(&self, topic: &str) -> Arc<Queue> {
        let mut topics = self.topics.lock().expect("topic map lock");
        topics
            .entry(topic.to_string())
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(self.capacity);
                Arc::new(Queue {
                    tx,
                    rx: Mutex::new(Some(rx)),
                    next_offset: std::sync::atomic::AtomicI64::new(0),
                })
            })
            .clone()
    }

    /// Messages waiting in a topic's queue.
    pub fn depth(&self, topic: &str) -> usize {
        let q = self.queue(topic);
        q.tx.max_capacity() - q.tx.capacity()
    }
}

#[async_trait]
impl Bus for InProcessBus {
    fn kind(&self) -> &'static str {
        "in_process"
    }

    async fn ensure_topics(&self, names: &[&str]) -> Result<(), BusError> {
        for n in names {
            self.queue(n);
        }
        Ok(())
    }

    async fn publish(&self, messages: Vec<Message>) -> Result<(), BusError> {
        for m in messages {
            let q = self.queue(&m.topic);
            let offset = q
                .next_offset
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            q.tx.send(Delivery {
                message: m,
                partition: 0,
                offset,
                timestamp_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as i64),
            })
            .await
            .map_err(|_| BusError::Closed)?;
        }
        Ok(())
    }

    async fn subscribe(
        &self,
        topic: &str,
        _group: &str,
    ) -> Result<Box<dyn Subscription>, BusError> {
        let q = self.queue(topic);
        let rx =
            q.rx.lock()
                .await
                .take()
                .ok_or_else(|| BusError::AlreadySubscribed(topic.into()))?;
        Ok(Box::new(InProcessSubscription {
            topic: topic.to_string(),
            rx,
            queue: q,
        }))
    }
}

struct InProcessSubscription {
    topic: String,
    rx: mpsc::Receiver<Delivery>,
    queue: Arc<Queue>,
}

#[async_trait]
impl Subscription for InProcessSubscription {
    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        let mut out = Vec::new();
        match tokio::time::timeout(wait, self.rx.recv_many(&mut out, max)).await {
            Ok(0) => Err(BusError::Closed),
            Ok(_) | Err(_) => {
                let depth = self.queue.tx.max_capacity() - self.queue.tx.capacity();
                ConsumerLagObserved {
                    topic: &self.topic,
                    partition: 0,
                    lag: depth as i64,
                }
                .emit();
                Ok(out)
            }
        }
    }

    async fn commit(&mut self, _done: &[Delivery]) -> Result<(), BusError> {
        Ok(())
    }
}

/// Why a handler failed: transient failures are retried, permanent ones go straight to the DLQ.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StageError {
    #[error("transient: {0}")]
    Transient(String),
    #[error("permanent: {0}")]
    Permanent(String),
}

impl StageError {
    pub fn is_transient(&self) -> bool {
        matches!(self, StageError::Transient(_))
    }

    /// A dependency's error (a store's, say) by what another try can do: a dependency that is
    /// down, busy or refusing credentials may come back, so the message is retried; invalid or
    /// unreadable data, a conflict or a missing record will fail the same way every time, so
    /// it goes to the dead-letter topic at once instead of after every retry.
    pub fn classified<E: recollect_model::Classify + std::fmt::Display>(e: E) -> Self {
        use recollect_model::ErrorKind;
        match e.kind() {
            ErrorKind::Unavailable | ErrorKind::ResourceExhausted | ErrorKind::Unauthenticated => {
                StageError::Transient(e.to_string())
            }
            ErrorKind::InvalidArgument
            | ErrorKind::Conflict
            | ErrorKind::NotFound
            | ErrorKind::Internal => StageError::Permanent(e.to_string()),
        }
    }
}

/// A pipeline worker: consumes one topic, returns what to publish for each input.
#[async_trait]
pub trait Stage: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn input_topic(&self) -> &'static str;
    fn max_batch(&self) -> usize {
        64
    }
    /// One result per delivery, in order. Outputs are published before the input is committed.
    async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>>;
    /// The input is drained for now: nothing was waiting right after a batch, or a poll waited
    /// its whole time and found nothing. A stage that defers work to batch it (a flush) can do
    /// it now rather than at its next deadline.
    fn idle(&self) {}
}

/// What the dead-letter topic holds: the error and where the message came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadLetter {
    pub stage: String,
    pub error: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    /// The original payload, lossily decoded (payloads are JSON).
    pub payload: String,
}

/// Retry policy for a failing message: bounded, with backoff.
fn retry_policy() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(500))
        .with_max_times(4)
}

/// Drives a stage until `shutdown` flips to true; then finishes the batch in hand (drain) and
/// returns. The loop never holds a message back for another: a poison message is dead-lettered.
pub async fn run_stage(
    bus: Arc<dyn Bus>,
    stage: Arc<dyn Stage>,
    group: String,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), BusError> {
    let mut sub = bus.subscribe(stage.input_topic(), &group).await?;
    let name = stage.name();
    tracing::info!(stage = name, topic = stage.input_topic(), "stage started");
    // Right after a batch the input is looked at without waiting: if nothing is there, the
    // stage hears it is drained now, not after a poll's whole wait (a burst's last turns were
    // settled, and a `wait` answered, 200 ms late).
    let mut after_batch = false;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let wait = if after_batch {
            Duration::ZERO
        } else {
            Duration::from_millis(200)
        };
        let batch = tokio::select! {
            r = sub.poll(stage.max_batch(), wait) => match r {
                Ok(b) => b,
                Err(BusError::Closed) => break,
                Err(e) => {
                    tracing::warn!(stage = name, error = %e, "poll failed");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => continue,
        };
        after_batch = !batch.is_empty();
        if batch.is_empty() {
            stage.idle();
            continue;
        }
        let started = Instant::now();
        handle_batch(bus.as_ref(), sub.as_mut(), stage.as_ref(), &batch).await?;
        StageBatchHandled {
            stage: name,
            messages: batch.len(),
            elapsed: started.elapsed(),
        }
        .emit();
    }
    sub.close().await;
    tracing::info!(stage = name, "stage stopped");
    Ok(())
}

/// One batch: handle it, settle each message (retried, then published or dead-lettered),
/// publish everything, then commit.
#[tracing::instrument(
    name = "pipeline.batch",
    skip_all,
    fields(stage = stage.name(), topic = stage.input_topic(), messages = batch.len())
)]
async fn handle_batch(
    bus: &dyn Bus,
    sub: &mut dyn Subscription,
    stage: &dyn Stage,
    batch: &[Delivery],
) -> Result<(), BusError> {
    let name = stage.name();
    let results = stage.handle(batch).await;
    let mut outputs = Vec::new();
    for (d, r) in batch.iter().zip(results) {
        outputs.append(&mut settle(stage, d, r).await);
    }
    // Publish, then commit: a crash between the two redelivers, and every effect is idempotent.
    (|| async { bus.publish(outputs.clone()).await })
        .retry(retry_policy().with_max_times(30))
        .notify(|e, _| tracing::warn!(stage = name, error = %e, "publish failed, retrying"))
        .await?;
    sub.commit(batch).await
}

/// What one message of a batch publishes: its outputs once the handler succeeds (retrying a
/// transient failure alone), or its dead letter. The span carries the message's tenant and
/// conversation (its key) and the trace id the gateway gave the request.
#[tracing::instrument(
    name = "pipeline.message",
    skip_all,
    fields(
        stage = stage.name(),
        tenant = d.message.key.split_once('/').map_or("", |(t, _)| t),
        conversation = d.message.key.split_once('/').map_or("", |(_, c)| c),
        trace_id = d.message.header("trace_id").unwrap_or(""),
        partition = d.partition,
        offset = d.offset,
    )
)]
async fn settle(
    stage: &dyn Stage,
    d: &Delivery,
    first: Result<Vec<Message>, StageError>,
) -> Vec<Message> {
    let name = stage.name();
    let trace_id = d.message.header("trace_id").unwrap_or("");
    let r = match first {
        Err(e) if e.is_transient() => {
            StageMessageRetried {
                stage: name,
                error: &e,
            }
            .emit();
            let one = std::slice::from_ref(d);
            (|| async {
                stage
                    .handle(one)
                    .await
                    .pop()
                    .unwrap_or(Err(StageError::Permanent(
                        "handler returned no result".into(),
                    )))
            })
            .retry(retry_policy())
            .when(StageError::is_transient)
            .notify(|e, _| {
                StageMessageRetried {
                    stage: name,
                    error: e,
                }
                .emit()
            })
            .await
        }
        other => other,
    };
    match r {
        Ok(out) => {
            StageMessageProcessed {
                stage: name,
                trace_id,
                partition: d.partition,
                offset: d.offset,
            }
            .emit();
            out
        }
        Err(e) => {
            StageMessageDeadLettered {
                stage: name,
                trace_id,
                partition: d.partition,
                offset: d.offset,
                error: &e,
            }
            .emit();
            let dl = DeadLetter {
                stage: name.to_string(),
                error: e.to_string(),
                topic: d.message.topic.clone(),
                partition: d.partition,
                offset: d.offset,
                key: d.message.key.clone(),
                payload: String::from_utf8_lossy(&d.message.payload()).into_owned(),
            };
            vec![Message::json(
                topics::DLQ,
                d.message.key.clone(),
                dl,
                trace_id,
            )]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that never left the process is read in place; bytes (a Kafka record) and a
    /// value of another type are parsed, to the same body.
    #[test]
    fn a_value_is_borrowed_bytes_are_parsed() {
        let m = Message::json("t", "k".into(), vec![1.5f32, 2.0], "trace");
        let body = m.decode_ref::<Vec<f32>>().unwrap();
        assert!(matches!(body, Cow::Borrowed(_)));
        assert_eq!(*body, [1.5, 2.0]);
        let wire = Message::from_bytes("t", "k".into(), m.payload().into_owned(), vec![]);
        let parsed = wire.decode_ref::<Vec<f32>>().unwrap();
        assert!(matches!(parsed, Cow::Owned(_)));
        assert_eq!(parsed, body);
        let widened = m.decode_ref::<Vec<f64>>().unwrap();
        assert!(matches!(widened, Cow::Owned(_)));
        assert_eq!(*widened, [1.5, 2.0]);
        assert_eq!(m.decode::<Vec<f32>>().unwrap(), [1.5, 2.0]);
        assert!(wire.decode_ref::<String>().is_err());
    }

    struct Doubler;

    #[async_trait]
    impl Stage for Doubler {
        fn name(&self) -> &'static str {
            "doubler"
        }
        fn input_topic(&self) -> &'static str {
            "in"
        }
        async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
            batch
                .iter()
                .map(|d| {
                    let n: i64 = d
                        .message
                        .decode()
                        .map_err(|e| StageError::Permanent(e.to_string()))?;
                    Ok(vec![Message::json(
                        "out",
                        d.message.key.clone(),
                        n * 2,
                        "t",
                    )])
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn stage_publishes_in_order_and_dead_letters_poison() {
        let bus = InProcessBus::new(16);
        bus.ensure_topics(&["in", "out", topics::DLQ])
            .await
            .unwrap();
        let mut out = bus.subscribe("out", "g").await.unwrap();
        let mut dlq = bus.subscribe(topics::DLQ, "g").await.unwrap();
        let (tx, rx) = watch::channel(false);
        let h = tokio::spawn(run_stage(bus.clone(), Arc::new(Doubler), "g".into(), rx));
        let mut msgs: Vec<Message> = (0..5)
            .map(|i| Message::json("in", "k".into(), i, "t"))
            .collect();
        msgs.insert(
            2,
            Message::from_bytes("in", "k".into(), b"{oops".to_vec(), vec![]),
        );
        bus.publish(msgs).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 5 {
            for d in out.poll(10, Duration::from_secs(5)).await.unwrap() {
                got.push(d.message.decode::<i64>().unwrap());
            }
        }
        assert_eq!(got, vec![0, 2, 4, 6, 8]);
        let dead = dlq.poll(10, Duration::from_secs(5)).await.unwrap();
        assert_eq!(dead.len(), 1);
        let dl: DeadLetter = serde_json::from_slice(&dead[0].message.payload()).unwrap();
        assert_eq!(dl.payload, "{oops");
        assert_eq!(dl.stage, "doubler");
        tx.send(true).unwrap();
        h.await.unwrap().unwrap();
    }

    /// Counts its batches and notes, at each `idle`, the clock and how many it had handled.
    #[derive(Default)]
    struct Idling {
        handled: std::sync::Mutex<Vec<tokio::time::Instant>>,
        idles: std::sync::Mutex<Vec<(tokio::time::Instant, usize)>>,
    }

    #[async_trait]
    impl Stage for Idling {
        fn name(&self) -> &'static str {
            "idling"
        }
        fn input_topic(&self) -> &'static str {
            "in"
        }
        fn idle(&self) {
            let handled = self.handled.lock().unwrap().len();
            self.idles
                .lock()
                .unwrap()
                .push((tokio::time::Instant::now(), handled));
        }
        async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
            self.handled
                .lock()
                .unwrap()
                .push(tokio::time::Instant::now());
            batch.iter().map(|_| Ok(Vec::new())).collect()
        }
    }

    /// A stage hears its input is drained right after the batch that drained it, not a poll's
    /// whole wait later (the embedded writer settles a burst's last turns, and answers a
    /// `wait`, on it). The clock is tokio's paused one, so "right after" is exact.
    #[tokio::test(start_paused = true)]
    async fn a_stage_hears_it_is_drained_right_after_its_last_batch() {
        let bus = InProcessBus::new(16);
        bus.ensure_topics(&["in"]).await.unwrap();
        let stage = Arc::new(Idling::default());
        let (tx, rx) = watch::channel(false);
        let h = tokio::spawn(run_stage(bus.clone(), stage.clone(), "g".into(), rx));
        // Idle before anything arrives: a whole poll's wait.
        tokio::time::sleep(Duration::from_millis(250)).await;
        let msgs = (0..3)
            .map(|i| Message::json("in", "k".into(), i, "t"))
            .collect();
        bus.publish(msgs).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let handled = stage.handled.lock().unwrap().clone();
        assert_eq!(handled.len(), 1, "the three messages in one batch");
        let after: Vec<_> = stage
            .idles
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, n)| *n == 1)
            .map(|(at, _)| *at)
            .collect();
        assert_eq!(after.len(), 1, "drained once since the batch, 50 ms later");
        assert_eq!(
            after[0], handled[0],
            "no time passed between the batch and `idle`"
        );
        tx.send(true).unwrap();
        h.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn in_process_bus_passes_the_contract() {
        contract::bus_contract(InProcessBus::new(64), "contract").await;
    }

    /// Fails every message with an error of the given kind and counts the tries.
    struct Failing(recollect_model::ErrorKind, std::sync::atomic::AtomicUsize);

    #[derive(Debug)]
    struct KindError(recollect_model::ErrorKind);
    impl std::fmt::Display for KindError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed with {}", self.0.code())
        }
    }
    impl recollect_model::Classify for KindError {
        fn kind(&self) -> recollect_model::ErrorKind {
            self.0
        }
    }

    #[async_trait]
    impl Stage for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn input_topic(&self) -> &'static str {
            "in"
        }
        async fn handle(&self, batch: &[Delivery]) -> Vec<Result<Vec<Message>, StageError>> {
            self.1
                .fetch_add(batch.len(), std::sync::atomic::Ordering::SeqCst);
            batch
                .iter()
                .map(|_| Err(StageError::classified(KindError(self.0))))
                .collect()
        }
    }

    async fn tries_before_dead_letter(kind: recollect_model::ErrorKind) -> usize {
        let bus = InProcessBus::new(16);
        bus.ensure_topics(&["in", topics::DLQ]).await.unwrap();
        let mut dlq = bus.subscribe(topics::DLQ, "g").await.unwrap();
        let stage = Arc::new(Failing(kind, Default::default()));
        let (tx, rx) = watch::channel(false);
        let h = tokio::spawn(run_stage(bus.clone(), stage.clone(), "g".into(), rx));
        bus.publish(vec![Message::json("in", "k".into(), 1, "t")])
            .await
            .unwrap();
        let dead = dlq.poll(1, Duration::from_secs(10)).await.unwrap();
        assert_eq!(dead.len(), 1, "the message is dead-lettered");
        let dl: DeadLetter = serde_json::from_slice(&dead[0].message.payload()).unwrap();
        assert!(dl.error.contains(kind.code()), "{}", dl.error);
        tx.send(true).unwrap();
        h.await.unwrap().unwrap();
        stage.1.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn invalid_data_is_dead_lettered_at_once_and_outages_are_retried() {
        use recollect_model::ErrorKind;
        for kind in [
            ErrorKind::InvalidArgument,
            ErrorKind::Internal,
            ErrorKind::Conflict,
        ] {
            assert_eq!(tries_before_dead_letter(kind).await, 1, "{kind:?}");
        }
        // The try in its batch, then alone: a first try and four retries.
        assert_eq!(tries_before_dead_letter(ErrorKind::Unavailable).await, 6);
    }

    #[tokio::test]
    async fn one_consumer_per_topic_in_process() {
        let bus = InProcessBus::new(4);
        let _a = bus.subscribe("t", "g").await.unwrap();
        assert!(matches!(
            bus.subscribe("t", "g").await,
            Err(BusError::AlreadySubscribed(_))
        ));
    }
}
