//! The embedded ledger: one redb file, for a single posbridge process.
//!
//! Writes go through one writer thread (`writer.rs`) that makes whatever
//! has queued up durable in one step (group commit), so concurrent
//! deliveries share one sync instead of queueing for one each: a frame of
//! the redo log (`wal.rs`), its writes kept in memory where reads look
//! first (`store.rs`), and every 100 ms one durable redb commit of all of
//! them (`tables.rs`). Reads look in memory, then in redb through table
//! handles kept from its last durable commit. Leases and entity locks live
//! in memory: they only need to outlive a request, and a crash must not
//! leave a delivery blocked.

mod store;
mod tables;
#[cfg(test)]
mod tests;
mod wal;
mod writer;

pub use wal::path_of as redo_log_path;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redb::ReadableDatabase;
use tokio::sync::{mpsc, oneshot};

use super::{Begin, Commit, EntityLock, EntitySlot, EntityState, Ledger, LedgerError};
use crate::event::DeliveryKey;
use store::Store;
use tables::{CHECKPOINTS, DONE, ENTITIES, unix_now};
use writer::{Reply, write_loop};

/// Number of entity lock stripes: enough that unrelated keys rarely share one.
const LOCK_STRIPES: usize = 1024;

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
        let store = Arc::new(Store::open(path)?);

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
        let txn = self.store.get()?.db.begin_read().map_err(storage)?;
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
        let opened = self.store.get()?;
        // `recent` first: the tables are replaced before it is emptied.
        let recent = opened.recent().done.get(delivery.as_str()).copied();
        let expires = match recent {
            Some(expires) => expires,
            None => {
                let tables = opened.tables();
                let stored = tables.done.get(delivery.as_str()).map_err(storage)?;
                stored.map_or(0, |expires| expires.value())
            }
        };
        Ok(expires > unix_now())
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
        let opened = self.store.get()?;
        let recent = opened.recent().entities.get(slot.as_str()).copied();
        if let Some(state) = recent {
            return EntityState::decode(slot, &state).map(Some);
        }
        let tables = opened.tables();
        let value = tables.entities.get(slot.as_str()).map_err(storage)?;
        value
            .map(|v| EntityState::decode(slot, v.value()))
            .transpose()
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        let opened = self.store.get()?;
        let recent = opened.recent().checkpoints.get(name).copied();
        if recent.is_some() {
            return Ok(recent);
        }
        let tables = opened.tables();
        Ok(tables
            .checkpoints
            .get(name)
            .map_err(storage)?
            .map(|v| v.value()))
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

    async fn may_be_empty(&self) -> Result<bool, LedgerError> {
        // The file's tables, and what the redo log holds beyond them.
        let counts = self.counts()?;
        let recent = self.store.get()?.recent().len();
        Ok(counts.done_deliveries == 0
            && counts.entities == 0
            && counts.checkpoints == 0
            && recent == 0)
    }

    async fn check(&self) -> Result<(), LedgerError> {
        if self.writer.is_closed() {
            return Err(LedgerError::Closed);
        }
        let txn = self.store.get()?.db.begin_read().map_err(storage)?;
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
