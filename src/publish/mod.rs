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

mod admin;
mod health;
mod watch;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::util::Timeout;

use crate::config::KafkaConfig;
use crate::event::EntityType;
use crate::telemetry;

use backon::BackoffBuilder as _;
use health::BrokerContext;
pub use health::{BrokerHealth, Refusal};
pub use watch::TopicChange;

/// How often the probe asks for metadata while no broker answers.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// How long a failed send's question "does the cluster answer at all?" may
/// take.
const CLUSTER_PROBE: Duration = Duration::from_millis(500);

/// The first wait before replacing a producer again when the one before
/// it failed for good too without a record acknowledged in between: a
/// cause a new producer id does not fix (an ACL) is then tried at most
/// once per wait, the wait doubling up to [`REPLACE_AGAIN_MAX`].
const REPLACE_AGAIN_MIN: Duration = Duration::from_secs(1);

/// The longest wait between two replacements of a producer that keeps
/// failing for good.
const REPLACE_AGAIN_MAX: Duration = Duration::from_secs(60);

/// The producer type: librdkafka's errors and logs go through [`BrokerContext`].
type KafkaProducer = FutureProducer<BrokerContext>;

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

    /// The start-up message's headline: what Kafka did, in the words of the
    /// cause, not "cannot reach" for a broker that answered with a refusal.
    pub fn headline(&self) -> &'static str {
        let code = match self {
            PublishError::CreateTopic { code, .. } => Some(*code),
            PublishError::CreateTopics(error) => error.rdkafka_error_code(),
            PublishError::Connection(_) => return "Kafka refused the connection",
            PublishError::TopicSettings { .. } => {
                return "an existing topic breaks a promise posbridge makes";
            }
            PublishError::Config(_) => return "librdkafka refused the Kafka settings",
            _ => None,
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
        let code = match self {
            PublishError::CreateTopic { code, .. } => Some(*code),
            PublishError::CreateTopics(error) => error.rdkafka_error_code(),
            _ => None,
        };
        match code {
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

/// Topic names by entity type, plus the dead-letter topic: where each record goes.
#[derive(Debug, Clone)]
pub struct Topics {
    /// One compacted topic per entity type.
    entities: BTreeMap<EntityType, String>,
    /// Raw bodies that could not be normalized.
    dead_letter: String,
}

impl Topics {
    /// The topics the configuration names (defaults from the prefix).
    pub fn new(config: &KafkaConfig) -> Topics {
        Topics {
            entities: EntityType::ALL
                .into_iter()
                .map(|t| (t, config.topic(t)))
                .collect(),
            dead_letter: config.dead_letter_topic(),
        }
    }

    /// The compacted topic of an entity type.
    pub fn entity(&self, entity_type: EntityType) -> &str {
        // Built from EntityType::ALL; a missing entry is a bug.
        &self.entities[&entity_type]
    }

    /// Every entity topic.
    pub fn entities(&self) -> impl Iterator<Item = &str> {
        self.entities.values().map(String::as_str)
    }

    /// The dead-letter topic.
    pub fn dead_letter(&self) -> &str {
        &self.dead_letter
    }

    /// Every topic with whether it is compacted: entity topics are, the
    /// dead-letter topic (raw bodies, each its own record) is not.
    pub fn all(&self) -> BTreeMap<String, bool> {
        let mut all: BTreeMap<String, bool> =
            self.entities().map(|t| (t.to_owned(), true)).collect();
        all.insert(self.dead_letter.clone(), false);
        all
    }
}

/// One record to produce, built by the pipeline (`pipeline/record.rs`).
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

/// The producer in use and its generation, so concurrent failures replace it once.
struct Current {
    /// The idempotent producer.
    producer: KafkaProducer,
    /// Bumped each time the producer is replaced.
    generation: u64,
    /// Replacements after fatal errors since the last acknowledged record.
    streak: Option<Streak>,
}

/// Producers replaced one after another, each failing for good before any
/// record was acknowledged: a cause a new producer id does not fix (a
/// denied ACL). Each next replacement waits longer, so the producer is not
/// rebuilt once per delivery.
struct Streak {
    /// The waits between replacements (`backon`'s exponential backoff).
    waits: backon::ExponentialBackoff,
    /// No replacement before this.
    not_before: Instant,
    /// Replacements in this streak.
    replacements: u32,
}

impl Streak {
    fn new() -> Streak {
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
    pub async fn send(&self, record: &OutgoingRecord) -> Result<(), PublishError> {
        if !self.health.is_up() {
            return Err(PublishError::BrokerDown);
        }
        if let Some(change) = self.health.changed(&record.topic) {
            return Err(PublishError::TopicChanged {
                topic: record.topic.clone(),
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
            Ok(Ok(_)) => Ok(()),
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
            Ok(_) => metrics::histogram!(
                telemetry::PUBLISH_DURATION,
                telemetry::PROVIDER => record.provider,
                telemetry::TOPIC => record.topic.clone()
            )
            .record(started.elapsed().as_secs_f64()),
            Err(e) => metrics::counter!(
                telemetry::PUBLISH_FAILURES,
                telemetry::PROVIDER => record.provider,
                telemetry::KIND => e.kind()
            )
            .increment(1),
        }
        result
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

    /// Replaces the producer, unless another failure already did since
    /// `generation` was read, or (after a fatal error) the streak's wait
    /// is not over: `why` is the failure that asks, named in the log.
    fn replace(&self, generation: u64, replace: Replace, why: &PublishError) {
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
    fn end_streak(&self) {
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
        let Some(current) = current.upgrade() else {
            return;
        };
        if health.is_up() {
            continue;
        }
        let producer = current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .producer
            .clone();
        drop(current);
        if metadata_answers(producer, PROBE_EVERY).await {
            health.mark_up();
        }
    }
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

/// Why a failed send replaces the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// librdkafka's fatal error: the producer takes no more records.
    Fatal,
    /// A timeout or a producer-state refusal, on a broker that cannot take
    /// librdkafka's epoch bump (`kafka.new_producer_after_timeout`).
    AfterTimeout,
}

/// Whether a send error (of a producer without a fatal error) is a timeout
/// or a producer-state refusal: what a broker that cannot take
/// librdkafka's epoch bump needs a new producer id for.
fn needs_new_producer_id(error: &KafkaError) -> bool {
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
fn classify(error: KafkaError) -> PublishError {
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
