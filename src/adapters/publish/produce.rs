//! What the data line needs of a producer: the seam between the pipeline's
//! decisions and the broker.
//!
//! [`super::Publisher`] is the real one (librdkafka, idempotent, acks=all);
//! the unit tests and the simulation put the pipeline on `fake::FakeBroker`
//! instead, which records, acknowledges, fails and delays on command, so
//! every dedup, guard, spool and dead-letter decision is tested to
//! "published" without a broker. Start-up's admin questions and the topic
//! watch stay on the `Publisher`: they ask a real cluster and nothing else
//! can answer for it.
//!
//! An enum rather than a trait object: a send's future is the producer's
//! own, not a box allocated for every record.

use std::time::Duration;

use super::{BrokerHealth, OutgoingRecord, PublishError, Publisher};
use crate::domain::record_at::RecordAt;

/// A producer the pipeline hands its records to.
#[derive(Clone)]
pub enum Producer {
    /// The real one.
    Kafka(Publisher),
    /// The fake broker of the unit tests and the simulation.
    #[cfg(test)]
    Fake(std::sync::Arc<super::FakeBroker>),
}

impl Producer {
    /// Produces one record and waits for the broker's acknowledgement.
    ///
    /// # Errors
    /// [`PublishError::Refused`] when the broker refuses it for good; any
    /// other error is retryable.
    pub async fn send(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError> {
        match self {
            Producer::Kafka(publisher) => publisher.send(record).await,
            #[cfg(test)]
            Producer::Fake(broker) => broker.send(record).await,
        }
    }

    /// The largest record `topic` takes now (its `max.message.bytes`), for a
    /// dead letter refused as too large; `None` when it cannot be learnt.
    pub async fn topic_limit(&self, topic: &str) -> Option<usize> {
        match self {
            Producer::Kafka(publisher) => publisher.topic_limit(topic).await,
            #[cfg(test)]
            Producer::Fake(broker) => broker.topic_limit(topic),
        }
    }

    /// Whether a broker answers, as the last send or probe found.
    pub fn health(&self) -> &BrokerHealth {
        match self {
            Producer::Kafka(publisher) => publisher.health(),
            #[cfg(test)]
            Producer::Fake(broker) => broker.health(),
        }
    }

    /// Whether a broker answers a question within `timeout`; `false` at
    /// once while it is known to be down.
    pub async fn broker_reachable(&self, timeout: Duration) -> bool {
        match self {
            Producer::Kafka(publisher) => publisher.broker_reachable(timeout).await,
            #[cfg(test)]
            Producer::Fake(broker) => broker.health().is_up(),
        }
    }

    /// Waits for queued records to be delivered, at most `timeout`.
    pub async fn flush(&self, timeout: Duration) {
        match self {
            Producer::Kafka(publisher) => publisher.flush(timeout).await,
            #[cfg(test)]
            Producer::Fake(_) => {}
        }
    }
}
