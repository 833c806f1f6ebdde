//! Entity topics changed under a running posbridge, as an operator would
//! change them: partitions raised (a key's next states would go to another
//! partition than its last, and compaction keeps both), the cleanup policy
//! set to `delete`, the topic deleted (the next produce would re-create it
//! with the broker's defaults). The topic watch runs the start-up check
//! again every `kafka.topic_check_secs`; a changed topic's deliveries are
//! refused as a topic Kafka refuses is (Mekari 503 + `Retry-After`,
//! ReceiptRoller spooled), the other topics publish, and `/readyz`, the
//! status page and `posbridge_topic_changed` name the topic and why.
//! Raising partitions and setting a policy are Kafka only (`kafka_only` in
//! their names): tansu 0.6 answers CreatePartitions and AlterConfigs with
//! UnsupportedFeature. Deleting a topic is tried on both.

use crate::support::kafka_only;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::operator::{delete_topic, raise_partitions, set_topic_config};
use crate::support::wait::{wait_for, wait_until};
use crate::support::{
    OwnBroker, TestApp, brokers, mekari_order, metric, rr_sale, spool_config, unique,
};

/// A posbridge whose topics have `partitions` partitions, checked again
/// every second, ReceiptRoller spooling.
async fn start(tag: &str, partitions: usize) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let mut config = spool_config(&brokers(), &unique(tag), dir.path());
    config.kafka.partitions = i32::try_from(partitions).unwrap();
    config.kafka.topic_check_secs = 1;
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    app
}

/// Waits until `/readyz` names `topic` among the failing topics; its reason.
async fn named_in_readyz(app: &TestApp, topic: &str) -> String {
    wait_for(
        Duration::from_secs(30),
        &format!("/readyz to name {topic}"),
        || async {
            let ready: Value = app.get("/readyz").await.json().await.unwrap();
            ready["failing_topics"][topic].as_str().map(str::to_owned)
        },
    )
    .await
}

fn order(n: u32) -> Value {
    mekari_order(
        &format!("tc-mk-{n}-{}", unique("o")),
        "order.created",
        "2026-11-29T17:15:30+07:00",
        &format!("ORD-{n}"),
        "new",
    )
}

/// The answer to `body` from `provider`: status, `Retry-After`, JSON body.
async fn answer(app: &TestApp, provider: &str, body: &Value) -> (u16, Option<String>, Value) {
    let response = app.send(provider, "main", body).await;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry_after, response.json().await.unwrap())
}

fn changed(metrics: &str, topic: &str, reason: &str) -> f64 {
    metric(
        metrics,
        "posbridge_topic_changed",
        &[("topic", topic), ("reason", reason)],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_partitions_raised_under_a_running_posbridge_stop_that_topic_and_are_named() {
    kafka_only("tansu 0.6 has no CreatePartitions");
    let app = start("parts", 3).await;
    let orders = app.topic("orders");
    assert_eq!(answer(&app, "mekari", &order(0)).await.0, 200);

    raise_partitions(&brokers(), &orders, 12).await;
    let why = named_in_readyz(&app, &orders).await;
    assert!(
        why.contains("12 partitions where posbridge keeps 3"),
        "{why}"
    );

    let (status, retry_after, body) = answer(&app, "mekari", &order(1)).await;
    assert_eq!(status, 503, "{body}");
    assert!(retry_after.is_some(), "Mekari waits before its retry");
    assert!(body["error"].is_string(), "{body}");
    let rr_order = json!({"id": unique("tc-rr"), "type": "order.created",
        "timestamp": "2026-11-29T10:10:00Z", "data": {"order_id": "O-TC", "status": "open"}});
    let (status, _, body) = answer(&app, "receiptroller", &rr_order).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("spooled")));
    let sale = rr_sale(
        &unique("tc-sale"),
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|0001",
        100,
    );
    let (status, _, body) = answer(&app, "receiptroller", &sale).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("published")),
        "another topic publishes"
    );

    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status(),
        200,
        "one refused topic leaves the pod ready"
    );
    let metrics = app.metrics().await;
    assert_eq!(changed(&metrics, &orders, "partitions"), 1.0, "{metrics}");
    assert_eq!(changed(&metrics, &app.topic("sales"), "partitions"), 0.0);

    let page = app.status_page().await;
    assert!(
        page.contains("failing-topics") && page.contains(&orders) && page.contains("12 partitions"),
        "{page}"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_topic_set_to_delete_under_a_running_posbridge_is_refused_until_it_compacts_again()
 {
    kafka_only("tansu 0.6 has no AlterConfigs");
    let app = start("policy", 1).await;
    let orders = app.topic("orders");
    set_topic_config(&brokers(), &orders, &[("cleanup.policy", "delete")]).await;
    let why = named_in_readyz(&app, &orders).await;
    assert!(why.contains("cleanup.policy is `delete`"), "{why}");
    assert_eq!(answer(&app, "mekari", &order(1)).await.0, 503);
    assert_eq!(
        changed(&app.metrics().await, &orders, "cleanup_policy"),
        1.0
    );

    set_topic_config(&brokers(), &orders, &[("cleanup.policy", "compact")]).await;
    wait_until(
        Duration::from_secs(30),
        "the topic to publish again",
        || async {
            let ready: Value = app.get("/readyz").await.json().await.unwrap();
            ready["failing_topics"].get(&orders).is_none()
        },
    )
    .await;
    let (status, _, body) = answer(&app, "mekari", &order(2)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("published")));
    assert_eq!(
        changed(&app.metrics().await, &orders, "cleanup_policy"),
        0.0
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_deleted_under_a_running_posbridge_is_refused_not_recreated_by_a_delivery() {
    // A broker of its own: deleting a topic a producer writes to makes
    // tansu 0.6's storage panic, after which the broker serves no client
    // (every other test's posbridge answered 503; docs/REAL-SERVERS.md).
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = spool_config(&broker.address(), &unique("deleted"), dir.path());
    config.kafka.topic_check_secs = 1;
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let orders = app.topic("orders");
    assert_eq!(answer(&app, "mekari", &order(0)).await.0, 200);

    delete_topic(&broker.address(), &orders).await;
    let why = named_in_readyz(&app, &orders).await;
    assert!(why.contains("changed under posbridge"), "{why}");
    let (status, retry_after, body) = answer(&app, "mekari", &order(1)).await;
    assert_eq!(status, 503, "{body}");
    assert!(retry_after.is_some());
    let metrics = app.metrics().await;
    assert_eq!(
        changed(&metrics, &orders, "missing") + changed(&metrics, &orders, "cleanup_policy"),
        1.0,
        "gone, or re-created by librdkafka's metadata request with the broker's defaults"
    );
    app.stop().await;
}

/// The watch looks at the topics every second here. Each look once made an
/// admin client on a worker and dropped it there, and an rdkafka client's
/// drop waits for its threads to end: about a tenth of a second in which
/// that worker ran nothing else. With one worker, every webhook waited, and
/// a flood's p99 showed it once per `kafka.topic_check_secs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn the_topic_watch_never_holds_up_the_runtime() {
    let app = start("watch-stall", 1).await;
    // Five looks of the watch, a tick every 5 ms beside them: the timer's
    // lateness is what is measured, so it is slept on, not waited out.
    let ticker = tokio::spawn(async {
        let mut late = Duration::ZERO;
        let started = tokio::time::Instant::now();
        let mut due = started;
        while started.elapsed() < Duration::from_secs(5) {
            due += Duration::from_millis(5);
            tokio::time::sleep_until(due).await;
            late = late.max(due.elapsed());
        }
        late
    });
    let late = ticker.await.unwrap();
    assert!(
        late < Duration::from_millis(50),
        "a task on the runtime waited {late:?} past its time while the topic watch looked"
    );
    app.stop().await;
}
