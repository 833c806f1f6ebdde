//! Whether Kafka is reachable, as the producer sees it, and librdkafka's own
//! errors and logs said once per outage instead of once per reconnect.
//!
//! While no broker answers, every delivery is answered at once (503, or the
//! spool) instead of waiting out the delivery deadline; a probe (see
//! `Publisher`) notices when a broker answers again. A failure of one topic
//! while the cluster answers (a denied write, a partition without a leader)
//! is that topic's alone: it is kept per topic, and Kafka stays up.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tracing::{debug, error, info, warn};

use super::change::TopicChange;
use crate::observe::telemetry;

/// Kafka's reachability: up until a send fails for want of a broker, down
/// until a broker answers again.
#[derive(Debug, Default)]
pub struct BrokerHealth {
    /// Since when no broker answers, while that is so.
    down_since: Mutex<Option<Instant>>,
    /// The last refusal of the connection itself that librdkafka reported
    /// (credentials, certificate): what start-up names when no broker answers.
    refusal: Mutex<Option<Refusal>>,
    /// Topics whose last send failed while the cluster answered (a denied
    /// write, a partition without a leader), with the broker's reason: that
    /// topic's deliveries fail, the others go on.
    failing_topics: Mutex<BTreeMap<String, String>>,
    /// Whether `failing_topics` holds any: every successful send asks, and
    /// must not take the lock for it.
    any_failing: AtomicBool,
    /// Entity topics the topic watch found changed under posbridge since
    /// start-up (partitions, cleanup policy, gone): refused before any send,
    /// until the watch finds them as they were.
    changed_topics: Mutex<BTreeMap<String, TopicChange>>,
    /// Whether `changed_topics` holds any: every send asks.
    any_changed: AtomicBool,
}

/// Why a broker refused the connection: settings to fix, not an outage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// SASL authentication failed: the user, the password or the mechanism.
    #[error(
        "Kafka refused the SASL credentials (kafka.librdkafka sasl.username, sasl.password, sasl.mechanism): {0}"
    )]
    Authentication(String),
    /// The TLS handshake failed: most often a broker certificate no trusted
    /// CA signed.
    #[error(
        "the TLS handshake with Kafka failed; is the broker's certificate signed by a CA in kafka.librdkafka ssl.ca.location? {0}"
    )]
    Tls(String),
}

impl BrokerHealth {
    /// Whether the last word was that a broker answers.
    pub fn is_up(&self) -> bool {
        self.down_for().is_none()
    }

    /// How long no broker has answered, while none does.
    pub fn down_for(&self) -> Option<Duration> {
        self.lock().map(|since| since.elapsed())
    }

    /// No broker answers; says so once per outage.
    pub fn mark_down(&self, why: &str) {
        let mut down_since = self
            .down_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if down_since.is_none() {
            *down_since = Some(Instant::now());
            metrics::gauge!(telemetry::BROKER_UP).set(0.0);
            warn!(
                reason = why,
                "Kafka is unreachable: sources that spool keep accepting, the others answer 503 until it is back."
            );
        }
    }

    /// A broker answers again; says so once, with how long it was away.
    pub fn mark_up(&self) {
        let mut down_since = self
            .down_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(since) = down_since.take() {
            info!(
                down_secs = since.elapsed().as_secs_f64(),
                "Kafka is reachable again."
            );
        }
        metrics::gauge!(telemetry::BROKER_UP).set(1.0);
    }

    /// A send to `topic` failed while the cluster answers; says so once per
    /// change of reason.
    pub fn topic_failed(&self, topic: &str, why: &str) {
        let mut failing = self
            .failing_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if failing.get(topic).is_none_or(|known| known != why) {
            warn!(
                topic,
                reason = why,
                "Kafka refuses this topic's records while the cluster answers: its deliveries are answered 503 (or spooled), the other topics publish."
            );
            failing.insert(topic.to_owned(), why.to_owned());
            self.any_failing.store(true, Ordering::Release);
        }
    }

    /// A send to `topic` succeeded; says so once if it was failing.
    pub fn topic_ok(&self, topic: &str) {
        if !self.any_failing.load(Ordering::Acquire) {
            return;
        }
        let mut failing = self
            .failing_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if failing.remove(topic).is_some() {
            info!(topic, "Kafka takes this topic's records again.");
        }
        self.any_failing
            .store(!failing.is_empty(), Ordering::Release);
    }

    /// The topics whose last send failed, with the reason, and the topics
    /// refused because they changed under posbridge, with the change.
    pub fn failing_topics(&self) -> BTreeMap<String, String> {
        let mut failing = self
            .failing_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if self.any_changed.load(Ordering::Acquire) {
            let changed = self
                .changed_topics
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for (topic, change) in changed.iter() {
                failing.insert(topic.clone(), change.to_string());
            }
        }
        failing
    }

    /// How `topic` changed under posbridge, while it is refused for that.
    pub fn changed(&self, topic: &str) -> Option<TopicChange> {
        if !self.any_changed.load(Ordering::Acquire) {
            return None;
        }
        self.changed_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
            .cloned()
    }

    /// What the topic watch found of `topic`: a change refuses its records
    /// from now on, `None` lets them through again. Said once per change,
    /// in the log and in `posbridge_topic_changed`.
    pub fn topic_shape(&self, topic: &str, change: Option<TopicChange>) {
        let mut changed = self
            .changed_topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let known = changed.get(topic);
        if known == change.as_ref() {
            return;
        }
        for reason in TopicChange::REASONS {
            let on = change.as_ref().is_some_and(|c| c.reason() == reason);
            metrics::gauge!(
                telemetry::TOPIC_CHANGED,
                telemetry::TOPIC => topic.to_owned(),
                telemetry::REASON => reason
            )
            .set(if on { 1.0 } else { 0.0 });
        }
        match change {
            Some(change) => {
                error!(
                    topic,
                    reason = change.reason(),
                    change = %change,
                    "An entity topic changed under posbridge: its records are refused (503, or spooled) until it is as it was, so that no key gets states in two partitions or loses its latest state; the other topics publish."
                );
                changed.insert(topic.to_owned(), change);
            }
            None => {
                info!(
                    topic,
                    "The entity topic is as posbridge found it at start-up again: its records publish."
                );
                changed.remove(topic);
            }
        }
        self.any_changed
            .store(!changed.is_empty(), Ordering::Release);
    }

    /// The last refusal librdkafka reported, if any.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn refused(&self, refusal: Refusal) {
        *self.refusal.lock().unwrap_or_else(PoisonError::into_inner) = Some(refusal);
    }

    fn lock(&self) -> Option<Instant> {
        *self
            .down_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The producer's librdkafka context: errors and logs go to `tracing`, and
/// while Kafka is known to be down the repeats go to DEBUG only.
pub struct BrokerContext {
    /// Shared with the `Publisher` and every replacement producer.
    pub health: std::sync::Arc<BrokerHealth>,
}

impl ClientContext for BrokerContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let quiet = !self.health.is_up();
        match level {
            _ if quiet => debug!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => error!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Warning => warn!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                info!(target: "librdkafka", facility, "{message}");
            }
            RDKafkaLogLevel::Debug => debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::Authentication) => {
                self.health
                    .refused(Refusal::Authentication(reason.to_owned()));
            }
            Some(RDKafkaErrorCode::SSL) => self.health.refused(Refusal::Tls(reason.to_owned())),
            _ => {}
        }
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
            // librdkafka's own words count brokers it has not tried yet as
            // up ("0/1 brokers are down" while none answers).
            debug!(target: "librdkafka", reason, "All brokers down.");
            self.health
                .mark_down("no broker of kafka.brokers answers a connection");
        } else if self.health.is_up() {
            warn!(target: "librdkafka", %error, reason, "Kafka client error.");
        } else {
            debug!(target: "librdkafka", %error, reason, "Kafka client error.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_topic_is_kept_until_a_send_to_it_succeeds() {
        let health = BrokerHealth::default();
        health.topic_ok("pos.sales");
        assert!(health.failing_topics().is_empty());
        health.topic_failed("pos.orders", "denied");
        health.topic_ok("pos.sales");
        assert_eq!(health.failing_topics()["pos.orders"], "denied");
        health.topic_ok("pos.orders");
        assert!(health.failing_topics().is_empty());
        assert!(health.is_up(), "a topic's failure is not Kafka's");
    }

    #[test]
    fn a_changed_topic_is_refused_and_named_until_the_watch_finds_it_as_it_was() {
        let health = BrokerHealth::default();
        assert_eq!(health.changed("pos.orders"), None);
        let raised = TopicChange::Partitions { from: 3, to: 12 };
        health.topic_shape("pos.orders", Some(raised.clone()));
        health.topic_shape("pos.sales", None);
        assert_eq!(health.changed("pos.orders"), Some(raised.clone()));
        assert_eq!(health.changed("pos.sales"), None);
        assert_eq!(health.failing_topics()["pos.orders"], raised.to_string());
        health.topic_ok("pos.orders");
        assert!(
            health.changed("pos.orders").is_some(),
            "a send does not clear a change"
        );
        health.topic_shape("pos.orders", None);
        assert_eq!(health.changed("pos.orders"), None);
        assert!(health.failing_topics().is_empty());
    }

    #[test]
    fn down_until_marked_up_and_each_change_once() {
        let health = BrokerHealth::default();
        assert!(health.is_up());
        health.mark_down("refused");
        std::thread::sleep(Duration::from_millis(20));
        health.mark_down("refused again");
        assert!(
            health.down_for().unwrap() >= Duration::from_millis(20),
            "the first mark counts"
        );
        health.mark_up();
        assert!(health.is_up());
        assert_eq!(health.down_for(), None);
    }
}
