use redb::Database;

use super::tables::{DONE, ENTITIES, SWEEP_PER_COMMIT, Sweep, Write, done_value, write_batch};
use super::*;
use crate::adapters::ledger::{Done, Store, WallClock};
use crate::domain::event::{EntityKey, EntityType, ProviderKind, Version};

fn open(dir: &tempfile::TempDir) -> EmbeddedLedger {
    EmbeddedLedger::open(
        &dir.path().join("ledger.redb"),
        Duration::from_secs(3600),
        Duration::from_secs(10),
    )
    .unwrap()
}

async fn mark_done(ledger: &EmbeddedLedger, id: &DeliveryKey) {
    ledger
        .commit(&Commit {
            delivery: Some(Done::published_now(id.clone())),
            ..Commit::NOTHING
        })
        .await
        .unwrap();
}

/// A delivery id, an entity slot and a state of it.
fn sample() -> (DeliveryKey, EntitySlot, EntityState) {
    let slot = EntitySlot::new(
        EntityType::Order,
        &EntityKey::new(ProviderKind::Mekari, None, "O-1"),
    );
    let state = EntityState {
        version: Version {
            at_micros: 42,
            rank: 1,
        },
        state_hash: [3; 16],
    };
    (DeliveryKey::new(ProviderKind::Mekari, "e1"), slot, state)
}

/// Whether the file (not memory) holds `slot`'s state.
fn in_file(ledger: &EmbeddedLedger, slot: &EntitySlot) -> bool {
    let opened = ledger.store.get().unwrap();
    let txn = opened.db.begin_read().unwrap();
    let table = txn.open_table(ENTITIES).unwrap();
    table.get(slot.as_str()).unwrap().is_some()
}

/// A ledger of `dir`'s file, opened again: the last handle's drop wrote
/// its last checkpoint and let go of the file before it returned.
async fn reopen(dir: &tempfile::TempDir) -> EmbeddedLedger {
    EmbeddedLedger::open(
        &dir.path().join("ledger.redb"),
        Duration::from_secs(3600),
        Duration::from_secs(10),
    )
    .unwrap_or_else(|error| panic!("the ledger does not open again: {error}"))
}

/// The last handle's drop returns once its thread has checkpointed what
/// memory held and closed the file: a stopped app's file opens at once
/// (`ledger check` right after a stop was refused "in use" by this
/// process's own closing thread, now and then).
#[tokio::test]
async fn the_last_handles_drop_checkpoints_and_lets_go_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (id, _, _) = sample();
    for _ in 0..20 {
        let ledger = open(&dir);
        let kept = ledger.clone();
        mark_done(&ledger, &id).await;
        drop(ledger);
        // Another handle keeps it open.
        assert!(open_again(&dir).is_err_and(|error| error.is_held_elsewhere()));
        drop(kept);
        let reopened = open_again(&dir).expect("the file is let go with the last handle");
        assert_eq!(reopened.begin(&id).await.unwrap(), Begin::Done);
    }
}

fn open_again(dir: &tempfile::TempDir) -> Result<EmbeddedLedger, LedgerError> {
    EmbeddedLedger::open(
        &dir.path().join("ledger.redb"),
        Duration::from_secs(3600),
        Duration::from_secs(10),
    )
}

#[tokio::test]
async fn a_delivery_is_new_then_in_flight_then_done() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let id = DeliveryKey::new(ProviderKind::Mekari, "e1");
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::InFlight);
    mark_done(&ledger, &id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
}

#[tokio::test]
async fn a_done_delivery_can_be_leased_again_but_not_while_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let id = DeliveryKey::new(ProviderKind::Mekari, "e1");
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
    assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::InFlight);
    mark_done(&ledger, &id).await;
    assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::New);
    assert_eq!(
        ledger.begin(&id).await.unwrap(),
        Begin::InFlight,
        "a live delivery of the same id waits for the lease"
    );
    ledger.release(&id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
}

#[tokio::test]
async fn a_released_delivery_can_be_taken_again() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let id = DeliveryKey::new(ProviderKind::ReceiptRoller, "d1");
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
    ledger.release(&id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
}

#[tokio::test]
async fn done_ids_and_entity_versions_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (id, slot, state) = sample();
    {
        let ledger = open(&dir);
        ledger.begin(&id).await.unwrap();
        ledger
            .commit(&Commit {
                delivery: Some(Done::published_now(id.clone())),
                entity: Some((slot.clone(), Held::unplaced(state))),
                checkpoint: Some(("mekari/main/orders".into(), 1234)),
                placed: None,
            })
            .await
            .unwrap();
    }
    let reopened = reopen(&dir).await;
    assert_eq!(reopened.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(
        reopened.entity(&slot).await.unwrap(),
        Some(Held::unplaced(state))
    );
    assert_eq!(
        reopened.checkpoint("mekari/main/orders").await.unwrap(),
        Some(1234)
    );
}

#[tokio::test]
async fn expired_ids_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = EmbeddedLedger::open(
        &dir.path().join("l.redb"),
        Duration::ZERO,
        Duration::from_secs(10),
    )
    .unwrap();
    let id = DeliveryKey::new(ProviderKind::Mekari, "e1");
    ledger.begin(&id).await.unwrap();
    mark_done(&ledger, &id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
}

/// Between checkpoints, writes are in memory: every read finds them
/// there, and a checkpoint moves them to the file.
#[tokio::test]
async fn reads_find_writes_waiting_for_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = EmbeddedLedger::open_with(
        &dir.path().join("ledger.redb"),
        Duration::from_secs(3600),
        Duration::from_secs(10),
        Duration::from_secs(3600),
    )
    .unwrap();
    let (id, slot, state) = sample();
    ledger
        .commit(&Commit {
            delivery: Some(Done::published_now(id.clone())),
            entity: Some((slot.clone(), Held::unplaced(state))),
            checkpoint: Some(("mekari/main/orders".into(), 7)),
            placed: None,
        })
        .await
        .unwrap();
    assert!(!in_file(&ledger, &slot), "no checkpoint yet");
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(
        ledger.entity(&slot).await.unwrap(),
        Some(Held::unplaced(state))
    );
    assert_eq!(
        ledger.checkpoint("mekari/main/orders").await.unwrap(),
        Some(7)
    );

    ledger.persist().await.unwrap();
    assert!(in_file(&ledger, &slot));
    assert_eq!(ledger.store.recent(|r| Some(r.len())), Some(0));
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(
        ledger.entity(&slot).await.unwrap(),
        Some(Held::unplaced(state))
    );
}

/// A checkpoint records the offsets of the records whose state it holds,
/// and none of a send still in flight: the next start reads the topics
/// from there.
#[tokio::test]
async fn a_checkpoint_records_the_offsets_of_finished_sends_only() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let (id, slot, state) = sample();
    let slow = ledger.sending();
    let fast = ledger.sending();
    ledger
        .commit(&Commit {
            delivery: Some(Done::published_now(id)),
            entity: Some((slot, Held::unplaced(state))),
            placed: Some(fast.placed(crate::domain::record_at::RecordAt::new("pos.orders", 2, 41))),
            ..Commit::NOTHING
        })
        .await
        .unwrap();
    ledger.persist().await.unwrap();
    assert_eq!(
        ledger.cached().await.unwrap().unwrap().offsets,
        Offsets::new(),
        "the slow send may lie below 41"
    );
    ledger
        .commit(&Commit {
            placed: Some(slow.placed(crate::domain::record_at::RecordAt::new("pos.orders", 2, 40))),
            ..Commit::NOTHING
        })
        .await
        .unwrap();
    ledger.persist().await.unwrap();
    drop(ledger);
    let offsets = reopen(&dir).await.cached().await.unwrap().unwrap().offsets;
    assert_eq!(offsets.get(&("pos.orders".to_owned(), 2)), Some(&42));
}

/// The redo log and its table that earlier versions kept are removed when
/// the file is opened: what they held is in the topics, and a file without
/// offsets is read from the topics' beginning.
#[tokio::test]
async fn an_earlier_versions_redo_log_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(tables::OLD_REDO)
            .unwrap()
            .insert("covered", 3)
            .unwrap();
        txn.commit().unwrap();
    }
    let wal = store::old_redo_log(&path);
    std::fs::write(&wal, b"frames").unwrap();
    let ledger = open(&dir);
    assert!(!wal.exists());
    assert_eq!(
        ledger.cached().await.unwrap(),
        Some(Cached::default()),
        "no offsets, no topics"
    );
}

#[tokio::test]
async fn the_sweep_forgets_expired_ids_a_few_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path().join("l.redb")).unwrap();
    let ids = |prefix: &str, n: usize| -> Vec<String> {
        (0..n).map(|n| format!("{prefix}{n:04}")).collect()
    };
    let done = |ids: &[String], expires| -> Vec<(String, u64)> {
        ids.iter().map(|id| (id.clone(), expires)).collect()
    };
    let write = |db: &Database, done: &[(String, u64)], sweep: &mut Sweep, now| {
        let values: Vec<Vec<u8>> = done
            .iter()
            .map(|(_, at)| {
                done_value(
                    *at,
                    &Done::published_now(DeliveryKey::from_stored(String::new())).answered,
                )
            })
            .collect();
        let writes: Vec<Write<'_>> = done
            .iter()
            .zip(&values)
            .map(|((id, _), value)| Write::Done(id, value))
            .collect();
        write_batch(db, &writes, &Offsets::new(), None, sweep, now).unwrap()
    };
    let t0 = 1_000_000;
    let expiring = done(&ids("p", SWEEP_PER_COMMIT * 2 + 50), t0 + 1);
    assert_eq!(write(&db, &expiring, &mut Sweep::default(), t0), 0);
    // Ids kept for an hour, after the expiring ones in key order.
    let kept = done(&ids("q", 10), t0 + 3600);
    write(&db, &kept, &mut Sweep::default(), t0);
    // Two seconds later the first lot has expired.
    let mut sweep = Sweep::default();
    let swept: Vec<usize> = (0..4)
        .map(|_| write(&db, &[], &mut sweep, t0 + 2))
        .collect();
    assert_eq!(swept, [SWEEP_PER_COMMIT, SWEEP_PER_COMMIT, 50, 0]);
    let txn = db.begin_read().unwrap();
    use redb::ReadableTableMetadata;
    assert_eq!(txn.open_table(DONE).unwrap().len().unwrap(), 10);
}

/// What a rebuild restores (offsets and the topics they are of) is kept by
/// the next checkpoint; forgetting the topics empties memory and the file.
#[tokio::test]
async fn the_topics_seen_are_kept_with_the_offsets_and_forgotten_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let (id, slot, state) = sample();
    ledger
        .commit(&Commit {
            delivery: Some(Done::published_now(id.clone())),
            entity: Some((slot.clone(), Held::unplaced(state))),
            checkpoint: Some(("reconcile".to_owned(), 7)),
            ..Commit::NOTHING
        })
        .await
        .unwrap();
    let offsets = Offsets::from([(("pos.orders".to_owned(), 0), 12)]);
    let seen = TopicsSeen {
        cluster: Some("cluster-a".to_owned()),
        topics: [(
            "pos.orders".to_owned(),
            crate::adapters::ledger::TopicSeen {
                id: Some("id-1".to_owned()),
                partitions: Some(2),
            },
        )]
        .into(),
    };
    ledger.restore(&offsets, &seen);
    ledger.persist().await.unwrap();
    drop(ledger);
    let ledger = reopen(&dir).await;
    assert_eq!(
        ledger.cached().await.unwrap(),
        Some(Cached {
            offsets,
            topics: Some(seen)
        })
    );
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    ledger.forget_topics().await.unwrap();
    assert_eq!(ledger.cached().await.unwrap(), Some(Cached::default()));
    assert_eq!(ledger.entity(&slot).await.unwrap(), None);
    assert_eq!(ledger.checkpoint("reconcile").await.unwrap(), None);
    drop(ledger);
    let ledger = reopen(&dir).await;
    assert_eq!(ledger.cached().await.unwrap(), Some(Cached::default()));
    assert_eq!(
        ledger.begin(&id).await.unwrap(),
        Begin::New,
        "forgotten for good"
    );
}

/// A done delivery is remembered with what it was answered and where its
/// record lies: from memory, and from the file after a checkpoint and a
/// restart; a lease held is in flight; an unknown id is nothing.
#[tokio::test]
async fn a_done_delivery_is_remembered_with_its_answer() {
    use crate::adapters::ledger::{Answered, Recorded, Remembered};
    use crate::domain::record_at::RecordAt;
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let (id, slot, state) = sample();
    let answered = Answered {
        outcome: Recorded::Published,
        at_micros: 1_764_000_000_000_001,
        place: Some(RecordAt::new("orders", 3, 77)),
    };
    assert_eq!(ledger.remembered(&id).await.unwrap(), Remembered::Nothing);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
    assert_eq!(ledger.remembered(&id).await.unwrap(), Remembered::InFlight);
    ledger
        .commit(&Commit {
            delivery: Some(Done {
                key: id.clone(),
                answered: answered.clone(),
                read_back: false,
            }),
            entity: Some((slot, Held::unplaced(state))),
            ..Commit::NOTHING
        })
        .await
        .unwrap();
    let remembered = |found: Remembered| match found {
        Remembered::Done { answered, until } => {
            let in_an_hour = WallClock::system().unix_now() as i64 + 3600;
            assert!(until.is_some_and(|until| (in_an_hour - 5..=in_an_hour).contains(&until)));
            answered
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(remembered(ledger.remembered(&id).await.unwrap()), answered);
    ledger.persist().await.unwrap();
    drop(ledger);
    let ledger = reopen(&dir).await;
    assert_eq!(remembered(ledger.remembered(&id).await.unwrap()), answered);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
}

/// A file an earlier version wrote (done ids with their expiry only) is
/// read on: its done ids are still done, their outcome unknown, and the
/// old table is gone.
#[tokio::test]
async fn an_earlier_versions_done_ids_stay_done_with_their_outcome_unknown() {
    use crate::adapters::ledger::{Recorded, Remembered};
    use redb::TableHandle as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.redb");
    let (id, ..) = sample();
    {
        let db = Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(super::tables::OLD_DONE)
            .unwrap()
            .insert(id.as_str(), WallClock::system().unix_now() + 600)
            .unwrap();
        txn.commit().unwrap();
    }
    let ledger = open(&dir);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    match ledger.remembered(&id).await.unwrap() {
        Remembered::Done { answered, .. } => assert_eq!(answered.outcome, Recorded::Unknown),
        other => panic!("{other:?}"),
    }
    let opened = ledger.store.get().unwrap();
    let txn = opened.db.begin_read().unwrap();
    let tables: Vec<String> = txn
        .list_tables()
        .unwrap()
        .map(|table| table.name().to_owned())
        .collect();
    assert!(
        !tables.iter().any(|name| name == "done_deliveries"),
        "{tables:?}"
    );
}
