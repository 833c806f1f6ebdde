//! The ledger's gate: closed while the ledger is being filled from the
//! topics, so nothing is decided on a ledger that does not hold what the
//! topics say yet. A closed gate refuses leases and guard reads with
//! [`LedgerError::Rebuilding`] (the delivery spools, or is answered 503 with
//! `Retry-After`), after a short wait so a start-up read of the topics'
//! last second is not seen by providers at all. It also keeps the progress
//! `/readyz`, `/status` and the metrics show.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::LedgerError;

/// How long a lease or a guard read waits for a closed gate to open.
const WAIT_FOR_OPEN: Duration = Duration::from_secs(1);

/// Where a rebuild stands.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Progress {
    /// Whether one runs now (the gate is closed).
    pub running: bool,
    /// Records read so far by the one running (or the last).
    pub records_read: u64,
    /// Records it has to read in all, as the partitions' offsets said when
    /// it began.
    pub records_to_read: u64,
    /// Partitions read to their end.
    pub partitions_done: u64,
    /// Partitions it reads.
    pub partitions: u64,
    /// Seconds it has run (or the last one ran).
    pub secs: f64,
    /// Seconds still to go at the rate so far, while it runs.
    pub eta_secs: Option<f64>,
    /// Why the last attempt failed, when it did (it is tried again).
    pub failed: Option<String>,
    /// Why the ledger was last forgotten and filled whole though it held
    /// offsets (it cached other topics than the cluster's), since start-up.
    pub forgotten_because: Option<String>,
    /// Fills started again since start-up because the store lost what they
    /// had written (a `FLUSHALL` in the middle of one).
    pub restarted: u64,
    /// Seconds since start-up while the first fill has begun and the gate
    /// has never opened (its attempts, and the waits between them, still
    /// going on); `None` before the first began and once the gate opened.
    pub first_fill_secs: Option<f64>,
}

/// The gate and the progress behind it. Shared by the [`super::Ledger`], the
/// rebuild and the operations endpoints.
#[derive(Debug)]
pub struct Gate {
    open: AtomicBool,
    opened: tokio::sync::Notify,
    /// Asked when a ledger is found lost while serving.
    lost: tokio::sync::Notify,
    /// The progress, when the running fill began, and how many times the
    /// ledger was found lost: a fill that began before the last loss does
    /// not open the gate ([`Gate::end_filled`]).
    progress: Mutex<(Progress, Option<Instant>, u64)>,
    /// When the gate was made (at start-up), whether a fill has begun and
    /// whether the gate has opened since: a replica still on its first
    /// fill says so to `/readyz`, between its attempts too.
    created: Instant,
    began: AtomicBool,
    ever_opened: AtomicBool,
}

impl Gate {
    /// A closed gate: nothing is decided until a rebuild opens it.
    pub fn closed() -> Arc<Gate> {
        Arc::new(Gate {
            open: AtomicBool::new(false),
            opened: tokio::sync::Notify::new(),
            lost: tokio::sync::Notify::new(),
            progress: Mutex::default(),
            created: Instant::now(),
            began: AtomicBool::new(false),
            ever_opened: AtomicBool::new(false),
        })
    }

    /// Whether deliveries are decided now.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, (Progress, Option<Instant>, u64)> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A rebuild begins: closed, its figures reset.
    pub fn begin(&self, partitions: u64, records_to_read: u64) {
        self.open.store(false, Ordering::Release);
        self.began.store(true, Ordering::Release);
        let mut progress = self.progress();
        let forgotten_because = progress.0.forgotten_because.take();
        let restarted = progress.0.restarted;
        progress.0 = Progress {
            running: true,
            partitions,
            records_to_read,
            forgotten_because,
            restarted,
            ..Progress::default()
        };
        progress.1 = Some(Instant::now());
    }

    /// A fill found the keys it wrote gone, and starts again.
    pub fn restarted(&self) {
        self.progress().0.restarted += 1;
    }

    /// The ledger was found caching other topics than the cluster's, and
    /// is forgotten and filled whole: `/readyz` and `/status` say why.
    pub fn filled_whole_because(&self, why: String) {
        self.progress().0.forgotten_because = Some(why);
    }

    /// `records` more were read; `partition_done` when a partition ended.
    pub fn read(&self, records: u64, partition_done: bool) {
        let mut progress = self.progress();
        progress.0.records_read += records;
        progress.0.partitions_done += u64::from(partition_done);
    }

    /// The rebuild ended: open, or closed with why it failed.
    pub fn end(&self, outcome: Result<(), String>) {
        {
            let mut progress = self.progress();
            progress.0.running = false;
            progress.0.failed = outcome.as_ref().err().cloned();
            progress.0.secs = progress.1.map_or(0.0, |at| at.elapsed().as_secs_f64());
        }
        if outcome.is_ok() {
            self.open.store(true, Ordering::Release);
            self.ever_opened.store(true, Ordering::Release);
            self.opened.notify_waiters();
        }
    }

    /// How many times the ledger was found lost so far: what a fill
    /// notes when it begins, for [`Gate::end_filled`].
    pub fn losses(&self) -> u64 {
        self.progress().2
    }

    /// A fill that began when [`Gate::losses`] said `losses` ended well:
    /// the gate opens, unless the ledger was found lost since (a Redis
    /// restarted in the middle of the fill), which another fill must read
    /// first: then it stays closed and `false` is returned. Decided under
    /// the lock [`Gate::found_lost`] counts under, so no delivery is decided
    /// between the two.
    pub fn end_filled(&self, losses: u64) -> bool {
        let mut progress = self.progress();
        if progress.2 != losses {
            return false;
        }
        progress.0.running = false;
        progress.0.failed = None;
        progress.0.secs = progress.1.map_or(0.0, |at| at.elapsed().as_secs_f64());
        self.open.store(true, Ordering::Release);
        self.ever_opened.store(true, Ordering::Release);
        drop(progress);
        self.opened.notify_waiters();
        true
    }

    /// Where it stands now.
    pub fn snapshot(&self) -> Progress {
        let (mut progress, started, _) = self.progress().clone();
        if progress.running
            && let Some(started) = started
        {
            progress.secs = started.elapsed().as_secs_f64();
            let rate = progress.records_read as f64 / progress.secs.max(0.001);
            let left = progress
                .records_to_read
                .saturating_sub(progress.records_read);
            progress.eta_secs = (rate > 0.0).then(|| left as f64 / rate);
        }
        progress.first_fill_secs = (self.began.load(Ordering::Acquire)
            && !self.ever_opened.load(Ordering::Acquire))
        .then(|| self.created.elapsed().as_secs_f64());
        progress
    }

    /// Closes the gate: the ledger was found lost while serving
    /// ([`LedgerError::Lost`]: its keys are gone; [`LedgerError::Changed`]:
    /// its last writes may be). The rebuild task, waiting in
    /// [`Gate::lost`], reads the topics again.
    pub fn found_lost(&self, error: &LedgerError) {
        let was_open = {
            let mut progress = self.progress();
            progress.2 += 1;
            self.open.swap(false, Ordering::AcqRel)
        };
        if was_open {
            match error {
                LedgerError::Changed { why } => tracing::warn!(
                    %why,
                    "The ledger may have lost its last writes: deliveries wait while the topics are read from its offsets to their end."
                ),
                _ => tracing::error!(
                    "The ledger lost its keys while serving (its generation mark is gone: FLUSHALL, or a failover to an empty replica): deliveries wait while it is filled from the topics again."
                ),
            }
        }
        self.lost.notify_one();
    }

    /// Waits until the ledger is found lost.
    pub async fn lost(&self) {
        self.lost.notified().await;
    }

    /// Whether the gate is open, or opens within `wait`.
    pub async fn opens_within(&self, wait: Duration) -> bool {
        if self.is_open() {
            return true;
        }
        let opened = self.opened.notified();
        if !self.is_open() {
            let _ = tokio::time::timeout(wait, opened).await;
        }
        self.is_open()
    }

    /// A lost ledger found by `result` closes the gate.
    pub(super) fn saw<T>(&self, result: Result<T, LedgerError>) -> Result<T, LedgerError> {
        if let Err(error @ (LedgerError::Lost | LedgerError::Changed { .. })) = &result {
            self.found_lost(error);
        }
        result
    }

    /// Whether to ask again after `result`: the ledger was found lost, and
    /// refilled within the gate's wait.
    pub(super) async fn again<T>(
        &self,
        result: &Result<T, LedgerError>,
    ) -> Result<bool, LedgerError> {
        let Err(error @ (LedgerError::Lost | LedgerError::Changed { .. })) = result else {
            return Ok(false);
        };
        self.found_lost(error);
        self.wait_open().await?;
        Ok(true)
    }

    /// [`LedgerError::Rebuilding`] while the gate is closed, with how far
    /// the fill got.
    pub(super) fn check_open(&self) -> Result<(), LedgerError> {
        if self.is_open() {
            return Ok(());
        }
        let progress = self.snapshot();
        Err(LedgerError::Rebuilding {
            read: progress.records_read,
            of: progress.records_to_read,
        })
    }

    /// Waits up to [`WAIT_FOR_OPEN`] for the gate to open.
    ///
    /// # Errors
    /// [`LedgerError::Rebuilding`] when it stays closed.
    pub(super) async fn wait_open(&self) -> Result<(), LedgerError> {
        if self.is_open() {
            return Ok(());
        }
        // In a box of its own: the wait is rare (a fill), and every call of
        // the line holds this future, which a move copies whole.
        Box::pin(self.opens_within(WAIT_FOR_OPEN)).await;
        self.check_open()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_closed_gate_refuses_after_its_wait_and_opens_when_filled() {
        let gate = Gate::closed();
        gate.begin(3, 100);
        gate.read(40, true);
        let refused = gate.wait_open().await;
        assert!(
            matches!(refused, Err(LedgerError::Rebuilding { read: 40, of: 100 })),
            "{refused:?}"
        );
        let progress = gate.snapshot();
        assert!(progress.running);
        assert_eq!(progress.partitions_done, 1);
        assert!(progress.eta_secs.is_some());

        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.wait_open().await })
        };
        tokio::task::yield_now().await;
        gate.end(Ok(()));
        assert!(waiting.await.unwrap().is_ok(), "a waiter is let through");
        assert!(!gate.snapshot().running);

        gate.found_lost(&LedgerError::Lost);
        assert!(!gate.is_open());
        tokio::time::timeout(Duration::from_millis(10), gate.lost())
            .await
            .expect("the rebuild task is woken");
    }

    /// A Redis restarted while a fill read the topics: that fill does not
    /// open the gate, the next one (begun after) does.
    #[test]
    fn a_fill_begun_before_the_last_loss_does_not_open_the_gate() {
        let gate = Gate::closed();
        let losses = gate.losses();
        gate.begin(1, 10);
        gate.found_lost(&LedgerError::Changed {
            why: "Redis restarted".to_owned(),
        });
        assert!(!gate.end_filled(losses));
        assert!(!gate.is_open());
        let losses = gate.losses();
        gate.begin(1, 10);
        gate.restarted();
        assert!(gate.end_filled(losses));
        assert!(gate.is_open());
        let progress = gate.snapshot();
        assert!(!progress.running);
        assert_eq!(progress.restarted, 1);
    }
}
