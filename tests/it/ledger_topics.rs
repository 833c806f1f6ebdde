//! The ledger knows which topics it caches: a cluster replaced by a new,
//! empty one at the same address while posbridge was stopped is taken for
//! what it is (the ledger is forgotten and filled from the new topics, so
//! retries and older events reach them), and a topic grown while posbridge
//! was stopped is refused from the start, as one grown while it runs is,
//! until the operator accepts the new count.

use crate::support::kafka_only;
use std::time::Duration;

use serde_json::Value;

use crate::support::operator::raise_partitions;
use crate::support::wait::wait_for;
use crate::support::{
    OwnBroker, TestApp, brokers, config, mekari_order, read_topic, rr_sale, unique,
};

/// The `status` of the answer to `body`, asked again while the answer is
/// 503 (the ledger being filled).
async fn status_of(app: &TestApp, provider: &str, body: &Value) -> String {
    wait_for(
        Duration::from_secs(60),
        &format!("an answer other than 503 from {provider}"),
        || async {
            let response = app.send(provider, "main", body).await;
            if response.status() == 503 {
                return None;
            }
            let body: Value = response.json().await.unwrap();
            Some(body["status"].as_str().unwrap_or("error").to_owned())
        },
    )
    .await
}

/// The high watermark of each of `topic`'s partitions: how many records
/// each holds (nothing is compacted away in the test's time).
fn ends(topic: &str) -> Vec<i64> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .unwrap()
                .1
        })
        .collect()
}

fn order(delivery: &str, occurred_at: &str, order_id: &str, kitchen: &str) -> Value {
    mekari_order(delivery, "order.updated", occurred_at, order_id, kitchen)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ledger_that_outlives_its_cluster_fills_again_from_the_new_empty_topics() {
    let mut broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(&broker.address(), &unique("replaced"), dir.path());
    let sale = rr_sale(
        &unique("lt-sale"),
        "sale.created",
        "2026-11-29T05:00:00Z",
        "T1|2026-12|0042",
        4321,
    );
    let newer = order(
        &unique("lt-o2"),
        "2026-11-29T12:05:00+07:00",
        "ORD-LT",
        "ready",
    );
    let older = order(
        &unique("lt-o1"),
        "2026-11-29T12:01:00+07:00",
        "ORD-LT",
        "preparing",
    );

    let app = TestApp::start_with(config.clone()).await;
    assert_eq!(status_of(&app, "receiptroller", &sale).await, "published");
    assert_eq!(status_of(&app, "mekari", &newer).await, "published");
    let (sales, orders) = (app.topic("sales"), app.topic("orders"));
    app.stop().await;

    // A new, empty cluster at the same address; the ledger file stays.
    broker.replace().await;

    let app = TestApp::start_with(config).await;
    assert_eq!(
        status_of(&app, "receiptroller", &sale).await,
        "published",
        "the retry of a delivery the old cluster holds reaches the new one"
    );
    assert_eq!(
        status_of(&app, "mekari", &older).await,
        "published",
        "nothing newer is in the new topic"
    );
    assert_eq!(status_of(&app, "mekari", &newer).await, "published");
    assert_eq!(status_of(&app, "mekari", &older).await, "duplicate");
    assert_eq!(read_topic(&broker.address(), &sales).len(), 1);
    assert_eq!(read_topic(&broker.address(), &orders).len(), 2);

    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    let why = ready["ledger_rebuild"]["forgotten_because"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // Kafka formats the new cluster with a new id; tansu keeps its
    // configured one and gives the topics new ids.
    assert!(
        why.contains("cluster's id") || why.contains("made again"),
        "{ready}"
    );
    let page = app.status_page().await;
    assert!(page.contains("ledger-forgotten"), "{page}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_topic_grown_while_posbridge_was_stopped_is_refused_at_start() {
    kafka_only("tansu 0.6 has no CreatePartitions");
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&brokers(), &unique("grown"), dir.path());
    config.kafka.partitions = 2;
    config.kafka.topic_check_secs = 1;
    let app = TestApp::start_with(config.clone()).await;
    let orders = app.topic("orders");
    for n in 0..8 {
        let created = order(
            &unique("lt-g"),
            "2026-11-29T12:00:00+07:00",
            &format!("ORD-G{n}"),
            "new",
        );
        assert_eq!(status_of(&app, "mekari", &created).await, "published");
    }
    app.stop().await;
    assert_eq!(ends(&orders).iter().sum::<i64>(), 8);

    raise_partitions(&brokers(), &orders, 6).await;
    let before = ends(&orders);

    let app = TestApp::start_with(config.clone()).await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    let why = ready["failing_topics"][&orders]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        why.contains("6 partitions where posbridge keeps 2"),
        "refused from the start: {ready}"
    );
    let update = order(
        &unique("lt-g"),
        "2026-11-29T12:10:00+07:00",
        "ORD-G3",
        "ready",
    );
    let response = app.send("mekari", "main", &update).await;
    assert_eq!(response.status(), 503, "Mekari retries it later");
    assert_eq!(
        ends(&orders),
        before,
        "no key got a state in a second partition"
    );
    app.stop().await;

    // The stopped app's checkpoint thread lets go of the file a moment later.
    let accepted = wait_for(
        Duration::from_secs(10),
        "the ledger file to be free",
        || async {
            match posbridge::app::partitions::accept_partitions(
                &config,
                std::slice::from_ref(&orders),
            )
            .await
            {
                Ok(accepted) => Some(accepted),
                Err(posbridge::app::BuildError::Ledger(error)) if error.is_held_elsewhere() => None,
                Err(error) => panic!("{error}"),
            }
        },
    )
    .await;
    assert_eq!(accepted[&orders], (Some(2), 6));
    let app = TestApp::start_with(config).await;
    assert_eq!(status_of(&app, "mekari", &update).await, "published");
    app.stop().await;
}
