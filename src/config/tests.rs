//! The configuration's checks: what each refuses and why.

use super::*;
use crate::domain::event::EntityType;

fn parse(text: &str) -> Config {
    Config::from_toml(text).unwrap()
}

#[test]
fn a_status_page_beyond_loopback_needs_credentials() {
    let admin_problems = |admin: &str| -> Vec<String> {
        parse(&format!("[admin]\n{admin}"))
            .problems()
            .into_iter()
            .filter(|p| p.key.starts_with("admin"))
            .map(|p| p.key)
            .collect()
    };
    assert!(admin_problems("listen = \"127.0.0.1:9090\"").is_empty());
    assert_eq!(
        admin_problems("listen = \"0.0.0.0:9090\""),
        ["admin.listen"]
    );
    assert!(admin_problems("listen = \"0.0.0.0:9090\"\ntoken = \"0123456789abcdef\"").is_empty());
    assert_eq!(
        admin_problems("listen = \"0.0.0.0:9090\"\ntoken = \"t\""),
        ["admin.token"],
        "a one-character token beyond loopback"
    );
    assert_eq!(
        admin_problems("listen = \"127.0.0.1:9090\"\nusername = \"ops\""),
        ["admin.username"]
    );
    assert_eq!(
        admin_problems("listen = \"127.0.0.1:8080\""),
        ["admin.listen"],
        "same as server.listen"
    );
    assert_eq!(admin_problems("listen = \"nowhere\""), ["admin.listen"]);
    // server.listen is 127.0.0.1:8080 here: every address includes it.
    assert_eq!(
        admin_problems("listen = \"0.0.0.0:8080\"\ntoken = \"0123456789abcdef\""),
        ["admin.listen"],
        "every address takes server.listen's port too"
    );
    assert_eq!(
        admin_problems("listen = \"[::]:8080\"\ntoken = \"0123456789abcdef\""),
        ["admin.listen"]
    );
    assert!(admin_problems("listen = \"127.0.0.2:8080\"").is_empty());
    assert_eq!(
        admin_problems("listen = \"[::ffff:127.0.0.1]:8080\"\ntoken = \"0123456789abcdef\""),
        ["admin.listen"]
    );
    assert!(admin_problems("listen = \"127.0.0.1:8081\"").is_empty());
    assert!(listeners_collide(
        "0.0.0.0:8080".parse().unwrap(),
        "127.0.0.1:8080".parse().unwrap()
    ));
    assert!(
        !listeners_collide(
            "0.0.0.0:8080".parse().unwrap(),
            "[::1]:8080".parse().unwrap()
        ),
        "0.0.0.0 takes IPv4 addresses only"
    );
    assert!(!listeners_collide(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap()
    ));
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../config/posbridge.example.toml");
    let config = parse(text);
    assert_eq!(config.problems(), vec![]);
    assert_eq!(config.kafka.librdkafka.get("linger.ms").unwrap(), "5");
    assert_eq!(config.kafka.topic(EntityType::Sale), "pos.sales");
}

#[test]
fn a_redis_node_list_is_checked_node_by_node() {
    let problems = |url: &str| {
        parse(&format!(
            "[ledger]\nbackend = \"redis\"\nredis_url = \"{url}\"\n"
        ))
        .problems()
        .into_iter()
        .filter(|p| p.key == "ledger.redis_url")
        .count()
    };
    assert_eq!(problems("redis://a:7000,redis://b:7001"), 0);
    assert_eq!(problems("http://a:7000"), 1);
    assert_eq!(problems("redis://a:7000,rediss://b:7001"), 1, "mixed TLS");
}

#[test]
fn a_spool_on_the_ledgers_file_is_refused() {
    let spool_keys = |spool: &str| -> Vec<String> {
        parse(&format!(
            "[ledger]\npath = \"var/posbridge.redb\"\n[spool]\npath = \"{spool}\"\n[receiptroller.sources.main]\nsecrets = [\"a-long-enough-secret\"]\non_broker_unavailable = \"spool\"\n"
        ))
        .problems()
        .into_iter()
        .filter(|p| p.key.starts_with("spool"))
        .map(|p| format!("{}: {}", p.key, p.message))
        .collect()
    };
    assert_eq!(spool_keys("var/spool.redb"), Vec::<String>::new());
    let refused = spool_keys("./var/posbridge.redb");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].starts_with("spool.path: "), "{refused:?}");
}

#[test]
fn every_mistake_is_reported_with_its_key() {
    let config = parse(
        r#"
        [kafka]
        delivery_timeout_ms = 50
        [kafka.topics]
        sale = "x"
        [kafka.librdkafka]
        "acks" = "1"
        [reconcile]
        initial_window_secs = 9223372036854775807
        [mekari.sources.main]
        secrets = []
        "#,
    );
    let keys: Vec<String> = config.problems().into_iter().map(|p| p.key).collect();
    for expected in [
        "kafka.delivery_timeout_ms",
        "kafka.topics.sale",
        "kafka.librdkafka.\"acks\"",
        "mekari.sources.main.secrets",
        "reconcile.initial_window_secs",
    ] {
        assert!(keys.iter().any(|k| k == expected), "{expected} in {keys:?}");
    }
}

/// The problems of a config with one Mekari source, whose section
/// gets `source`, the rest of the file `rest`.
fn problems_with_source(source: &str, rest: &str) -> Vec<Problem> {
    parse(&format!(
        "{rest}\n[mekari.sources.main]\nsecrets = [\"s\"]\n{source}\n"
    ))
    .problems()
}

fn keys(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.key.as_str()).collect()
}

#[test]
fn a_share_of_nothing_is_refused() {
    let problems = problems_with_source("max_in_flight = 0", "[server]\nshare_in_flight = 0");
    assert_eq!(
        keys(&problems),
        [
            "server.share_in_flight",
            "mekari.sources.main.max_in_flight"
        ]
    );
    let problems = problems_with_source("max_in_flight = 1", "[server]\nbusy_in_flight = 0");
    assert_eq!(keys(&problems), Vec::<&str>::new());
    // A rate of 0 for a source would hold every delivery back; for the
    // server it turns the pace off.
    let problems = problems_with_source("max_per_second = 0", "[server]\nshare_per_second = 0");
    assert_eq!(keys(&problems), ["mekari.sources.main.max_per_second"]);
}

#[test]
fn two_sources_whose_own_topics_kafka_cannot_tell_apart_are_refused() {
    let source = |name: &str, prefix: &str| {
        format!(
            "[mekari.sources.{name}]\nsecrets = [\"s\"]\naccount = \"{name}\"\ntopic_prefix = \"{prefix}\"\n"
        )
    };
    let text = [
        source("a", "dl."),
        // `dl-dead-letter` (and `dl_sales`), as `dl.` gives.
        source("b", "dl_"),
        source("c", "col."),
        // `col_sales`, which Kafka takes for `col.sales`.
        source("d", "col_"),
        source("e", "own."),
    ]
    .concat();
    let problems = parse(&text).problems();
    assert_eq!(
        keys(&problems),
        [
            "mekari.sources.b.topic_prefix",
            "mekari.sources.d.topic_prefix"
        ],
        "{problems:?}"
    );
    assert!(
        problems[0].message.contains("mekari.sources.a"),
        "{problems:?}"
    );
}

#[test]
fn settings_that_would_make_every_delivery_fail_are_refused() {
    let missed = [
        (
            "",
            "[kafka.librdkafka]\n\"transactional.id\" = \"pb\"",
            "kafka.librdkafka.\"transactional.id\"",
        ),
        (
            "",
            "[kafka.librdkafka]\n\"topic.partitioner\" = \"random\"",
            "kafka.librdkafka.\"topic.partitioner\"",
        ),
        (
            "",
            "[kafka.librdkafka]\n\"metadata.broker.list\" = \"other:9092\"",
            "kafka.librdkafka.\"metadata.broker.list\"",
        ),
        (
            "",
            "[kafka.librdkafka]\n\"request.required.acks\" = \"1\"",
            "kafka.librdkafka.\"request.required.acks\"",
        ),
        (
            "",
            "[reconcile]\nrequest_timeout_ms = 0",
            "reconcile.request_timeout_ms",
        ),
        ("header = \"X Signature\"", "", "mekari.sources.main.header"),
        (
            "tolerance_secs = 0",
            "",
            "mekari.sources.main.tolerance_secs",
        ),
        (
            "",
            "[admin]\nlisten = \"0.0.0.0:9090\"\ntoken = \"x\"",
            "admin.token",
        ),
        (
            "",
            "[kafka]\ndead_letter_topic = \"pos.dead-letter\"",
            "kafka.dead_letter_topic",
        ),
        (
            "",
            "[reconcile]\nmax_pages_per_run = 0",
            "reconcile.max_pages_per_run",
        ),
        (
            "topic_prefix = \"acme/\"",
            "",
            "mekari.sources.main.topic_prefix",
        ),
        (
            "topic_prefix = \".\"",
            "",
            "mekari.sources.main.topic_prefix",
        ),
        (
            "topic_prefix = \"pos.\"",
            "",
            "mekari.sources.main.topic_prefix",
        ),
        // Inside the shared topics' pattern.
        (
            "topic_prefix = \"pos.acme.\"",
            "",
            "mekari.sources.main.topic_prefix",
        ),
        // `pos_sales`, which Kafka takes for `pos.sales`.
        (
            "topic_prefix = \"pos_\"",
            "",
            "mekari.sources.main.topic_prefix",
        ),
        (
            "",
            "[reconcile]\nmax_run_secs = 0",
            "reconcile.max_run_secs",
        ),
        (
            "",
            "[reconcile]\nmax_body_bytes = 1000",
            "reconcile.max_body_bytes",
        ),
    ]
    .into_iter()
    .filter(|(source, rest, key)| keys(&problems_with_source(source, rest)) != [*key])
    .map(|(_, _, key)| key)
    .collect::<Vec<_>>();
    assert_eq!(missed, Vec::<&str>::new(), "not refused alone");
    for (source, rest) in [
        ("", "[kafka.librdkafka]\nacks = \"-1\""),
        ("header = \"X-Signature\"\ntolerance_secs = 30", ""),
        ("", "[admin]\nlisten = \"127.0.0.1:9090\"\ntoken = \"x\""),
        (
            "",
            "[admin]\nlisten = \"0.0.0.0:9090\"\ntoken = \"0123456789abcdef\"",
        ),
        ("", "[kafka]\ndead_letter_topic = \"pos-letters\""),
    ] {
        assert_eq!(
            keys(&problems_with_source(source, rest)),
            Vec::<&str>::new()
        );
    }
}

#[test]
fn a_message_size_below_the_envelope_is_not_answered_with_a_body_limit_of_zero() {
    let found = problems_with_source("", "[kafka.librdkafka]\n\"message.max.bytes\" = \"1000\"");
    assert_eq!(keys(&found), ["kafka.librdkafka.\"message.max.bytes\""]);
    assert!(!found[0].message.contains("to 0"), "{}", found[0].message);
    let found = problems_with_source(
        "",
        "[server]\nbody_limit_bytes = 1048576\n[kafka.librdkafka]\n\"message.max.bytes\" = \"1000000\"",
    );
    assert!(
        found[0].message.contains("body_limit_bytes to 467232"),
        "{}",
        found[0].message
    );
}

#[test]
fn records_are_sized_for_the_largest_accepted_body() {
    let sized = |text: &str| parse(text).max_record_bytes();
    assert_eq!(sized(""), 2 * 1024 * 1024 + 64 * 1024);
    assert_eq!(
        sized("[kafka.librdkafka]\n\"message.max.bytes\" = \"5000000\"\n"),
        5_000_000
    );
}

#[test]
fn the_body_limit_must_fit_the_producers_message_size() {
    let problems = |server: &str, librdkafka: &str| -> Vec<String> {
        parse(&format!(
            "[server]\n{server}\n[kafka.librdkafka]\n{librdkafka}\n[mekari.sources.main]\nsecrets = [\"s\"]\n"
        ))
        .problems()
        .into_iter()
        .map(|p| p.key)
        .collect()
    };
    assert_eq!(problems("", ""), Vec::<String>::new(), "the defaults agree");
    assert_eq!(
        problems("body_limit_bytes = 4194304", ""),
        Vec::<String>::new(),
        "unset, message.max.bytes follows the body limit"
    );
    assert_eq!(
        problems(
            "body_limit_bytes = 1048576",
            "\"message.max.bytes\" = \"1000000\""
        ),
        vec!["kafka.librdkafka.\"message.max.bytes\""]
    );
    assert_eq!(
        problems(
            "body_limit_bytes = 1048576",
            "\"message.max.bytes\" = \"2200000\""
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        problems("", "\"message.max.bytes\" = \"lots\""),
        vec!["kafka.librdkafka.\"message.max.bytes\""]
    );
    assert_eq!(
        problems("max_body_bytes_in_flight = 1000", ""),
        vec!["server.max_body_bytes_in_flight"]
    );
    assert_eq!(
        problems("max_event_ahead_ms = 3600000", ""),
        vec!["server.max_event_ahead_ms"]
    );
    assert_eq!(
        problems("max_event_ahead_ms = 0", ""),
        vec!["server.max_event_ahead_ms"]
    );
    assert_eq!(
        problems("max_event_ahead_ms = 10000", ""),
        Vec::<String>::new()
    );
    assert_eq!(
        problems("header_read_timeout_ms = 0\nbody_read_timeout_ms = 0", ""),
        vec![
            "server.header_read_timeout_ms",
            "server.body_read_timeout_ms"
        ]
    );
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
    // As an environment override gives them: one string.
    let files = parse("[receiptroller.sources.a]\nsecrets_files = \"/run/a, /run/b\"\n");
    assert_eq!(
        files.receiptroller.sources["a"].secrets_files,
        [
            std::path::Path::new("/run/a"),
            std::path::Path::new("/run/b")
        ]
    );
    assert_eq!(secrets[1].expose(), "two");
    assert_eq!(format!("{:?}", secrets[0]), "[redacted]");
}

#[test]
fn a_librdkafka_property_comes_from_the_environment_dots_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("posbridge.toml");
    std::fs::write(
        &file,
        "[kafka.librdkafka]\n\"sasl.username\" = \"posbridge\"\n\"sasl.password\" = \"old\"\n",
    )
    .unwrap();
    let env = [
        (
            "POSBRIDGE__KAFKA__LIBRDKAFKA__sasl.password",
            "from-a-secret",
        ),
        ("POSBRIDGE__KAFKA__LIBRDKAFKA__SSL.KEY.PASSWORD", "key"),
        ("posbridge__kafka__brokers", "kafka:9093"),
        ("OTHER__KAFKA__LIBRDKAFKA__linger.ms", "99"),
    ]
    .map(|(name, value)| (name.into(), value.into()));
    let config = Config::read_with_env(Some(&file), env).unwrap();
    let librdkafka: Vec<(&str, &str)> = config
        .kafka
        .librdkafka
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        librdkafka,
        [
            ("sasl.password", "from-a-secret"),
            ("sasl.username", "posbridge"),
            ("ssl.key.password", "key"),
        ]
    );
    assert_eq!(config.kafka.brokers, "kafka:9093");
}

#[test]
fn unknown_keys_are_rejected() {
    let error = Config::from_toml("[kafka]\nbrokerz = \"x\"").unwrap_err();
    assert!(error.to_string().contains("brokerz"));
}
