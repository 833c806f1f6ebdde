//! The `[kafka]` section: broker, topics and producer settings.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::event::EntityType;

/// librdkafka's aliases (the "Alias for" rows of librdkafka 2.12's
/// CONFIGURATION.md), each beside the property it sets. A refusal is
/// decided on the property set, so no spelling gets round it.
const ALIASES: [(&str, &str); 11] = [
    ("acks", "request.required.acks"),
    ("bootstrap.servers", "metadata.broker.list"),
    ("compression.type", "compression.codec"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("linger.ms", "queue.buffering.max.ms"),
    ("max.in.flight", "max.in.flight.requests.per.connection"),
    ("max.partition.fetch.bytes", "fetch.message.max.bytes"),
    ("retries", "message.send.max.retries"),
    ("sasl.mechanism", "sasl.mechanisms"),
    (
        "sasl.oauthbearer.client.credentials.client.id",
        "sasl.oauthbearer.client.id",
    ),
    (
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.client.secret",
    ),
];

/// The global properties whose names start with `topic.`. librdkafka
/// hands any other `topic.X` to the default topic configuration as `X`
/// (`topic.partitioner` sets `partitioner`).
const GLOBAL_TOPIC_PROPERTIES: [&str; 6] = [
    "topic.blacklist",
    "topic.metadata.propagation.max.ms",
    "topic.metadata.refresh.fast.cnt",
    "topic.metadata.refresh.fast.interval.ms",
    "topic.metadata.refresh.interval.ms",
    "topic.metadata.refresh.sparse",
];

/// The property librdkafka sets for `name`: a `topic.` prefix dropped as
/// librdkafka drops it, then an alias resolved.
pub fn property_set_by(name: &str) -> &str {
    let name = match name.strip_prefix("topic.") {
        Some(topic_property) if !GLOBAL_TOPIC_PROPERTIES.contains(&name) => topic_property,
        _ => name,
    };
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, property)| property)
}

/// The librdkafka properties only a producer reads (scope `P` in
/// librdkafka 2.12's CONFIGURATION.md). A consumer made from the same
/// pass-through table (the dead-letter replay) leaves them out.
const PRODUCER_ONLY_PROPERTIES: [&str; 30] = [
    "acks",
    "batch.num.messages",
    "batch.size",
    "compression.codec",
    "compression.level",
    "compression.type",
    "delivery.report.only.error",
    "delivery.timeout.ms",
    "dr_cb",
    "dr_msg_cb",
    "enable.gapless.guarantee",
    "enable.idempotence",
    "linger.ms",
    "message.send.max.retries",
    "message.timeout.ms",
    "msg_order_cmp",
    "partitioner",
    "partitioner_cb",
    "produce.offset.report",
    "queue.buffering.backpressure.threshold",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "queue.buffering.max.ms",
    "queuing.strategy",
    "request.required.acks",
    "request.timeout.ms",
    "retries",
    "sticky.partitioning.linger.ms",
    "transaction.timeout.ms",
    "transactional.id",
];

/// The longest wait between two connection attempts to a broker, unless
/// `[kafka.librdkafka]` sets `reconnect.backoff.max.ms`. librdkafka doubles
/// its wait up to 10 s by default, so a broker back after a few seconds'
/// outage was seen again only up to 5 s later (measured), while every
/// delivery was refused 503 at once; one attempt a second at most finds it
/// within a second, for a connection attempt per broker per second during
/// an outage.
const RECONNECT_BACKOFF_MAX_MS: u64 = 1000;

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
    /// Where events we cannot normalize go, raw; default `pos-dead-letter`
    /// for the prefix `pos.` (outside the entity topics' pattern).
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Partitions for topics posbridge creates.
    #[serde(default = "default_partitions")]
    pub partitions: i32,
    /// Replication factor for topics posbridge creates; by default as many
    /// replicas as the cluster has brokers, at most 3. Created topics get
    /// `min.insync.replicas` one less (at least 1), so `acks=all` means a
    /// record on at least two brokers wherever there are three.
    #[serde(default)]
    pub replication_factor: Option<i32>,
    /// Create missing topics at start-up (compact for entities, delete for dead letters).
    #[serde(default = "super::default_true")]
    pub create_topics: bool,
    /// How long one record may take to be acknowledged before the delivery is
    /// answered 503; must leave room inside the providers' 10 s.
    #[serde(default = "default_delivery_timeout_ms")]
    pub delivery_timeout_ms: u64,
    /// Replace the producer (a new producer id) after a timed-out record,
    /// not only after a fatal error: for tansu 0.6, which panics on the
    /// epoch librdkafka bumps instead. Off for Kafka and every broker that
    /// implements KIP-360, where a new producer id could let a record in
    /// doubt land after a newer record of the same key.
    #[serde(default)]
    pub new_producer_after_timeout: bool,
    /// How often the entity topics are checked again while running, as at
    /// start-up: a topic whose partitions changed, whose `cleanup.policy`
    /// no longer compacts, or that is gone has its records refused (503, or
    /// the spool) until it is as it was. 0 checks only at start-up.
    #[serde(default = "default_topic_check_secs")]
    pub topic_check_secs: u64,
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
            replication_factor: None,
            create_topics: true,
            delivery_timeout_ms: default_delivery_timeout_ms(),
            new_producer_after_timeout: false,
            topic_check_secs: default_topic_check_secs(),
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
const fn default_delivery_timeout_ms() -> u64 {
    5000
}
/// Often enough that a changed topic takes few records before it is
/// refused, rare enough that the two admin requests a look costs do not
/// count on the cluster.
const fn default_topic_check_secs() -> u64 {
    30
}

impl KafkaConfig {
    /// The topic an entity type's records go to.
    pub fn topic(&self, entity: EntityType) -> String {
        self.topics
            .get(entity.plural())
            .cloned()
            .unwrap_or_else(|| format!("{}{}", self.topic_prefix, entity.plural()))
    }

    /// The dead-letter topic: by default `{topic_prefix}` without its
    /// trailing separator, then `-dead-letter` (`pos.` gives
    /// `pos-dead-letter`), so a consumer subscribing to the entity topics by
    /// pattern (`pos\..*`) with an Avro deserializer does not also get the
    /// raw JSON of dead letters.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic.clone().unwrap_or_else(|| {
            let stem = self.topic_prefix.trim_end_matches(['.', '_', '-']);
            if stem.is_empty() {
                "dead-letter".to_owned()
            } else {
                format!("{stem}-dead-letter")
            }
        })
    }

    /// The produce deadline as a duration.
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }

    /// The librdkafka properties posbridge sets unless `[kafka.librdkafka]`
    /// sets them too. librdkafka refuses a `reconnect.backoff.max.ms` below
    /// `reconnect.backoff.ms`, so a first wait set longer than the default
    /// maximum raises the maximum with it.
    pub fn default_client_properties(&self) -> [(&'static str, String); 1] {
        let first_wait = self
            .librdkafka
            .get("reconnect.backoff.ms")
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .unwrap_or(0);
        [(
            "reconnect.backoff.max.ms",
            RECONNECT_BACKOFF_MAX_MS.max(first_wait).to_string(),
        )]
    }

    /// The producer properties posbridge sets itself, the one list of them:
    /// passing any of these through `librdkafka` would break a promise the
    /// service makes (exactly-once per partition, acks from all replicas,
    /// Java-compatible partitioning, the delivery deadline).
    pub fn fixed_producer_properties(&self) -> [(&'static str, String); 5] {
        [
            ("bootstrap.servers", self.brokers.clone()),
            ("enable.idempotence", "true".into()),
            ("acks", "all".into()),
            ("partitioner", PARTITIONER.into()),
            ("message.timeout.ms", self.delivery_timeout_ms.to_string()),
        ]
    }

    /// The properties of a consumer of posbridge's own topics: the brokers
    /// and the pass-through table (TLS, SASL, timeouts), without what only a
    /// producer reads.
    pub fn consumer_properties(&self) -> Vec<(&str, &str)> {
        self.passed_through()
            .filter(|(key, _)| !PRODUCER_ONLY_PROPERTIES.contains(&property_set_by(key)))
            .chain([("bootstrap.servers", self.brokers.as_str())])
            .collect()
    }

    /// The pass-through table without the properties posbridge sets itself:
    /// those are either refused ([`Self::refusal`]) or spelled to mean what
    /// posbridge sets, and librdkafka applies a client's properties in no
    /// fixed order, so an alias beside the fixed name could win either way.
    pub fn passed_through(&self) -> impl Iterator<Item = (&str, &str)> {
        let fixed = self.fixed_property_names();
        self.librdkafka
            .iter()
            .filter(move |(key, _)| !fixed.contains(&property_set_by(key)))
            .map(|(key, value)| (key.as_str(), value.as_str()))
    }

    /// The properties posbridge sets, and `transactional.id`, which it keeps
    /// unset, each by the name librdkafka files it under
    /// ([`property_set_by`]): the pass-through table cannot change them.
    fn fixed_property_names(&self) -> Vec<&'static str> {
        self.fixed_producer_properties()
            .map(|(name, _)| property_set_by(name))
            .into_iter()
            .chain(["transactional.id"])
            .collect()
    }

    /// Why a pass-through property cannot be taken, with what to do instead;
    /// `None` for a property posbridge leaves to the user, or one spelled
    /// (under any alias) to mean what posbridge sets. The one judgement of
    /// the table's properties that `check-config` and `serve` both use.
    pub fn refusal(&self, name: &str, value: &str) -> Option<String> {
        let value = value.trim();
        let (same, why) = match property_set_by(name) {
            "metadata.broker.list" => (
                value == self.brokers.trim(),
                "it names the brokers: set kafka.brokers instead (a second list would send writes to another cluster)",
            ),
            "enable.idempotence" => (
                ["true", "t", "1"]
                    .iter()
                    .any(|yes| value.eq_ignore_ascii_case(yes)),
                "posbridge's producer is idempotent (each record once per partition); remove it",
            ),
            "request.required.acks" => (
                value.eq_ignore_ascii_case("all") || value == "-1",
                "posbridge waits for every in-sync replica (acks = all, or -1); remove it",
            ),
            "partitioner" => (
                value == PARTITIONER,
                "posbridge partitions as Java clients do (murmur2_random), so every state of a key lands on one partition and compaction keeps the newest; remove it",
            ),
            "message.timeout.ms" => (
                value.parse() == Ok(self.delivery_timeout_ms),
                "it is the delivery deadline: set kafka.delivery_timeout_ms instead",
            ),
            "transactional.id" => (
                false,
                "posbridge's producer is idempotent, not transactional: with a transactional id librdkafka refuses every record sent outside a transaction, so every delivery would fail; remove it",
            ),
            _ => return None,
        };
        (!same).then(|| format!("posbridge sets this itself: {why}"))
    }
}

/// The partitioner of Java clients and Kafka Streams: a key's records land
/// where theirs do.
const PARTITIONER: &str = "murmur2_random";

/// Room for an event record's fields, headers and key beside its body: a
/// record carries the raw body once and its normalized fields, which are never
/// longer than the JSON they came from, so it is at most twice the body plus this.
pub const RECORD_ENVELOPE_BYTES: usize = 64 * 1024;

impl KafkaConfig {
    /// The section's mistakes, as (key, what is wrong). `needed` is the
    /// record size the body limit asks for (`Config::max_record_bytes`),
    /// `body_limit` that limit. The produce deadline against the providers'
    /// answer limit is checked in `app::check`.
    pub fn problems(&self, needed: usize, body_limit: usize) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |key: &str, message: String| problems.push((key.to_owned(), message));
        match self
            .librdkafka
            .get("message.max.bytes")
            .map(|v| v.trim().parse::<usize>())
        {
            Some(Err(_)) => problem(
                "kafka.librdkafka.\"message.max.bytes\"",
                "must be a number of bytes".into(),
            ),
            Some(Ok(max)) if needed > max => {
                // A body limit is only a fix when it would still take a body.
                let fitting_body = max.saturating_sub(RECORD_ENVELOPE_BYTES) / 2;
                let or_lower = if fitting_body > 0 {
                    format!(" or lower server.body_limit_bytes to {fitting_body}")
                } else {
                    format!(" ({max} is not even room for the envelope, so no body limit fits it)")
                };
                problem(
                    "kafka.librdkafka.\"message.max.bytes\"",
                    format!(
                        "{max} cannot hold every accepted event: a record holds its body at most twice (raw and normalized) plus up to {RECORD_ENVELOPE_BYTES} bytes of envelope, so server.body_limit_bytes = {body_limit} needs {needed}; leave message.max.bytes unset (posbridge then sets it, and the created topics' max.message.bytes, to that){or_lower}",
                    ),
                );
            }
            Some(_) | None => {}
        }
        if self.delivery_timeout_ms < 100 {
            problem(
                "kafka.delivery_timeout_ms",
                "must be at least 100 ms".into(),
            );
        }
        if self.brokers.trim().is_empty() {
            problem("kafka.brokers", "must name at least one broker".into());
        }
        if self.partitions < 1 {
            problem("kafka.partitions", "must be at least 1".into());
        }
        if self.replication_factor.is_some_and(|rf| rf < 1) {
            problem("kafka.replication_factor", "must be at least 1".into());
        }
        for name in self.topics.keys() {
            if !EntityType::ALL.iter().any(|t| t.plural() == name) {
                problem(
                    &format!("kafka.topics.{name}"),
                    format!(
                        "unknown entity type; use one of {}",
                        EntityType::ALL.map(EntityType::plural).join(", ")
                    ),
                );
            }
        }
        let mut topics: Vec<(String, String)> = EntityType::ALL
            .iter()
            .map(|t| (format!("kafka.topics.{}", t.plural()), self.topic(*t)))
            .collect();
        topics.push(("kafka.dead_letter_topic".into(), self.dead_letter_topic()));
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
        if let Some(letters) = &self.dead_letter_topic
            && !self.topic_prefix.is_empty()
            && letters.starts_with(&self.topic_prefix)
        {
            let prefix = &self.topic_prefix;
            let fix = KafkaConfig {
                dead_letter_topic: None,
                ..self.clone()
            }
            .dead_letter_topic();
            let fix = if fix.starts_with(prefix.as_str()) {
                "a name that does not start with it".to_owned()
            } else {
                format!("`{fix}` (the default: remove the setting)")
            };
            problem(
                "kafka.dead_letter_topic",
                format!(
                    "`{letters}` starts with the entity topics' prefix `{prefix}`: a consumer subscribing to the entity topics by that prefix would get raw JSON letters among its Avro records; use {fix}"
                ),
            );
        }
        for (name, value) in &self.librdkafka {
            if let Some(why) = self.refusal(name, value) {
                problem(&format!("kafka.librdkafka.\"{name}\""), why);
            }
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

/// Whether two listeners would take the same port: the same address, or
/// one of them on every address of the other's family (`0.0.0.0` takes
/// every IPv4 address; `[::]`, dual-stack on Linux, every address). Port 0
/// lets the system pick, so never collides.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_gets_the_connection_settings_but_no_producer_property() {
        let config = KafkaConfig {
            brokers: "kafka-1:9093".into(),
            librdkafka: [
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("linger.ms", "20"),
                ("compression.type", "zstd"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
            ..KafkaConfig::default()
        };
        assert_eq!(
            config.consumer_properties(),
            [
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("security.protocol", "sasl_ssl"),
                ("bootstrap.servers", "kafka-1:9093"),
            ]
        );
    }

    fn with(table: &[(&str, &str)]) -> KafkaConfig {
        KafkaConfig {
            librdkafka: table
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..KafkaConfig::default()
        }
    }

    #[test]
    fn every_spelling_of_a_fixed_property_is_refused() {
        for (name, value) in [
            ("partitioner", "random"),
            ("topic.partitioner", "random"),
            ("metadata.broker.list", "elsewhere:9092"),
            ("bootstrap.servers", "elsewhere:9092"),
            ("request.required.acks", "1"),
            ("topic.request.required.acks", "1"),
            ("acks", "0"),
            ("topic.acks", "1"),
            ("enable.idempotence", "false"),
            ("message.timeout.ms", "300000"),
            ("delivery.timeout.ms", "300000"),
            ("topic.delivery.timeout.ms", "300000"),
            ("transactional.id", "posbridge"),
        ] {
            let config = with(&[(name, value)]);
            assert!(config.refusal(name, value).is_some(), "{name} = {value}");
            assert_eq!(config.passed_through().count(), 0, "{name} is passed on");
        }
    }

    #[test]
    fn spellings_that_mean_what_posbridge_sets_are_taken_and_not_passed_on() {
        let config = KafkaConfig::default();
        for (name, value) in [
            ("acks", "-1"),
            ("acks", "all"),
            ("request.required.acks", "ALL"),
            ("topic.acks", "-1"),
            ("enable.idempotence", "true"),
            ("partitioner", "murmur2_random"),
            ("topic.partitioner", "murmur2_random"),
            ("bootstrap.servers", "127.0.0.1:9092"),
            ("message.timeout.ms", "5000"),
        ] {
            assert_eq!(config.refusal(name, value), None, "{name} = {value}");
            assert_eq!(with(&[(name, value)]).passed_through().count(), 0);
        }
    }

    #[test]
    fn the_properties_left_to_the_user_pass_through() {
        let config = with(&[
            ("linger.ms", "20"),
            ("topic.metadata.refresh.interval.ms", "1000"),
            ("topic.compression.type", "zstd"),
        ]);
        for (name, value) in &config.librdkafka {
            assert_eq!(config.refusal(name, value), None, "{name}");
        }
        assert_eq!(config.passed_through().count(), 3);
        assert_eq!(
            property_set_by("topic.metadata.refresh.interval.ms"),
            "topic.metadata.refresh.interval.ms",
            "a global property of that name keeps it"
        );
        assert_eq!(
            property_set_by("topic.compression.type"),
            "compression.codec"
        );
    }

    #[test]
    fn the_properties_posbridge_fixes_are_producer_properties() {
        for (property, _) in KafkaConfig::default().fixed_producer_properties() {
            assert!(
                property == "bootstrap.servers" || PRODUCER_ONLY_PROPERTIES.contains(&property),
                "{property}"
            );
        }
    }
}
