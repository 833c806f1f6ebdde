//! The checkpoint thread: what was written in memory since the last
//! checkpoint, made durable in the file in one redb commit, with the offsets
//! of the records whose state it holds.
//!
//! Nothing waits for it: a delivery is answered once Kafka acknowledged its
//! record and the ledger holds its outcome in memory. The topics hold every
//! outcome meanwhile (delivery id, entity version and state hash are in each
//! record's headers), so what a crash takes from memory is read back from
//! them at the next start, from the offsets the last checkpoint recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tracing::{error, info};

use super::store::{Recent, Store};
use super::tables::{Sweep, Tables, write_batch};
use crate::adapters::ledger::WallClock;
use crate::adapters::ledger::placements::{Offsets, Placements};
use crate::adapters::ledger::{LedgerError, TopicsSeen};

/// How long a checkpoint waits for the sends of the epoch it sealed to
/// end: their offsets are counted now, not at the next checkpoint. A send
/// slower than this (a broker outage) only holds its partition's offset
/// back until it ends.
const SEAL_WAIT: Duration = Duration::from_millis(200);

/// What the thread is asked besides its interval.
pub(super) enum Ask {
    /// Memory holds many writes: a checkpoint now.
    Soon,
    /// A checkpoint now, answered when durable (shutdown).
    Now(oneshot::Sender<Result<(), LedgerError>>),
    /// Everything forgotten, answered when durable: the file cached other
    /// topics. Done here, between checkpoints, so none writes half of it.
    Forget(oneshot::Sender<Result<(), LedgerError>>),
}

/// The cluster and topics the offsets restored are of, set by a rebuild;
/// the next checkpoint records them with the offsets.
pub(super) type Seen = Mutex<Option<TopicsSeen>>;

/// Whether the last checkpoint failed, and why: `/readyz` shows it, and the
/// next one reopens the file first.
#[derive(Debug, Default)]
pub(super) struct Health {
    failing: Mutex<Option<String>>,
}

impl Health {
    pub(super) fn failing(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Said once per change.
    fn set(&self, outcome: &Result<(), LedgerError>) {
        let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
        match (outcome, failing.is_some()) {
            (Err(error), false) => {
                metrics::gauge!(crate::observe::telemetry::LEDGER_WRITABLE).set(0.0);
                error!(%error, "The ledger's checkpoint failed: deliveries go on (the topics hold their outcomes), and the ledger is read back from its last checkpoint's offsets should posbridge stop before one works.");
                *failing = Some(error.to_string());
            }
            (Ok(()), true) => {
                metrics::gauge!(crate::observe::telemetry::LEDGER_WRITABLE).set(1.0);
                info!("The ledger's checkpoints work again.");
                *failing = None;
            }
            _ => {}
        }
    }
}

/// Takes the checkpoints: on a thread of its own in the service
/// ([`checkpoint_loop`]), on the caller's thread when a simulation drives
/// them (`EmbeddedLedger::open_driven`).
pub(super) struct Checkpointer {
    pub(super) store: Arc<Store>,
    pub(super) placements: Arc<Placements>,
    pub(super) seen: Arc<Seen>,
    pub(super) health: Arc<Health>,
    /// How long a checkpoint waits for the sends of the epoch it sealed.
    pub(super) seal_wait: Duration,
    checkpoint: Checkpoint,
}

impl Checkpointer {
    pub(super) fn new(
        store: Arc<Store>,
        placements: Arc<Placements>,
        seen: Arc<Seen>,
        health: Arc<Health>,
        clock: WallClock,
    ) -> Checkpointer {
        Checkpointer {
            store,
            placements,
            seen,
            health,
            seal_wait: SEAL_WAIT,
            checkpoint: Checkpoint {
                clock,
                ..Checkpoint::default()
            },
        }
    }

    /// Does what was asked (`None`: the interval is up).
    pub(super) fn handle(&mut self, ask: Option<Ask>) {
        if let Some(Ask::Forget(reply)) = ask {
            // A write of the file like a checkpoint's: its failure shows in
            // the health, and the next write reopens the file first (redb
            // takes no write after an I/O error until it is reopened).
            let reopen_first = needs_reopen(&self.store, &self.health);
            let outcome = self
                .checkpoint
                .forget(&self.store, &self.placements, reopen_first);
            self.health.set(&outcome);
            let _ = reply.send(outcome);
            return;
        }
        let outcome = self.take();
        if let Some(Ask::Now(reply)) = ask {
            // The asker may have given up waiting; nothing to tell it.
            let _ = reply.send(outcome);
        }
    }

    /// One checkpoint, its outcome shown by the health.
    fn take(&mut self) -> Result<(), LedgerError> {
        let outcome = self.checkpoint.take(
            &self.store,
            &self.placements,
            &self.seen,
            &self.health,
            self.seal_wait,
        );
        self.health.set(&outcome);
        outcome
    }
}

/// The thread's loop: a checkpoint every `every`, when asked, and a last
/// one when every ledger handle is gone.
pub(super) fn checkpoint_loop(
    mut checkpointer: Checkpointer,
    asked: &AtomicBool,
    asks: &Receiver<Ask>,
    every: Duration,
) {
    loop {
        let ask = asks.recv_timeout(every);
        // Commits from here on may ask again.
        asked.store(false, Ordering::Release);
        match ask {
            Ok(ask) => checkpointer.handle(Some(ask)),
            Err(RecvTimeoutError::Timeout) => checkpointer.handle(None),
            Err(RecvTimeoutError::Disconnected) => {
                // Its outcome is in the health; nobody is left to tell.
                let _ = checkpointer.take();
                return;
            }
        }
    }
}

/// What the checkpoints so far wrote.
#[derive(Debug, Default)]
struct Checkpoint {
    sweep: Sweep,
    /// What the sweep of expired done ids counts time by.
    clock: WallClock,
    /// The offsets the file records.
    offsets: Offsets,
    /// The cluster and topics the file records they are of.
    topics: Option<TopicsSeen>,
}

impl Checkpoint {
    /// One checkpoint: seal the epoch, count the offsets of what ended,
    /// move memory's writes aside, write both durably, then let go of them.
    fn take(
        &mut self,
        store: &Store,
        placements: &Placements,
        seen: &Seen,
        health: &Health,
        seal_wait: Duration,
    ) -> Result<(), LedgerError> {
        let sealed = placements.seal();
        let deadline = Instant::now() + seal_wait;
        while !placements.finished(sealed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let offsets = placements.safe(sealed);
        // Read after the offsets: a rebuild restores its offsets first, so
        // topics read here are never newer than the offsets written with them.
        let topics = seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|topics| self.topics.as_ref() != Some(*topics))
            .cloned();
        let flushing = {
            let mut layers = store.layers();
            let current = std::mem::take(&mut layers.current);
            let flushing = Arc::new(current);
            layers.flushing = Some(flushing.clone());
            flushing
        };
        let reopen_first = needs_reopen(store, health);
        if flushing.len() == 0 && offsets == self.offsets && topics.is_none() && !reopen_first {
            store.layers().flushing = None;
            return Ok(());
        }
        let written = self.write(store, &flushing, &offsets, topics, reopen_first);
        let mut layers = store.layers();
        layers.flushing = None;
        if written.is_err() {
            // Kept for the next checkpoint, beneath what came since.
            layers.current.beneath(&flushing);
        }
        written
    }

    fn write(
        &mut self,
        store: &Store,
        flushing: &Recent,
        offsets: &Offsets,
        topics: Option<TopicsSeen>,
        reopen_first: bool,
    ) -> Result<(), LedgerError> {
        if reopen_first {
            reopen(store, 64 * flushing.len() as u64)?;
        }
        let opened = store.get()?;
        let storage = |e: redb::Error| LedgerError::Embedded(Arc::new(e));
        write_batch(
            &opened.db,
            &flushing.writes(),
            offsets,
            topics.as_ref(),
            &mut self.sweep,
            self.clock.unix_now(),
        )
        .map_err(storage)?;
        // The file holds it all now: reads find it there, through new
        // handles in place before the layer is let go of.
        let tables = Tables::open(&opened.db).map_err(storage)?;
        *opened
            .tables
            .write()
            .unwrap_or_else(PoisonError::into_inner) = tables;
        self.offsets.clone_from(offsets);
        if topics.is_some() {
            self.topics = topics;
        }
        Ok(())
    }

    /// Forgets what memory and the file hold, durably.
    fn forget(
        &mut self,
        store: &Store,
        placements: &Placements,
        reopen_first: bool,
    ) -> Result<(), LedgerError> {
        if reopen_first {
            reopen(store, 0)?;
        }
        {
            let mut layers = store.layers();
            layers.current = Recent::default();
            layers.flushing = None;
        }
        placements.forget();
        let opened = store.get()?;
        let storage = |e: redb::Error| LedgerError::Embedded(Arc::new(e));
        super::tables::forget(&opened.db).map_err(storage)?;
        let tables = Tables::open(&opened.db).map_err(storage)?;
        *opened
            .tables
            .write()
            .unwrap_or_else(PoisonError::into_inner) = tables;
        *self = Checkpoint::default();
        Ok(())
    }
}

/// Whether the next write opens the file again first: the last write
/// failed (redb takes none after an I/O error until it is reopened), or a
/// reopen failed and left no handle. Either way, nothing counts as working
/// again until a write has.
fn needs_reopen(store: &Store, health: &Health) -> bool {
    health.failing().is_some() || store.get().is_err()
}

/// Opens the file again after a write failed, room for `bytes` more first:
/// a reopen on a disk still full may fail and leave no handle for the
/// reads memory does not answer.
fn reopen(store: &Store, bytes: u64) -> Result<(), LedgerError> {
    crate::adapters::store_file::probe_disk(&store.path, 64 * 1024 + bytes).map_err(|e| {
        LedgerError::Open {
            path: store.path.display().to_string(),
            source: e.into(),
        }
    })?;
    store.reopen()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writable_gauge(recorder: &metrics_exporter_prometheus::PrometheusRecorder) -> String {
        crate::observe::telemetry::rendered(recorder, crate::observe::telemetry::LEDGER_WRITABLE)
    }

    /// On a recorder of its own: the suite's apps share the global one.
    #[test]
    fn a_failed_checkpoint_shows_the_ledger_unwritable_until_one_works() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            let health = Health::default();
            health.set(&Err(LedgerError::Closed));
            assert_eq!(health.failing().as_deref(), Some("ledger is closed"));
            assert_eq!(writable_gauge(&recorder), "posbridge_ledger_writable 0");
            health.set(&Err(LedgerError::Closed));
            health.set(&Ok(()));
            assert_eq!(health.failing(), None);
            assert_eq!(writable_gauge(&recorder), "posbridge_ledger_writable 1");
        });
    }
}
