//! Replacing a producer that failed: at once after a fatal error (a new
//! producer id), and, when the replacements keep failing for good before
//! any record is acknowledged (a cause a new producer id does not fix, such
//! as a denied producer id), at most once per wait, the wait doubling
//! (`backon`'s exponential backoff).

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::health::BrokerContext;
use super::{PublishError, Publisher};
use crate::observe::telemetry;

/// The first wait before replacing a producer again when the one before
/// it failed for good too without a record acknowledged in between: a
/// cause a new producer id does not fix (an ACL) is then tried at most
/// once per wait, the wait doubling up to [`REPLACE_AGAIN_MAX`].
const REPLACE_AGAIN_MIN: Duration = Duration::from_secs(1);

/// The longest wait between two replacements of a producer that keeps
/// failing for good.
const REPLACE_AGAIN_MAX: Duration = Duration::from_secs(60);

/// Producers replaced one after another, each failing for good before any
/// record was acknowledged: a cause a new producer id does not fix (a
/// denied ACL). Each next replacement waits longer, so the producer is not
/// rebuilt once per delivery.
pub(super) struct Streak {
    /// The waits between replacements (`backon`'s exponential backoff).
    waits: backon::ExponentialBackoff,
    /// No replacement before this.
    not_before: Instant,
    /// Replacements in this streak.
    replacements: u32,
}

impl Streak {
    pub(super) fn new() -> Streak {
        Streak {
            waits: backon::ExponentialBuilder::default()
                .with_min_delay(REPLACE_AGAIN_MIN)
                .with_max_delay(REPLACE_AGAIN_MAX)
                .with_factor(2.0)
                .without_max_times()
                .build(),
            not_before: Instant::now(),
            replacements: 0,
        }
    }
}

/// Why a failed send replaces the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replace {
    /// librdkafka's fatal error: the producer takes no more records.
    Fatal,
    /// A timeout or a producer-state refusal, on a broker that cannot take
    /// librdkafka's epoch bump (`kafka.new_producer_after_timeout`).
    AfterTimeout,
}

/// Whether a send error (of a producer without a fatal error) is a timeout
/// or a producer-state refusal: what a broker that cannot take
/// librdkafka's epoch bump needs a new producer id for.
pub(super) fn needs_new_producer_id(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Unknown
                | RDKafkaErrorCode::OutOfOrderSequenceNumber
                | RDKafkaErrorCode::UnknownProducerId
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::MessageTimedOut
        )
    )
}

impl Publisher {
    /// Replaces the producer, unless another failure already did since
    /// `generation` was read, or (after a fatal error) the streak's wait
    /// is not over: `why` is the failure that asks, named in the log.
    pub(super) fn replace(&self, generation: u64, replace: Replace, why: &PublishError) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.generation != generation {
            return;
        }
        let now = Instant::now();
        if replace == Replace::Fatal
            && current
                .streak
                .as_ref()
                .is_some_and(|streak| now < streak.not_before)
        {
            return;
        }
        let producer = match self.client_config.create_with_context(BrokerContext {
            health: self.health.clone(),
        }) {
            Ok(producer) => producer,
            Err(error) => {
                tracing::error!(%error, "Could not replace a stuck producer.");
                return;
            }
        };
        let old = std::mem::replace(&mut current.producer, producer);
        current.generation += 1;
        tokio::task::spawn_blocking(move || drop(old));
        metrics::counter!(telemetry::PRODUCER_REPLACEMENTS).increment(1);
        let generation = current.generation;
        if replace == Replace::AfterTimeout {
            tracing::warn!(
                generation,
                reason = %why,
                "Replaced the producer after a failed send; the next one gets a fresh producer id."
            );
            return;
        }
        let streak = current.streak.get_or_insert_with(Streak::new);
        let wait = streak.waits.next().unwrap_or(REPLACE_AGAIN_MAX);
        streak.not_before = now + wait;
        streak.replacements += 1;
        self.streak_on.store(true, Ordering::Release);
        match streak.replacements {
            1 => tracing::warn!(
                generation,
                reason = %why,
                "Replaced the producer after it failed for good; the next one gets a fresh producer id."
            ),
            2 => tracing::error!(
                generation,
                reason = %why,
                next_in_secs = wait.as_secs_f64(),
                "The new producer failed for good too, before any record was acknowledged: a new producer id does not fix this cause. Deliveries are answered 503 (or spooled); the producer is replaced again at most once per wait, doubling up to 60 s, until a record is acknowledged."
            ),
            _ => {
                tracing::debug!(generation, reason = %why, next_in_secs = wait.as_secs_f64(), "Producer replaced again.");
            }
        }
    }

    /// A record was acknowledged: a streak of replacements is over.
    pub(super) fn end_streak(&self) {
        if !self.streak_on.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(streak) = current.streak.take()
            && streak.replacements > 1
        {
            tracing::info!(
                replacements = streak.replacements,
                "Kafka acknowledges records again after the producer was replaced."
            );
        }
    }

    /// How many times the producer was replaced since start.
    pub fn replacements(&self) -> u64 {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, KafkaConfig};

    /// A producer that fails for good, replaced: the first replacement is
    /// at once, the next one waits (it would fail the same way), and an
    /// acknowledged record ends the wait.
    #[tokio::test]
    async fn a_producer_failing_for_good_again_is_not_replaced_at_once() {
        let kafka = KafkaConfig {
            // Nothing listens on port 1: no broker is needed to replace.
            brokers: "127.0.0.1:1".into(),
            ..KafkaConfig::default()
        };
        let publisher = Publisher::new(&kafka, Config::default().max_record_bytes()).unwrap();
        let why = PublishError::ProducerFailed {
            code: RDKafkaErrorCode::ClusterAuthorizationFailed,
            reason: "denied".into(),
        };
        publisher.replace(0, Replace::Fatal, &why);
        assert_eq!(publisher.replacements(), 1, "the first at once");
        publisher.replace(1, Replace::Fatal, &why);
        publisher.replace(1, Replace::Fatal, &why);
        assert_eq!(publisher.replacements(), 1, "the next waits at least 1 s");
        publisher.replace(0, Replace::Fatal, &why);
        assert_eq!(publisher.replacements(), 1, "an older generation's failure");
        publisher.end_streak();
        publisher.replace(1, Replace::Fatal, &why);
        assert_eq!(publisher.replacements(), 2, "after an ack, at once again");
        publisher.replace(2, Replace::AfterTimeout, &why);
        assert_eq!(
            publisher.replacements(),
            3,
            "tansu's replacement does not wait"
        );
    }
}
