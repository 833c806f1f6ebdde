//! The embedded ledger: one redb file, for a single posbridge process.
//!
//! A commit is a write in memory (`store.rs`): the delivery is answered
//! once Kafka has acknowledged its record, which carries what the ledger
//! would keep (its delivery id, entity version and state hash). A thread
//! (`checkpoint.rs`) makes memory's writes durable in the file every
//! `ledger.checkpoint_interval_ms`, in one redb commit with the offsets of
//! the records they came from (`crate::adapters::ledger::placements`); at the next
//! start the topics are read from those offsets to their end, so a crash
//! loses nothing the topics hold. Reads look in memory, then in redb
//! through table handles kept from its last checkpoint. Leases and entity
//! locks live in memory: they only need to outlive a request, and a crash
//! must not leave a delivery blocked.
//!
//! The file is a cache of the topics, so a damaged one (empty, damaged
//! pages, not a database) does not stop start-up: it is set aside for a
//! look and a new file opened, which has no offsets, so the rebuild reads
//! every partition from its beginning before the gate lets a delivery be
//! decided.

mod checkpoint;
mod opening;
mod store;
mod tables;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use redb::ReadableDatabase;
use tokio::sync::oneshot;

use super::key_locks::KeyLocks;
use super::placements::{Offsets, Placements, Sending};
use super::{
    Begin, Cached, Commit, EntityLock, EntitySlot, EntityState, Exclusive, FILL_TOKEN_NAME,
    FillToken, GENERATION_MARK_NAME, GenerationMark, Held, LedgerError, RebuildLock, Remembered,
    TopicsSeen, WallClock,
};
use crate::adapters::store_file::Disk;
use crate::domain::event::DeliveryKey;
use checkpoint::{Ask, Checkpointer, Health, Seen, checkpoint_loop};
use store::Store;
use tables::DONE;

/// How often memory's writes are made durable when the config says nothing.
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Writes in memory that ask for a checkpoint before its interval is up.
const CHECKPOINT_AT: usize = 64 * 1024;

/// Writes in memory past which commits are refused (the fence then answers
/// 503 or spools): checkpoints keep failing, and memory must stay bounded.
const MEMORY_AT_MOST: usize = 1024 * 1024;

/// The embedded, persistent ledger. Cheap to clone.
#[derive(Clone)]
pub struct EmbeddedLedger {
    /// The database, shared with the writer thread.
    store: Arc<Store>,
    /// Delivery ids being processed now, with the instant their lease lapses.
    leases: Arc<Mutex<HashMap<String, Instant>>>,
    /// How long a lease holds if its holder never ends it.
    lease: Duration,
    /// One lock per entity key in flight.
    locks: Arc<KeyLocks>,
    /// The rebuild's lock. One process holds the file, so a fill never
    /// waits for another replica; this only keeps two fills of one process
    /// apart.
    rebuilding: Arc<tokio::sync::Mutex<()>>,
    /// Held by the rederive run under way (one process holds the file).
    rederiving: Arc<tokio::sync::Mutex<()>>,
    /// How long a done id is remembered.
    dedup_ttl: Duration,
    /// What that time is counted on.
    clock: WallClock,
    /// The sends in flight and the offsets committed, for checkpoints.
    placements: Arc<Placements>,
    /// The cluster and topics a rebuild found, for the next checkpoint.
    seen: Arc<Seen>,
    /// Whether the last checkpoint failed.
    health: Arc<Health>,
    /// Whether a checkpoint was asked for and has not begun yet.
    asked: Arc<AtomicBool>,
    /// To whoever takes the checkpoints.
    asks: Asks,
}

/// Where a ledger's asks for a checkpoint go.
#[derive(Clone)]
enum Asks {
    /// The checkpoint thread, which also checkpoints every interval and
    /// ends (with a last checkpoint) when every handle is gone.
    Thread(Arc<CheckpointThread>),
    /// Taken on the asker's thread, and only when asked, without waiting
    /// for sends of the sealed epoch: a simulation decides when each
    /// checkpoint is taken, on its virtual clock, and a crash takes none.
    #[cfg(test)]
    Inline(Arc<Mutex<Checkpointer>>, Arc<AtomicBool>),
}

impl Asks {
    fn send(&self, ask: Ask) -> Result<(), LedgerError> {
        match self {
            Asks::Thread(thread) => thread.send(ask),
            #[cfg(test)]
            Asks::Inline(checkpointer, asked) => {
                asked.store(false, Ordering::Release);
                checkpointer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .handle(Some(ask));
                Ok(())
            }
        }
    }
}

/// The checkpoint thread, joined when the last handle goes: that handle's
/// drop returns once the last checkpoint is written and the file let go,
/// so a stopped posbridge's file can be opened at once (`ledger check`, a
/// restart in the same process) instead of after a race with the thread.
struct CheckpointThread {
    /// Taken on drop: the thread ends when it sees the channel closed.
    asks: Option<std::sync::mpsc::Sender<Ask>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CheckpointThread {
    fn send(&self, ask: Ask) -> Result<(), LedgerError> {
        self.asks
            .as_ref()
            .ok_or(LedgerError::Closed)?
            .send(ask)
            .map_err(|_| LedgerError::Closed)
    }
}

impl Drop for CheckpointThread {
    fn drop(&mut self) {
        drop(self.asks.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        // A panic in the thread was already reported by its hook.
        let join = move || drop(thread.join());
        // Dropped on a worker of tokio's multi-threaded runtime (the end of
        // `serve`, a task's last handle), the wait for the last checkpoint
        // hands the worker's other tasks on first; a current-thread runtime
        // (tests, commands) has no other worker to hand them to.
        match tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(join),
            _ => join(),
        }
    }
}

impl EmbeddedLedger {
    /// Opens (or creates) the ledger file, checkpointing every second.
    ///
    /// # Errors
    /// As [`EmbeddedLedger::open_with`].
    pub fn open(path: &Path, dedup_ttl: Duration, lease: Duration) -> Result<Self, LedgerError> {
        Self::open_with(path, dedup_ttl, lease, DEFAULT_CHECKPOINT_EVERY)
    }

    /// Opens (or creates) the ledger file and starts its checkpoint thread,
    /// which checkpoints every `checkpoint_every`. A damaged file is set
    /// aside (`<path>.damaged-<unix seconds>`) and a new one opened.
    ///
    /// # Errors
    /// [`LedgerError::File`] when the file cannot be opened for a reason
    /// other than damage, e.g. because another posbridge process holds it;
    /// [`LedgerError::Open`] when a damaged file cannot be set aside.
    pub fn open_with(
        path: &Path,
        dedup_ttl: Duration,
        lease: Duration,
        checkpoint_every: Duration,
    ) -> Result<Self, LedgerError> {
        let clock = WallClock::system();
        let file = (path, &Disk::default());
        Self::open_taking(file, (dedup_ttl, clock), lease, |checkpointer, asked| {
            let (asks, queue) = std::sync::mpsc::channel();
            let thread = crate::background::spawn("ledger-checkpoint", move || {
                checkpoint_loop(checkpointer, &asked, &queue, checkpoint_every);
            })
            .map_err(|e| LedgerError::Open {
                path: path.display().to_string(),
                source: e.into(),
            })?;
            Ok(Asks::Thread(Arc::new(CheckpointThread {
                asks: Some(asks),
                thread: Some(thread),
            })))
        })
    }

    /// Opens (or creates) the ledger file on `disk` with no checkpoint
    /// thread: a checkpoint is taken when [`super::Store::persist`] asks for
    /// one, on the asker's thread, and none when the ledger is dropped (a
    /// crash).
    ///
    /// # Errors
    /// As [`EmbeddedLedger::open_with`].
    #[cfg(test)]
    pub(crate) fn open_driven(
        (path, disk): (&Path, &Disk),
        (dedup_ttl, clock): (Duration, WallClock),
        lease: Duration,
    ) -> Result<Self, LedgerError> {
        Self::open_taking(
            (path, disk),
            (dedup_ttl, clock),
            lease,
            |mut checkpointer, asked| {
                checkpointer.seal_wait = Duration::ZERO;
                Ok(Asks::Inline(Arc::new(Mutex::new(checkpointer)), asked))
            },
        )
    }

    /// Opens the file on its disk, a damaged one set aside, and hands its
    /// checkpoints to whoever `start` says.
    fn open_taking(
        (path, disk): (&Path, &Disk),
        (dedup_ttl, clock): (Duration, WallClock),
        lease: Duration,
        start: impl FnOnce(Checkpointer, Arc<AtomicBool>) -> Result<Asks, LedgerError>,
    ) -> Result<Self, LedgerError> {
        let store = Arc::new(opening::open_or_set_aside(path, disk)?);
        let placements = Arc::new(Placements::default());
        let seen = Arc::new(Seen::default());
        let health = Arc::new(Health::default());
        let asked = Arc::new(AtomicBool::new(false));
        let asks = start(
            Checkpointer::new(
                store.clone(),
                placements.clone(),
                seen.clone(),
                health.clone(),
                clock.clone(),
            ),
            asked.clone(),
        )?;
        Ok(EmbeddedLedger {
            store,
            leases: Arc::default(),
            lease,
            locks: Arc::default(),
            rebuilding: Arc::default(),
            rederiving: Arc::default(),
            dedup_ttl,
            clock,
            placements,
            seen,
            health,
            asked,
            asks,
        })
    }

    /// Writes a commit in memory; what the checkpoint thread makes durable.
    fn write(&self, commit: &Commit) -> Result<(), LedgerError> {
        let expires = self.clock.unix_now() + self.dedup_ttl.as_secs();
        let held = {
            let mut layers = self.store.layers();
            let current = &mut layers.current;
            if current.len() >= MEMORY_AT_MOST {
                return Err(LedgerError::Unwritable {
                    reason: self
                        .health
                        .failing()
                        .unwrap_or_else(|| "checkpoints cannot keep up with the writes".to_owned()),
                });
            }
            if let Some(done) = &commit.delivery {
                current.done.insert(
                    done.key.as_str().to_owned(),
                    tables::done_value(expires, &done.answered),
                );
            }
            if let Some((slot, held)) = &commit.entity {
                current
                    .entities
                    .insert(slot.as_str().to_owned(), held.to_bytes());
            }
            if let Some((name, at)) = &commit.checkpoint {
                current.checkpoints.insert(name.clone(), *at);
            }
            current.len()
        };
        if let Some(placed) = &commit.placed {
            self.placements.applied(placed);
        }
        if held >= CHECKPOINT_AT && !self.asked.swap(true, Ordering::AcqRel) {
            // A closed thread: the next commit's read finds the ledger closed.
            let _ = self.asks.send(Ask::Soon);
        }
        Ok(())
    }

    fn is_done(&self, delivery: &DeliveryKey) -> Result<bool, LedgerError> {
        let expires = self.done_value(delivery, tables::expiry)?;
        Ok(expires.is_some_and(|expires| expires > self.clock.unix_now()))
    }

    /// What `read` makes of a done id's stored value, if the ledger holds
    /// one: memory first (the tables are replaced before it lets go).
    fn done_value<T>(
        &self,
        delivery: &DeliveryKey,
        read: impl Fn(&[u8]) -> T,
    ) -> Result<Option<T>, LedgerError> {
        if let Some(found) = self
            .store
            .recent(|recent| recent.done.get(delivery.as_str()).map(|value| read(value)))
        {
            return Ok(Some(found));
        }
        let tables = self.store.get()?.tables();
        let stored = tables.done.get(delivery.as_str()).map_err(storage)?;
        Ok(stored.map(|value| read(value.value())))
    }

    /// Takes the delivery's lease unless one is held; with `check_done`, a
    /// done delivery is not leased (`begin`), without it, it is (`begin_again`).
    ///
    /// The lease is claimed first and the done ids read after, outside the
    /// lease map's lock (a read may reach redb's pages): two attempts still
    /// cannot both see `New`, since the second finds the first's claim and
    /// waits for it as for any attempt in flight; a claim on a done delivery
    /// is given back before `Done` is answered.
    fn lease(&self, delivery: &DeliveryKey, check_done: bool) -> Result<Begin, LedgerError> {
        {
            let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if held(&leases, delivery, now) {
                return Ok(Begin::InFlight);
            }
            leases.insert(delivery.as_str().to_owned(), now + self.lease);
        }
        if check_done {
            match self.is_done(delivery) {
                Ok(false) => {}
                done_or_failed => {
                    self.end_lease(delivery);
                    return done_or_failed.map(|_| Begin::Done);
                }
            }
        }
        Ok(Begin::New)
    }

    fn end_lease(&self, delivery: &DeliveryKey) {
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(delivery.as_str());
    }
}

/// Whether an attempt holds `delivery`'s lease at `now`.
fn held(leases: &HashMap<String, Instant>, delivery: &DeliveryKey, now: Instant) -> bool {
    leases
        .get(delivery.as_str())
        .is_some_and(|lapses| *lapses > now)
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

impl super::Store for EmbeddedLedger {
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.lease(delivery, true)
    }

    async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.lease(delivery, false)
    }

    async fn release(&self, delivery: &DeliveryKey) {
        self.end_lease(delivery);
    }

    async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        let leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if held(&leases, delivery, Instant::now()) {
            return Ok(Remembered::InFlight);
        }
        drop(leases);
        let found = self.done_value(delivery, |value| {
            (tables::expiry(value), tables::answered(value))
        })?;
        Ok(match found {
            Some((expires, answered)) if expires > self.clock.unix_now() => Remembered::Done {
                answered,
                until: i64::try_from(expires).ok(),
            },
            _ => Remembered::Nothing,
        })
    }

    async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        let lock: EntityLock = Box::new(self.locks.lock(slot.as_str()).await);
        let state = self.entity(slot).await?.map(|held| held.state);
        Ok((lock, state))
    }

    async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        let recent = self
            .store
            .recent(|recent| recent.entities.get(slot.as_str()).copied());
        if let Some(state) = recent {
            return Held::decode(slot, &state).map(Some);
        }
        let tables = self.store.get()?.tables();
        let value = tables.entities.get(slot.as_str()).map_err(storage)?;
        value.map(|v| Held::decode(slot, v.value())).transpose()
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        let recent = self
            .store
            .recent(|recent| recent.checkpoints.get(name).copied());
        if recent.is_some() {
            return Ok(recent);
        }
        let tables = self.store.get()?.tables();
        Ok(tables
            .checkpoints
            .get(name)
            .map_err(storage)?
            .map(|v| v.value()))
    }

    async fn generation_mark(&self) -> Result<Option<GenerationMark>, LedgerError> {
        let filled_at = self.checkpoint(GENERATION_MARK_NAME).await?;
        Ok(filled_at.map(|filled_at| GenerationMark { filled_at }))
    }

    async fn mark_generation(&self, filled_at: i64) -> Result<(), LedgerError> {
        self.write(&Commit::checkpoint(GENERATION_MARK_NAME, filled_at))
    }

    async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        Ok(self.checkpoint(FILL_TOKEN_NAME).await?.map(FillToken))
    }

    async fn begin_fill(&self) -> Result<FillToken, LedgerError> {
        let token = FillToken::random();
        self.write(&Commit::checkpoint(FILL_TOKEN_NAME, token.0))?;
        Ok(token)
    }

    async fn exclusive(&self, task: Exclusive) -> Result<Option<RebuildLock>, LedgerError> {
        Ok(match task {
            Exclusive::Fill => Some(RebuildLock::new(self.rebuilding.clone().lock_owned().await)),
            Exclusive::Rederive => self
                .rederiving
                .clone()
                .try_lock_owned()
                .ok()
                .map(RebuildLock::new),
        })
    }

    async fn commit(&self, commit: &Commit) -> Result<(), LedgerError> {
        let result = self.write(commit);
        if let Some(done) = &commit.delivery {
            self.end_lease(&done.key);
        }
        result
    }

    fn sending(&self) -> Sending {
        self.placements.sending()
    }

    async fn cached(&self) -> Result<Option<Cached>, LedgerError> {
        let opened = self.store.get()?;
        Ok(Some(Cached {
            offsets: tables::offsets(&opened.db).map_err(storage)?,
            topics: tables::topics_seen(&opened.db).map_err(storage)?,
        }))
    }

    fn restore(&self, offsets: &Offsets, topics: &TopicsSeen) {
        self.placements.restore(offsets);
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(topics.clone());
    }

    async fn forget_topics(&self) -> Result<(), LedgerError> {
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let (reply, answer) = oneshot::channel();
        self.asks.send(Ask::Forget(reply))?;
        answer.await.unwrap_or(Err(LedgerError::Closed))
    }

    /// Nothing but this process writes the file (redb locks it), and what
    /// a crash took from memory is read back at the start: the file cannot
    /// lose writes under a running posbridge.
    async fn kept_writes(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn persist(&self) -> Result<(), LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.asks.send(Ask::Now(reply))?;
        answer.await.unwrap_or(Err(LedgerError::Closed))
    }

    async fn reopen(&self) -> Result<(), LedgerError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.reopen())
            .await
            .unwrap_or(Err(LedgerError::Closed))
    }

    async fn check(&self) -> Result<(), LedgerError> {
        if let Some(reason) = self.health.failing() {
            return Err(LedgerError::Unwritable { reason });
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
