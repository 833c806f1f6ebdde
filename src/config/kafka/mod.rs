//! The `[kafka]` section: broker, topics and producer settings; what the
//! pass-through table of librdkafka properties may hold is `properties.rs`.

mod properties;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::event::EntityType;

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
            .unwrap_or_else(|| entity_topic(&self.topic_prefix, entity))
    }

    /// The dead-letter topic: by default `{topic_prefix}` without its
    /// trailing separator, then `-dead-letter` (`pos.` gives
    /// `pos-dead-letter`), so a consumer subscribing to the entity topics by
    /// pattern (`pos\..*`) with an Avro deserializer does not also get the
    /// raw JSON of dead letters.
    pub fn dead_letter_topic(&self) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| dead_letter_of(&self.topic_prefix))
    }

    /// The produce deadline as a duration.
    pub fn delivery_timeout(&self) -> Duration {
        Duration::from_millis(self.delivery_timeout_ms)
    }
}

/// An entity type's topic under `prefix`, without an override:
/// `{prefix}{plural}`.
pub fn entity_topic(prefix: &str, entity: EntityType) -> String {
    format!("{prefix}{}", entity.plural())
}

/// The dead-letter topic of `prefix`, without an override: the prefix
/// without its trailing separator, then `-dead-letter`.
pub fn dead_letter_of(prefix: &str) -> String {
    let stem = prefix.trim_end_matches(['.', '_', '-']);
    if stem.is_empty() {
        "dead-letter".to_owned()
    } else {
        format!("{stem}-dead-letter")
    }
}

/// The topics a source's own `topic_prefix` names: each entity type's,
/// then its dead-letter topic.
pub fn topics_of_prefix(prefix: &str) -> Vec<String> {
    EntityType::ALL
        .iter()
        .map(|t| entity_topic(prefix, *t))
        .chain([dead_letter_of(prefix)])
        .collect()
}

/// What is wrong with a source's own `topic_prefix`, if anything: every
/// topic it names must be a valid Kafka topic name.
pub fn topic_prefix_problem(prefix: &str) -> Option<String> {
    if prefix.trim_end_matches(['.', '_', '-']).is_empty() {
        return Some("must name something before its separator, as in `acme.`".into());
    }
    // Neither the prefix nor its topics are repeated: a source file's
    // problems are shown on `/status`, and it holds secrets.
    if topics_of_prefix(prefix)
        .into_iter()
        .any(|n| !valid_topic_name(&n))
    {
        return Some("gives topic names Kafka does not take (1-249 of a-z A-Z 0-9 . _ -)".into());
    }
    // Its dead letters are raw JSON: a subscriber to its topics' pattern
    // with an Avro deserializer must not get them.
    inside(&dead_letter_of(prefix), prefix).then(|| {
        "does not end with `.` or `_`: its dead-letter topic would be inside its own topics' pattern".into()
    })
}

/// Whether the topics of one prefix fall inside the other's pattern, one
/// way or the other.
pub fn prefixes_nest(a: &str, b: &str) -> bool {
    topics_of_prefix(a).iter().any(|t| inside(t, b))
        || topics_of_prefix(b).iter().any(|t| inside(t, a))
}

/// Whether `topic` is inside the pattern of the topics named by `prefix`
/// (a subscriber to `{prefix}.*` reads it), by the name Kafka tells
/// topics apart by.
pub fn inside(topic: &str, prefix: &str) -> bool {
    collision_name(topic).starts_with(&collision_name(prefix))
}

impl KafkaConfig {
    /// Every shared topic: each entity type's, then the dead-letter topic.
    pub fn shared_topics(&self) -> Vec<String> {
        EntityType::ALL
            .iter()
            .map(|t| self.topic(*t))
            .chain([self.dead_letter_topic()])
            .collect()
    }

    /// Whether a source's own `topic_prefix` stands in the shared topics'
    /// way: it names one of them (or a name Kafka takes for one, `.` and
    /// `_` alike), or names topics inside their pattern (`pos\..*` for the
    /// default `pos.`), which a subscriber to the shared topics reads. Said
    /// as the problem, without the prefix.
    pub fn shared_topic_clash(&self, prefix: &str) -> Option<String> {
        let shared: Vec<String> = self
            .shared_topics()
            .iter()
            .map(|topic| collision_name(topic))
            .collect();
        let own = topics_of_prefix(prefix);
        if own.iter().any(|n| shared.contains(&collision_name(n))) {
            return Some(
                "gives one of the shared topics, or a name Kafka takes for one (`.` and `_` alike): a source on the shared topics has no topic_prefix"
                    .into(),
            );
        }
        let pattern = self.topic_prefix.as_str();
        if !pattern.is_empty() && own.iter().any(|n| n.starts_with(pattern)) {
            return Some("starts with kafka.topic_prefix: its topics would be inside the shared topics' pattern, and a subscriber to the shared topics would read this source's records; choose a prefix of its own".into());
        }
        self.shared_topics().iter().any(|t| inside(t, prefix)).then(|| {
            "the shared topics would be inside this source's topics' pattern: a subscriber to its topics would read every merchant's records and the shared dead letters; choose a longer prefix".into()
        })
    }
}

/// The name by which Kafka tells topics apart: `.` and `_` are one
/// character to it (its metric names replace one with the other), so a
/// topic whose name differs from another's only there is refused
/// (`InvalidTopic`).
pub fn collision_name(topic: &str) -> String {
    topic.replace('.', "_")
}

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
