//! What the data line needs of a producer, as a trait: the seam between the
//! pipeline's decisions and the broker.
//!
//! [`super::Publisher`] is the real one (librdkafka, idempotent, acks=all);
//! the unit tests put the pipeline on `fake::FakeBroker` instead, which
//! records, acknowledges, fails and delays on command, so every dedup, guard,
//! spool and dead-letter decision is tested to "published" without a broker.
//! Start-up's admin questions and the topic watch stay on the `Publisher`:
//! they ask a real cluster and nothing else can answer for it.

use std::time::Duration;

use async_trait::async_trait;

use super::{BrokerHealth, OutgoingRecord, PublishError, Publisher};
use crate::domain::record_at::RecordAt;

/// A producer the pipeline hands its records to.
#[async_trait]
pub trait Produce: Send + Sync + 'static {
    /// Produces one record and waits for the broker's acknowledgement.
    ///
    /// # Errors
    /// [`PublishError::Refused`] when the broker refuses it for good; any
    /// other error is retryable.
    async fn send(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError>;

    /// The largest record `topic` takes now (its `max.message.bytes`), for a
    /// dead letter refused as too large; `None` when it cannot be learnt.
    async fn topic_limit(&self, topic: &str) -> Option<usize>;

    /// Whether a broker answers, as the last send or probe found.
    fn health(&self) -> &BrokerHealth;

    /// Whether a broker answers a question within `timeout`; `false` at
    /// once while it is known to be down.
    async fn broker_reachable(&self, timeout: Duration) -> bool;

    /// Waits for queued records to be delivered, at most `timeout`.
    async fn flush(&self, timeout: Duration);
}

#[async_trait]
impl Produce for Publisher {
    async fn send(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError> {
        Publisher::send(self, record).await
    }

    async fn topic_limit(&self, topic: &str) -> Option<usize> {
        Publisher::topic_limit(self, topic).await
    }

    fn health(&self) -> &BrokerHealth {
        Publisher::health(self)
    }

    async fn broker_reachable(&self, timeout: Duration) -> bool {
        Publisher::broker_reachable(self, timeout).await
    }

    async fn flush(&self, timeout: Duration) {
        Publisher::flush(self, timeout).await;
    }
}
