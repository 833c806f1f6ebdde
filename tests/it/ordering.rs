//! Out-of-order deliveries never roll an entity back in the compacted view.

use posbridge::encode::decode;

use crate::support::{TestApp, brokers, latest_per_key, mekari_order, metric, read_topic};

#[tokio::test]
async fn out_of_order_pair_leaves_the_newer_state_in_the_compacted_view() {
    let app = TestApp::start().await;
    let newer = serde_json::json!({"id": "o-2", "type": "order.updated",
        "timestamp": "2026-11-29T10:20:00Z", "data": {"order_id": "O-77", "status": "paid"}});
    let older = serde_json::json!({"id": "o-1", "type": "order.created",
        "timestamp": "2026-11-29T10:10:00Z", "data": {"order_id": "O-77", "status": "open"}});
    assert_eq!(
        app.send("receiptroller", "main", &newer).await.status(),
        200
    );
    let late = app.send("receiptroller", "main", &older).await;
    assert_eq!(
        late.status(),
        200,
        "a stale event is answered 2xx: it was handled"
    );
    assert_eq!(
        late.json::<serde_json::Value>().await.unwrap()["status"],
        "stale"
    );

    let records = read_topic(&brokers(), &app.topic("orders"));
    let view = latest_per_key(&records);
    let latest = decode(view["receiptroller:O-77"].payload.as_deref().unwrap()).unwrap();
    assert_eq!(latest.status.as_deref(), Some("paid"));
    assert_eq!(records.len(), 1, "the older state was never written");

    let metrics = app.metrics().await;
    assert!(
        metric(
            &metrics,
            "posbridge_stale_events_total",
            &[("provider", "receiptroller"), ("entity_type", "order")]
        ) >= 1.0
    );
    app.stop().await;
}

#[tokio::test]
async fn kitchen_status_breaks_a_tie_at_the_same_occurred_at() {
    let app = TestApp::start().await;
    let at = "2026-11-29T17:15:30+07:00";
    let ready = mekari_order("k-2", "order.kitchen_status_changed", at, "ORD-1", "ready");
    let preparing = mekari_order(
        "k-1",
        "order.kitchen_status_changed",
        at,
        "ORD-1",
        "preparing",
    );
    assert_eq!(app.send("mekari", "main", &ready).await.status(), 200);
    let late = app.send("mekari", "main", &preparing).await;
    assert_eq!(
        late.json::<serde_json::Value>().await.unwrap()["status"],
        "stale"
    );
    let view = latest_per_key(&read_topic(&brokers(), &app.topic("orders")));
    let latest = decode(view["mekari:ORD-1"].payload.as_deref().unwrap()).unwrap();
    assert_eq!(latest.kitchen_status.as_deref(), Some("ready"));
    app.stop().await;
}

#[tokio::test]
async fn concurrent_events_for_one_key_end_with_the_newest() {
    let app = TestApp::start().await;
    let bodies: Vec<_> = (0..10)
        .map(|i| {
            mekari_order(
                &format!("c-{i}"),
                "order.updated",
                &format!("2026-11-29T17:15:{i:02}+07:00"),
                "ORD-C",
                "preparing",
            )
        })
        .collect();
    let sends = bodies.iter().rev().map(|b| app.send("mekari", "main", b));
    for response in futures::future::join_all(sends).await {
        assert_eq!(response.status(), 200);
    }
    let records = read_topic(&brokers(), &app.topic("orders"));
    let versions: Vec<_> = records
        .iter()
        .map(|r| decode(r.payload.as_deref().unwrap()).unwrap().version)
        .collect();
    assert!(
        versions.windows(2).all(|w| w[0] < w[1]),
        "written in increasing version order"
    );
    let latest = decode(
        latest_per_key(&records)["mekari:ORD-C"]
            .payload
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(latest.event_id, "c-9");
    app.stop().await;
}

/// A record in doubt never lands after a newer state of its key: the broker
/// freezes with a record in flight, the delivery is answered 503 at the
/// deadline, a newer event for the same entity comes (503 while Kafka is
/// away, then its retry publishes once the broker thaws). The newest record
/// for the key is the newer state, and the older delivery's retry is stale.
/// Kafka only (`kafka_only` in its name): it is librdkafka's own recovery
/// after a timeout (an epoch bump once the requests in flight are done)
/// that keeps the order; on tansu posbridge replaces the producer instead
/// (`kafka.new_producer_after_timeout`), which tansu needs and which gives
/// up that order.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_record_in_doubt_never_lands_after_a_newer_state_of_its_key() {
    if crate::support::broker_kind() == crate::support::BrokerKind::Tansu {
        eprintln!(
            "record in doubt: Apache Kafka only (tansu needs a new producer after a timeout)"
        );
        return;
    }
    let broker = crate::support::OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::support::unique("doubt");
    let app = TestApp::start_with(crate::support::config(
        &broker.address(),
        &prefix,
        dir.path(),
    ))
    .await;
    let warm = mekari_order(
        "d-0",
        "order.created",
        "2026-11-29T17:00:00+07:00",
        "ORD-W",
        "new",
    );
    assert_eq!(app.send("mekari", "main", &warm).await.status(), 200);

    broker.freeze();
    let older = mekari_order(
        "d-1",
        "order.updated",
        "2026-11-29T17:10:00+07:00",
        "ORD-D",
        "preparing",
    );
    let newer = mekari_order(
        "d-2",
        "order.updated",
        "2026-11-29T17:20:00+07:00",
        "ORD-D",
        "ready",
    );
    assert_eq!(
        app.send("mekari", "main", &older).await.status(),
        503,
        "no acknowledgement within the deadline"
    );
    assert_eq!(app.send("mekari", "main", &newer).await.status(), 503);
    broker.thaw();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let response = app.send("mekari", "main", &newer).await;
        if response.status() == 200 {
            let outcome: serde_json::Value = response.json().await.unwrap();
            assert_eq!(outcome["status"], "published");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the newer event never published"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let retry = app.send("mekari", "main", &older).await;
    assert_eq!(retry.status(), 200);
    let outcome: serde_json::Value = retry.json().await.unwrap();
    assert!(
        outcome["status"] == "stale" || outcome["status"] == "duplicate",
        "the older delivery's retry writes nothing: {outcome}"
    );
    // Let anything still in flight land before reading.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let records = read_topic(&broker.address(), &app.topic("orders"));
    let of_key: Vec<_> = records.iter().filter(|r| r.key == "mekari:ORD-D").collect();
    let states: Vec<_> = of_key
        .iter()
        .map(|r| decode(r.payload.as_deref().unwrap()).unwrap().event_id)
        .collect();
    println!("record in doubt: the key's records in order: {states:?}");
    assert_eq!(states.last().map(String::as_str), Some("d-2"), "{states:?}");
    assert!(
        states.iter().filter(|s| *s == "d-2").count() == 1,
        "{states:?}"
    );
    app.stop().await;
}
