//! The fence: once a ledger write fails, nothing new is taken until writes
//! work again.
//!
//! A ledger that cannot record outcomes silently ends both guarantees it
//! exists for: done ids are not remembered (duplicates publish again) and a
//! newer entity state is not recorded (an older event then passes the stale
//! guard and rolls the compacted topic back). redb, after an I/O error such
//! as a full disk, refuses every later write until the file is reopened.
//!
//! So the first failed commit raises the fence: every read and `begin` is
//! refused with [`LedgerError::Unwritable`] (503 + Retry-After, or the spool),
//! `/readyz` fails, and the failed commits are kept in memory. At most once
//! per [`RETRY_EVERY`] a request tries to heal: reopen the store, write the
//! kept commits in order, and lower the fence when they are durable. The
//! record a kept commit describes is already in Kafka; writing its entity
//! state before anything else is read keeps the stale guard exact.
//!
//! [`Fence`] is that state; the [`super::Ledger`] asks it around each call
//! to its store.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use tracing::{error, info, warn};

use super::{Backend, Commit, LedgerError, Store};
use crate::observe::telemetry;

/// How often a fenced ledger tries to heal.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The fence's state. See the module documentation.
pub(super) struct Fence {
    raised: Mutex<Option<Raised>>,
    /// Whether `raised` holds one: read without the lock on every call, so
    /// a healthy ledger pays one atomic load.
    up: AtomicBool,
    /// Serializes healing, so one attempt runs at a time.
    healing: tokio::sync::Mutex<()>,
    /// Failed commits so far: a read that waited for an entity's lock knows
    /// from it whether a commit failed meanwhile
    /// ([`super::Ledger::lock_and_read`]).
    failures: AtomicU64,
    /// Whether the store took the last write asked of it outside a commit:
    /// a `begin` (a lease is a write) or the readiness check's probe. A
    /// store that refuses writes (Redis at `maxmemory` under `noeviction`,
    /// a read-only replica) fails every `begin` before a commit could raise
    /// the fence, so this is what `/readyz` and the gauge read then.
    takes_writes: AtomicBool,
}

/// Why the fence is up, since when, and what waits to be written.
struct Raised {
    reason: String,
    since: Instant,
    last_attempt: Instant,
    pending: Vec<Commit>,
}

impl Fence {
    /// A lowered fence, for a store that answered at start-up.
    pub(super) fn new() -> Self {
        metrics::gauge!(telemetry::LEDGER_WRITABLE).set(1.0);
        Fence {
            raised: Mutex::new(None),
            up: AtomicBool::new(false),
            healing: tokio::sync::Mutex::new(()),
            failures: AtomicU64::new(0),
            takes_writes: AtomicBool::new(true),
        }
    }

    /// Failed commits so far.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Ordering::Acquire)
    }

    /// The gauge: 1 while the fence is down and the store takes writes.
    fn show_writable(&self) {
        let writable =
            !self.up.load(Ordering::Acquire) && self.takes_writes.load(Ordering::Acquire);
        metrics::gauge!(telemetry::LEDGER_WRITABLE).set(if writable { 1.0 } else { 0.0 });
    }

    /// Notes whether a write outside a commit worked, saying so once when
    /// that changes.
    pub(super) fn saw_write<T>(&self, result: &Result<T, LedgerError>) {
        let works = result.is_ok();
        if self.takes_writes.swap(works, Ordering::AcqRel) == works {
            return;
        }
        match result {
            Err(error) => warn!(
                %error,
                "A ledger write or check failed: deliveries are refused (or spooled) until one works again."
            ),
            Ok(_) => info!("Ledger writes and checks work again."),
        }
        self.show_writable();
    }

    fn raised(&self) -> std::sync::MutexGuard<'_, Option<Raised>> {
        self.raised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `commit` when the fence is up, deciding under the lock; the
    /// error to answer with, or `None` when the fence is down.
    fn keep_if_up(&self, commit: &Commit) -> Option<LedgerError> {
        if !self.up.load(Ordering::Acquire) {
            return None;
        }
        self.raised().as_mut().map(|raised| {
            raised.pending.push(commit.clone());
            LedgerError::Unwritable {
                reason: raised.reason.clone(),
            }
        })
    }

    /// Raises the fence (once) and keeps `commit` to be written on healing.
    fn raise(&self, commit: Commit, error: &LedgerError) {
        let mut raised = self.raised();
        self.failures.fetch_add(1, Ordering::AcqRel);
        match raised.as_mut() {
            Some(raised) => raised.pending.push(commit),
            None => {
                error!(%error, "Ledger writes are failing: refusing deliveries until a write works again.");
                let now = Instant::now();
                self.up.store(true, Ordering::Release);
                self.show_writable();
                *raised = Some(Raised {
                    reason: error.to_string(),
                    since: now,
                    last_attempt: now,
                    pending: vec![commit],
                });
            }
        }
    }

    /// `Ok` when the fence is down, or was lowered by this call's healing
    /// of `store`.
    ///
    /// # Errors
    /// [`LedgerError::Unwritable`] while it stays up.
    pub(super) async fn open(&self, store: &Backend) -> Result<(), LedgerError> {
        if !self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        let due = match self.raised().as_mut() {
            None => return Ok(()),
            Some(raised) if raised.last_attempt.elapsed() >= RETRY_EVERY => {
                raised.last_attempt = Instant::now();
                true
            }
            Some(_) => false,
        };
        if due && let Ok(_healing) = self.healing.try_lock() {
            // In a box of its own: rare, and every call of the line holds
            // this future, which a move copies whole.
            Box::pin(self.heal(store)).await;
        }
        match self.raised().as_ref() {
            None => Ok(()),
            Some(raised) => Err(LedgerError::Unwritable {
                reason: raised.reason.clone(),
            }),
        }
    }

    /// Commits `commit` to `store` unless the fence is up (healing first
    /// when due); a failed write raises it. Kept or failed, the commit is
    /// written again on healing, and its delivery's lease given back.
    ///
    /// # Errors
    /// [`LedgerError::Unwritable`] while the fence is up, or the store's
    /// error that raised it.
    pub(super) async fn commit(&self, store: &Backend, commit: Commit) -> Result<(), LedgerError> {
        // Heal first when due; then, if the fence is still up, keep the
        // commit under the same lock that saw it up.
        let _ = self.open(store).await;
        if let Some(error) = self.keep_if_up(&commit) {
            if let Some(done) = &commit.delivery {
                store.release(&done.key).await;
            }
            return Err(error);
        }
        match store.commit(&commit).await {
            Ok(()) => Ok(()),
            Err(error) => {
                self.raise(commit, &error);
                Err(error)
            }
        }
    }

    /// Commits kept to be written again are of the topics forgotten: they
    /// go too.
    pub(super) fn forget_pending(&self) {
        if let Some(raised) = self.raised().as_mut() {
            raised.pending.clear();
        }
    }

    /// Reopens the store and writes the kept commits in order; lowers the
    /// fence when all are durable. A commit leaves the list only after its
    /// write succeeded, so a heal cut short (its request dropped) loses
    /// nothing: the next one writes it again, which is harmless. Emptiness is
    /// decided and the fence lowered under one lock, so a commit kept
    /// meanwhile is never dropped.
    async fn heal(&self, store: &Backend) {
        if store.reopen().await.is_err() {
            return;
        }
        loop {
            let next = {
                let mut guard = self.raised();
                let Some(raised) = guard.as_ref() else { return };
                match raised.pending.first() {
                    Some(commit) => commit.clone(),
                    None => {
                        let since = raised.since;
                        *guard = None;
                        self.up.store(false, Ordering::Release);
                        self.show_writable();
                        info!(
                            after_secs = since.elapsed().as_secs(),
                            "Ledger writes work again; taking deliveries."
                        );
                        return;
                    }
                }
            };
            match store.commit(&next).await {
                // Only one heal runs at a time and others only append, so
                // the first is still the one just written.
                Ok(()) => {
                    if let Some(raised) = self.raised().as_mut() {
                        raised.pending.remove(0);
                    }
                }
                Err(error) => {
                    if let Some(raised) = self.raised().as_mut() {
                        raised.reason = error.to_string();
                    }
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use crate::adapters::ledger::failing::FailingWrites;
    use crate::adapters::ledger::{
        Backend, Begin, Commit, EmbeddedLedger, EntitySlot, Gate, Held, Ledger, LedgerError,
    };
    use crate::domain::event::{DeliveryKey, EntityKey, EntityType, ProviderKind, Version};
    use crate::domain::guard::EntityState;

    /// An embedded ledger in `dir` behind an open gate and the fence, whose
    /// writes fail from the start when `failing`; the store, to fail them.
    fn failing_writes(dir: &tempfile::TempDir, failing: bool) -> (Ledger, Arc<FailingWrites>) {
        let ledger = EmbeddedLedger::open(
            &dir.path().join("ledger.redb"),
            Duration::from_secs(3600),
            Duration::from_secs(30),
        )
        .unwrap();
        let store = Arc::new(FailingWrites {
            ledger,
            failing: AtomicBool::new(failing),
            locks_asked: tokio::sync::watch::Sender::new(0),
        });
        let gate = Gate::closed();
        gate.end(Ok(()));
        let backend = Backend::Failing(store.clone());
        (Ledger::new(Arc::new(backend), gate), store)
    }

    #[tokio::test]
    async fn a_read_that_waited_for_the_lock_of_a_holder_whose_commit_failed_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (fenced, store) = failing_writes(&dir, false);
        let fenced = Arc::new(fenced);
        let slot = EntitySlot::new(
            EntityType::Sale,
            &EntityKey::new(ProviderKind::ReceiptRoller, None, "S-1"),
        );
        // The holder of the lock publishes a newer state...
        let (held, _) = fenced.lock_and_read(&slot).await.unwrap();
        let waiter = tokio::spawn({
            let (fenced, slot) = (fenced.clone(), slot.clone());
            async move { fenced.lock_and_read(&slot).await.map(|(_, state)| state) }
        });
        // The waiter asks for the lock (past the fence, which is down)...
        let _ = store
            .locks_asked
            .subscribe()
            .wait_for(|asked| *asked == 2)
            .await;
        // ...while the holder fails to record its state, then lets go.
        store.failing.store(true, Ordering::Release);
        let newer = EntityState {
            version: Version {
                at_micros: 1_700_000_000_000_000,
                rank: 0,
            },
            state_hash: [7; 16],
        };
        assert!(
            fenced
                .commit(Commit {
                    entity: Some((slot.clone(), Held::unplaced(newer))),
                    ..Commit::NOTHING
                })
                .await
                .is_err()
        );
        drop(held);
        let read = waiter.await.unwrap();
        assert!(
            matches!(read, Err(LedgerError::Unwritable { .. })),
            "the state read under the lock misses the newer one the fence keeps: {read:?}"
        );
    }

    fn writable_gauge(recorder: &metrics_exporter_prometheus::PrometheusRecorder) -> String {
        crate::observe::telemetry::rendered(recorder, crate::observe::telemetry::LEDGER_WRITABLE)
    }

    /// The gauge of this ledger alone (a recorder of the test's own): a
    /// lease the store refuses says unwritable before any commit failed,
    /// and the next write that works (the readiness check) says writable.
    #[test]
    fn a_refused_lease_shows_the_ledger_unwritable_until_a_write_works() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        metrics::with_local_recorder(&recorder, || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let dir = tempfile::tempdir().unwrap();
                let (fenced, store) = failing_writes(&dir, true);
                assert_eq!(writable_gauge(&recorder), "posbridge_ledger_writable 1");
                let delivery = DeliveryKey::new(ProviderKind::Mekari, "d-1");
                assert!(fenced.begin(&delivery).await.is_err());
                assert_eq!(writable_gauge(&recorder), "posbridge_ledger_writable 0");
                store.failing.store(false, Ordering::Release);
                fenced.check().await.unwrap();
                assert_eq!(writable_gauge(&recorder), "posbridge_ledger_writable 1");
                assert_eq!(fenced.begin(&delivery).await.unwrap(), Begin::New);
            });
        });
    }
}
