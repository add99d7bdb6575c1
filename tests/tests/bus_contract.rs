//! The bus contract (`recollect_bus::contract`) against Kafka: a tansu broker started here on
//! 127.0.0.1 and stopped by PID. The in-process bus passes the same suite in the crate's tests.
//! Runs where the Kafka tests run (`REQUIRE_KAFKA=1` in `make test`), skips with a message when
//! tansu is not installed.

use recollect_bus::contract::bus_contract;
use recollect_tests::{tansu, Broker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_bus_passes_the_contract() {
    let Some(tansu) = tansu() else {
        assert!(
            std::env::var("REQUIRE_KAFKA").is_err(),
            "tansu is required here (scripts/setup-kafka.sh installs it)"
        );
        eprintln!("skipping: tansu is not installed (scripts/setup-kafka.sh)");
        return;
    };
    let broker = Broker::start(&tansu);
    let bus = recollect_bus::KafkaBus::connect(recollect_bus::KafkaSettings {
        brokers: broker.addr.clone(),
        client_id: "bus-contract".into(),
        // Several partitions: per-key order must hold across them.
        partitions: 3,
        replication: 1,
        security: Default::default(),
    })
    .expect("kafka client");
    bus_contract(bus, "contract").await;
}
