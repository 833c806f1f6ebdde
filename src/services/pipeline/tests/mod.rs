//! The pipeline's decisions on a fake broker ([`Pipeline::on_fake_broker`])
//! and a real embedded ledger. Here the broker is down, so every path that
//! would publish ends in a retryable error; `broker.rs` has what the line
//! does with the broker's other answers (taken, refused, late).

mod broker;

use std::path::Path;

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::json;
use time::macros::datetime;

use super::intake::{Envelope, identify};
use super::*;
use crate::adapters::ledger::{Begin, Commit, EntitySlot, Held};
use crate::adapters::publish::PublishError;
use crate::config::Secrets;
use crate::domain::event::{
    Content, DeliveryKey, EntityType, Normalized, Origin, PosEvent, ProviderKind, Version,
};
use crate::domain::guard;
use crate::domain::guard::EntityState;
use crate::domain::verify::SchemeName;
use crate::domain::verify::{Verifier, sign};

const SECRET: &str = "pipeline-test-secret";

/// A pipeline whose broker is down.
async fn pipeline(dir: &Path, inflight_wait: Duration) -> Pipeline {
    let (pipeline, broker) = Pipeline::on_fake_broker(dir, inflight_wait).await;
    broker.go_down();
    pipeline
}

/// With no broker the answer is "try again": not a refusal for good, which
/// would be dead-lettered, nor any other stage's error.
fn assert_kafka_did_not_take(error: &PipelineError) {
    assert!(
        matches!(error, PipelineError::Publish(PublishError::BrokerDown)),
        "{error:?}"
    );
    assert!(error.is_retryable());
}

fn source() -> Arc<Source> {
    Arc::new(Source {
        provider: ProviderKind::Mekari,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    })
}

/// A Mekari order delivery, verified as the ingress would.
fn delivery(delivery_id: &str, body_id: &str, occurred_at: &str) -> Delivery {
    let body = serde_json::to_vec(&json!({
        "id": body_id, "event": "order.updated", "occurred_at": occurred_at,
        "data": {"id": "ORD-1", "status": "paid", "total": 10}
    }))
    .unwrap();
    delivery_of(delivery_id, body)
}

fn delivery_of(delivery_id: &str, body: Vec<u8>) -> Delivery {
    let secrets: Secrets = serde_json::from_value(json!([SECRET])).unwrap();
    let verifier = Verifier::new(SchemeName::Hex, "x-sig", &secrets.0, 300).unwrap();
    let mut headers = HeaderMap::new();
    for (name, value) in sign(SchemeName::Hex, "x-sig", SECRET, delivery_id, 0, &body) {
        headers.insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    Delivery {
        source: source(),
        delivery_id: delivery_id.into(),
        body: verifier.verify(&headers, Bytes::from(body), 0).unwrap(),
        // After every event time the tests send: none lies ahead of its arrival.
        received_at: datetime!(2026-11-29 12:00 UTC),
        arrived: Instant::now(),
        spools: false,
        trace: DeliveryTrace::default(),
    }
}

/// The same delivery from a source that spools.
fn spooling(mut delivery: Delivery) -> Delivery {
    delivery.spools = true;
    delivery
}

fn order_event(origin: Origin, at: OffsetDateTime) -> PosEvent {
    PosEvent {
        entity_id: "ORD-1".into(),
        occurred_at: at,
        version: Version::new(at, 0),
        received_at: at,
        origin,
        status: Some("paid".into()),
        ..PosEvent::sample()
    }
}

/// An event with no business content beyond its fields.
fn unnormalized(event: PosEvent) -> Normalized {
    Normalized {
        event,
        content: Content::default(),
    }
}

/// Writes `event`'s state into the ledger as if it had been published.
async fn written(pipeline: &Pipeline, event: &PosEvent) {
    pipeline
        .ledger()
        .commit(Commit::state(
            EntitySlot::new(event.entity_type, &event.key()),
            Held::unplaced(EntityState {
                version: event.version,
                state_hash: guard::state_hash(event, &Content::default()),
            }),
        ))
        .await
        .unwrap();
}

fn key(id: &str) -> DeliveryKey {
    DeliveryKey::new(ProviderKind::Mekari, id)
}

#[tokio::test]
async fn an_older_event_is_held_back_and_its_delivery_is_done() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    written(
        &pipeline,
        &order_event(Origin::Webhook, datetime!(2026-11-29 12:00 UTC)),
    )
    .await;
    let old = delivery("d-old", "d-old", "2026-11-29T11:00:00Z");
    assert_eq!(
        pipeline.deliver(old.clone()).await.unwrap().outcome,
        Outcome::Stale
    );
    assert_eq!(
        pipeline.deliver(old).await.unwrap().outcome,
        Outcome::Duplicate
    );
}

#[tokio::test]
async fn the_same_state_again_is_unchanged_whatever_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let at = datetime!(2026-11-29 12:00 UTC);
    written(&pipeline, &order_event(Origin::Webhook, at)).await;
    let same = order_event(Origin::Webhook, at);
    assert_eq!(
        pipeline.apply(unnormalized(same)).await.unwrap(),
        Outcome::Unchanged
    );
    let fetched_later = order_event(Origin::Reconciler, datetime!(2026-11-30 00:00 UTC));
    assert_eq!(
        pipeline.apply(unnormalized(fetched_later)).await.unwrap(),
        Outcome::Unchanged
    );
    let mut older_fetch = order_event(Origin::Reconciler, datetime!(2026-11-29 06:00 UTC));
    older_fetch.status = Some("refunded".into());
    assert_eq!(
        pipeline.apply(unnormalized(older_fetch)).await.unwrap(),
        Outcome::Stale
    );
}

#[tokio::test]
async fn a_delivery_id_unlike_the_bodys_is_refused_and_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let error = pipeline
        .deliver(delivery("d-1", "d-2", "2026-11-29T11:00:00Z"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, PipelineError::DeliveryIdMismatch),
        "{error}"
    );
    assert!(!error.is_retryable());
    assert_eq!(
        pipeline.ledger().begin(&key("d-1")).await.unwrap(),
        Begin::New
    );
}

#[tokio::test]
async fn a_retry_of_a_done_delivery_is_answered_from_the_ledger_without_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    done(&pipeline, "d-1").await;
    // A body naming another id would be refused, were it read at all.
    let handled = pipeline
        .deliver(delivery("d-1", "d-2", "2026-11-29T11:00:00Z"))
        .await
        .unwrap();
    assert_eq!(handled.outcome, Outcome::Duplicate);
}

#[tokio::test]
async fn a_record_kafka_did_not_take_leaves_the_delivery_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let error = pipeline
        .deliver(delivery("d-new", "d-new", "2026-11-29T11:00:00Z"))
        .await
        .unwrap_err();
    assert_kafka_did_not_take(&error);
    assert!(error.is_retryable());
    // The lease was given back and nothing was marked: the retry is processed.
    assert_eq!(
        pipeline.ledger().begin(&key("d-new")).await.unwrap(),
        Begin::New
    );
    let slot = EntitySlot::new(
        EntityType::Order,
        &crate::domain::event::EntityKey::new(ProviderKind::Mekari, None, "ORD-1"),
    );
    assert_eq!(pipeline.ledger().entity(&slot).await.unwrap(), None);
}

#[tokio::test]
async fn a_body_that_cannot_be_dead_lettered_stays_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let error = pipeline
        .deliver(delivery_of("d-junk", b"not json".to_vec()))
        .await
        .unwrap_err();
    assert_kafka_did_not_take(&error);
    // Not JSON, still keyed by its delivery id: neither done nor still leased.
    assert_eq!(
        pipeline.ledger().begin(&key("d-junk")).await.unwrap(),
        Begin::New
    );
}

#[tokio::test]
async fn a_duplicate_of_a_delivery_in_flight_waits_then_asks_for_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    assert_eq!(
        pipeline.ledger().begin(&key("d-busy")).await.unwrap(),
        Begin::New
    );
    let error = pipeline
        .deliver(delivery("d-busy", "d-busy", "2026-11-29T11:00:00Z"))
        .await
        .unwrap_err();
    assert!(matches!(error, PipelineError::InFlight), "{error}");
    assert!(error.is_retryable());
}

#[tokio::test]
async fn a_body_naming_another_id_is_refused_not_spooled_when_its_lease_cannot_be_had() {
    let dir = tempfile::tempdir().unwrap();
    // The work's deadline (the budget less the spool's margin) comes before
    // the in-flight wait ends: taking the lease fails before the body is read.
    let pipeline = pipeline(dir.path(), Duration::from_secs(2)).await;
    let spool = pipeline.spool().unwrap().clone();
    assert_eq!(
        pipeline.ledger().begin(&key("d-held")).await.unwrap(),
        Begin::New
    );
    let error = pipeline
        .deliver(spooling(delivery(
            "d-held",
            "d-other",
            "2026-11-29T11:00:00Z",
        )))
        .await
        .unwrap_err();
    assert!(
        matches!(error, PipelineError::DeliveryIdMismatch),
        "{error}"
    );
    assert_eq!(spool.stats().entries, 0);
    // The same delivery with its own id is spooled in that case.
    let spooled = pipeline
        .deliver(spooling(delivery(
            "d-held",
            "d-held",
            "2026-11-29T11:00:00Z",
        )))
        .await
        .unwrap();
    assert_eq!(spooled.outcome, Outcome::Spooled);
}

#[tokio::test]
async fn what_kafka_cannot_take_is_spooled_once_and_answered_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let spool = pipeline.spool().unwrap().clone();
    let started = Instant::now();
    let first = delivery("d-sp", "d-sp", "2026-11-29T11:00:00Z");
    assert_eq!(
        pipeline
            .deliver(spooling(first.clone()))
            .await
            .unwrap()
            .outcome,
        Outcome::Spooled
    );
    assert!(
        started.elapsed() <= pipeline.inner.answer_budget,
        "answered within the budget: {:?}",
        started.elapsed()
    );
    assert!(spool.contains(&key("d-sp")).unwrap());
    // Not done in the ledger: the drainer still has to publish it.
    assert_eq!(
        pipeline.ledger().begin(&key("d-sp")).await.unwrap(),
        Begin::New
    );
    pipeline.ledger().release(&key("d-sp")).await;
    // The provider's retry is a duplicate, and nothing is spooled twice.
    assert_eq!(
        pipeline.deliver(spooling(first)).await.unwrap().outcome,
        Outcome::Duplicate
    );
    assert_eq!(spool.stats().entries, 1);
}

#[tokio::test]
async fn a_full_spool_asks_for_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    for id in ["f-1", "f-2", "f-3"] {
        let outcome = pipeline
            .deliver(spooling(delivery(id, id, "2026-11-29T11:00:00Z")))
            .await
            .unwrap()
            .outcome;
        assert_eq!(outcome, Outcome::Spooled);
    }
    let error = pipeline
        .deliver(spooling(delivery("f-4", "f-4", "2026-11-29T11:00:00Z")))
        .await
        .unwrap_err();
    assert!(matches!(error, PipelineError::Spool(_)), "{error}");
    assert!(error.is_retryable());
    assert_eq!(
        pipeline.ledger().begin(&key("f-4")).await.unwrap(),
        Begin::New
    );
}

#[tokio::test]
async fn a_source_that_retries_is_never_spooled() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let error = pipeline
        .deliver(delivery("r-1", "r-1", "2026-11-29T11:00:00Z"))
        .await
        .unwrap_err();
    // Kafka's own failure reaches the provider, not a spool error.
    assert_kafka_did_not_take(&error);
    assert_eq!(pipeline.spool().unwrap().stats().entries, 0);
    assert!(!pipeline.spool().unwrap().contains(&key("r-1")).unwrap());
    // The lease was given back: the provider's retry is processed.
    assert_eq!(
        pipeline.ledger().begin(&key("r-1")).await.unwrap(),
        Begin::New
    );
}

#[tokio::test]
async fn a_replay_kafka_cannot_take_stays_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    let error = pipeline
        .replay(delivery("p-1", "p-1", "2026-11-29T11:00:00Z"))
        .await
        .unwrap_err();
    assert_kafka_did_not_take(&error);
    assert_eq!(
        pipeline.ledger().begin(&key("p-1")).await.unwrap(),
        Begin::New
    );
}

/// A signed body with no usable `id` is dead-lettered, not refused, and is
/// remembered by the delivery id its provider sent in the header, like any
/// other delivery: two ids are two deliveries (two dead letters, each with
/// its id), whatever their bodies, and an id never seen is never a
/// duplicate. A string `id` unlike the header is still the request's mistake.
#[test]
fn a_body_without_a_usable_id_is_keyed_by_its_delivery_id_and_cannot_become_an_event() {
    for provider in ProviderKind::ALL {
        let of = |delivery_id: &str, body: &[u8]| {
            let mut delivery = delivery_of(delivery_id, body.to_vec());
            delivery.source = Arc::new(Source {
                provider,
                ..source().as_ref().clone()
            });
            // The envelope borrows the delivery: kept as what it says.
            identify(&delivery).map(|(key, envelope)| {
                let unusable = match envelope {
                    Envelope::Event(_) => None,
                    Envelope::Unusable(reason) => Some(reason.code()),
                };
                (key, unusable)
            })
        };
        for (body, code) in [
            (&b"[1,3]"[..], "missing_field"),
            (&b"[1, 2]"[..], "missing_field"),
            (&b"5"[..], "missing_field"),
            (
                &br#"{"id": 5, "event": "order.created"}"#[..],
                "invalid_field",
            ),
            (&b"not json"[..], "invalid_json"),
            (&b""[..], "invalid_json"),
        ] {
            let text = String::from_utf8_lossy(body);
            let (key, unusable) = of("d-x", body).unwrap();
            assert_eq!(unusable, Some(code), "{text:?}");
            assert_eq!(
                key,
                DeliveryKey::new(provider, "d-x"),
                "{provider} {text:?}"
            );
            let (other, _) = of("d-y", body).unwrap();
            assert_eq!(
                other,
                DeliveryKey::new(provider, "d-y"),
                "{provider} {text:?}"
            );
        }
        let (key, unusable) = of("d-1", br#"{"id": "d-1"}"#).unwrap();
        assert_eq!(key, DeliveryKey::new(provider, "d-1"));
        assert_eq!(unusable, None, "an event");
        assert!(matches!(
            of("d-1", br#"{"id": "d-2"}"#),
            Err(PipelineError::DeliveryIdMismatch)
        ));
    }
}

/// Marks a delivery done, as dead-lettering it did.
async fn done(pipeline: &Pipeline, id: &str) {
    assert_eq!(pipeline.ledger().begin(&key(id)).await.unwrap(), Begin::New);
    pipeline
        .ledger()
        .commit(Commit::done(crate::adapters::ledger::Done::published_now(
            key(id),
        )))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_redelivered_dead_letter_is_guarded_like_any_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    written(
        &pipeline,
        &order_event(Origin::Webhook, datetime!(2026-11-29 12:00 UTC)),
    )
    .await;
    done(&pipeline, "d-old").await;
    let old = delivery("d-old", "d-old", "2026-11-29T11:00:00Z");
    let entity = crate::domain::event::EntityKey::new(ProviderKind::Mekari, None, "ORD-1");
    let stale = Redelivery::Applied {
        outcome: Outcome::Stale,
        entity,
    };
    assert_eq!(pipeline.plan_redelivery(&old).await.unwrap(), stale);
    assert_eq!(pipeline.redeliver(old).await.unwrap(), stale);
    assert_eq!(
        pipeline.ledger().begin(&key("d-old")).await.unwrap(),
        Begin::Done,
        "its commit ended the lease"
    );
}

#[tokio::test]
async fn a_redelivery_that_still_cannot_be_normalized_is_reported_and_gives_the_lease_back() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    done(&pipeline, "d-shift").await;
    let body = br#"{"id":"d-shift","event":"shift.closed","occurred_at":"2026-11-29T11:00:00Z","data":{"id":"S-1"}}"#;
    let shift = delivery_of("d-shift", body.to_vec());
    let still = pipeline.redeliver(shift.clone()).await.unwrap();
    assert!(
        matches!(&still, Redelivery::StillFailing { code: "unknown_event_type", reason } if reason.contains("shift.closed")),
        "{still:?}"
    );
    assert_eq!(pipeline.plan_redelivery(&shift).await.unwrap(), still);
    assert_eq!(
        pipeline
            .ledger()
            .begin_again(&key("d-shift"))
            .await
            .unwrap(),
        Begin::New,
        "released"
    );
    // Held by another attempt now: the redelivery waits, then gives up.
    let error = pipeline.redeliver(shift).await.unwrap_err();
    assert!(matches!(error, PipelineError::InFlight), "{error}");
}

#[tokio::test]
async fn a_redelivery_kafka_cannot_take_stays_retryable_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(100)).await;
    done(&pipeline, "d-new").await;
    let new = delivery("d-new", "d-new", "2026-11-29T11:00:00Z");
    assert!(matches!(
        pipeline.plan_redelivery(&new).await.unwrap(),
        Redelivery::Applied {
            outcome: Outcome::Published,
            ..
        }
    ));
    let error = pipeline.redeliver(new).await.unwrap_err();
    assert_kafka_did_not_take(&error);
    let slot = EntitySlot::new(
        EntityType::Order,
        &crate::domain::event::EntityKey::new(ProviderKind::Mekari, None, "ORD-1"),
    );
    assert_eq!(pipeline.ledger().entity(&slot).await.unwrap(), None);
    assert_eq!(
        pipeline.ledger().begin(&key("d-new")).await.unwrap(),
        Begin::Done,
        "still done from its dead letter, and not leased"
    );
}

/// The webhook handler awaits `deliver`'s future inside its own, and each
/// move of a future copies it whole: `deliver` only waits for its task's
/// answer, so its future stays small. The task's own future is copied by
/// the spawn several times (the tracker's wrapper, the span's, tokio's
/// cell): its stages run in boxes of their own, so it stays small too
/// (unboxed, it was 13 KiB, and the copies 40% of posbridge's instructions).
#[tokio::test]
async fn a_delivery_future_stays_small() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = pipeline(dir.path(), Duration::from_millis(10)).await;
    let future = pipeline.deliver(delivery("d-1", "d-1", "2026-11-29T10:00:00Z"));
    let size = std::mem::size_of_val(&future);
    assert!(size <= 2048, "deliver's future is {size} bytes");
    let (answer, _answered) = tokio::sync::oneshot::channel();
    let task = pipeline.clone().deliver_on_its_task(
        delivery("d-2", "d-2", "2026-11-29T10:00:00Z"),
        super::tasks::Answer::new(answer),
    );
    let size = std::mem::size_of_val(&task);
    assert!(size <= 2048, "a delivery's task's future is {size} bytes");
}
