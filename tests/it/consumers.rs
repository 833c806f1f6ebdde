//! The consumer examples a downstream team copies (`examples/consumer.rs`
//! with rdkafka + apache-avro, `examples/consumer.py` with confluent-kafka,
//! `examples/java` with kafka-clients, Apache Avro and Apicurio's serde, run
//! by `scripts/java-consumer`) read both framings posbridge writes, the
//! Confluent one through the real registry, and keep the latest state per key.
//! The Java example runs on Apache Kafka only: kafka-clients 4.4's
//! `endOffsets` (ListOffsets) times out against tansu 0.6.

use serde_json::Value;

use crate::support::registry::Registry;
use crate::support::{TestApp, brokers, config, example_binary, kafka_only, rr_sale, unique};

/// Publishes two sales, then a newer state of the first, and returns the topic.
async fn three_records(app: &TestApp) -> String {
    for (id, timestamp, sale, status_total) in [
        ("c-1", "2026-11-29T10:00:00Z", "T1|2026-11|0001", 100),
        ("c-2", "2026-11-29T10:00:01Z", "T1|2026-11|0002", 200),
        ("c-3", "2026-11-29T10:05:00Z", "T1|2026-11|0001", 150),
    ] {
        let event = if id == "c-3" {
            "sale.cancelled"
        } else {
            "sale.created"
        };
        let mut body = rr_sale(id, event, timestamp, sale, status_total);
        body["data"]["status"] = event.trim_start_matches("sale.").into();
        assert_eq!(app.send("receiptroller", "main", &body).await.status(), 200);
    }
    app.topic("sales")
}

/// The compacted view both examples must print.
fn assert_view(output: &[u8], who: &str) {
    let lines: Vec<Value> = String::from_utf8_lossy(output)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{who}: one line per key: {lines:?}");
    assert_eq!(lines[0]["key"], "receiptroller:T1|2026-11|0001", "{who}");
    assert_eq!(lines[0]["status"], "cancelled", "{who}: the latest state");
    assert_eq!(lines[0]["total"], "150.0000", "{who}");
    assert_eq!(lines[0]["entity_type"], "SALE", "{who}");
    assert_eq!(lines[1]["status"], "created", "{who}");
}

async fn run(program: &std::path::Path, args: &[&str]) -> std::process::Output {
    let output = tokio::process::Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The two framings, each on a posbridge of its own with three records:
/// the arguments a consumer example takes to read them (the registry's
/// for the Confluent one), and a name for each.
async fn both_framings(mut read: impl AsyncFnMut(&[&str], &str)) {
    let brokers = brokers();

    // Single-object encoding (no registry).
    let app = TestApp::start().await;
    let topic = three_records(&app).await;
    read(
        &["--brokers", brokers.as_str(), "--topic", topic.as_str()],
        "single-object",
    )
    .await;
    app.stop().await;

    // Confluent wire format (a registry).
    let registry = Registry::shared();
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&brokers, &unique("consumers"), dir.path());
    config.schema_registry.url = Some(registry.url.clone());
    let app = TestApp::start_with(config).await;
    let topic = three_records(&app).await;
    read(
        &[
            "--brokers",
            brokers.as_str(),
            "--topic",
            topic.as_str(),
            "--registry",
            registry.url.as_str(),
        ],
        "confluent",
    )
    .await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_and_python_consumer_examples_read_both_framings_into_the_latest_state() {
    let rust = example_binary("consumer");
    let python = crate::support::python_path();
    let python_example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/consumer.py");
    both_framings(async |args, framing| {
        assert_view(&run(&rust, args).await.stdout, &format!("rust, {framing}"));
        let mut py_args = vec![python_example];
        py_args.extend(args);
        assert_view(
            &run(std::path::Path::new(&python), &py_args).await.stdout,
            &format!("python, {framing}"),
        );
    })
    .await;
}

/// Apache Kafka only: kafka-clients 4.4's `endOffsets` (ListOffsets) times
/// out against tansu 0.6.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_the_java_consumer_example_reads_both_framings_into_the_latest_state() {
    kafka_only("kafka-clients' ListOffsets times out against tansu 0.6");
    let java = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/java-consumer"
    ));
    both_framings(async |args, framing| {
        assert_view(&run(java, args).await.stdout, &format!("java, {framing}"));
    })
    .await;
}
