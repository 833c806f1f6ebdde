//! The one task every piece of work of the line runs on (a webhook's
//! delivery, a spooled one's replay, a reconciled record, a dead letter
//! and its redelivery), and shutdown's wait for those tasks.
//!
//! Work that may have handed a record to the producer must reach its
//! commit whoever stops waiting for it: hyper drops a request's future
//! when the client goes away or shutdown aborts the connection, the
//! reconciler cuts a pass at its budget, and a delivery's answer deadline
//! may pass while its record waits for Kafka. A delivery cancelled between
//! Kafka's acknowledgement and the ledger commit would lose the entity's
//! version (an older event would then publish) and its delivery id (the
//! retry would publish again). So each runs on a task of its own that its
//! caller only waits for an [`Answer`] from; the task may answer first
//! (at a deadline) and go on to the commit.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tracing::Instrument;

use super::Pipeline;
use crate::observe::delivery as observe;

/// Where a task sends its caller the answer, once: at the end of the work,
/// or earlier when the caller's deadline passes first.
pub(super) struct Answer<T>(oneshot::Sender<T>);

impl<T> Answer<T> {
    /// An answer sent on `sender`: a test's, to look at a task's future.
    #[cfg(test)]
    pub(super) fn new(sender: oneshot::Sender<T>) -> Self {
        Answer(sender)
    }

    /// Gives the caller its answer. A caller that went away (a client that
    /// hung up) is told nothing; the work is done all the same.
    pub(super) fn send(self, answer: T) {
        let _ = self.0.send(answer);
    }

    /// Waits for `sending` (work that may have handed a record to Kafka)
    /// until `deadline`: what it came to, with this answer still to give.
    /// Past the deadline the caller is given what `late` makes, the send
    /// runs on to its commit, and `None` is returned. `sending` comes boxed,
    /// so that the task's own future stays small and spawning it copies
    /// little.
    pub(super) async fn sent_by<S: Future + Unpin>(
        self,
        deadline: Instant,
        mut sending: S,
        late: impl AsyncFnOnce() -> T,
    ) -> Option<(S::Output, Self)> {
        match tokio::time::timeout_at(deadline, &mut sending).await {
            Ok(sent) => Some((sent, self)),
            Err(_) => {
                self.send(late().await);
                let _ = sending.await;
                None
            }
        }
    }
}

impl Pipeline {
    /// Runs `work` on a task of its own, in the current span, and waits for
    /// what it answers. The task goes on when the caller's future is
    /// dropped, and after it has answered; shutdown waits for it
    /// ([`Pipeline::finish_deliveries`]).
    ///
    /// # Panics
    /// When `work` panics before it answers: the ingress answers a panic
    /// 503, as it would the panic itself (which the task's panic hook has
    /// already reported).
    pub(super) async fn on_its_task<T, F>(&self, work: impl FnOnce(Answer<T>) -> F) -> T
    where
        T: Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        self.inner
            .deliveries
            .spawn(work(Answer(answer)).instrument(tracing::Span::current()));
        match answered.await {
            Ok(answer) => answer,
            Err(_) => panic!("a delivery's task ended without an answer: it panicked"),
        }
    }

    /// Waits, at most `timeout`, for the deliveries still running (those
    /// whose requests went away included) to reach their outcome.
    pub async fn finish_deliveries(&self, timeout: Duration) {
        self.inner.deliveries.close();
        if tokio::time::timeout(timeout, self.inner.deliveries.wait())
            .await
            .is_err()
        {
            observe::still_running_at_shutdown(self.inner.deliveries.len());
        }
    }
}
