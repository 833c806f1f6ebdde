//! The drainer's tests: its back-off, what stays in the spool, the order
//! it publishes in, and a spool damaged on disk.

use super::*;
use crate::adapters::spool::SpooledDelivery;
use crate::domain::event::{ProviderKind, Source};

#[test]
fn a_ledger_that_cannot_answer_sets_no_spooled_entry_aside() {
    use crate::adapters::ledger::LedgerError;
    assert!(!about_the_entry(&PipelineError::Ledger(
        LedgerError::Closed
    )));
    assert!(!about_the_entry(&PipelineError::Ledger(
        LedgerError::Unwritable {
            reason: "OOM command not allowed".into()
        }
    )));
    assert!(about_the_entry(&PipelineError::DeliveryIdMismatch));
}

#[test]
fn a_slow_or_short_of_replicas_broker_sets_no_spooled_entry_aside_a_denied_topic_does() {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let produce = |code| KafkaError::MessageProduction(code);
    for transient in [
        PublishError::Unavailable(produce(RDKafkaErrorCode::NotEnoughReplicas)),
        PublishError::Unavailable(produce(RDKafkaErrorCode::RequestTimedOut)),
        PublishError::DeadlinePassed,
        PublishError::BrokerDown,
    ] {
        assert!(
            !about_the_entry(&PipelineError::Publish(transient)),
            "a broker condition counted against the entry"
        );
    }
    assert!(!about_the_entry(&PipelineError::DeadlinePassed));
    assert!(about_the_entry(&PipelineError::Publish(
        PublishError::Denied(produce(RDKafkaErrorCode::TopicAuthorizationFailed))
    )));
}
#[test]
fn passes_the_spool_stops_wait_twice_as_long_each_time_up_to_the_cap() {
    let mut stops = SpoolStops::default();
    assert!(stops.may_pass());
    let error = SpoolError::Unwritable {
        reason: "No space left on device".into(),
    };
    for attempt in 0..12 {
        let before = Instant::now();
        stops.stopped(&error);
        let wait = stops.next_pass.unwrap() - before;
        let base = (IDLE * 2u32.pow(attempt)).min(SPOOL_BACKOFF_MAX / 2);
        assert!(
            wait >= base && wait <= base * 2 + Duration::from_millis(50),
            "attempt {attempt}: waited {wait:?}, base {base:?}"
        );
        assert!(!stops.may_pass());
    }
    stops.healed();
    assert!(stops.may_pass(), "a healed spool is drained at once");
    stops.stopped(&error);
    stops.passed();
    stops.stopped(&error);
    let wait = stops.next_pass.unwrap() - Instant::now();
    assert!(
        wait <= IDLE * 2,
        "a pass that worked starts the back-off over: {wait:?}"
    );
}

/// A record's delivery id.
fn delivery_id(record: &crate::adapters::publish::OutgoingRecord) -> &str {
    record
        .header(crate::services::pipeline::HEADER_DELIVERY_ID)
        .unwrap()
}

/// Spools one Mekari delivery per id, each a newer state of order
/// `O-1` than the one before.
async fn spool_orders(spool: &Spool, ids: &[&str]) {
    for (minute, id) in ids.iter().enumerate() {
        let body = format!(
            r#"{{"id":"{id}","event":"order.updated","occurred_at":"2026-11-29T10:{minute:02}:00Z","data":{{"id":"O-1"}}}}"#
        );
        spool
            .append(&SpooledDelivery {
                key: crate::domain::event::DeliveryKey::new(ProviderKind::Mekari, id),
                source: Source {
                    provider: ProviderKind::Mekari,
                    name: "main".into(),
                    account: None,
                    topic_prefix: None,
                },
                delivery_id: (*id).into(),
                received_at: OffsetDateTime::now_utc(),
                body: bytes::Bytes::from(body),
            })
            .await
            .unwrap();
    }
}

/// Counts that say entries the spool's file does not hold make every pass
/// find none: the drainer waits between such passes instead of passing
/// again at once for ever without yielding (a core at 100 %, and a
/// simulated world whose clock never moves).
#[tokio::test]
async fn passes_that_find_nothing_the_counts_say_wait() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, _broker) =
        Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    let spool = pipeline.spool().unwrap().clone();
    spool.miscount(3);
    let drainer = Drainer::new(pipeline, spool.clone());
    // Ten seconds of a paused clock, which moves only while the drainer
    // waits; on a thread and a runtime of its own, so a drainer that never
    // yields fails this test instead of holding its runtime for ever.
    let running = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(async {
                let never = CancellationToken::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), drainer.run(never)).await;
            });
    });
    let asked = Instant::now();
    while !running.is_finished() && asked.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        running.is_finished(),
        "the drainer passed again and again without waiting: ten seconds of its clock never passed"
    );
    assert_eq!(spool.stats().entries, 3, "nothing the file holds was taken");
}

/// Without a broker a pass stops at the first entry and keeps it (and
/// everything after it) for the next pass.
#[tokio::test]
async fn what_kafka_cannot_take_stays_in_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    broker.go_down();
    let spool = pipeline.spool().unwrap().clone();
    spool_orders(&spool, &["k-1", "k-2"]).await;
    let drainer = Drainer::new(pipeline, spool.clone());
    let error = drainer.drain_all().await.unwrap_err();
    assert!(matches!(error, DrainError::Pipeline(_)), "{error}");
    assert_eq!(spool.stats().entries, 2);
    assert_eq!(spool.delivery_ids(), ["k-1", "k-2"], "kept, in order");
}

/// With a broker that takes them, a pass publishes every entry once, an
/// entity's in the order spooled, and empties the spool.
#[tokio::test]
async fn a_pass_publishes_the_spool_in_order_and_empties_it() {
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    let spool = pipeline.spool().unwrap().clone();
    spool_orders(&spool, &["k-1", "k-2", "k-3"]).await;
    let drainer = Drainer::new(pipeline, spool.clone());
    drainer.drain_all().await.unwrap();
    assert_eq!(spool.stats().entries, 0);
    let ids: Vec<String> = broker
        .taken()
        .iter()
        .map(|record| format!("{}/{}", record.key, delivery_id(record)))
        .collect();
    assert_eq!(ids, ["mekari:O-1/k-1", "mekari:O-1/k-2", "mekari:O-1/k-3"]);
    assert_eq!(drainer.drain_all().await.unwrap().entries, 0);
    assert_eq!(broker.taken().len(), 3, "nothing twice");
}

/// The issue's case, end to end: three ReceiptRoller sales spooled
/// during an outage, posbridge stopped, one byte of one body changed on
/// disk (a total 4321 → 9321). posbridge starts (the spool set aside and
/// salvaged), and the two intact sales reach the topic; the changed one
/// does not, as what it was or as what it became.
#[tokio::test]
async fn the_intact_sales_of_a_spool_damaged_on_disk_reach_the_topic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let spool = Spool::open(&crate::config::SpoolConfig {
            path: dir.path().join("spool.redb"),
            max_bytes: 1 << 20,
            max_entries: 3,
        })
        .unwrap();
        for (n, total) in [(1, 1200), (2, 4321), (3, 5000)] {
            let id = format!("sale-{n}");
            let body = serde_json::json!({
                "id": id, "type": "sale.created", "timestamp": "2026-11-29T10:15:30Z",
                "webhook_id": "wh_1",
                "data": {"id": format!("T1|2026-11|{n}"), "terminal_id": "T001", "store_id": "S01",
                         "transaction_id": "000123", "transaction_type": 1,
                         "transaction_at": "2026-11-29T10:15:29Z", "currency": "JPY",
                         "sub_total": total - total / 11, "tax_total": total / 11, "grand_total": total,
                         "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 250}]}
            });
            spool
                .append(&SpooledDelivery {
                    key: crate::domain::event::DeliveryKey::new(ProviderKind::ReceiptRoller, &id),
                    source: Source {
                        provider: ProviderKind::ReceiptRoller,
                        name: "main".into(),
                        account: None,
                        topic_prefix: None,
                    },
                    delivery_id: id,
                    received_at: OffsetDateTime::now_utc(),
                    body: serde_json::to_vec(&body).unwrap().into(),
                })
                .await
                .unwrap();
        }
    }
    let path = dir.path().join("spool.redb");
    let bytes = std::fs::read(&path).unwrap();
    let mut changed = bytes.clone();
    let mut copies = 0;
    for at in memchr::memmem::find_iter(&bytes, b"4321") {
        changed[at] = b'9';
        copies += 1;
    }
    assert!(copies > 0);
    std::fs::write(&path, &changed).unwrap();

    let (pipeline, broker) = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    let spool = pipeline.spool().unwrap().clone();
    Drainer::new(pipeline, spool.clone())
        .drain_all()
        .await
        .unwrap();
    let mut ids: Vec<String> = broker
        .taken()
        .iter()
        .map(|record| delivery_id(record).to_owned())
        .collect();
    // Two entities, two lanes: either may publish first.
    ids.sort();
    assert_eq!(ids, ["sale-1", "sale-3"]);
    assert_eq!(spool.stats().entries, 0);
}
