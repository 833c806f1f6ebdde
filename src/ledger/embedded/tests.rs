use redb::Database;

use super::store::{Opened, Store};
use super::tables::{DONE, ENTITIES, SWEEP_PER_COMMIT, Sweep, unix_now, write_batch};
use super::wal::Write;
use super::writer::{Synced, commit_batch};
use super::*;
use crate::event::{EntityKey, EntityType, ProviderKind, Version};
use crate::store_file::Integrity;

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
        .commit(Commit {
            delivery: Some(id.clone()),
            ..Commit::default()
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

/// The store of `dir`'s ledger with `writes` committed to its redo log
/// only.
fn with_logged(dir: &tempfile::TempDir, writes: &[Write<'_>]) -> Opened {
    let opened = Store::open_file(&dir.path().join("ledger.redb"), Integrity::Check).unwrap();
    let synced = commit_batch(
        &opened,
        writes,
        false,
        &mut Vec::new(),
        &mut Sweep::default(),
        0,
    );
    assert_eq!(synced.unwrap(), Synced::InLog);
    opened
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
            .commit(Commit {
                delivery: Some(id.clone()),
                entity: Some((slot.clone(), state)),
                checkpoint: Some(("mekari/main/orders".into(), 1234)),
            })
            .await
            .unwrap();
    }
    // The writer thread holds the database until its queue closes.
    let reopened = loop {
        match EmbeddedLedger::open(
            &dir.path().join("ledger.redb"),
            Duration::from_secs(3600),
            Duration::from_secs(10),
        ) {
            Ok(ledger) => break ledger,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert_eq!(reopened.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(reopened.entity(&slot).await.unwrap(), Some(state));
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

/// Between durable commits, writes wait in memory: every read finds
/// them there, and the durable commit moves them to the file.
#[tokio::test]
async fn reads_find_writes_waiting_for_the_durable_commit() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = open(&dir);
    let (id, slot, state) = sample();
    let opened = ledger.store.get().unwrap();
    let in_file = |opened: &Opened| {
        let txn = opened.db.begin_read().unwrap();
        let table = txn.open_table(ENTITIES).unwrap();
        table.get(slot.as_str()).unwrap().is_some()
    };
    let writes = [
        Write::Done(id.as_str(), unix_now() + 3600),
        Write::Entity(slot.as_str(), state.to_bytes()),
        Write::Checkpoint("mekari/main/orders", 7),
    ];
    let (mut frame, mut sweep) = (Vec::new(), Sweep::default());
    let synced = commit_batch(&opened, &writes, false, &mut frame, &mut sweep, 0);
    assert_eq!(synced.unwrap(), Synced::InLog);
    assert!(!in_file(&opened));
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(ledger.entity(&slot).await.unwrap(), Some(state));
    assert_eq!(
        ledger.checkpoint("mekari/main/orders").await.unwrap(),
        Some(7)
    );

    let synced = commit_batch(&opened, &[], true, &mut frame, &mut sweep, 0);
    assert_eq!(synced.unwrap(), Synced::InRedb);
    assert!(in_file(&opened));
    assert_eq!(opened.recent().len(), 0);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(ledger.entity(&slot).await.unwrap(), Some(state));
}

/// A crash after a durable commit covered the log's generation and
/// before the log moved on: opening does not apply those frames again
/// over what the file holds.
#[tokio::test]
async fn frames_of_a_covered_generation_are_not_applied_again() {
    let dir = tempfile::tempdir().unwrap();
    let name = "mekari/main/orders";
    {
        let opened = with_logged(&dir, &[Write::Checkpoint(name, 5)]);
        let generation = opened.log.lock().unwrap().generation;
        let later = [Write::Checkpoint(name, 9)];
        write_batch(
            &opened.db,
            &later,
            Some(generation),
            &mut Sweep::default(),
            0,
        )
        .unwrap();
    }
    assert_eq!(open(&dir).checkpoint(name).await.unwrap(), Some(9));
}

/// A newer state in the file than in the log (a version that kept no
/// `covered` wrote it) stays: the log never rolls an entity back.
#[tokio::test]
async fn an_older_state_in_the_log_never_replaces_a_newer_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_, slot, old) = sample();
    let new = EntityState {
        version: Version {
            at_micros: old.version.at_micros + 1,
            rank: 0,
        },
        ..old
    };
    {
        let opened = with_logged(&dir, &[Write::Entity(slot.as_str(), old.to_bytes())]);
        let newer = [Write::Entity(slot.as_str(), new.to_bytes())];
        write_batch(&opened.db, &newer, None, &mut Sweep::default(), 0).unwrap();
    }
    assert_eq!(open(&dir).entity(&slot).await.unwrap(), Some(new));
}

/// What a batch committed through the redo log holds survives a stop
/// that never made it durable in the file: the files as a crash leaves
/// them (copied while the ledger runs) open with the log applied.
#[tokio::test]
async fn a_commit_in_the_redo_log_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let (id, slot, state) = sample();
    let opened = Store::open_file(&dir.path().join("ledger.redb"), Integrity::Check).unwrap();
    let writes = [
        Write::Done(id.as_str(), unix_now() + 3600),
        Write::Entity(slot.as_str(), state.to_bytes()),
    ];
    let mut frame = Vec::new();
    let synced = commit_batch(
        &opened,
        &writes,
        false,
        &mut frame,
        &mut Sweep::default(),
        0,
    );
    assert_eq!(synced.unwrap(), Synced::InLog);

    let crashed = tempfile::tempdir().unwrap();
    let path = crashed.path().join("ledger.redb");
    std::fs::copy(dir.path().join("ledger.redb"), &path).unwrap();
    std::fs::copy(
        wal::path_of(&dir.path().join("ledger.redb")),
        wal::path_of(&path),
    )
    .unwrap();
    let after = open(&crashed);
    assert_eq!(after.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(after.entity(&slot).await.unwrap(), Some(state));
    let opened = after.store.get().unwrap();
    let log = opened.log.lock().unwrap();
    assert!(
        log.wal.as_ref().unwrap().frames().unwrap().is_empty(),
        "applied, the log starts over"
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
        let writes: Vec<Write<'_>> = done.iter().map(|(id, at)| Write::Done(id, *at)).collect();
        write_batch(db, &writes, None, sweep, now).unwrap()
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
