//! Why a record was not acknowledged or the producer could not start,
//! sorted where the error arises into retryable and permanent, and Kafka's
//! refusals named for the operator (`Cause`).

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::{Refusal, TopicChange};

/// Dead-letter reason code of a record the broker refused for good.
pub const PUBLISH_REFUSED: &str = "publish_refused";
/// Dead-letter reason code of a record whose timestamp the topic refuses.
pub const TIMESTAMP_REFUSED: &str = "timestamp_refused";
/// Every reason code [`PublishError::refusal_code`] gives, for series that
/// exist from start-up.
pub const REFUSAL_CODES: [&str; 2] = [PUBLISH_REFUSED, TIMESTAMP_REFUSED];

/// Why a record was not acknowledged, or the producer could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker is unreachable or the queue is full: the same record may
    /// succeed later. The delivery is answered 503.
    #[error("broker unavailable: {0}")]
    Unavailable(#[source] KafkaError),
    /// No acknowledgement came within the delivery deadline.
    #[error("no acknowledgement within the delivery deadline")]
    DeadlinePassed,
    /// No broker answers (known since an earlier send or librdkafka said
    /// so): not tried, so the answer comes at once.
    #[error("no Kafka broker answers")]
    BrokerDown,
    /// The broker refused this record for good (too large, invalid): retrying
    /// cannot help. The event goes to the dead-letter topic instead.
    #[error("record refused by the broker: {0}")]
    Refused(#[source] KafkaError),
    /// Kafka's authorizer denies posbridge's user this write (an ACL is
    /// missing): the operator's to fix, so retryable.
    #[error("{cause}: {error}", cause = Cause(.0.rdkafka_error_code()), error = .0)]
    Denied(#[source] KafkaError),
    /// The producer failed for good (a librdkafka fatal error, the cause
    /// named): every record it is given fails until it is replaced, which
    /// fixes a lost producer id but not a denied one.
    #[error("the producer failed for good: {}: {reason}", Cause(Some(*.code)))]
    ProducerFailed {
        /// librdkafka's fatal error code.
        code: RDKafkaErrorCode,
        /// librdkafka's words for it.
        reason: String,
    },
    /// The entity topic changed under posbridge since start-up (its
    /// partitions, its cleanup policy, or it is gone): its records are
    /// refused until it is as it was.
    #[error("topic `{topic}` {change}")]
    TopicChanged {
        /// The topic.
        topic: String,
        /// What changed.
        change: TopicChange,
    },
    /// librdkafka refused the producer or admin client configuration.
    #[error("kafka client configuration: {0}")]
    Config(#[source] KafkaError),
    /// The topics could not be created at start-up (no broker answered).
    #[error("creating topics: {0}")]
    CreateTopics(#[source] KafkaError),
    /// The cluster could not be described (its id, its topics' ids).
    #[error("describing the cluster and its topics: {0}")]
    Describe(String),
    /// The broker refused to create a topic.
    #[error("cannot create topic `{topic}`: {}", Cause(Some(*.code)))]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's answer.
        code: RDKafkaErrorCode,
    },
    /// The broker refused the connection itself: credentials or certificate.
    #[error(transparent)]
    Connection(#[from] Refusal),
    /// An existing entity topic's settings break a promise posbridge makes.
    #[error("topic `{topic}`: {problem}")]
    TopicSettings {
        /// The topic.
        topic: String,
        /// What is wrong, and how to fix it.
        problem: String,
    },
}

impl PublishError {
    /// Whether the broker refused the record for its size: a shorter copy
    /// may still be taken.
    pub fn is_too_large(&self) -> bool {
        matches!(
            self,
            PublishError::Refused(error) if matches!(
                error.rdkafka_error_code(),
                Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize)
            )
        )
    }

    /// The dead-letter reason code of a record refused for good:
    /// [`TIMESTAMP_REFUSED`] when its timestamp lies outside what the topic
    /// takes (a cluster's `message.timestamp.before.max.ms` or
    /// `after.max.ms`), else [`PUBLISH_REFUSED`].
    pub fn refusal_code(error: &KafkaError) -> &'static str {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::InvalidTimestamp) => TIMESTAMP_REFUSED,
            _ => PUBLISH_REFUSED,
        }
    }

    /// Whether the record may be in the topic though no acknowledgement came:
    /// librdkafka gave up waiting for it (`MessageTimedOut`), or posbridge did
    /// ([`PublishError::DeadlinePassed`]) while it may still land. Every other
    /// failure left nothing in the log.
    pub fn is_in_doubt(&self) -> bool {
        match self {
            PublishError::DeadlinePassed => true,
            PublishError::Unavailable(error) => {
                error.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut)
            }
            _ => false,
        }
    }

    /// Whether a later attempt may succeed; the `kind` metric label says the same.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, PublishError::Refused(_))
    }

    /// Whether the cause was said once when it began (a changed topic, a
    /// producer that failed for good), so each refused record need not
    /// say it again.
    pub fn is_announced(&self) -> bool {
        matches!(
            self,
            PublishError::BrokerDown
                | PublishError::TopicChanged { .. }
                | PublishError::ProducerFailed { .. }
        )
    }

    /// Kafka's code for a start-up refusal of the topics, if it gave one.
    fn start_up_code(&self) -> Option<RDKafkaErrorCode> {
        match self {
            PublishError::CreateTopic { code, .. } => Some(*code),
            PublishError::CreateTopics(error) => error.rdkafka_error_code(),
            _ => None,
        }
    }

    /// The start-up message's headline: what Kafka did, in the words of the
    /// cause, not "cannot reach" for a broker that answered with a refusal.
    pub fn headline(&self) -> &'static str {
        let code = match self {
            PublishError::Connection(_) => return "Kafka refused the connection",
            PublishError::TopicSettings { .. } => {
                return "an existing topic breaks a promise posbridge makes";
            }
            PublishError::Config(_) => return "librdkafka refused the Kafka settings",
            _ => self.start_up_code(),
        };
        match code {
            Some(code) if is_authorization(code) => "Kafka denies posbridge's user",
            Some(RDKafkaErrorCode::InvalidReplicationFactor) => {
                "Kafka refused the topics' replication factor"
            }
            Some(RDKafkaErrorCode::InvalidPartitions) => "Kafka refused the topics' partitions",
            Some(RDKafkaErrorCode::PolicyViolation) => {
                "Kafka's topic policy refused the topics' settings"
            }
            _ if matches!(self, PublishError::CreateTopic { .. }) => {
                "Kafka refused to create a topic"
            }
            _ => "cannot reach Kafka",
        }
    }

    /// What to check, for the start-up message.
    pub fn hint(&self) -> &'static str {
        match self.start_up_code() {
            Some(code) if is_authorization(code) => {
                "grant posbridge's user (kafka.librdkafka sasl.username) CREATE, DESCRIBE, DESCRIBE_CONFIGS and WRITE on its topics, or create them beforehand and set kafka.create_topics = false"
            }
            Some(RDKafkaErrorCode::InvalidReplicationFactor) => {
                "kafka.replication_factor is more than the cluster's brokers: lower it, or leave it out (as many replicas as the cluster has brokers, at most 3)"
            }
            Some(RDKafkaErrorCode::InvalidPartitions) => {
                "kafka.partitions must be at least 1 and within the cluster's limits"
            }
            Some(RDKafkaErrorCode::PolicyViolation) => {
                "the cluster's create-topic policy refused the settings posbridge asks for (kafka.partitions, kafka.replication_factor): create the topics beforehand and set kafka.create_topics = false"
            }
            _ => {
                "check kafka.brokers and that a broker answers (and the security settings under kafka.librdkafka); start-up creates the topics, so it needs the broker"
            }
        }
    }

    /// The `kind` metric label.
    pub fn kind(&self) -> &'static str {
        if self.is_retryable() {
            "retryable"
        } else {
            "permanent"
        }
    }
}

/// Whether a broker's answer is its authorizer's refusal.
fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::DelegationTokenAuthorizationFailed
    )
}

/// A Kafka error code as the operator needs it: its name as Kafka's tools
/// and documents spell it, librdkafka's words, and for a refusal what to
/// grant or change.
struct Cause(Option<RDKafkaErrorCode>);

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(code) = self.0 else {
            return f.write_str("Kafka error");
        };
        write!(f, "{code}")?;
        let fix = match code {
            RDKafkaErrorCode::TopicAuthorizationFailed => {
                "Kafka denies posbridge's user this topic: grant it WRITE and DESCRIBE on the topic (CREATE too where posbridge creates it)"
            }
            RDKafkaErrorCode::ClusterAuthorizationFailed => {
                "Kafka denies posbridge's user the idempotent producer: grant it IdempotentWrite on the cluster (or WRITE on its topics); a new producer cannot help until then"
            }
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
                "Kafka denies posbridge's user its transactional id: grant it WRITE and DESCRIBE on the transactional id"
            }
            RDKafkaErrorCode::GroupAuthorizationFailed => {
                "Kafka denies posbridge's user the consumer group: grant it READ on the group"
            }
            RDKafkaErrorCode::InvalidReplicationFactor => {
                "the replication factor is more than the cluster's brokers (kafka.replication_factor)"
            }
            _ => return Ok(()),
        };
        write!(f, ": {fix}")
    }
}

/// Sorts a produce error: what a later attempt may fix is retryable.
pub(super) fn classify(error: KafkaError) -> PublishError {
    // Only what is wrong with the record itself is permanent. A missing ACL,
    // a bad topic name or an acks setting the cluster refuses is the
    // operator's to fix: retryable, so the provider's retry (or the spool)
    // still delivers the event, instead of a dead letter that cannot be
    // written either and a 4xx that makes Mekari count a permanent failure.
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTimestamp
        )
    );
    if permanent {
        PublishError::Refused(error)
    } else if error.rdkafka_error_code().is_some_and(is_authorization) {
        PublishError::Denied(error)
    } else {
        PublishError::Unavailable(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafkas_refusals_are_named_with_what_to_change_and_only_silence_is_unreachable() {
        let denied = PublishError::CreateTopic {
            topic: "pos.sales".into(),
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        };
        assert_eq!(denied.headline(), "Kafka denies posbridge's user");
        let text = denied.to_string();
        assert!(text.contains("TopicAuthorizationFailed"), "{text}");
        assert!(text.contains("grant it WRITE"), "{text}");
        assert!(denied.hint().contains("CREATE"), "{}", denied.hint());

        let replicas = PublishError::CreateTopic {
            topic: "pos.sales".into(),
            code: RDKafkaErrorCode::InvalidReplicationFactor,
        };
        assert_eq!(
            replicas.headline(),
            "Kafka refused the topics' replication factor"
        );
        assert!(replicas.hint().contains("kafka.replication_factor"));

        let fatal = PublishError::ProducerFailed {
            code: RDKafkaErrorCode::ClusterAuthorizationFailed,
            reason: "Failed to acquire idempotence PID".into(),
        };
        let text = fatal.to_string();
        assert!(text.contains("ClusterAuthorizationFailed"), "{text}");
        assert!(text.contains("IdempotentWrite"), "{text}");
        assert!(fatal.is_retryable() && fatal.is_announced());

        let silent = PublishError::CreateTopics(KafkaError::MetadataFetch(
            RDKafkaErrorCode::BrokerTransportFailure,
        ));
        assert_eq!(silent.headline(), "cannot reach Kafka");
        let write = classify(KafkaError::MessageProduction(
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ));
        assert!(matches!(write, PublishError::Denied(_)), "{write}");
        assert!(write.is_retryable());
    }
}
