//! Apache Kafka's own security, on the listeners `scripts/kafka` opens:
//! SASL_SSL with SCRAM-SHA-512 end to end, and start-up that names a wrong
//! password or an untrusted certificate within seconds instead of hanging.
//! Kafka only (the `kafka_only` in their names): tansu has neither TLS nor
//! SASL, so on tansu each says so and passes without a broker to ask.

use crate::support::kafka_only;
use std::time::{Duration, Instant};

use posbridge::app::App;
use posbridge::config::Config;

use crate::support::tls::TestCa;
use crate::support::{
    KafkaSecurity, TestApp, config, kafka_security, read_topic_with, rr_sale, unique,
};

/// The shared Kafka's security settings (tansu has no TLS or SASL).
fn on_kafka() -> KafkaSecurity {
    kafka_only("tansu has no TLS or SASL");
    kafka_security().expect("scripts/test names Kafka's TLS and SASL listeners")
}

/// A config for the SASL_SSL listener with `password`, trusting `ca_file`.
fn scram_config(
    security: &KafkaSecurity,
    password: &str,
    ca_file: &str,
    dir: &std::path::Path,
) -> Config {
    let mut config = config(&security.sasl, &unique("scram"), dir);
    for (key, value) in scram_properties(security, password, ca_file) {
        config.kafka.librdkafka.insert(key.into(), value);
    }
    assert_eq!(posbridge::app::problems(&config), vec![]);
    config
}

fn scram_properties(
    security: &KafkaSecurity,
    password: &str,
    ca_file: &str,
) -> [(&'static str, String); 5] {
    [
        ("security.protocol", "SASL_SSL".into()),
        ("sasl.mechanism", "SCRAM-SHA-512".into()),
        ("sasl.username", security.user.into()),
        ("sasl.password", password.into()),
        ("ssl.ca.location", ca_file.into()),
    ]
}

/// The start-up error of `config`, and how long it took to come.
async fn start_up_error(config: &Config) -> (String, Duration) {
    let started = Instant::now();
    let error = match App::build(config).await {
        Ok(_) => panic!("start-up must fail"),
        Err(error) => format!("{:#}", anyhow::Error::new(error)),
    };
    (error, started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_posbridge_publishes_over_sasl_ssl_with_scram_sha_512() {
    let security = on_kafka();
    let dir = tempfile::tempdir().unwrap();
    let config = scram_config(&security, security.password, &security.ca_file, dir.path());
    let app = TestApp::start_with(config).await;
    let body = rr_sale(
        "scram-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|0900",
        900,
    );
    let response = app.send("receiptroller", "main", &body).await;
    assert_eq!(response.status(), 200);
    let properties = scram_properties(&security, security.password, &security.ca_file);
    let properties: Vec<(&str, &str)> = properties.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let records = read_topic_with(&security.sasl, &app.topic("sales"), &properties);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key, "receiptroller:T1|2026-11|0900");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_wrong_scram_password_ends_start_up_naming_the_credentials() {
    let security = on_kafka();
    let dir = tempfile::tempdir().unwrap();
    let mut config = scram_config(&security, "not-the-password", &security.ca_file, dir.path());
    // Without topic creation nothing else would ask the broker at start-up.
    config.kafka.create_topics = false;
    let (error, took) = start_up_error(&config).await;
    assert!(error.contains("SASL credentials"), "{error}");
    assert!(
        error.contains("Authentication failed"),
        "librdkafka's reason: {error}"
    );
    assert!(took < Duration::from_secs(5), "took {took:?}: {error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_an_untrusted_broker_certificate_ends_start_up_naming_the_certificate() {
    let security = on_kafka();
    let dir = tempfile::tempdir().unwrap();
    // A CA of the test's own, which did not sign the broker's certificate.
    let other_ca = TestCa::new(dir.path());
    let other = other_ca.ca_file.display().to_string();
    for address in [&security.ssl, &security.sasl] {
        let mut config = scram_config(&security, security.password, &other, dir.path());
        config.kafka.brokers = address.clone();
        if address == &security.ssl {
            config
                .kafka
                .librdkafka
                .insert("security.protocol".into(), "SSL".into());
        }
        config.ledger.path = dir.path().join(format!("{}.redb", unique("ledger")));
        let (error, took) = start_up_error(&config).await;
        assert!(error.contains("TLS handshake"), "{address}: {error}");
        assert!(error.contains("ssl.ca.location"), "{address}: {error}");
        assert!(
            error.contains("certificate verify failed"),
            "{address}: librdkafka's reason: {error}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{address}: took {took:?}: {error}"
        );
    }
}
