//! Producing records: the idempotent rdkafka producer, topic creation, and
//! the sorting of produce errors into retryable and permanent.
//!
//! The producer runs with `enable.idempotence=true` and `acks=all`, so a
//! record the broker acknowledged is on every in-sync replica and exactly once
//! per partition; with `partitioner=murmur2_random` a key maps to the same
//! partition a Java client would choose. `message.timeout.ms` is the delivery
//! deadline: past it the record fails, and the delivery is answered 503.
//!
//! An idempotent producer whose record timed out must bump its epoch before
//! it produces again. librdkafka does that itself once the requests in
//! flight have finished (KIP-360), so a record in doubt lands, if at all,
//! before anything produced after it: Kafka's order per key holds. Only a
//! fatal error ends a producer, and only then is it replaced. tansu 0.6
//! panics on the bumped epoch; for such a broker
//! `kafka.new_producer_after_timeout` replaces the producer after a timeout
//! or a producer-state refusal too, at the price of that order (a record in
//! doubt from the old producer id may land after a newer one).
//!
//! `health.rs` keeps whether any broker answers: while none does, `send`
//! fails at once instead of waiting out the deadline, and a probe once a
//! second notices the broker's return.
//!
//! `produce.rs` is what the pipeline needs of a producer, as a trait the
//! `Publisher` and the unit tests' `fake.rs` both implement.
//!
//! `error.rs` sorts the errors and names Kafka's refusals; `replace.rs`
//! replaces a failed producer (with a growing wait while the replacements
//! keep failing); `admin.rs` holds start-up's questions to the cluster and
//! `watch.rs` asks the entity topics' again while running.

mod admin;
mod admin_client;

pub use admin::zero_change_gauges;
mod change;
mod describe;
mod error;
#[cfg(test)]
mod fake;
mod health;
mod produce;
mod replace;
mod topics;
mod watch;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use compact_str::CompactString;
use metrics::Histogram;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;

use crate::config::KafkaConfig;
use crate::domain::event::ProviderKind;
use crate::domain::record_at::RecordAt;
use crate::observe::telemetry;

pub use change::TopicChange;
pub use describe::{Described, TopicIdentity};
use error::classify;
pub use error::{PUBLISH_REFUSED, PublishError, REFUSAL_CODES, TIMESTAMP_REFUSED};
#[cfg(test)]
pub use fake::{FakeBroker, Fault};
use health::BrokerContext;
pub use health::{BrokerHealth, Refusal};
pub use produce::Producer;
use replace::{Replace, Streak, needs_new_producer_id};
pub use topics::{TopicSets, Topics};

/// How often the probe asks for metadata while no broker answers.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a failed send's question "does the cluster answer at all?" may
/// take.
const CLUSTER_PROBE: Duration = Duration::from_millis(500);

/// The producer type: librdkafka's errors and logs go through [`BrokerContext`].
type KafkaProducer = FutureProducer<BrokerContext>;

/// One record to produce, built by the pipeline (`pipeline/record.rs`).
#[derive(Debug, Clone)]
pub struct OutgoingRecord {
    /// Destination topic, shared with its topic set.
    pub topic: Arc<str>,
    /// UTF-8 record key.
    pub key: String,
    /// Value bytes; `None` writes a tombstone.
    pub payload: Option<Vec<u8>>,
    /// Record timestamp, milliseconds since the epoch.
    pub timestamp_ms: i64,
    /// Record headers: names and the values known before the run (a
    /// provider's name, the origin, the schema's revision) are not
    /// allocated per record.
    pub headers: Vec<(&'static str, CompactString)>,
    /// Provider name, for the latency metric.
    pub provider: &'static str,
}

#[cfg(test)]
impl OutgoingRecord {
    /// A header's value: what the tests read back from the fake broker.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_ref())
    }
}

/// The producer in use and its generation, so concurrent failures replace it once.
struct Current {
    /// The idempotent producer.
    producer: KafkaProducer,
    /// Bumped each time the producer is replaced.
    generation: u64,
    /// Replacements after fatal errors since the last acknowledged record.
    streak: Option<Streak>,
}

/// The producer handle. Cheap to clone.
#[derive(Clone)]
pub struct Publisher {
    /// The producer, replaceable when it gets stuck.
    current: Arc<RwLock<Current>>,
    /// Producer settings, for replacements.
    client_config: ClientConfig,
    /// The same without the producer-only properties, for admin clients.
    admin_config: ClientConfig,
    /// Per-record deadline.
    delivery_timeout: Duration,
    /// The largest record: the producer's `message.max.bytes`, and with a
    /// batch header the created topics' `max.message.bytes`.
    max_record_bytes: usize,
    /// Whether a broker answers; shared by every producer this handle makes.
    health: Arc<BrokerHealth>,
    /// Replace the producer after a timeout too (`kafka.new_producer_after_timeout`).
    new_producer_after_timeout: bool,
    /// Whether a [`Streak`] of replacements is on: every acknowledged
    /// record asks, and must not take the lock for it.
    streak_on: Arc<AtomicBool>,
    /// What each entity topic was at start-up, for the topic watch.
    baseline: Arc<watch::Baseline>,
    /// The acknowledgement latency histogram of each configured topic and
    /// provider, looked up once: a labelled `metrics::histogram!` builds,
    /// allocates and hashes its key on every call, and every record
    /// records here.
    latency: Arc<[(String, [Histogram; 2])]>,
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
    /// `max_record_bytes` (`Config::max_record_bytes`) becomes the producer's
    /// `message.max.bytes` and the created topics' `max.message.bytes`.
    ///
    /// # Errors
    /// [`PublishError::Config`] when librdkafka refuses a property.
    pub fn new(config: &KafkaConfig, max_record_bytes: usize) -> Result<Publisher, PublishError> {
        let (admin_config, client_config) = client_configs(config, max_record_bytes);
        let health = Arc::new(BrokerHealth::default());
        let producer: KafkaProducer = client_config
            .create_with_context(BrokerContext {
                health: health.clone(),
            })
            .map_err(PublishError::Config)?;
        let publisher = Publisher {
            current: Arc::new(RwLock::new(Current {
                producer,
                generation: 0,
                streak: None,
            })),
            client_config,
            admin_config,
            delivery_timeout: config.delivery_timeout(),
            max_record_bytes,
            health,
            new_producer_after_timeout: config.new_producer_after_timeout,
            streak_on: Arc::default(),
            baseline: Arc::default(),
            latency: Topics::new(config)
                .all()
                .into_keys()
                .map(|topic| {
                    let by_provider = ProviderKind::ALL
                        .map(|provider| latency_histogram(provider.as_str(), topic.clone()));
                    (topic, by_provider)
                })
                .collect(),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(probe(
                Arc::downgrade(&publisher.current),
                publisher.health.clone(),
            ));
        }
        Ok(publisher)
    }

    /// Produces one record and waits for the broker's acknowledgement, at
    /// most the delivery deadline.
    ///
    /// # Errors
    /// [`PublishError::Refused`] (permanent), or a retryable one:
    /// [`PublishError::Unavailable`], [`PublishError::Denied`],
    /// [`PublishError::ProducerFailed`], or at once
    /// [`PublishError::BrokerDown`] and [`PublishError::TopicChanged`].
    pub async fn send(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError> {
        if !self.health.is_up() {
            return Err(PublishError::BrokerDown);
        }
        if let Some(change) = self.health.changed(&record.topic) {
            return Err(PublishError::TopicChanged {
                topic: record.topic.to_string(),
                change,
            });
        }
        let started = Instant::now();
        let (producer, generation) = self.producer();
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
            producer.send(future_record, Timeout::After(self.delivery_timeout)),
        )
        .await;
        let result = match result {
            Err(_) => Err((
                PublishError::DeadlinePassed,
                self.new_producer_after_timeout
                    .then_some(Replace::AfterTimeout),
            )),
            Ok(Ok(delivery)) => Ok(RecordAt {
                topic: record.topic.clone(),
                partition: delivery.partition,
                offset: delivery.offset,
            }),
            Ok(Err((error, _))) => match producer.client().fatal_error() {
                // Whatever this record's own error (often its purge), the
                // producer's fatal error is the cause.
                Some((code, reason)) => Err((
                    PublishError::ProducerFailed { code, reason },
                    Some(Replace::Fatal),
                )),
                None => {
                    let replace = (self.new_producer_after_timeout
                        && needs_new_producer_id(&error))
                    .then_some(Replace::AfterTimeout);
                    Err((classify(error), replace))
                }
            },
        };
        let result = result.map_err(|(error, replace)| {
            if let Some(replace) = replace {
                self.replace(generation, replace, &error);
            }
            error
        });
        // Destroying a replaced producer (when this was its last handle) waits
        // for librdkafka; keep that off the async workers.
        if self.producer().1 != generation {
            tokio::task::spawn_blocking(move || drop(producer));
        }
        match &result {
            Ok(_) => {
                self.health.mark_up();
                self.health.topic_ok(&record.topic);
                self.end_streak();
            }
            Err(PublishError::BrokerDown) => {}
            // Dropped with a producer posbridge replaced: not the topic's doing.
            Err(PublishError::Unavailable(error))
                if matches!(
                    error.rdkafka_error_code(),
                    Some(RDKafkaErrorCode::PurgeQueue | RDKafkaErrorCode::PurgeInflight)
                ) => {}
            Err(error) if error.is_retryable() => {
                if self.cluster_unreachable(error).await {
                    self.health.mark_down(&error.to_string());
                } else {
                    self.health.topic_failed(&record.topic, &error.to_string());
                }
            }
            Err(_) => {}
        }
        match &result {
            Ok(_) => self.latency(record).record(started.elapsed().as_secs_f64()),
            Err(e) => metrics::counter!(
                telemetry::PUBLISH_FAILURES,
                telemetry::PROVIDER => record.provider,
                telemetry::KIND => e.kind()
            )
            .increment(1),
        }
        result
    }

    /// The latency histogram of `record`'s topic and provider: looked up at
    /// start-up for the configured topics, else made now.
    fn latency(&self, record: &OutgoingRecord) -> Histogram {
        let provider = ProviderKind::ALL
            .iter()
            .position(|provider| provider.as_str() == record.provider);
        let known = self
            .latency
            .iter()
            .find(|(topic, _)| **topic == *record.topic);
        match (known, provider) {
            (Some((_, by_provider)), Some(at)) => by_provider[at].clone(),
            _ => latency_histogram(record.provider, record.topic.to_string()),
        }
    }

    /// Whether a retryable send error means the whole cluster is away (no
    /// broker reachable), rather than this record's topic or partition
    /// (a denied write, a partition without a leader, too few in-sync
    /// replicas). A timeout says neither, so the cluster is asked.
    async fn cluster_unreachable(&self, error: &PublishError) -> bool {
        let code = match error {
            PublishError::Unavailable(error) => error.rdkafka_error_code(),
            PublishError::DeadlinePassed => None,
            _ => return false,
        };
        match code {
            Some(
                RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::Authentication
                | RDKafkaErrorCode::SSL,
            ) => true,
            None | Some(RDKafkaErrorCode::MessageTimedOut | RDKafkaErrorCode::RequestTimedOut) => {
                !metadata_answers(self.producer().0, CLUSTER_PROBE).await
            }
            Some(_) => false,
        }
    }

    fn producer(&self) -> (KafkaProducer, u64) {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        (current.producer.clone(), current.generation)
    }

    /// Whether the broker answers a metadata request within `timeout`;
    /// `false` at once while it is known to be down.
    pub async fn broker_reachable(&self, timeout: Duration) -> bool {
        self.health.is_up() && metadata_answers(self.producer().0, timeout).await
    }

    /// Whether a broker answers, as the last send or probe found.
    pub fn health(&self) -> &BrokerHealth {
        &self.health
    }

    /// Waits for queued records to be delivered, at most `timeout`.
    pub async fn flush(&self, timeout: Duration) {
        let (producer, _) = self.producer();
        let flushed =
            tokio::task::spawn_blocking(move || producer.flush(Timeout::After(timeout))).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "Producer flush did not finish.");
        }
    }
}

/// The admin and the producer client configurations: posbridge's defaults,
/// the pass-through properties over them, the brokers, and (for the
/// producer) what posbridge fixes and the record size.
fn client_configs(config: &KafkaConfig, max_record_bytes: usize) -> (ClientConfig, ClientConfig) {
    let mut admin_config = ClientConfig::new();
    for (key, value) in config.default_client_properties() {
        admin_config.set(key, value);
    }
    for (key, value) in config.passed_through() {
        admin_config.set(key, value);
    }
    admin_config.set("bootstrap.servers", &config.brokers);
    let mut producer_config = admin_config.clone();
    for (key, value) in config.fixed_producer_properties() {
        producer_config.set(key, value);
    }
    producer_config.set("message.max.bytes", max_record_bytes.to_string());
    (admin_config, producer_config)
}

/// Whether librdkafka takes the producer configuration: unknown properties,
/// values it rejects, features it was built without. Nothing connects.
///
/// # Errors
/// librdkafka's refusal, which names the property.
pub fn validate(config: &KafkaConfig, max_record_bytes: usize) -> Result<(), KafkaError> {
    let (_, mut producer_config) = client_configs(config, max_record_bytes);
    // No brokers: the client is made and dropped without a connection.
    producer_config.set("bootstrap.servers", "");
    producer_config
        .create::<rdkafka::producer::BaseProducer>()
        .map(drop)
}

/// Asks for metadata once a second while no broker answers, and marks the
/// broker up when one does. Ends with the last `Publisher` handle.
async fn probe(current: Weak<RwLock<Current>>, health: Arc<BrokerHealth>) {
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        let Some(producer) = producer_of(&current) else {
            return;
        };
        if health.is_up() {
            continue;
        }
        if metadata_answers(producer, PROBE_EVERY).await {
            health.mark_up();
        }
    }
}

/// The producer in use, for a background loop that holds the publisher
/// weakly; `None` once the last `Publisher` handle is gone.
fn producer_of(current: &Weak<RwLock<Current>>) -> Option<KafkaProducer> {
    let current = current.upgrade()?;
    let producer = current
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .producer
        .clone();
    Some(producer)
}

/// Whether a broker answers a metadata request within `timeout`.
async fn metadata_answers(producer: KafkaProducer, timeout: Duration) -> bool {
    tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(None, Timeout::After(timeout))
            .is_ok()
    })
    .await
    .unwrap_or(false)
}

/// A topic's acknowledgement latency histogram for one provider.
fn latency_histogram(provider: &'static str, topic: String) -> Histogram {
    metrics::histogram!(
        telemetry::PUBLISH_DURATION,
        telemetry::PROVIDER => provider,
        telemetry::TOPIC => topic
    )
}

#[cfg(test)]
mod tests {
    use super::client_configs;
    use crate::config::KafkaConfig;

    #[test]
    fn posbridges_defaults_apply_unless_the_pass_through_table_sets_them() {
        let mut config = KafkaConfig::default();
        let (admin, producer) = client_configs(&config, 1_000);
        assert_eq!(admin.get("reconnect.backoff.max.ms"), Some("1000"));
        assert_eq!(producer.get("reconnect.backoff.max.ms"), Some("1000"));
        config
            .librdkafka
            .insert("reconnect.backoff.max.ms".into(), "10000".into());
        let (admin, producer) = client_configs(&config, 1_000);
        assert_eq!(admin.get("reconnect.backoff.max.ms"), Some("10000"));
        assert_eq!(producer.get("reconnect.backoff.max.ms"), Some("10000"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn a_first_reconnect_wait_longer_than_the_default_maximum_raises_it() {
        let mut config = KafkaConfig::default();
        config
            .librdkafka
            .insert("reconnect.backoff.ms".into(), "2000".into());
        let (_, producer) = client_configs(&config, 1_000);
        assert_eq!(producer.get("reconnect.backoff.max.ms"), Some("2000"));
        assert_eq!(
            super::validate(&config, 1_000).map_err(|e| e.to_string()),
            Ok(())
        );
    }
}
