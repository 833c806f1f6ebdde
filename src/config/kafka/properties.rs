//! The librdkafka properties: the names librdkafka files a property under
//! (aliases, `topic.` prefixes), the ones posbridge sets itself and refuses
//! from the pass-through table, and what passes through to the producer and
//! to posbridge's own consumers.

use super::KafkaConfig;

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
fn property_set_by(name: &str) -> &str {
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

/// The partitioner of Java clients and Kafka Streams: a key's records land
/// where theirs do.
const PARTITIONER: &str = "murmur2_random";

impl KafkaConfig {
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
