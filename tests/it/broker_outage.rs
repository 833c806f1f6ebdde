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
