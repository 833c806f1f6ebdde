//! Work that runs to its end when its caller goes away, and shutdown's wait
//! for it: the webhook's delivery, and each record from the moment it may
//! reach Kafka to its commit.

use std::time::Duration;

use tracing::{Instrument, warn};

use super::Pipeline;

impl Pipeline {
    /// Runs `work` on a task of its own, in the current span, which goes on
    /// when the caller's future is dropped; shutdown waits for it
    /// ([`Pipeline::finish_deliveries`]).
    pub(super) async fn to_the_end<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> T {
        let task = self
            .inner
            .deliveries
            .spawn(work.instrument(tracing::Span::current()));
        match task.await {
            Ok(result) => result,
            // A panic in the delivery: the ingress answers a panic 503.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
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
            warn!(
                running = self.inner.deliveries.len(),
                "Deliveries still running at the end of the shutdown budget."
            );
        }
    }
}
