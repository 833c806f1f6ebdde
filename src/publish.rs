//! Producing records: the idempotent rdkafka producer, topic creation, and
//! the sorting of produce errors into retryable and permanent.
//!
//! The producer runs with `enable.idempotence=true` and `acks=all`, so a
//! record the broker acknowledged is on every in-sync replica and exactly once
//! per partition; with `partitioner=murmur2_random` a key maps to the same
//! partition a Java client would choose. `message.timeout.ms` is the delivery
//! deadline: past it the record fails, and the delivery is answered 503.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;

use crate::config::KafkaConfig;
use crate::metrics;

/// Record header: the provider's delivery id.
pub const HEADER_DELIVERY_ID: &str = "posbridge-delivery-id";
/// Record header: provider name.
pub const HEADER_PROVIDER: &str = "posbridge-provider";
/// Record header: the event type as the provider sent it.
pub const HEADER_EVENT_TYPE: &str = "posbridge-event-type";
/// Record header: configured source name.
pub const HEADER_SOURCE: &str = "posbridge-source";
/// Record header: webhook or reconciler.
pub const HEADER_ORIGIN: &str = "posbridge-origin";
/// Dead-letter header: why the event could not be normalized or published.
pub const HEADER_REASON: &str = "posbridge-reason";

/// Why a record was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker is unreachable, the deadline passed, or the queue is full:
    /// the same record may succeed later. The delivery is answered 503.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The broker refused this record for good (too large, invalid): retrying
    /// cannot help. The event goes to the dead-letter topic instead.
    #[error("record refused by the broker: {0}")]
    Refused(String),
    /// The producer or admin client could not be configured.
    #[error("kafka client configuration: {0}")]
    Config(String),
    /// A topic could not be created at start-up.
    #[error("cannot create topic `{topic}`: {reason}")]
    CreateTopic {
        /// The topic.
        topic: String,
        /// The broker's answer.
        reason: String,
    },
}

impl PublishError {
    /// The `kind` metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            PublishError::Refused(_) => "permanent",
            _ => "retryable",
        }
    }
}

/// One record to produce, built by the pipeline.
#[derive(Debug, Clone)]
pub struct OutgoingRecord {
    /// Destination topic.
    pub topic: String,
    /// UTF-8 record key.
    pub key: String,
    /// Value bytes; `None` writes a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Record timestamp, milliseconds since the epoch.
    pub timestamp_ms: i64,
    /// Record headers.
    pub headers: Vec<(&'static str, String)>,
    /// Provider name, for the latency metric.
    pub provider: &'static str,
}

/// Where a record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// The producer handle. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    /// The idempotent producer.
    producer: FutureProducer,
    /// The same settings, for admin clients.
    client_config: ClientConfig,
    /// Per-record deadline.
    delivery_timeout: Duration,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("delivery_timeout", &self.delivery_timeout)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Creates the producer. librdkafka connects lazily, so this succeeds
    /// while the broker is down; [`Publisher::ensure_topics`] is the first
    /// call that needs it.
    ///
    /// # Errors
    /// [`PublishError::Config`] when librdkafka refuses a property.
    pub fn new(config: &KafkaConfig) -> Result<Publisher, PublishError> {
        let mut client_config = ClientConfig::new();
        for (key, value) in &config.librdkafka {
            client_config.set(key, value);
        }
        client_config
            .set("bootstrap.servers", &config.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set("message.timeout.ms", config.delivery_timeout_ms.to_string());
        let producer: FutureProducer = client_config
            .create()
            .map_err(|e| PublishError::Config(e.to_string()))?;
        Ok(Publisher {
            producer,
            client_config,
            delivery_timeout: config.delivery_timeout(),
        })
    }

    /// Creates the missing topics: `compact` for entity topics (each maps to
    /// `true`), `delete` for the dead-letter topic. Existing topics are left alone.
    ///
    /// # Errors
    /// [`PublishError::CreateTopic`] naming the topic and the broker's answer,
    /// or [`PublishError::Unavailable`] when the broker cannot be reached.
    pub async fn ensure_topics(
        &self,
        topics: &BTreeMap<String, bool>,
        partitions: i32,
        replication: i32,
    ) -> Result<(), PublishError> {
        let mut admin_config = self.client_config.clone();
        for producer_only in ["enable.idempotence", "acks", "partitioner", "message.timeout.ms"] {
            admin_config.remove(producer_only);
        }
        let admin: AdminClient<DefaultClientContext> = admin_config
            .create()
            .map_err(|e| PublishError::Config(e.to_string()))?;
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(name, compact)| {
                NewTopic::new(name, partitions, TopicReplication::Fixed(replication)).set(
                    "cleanup.policy",
                    if *compact { "compact" } else { "delete" },
                )
            })
            .collect();
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(Duration::from_secs(15))))
            .operation_timeout(Some(Timeout::After(Duration::from_secs(15))));
        let results = admin
            .create_topics(new_topics.iter(), &options)
            .await
            .map_err(|e| PublishError::Unavailable(format!("creating topics: {e}")))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(PublishError::CreateTopic {
                        topic,
                        reason: code.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Produces one record and waits for the broker's acknowledgement, at
    /// most the delivery deadline.
    ///
    /// # Errors
    /// [`PublishError::Unavailable`] (retryable) or [`PublishError::Refused`] (permanent).
    pub async fn send(&self, record: OutgoingRecord) -> Result<Acked, PublishError> {
        let started = Instant::now();
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len());
        for (key, value) in &record.headers {
            headers = headers.insert(Header {
                key,
                value: Some(value.as_bytes()),
            });
        }
        let mut future_record = FutureRecord::to(&record.topic)
            .key(record.key.as_bytes())
            .timestamp(record.timestamp_ms)
            .headers(headers);
        if let Some(payload) = &record.payload {
            future_record = future_record.payload(payload.as_slice());
        }
        // The whole wait is bounded even if librdkafka's own timer slips.
        let result = tokio::time::timeout(
            self.delivery_timeout + Duration::from_millis(500),
            self.producer
                .send(future_record, Timeout::After(self.delivery_timeout)),
        )
        .await;
        let result = match result {
            Err(_) => Err(PublishError::Unavailable("delivery deadline passed".into())),
            Ok(Ok(delivery)) => Ok(Acked {
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Ok(Err((error, _))) => Err(classify(&error)),
        };
        match &result {
            Ok(_) => ::metrics::histogram!(
                metrics::PUBLISH_DURATION,
                metrics::PROVIDER => record.provider,
                metrics::TOPIC => record.topic.clone()
            )
            .record(started.elapsed().as_secs_f64()),
            Err(e) => ::metrics::counter!(
                metrics::PUBLISH_FAILURES,
                metrics::PROVIDER => record.provider,
                metrics::KIND => e.kind()
            )
            .increment(1),
        }
        result
    }

    /// Whether the broker answers a metadata request within `timeout`.
    pub async fn broker_reachable(&self, timeout: Duration) -> bool {
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(None, Timeout::After(timeout))
                .is_ok()
        })
        .await
        .unwrap_or(false)
    }

    /// Waits for queued records to be delivered, at most `timeout`.
    pub async fn flush(&self, timeout: Duration) {
        let producer = self.producer.clone();
        let flushed = tokio::task::spawn_blocking(move || producer.flush(Timeout::After(timeout)))
            .await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "Producer flush did not finish.");
        }
    }
}

/// Sorts a produce error: what a later attempt may fix is retryable.
fn classify(error: &KafkaError) -> PublishError {
    let permanent = matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::InvalidRequiredAcks
        )
    );
    if permanent {
        PublishError::Refused(error.to_string())
    } else {
        PublishError::Unavailable(error.to_string())
    }
}
