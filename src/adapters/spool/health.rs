//! Whether the spool's file takes writes. After one I/O error (its disk
//! full) redb refuses every later write until the file is reopened, so the
//! first failure marks the spool unwritable: `/readyz` and
//! `posbridge_spool_writable` say so, appends are refused at once (503)
//! instead of each trying the disk, and at most once per [`RETRY_EVERY`]
//! an append or the drainer heals it: tries the disk with a plain file of an
//! entry's size, then reopens the spool file and writes a probe entry of
//! that size into it, taking out in the same commit the entries of appends
//! that failed (`doubt.rs`). Only a probe that is durable marks it writable
//! again: a reopen alone succeeds on a disk that is still full. Until then,
//! reads go on through the handle there is, so the drainer still publishes
//! what the spool holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use tracing::{error, info};

use super::Inner;
use crate::adapters::store_file::{self, Integrity, ReopenError};
use crate::domain::event::DeliveryKey;
use crate::observe::telemetry;

/// How often an unwritable spool tries to heal, as the ledger's fence does;
/// on tokio's clock, like the core's other retries, which a simulation's
/// paused clock moves (the system's does not: a world's spool stayed
/// unwritable after one failed write).
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The smallest probe a heal writes: a sale's body is a few KB. It writes
/// the spool's average entry when that is larger, so "writable" means one
/// more delivery of the usual size would be taken.
pub(super) const PROBE_BYTES: u64 = 16 * 1024;

/// One probe entry, written and removed by a heal to learn that writes work.
const PROBE: TableDefinition<u8, &[u8]> = TableDefinition::new("probe");

/// The spool's write health.
pub(super) struct Health {
    /// Whether writes work: read without the lock by every append.
    writable: AtomicBool,
    /// Why they do not, since when, and the last heal attempt.
    broken: Mutex<Option<Broken>>,
    /// Set while a heal runs, so one runs at a time.
    healing: AtomicBool,
}

struct Broken {
    reason: String,
    since: Instant,
    last_attempt: Instant,
}

impl Health {
    pub(super) fn new() -> Health {
        metrics::gauge!(telemetry::SPOOL_WRITABLE).set(1.0);
        Health {
            writable: AtomicBool::new(true),
            broken: Mutex::new(None),
            healing: AtomicBool::new(false),
        }
    }

    fn broken(&self) -> std::sync::MutexGuard<'_, Option<Broken>> {
        self.broken.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn is_writable(&self) -> bool {
        self.writable.load(Ordering::Acquire)
    }

    /// Why writes fail, while they do.
    pub(super) fn reason(&self) -> Option<String> {
        self.broken().as_ref().map(|broken| broken.reason.clone())
    }

    /// Notes a failed write (or read) of the file: the first marks the
    /// spool unwritable, and is said once.
    pub(super) fn failed(&self, why: &dyn std::fmt::Display) {
        let mut broken = self.broken();
        match broken.as_mut() {
            Some(broken) => broken.reason = why.to_string(),
            None => {
                error!(error = %why, "Spool writes are failing: deliveries that would spool are answered 503 until a write works again.");
                metrics::gauge!(telemetry::SPOOL_WRITABLE).set(0.0);
                let now = Instant::now();
                *broken = Some(Broken {
                    reason: why.to_string(),
                    since: now,
                    last_attempt: now,
                });
                self.writable.store(false, Ordering::Release);
            }
        }
    }

    /// Whether a heal may start now; if so, this caller runs it and must
    /// end it with [`Health::healed`] or [`Health::not_healed`].
    pub(super) fn start_heal(&self) -> bool {
        {
            let mut broken = self.broken();
            match broken.as_mut() {
                Some(broken) if broken.last_attempt.elapsed() >= RETRY_EVERY => {}
                _ => return false,
            }
            if self.healing.swap(true, Ordering::AcqRel) {
                return false;
            }
            if let Some(broken) = broken.as_mut() {
                broken.last_attempt = Instant::now();
            }
        }
        true
    }

    /// A heal wrote its probe durably: writes work again.
    pub(super) fn healed(&self) {
        if let Some(broken) = self.broken().take() {
            info!(
                after_secs = broken.since.elapsed().as_secs(),
                "Spool writes work again; spooling deliveries."
            );
        }
        metrics::gauge!(telemetry::SPOOL_WRITABLE).set(1.0);
        self.writable.store(true, Ordering::Release);
        self.healing.store(false, Ordering::Release);
    }

    /// A heal failed: the spool stays unwritable, for this reason now.
    pub(super) fn not_healed(&self, why: &dyn std::fmt::Display) {
        if let Some(broken) = self.broken().as_mut() {
            broken.reason = why.to_string();
        }
        self.healing.store(false, Ordering::Release);
    }
}

impl Inner {
    /// Reopens the file and writes (then removes) a probe of `probe_bytes`,
    /// taking out the entries of appends in doubt; marks the spool writable
    /// when both are durable. Blocking.
    pub(super) fn heal(&self, probe_bytes: u64) -> bool {
        // The disk first, with a plain file: reopening on a disk that is
        // still full can fail (redb repairs a file it could not close
        // cleanly, which writes), and would leave no handle to read the
        // spooled entries through while the drainer replays them.
        if let Err(error) = crate::adapters::store_file::probe_disk(&self.path, probe_bytes) {
            self.health.not_healed(&error);
            return false;
        }
        let reopened = self
            .db
            .reopen(
                || store_file::open_with(&self.path, Integrity::Trust, &self.disk),
                store_file::is_held,
            )
            .map_err(|error| match error {
                ReopenError::Busy => "reads kept the spool file open past the wait".to_owned(),
                ReopenError::Open(error) => error.to_string(),
            });
        let in_doubt = self.counts().in_doubt.entries();
        let probed = reopened.and_then(|()| {
            let db = self.db.get().ok_or("the spool file is not open")?;
            probe(&db, probe_bytes, &in_doubt).map_err(|error| error.to_string())
        });
        match probed {
            Ok((entries, bytes)) => {
                let mut counts = self.counts();
                counts.in_doubt.taken_out(&in_doubt);
                // What the file holds, not what the counts kept: a write
                // that failed may have landed all the same (a removal's
                // entries gone, the counts still holding them; the drainer
                // would then look for entries it never finds).
                counts.entries = entries;
                counts.bytes = bytes;
                drop(counts);
                self.health.healed();
                true
            }
            Err(why) => {
                self.health.not_healed(&why);
                false
            }
        }
    }
}

/// Writes `bytes` into the probe table, taking `in_doubt` out of the
/// spool's, then removes them, each durably; the entries and bytes the
/// spool's table holds then (a redb commit that failed may have landed:
/// after a reopen, the file says what is there).
fn probe(
    db: &Database,
    bytes: u64,
    in_doubt: &[(u64, DeliveryKey)],
) -> Result<(u64, u64), redb::Error> {
    let filler = vec![0u8; usize::try_from(bytes).unwrap_or(usize::MAX)];
    let txn = db.begin_write()?;
    txn.open_table(PROBE)?.insert(0, filler.as_slice())?;
    super::take_out(&txn, in_doubt)?;
    let held = {
        let entries = txn.open_table(super::ENTRIES)?;
        let mut held_bytes = 0;
        for entry in entries.iter()? {
            held_bytes += entry?.1.value().len() as u64;
        }
        (entries.len()?, held_bytes)
    };
    txn.commit()?;
    let txn = db.begin_write()?;
    txn.open_table(PROBE)?.remove(0)?;
    txn.commit()?;
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writable_gauge(recorder: &metrics_exporter_prometheus::PrometheusRecorder) -> String {
        telemetry::rendered(recorder, telemetry::SPOOL_WRITABLE)
    }

    #[test]
    fn the_gauge_and_the_state_say_unwritable_from_a_failure_until_a_heal() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            let health = Health::new();
            assert_eq!(writable_gauge(&recorder), "posbridge_spool_writable 1");
            health.failed(&"No space left on device");
            assert!(!health.is_writable());
            assert_eq!(writable_gauge(&recorder), "posbridge_spool_writable 0");
            assert_eq!(health.reason().as_deref(), Some("No space left on device"));
            assert!(
                !health.start_heal(),
                "a heal waits RETRY_EVERY after the failure"
            );
            health.healed();
            assert!(health.is_writable());
            assert_eq!(health.reason(), None);
            assert_eq!(writable_gauge(&recorder), "posbridge_spool_writable 1");
        });
    }
}
