//! Configuration: plain data, loaded once from a TOML file with every key
//! overridable by `POSBRIDGE__SECTION__KEY` environment variables.
//!
//! Nothing here opens a connection: `App::build` turns this data into a
//! running service, and [`Config::problems`] reports every mistake at once so
//! `posbridge check-config` can explain them all in one go.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::event::{EntityType, ProviderKind};
use crate::verify::SchemeName;

/// Environment variables with this prefix override file keys.
pub const ENV_PREFIX: &str = "POSBRIDGE";
/// Separates the prefix and the path segments of an override.
pub const ENV_SEPARATOR: &str = "__";

/// Mekari's last retry comes about 11 hours after the first attempt (plus up
/// to a minute of jitter); a done delivery id must be remembered longer.
const LONGEST_RETRY_WINDOW: Duration = Duration::from_secs(11 * 3600 + 5 * 60);

/// Both providers give up on an attempt after 10 s; our answer must come well
/// before that, including the wait for Kafka's acknowledgement.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);

/// Properties posbridge sets itself; passing them through would break a
/// promise the service makes (exactly-once per partition, acks from all
/// replicas, Java-compatible partitioning, the delivery deadline).
const RESERVED_KAFKA_PROPERTIES: [&str; 6] = [
    "bootstrap.servers",
    "enable.idempotence",
    "acks",
    "partitioner",
    "message.timeout.ms",
    "delivery.timeout.ms",
];

/// Why the configuration could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing or is not valid TOML, or a value has the wrong type.
    #[error("cannot read configuration: {0}")]
    Read(#[from] config::ConfigError),
    /// The file parsed, but some values are wrong; each problem names its key.
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// One mistake in the configuration, named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path, e.g. `mekari.sources.main.secrets`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP listener and answer policy.
    #[serde(default)]
    pub server: ServerConfig,
    /// Broker, topics, producer settings.
    #[serde(default)]
    pub kafka: KafkaConfig,
    /// Confluent Schema Registry; absent means registry-less single-object encoding.
    #[serde(default)]
    pub schema_registry: RegistryConfig,
    /// Where delivery ids and entity versions are kept.
    #[serde(default)]
    pub ledger: LedgerConfig,
    /// ReceiptRoller webhooks.
    #[serde(default)]
    pub receiptroller: ProviderConfig,
    /// Mekari POS webhooks.
    #[serde(default)]
    pub mekari: ProviderConfig,
    /// Catching up from the providers' APIs.
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    /// Watching that the providers still send to us.
    #[serde(default)]
    pub watchdog: WatchdogConfig,
}

/// The reconciler: reads what webhooks may have missed from the providers'
/// list APIs and publishes it through the same pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    /// Run on a schedule inside `serve`.
    #[serde(default)]
    pub enabled: bool,
    /// Time between scheduled runs.
    #[serde(default = "default_reconcile_interval_secs")]
    pub interval_secs: u64,
    /// Each run starts this long before its checkpoint: ReceiptRoller's
    /// retries take ~71 min and Mekari's offline sales carry earlier times.
    #[serde(default = "default_lookback_secs")]
    pub lookback_secs: u64,
    /// How far back the first run of a source reaches, with no checkpoint yet.
    #[serde(default = "default_initial_window_secs")]
    pub initial_window_secs: u64,
    /// A run's window is read in steps of this length; the checkpoint moves
    /// after each complete step, so a crash resumes from the last one.
    #[serde(default = "default_step_secs")]
    pub step_secs: u64,
    /// Attempts per API page before the run fails (429, 5xx, connection errors).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Timeout of one API request.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            enabled: false,
            interval_secs: default_reconcile_interval_secs(),
            lookback_secs: default_lookback_secs(),
            initial_window_secs: default_initial_window_secs(),
            step_secs: default_step_secs(),
            max_attempts: default_max_attempts(),
            request_timeout_ms: default_request_timeout_ms(),
        }
    }
}

const fn default_reconcile_interval_secs() -> u64 {
    900
}
// ReceiptRoller's last retry comes ~71 min after the first attempt; 90 min covers it.
const fn default_lookback_secs() -> u64 {
    90 * 60
}
const fn default_initial_window_secs() -> u64 {
    24 * 3600
}
const fn default_step_secs() -> u64 {
    3600
}
const fn default_max_attempts() -> u32 {
    5
}
const fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The webhook-health watchdog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogConfig {
    /// Run inside `serve`.
    #[serde(default)]
    pub enabled: bool,
    /// Time between checks of every webhook's state.
    #[serde(default = "default_watchdog_interval_secs")]
    pub interval_secs: u64,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            enabled: false,
            interval_secs: default_watchdog_interval_secs(),
        }
    }
}

const fn default_watchdog_interval_secs() -> u64 {
    60
}

/// How to read one source's data and webhook state from its provider's API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// API base URL; paths are appended to it.
    pub base_url: String,
    /// ReceiptRoller: bearer token.
    #[serde(default)]
    pub token: Option<Secret>,
    /// Mekari: HMAC client id.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Mekari: HMAC client secret.
    #[serde(default)]
    pub client_secret: Option<Secret>,
    /// Mekari: outlets whose orders, returns, refunds and exchanges are read.
    #[serde(default)]
    pub outlets: Vec<String>,
    /// Records per page requested.
    #[serde(default = "default_per_page")]
    pub per_page: u32,
    /// Path overrides by name (see each provider's defaults).
    #[serde(default)]
    pub paths: BTreeMap<String, String>,
    /// ReceiptRoller: this source's webhook id, for the watchdog.
    #[serde(default)]
    pub webhook_id: Option<String>,
    /// Mekari: this source's endpoint key, for the watchdog.
    #[serde(default)]
    pub endpoint_key: Option<String>,
    /// Switch the webhook back on when the watchdog finds it off (Mekari:
    /// `test`, then the same `PUT`; ReceiptRoller: `PATCH active=true`).
    #[serde(default)]
    pub resume_when_off: bool,
}

const fn default_per_page() -> u32 {
    100
}

/// HTTP listener and answer policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Largest webhook body accepted; larger gets 413 before any work.
    #[serde(default = "default_body_limit_bytes")]
    pub body_limit_bytes: usize,
    /// `Retry-After` sent with 503. Mekari waits at least this long (capped at
    /// one hour by Mekari); ReceiptRoller ignores it.
    #[serde(default = "default_retry_after_secs")]
    pub retry_after_secs: u64,
    /// How long a duplicate waits for the same delivery already in flight
    /// before answering 503.
    #[serde(default = "default_inflight_wait_ms")]
    pub inflight_wait_ms: u64,
    /// How long shutdown waits for in-flight deliveries and the producer flush.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            body_limit_bytes: default_body_limit_bytes(),
            retry_after_secs: default_retry_after_secs(),
            inflight_wait_ms: default_inflight_wait_ms(),
            shutdown_timeout_ms: default_shutdown_timeout_ms(),
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
const fn default_body_limit_bytes() -> usize {
    1024 * 1024
}
// Mekari's second attempt comes 30 s after the first anyway.
const fn default_retry_after_secs() -> u64 {
    30
}
const fn default_inflight_wait_ms() -> u64 {
    3000
}
const fn default_shutdown_timeout_ms() -> u64 {
    10_000
}

/// Broker, topics and producer settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    #[serde(default = "default_brokers")]
    pub brokers: String,
    /// Prefix of every default topic name (`pos.` gives `pos.sales`, …).
    #[serde(default = "default_topic_prefix")]
    pub topic_prefix: String,
    /// Per entity type (plural name: `sales`, `orders`, …) a full topic name
    /// that replaces `{topic_prefix}{plural}`.
    #[serde(default)]
    pub topics: BTreeMap<String, String>,
    /// Where events we cannot normalize go, raw; default `{topic_prefix}dead-letter`.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Partitions for topics posbridge creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor for topics posbridge creates.
    #[serde(default = "default_replication_factor")]
    pub replication_factor: i32,
    /// Create missing topics at start-up (compact for entities, delete for dead letters).
    #[serde(default = "default_true")]
    pub create_topics: bool,
    /// How long one record may take to be acknowledged before the delivery is
    /// answered 503; must leave room inside the providers' 10 s.
    #[serde(default = "default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u64,
    /// Any other librdkafka producer property, passed through as is.
    #[serde(default)]
    pub librdkafka: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: default_brokers(),
            topic_prefix: default_topic_prefix(),
            topics: BTreeMap::new(),
            dead_letter_topic: None,
            partitions: default_partitions(),
            replication_factor: default_replication_factor(),
            create_topics: true,
            delivery_timeout_ms: default_delivery_timeout_ms(),
            librdkafka: BTreeMap::new(),
        }
    }
}

fn default_brokers() -> String {
    "127.0.0.1:9092".into()
}
fn default_topic_prefix() -> String {
    "pos.".into()
}
const fn default_partitions() -> i32 {
    6
}
const fn default_replication_factor() -> i32 {
    1
}
const fn default_true() -> bool {
    true
}
const fn default_delivery_timeout_ms() -> u64 {
    5000
}

impl KafkaConfig {
    /// The topic an entity type's records go to.
    pub fn topic(&self, entity: EntityType) -> String {
        self.topics
            .get(entity.plural())
            .cloned()
            .unwrap_or_else(|| format!("{}{}", self.topic_prefix, entity.plural()))
    }

    /// The dead-letter topic.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| format!("{}dead-letter", self.topic_prefix))
    }

    /// The produce deadline as a duration.
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }
}

/// Confluent Schema Registry settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Registry base URL; when absent, records use Avro single-object encoding.
    #[serde(default)]
    pub url: Option<String>,
    /// Basic-auth user, when the registry needs one.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<Secret>,
}

/// Which ledger backend keeps delivery ids and entity versions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerBackend {
    /// A redb file on local disk: one process, survives restarts.
    #[default]
    Embedded,
    /// A Redis server shared by several processes (replicas, `posbridge
    /// reconciler` beside `serve`). Give it persistence (AOF) in production.
    Redis,
}

/// Ledger settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// Backend kind.
    #[serde(default)]
    pub backend: LedgerBackend,
    /// File of the embedded backend.
    #[serde(default = "default_ledger_path")]
    pub path: PathBuf,
    /// How long a finished delivery id is remembered. It must outlast the
    /// slowest provider's whole retry window (Mekari: ~11 h), or a late retry
    /// is processed twice.
    #[serde(default = "default_dedup_ttl_secs")]
    pub dedup_ttl_secs: u64,
    /// Redis backend: server URL.
    #[serde(default = "default_redis_url")]
    pub redis_url: String,
    /// Redis backend: prefix of every key, so deployments can share a server.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".into()
}
fn default_redis_prefix() -> String {
    "posbridge:".into()
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            backend: LedgerBackend::Embedded,
            path: default_ledger_path(),
            dedup_ttl_secs: default_dedup_ttl_secs(),
            redis_url: default_redis_url(),
            redis_prefix: default_redis_prefix(),
        }
    }
}

fn default_ledger_path() -> PathBuf {
    "posbridge-ledger.redb".into()
}
// A day: twice Mekari's ~11 h retry window, "a few hours at least" for ReceiptRoller.
const fn default_dedup_ttl_secs() -> u64 {
    24 * 3600
}

/// One provider's webhooks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Configured webhooks by name; the name is the `{source}` in the URL.
    #[serde(default)]
    pub sources: BTreeMap<String, SourceConfig>,
}

/// One configured webhook.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Secrets that may sign a delivery; any one matching accepts it, so a
    /// new secret can be added before the provider switches to it.
    pub secrets: Secrets,
    /// Signature scheme; the provider's default when absent.
    #[serde(default)]
    pub scheme: Option<SchemeName>,
    /// Signature header; the scheme's or provider's default when absent.
    #[serde(default)]
    pub header: Option<String>,
    /// For timestamped schemes (stripe, standard-webhooks): how far the
    /// signed time may be from ours.
    #[serde(default = "default_tolerance_secs")]
    pub tolerance_secs: u64,
    /// Merchant account this webhook serves; becomes part of record keys.
    #[serde(default)]
    pub account: Option<String>,
    /// The provider's API for this source's account: reconciler and watchdog.
    #[serde(default)]
    pub api: Option<ApiConfig>,
}

const fn default_tolerance_secs() -> u64 {
    300
}

/// A secret value whose `Debug` never shows it, so it cannot reach logs.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A list of secrets, from a TOML array or, for environment overrides, one
/// comma-separated string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secrets(pub Vec<Secret>);

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            List(Vec<String>),
            Joined(String),
        }
        let list = match Form::deserialize(deserializer)? {
            Form::List(list) => list,
            Form::Joined(joined) => joined.split(',').map(str::to_owned).collect(),
        };
        Ok(Secrets(
            list.into_iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .map(Secret)
                .collect(),
        ))
    }
}

impl Config {
    /// Reads the file (when given) and the environment overrides, then
    /// validates.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read or has a key of the
    /// wrong type or an unknown key; [`ConfigError::Invalid`] listing every
    /// problem [`Config::problems`] finds.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let config = Self::read(path)?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// Reads without validating, for `check-config` which reports problems itself.
    ///
    /// # Errors
    /// [`ConfigError::Read`] as for [`Config::load`].
    pub fn read(path: Option<&Path>) -> Result<Config, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            builder = builder.add_source(
                config::File::from(path)
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        let built = builder
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator(ENV_SEPARATOR)
                    .separator(ENV_SEPARATOR),
            )
            .build()?;
        Ok(built.try_deserialize()?)
    }

    /// The sources of one provider.
    pub fn provider(&self, provider: ProviderKind) -> &ProviderConfig {
        match provider {
            ProviderKind::ReceiptRoller => &self.receiptroller,
            ProviderKind::Mekari => &self.mekari,
        }
    }

    /// Every mistake found, each with its key path. Empty means valid.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut problem = |key: &str, message: String| {
            problems.push(Problem {
                key: key.to_owned(),
                message,
            })
        };

        if self.server.listen.parse::<std::net::SocketAddr>().is_err() {
            problem(
                "server.listen",
                format!(
                    "`{}` is not an address like 127.0.0.1:8080",
                    self.server.listen
                ),
            );
        }
        if self.server.body_limit_bytes == 0 {
            problem("server.body_limit_bytes", "must be above 0".into());
        }
        if self.server.retry_after_secs == 0 || self.server.retry_after_secs > 3600 {
            problem(
                "server.retry_after_secs",
                "must be 1..=3600 (Mekari caps Retry-After at one hour)".into(),
            );
        }
        let answer_budget = Duration::from_millis(self.kafka.delivery_timeout_ms)
            + Duration::from_millis(self.server.inflight_wait_ms);
        if answer_budget >= PROVIDER_TIMEOUT.mul_f32(0.9) {
            problem(
                "kafka.delivery_timeout_ms",
                format!(
                    "delivery_timeout_ms + server.inflight_wait_ms = {} ms leaves no room inside the providers' 10 s answer limit; keep the sum under 9000",
                    answer_budget.as_millis()
                ),
            );
        }
        if self.kafka.delivery_timeout_ms < 100 {
            problem(
                "kafka.delivery_timeout_ms",
                "must be at least 100 ms".into(),
            );
        }
        if self.kafka.brokers.trim().is_empty() {
            problem("kafka.brokers", "must name at least one broker".into());
        }
        if self.kafka.partitions < 1 {
            problem("kafka.partitions", "must be at least 1".into());
        }
        if self.kafka.replication_factor < 1 {
            problem("kafka.replication_factor", "must be at least 1".into());
        }
        for name in self.kafka.topics.keys() {
            if !EntityType::ALL.iter().any(|t| t.plural() == name) {
                problem(
                    &format!("kafka.topics.{name}"),
                    format!(
                        "unknown entity type; use one of {}",
                        EntityType::ALL.map(|t| t.plural()).join(", ")
                    ),
                );
            }
        }
        let mut topics: Vec<(String, String)> = EntityType::ALL
            .iter()
            .map(|t| (format!("kafka.topics.{}", t.plural()), self.kafka.topic(*t)))
            .collect();
        topics.push((
            "kafka.dead_letter_topic".into(),
            self.kafka.dead_letter_topic(),
        ));
        for (key, topic) in &topics {
            if !valid_topic_name(topic) {
                problem(
                    key,
                    format!(
                        "`{topic}` is not a valid Kafka topic name (1-249 of a-z A-Z 0-9 . _ -)"
                    ),
                );
            }
            if topics.iter().filter(|(_, t)| t == topic).count() > 1 {
                problem(key, format!("topic `{topic}` is used twice"));
            }
        }
        for name in self.kafka.librdkafka.keys() {
            if RESERVED_KAFKA_PROPERTIES.contains(&name.as_str()) {
                problem(
                    &format!("kafka.librdkafka.\"{name}\""),
                    "posbridge sets this itself (idempotent, acks=all, murmur2_random, delivery deadline); use kafka.brokers / kafka.delivery_timeout_ms or remove it".into(),
                );
            }
        }
        if let Some(url) = &self.schema_registry.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            problem(
                "schema_registry.url",
                format!("`{url}` must start with http:// or https://"),
            );
        }
        if self.ledger.backend == LedgerBackend::Redis
            && !(self.ledger.redis_url.starts_with("redis://")
                || self.ledger.redis_url.starts_with("rediss://"))
        {
            problem(
                "ledger.redis_url",
                format!(
                    "`{}` must start with redis:// or rediss://",
                    self.ledger.redis_url
                ),
            );
        }
        if Duration::from_secs(self.ledger.dedup_ttl_secs) <= LONGEST_RETRY_WINDOW {
            problem(
                "ledger.dedup_ttl_secs",
                format!(
                    "{} s is shorter than Mekari's retry window (~11 h); a late retry would be published twice. Use at least {}",
                    self.ledger.dedup_ttl_secs,
                    LONGEST_RETRY_WINDOW.as_secs() + 1
                ),
            );
        }

        let mut any_source = false;
        for provider in ProviderKind::ALL {
            for (name, source) in &self.provider(provider).sources {
                any_source = true;
                let key = format!("{provider}.sources.{name}");
                if !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    problem(
                        &key,
                        "source names go into URLs: use a-z, 0-9, - and _".into(),
                    );
                }
                if source.secrets.0.is_empty() {
                    problem(
                        &format!("{key}.secrets"),
                        "at least one secret is needed to verify signatures".into(),
                    );
                }
                let scheme = source
                    .scheme
                    .unwrap_or_else(|| crate::providers::for_kind(provider).default_scheme());
                for (i, secret) in source.secrets.0.iter().enumerate() {
                    if let Err(error) = scheme.check_secret(secret.expose()) {
                        problem(&format!("{key}.secrets[{i}]"), error);
                    }
                }
                if let Some(api) = &source.api {
                    for (field, message) in crate::reconcile::api_problems(provider, api) {
                        problem(&format!("{key}.api.{field}"), message);
                    }
                }
                if let Some(account) = &source.account
                    && (account.is_empty() || account.contains(':'))
                {
                    problem(
                        &format!("{key}.account"),
                        "must be non-empty and without `:` (it is part of the record key)".into(),
                    );
                }
            }
        }
        for (key, value) in [
            ("reconcile.interval_secs", self.reconcile.interval_secs),
            ("reconcile.step_secs", self.reconcile.step_secs),
            ("watchdog.interval_secs", self.watchdog.interval_secs),
        ] {
            if value == 0 {
                problem(key, "must be above 0".into());
            }
        }
        if self.reconcile.max_attempts == 0 {
            problem("reconcile.max_attempts", "must be at least 1".into());
        }
        if !any_source {
            problem(
                "receiptroller.sources / mekari.sources",
                "no webhook source is configured; every request would get 404".into(),
            );
        }
        problems
    }
}

fn valid_topic_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap()
    }

    #[test]
    fn example_config_is_valid() {
        let text = include_str!("../config/posbridge.example.toml");
        let config = parse(text);
        assert_eq!(config.problems(), vec![]);
        assert_eq!(config.kafka.librdkafka.get("linger.ms").unwrap(), "5");
        assert_eq!(config.kafka.topic(EntityType::Sale), "pos.sales");
    }

    #[test]
    fn every_mistake_is_reported_with_its_key() {
        let config = parse(
            r#"
            [kafka]
            delivery_timeout_ms = 9500
            [kafka.topics]
            sale = "x"
            [kafka.librdkafka]
            "acks" = "1"
            [ledger]
            dedup_ttl_secs = 3600
            [mekari.sources.main]
            secrets = []
            [mekari.sources.main.api]
            base_url = "not a url"
            client_id = "c"
            client_secret = "s"
            [mekari.sources.main.api.paths]
            order = "/orders"
            "#,
        );
        let keys: Vec<String> = config.problems().into_iter().map(|p| p.key).collect();
        for expected in [
            "kafka.delivery_timeout_ms",
            "kafka.topics.sale",
            "kafka.librdkafka.\"acks\"",
            "ledger.dedup_ttl_secs",
            "mekari.sources.main.secrets",
            "mekari.sources.main.api.outlets",
            "mekari.sources.main.api.base_url",
            "mekari.sources.main.api.paths",
        ] {
            assert!(keys.iter().any(|k| k == expected), "{expected} in {keys:?}");
        }
    }

    #[test]
    fn secrets_accept_a_comma_separated_string() {
        let config = parse(
            r#"
            [receiptroller.sources.a]
            secrets = "one, two"
            "#,
        );
        let secrets = &config.receiptroller.sources["a"].secrets.0;
        assert_eq!(secrets.len(), 2);
        assert_eq!(secrets[1].expose(), "two");
        assert_eq!(format!("{:?}", secrets[0]), "[redacted]");
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let result: Result<Config, _> = config::Config::builder()
            .add_source(config::File::from_str(
                "[kafka]\nbrokerz = \"x\"",
                config::FileFormat::Toml,
            ))
            .build()
            .unwrap()
            .try_deserialize();
        assert!(result.unwrap_err().to_string().contains("brokerz"));
    }
}
