//! The broker becomes unreachable (connections cut, new ones refused): deliveries are answered 503 + Retry-After and stay
//! retryable; after it returns, the provider's retry publishes exactly once.

use std::time::{Duration, Instant};

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
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let retry = app.send("receiptroller", "main", &body).await;
        if retry.status() == 200 {
            break retry.json::<serde_json::Value>().await.unwrap()["status"].clone();
        }
        assert_eq!(retry.status(), 503);
        assert!(Instant::now() < deadline, "the broker never came back");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
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

#[tokio::test(flavor = "multi_thread")]
async fn readiness_follows_the_broker_and_shutdown_finishes_in_flight_deliveries() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start_with(config(&broker.address(), &unique("shutdown"), dir.path())).await;
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

    // A delivery waiting for the (unreachable) broker when shutdown starts
    // still gets its answer: shutdown stops accepting, then finishes it.
    let body = rr_sale(
        "sd-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|301",
        500,
    );
    let bytes = serde_json::to_vec(&body).unwrap();
    let request = signed_request(
        &app.http,
        &app.base,
        "receiptroller",
        "main",
        "sd-1",
        bytes,
        None,
    );
    let in_flight = tokio::spawn(request.send());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    app.stop().await;
    let answer = in_flight
        .await
        .unwrap()
        .expect("the in-flight request was answered, not cut");
    assert_eq!(answer.status(), 503);
    assert!(started.elapsed() < Duration::from_secs(9));
}

/// A client that goes away while its record is on the way to Kafka does
/// not cancel the delivery: the record the broker acknowledges afterwards
/// is committed to the ledger all the same, so an older event of the same
/// entity is held back as stale and the provider's retry of the delivery is
/// a duplicate. The broker is frozen for a moment to hold the record in
/// flight while the client gives up.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_disconnects_mid_publish_does_not_cancel_the_ledger_commit() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("disconnect");
    let app = TestApp::start_with(config(&broker.address(), &prefix, dir.path())).await;
    let warm = rr_sale(
        "dc-0",
        "sale.created",
        "2026-11-29T10:00:00Z",
        "T1|2026-11|300",
        100,
    );
    assert_eq!(app.send("receiptroller", "main", &warm).await.status(), 200);

    let newer = rr_sale(
        "dc-1",
        "sale.updated",
        "2026-11-29T10:20:00Z",
        "T1|2026-11|301",
        900,
    );
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    broker.freeze();
    let gave_up = signed_request(
        &impatient,
        &app.base,
        "receiptroller",
        "main",
        "dc-1",
        serde_json::to_vec(&newer).unwrap(),
        None,
    )
    .send()
    .await;
    assert!(gave_up.is_err(), "the client gave up before the answer");
    // Well inside the 3 s delivery deadline: the record is acknowledged.
    tokio::time::sleep(Duration::from_millis(600)).await;
    broker.thaw();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let older = rr_sale(
        "dc-2",
        "sale.created",
        "2026-11-29T10:10:00Z",
        "T1|2026-11|301",
        500,
    );
    let late = app.send("receiptroller", "main", &older).await;
    assert_eq!(late.status(), 200);
    assert_eq!(
        late.json::<serde_json::Value>().await.unwrap()["status"],
        "stale",
        "the acknowledged newer state was committed"
    );
    let retry = app.send("receiptroller", "main", &newer).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(
        retry.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate",
        "the delivery id was remembered"
    );
    let records = read_topic(&broker.address(), &app.topic("sales"));
    let for_key = records
        .iter()
        .filter(|r| r.key == "receiptroller:T1|2026-11|301")
        .count();
    assert_eq!(for_key, 1, "one record for the entity");
    app.stop().await;
}
