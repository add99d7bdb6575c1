//! Kafka security settings against a real broker (tansu): SASL/SCRAM with authentication
//! required, and SASL_SSL with a private CA (`bus.ssl_ca_file`). tansu 0.6 cannot serve TLS
//! itself (its CLI refuses `--cert` together with `--key`), so for SASL_SSL a TLS terminator
//! (scripts/tls-proxy.py, Python's ssl module) sits in front of it and is the address tansu
//! advertises: the TLS handshake and certificate check are librdkafka's own, against a real
//! listener; the Kafka protocol and SCRAM exchange behind it are tansu's.
//!
//! Runs where the Kafka end-to-end test runs (`REQUIRE_KAFKA=1` in `make test`), skips with a
//! message when tansu is not installed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use recollect_bus::{Bus, KafkaBus, KafkaSecurity, KafkaSettings, Message};
use recollect_tests::{free_port, tansu};

const USER: &str = "recollect";
const PASSWORD: &str = "s3cret \"pw\"";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A child process killed on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn broker(tansu: &Path, dir: &Path, port: u16, advertised: u16, authentication: bool) -> Running {
    let mut cmd = Command::new(tansu);
    cmd.arg("broker")
        .arg("--listener-url")
        .arg(format!("tcp://127.0.0.1:{port}"))
        .arg("--advertised-listener-url")
        .arg(format!("tcp://127.0.0.1:{advertised}"))
        .arg("--storage-engine")
        .arg("sqlite://tansu.db")
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("broker.log")).unwrap(),
        ));
    if authentication {
        cmd.arg("--authentication");
    }
    let child = Running(cmd.spawn().expect("start tansu"));
    wait_listening(port, "tansu");
    child
}

fn bus(port: u16, security: KafkaSecurity) -> std::sync::Arc<KafkaBus> {
    KafkaBus::connect(KafkaSettings {
        brokers: format!("127.0.0.1:{port}"),
        client_id: "security-test".into(),
        partitions: 1,
        replication: 1,
        security,
    })
    .unwrap()
}

/// Creates a topic, publishes a message and reads it back through `bus`.
async fn round_trip(bus: &KafkaBus, topic: &str) -> Result<(), String> {
    bus.ensure_topics(&[topic])
        .await
        .map_err(|e| e.to_string())?;
    bus.publish(vec![Message::from_bytes(
        topic,
        "k".into(),
        b"over a secured connection".to_vec(),
        vec![],
    )])
    .await
    .map_err(|e| e.to_string())?;
    let mut sub = bus
        .subscribe(topic, &format!("{topic}-group"))
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let got = sub
            .poll(10, Duration::from_secs(1))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(d) = got.first() {
            assert_eq!(d.message.payload().as_ref(), b"over a secured connection");
            sub.close().await;
            return Ok(());
        }
    }
    Err("no message came back".into())
}

#[test]
fn sasl_scram_and_sasl_ssl_against_tansu() {
    let Some(tansu) = tansu() else {
        assert!(
            std::env::var("REQUIRE_KAFKA").is_err(),
            "tansu is required here (scripts/setup-kafka.sh installs it)"
        );
        eprintln!("skipping: tansu is not installed (scripts/setup-kafka.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let made = Command::new("bash")
        .arg(repo().join("scripts/test-ca.sh"))
        .arg(&ca)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "scripts/test-ca.sh: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (port, tls_port) = (free_port(), free_port());

    // SCRAM credentials are kept in tansu's storage: create them on an open broker, then
    // restart it on the same storage with authentication required.
    {
        let _open = broker(&tansu, dir.path(), port, port, false);
        for mechanism in ["scram256", "scram512"] {
            let out = Command::new(&tansu)
                .args(["user", "create", "--broker"])
                .arg(format!("tcp://127.0.0.1:{port}"))
                .args(["--mechanism", mechanism, USER, PASSWORD])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "tansu user create: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    // Clients are sent to the TLS terminator's port by the metadata tansu advertises; the
    // SASL_PLAINTEXT cases below only talk to the bootstrap address, tansu itself.
    let _broker = broker(&tansu, dir.path(), port, tls_port, true);
    let proxy = Command::new("python3")
        .arg(repo().join("scripts/tls-proxy.py"))
        .arg(tls_port.to_string())
        .arg(port.to_string())
        .arg(ca.join("server.pem"))
        .arg(ca.join("server.key"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start scripts/tls-proxy.py");
    let _proxy = Running(proxy);
    wait_listening(tls_port, "scripts/tls-proxy.py");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let sasl_ssl = |mechanism: &str, password: &str, ca_file: &Path| KafkaSecurity {
        protocol: "sasl_ssl".into(),
        sasl_mechanism: mechanism.into(),
        sasl_username: USER.into(),
        sasl_password: password.into(),
        ssl_ca_file: ca_file.to_string_lossy().into(),
    };

    // SASL_SSL with SCRAM-SHA-512 and the private CA: topics, produce, consume.
    let ok = bus(
        tls_port,
        sasl_ssl("SCRAM-SHA-512", PASSWORD, &ca.join("ca.pem")),
    );
    rt.block_on(round_trip(&ok, "secured-512"))
        .expect("sasl_ssl, SCRAM-SHA-512, private CA");
    let ok = bus(
        tls_port,
        sasl_ssl("SCRAM-SHA-256", PASSWORD, &ca.join("ca.pem")),
    );
    rt.block_on(round_trip(&ok, "secured-256"))
        .expect("sasl_ssl, SCRAM-SHA-256, private CA");

    // Refused: a wrong password; a certificate of a CA the client was not given. librdkafka
    // retries a failed connection in the background, so a refusal may show as an error or as
    // no success within the bound.
    let refused = |bus: std::sync::Arc<KafkaBus>, topic: &'static str| {
        rt.block_on(async move {
            match tokio::time::timeout(Duration::from_secs(20), round_trip(&bus, topic)).await {
                Ok(Ok(())) => false,
                Ok(Err(_)) | Err(_) => true,
            }
        })
    };
    assert!(
        refused(
            bus(
                tls_port,
                sasl_ssl("SCRAM-SHA-512", "wrong", &ca.join("ca.pem"))
            ),
            "refused-password"
        ),
        "a wrong SCRAM password was accepted"
    );
    assert!(
        refused(
            bus(tls_port, sasl_ssl("SCRAM-SHA-512", PASSWORD, Path::new(""))),
            "refused-ca"
        ),
        "a certificate from an unknown CA was accepted (system roots only)"
    );
}
