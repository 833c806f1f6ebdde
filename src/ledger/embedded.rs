//! The embedded ledger: one redb file, for a single posbridge process.
//!
//! Writes go through one writer thread that makes whatever has queued up
//! durable in one step (group commit), so concurrent deliveries share one
//! sync instead of queueing for one each: a frame of the redo log
//! (`wal.rs`), its writes kept in memory where reads look first, and every
//! 100 ms one durable redb commit of all of them. Reads look in memory,
//! then in redb through table handles kept from its last durable commit. Leases and entity locks live in memory: they only need to
//! outlive a request, and a crash must not leave a delivery blocked.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};
use tracing::{error, info, warn};

use super::wal::{self, Wal, Write};
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
/// [`COVERED`] → the last redo log generation whose frames this file holds
/// durably.
const REDO: TableDefinition<&str, u64> = TableDefinition::new("redo_log");
const COVERED: &str = "covered";

/// Number of entity lock stripes: enough that unrelated keys rarely share one.
const LOCK_STRIPES: usize = 1024;
/// The writer starts a commit at most this often: a delivery after a quiet
/// spell is committed at once, one under load waits at most this long to
/// share its commit (and its sync) with the others (docs/BENCHMARKS.md).
const COMMIT_EVERY: Duration = Duration::from_millis(2);
/// How often the writes the redo log made durable are committed durably to
/// the file, so the log can start over. Each such commit touches every leaf
/// its keys fall in, once for all of them, and delays the batch that makes
/// it: often enough that it stays short, rarely enough that most of a
/// leaf's writes share it.
const APPLY_EVERY: Duration = Duration::from_millis(100);
/// Recent writes that make a durable commit due before [`APPLY_EVERY`].
const APPLY_AT: usize = 16 * 1024;
/// A batch with more writes than this (a bulk load; a webhook surge gathers
/// a few dozen per batch) is committed durably to redb at once: logging it
/// first would write and hold it twice for nothing.
const LOG_AT_MOST: usize = 1024;
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

/// The open database and its redo log, replaced together by
/// [`Store::reopen`] after a failure.
struct Store {
    path: PathBuf,
    /// `None` only while it is being reopened.
    db: RwLock<Option<Arc<Opened>>>,
}

/// An open ledger file, the redo log beside it, and what the log holds
/// that the file does not yet.
struct Opened {
    db: Database,
    /// The redo log and the generation its frames are written in.
    log: Mutex<Log>,
    /// Writes durable in the redo log and not yet in `db`: reads look here
    /// first. Only the writer thread changes it.
    recent: RwLock<Recent>,
    /// Read handles on `db` as of its last durable commit. With `recent`
    /// they hold the whole ledger, so a lookup opens no transaction of its
    /// own. The writer replaces them after each durable commit, before it
    /// empties `recent`.
    tables: RwLock<Arc<Tables>>,
}

impl Opened {
    fn recent(&self) -> std::sync::RwLockReadGuard<'_, Recent> {
        self.recent.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn tables(&self) -> Arc<Tables> {
        self.tables
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// `writes` without the entity states older than the one the file holds.
fn not_older<'a>(db: &Database, writes: Vec<Write<'a>>) -> Result<Vec<Write<'a>>, redb::Error> {
    let txn = db.begin_read()?;
    let entities = txn.open_table(ENTITIES)?;
    let mut kept = Vec::with_capacity(writes.len());
    for write in writes {
        if let Write::Entity(slot, state) = &write {
            let stored = entities.get(*slot)?;
            let older = stored
                .and_then(|v| EntityState::from_bytes(v.value()))
                .zip(EntityState::from_bytes(state))
                .is_some_and(|(stored, frame)| frame.version < stored.version);
            if older {
                continue;
            }
        }
        kept.push(write);
    }
    Ok(kept)
}

/// The redo log, or none once a write to it (or a durable commit) failed:
/// every commit is then durable in redb, until the file is reopened.
struct Log {
    /// The generation every durable commit records as covered: the log's
    /// current one, kept when the log is dropped, so commits made without
    /// it still cover the frames written before.
    generation: u64,
    wal: Option<Wal>,
}

/// The tables as one read transaction sees them.
struct Tables {
    done: redb::ReadOnlyTable<&'static str, u64>,
    entities: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    checkpoints: redb::ReadOnlyTable<&'static str, i64>,
}

impl Tables {
    fn open(db: &Database) -> Result<Arc<Tables>, redb::Error> {
        let txn = db.begin_read()?;
        Ok(Arc::new(Tables {
            done: txn.open_table(DONE)?,
            entities: txn.open_table(ENTITIES)?,
            checkpoints: txn.open_table(CHECKPOINTS)?,
        }))
    }
}

/// The latest value of each key written since the last durable commit, in
/// key order (a few thousand keys at most: a lookup is a dozen compares, and
/// the durable commit walks each B-tree once from left to right).
#[derive(Debug, Default)]
struct Recent {
    done: BTreeMap<String, u64>,
    entities: BTreeMap<String, [u8; 28]>,
    checkpoints: BTreeMap<String, i64>,
}

impl Recent {
    fn len(&self) -> usize {
        self.done.len() + self.entities.len() + self.checkpoints.len()
    }

    fn insert(&mut self, writes: &[Write<'_>]) {
        for write in writes {
            match *write {
                Write::Done(id, expires) => {
                    self.done.insert(id.to_owned(), expires);
                }
                Write::Entity(slot, state) => {
                    self.entities.insert(slot.to_owned(), state);
                }
                Write::Checkpoint(name, at) => {
                    self.checkpoints.insert(name.to_owned(), at);
                }
            }
        }
    }

    /// Every write, in key order within each table.
    fn writes(&self) -> Vec<Write<'_>> {
        let done = self.done.iter().map(|(id, at)| Write::Done(id, *at));
        let entities = self
            .entities
            .iter()
            .map(|(slot, state)| Write::Entity(slot, *state));
        let checkpoints = self
            .checkpoints
            .iter()
            .map(|(name, at)| Write::Checkpoint(name, *at));
        done.chain(entities).chain(checkpoints).collect()
    }
}

impl Store {
    /// How long a reopen waits for reads in progress to let go of the old handle.
    const RELEASE_WAIT: Duration = Duration::from_secs(2);

    /// Opens (or creates) the checked file and its tables, then applies
    /// what its redo log holds that the file does not.
    fn open_file(path: &Path, integrity: Integrity) -> Result<Opened, LedgerError> {
        let db = store_file::open_with(path, integrity)?;
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| LedgerError::Open {
            path: path.display().to_string(),
            source: e,
        };
        let redb_error = |e: redb::Error| open_error(e.into());
        let txn = db.begin_write().map_err(|e| redb_error(e.into()))?;
        txn.open_table(DONE).map_err(|e| redb_error(e.into()))?;
        txn.delete_table(OLD_DONE_BY_EXPIRY)
            .map_err(|e| redb_error(e.into()))?;
        txn.open_table(ENTITIES).map_err(|e| redb_error(e.into()))?;
        txn.open_table(CHECKPOINTS)
            .map_err(|e| redb_error(e.into()))?;
        let covered = txn
            .open_table(REDO)
            .and_then(|table| Ok(table.get(COVERED)?.map(|v| v.value())))
            .map_err(|e| redb_error(e.into()))?
            .unwrap_or(0);
        txn.commit().map_err(|e| redb_error(e.into()))?;

        let wal_path = wal::path_of(path);
        let wal_error = |e: std::io::Error| LedgerError::Open {
            path: wal_path.display().to_string(),
            source: e.into(),
        };
        let mut wal = Wal::open(&wal_path).map_err(wal_error)?;
        if wal.generation() > covered {
            let frames = wal.frames().map_err(wal_error)?;
            let mut writes = Vec::new();
            for frame in &frames {
                writes.extend(wal::decode(frame).ok_or_else(|| {
                    wal_error(std::io::Error::other("a frame this version cannot read"))
                })?);
            }
            // A state older than the file's (a frame left by a version that
            // did not record `covered`, then a downgrade) never goes back in.
            let writes = not_older(&db, writes).map_err(redb_error)?;
            if !writes.is_empty() {
                let covers = Some(wal.generation());
                write_batch(&db, &writes, covers, &mut Sweep::default(), unix_now())
                    .map_err(redb_error)?;
                info!(
                    writes = writes.len(),
                    "Applied the ledger's redo log: what was answered before the last stop is kept."
                );
            }
        }
        wal.advance_past(covered).map_err(wal_error)?;
        let tables = Tables::open(&db).map_err(redb_error)?;
        Ok(Opened {
            db,
            log: Mutex::new(Log {
                generation: wal.generation(),
                wal: Some(wal),
            }),
            recent: RwLock::default(),
            tables: RwLock::new(tables),
        })
    }

    fn get(&self) -> Result<Arc<Opened>, LedgerError> {
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

/// The writer thread: take everything queued, make it durable in one step,
/// answer every waiter with the result.
fn write_loop(
    store: &Store,
    mut queue: mpsc::UnboundedReceiver<(Commit, Reply)>,
    dedup_ttl: Duration,
) {
    let mut sweep = Sweep::default();
    let mut last_commit = Instant::now() - COMMIT_EVERY;
    let mut last_apply = Instant::now();
    // Kept from batch to batch: a buffer that grows once instead of being
    // allocated again (and freed from another thread) every 2 ms.
    let (mut frame, mut batch) = (Vec::new(), Vec::new());
    while let Some(first) = queue.blocking_recv() {
        // Under load, gather what arrives until a commit is due: each commit
        // costs a sync however few ids it holds.
        let due = last_commit + COMMIT_EVERY;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        last_commit = Instant::now();
        batch.push(first);
        while let Ok(next) = queue.try_recv() {
            batch.push(next);
        }
        let now = unix_now();
        let writes = writes_of(&batch, now + dedup_ttl.as_secs());
        let apply_due = last_commit >= last_apply + APPLY_EVERY;
        let result = store.get().and_then(|opened| {
            let result = commit_batch(&opened, &writes, apply_due, &mut frame, &mut sweep, now);
            if let Ok(Synced::InRedb) = result {
                last_apply = last_commit;
            }
            result.map_err(|e| LedgerError::Embedded(Arc::new(e)))
        });
        drop(writes);
        for (_, reply) in batch.drain(..) {
            // The waiter may have given up (request cancelled); nothing to tell it.
            let _ = reply.send(match &result {
                Ok(_) => Ok(()),
                Err(LedgerError::Embedded(error)) => Err(LedgerError::Embedded(error.clone())),
                Err(_) => Err(LedgerError::Closed),
            });
        }
    }
    // Shutting down: make the recent writes durable in the file, so the
    // next start has no log to apply (if the process lets this thread
    // finish; if not, the log still holds them).
    if let Ok(opened) = store.get()
        && let Err(error) =
            commit_batch(&opened, &[], true, &mut Vec::new(), &mut sweep, unix_now())
    {
        warn!(%error, "The ledger's last durable commit failed; the next start applies its redo log.");
    }
}

/// Where a batch's durability came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Synced {
    /// A frame of the redo log; the writes wait in [`Recent`].
    InLog,
    /// A durable redb commit of everything recent (due, or the log is full
    /// or failing), after which the log starts over.
    InRedb,
}

/// Makes one batch durable: as a redo log frame, its writes kept in
/// [`Recent`] for reads; and when `apply_due` (or the log cannot take the
/// batch), everything recent in one durable redb commit.
fn commit_batch(
    opened: &Opened,
    writes: &[Write<'_>],
    apply_due: bool,
    frame: &mut Vec<u8>,
    sweep: &mut Sweep,
    now: u64,
) -> Result<Synced, redb::Error> {
    let mut log = opened.log.lock().unwrap_or_else(PoisonError::into_inner);
    let generation = log.generation;
    let mut logged = false;
    // A due apply makes the batch durable itself: no frame first.
    if !apply_due
        && !writes.is_empty()
        && writes.len() <= LOG_AT_MOST
        && let Some(wal) = log.wal.as_mut()
    {
        frame.clear();
        for write in writes {
            wal::encode(write, frame);
        }
        match wal.append(frame) {
            Ok(fits) => logged = fits,
            Err(error) => {
                error!(%error, "The ledger's redo log cannot be written: every commit is now a durable database commit.");
                log.wal = None;
            }
        }
    }
    if logged {
        let mut recent = opened
            .recent
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        recent.insert(writes);
        if recent.len() < APPLY_AT {
            return Ok(Synced::InLog);
        }
    }
    let applied = apply(opened, writes, logged, generation, sweep, now);
    match &applied {
        Ok(()) => {
            if let Some(wal) = log.wal.as_mut()
                && let Err(error) = wal.advance_past(generation)
            {
                error!(%error, "The ledger's redo log cannot start over: every commit is now a durable database commit.");
                log.wal = None;
            }
            // Frames from here on belong to a generation the file does not
            // cover (or there is no log).
            if let Some(wal) = &log.wal {
                log.generation = wal.generation();
            }
        }
        // The commit may have reached the file, `covered` with it: a frame
        // appended at this generation now might never be replayed. No more
        // frames until the file is reopened.
        Err(_) => log.wal = None,
    }
    applied.map(|()| Synced::InRedb)
}

/// One durable redb commit of everything recent, then `writes` unless they
/// are recent already (`logged`), covering the log's `generation`; then the
/// reads' handles replaced and `recent` emptied, in that order.
fn apply(
    opened: &Opened,
    writes: &[Write<'_>],
    logged: bool,
    generation: u64,
    sweep: &mut Sweep,
    now: u64,
) -> Result<(), redb::Error> {
    {
        let recent = opened.recent();
        let mut all = recent.writes();
        if !logged {
            // Newer than anything recent: written last.
            all.extend_from_slice(writes);
        }
        write_batch(&opened.db, &all, Some(generation), sweep, now)?;
    }
    // The file holds it all now: reads find it there, through new handles
    // in place before `recent` is emptied.
    let tables = Tables::open(&opened.db)?;
    *opened
        .tables
        .write()
        .unwrap_or_else(PoisonError::into_inner) = tables;
    *opened
        .recent
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Recent::default();
    Ok(())
}

/// A batch's writes, its done ids kept until `expires`.
fn writes_of(batch: &[(Commit, Reply)], expires: u64) -> Vec<Write<'_>> {
    let mut writes = Vec::with_capacity(batch.len() * 2);
    for (commit, _) in batch {
        if let Some(delivery) = &commit.delivery {
            writes.push(Write::Done(delivery.as_str(), expires));
        }
        if let Some((slot, state)) = &commit.entity {
            writes.push(Write::Entity(slot.as_str(), state.to_bytes()));
        }
        if let Some((name, at)) = &commit.checkpoint {
            writes.push(Write::Checkpoint(name.as_str(), *at));
        }
    }
    writes
}

/// Where the sweep of expired ids goes on.
#[derive(Debug, Default)]
struct Sweep {
    /// The last id the previous commit looked at; `None`: from the start.
    after: Option<String>,
}

/// Writes `writes` in one durable transaction at unix second `now`, with
/// the next step of the sweep, recording the redo log generation it
/// `covers`; how many expired ids the sweep deleted. The sweep looks at
/// [`SWEEP_PER_COMMIT`] ids and two more per id written, so it keeps up
/// with what is added however many ids each commit holds.
fn write_batch(
    db: &Database,
    writes: &[Write<'_>],
    covers: Option<u64>,
    sweep: &mut Sweep,
    now: u64,
) -> Result<usize, redb::Error> {
    let txn = db.begin_write()?;
    let (swept, after) = {
        let mut done = txn.open_table(DONE)?;
        let mut entities = txn.open_table(ENTITIES)?;
        let mut checkpoints = txn.open_table(CHECKPOINTS)?;
        let mut added = 0;
        for write in writes {
            match write {
                Write::Done(id, expires) => {
                    done.insert(*id, *expires)?;
                    added += 1;
                }
                Write::Entity(slot, state) => {
                    entities.insert(*slot, state.as_slice())?;
                }
                Write::Checkpoint(name, at) => {
                    checkpoints.insert(*name, *at)?;
                }
            }
        }
        if let Some(generation) = covers {
            txn.open_table(REDO)?.insert(COVERED, generation)?;
        }
        let range = match &sweep.after {
            Some(after) => {
                done.range::<&str>((Bound::Excluded(after.as_str()), Bound::Unbounded))?
            }
            None => done.range::<&str>(..)?,
        };
        let look_at = SWEEP_PER_COMMIT + 2 * added;
        let (mut looked_at, mut expired, mut last) = (0, Vec::new(), None);
        for entry in range.take(look_at) {
            let (id, at) = entry?;
            looked_at += 1;
            if at.value() <= now {
                expired.push(id.value().to_owned());
            }
            if looked_at == look_at {
                last = Some(id.value().to_owned());
            }
        }
        for id in &expired {
            done.remove(id.as_str())?;
        }
        // At the end of the table (`last` is none) the next sweep starts over.
        (expired.len(), last)
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
}
