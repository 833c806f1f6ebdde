//! A minimal ledger store on fjall, the storage a fjall backend of the
//! embedded ledger would need: done delivery ids with their expiry in one
//! keyspace, entity states in another, leases in memory as today, and one
//! writer thread that group-commits. fjall has no group commit of its own
//! (each `persist` takes the journal's lock and syncs, whoever already
//! synced the bytes), so the writer batches as posbridge's does: it starts
//! a commit at most every [`COMMIT_EVERY`], writes everything queued as one
//! atomic batch and syncs the journal once (`PersistMode::SyncData`) before
//! it answers. Expired ids are dropped by a compaction filter, so there is
//! no sweep of our own.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fjall::compaction::filter::{
    CompactionFilter, CompactionFilterResult, Context, Factory, ItemAccessor, Verdict,
};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};
use posbridge::adapters::ledger::Begin;
use tokio::sync::{mpsc, oneshot};

/// As posbridge's writer: a commit under load waits at most this long to
/// share its sync with the others.
const COMMIT_EVERY: Duration = Duration::from_millis(2);
/// Memory bounds that fit posbridge's 64 MiB RSS aim (fjall's defaults are
/// a 32 MiB block cache and 64 MiB memtables per keyspace).
const CACHE_BYTES: u64 = 8 * 1024 * 1024;
const MEMTABLE_BYTES: u64 = 8 * 1024 * 1024;

/// One delivery made done with its entity's state.
struct Write {
    id: String,
    slot: String,
    state: [u8; 36],
}

type Reply = oneshot::Sender<Result<(), Arc<fjall::Error>>>;

/// The store; close it with [`FjallStore::close`] before opening it again.
pub struct FjallStore {
    done: Keyspace,
    leases: Mutex<HashSet<String>>,
    writer: mpsc::UnboundedSender<(Write, Reply)>,
    thread: JoinHandle<()>,
}

impl FjallStore {
    /// Opens (or creates) the store in `dir`, recovering its journal.
    pub fn open(dir: &Path, dedup_ttl: Duration) -> fjall::Result<FjallStore> {
        let db = Database::builder(dir)
            .cache_size(CACHE_BYTES)
            .with_compaction_filter_factories(Arc::new(|keyspace| {
                (keyspace == "done").then(|| Arc::new(Expired) as Arc<dyn Factory>)
            }))
            .open()?;
        let options = || KeyspaceCreateOptions::default().max_memtable_size(MEMTABLE_BYTES);
        let done = db.keyspace("done", options)?;
        let entities = db.keyspace("entities", options)?;
        let (writer, queue) = mpsc::unbounded_channel();
        let thread = {
            let done = done.clone();
            std::thread::spawn(move || write_loop(&db, &done, &entities, queue, dedup_ttl))
        };
        Ok(FjallStore {
            done,
            leases: Mutex::default(),
            writer,
            thread,
        })
    }

    /// Takes the delivery's lease unless it is held or the id is done.
    pub fn begin(&self, id: &str) -> fjall::Result<Begin> {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if leases.contains(id) {
            return Ok(Begin::InFlight);
        }
        if self.is_done(id)? {
            return Ok(Begin::Done);
        }
        leases.insert(id.to_owned());
        Ok(Begin::New)
    }

    /// Whether the id is done and not yet expired.
    pub fn is_done(&self, id: &str) -> fjall::Result<bool> {
        Ok(self.done.get(id)?.is_some_and(|v| expiry(&v) > unix_now()))
    }

    /// Makes the delivery done with the entity's state, durably, then ends
    /// its lease.
    pub async fn commit(&self, id: &str, slot: &str, state: [u8; 36]) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        let write = Write {
            id: id.to_owned(),
            slot: slot.to_owned(),
            state,
        };
        let result = match self.writer.send((write, reply)) {
            Ok(()) => match answer.await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err("writer gone".to_owned()),
            },
            Err(_) => Err("writer gone".to_owned()),
        };
        self.leases
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        result
    }

    /// Stops the writer and lets go of the database (fjall syncs its
    /// journal when the last handle drops).
    pub fn close(self) {
        let FjallStore {
            done,
            writer,
            thread,
            ..
        } = self;
        drop((done, writer));
        let _ = thread.join();
    }
}

fn write_loop(
    db: &Database,
    done: &Keyspace,
    entities: &Keyspace,
    mut queue: mpsc::UnboundedReceiver<(Write, Reply)>,
    dedup_ttl: Duration,
) {
    let mut last_commit = Instant::now() - COMMIT_EVERY;
    let mut batch = Vec::new();
    while let Some(first) = queue.blocking_recv() {
        if let Some(wait) = (last_commit + COMMIT_EVERY).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        last_commit = Instant::now();
        batch.push(first);
        while let Ok(next) = queue.try_recv() {
            batch.push(next);
        }
        let expires = (unix_now() + dedup_ttl.as_secs()).to_be_bytes();
        let mut writes = db.batch().durability(Some(PersistMode::SyncData));
        for (write, _) in &batch {
            writes.insert(done, write.id.as_str(), &expires[..]);
            writes.insert(entities, write.slot.as_str(), &write.state[..]);
        }
        let result = writes.commit().map_err(Arc::new);
        for (_, reply) in batch.drain(..) {
            let _ = reply.send(result.clone());
        }
    }
}

/// Drops done ids whose time is up when their table is compacted.
struct Expired;

impl Factory for Expired {
    fn name(&self) -> &str {
        "expired-delivery-ids"
    }

    fn make_filter(&self, _: &Context) -> Box<dyn CompactionFilter> {
        Box::new(ExpiredBefore(unix_now()))
    }
}

struct ExpiredBefore(u64);

impl CompactionFilter for ExpiredBefore {
    fn filter_item(&mut self, item: ItemAccessor<'_>, _: &Context) -> CompactionFilterResult {
        Ok(if expiry(&item.value()?) <= self.0 {
            Verdict::Remove
        } else {
            Verdict::Keep
        })
    }
}

fn expiry(value: &[u8]) -> u64 {
    value.try_into().map_or(0, u64::from_be_bytes)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
