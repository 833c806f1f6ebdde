//! A record in doubt (its acknowledgement lost with a frozen broker) never
//! lands after a newer state of its key: what only librdkafka's idempotent
//! producer and a real broker show. The guard's order (older after newer,
//! events of one entity at once) is unit-tested on the fake broker
//! (`pipeline/tests/broker.rs`), the kitchen stage's tie-break with Mekari's
//! normalization.

use crate::support::kafka_only;
use posbridge::adapters::encode::decode;

use crate::support::wait::wait_for;
use crate::support::{TestApp, mekari_order, read_topic};

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
    kafka_only("tansu needs a new producer after a timeout");
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
    // Whatever the producer still holds (the record in doubt) lands or
    // fails before the topic is read.
    app.publisher
        .flush(std::time::Duration::from_secs(10))
        .await;
    let records = read_topic(&broker.address(), &app.topic("orders"));
    let of_key: Vec<_> = records.iter().filter(|r| r.key == "mekari:ORD-D").collect();
    let states: Vec<_> = of_key
        .iter()
        .map(|r| decode(r.payload.as_deref().unwrap()).unwrap().event_id)
        .collect();
    println!("record in doubt: the key's records in order: {states:?}");
    assert_eq!(
        states.last().map(compact_str::CompactString::as_str),
        Some("d-2"),
        "{states:?}"
    );
    assert!(
        states.iter().filter(|s| *s == "d-2").count() == 1,
        "{states:?}"
    );
    app.stop().await;
}
