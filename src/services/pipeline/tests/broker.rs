//! What the line does with each answer of the broker, on the fake broker:
//! a record taken once however often its delivery comes, the newest state
//! last whatever the order, a record taken after its answer deadline (or its
//! caller gone) committed all the same, a refusal for good dead-lettered, a
//! dead letter too large cut to what its topic takes.

use std::sync::Arc;

use futures::future::join_all;
use rdkafka::error::RDKafkaErrorCode;
use sha2::{Digest, Sha256};

use super::*;
use crate::adapters::publish::{FakeBroker, Fault, OutgoingRecord};
use crate::domain::event::EntityKey;

/// The order every test delivery is about.
const ORDER: &str = "mekari:ORD-1";

/// A pipeline on a broker that takes every record.
async fn taking(dir: &Path, inflight_wait: Duration) -> (Pipeline, Arc<FakeBroker>) {
    Pipeline::on_fake_broker(dir, inflight_wait).await
}

/// `delivery` delivered on a task of its own, as the ingress's request does.
fn spawned(
    pipeline: &Pipeline,
    delivery: Delivery,
) -> tokio::task::JoinHandle<Result<Handled, PipelineError>> {
    let pipeline = pipeline.clone();
    tokio::spawn(async move { pipeline.deliver(delivery).await })
}

fn orders(pipeline: &Pipeline) -> String {
    pipeline
        .inner
        .topics
        .shared()
        .entity(EntityType::Order)
        .to_string()
}

fn dead_letters(pipeline: &Pipeline) -> String {
    pipeline.inner.topics.shared().dead_letter().to_string()
}

fn header<'r>(record: &'r OutgoingRecord, name: &str) -> &'r str {
    record.header(name).unwrap_or_default()
}

/// The delivery id of every record the broker took, in order.
fn delivery_ids(broker: &FakeBroker) -> Vec<String> {
    broker
        .taken()
        .iter()
        .map(|record| header(record, HEADER_DELIVERY_ID).to_owned())
        .collect()
}

/// The order's state in the ledger.
async fn order_state(pipeline: &Pipeline) -> Option<EntityState> {
    let slot = EntitySlot::new(
        EntityType::Order,
        &EntityKey::new(ProviderKind::Mekari, None, "ORD-1"),
    );
    pipeline
        .ledger()
        .entity(&slot)
        .await
        .unwrap()
        .map(|held| held.state)
}

#[tokio::test]
async fn a_delivery_kafka_takes_is_published_once_with_the_state_it_wrote_in_its_headers() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let first = delivery("d-1", "d-1", "2026-11-29T11:00:00Z");
    let handled = pipeline.deliver(first.clone()).await.unwrap();
    assert_eq!(handled.outcome, Outcome::Published);
    assert_eq!(handled.entity_key.as_deref(), Some(ORDER));
    assert_eq!(
        pipeline.deliver(first).await.unwrap().outcome,
        Outcome::Duplicate
    );
    let taken = broker.taken();
    assert_eq!(taken.len(), 1, "{taken:?}");
    let record = &taken[0];
    assert_eq!(*record.topic, *orders(&pipeline));
    assert_eq!(record.key, ORDER);
    assert!(record.payload.is_some());
    assert_eq!(header(record, HEADER_DELIVERY_ID), "d-1");
    // What a rebuild reads back is what the ledger holds.
    let from_headers = state_from_headers(
        header(record, HEADER_VERSION).as_bytes(),
        header(record, HEADER_STATE_HASH).as_bytes(),
    );
    assert_eq!(from_headers, order_state(&pipeline).await);
    assert!(from_headers.is_some());
    assert_eq!(
        pipeline.ledger().begin(&key("d-1")).await.unwrap(),
        Begin::Done
    );
}

#[tokio::test]
async fn copies_of_one_delivery_at_once_write_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_secs(5)).await;
    broker.hold();
    let copy = delivery("d-8", "d-8", "2026-11-29T11:00:00Z");
    let copies: Vec<_> = (0..8).map(|_| spawned(&pipeline, copy.clone())).collect();
    // One copy's record is in flight; the others wait for its outcome.
    broker.arrivals(1).await;
    broker.release();
    let mut outcomes: Vec<Outcome> = join_all(copies)
        .await
        .into_iter()
        .map(|copy| copy.unwrap().unwrap().outcome)
        .collect();
    outcomes.sort_by_key(|outcome| outcome.as_str());
    let mut expected = vec![Outcome::Duplicate; 7];
    expected.push(Outcome::Published);
    expected.sort_by_key(|outcome| outcome.as_str());
    assert_eq!(outcomes, expected);
    assert_eq!(broker.taken().len(), 1);
}

#[tokio::test]
async fn an_older_event_after_a_newer_one_writes_nothing_and_the_newest_stays_last() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    for (id, at, outcome) in [
        ("d-b", "2026-11-29T11:30:00Z", Outcome::Published),
        ("d-a", "2026-11-29T11:00:00Z", Outcome::Stale),
        ("d-c", "2026-11-29T11:45:00Z", Outcome::Published),
    ] {
        let handled = pipeline.deliver(delivery(id, id, at)).await.unwrap();
        assert_eq!(handled.outcome, outcome, "{id}");
    }
    let ids = delivery_ids(&broker);
    assert_eq!(ids, ["d-b", "d-c"]);
}

/// A record whose acknowledgement is lost may be in the topic: its state is
/// kept in doubt, so an older event of its entity is stale instead of
/// landing after it, and the delivery's retry publishes it again (one more
/// copy at most). Found by the simulation (seed 10).
#[tokio::test]
async fn a_record_in_doubt_holds_back_older_events_and_its_retry_publishes_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let mut faults = vec![Fault::LoseAck];
    broker.plan(move |_| faults.pop().unwrap_or(Fault::Take));
    let newer = delivery("d-new", "d-new", "2026-11-29T11:30:00Z");
    let error = pipeline.deliver(newer.clone()).await.unwrap_err();
    assert!(error.is_retryable(), "{error}");
    let older = pipeline
        .deliver(delivery("d-old", "d-old", "2026-11-29T11:00:00Z"))
        .await
        .unwrap();
    assert_eq!(
        older.outcome,
        Outcome::Stale,
        "nothing lands after the record in doubt"
    );
    assert_eq!(
        pipeline.deliver(newer.clone()).await.unwrap().outcome,
        Outcome::Published,
        "the retry writes the state in doubt again"
    );
    assert_eq!(
        pipeline.deliver(newer).await.unwrap().outcome,
        Outcome::Duplicate
    );
    let ids = delivery_ids(&broker);
    assert_eq!(ids, ["d-new", "d-new"]);
}

/// Events of one entity arriving together, in any order, are written one at
/// a time under the entity's lock: the records' versions only ever rise, so
/// the newest is the last and no older state follows a newer one.
#[tokio::test]
async fn events_of_one_entity_at_once_never_write_an_older_state_after_a_newer() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let minutes = [7, 2, 9, 0, 5, 8, 1, 6, 3, 4];
    let deliveries = minutes.map(|minute| {
        let id = format!("d-{minute}");
        let at = format!("2026-11-29T11:{minute:02}:00Z");
        spawned(&pipeline, delivery(&id, &id, &at))
    });
    for delivered in join_all(deliveries).await {
        let outcome = delivered.unwrap().unwrap().outcome;
        assert!(
            matches!(outcome, Outcome::Published | Outcome::Stale),
            "{outcome:?}"
        );
    }
    let versions: Vec<String> = broker
        .taken()
        .iter()
        .map(|record| header(record, HEADER_VERSION).to_owned())
        .collect();
    let parsed: Vec<(i64, u32)> = versions
        .iter()
        .map(|version| {
            let (at, rank) = version.split_once(':').unwrap();
            (at.parse().unwrap(), rank.parse().unwrap())
        })
        .collect();
    assert!(
        parsed.windows(2).all(|pair| pair[0] < pair[1]),
        "versions in the order written: {versions:?}"
    );
    let last = broker.taken().pop().unwrap();
    assert_eq!(header(&last, HEADER_DELIVERY_ID), "d-9");
}

/// A delivery whose answer deadline passes while Kafka holds its record is
/// answered "try again", but the record's acknowledgement is still
/// committed: the provider's retry finds the delivery done instead of
/// writing the same state a second time.
#[tokio::test]
async fn a_record_taken_after_its_answer_deadline_is_committed_and_not_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(200)).await;
    broker.hold();
    // Each attempt is a request of its own, its budget counted from its arrival.
    let late = || delivery("d-late", "d-late", "2026-11-29T11:00:00Z");
    let error = pipeline.deliver(late()).await.unwrap_err();
    assert!(matches!(error, PipelineError::DeadlinePassed), "{error:?}");
    assert!(error.is_retryable());
    // While the record is in flight its delivery is too.
    let error = pipeline.deliver(late()).await.unwrap_err();
    assert!(matches!(error, PipelineError::InFlight), "{error:?}");
    broker.release();
    assert_eq!(
        pipeline.deliver(late()).await.unwrap().outcome,
        Outcome::Duplicate,
        "the late record was committed"
    );
    assert_eq!(broker.taken().len(), 1);
    assert!(order_state(&pipeline).await.is_some());
}

/// A caller that goes away (the client hung up) while its record is on the
/// way does not cancel the delivery: the acknowledgement is committed, the
/// entity's lock held until then, so an older event of the entity is stale
/// and the retry is a duplicate.
#[tokio::test]
async fn a_delivery_whose_caller_went_away_mid_publish_is_committed_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.hold();
    let newer = delivery("d-new", "d-new", "2026-11-29T11:20:00Z");
    let caller = spawned(&pipeline, newer.clone());
    broker.arrivals(1).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    broker.release();
    let older = delivery("d-old", "d-old", "2026-11-29T11:10:00Z");
    assert_eq!(
        pipeline.deliver(older).await.unwrap().outcome,
        Outcome::Stale
    );
    assert_eq!(
        pipeline.deliver(newer).await.unwrap().outcome,
        Outcome::Duplicate
    );
    assert_eq!(broker.taken().len(), 1);
}

/// What the ingress hands over with a delivery (its place in the source's
/// fair share) is held until the delivery's outcome, not until its caller
/// goes away: a provider that hangs up does not free its place while its
/// record is still on the way.
#[tokio::test]
async fn what_a_delivery_holds_is_kept_until_its_outcome_when_its_caller_went_away() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.hold();
    let place = Arc::new(());
    let caller = {
        let pipeline = pipeline.clone();
        let held = place.clone();
        let delivery = delivery("d-held", "d-held", "2026-11-29T11:20:00Z");
        tokio::spawn(async move { pipeline.deliver_holding(delivery, held).await })
    };
    broker.arrivals(1).await;
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    assert_eq!(Arc::strong_count(&place), 2, "let go with the caller");
    broker.release();
    pipeline.finish_deliveries(Duration::from_secs(5)).await;
    assert_eq!(Arc::strong_count(&place), 1, "kept past the outcome");
    assert!(order_state(&pipeline).await.is_some());
}

#[tokio::test]
async fn a_send_that_failed_leaves_the_delivery_to_its_retry_which_writes_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.fail_next(RDKafkaErrorCode::NotEnoughReplicas);
    let attempt = delivery("d-r", "d-r", "2026-11-29T11:00:00Z");
    let error = pipeline.deliver(attempt.clone()).await.unwrap_err();
    assert!(
        matches!(error, PipelineError::Publish(PublishError::Unavailable(_))),
        "{error:?}"
    );
    assert!(error.is_retryable());
    assert_eq!(order_state(&pipeline).await, None);
    assert_eq!(
        pipeline.deliver(attempt).await.unwrap().outcome,
        Outcome::Published
    );
    assert_eq!(broker.taken().len(), 1);
}

/// A record the broker refuses for good (retrying the same bytes cannot
/// help) is dead-lettered with why, and its delivery is done: 2xx, so
/// neither provider counts a failure; the reason code says which refusal.
#[tokio::test]
async fn a_record_refused_for_good_is_dead_lettered_with_its_reason_and_done() {
    for (code, reason) in [
        (RDKafkaErrorCode::InvalidRecord, "publish_refused"),
        (RDKafkaErrorCode::InvalidTimestamp, "timestamp_refused"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
        broker.fail_next(code);
        let refused = delivery("d-x", "d-x", "2026-11-29T11:00:00Z");
        let handled = pipeline.deliver(refused.clone()).await.unwrap();
        assert_eq!(handled.outcome, Outcome::DeadLettered, "{code:?}");
        assert_eq!(handled.dead_letter_reason, Some(reason), "{code:?}");
        let taken = broker.taken();
        assert_eq!(taken.len(), 1, "{code:?}: {taken:?}");
        assert_eq!(*taken[0].topic, *dead_letters(&pipeline));
        assert_eq!(header(&taken[0], HEADER_REASON_CODE), reason);
        assert_eq!(order_state(&pipeline).await, None, "no state written");
        assert_eq!(
            pipeline.deliver(refused).await.unwrap().outcome,
            Outcome::Duplicate
        );
    }
}

/// A dead letter larger than its topic takes is cut to fit, its body's
/// whole length, hash and the topic's limit in headers, and its delivery is
/// done: a 5xx on every attempt would pause a Mekari endpoint.
#[tokio::test]
async fn a_dead_letter_too_large_for_its_topic_is_cut_to_what_it_takes() {
    const LIMIT: usize = 4096;
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.limit(&dead_letters(&pipeline), LIMIT);
    let body = format!("not json: {}", "x".repeat(3 * LIMIT)).into_bytes();
    let handled = pipeline
        .deliver(delivery_of("d-big", body.clone()))
        .await
        .unwrap();
    assert_eq!(handled.outcome, Outcome::DeadLettered);
    let taken = broker.taken();
    assert_eq!(taken.len(), 1, "{taken:?}");
    let letter = &taken[0];
    let kept = letter.payload.as_deref().unwrap_or_default();
    assert!(
        !kept.is_empty() && kept.len() < LIMIT,
        "{} bytes kept",
        kept.len()
    );
    assert_eq!(kept, &body[..kept.len()], "the body's head");
    assert_eq!(header(letter, HEADER_BODY_BYTES), body.len().to_string());
    assert_eq!(
        header(letter, HEADER_BODY_SHA256),
        hex::encode(Sha256::digest(&body))
    );
    assert_eq!(header(letter, HEADER_REASON_CODE), "invalid_json");
    let why = header(letter, HEADER_CUT_REASON);
    assert!(why.contains(&LIMIT.to_string()), "the topic's limit: {why}");
    assert_eq!(
        pipeline.ledger().begin(&key("d-big")).await.unwrap(),
        Begin::Done
    );
}

/// A dead letter Kafka takes after its delivery was spooled at the work
/// deadline is committed when it is taken, so the spool's replay finds the
/// delivery done instead of writing the letter a second time.
#[tokio::test]
async fn a_dead_letter_taken_after_its_delivery_was_spooled_is_not_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.hold();
    let junk = spooling(delivery_of("d-junk", b"not json".to_vec()));
    assert_eq!(
        pipeline.deliver(junk.clone()).await.unwrap().outcome,
        Outcome::Spooled
    );
    broker.release();
    assert_eq!(
        pipeline.replay(junk).await.unwrap(),
        Outcome::Duplicate,
        "the late letter was committed"
    );
    assert_eq!(broker.taken_on(&dead_letters(&pipeline)).len(), 1);
}

/// What was spooled while no broker answered is published once by its
/// replay, and the provider's retry of it afterwards is a duplicate.
#[tokio::test]
async fn a_spooled_delivery_is_published_once_by_its_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.go_down();
    let spooled = spooling(delivery("d-sp", "d-sp", "2026-11-29T11:00:00Z"));
    assert_eq!(
        pipeline.deliver(spooled.clone()).await.unwrap().outcome,
        Outcome::Spooled
    );
    broker.recover();
    assert_eq!(
        pipeline.replay(spooled.clone()).await.unwrap(),
        Outcome::Published
    );
    assert_eq!(
        pipeline.deliver(spooled).await.unwrap().outcome,
        Outcome::Duplicate
    );
    assert_eq!(broker.taken().len(), 1);
}

/// The reconciler's record goes down the same line: once it is written, the
/// webhook's delivery of the same state writes nothing.
#[tokio::test]
async fn a_reconciled_state_and_the_same_state_by_webhook_write_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let webhook = delivery("d-w", "d-w", "2026-11-29T11:00:00Z");
    let (_, envelope) = super::identify(&webhook).unwrap();
    let mut reconciled = pipeline.normalize(&webhook, envelope).unwrap();
    reconciled.event.origin = Origin::Reconciler;
    assert_eq!(
        pipeline.apply(reconciled).await.unwrap(),
        Outcome::Published
    );
    assert_eq!(
        pipeline.deliver(webhook).await.unwrap().outcome,
        Outcome::Unchanged
    );
    assert_eq!(broker.taken().len(), 1);
}

/// Per-key order without other keys waiting: while one order's record
/// waits for its acknowledgement (the entity's turn held across the broker's
/// round trip), five thousand other orders are each published at once.
/// With the entity locks striped over 1024 stripes, one of them would have
/// shared the held order's stripe (all but certainly: 1 - (1023/1024)^5000)
/// and waited out its answer budget.
#[tokio::test(start_paused = true)]
async fn one_key_waiting_for_its_acknowledgement_holds_up_no_other_key() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    broker.plan(|record| {
        if record.header(HEADER_DELIVERY_ID) == Some("d-held") {
            Fault::Late(Duration::from_secs(3600))
        } else {
            Fault::Take
        }
    });
    let held = spawned(
        &pipeline,
        delivery("d-held", "d-held", "2026-11-29T11:00:00Z"),
    );
    broker.arrivals(1).await;
    let started = Instant::now();
    for n in 0..5_000 {
        let body = serde_json::to_vec(&json!({
            "id": format!("d-{n}"), "event": "order.updated",
            "occurred_at": "2026-11-29T11:00:00Z",
            "data": {"id": format!("ORD-other-{n}"), "status": "paid", "total": 10}
        }))
        .unwrap();
        let handled = pipeline
            .deliver(delivery_of(&format!("d-{n}"), body))
            .await
            .unwrap_or_else(|error| panic!("order {n} waited for another key: {error}"));
        assert_eq!(handled.outcome, Outcome::Published);
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no delivery waited on the clock"
    );
    assert!(!held.is_finished(), "the held order is still in flight");
    // Its own next event waits for its turn.
    let next = spawned(
        &pipeline,
        delivery("d-held-2", "d-held-2", "2026-11-29T11:05:00Z"),
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !next.is_finished(),
        "the same order's next event did not wait"
    );
}

/// A source with topics of its own (`topic_prefix`) has its states and
/// its dead letters there, and nothing in the shared topics.
#[tokio::test]
async fn a_source_with_its_own_topics_writes_its_states_and_letters_there_only() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let own = |mut delivery: Delivery| {
        let mut source = Source::clone(&delivery.source);
        source.topic_prefix = Some("acme.".into());
        delivery.source = Arc::new(source);
        delivery
    };
    let state = own(delivery("d-1", "d-1", "2026-11-29T11:00:00Z"));
    assert_eq!(
        pipeline.deliver(state).await.unwrap().outcome,
        Outcome::Published
    );
    let junk = own(delivery_of("d-junk", b"not json".to_vec()));
    assert_eq!(
        pipeline.deliver(junk).await.unwrap().outcome,
        Outcome::DeadLettered
    );
    let topics: Vec<String> = broker
        .taken()
        .into_iter()
        .map(|r| r.topic.to_string())
        .collect();
    assert_eq!(topics, ["acme.orders", "acme-dead-letter"]);
    assert_ne!(orders(&pipeline), "acme.orders");
}

/// A record's state derived again takes its place only while the ledger
/// holds the state that record wrote: over a newer state (a webhook that
/// arrived meanwhile) it is stale and nothing is written; in its place it
/// is published at the record's version, its new state the entity's.
#[tokio::test]
async fn a_state_derived_again_replaces_its_record_only_while_the_ledger_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = taking(dir.path(), Duration::from_millis(100)).await;
    let at = datetime!(2026-11-29 11:00 UTC);
    let event = order_event(Origin::Webhook, at);
    written(&pipeline, &event).await;
    let recorded = order_state(&pipeline).await.unwrap();
    let mut derived = event.clone();
    derived.status = Some("refunded".into());
    let newer = EntityState {
        version: Version::new(datetime!(2026-11-29 12:00 UTC), 0),
        ..recorded
    };
    assert_eq!(
        pipeline
            .rederive(unnormalized(derived.clone()), newer)
            .await
            .unwrap(),
        Outcome::Stale,
        "not the state the ledger holds"
    );
    assert!(broker.taken().is_empty());
    assert_eq!(
        pipeline
            .rederive(unnormalized(derived.clone()), recorded)
            .await
            .unwrap(),
        Outcome::Published
    );
    let now = order_state(&pipeline).await.unwrap();
    assert_eq!(now.version, recorded.version, "at the record's version");
    assert_ne!(now.state_hash, recorded.state_hash);
    assert_eq!(
        pipeline
            .rederive(unnormalized(derived), recorded)
            .await
            .unwrap(),
        Outcome::Stale,
        "replaced already"
    );
    assert_eq!(broker.taken().len(), 1);
}
