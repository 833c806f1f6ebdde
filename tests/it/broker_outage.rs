//! The broker becomes unreachable (connections cut, new ones refused): deliveries are answered 503 + Retry-After and stay
//! retryable; after it returns, the provider's retry publishes exactly once.
//! What the line does with a record Kafka takes late (its caller gone, its
//! answer deadline passed) is unit-tested on the fake broker
//! (`pipeline/tests/broker.rs`).

use std::time::{Duration, Instant};

use posbridge::adapters::ledger::Begin;
use posbridge::domain::event::{DeliveryKey, ProviderKind};

use crate::support::wait::wait_for;
use crate::support::{OwnBroker, TestApp, config, read_topic, rr_sale, signed_request, unique};

#[tokio::test(flavor = "multi_thread")]
async fn broker_stopped_gives_503_with_retry_after_then_the_retry_publishes_once() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("outage");
    let app = TestApp::start_with(config(&broker.address(), &prefix, dir.path())).await;
    let warm = rr_sale(
        "out-0",
        "sale.created",
        "2026-11-29T10:00:00Z",
        "T1|2026-11|100",
        100,
    );
    assert_eq!(app.send("receiptroller", "main", &warm).await.status(), 200);

    broker.cut();
    let body = rr_sale(
        "out-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|101",
        500,
    );
    let started = Instant::now();
    let refused = app.send("receiptroller", "main", &body).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "7");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "answered inside the providers' 10 s"
    );

    broker.heal();
    // Retried as the provider does, until Kafka takes it.
    let status = wait_for(
        Duration::from_secs(60),
        "the broker to come back",
        async || {
            let retry = app.send("receiptroller", "main", &body).await;
            if retry.status() == 200 {
                return Some(retry.json::<serde_json::Value>().await.unwrap()["status"].clone());
            }
            assert_eq!(retry.status(), 503);
            None
        },
    )
    .await;
    assert_eq!(status, "published");
    let again = app.send("receiptroller", "main", &body).await;
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );

    let records = read_topic(&broker.address(), &app.topic("sales"));
    let for_key = records
        .iter()
        .filter(|r| r.key == "receiptroller:T1|2026-11|101")
        .count();
    assert_eq!(for_key, 1, "exactly one record for the retried delivery");
    assert_eq!(records.len(), 2);
    app.stop().await;
}

/// Readiness follows the broker; and shutdown waits for the deliveries in
/// flight: with the broker frozen (connections open, nothing answers), a
/// delivery is waiting for its acknowledgement when shutdown starts. Shutdown
/// stops accepting and waits; once the broker thaws the record is
/// acknowledged, the delivery is answered (`published`) and committed before
/// `stop` returns. The same for a delivery whose client went away: nothing
/// on the connection waits for it, the pipeline's tracking does.
#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_broker_and_shutdown_finishes_in_flight_deliveries() {
    let broker = OwnBroker::start().await;
    // A deadline long enough that the record waits out the freeze below on
    // a loaded machine.
    let start = |tag: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(&broker.address(), &unique(tag), dir.path());
        cfg.kafka.delivery_timeout_ms = 8000;
        async move {
            let mut app = TestApp::start_with(cfg).await;
            app.keep(dir);
            app
        }
    };
    let app = start("shutdown").await;
    let get = |path: &'static str| {
        let url = format!("{}{path}", app.base);
        let http = app.http.clone();
        async move { http.get(url).send().await.unwrap() }
    };
    assert_eq!(get("/readyz").await.status(), 200);

    broker.cut();
    let not_ready = get("/readyz").await;
    assert_eq!(not_ready.status(), 503);
    assert_eq!(
        not_ready.json::<serde_json::Value>().await.unwrap()["broker"],
        "unavailable"
    );
    assert_eq!(
        get("/healthz").await.status(),
        200,
        "the process itself is up"
    );
    broker.heal();
    published_once_up(&app, "sd-0", "T1|2026-11|300").await;
    assert_eq!(get("/readyz").await.status(), 200, "ready again");

    // A delivery waiting for the frozen broker when shutdown starts.
    let topic = app.topic("sales");
    let pipeline = app.pipeline.clone();
    broker.freeze();
    let body = rr_sale(
        "sd-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|301",
        500,
    );
    let request = signed_request(
        &app.http,
        &app.base,
        "receiptroller",
        "main",
        "sd-1",
        serde_json::to_vec(&body).unwrap(),
        None,
    );
    let in_flight = tokio::spawn(request.send());
    // The delivery reaches the frozen broker, then shutdown starts; the
    // assertions below are about shutdown *still* waiting after a while,
    // which no condition can show sooner.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = tokio::spawn(app.stop());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !in_flight.is_finished(),
        "the request waits for its answer, not cut by shutdown"
    );
    assert!(!stopping.is_finished(), "shutdown waits for the delivery");
    broker.thaw();
    // The app's folder, kept while the ledger is read below.
    let _dir = tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("shutdown ends once the delivery did")
        .unwrap();
    // Committed before `stop` returned.
    let key = |id: &str| DeliveryKey::new(ProviderKind::ReceiptRoller, id);
    assert_eq!(
        pipeline.ledger().begin(&key("sd-1")).await.unwrap(),
        Begin::Done,
        "the delivery was committed before shutdown ended"
    );
    drop(pipeline);
    let answer = in_flight
        .await
        .unwrap()
        .expect("the in-flight request was answered, not cut");
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );
    let records = read_topic(&broker.address(), &topic);
    let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "receiptroller:T1|2026-11|300",
            "receiptroller:T1|2026-11|301"
        ]
    );

    // Deliveries whose clients gave up while the broker is frozen: no
    // connection is left to wait for (hyper closed them), so shutdown waits
    // for the deliveries themselves (the pipeline's tracking, then the
    // producer's flush). The second, a newer state of the same sale, waits
    // for the first to release the entity: it has not reached the producer
    // when shutdown starts.
    let app = start("shutdown-gone").await;
    published_once_up(&app, "sd-2", "T1|2026-11|302").await;
    let topic = app.topic("sales");
    let pipeline = app.pipeline.clone();
    broker.freeze();
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    for (id, event, at) in [
        ("sd-3", "sale.created", "2026-11-29T10:15:30Z"),
        ("sd-4", "sale.updated", "2026-11-29T10:20:00Z"),
    ] {
        let body = rr_sale(id, event, at, "T1|2026-11|303", 500);
        let gave_up = signed_request(
            &impatient,
            &app.base,
            "receiptroller",
            "main",
            id,
            serde_json::to_vec(&body).unwrap(),
            None,
        )
        .send()
        .await;
        assert!(gave_up.is_err(), "the client gave up before the answer");
    }
    let stopping = tokio::spawn(app.stop());
    // That shutdown is still waiting a while later: a time, not a condition.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!stopping.is_finished(), "shutdown waits for the deliveries");
    broker.thaw();
    let _dir = tokio::time::timeout(Duration::from_secs(20), stopping)
        .await
        .expect("shutdown ends once the deliveries did")
        .unwrap();
    for id in ["sd-3", "sd-4"] {
        assert_eq!(
            pipeline.ledger().begin(&key(id)).await.unwrap(),
            Begin::Done,
            "{id}, whose client went away, was committed before shutdown ended"
        );
    }
    drop(pipeline);
    let records = read_topic(&broker.address(), &topic);
    let written: Vec<(&str, String)> = records
        .iter()
        .map(|r| {
            let event = posbridge::adapters::encode::decode(r.payload.as_deref().unwrap()).unwrap();
            (r.key.as_str(), event.event_id.into())
        })
        .collect();
    assert_eq!(
        written,
        [
            ("receiptroller:T1|2026-11|302", "sd-2".to_owned()),
            ("receiptroller:T1|2026-11|303", "sd-3".to_owned()),
            ("receiptroller:T1|2026-11|303", "sd-4".to_owned()),
        ]
    );
}

/// Sends a sale until it is published (a broker that just came back may
/// take a moment): the producer has a connection and the topic's leader.
async fn published_once_up(app: &TestApp, delivery_id: &str, sale_id: &str) {
    let body = rr_sale(
        delivery_id,
        "sale.created",
        "2026-11-29T10:00:00Z",
        sale_id,
        100,
    );
    let status = wait_for(
        Duration::from_secs(60),
        "the broker to come back",
        async || {
            let response = app.send("receiptroller", "main", &body).await;
            if response.status() != 200 {
                return None;
            }
            Some(response.json::<serde_json::Value>().await.unwrap()["status"].clone())
        },
    )
    .await;
    assert_eq!(status, "published");
}
