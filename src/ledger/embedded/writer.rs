//! The writer thread: group commit of whatever has queued up, as one redo
//! log frame or one durable commit of the file.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tracing::{error, warn};

use super::store::{Opened, Recent, Store};
use super::tables::{Sweep, Tables, unix_now, write_batch};
use super::wal::{self, Write};
use crate::ledger::{Commit, LedgerError};

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

pub(super) type Reply = oneshot::Sender<Result<(), LedgerError>>;

/// The writer thread: take everything queued, make it durable in one step,
/// answer every waiter with the result.
pub(super) fn write_loop(
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
pub(super) enum Synced {
    /// A frame of the redo log; the writes wait in [`Recent`].
    InLog,
    /// A durable redb commit of everything recent (due, or the log is full
    /// or failing), after which the log starts over.
    InRedb,
}

/// Makes one batch durable: as a redo log frame, its writes kept in
/// [`Recent`] for reads; and when `apply_due` (or the log cannot take the
/// batch), everything recent in one durable redb commit.
pub(super) fn commit_batch(
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
