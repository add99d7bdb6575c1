//! The contract every [`Bus`] passes: what the stage runner and the gateway rely on, checked the
//! same way against the in-process queues (the crate's tests) and Kafka (a tansu broker, in
//! `tests/tests/bus_contract.rs`). Topics are named from `prefix`, so a run on a shared broker
//! never sees another's messages.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{Bus, Delivery, Message, Subscription};

/// How long a bus may take to deliver what it acknowledged (Kafka's group join included).
const DELIVERY_LIMIT: Duration = Duration::from_secs(60);

pub async fn bus_contract(bus: Arc<dyn Bus>, prefix: &str) {
    let a = format!("{prefix}-a");
    let b = format!("{prefix}-b");
    topics_are_created_idempotently(bus.as_ref(), &a, &b).await;
    messages_published_before_the_subscription_arrive_in_key_order(bus.as_ref(), &a, &b).await;
    let c = format!("{prefix}-c");
    bus.ensure_topics(&[&c]).await.expect("ensure topic c");
    later_publishes_reach_a_live_subscription(bus.as_ref(), &c).await;
}

async fn topics_are_created_idempotently(bus: &dyn Bus, a: &str, b: &str) {
    bus.ensure_topics(&[a, b]).await.expect("ensure topics");
    bus.ensure_topics(&[a, b])
        .await
        .expect("ensuring existing topics again is a no-op");
    bus.publish(Vec::new())
        .await
        .expect("publishing nothing succeeds");
}

fn message(topic: &str, key: &str, n: usize) -> Message {
    Message::from_bytes(
        topic,
        key.to_string(),
        format!("{key}:{n}").into_bytes(),
        vec![
            ("trace_id".to_string(), format!("trace-{key}-{n}")),
            ("n".to_string(), n.to_string()),
        ],
    )
}

/// Polls until `want` deliveries arrived (more is a failure the caller sees), or the limit.
async fn collect(sub: &mut dyn Subscription, want: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + DELIVERY_LIMIT;
    let mut got = Vec::new();
    while got.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} messages arrived within {DELIVERY_LIMIT:?}",
            got.len()
        );
        got.extend(
            sub.poll(want - got.len(), Duration::from_millis(500))
                .await
                .expect("poll"),
        );
    }
    got
}

async fn messages_published_before_the_subscription_arrive_in_key_order(
    bus: &dyn Bus,
    a: &str,
    b: &str,
) {
    // Two keys interleaved over two publish calls, and one message on another topic.
    let keys = ["conversation-1", "conversation-2"];
    let mut first = Vec::new();
    let mut second = Vec::new();
    for n in 0..10 {
        for k in keys {
            first.push(message(a, k, n));
            second.push(message(a, k, n + 10));
        }
    }
    bus.publish(first).await.expect("publish");
    bus.publish(second).await.expect("publish");
    bus.publish(vec![message(b, "elsewhere", 0)])
        .await
        .expect("publish to b");

    let mut sub = bus.subscribe(a, "contract").await.expect("subscribe");
    let got = collect(sub.as_mut(), 40).await;
    assert!(
        got.iter().all(|d| d.message.topic == a),
        "a subscription delivers its own topic only"
    );
    // Per key: every message once, in publish order, headers and payload intact.
    let mut by_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for d in &got {
        let n: usize = d
            .message
            .header("n")
            .expect("headers kept")
            .parse()
            .unwrap();
        assert_eq!(
            d.message.payload().as_ref(),
            format!("{}:{n}", d.message.key).as_bytes()
        );
        assert_eq!(
            d.message.header("trace_id"),
            Some(format!("trace-{}-{n}", d.message.key).as_str())
        );
        by_key.entry(&d.message.key).or_default().push(n);
    }
    for k in keys {
        assert_eq!(
            by_key.get(k).cloned().unwrap_or_default(),
            (0..20).collect::<Vec<_>>(),
            "key {k}: each message once, in publish order"
        );
    }
    // Offsets grow within a partition: what commit relies on.
    let mut last: BTreeMap<i32, i64> = BTreeMap::new();
    for d in &got {
        if let Some(prev) = last.insert(d.partition, d.offset) {
            assert!(
                d.offset > prev,
                "offsets grow within partition {}",
                d.partition
            );
        }
    }
    // Nothing more: an empty poll returns empty, and not long after its wait.
    let started = Instant::now();
    let extra = sub
        .poll(10, Duration::from_millis(300))
        .await
        .expect("poll");
    assert!(extra.is_empty(), "delivered twice: {extra:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "an empty poll waited {:?}",
        started.elapsed()
    );
    sub.commit(&got).await.expect("commit");
    sub.close().await;
}

async fn later_publishes_reach_a_live_subscription(bus: &dyn Bus, c: &str) {
    let mut sub = bus.subscribe(c, "contract").await.expect("subscribe");
    // A poll on an empty topic (Kafka: while the group forms) is empty, not an error.
    let _ = sub.poll(1, Duration::from_millis(200)).await.expect("poll");
    bus.publish((0..5).map(|n| message(c, "k", n)).collect())
        .await
        .expect("publish");
    let got = collect(sub.as_mut(), 5).await;
    let ns: Vec<String> = got
        .iter()
        .map(|d| d.message.header("n").unwrap_or("").to_string())
        .collect();
    assert_eq!(ns, ["0", "1", "2", "3", "4"]);
    sub.commit(&got).await.expect("commit");
    sub.close().await;
}
