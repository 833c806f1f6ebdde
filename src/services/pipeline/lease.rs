//! A delivery's lease as a value: whoever holds it is the one attempt of
//! that delivery at work. It travels down the line with the delivery, into
//! the task that waits for Kafka's acknowledgement when a record was handed
//! to the producer, and ends with the outcome's commit.
//!
//! Dropped without a commit (an error, or an answer deadline that cut the
//! work before any record reached the producer), it is given back, so that
//! a retry may take over at once. A lease whose record is still in the
//! producer when the deadline passes lives on in that record's task: a retry
//! or a spool replay meanwhile finds the delivery in flight and waits,
//! instead of writing it a second time.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

use crate::adapters::ledger::Ledger;
use crate::domain::event::DeliveryKey;

/// The lease of one delivery, taken from the ledger.
pub(super) struct Lease {
    key: DeliveryKey,
    ledger: Arc<Ledger>,
    /// Where the release of a dropped lease runs, so shutdown waits for it.
    tasks: TaskTracker,
    /// That release, for [`Released::wait`].
    release: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// Ended by the commit of its outcome: nothing to give back.
    ended: bool,
}

/// Whoever runs a lease's work waits here for its release, so that the
/// delivery can be taken again as soon as the answer is out.
pub(super) struct Released(Arc<Mutex<Option<JoinHandle<()>>>>);

impl Lease {
    /// The lease `ledger` just gave for `key`, and where its release is
    /// waited for.
    pub(super) fn held(
        key: DeliveryKey,
        ledger: Arc<Ledger>,
        tasks: TaskTracker,
    ) -> (Lease, Released) {
        let release = Arc::default();
        let lease = Lease {
            key,
            ledger,
            tasks,
            release: Arc::clone(&release),
            ended: false,
        };
        (lease, Released(release))
    }

    /// The delivery it is the lease of.
    pub(super) fn key(&self) -> &DeliveryKey {
        &self.key
    }

    /// The ledger's commit of the outcome ended it.
    pub(super) fn ended(mut self) {
        self.ended = true;
    }

    /// Gives it back now, on the caller's task: its work failed, and the
    /// retry may take the delivery as soon as the answer is out.
    pub(super) async fn give_back(mut self) {
        self.ended = true;
        self.ledger.release(&self.key).await;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let (ledger, key) = (self.ledger.clone(), self.key.clone());
        let release = self.tasks.spawn(async move { ledger.release(&key).await });
        *self.release.lock().unwrap_or_else(PoisonError::into_inner) = Some(release);
    }
}

impl Released {
    /// Until the lease, if it was dropped, is given back. A lease that
    /// lives on in a record's task is not waited for.
    pub(super) async fn wait(self) {
        let release = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(release) = release {
            // A failed release leaves the lease to lapse; nothing to add.
            let _ = release.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::adapters::ledger::{Backend, Begin, EmbeddedLedger, Gate};
    use crate::domain::event::ProviderKind;

    #[tokio::test]
    async fn a_dropped_lease_is_given_back_before_wait_returns_and_an_ended_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedLedger::open(
            &dir.path().join("ledger.redb"),
            Duration::from_secs(3600),
            Duration::from_secs(30),
        )
        .unwrap();
        let gate = Gate::closed();
        gate.end(Ok(()));
        let ledger = Arc::new(Ledger::new(Arc::new(Backend::Embedded(store)), gate));
        let tasks = TaskTracker::new();
        let key = DeliveryKey::new(ProviderKind::Mekari, "e1");

        assert_eq!(ledger.begin(&key).await.unwrap(), Begin::New);
        let (lease, released) = Lease::held(key.clone(), ledger.clone(), tasks.clone());
        drop(lease);
        released.wait().await;
        assert_eq!(ledger.begin(&key).await.unwrap(), Begin::New, "given back");

        let (lease, released) = Lease::held(key.clone(), ledger.clone(), tasks.clone());
        lease.ended();
        released.wait().await;
        assert_eq!(
            ledger.begin(&key).await.unwrap(),
            Begin::InFlight,
            "an ended lease is the commit's to end, not given back"
        );
    }
}
