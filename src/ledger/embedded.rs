//! The embedded ledger: one redb file, for a single posbridge process.
//!
//! Reads go straight to redb. Writes go through one writer thread that
//! commits whatever has queued up in a single durable transaction (group
//! commit), so concurrent deliveries share one fsync instead of queueing for
//! one each. Leases and entity locks live in memory: they only need to
//! outlive a request, and a crash must not leave a delivery blocked.

use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use super::{Begin, Commit, EntityLock, EntitySlot, EntityState, Ledger, LedgerError};
use crate::event::DeliveryKey;
use crate::store_file::{self, Integrity, StoreFileError};

/// Done delivery ids → unix second they may be forgotten.
const DONE: TableDefinition<&str, u64> = TableDefinition::new("done_deliveries");
/// An index of done ids by expiry that earlier versions kept for the purge;
/// dropped when a file is opened (the sweep needs no index).
const OLD_DONE_BY_EXPIRY: TableDefinition<(u64, &str), ()> = TableDefinition::new("done_by_expiry");
/// Entity slot → version and state hash (`EntityState::to_bytes`).
const ENTITIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entities");
/// Reconciler checkpoint name → unix second its window is complete up to.
const CHECKPOINTS: TableDefinition<&str, i64> = TableDefinition::new("checkpoints");

/// Number of entity lock stripes: enough that unrelated keys rarely share one.
const LOCK_STRIPES: usize = 1024;
/// The writer starts a commit at most this often: a delivery after a quiet
/// spell is committed at once, one under load waits at most this long to
/// share its commit (and its sync) with the others (docs/BENCHMARKS.md).
const COMMIT_EVERY: Duration = Duration::from_millis(2);
/// How many done ids each commit looks at, in key order from where the last
/// one stopped, deleting those expired: the sweep walks the whole table in
/// turn, a few leaf pages per commit, so forgetting costs the same small
/// amount on every commit instead of a long transaction now and then, and
/// needs no second index by expiry (which cost a B-tree path per id on
/// every commit and half the file).
const SWEEP_PER_COMMIT: usize = 128;

type Reply = oneshot::Sender<Result<(), LedgerError>>;

/// The embedded, persistent ledger. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedLedger {
    /// The database, shared with the writer thread.
    store: Arc<Store>,
    /// Delivery ids being processed now, with the instant their lease lapses.
    leases: Arc<Mutex<HashMap<String, Instant>>>,
    /// How long a lease holds if its holder never ends it.
    lease: Duration,
    /// Striped per-entity locks.
    locks: Arc<Vec<Arc<tokio::sync::Mutex<()>>>>,
    /// Queue to the group-commit writer thread (which knows the dedup TTL).
    writer: mpsc::UnboundedSender<(Commit, Reply)>,
}

impl EmbeddedLedger {
    /// Opens (or creates) the ledger file and starts its writer thread.
    ///
    /// # Errors
    /// [`LedgerError::Open`] when the file cannot be opened, e.g. because
    /// another posbridge process holds it.
    pub fn open(path: &Path, dedup_ttl: Duration, lease: Duration) -> Result<Self, LedgerError> {
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| LedgerError::Open {
            path: path.display().to_string(),
            source: e,
        };
        let store = Arc::new(Store {
            path: path.to_owned(),
            db: RwLock::new(Some(Arc::new(Store::open_file(path, Integrity::Check)?))),
        });

        let (writer, queue) = mpsc::unbounded_channel();
        let writer_store = store.clone();
        std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || write_loop(&writer_store, queue, dedup_ttl))
            .map_err(|e| open_error(e.into()))?;

        Ok(EmbeddedLedger {
            store,
            leases: Arc::default(),
            lease,
            locks: Arc::new(
                (0..LOCK_STRIPES)
                    .map(|_| Arc::new(tokio::sync::Mutex::new(())))
                    .collect(),
            ),
            writer,
        })
    }

    /// How many done ids, entity states and checkpoints the file holds; for
    /// `posbridge ledger check`, which has already had the file checked by opening it.
    ///
    /// # Errors
    /// [`LedgerError::Embedded`] when a table cannot be read.
    pub fn counts(&self) -> Result<LedgerCounts, LedgerError> {
        use redb::ReadableTableMetadata;
        let txn = self.store.get()?.begin_read().map_err(storage)?;
        Ok(LedgerCounts {
            done_deliveries: txn
                .open_table(DONE)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
            entities: txn
                .open_table(ENTITIES)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
            checkpoints: txn
                .open_table(CHECKPOINTS)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
        })
    }

    fn is_done(&self, delivery: &DeliveryKey) -> Result<bool, LedgerError> {
        let txn = self.store.get()?.begin_read().map_err(storage)?;
        let table = txn.open_table(DONE).map_err(storage)?;
        Ok(table
            .get(delivery.as_str())
            .map_err(storage)?
            .is_some_and(|expires| expires.value() > unix_now()))
    }

    /// Takes the delivery's lease unless one is held; with `check_done`, a
    /// done delivery is not leased (`begin`), without it, it is (`begin_again`).
    fn lease(&self, delivery: &DeliveryKey, check_done: bool) -> Result<Begin, LedgerError> {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if leases
            .get(delivery.as_str())
            .is_some_and(|lapses| *lapses > now)
        {
            return Ok(Begin::InFlight);
        }
        // Checked under the lease map's lock, so two attempts cannot both see New.
        if check_done && self.is_done(delivery)? {
            return Ok(Begin::Done);
        }
        leases.insert(delivery.as_str().to_owned(), now + self.lease);
        Ok(Begin::New)
    }

    fn end_lease(&self, delivery: &DeliveryKey) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(delivery.as_str());
    }
}

/// The open database, replaced by [`Store::reopen`] after a failure.
struct Store {
    path: PathBuf,
    /// `None` only while it is being reopened.
    db: RwLock<Option<Arc<Database>>>,
}

impl Store {
    /// How long a reopen waits for reads in progress to let go of the old handle.
    const RELEASE_WAIT: Duration = Duration::from_secs(2);

    /// Opens (or creates) the checked file and its tables.
    fn open_file(path: &Path, integrity: Integrity) -> Result<Database, LedgerError> {
        let db = store_file::open_with(path, integrity)?;
        let open_error = |e: redb::Error| LedgerError::Open {
            path: path.display().to_string(),
            source: e.into(),
        };
        let txn = db.begin_write().map_err(|e| open_error(e.into()))?;
        txn.open_table(DONE).map_err(|e| open_error(e.into()))?;
        txn.delete_table(OLD_DONE_BY_EXPIRY)
            .map_err(|e| open_error(e.into()))?;
        txn.open_table(ENTITIES).map_err(|e| open_error(e.into()))?;
        txn.open_table(CHECKPOINTS)
            .map_err(|e| open_error(e.into()))?;
        txn.commit().map_err(|e| open_error(e.into()))?;
        Ok(db)
    }

    fn get(&self) -> Result<Arc<Database>, LedgerError> {
        self.db
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or(LedgerError::Closed)
    }

    /// Closes the handle and opens the file again: redb refuses every write
    /// after one I/O error until then. Blocking.
    fn reopen(&self) -> Result<(), LedgerError> {
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut old) = slot.take() {
            // The file admits one handle: wait for reads in progress to end.
            let deadline = Instant::now() + Self::RELEASE_WAIT;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => break drop(db),
                    Err(held) if Instant::now() < deadline => {
                        old = held;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(held) => {
                        *slot = Some(held);
                        return Err(LedgerError::Closed);
                    }
                }
            }
        }
        // A read transaction that just ended may hold the file a moment longer.
        let deadline = Instant::now() + Self::RELEASE_WAIT;
        loop {
            match Store::open_file(&self.path, Integrity::Trust) {
                Ok(db) => {
                    *slot = Some(Arc::new(db));
                    return Ok(());
                }
                Err(LedgerError::File(StoreFileError::Database {
                    source: redb::DatabaseError::DatabaseAlreadyOpen,
                    ..
                })) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// What an embedded ledger file holds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct LedgerCounts {
    /// Delivery ids remembered as done (expired ones included until purged).
    pub done_deliveries: u64,
    /// Entities with a recorded state.
    pub entities: u64,
    /// Reconciler checkpoints.
    pub checkpoints: u64,
}

/// Any redb error as a ledger error.
fn storage(error: impl Into<redb::Error>) -> LedgerError {
    LedgerError::Embedded(Arc::new(error.into()))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The writer thread: take everything queued, write it in one transaction,
/// answer every waiter with the transaction's result.
fn write_loop(
    store: &Store,
    mut queue: mpsc::UnboundedReceiver<(Commit, Reply)>,
    dedup_ttl: Duration,
) {
    let mut sweep = Sweep::default();
    let mut last_commit = Instant::now() - COMMIT_EVERY;
    while let Some(first) = queue.blocking_recv() {
        // Under load, gather what arrives until a commit is due: each commit
        // costs a sync and a B-tree path per table however few ids it holds.
        let due = last_commit + COMMIT_EVERY;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        last_commit = Instant::now();
        let mut batch = vec![first];
        while let Ok(next) = queue.try_recv() {
            batch.push(next);
        }
        let result = store.get().and_then(|db| {
            write_batch(&db, &batch, dedup_ttl, &mut sweep, unix_now())
                .map_err(|e| LedgerError::Embedded(Arc::new(e)))
        });
        for (_, reply) in batch {
            // The waiter may have given up (request cancelled); nothing to tell it.
            let _ = reply.send(match &result {
                Ok(_) => Ok(()),
                Err(LedgerError::Embedded(error)) => Err(LedgerError::Embedded(error.clone())),
                Err(_) => Err(LedgerError::Closed),
            });
        }
    }
}

/// Where the sweep of expired ids goes on.
#[derive(Debug, Default)]
struct Sweep {
    /// The last id the previous commit looked at; `None`: from the start.
    after: Option<String>,
}

/// Writes one batch of commits in one durable transaction at unix second
/// `now`, with the next step of the sweep; how many expired ids it deleted.
/// The sweep moves on only when the transaction is durable.
fn write_batch(
    db: &Database,
    batch: &[(Commit, Reply)],
    dedup_ttl: Duration,
    sweep: &mut Sweep,
    now: u64,
) -> Result<usize, redb::Error> {
    let expires = now + dedup_ttl.as_secs();
    let txn = db.begin_write()?;
    let (swept, after) = {
        let mut done = txn.open_table(DONE)?;
        let mut entities = txn.open_table(ENTITIES)?;
        let mut checkpoints = txn.open_table(CHECKPOINTS)?;
        for (commit, _) in batch {
            if let Some(delivery) = &commit.delivery {
                done.insert(delivery.as_str(), expires)?;
            }
            if let Some((slot, state)) = &commit.entity {
                entities.insert(slot.as_str(), state.to_bytes().as_slice())?;
            }
            if let Some((name, at)) = &commit.checkpoint {
                checkpoints.insert(name.as_str(), *at)?;
            }
        }
        let range = match &sweep.after {
            Some(after) => {
                done.range::<&str>((Bound::Excluded(after.as_str()), Bound::Unbounded))?
            }
            None => done.range::<&str>(..)?,
        };
        let looked_at: Vec<(String, u64)> = range
            .take(SWEEP_PER_COMMIT)
            .map(|entry| entry.map(|(id, at)| (id.value().to_owned(), at.value())))
            .collect::<Result<_, _>>()?;
        let mut swept = 0;
        for (id, at) in &looked_at {
            if *at <= now {
                done.remove(id.as_str())?;
                swept += 1;
            }
        }
        // At the end of the table the next sweep starts over.
        let after = if looked_at.len() < SWEEP_PER_COMMIT {
            None
        } else {
            looked_at.last().map(|(id, _)| id.clone())
        };
        (swept, after)
    };
    txn.commit()?;
    sweep.after = after;
    Ok(swept)
}

#[async_trait]
impl Ledger for EmbeddedLedger {
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.lease(delivery, true)
    }

    async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.lease(delivery, false)
    }

    async fn release(&self, delivery: &DeliveryKey) {
        self.end_lease(delivery);
    }

    async fn lock_entity(&self, slot: &EntitySlot) -> Result<EntityLock, LedgerError> {
        use std::hash::{BuildHasher, RandomState};
        static HASHER: std::sync::LazyLock<RandomState> =
            std::sync::LazyLock::new(RandomState::new);
        let stripe = usize::try_from(HASHER.hash_one(slot.as_str())).unwrap_or(0) % LOCK_STRIPES;
        Ok(Box::new(self.locks[stripe].clone().lock_owned().await))
    }

    async fn entity(&self, slot: &EntitySlot) -> Result<Option<EntityState>, LedgerError> {
        let txn = self.store.get()?.begin_read().map_err(storage)?;
        let table = txn.open_table(ENTITIES).map_err(storage)?;
        let value = table.get(slot.as_str()).map_err(storage)?;
        value
            .map(|v| EntityState::decode(slot, v.value()))
            .transpose()
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        let txn = self.store.get()?.begin_read().map_err(storage)?;
        let table = txn.open_table(CHECKPOINTS).map_err(storage)?;
        Ok(table.get(name).map_err(storage)?.map(|v| v.value()))
    }

    async fn commit(&self, commit: Commit) -> Result<(), LedgerError> {
        let delivery = commit.delivery.clone();
        let (reply, answer) = oneshot::channel();
        let result = match self.writer.send((commit, reply)) {
            Ok(()) => answer.await.unwrap_or(Err(LedgerError::Closed)),
            Err(_) => Err(LedgerError::Closed),
        };
        if let Some(delivery) = delivery {
            self.end_lease(&delivery);
        }
        result
    }

    async fn reopen(&self) -> Result<(), LedgerError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.reopen())
            .await
            .unwrap_or(Err(LedgerError::Closed))
    }

    async fn check(&self) -> Result<(), LedgerError> {
        if self.writer.is_closed() {
            return Err(LedgerError::Closed);
        }
        let txn = self.store.get()?.begin_read().map_err(storage)?;
        txn.open_table(DONE).map_err(storage)?;
        Ok(())
    }
}

impl std::fmt::Debug for EmbeddedLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedLedger")
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EntityKey, EntityType, ProviderKind, Version};

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
        let id = DeliveryKey::new(ProviderKind::Mekari, "e1");
        let slot = EntitySlot::new(
            EntityType::Order,
            &EntityKey::new(ProviderKind::Mekari, None, "O-1"),
        );
        let state = EntityState {
            version: Version {
                at_micros: 42,
                rank: 7,
            },
            state_hash: [9; 16],
        };
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

    #[tokio::test]
    async fn the_sweep_forgets_expired_ids_a_few_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("l.redb")).unwrap();
        let commit = |id: &str| {
            let commit = Commit {
                delivery: Some(DeliveryKey::new(ProviderKind::Mekari, id)),
                ..Commit::default()
            };
            (commit, oneshot::channel().0)
        };
        let mut sweep = Sweep::default();
        let expiring: Vec<(Commit, Reply)> = (0..SWEEP_PER_COMMIT * 2 + 50)
            .map(|n| commit(&format!("p{n:04}")))
            .collect();
        let (t0, second) = (1_000_000, Duration::from_secs(1));
        assert_eq!(
            write_batch(&db, &expiring, second, &mut sweep, t0).unwrap(),
            0
        );
        // Ids kept for an hour, after the expiring ones in key order.
        let kept: Vec<(Commit, Reply)> = (0..10).map(|n| commit(&format!("q{n}"))).collect();
        sweep = Sweep::default();
        let hour = Duration::from_secs(3600);
        write_batch(&db, &kept, hour, &mut sweep, t0).unwrap();
        // Two seconds later the first lot has expired.
        sweep = Sweep::default();
        let swept: Vec<usize> = (0..4)
            .map(|_| write_batch(&db, &[], Duration::ZERO, &mut sweep, t0 + 2).unwrap())
            .collect();
        assert_eq!(swept, [SWEEP_PER_COMMIT, SWEEP_PER_COMMIT, 50, 0]);
        let txn = db.begin_read().unwrap();
        use redb::ReadableTableMetadata;
        assert_eq!(txn.open_table(DONE).unwrap().len().unwrap(), 10);
    }
}
