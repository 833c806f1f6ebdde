//! Out-of-order deliveries never roll an entity back in the compacted view.

use posbridge::encode::decode;
use posbridge::pipeline::{HEADER_STATE_HASH, HEADER_VERSION, state_from_headers};

use crate::support::wait::wait_for;
use crate::support::{
    Meter, TestApp, brokers, config, latest_per_key, mekari_order, own_source, read_topic, unique,
};

#[tokio::test]
async fn out_of_order_pair_leaves_the_newer_state_in_the_compacted_view() {
    // A source of its own, so the series labelled with it are this test's.
    let source = unique("ordering");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&brokers(), &unique("ordering"), dir.path());
    own_source(&mut cfg, "receiptroller", "main", &source);
    let mut app = TestApp::start_with(cfg).await;
    app.keep(dir);
    let newer = serde_json::json!({"id": "o-2", "type": "order.updated",
        "timestamp": "2026-11-29T10:20:00Z", "data": {"order_id": "O-77", "status": "paid"}});
    let older = serde_json::json!({"id": "o-1", "type": "order.created",
        "timestamp": "2026-11-29T10:10:00Z", "data": {"order_id": "O-77", "status": "open"}});
    // The newer state is written before the older event arrives.
    let first = app.send("receiptroller", &source, &newer).await;
    assert_eq!(first.status(), 200);
    assert_eq!(
        first.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );
    let topic = app.topic("orders");
    assert_eq!(read_topic(&brokers(), &topic).len(), 1);

    let before = Meter::read(&app).await;
    let late = app.send("receiptroller", &source, &older).await;
    assert_eq!(
        late.status(),
        200,
        "a stale event is answered 2xx: it was handled"
    );
    assert_eq!(
        late.json::<serde_json::Value>().await.unwrap()["status"],
        "stale"
    );
    let after = Meter::read(&app).await;

    let records = read_topic(&brokers(), &topic);
    let view = latest_per_key(&records);
    let latest = decode(view["receiptroller:O-77"].payload.as_deref().unwrap()).unwrap();
    assert_eq!(latest.status.as_deref(), Some("paid"));
    assert_eq!(records.len(), 1, "the older state was never written");

    // This test's source and topic: exactly the late event, answered stale,
    // and nothing acknowledged on the topic meanwhile.
    assert_eq!(
        after.delta(
            &before,
            "posbridge_webhook_requests_total",
            &[
                ("provider", "receiptroller"),
                ("source", source.as_str()),
                ("outcome", "stale")
            ]
        ),
        1.0
    );
    assert_eq!(
        after.delta(
            &before,
            "posbridge_publish_duration_seconds_count",
            &[("topic", topic.as_str())]
        ),
        0.0
    );
    // By provider and entity type only: the simulator's runs in the
    // catch-up tests hold back ReceiptRoller orders too, so this is at
    // least the late event.
    assert!(
        after.delta(
            &before,
            "posbridge_stale_events_total",
            &[("provider", "receiptroller"), ("entity_type", "order")]
        ) >= 1.0,
        "the held-back event is counted"
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

/// Ten states of one order: the middle one is written first, then the
/// other nine arrive at once, older and newer ones interleaved. Each older
/// one arrives after a newer state was written, so it is held back; of the
/// newer ones, whatever order the entity's lock lets them through in, only
/// states newer than the last written one are written.
#[tokio::test]
async fn concurrent_events_for_one_key_end_with_the_newest() {
    let app = TestApp::start().await;
    let body = |i: usize| {
        mekari_order(
            &format!("c-{i}"),
            "order.updated",
            &format!("2026-11-29T17:15:{i:02}+07:00"),
            "ORD-C",
            "preparing",
        )
    };
    let outcome = |response: reqwest::Response| async move {
        assert_eq!(response.status(), 200);
        let json: serde_json::Value = response.json().await.unwrap();
        json["status"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        outcome(app.send("mekari", "main", &body(5)).await).await,
        "published"
    );
    let order = [8, 2, 9, 0, 6, 4, 1, 7, 3];
    let bodies: Vec<_> = order.iter().map(|&i| body(i)).collect();
    let sends = bodies.iter().map(|b| app.send("mekari", "main", b));
    let mut outcomes = std::collections::BTreeMap::new();
    for (i, response) in order.iter().zip(futures::future::join_all(sends).await) {
        outcomes.insert(*i, outcome(response).await);
    }
    for i in 0..5 {
        assert_eq!(
            outcomes[&i], "stale",
            "c-{i} is older than c-5, written before it was sent: {outcomes:?}"
        );
    }
    assert_eq!(outcomes[&9], "published", "nothing newer: {outcomes:?}");
    assert!(
        outcomes.values().all(|o| o == "published" || o == "stale"),
        "{outcomes:?}"
    );

    let records = read_topic(&brokers(), &app.topic("orders"));
    let written: Vec<_> = records
        .iter()
        .map(|r| decode(r.payload.as_deref().unwrap()).unwrap().event_id)
        .collect();
    let published: Vec<_> = std::iter::once("c-5".to_owned())
        .chain(
            outcomes
                .iter()
                .filter(|(_, o)| *o == "published")
                .map(|(i, _)| format!("c-{i}")),
        )
        .collect();
    assert_eq!(
        written, published,
        "written once each, in increasing version order, exactly the states answered published"
    );
    // Each record says the state the guard compared, in the order written:
    // what a ledger rebuilt from the topic would hold.
    let versions: Vec<_> = records
        .iter()
        .map(|r| {
            state_from_headers(
                r.headers[HEADER_VERSION].as_bytes(),
                r.headers[HEADER_STATE_HASH].as_bytes(),
            )
            .expect("every record carries its state")
            .version
        })
        .collect();
    assert!(
        versions.windows(2).all(|pair| pair[0] < pair[1]),
        "{versions:?}"
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
    let outcome = wait_for(
        std::time::Duration::from_secs(90),
        "the newer event to be answered 2xx",
        async || {
            let response = app.send("mekari", "main", &newer).await;
            if response.status() != 200 {
                return None;
            }
            Some(response.json::<serde_json::Value>().await.unwrap())
        },
    )
    .await;
    assert_eq!(outcome["status"], "published");
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
