//! TLS on the way out: to a Kafka listener that speaks TLS and to Redis
//! over `rediss://`, each trusting only a CA the test made. On Apache Kafka
//! the listener is the broker's own (`scripts/kafka`'s SSL listener); tansu
//! has no TLS, so there it is a TLS-terminating proxy in front of it.

use std::time::Duration;

use posbridge::adapters::ledger::{Begin, Commit, Done, RedisLedger, Store};
use posbridge::domain::event::{DeliveryKey, ProviderKind};

use crate::support::tls::TestCa;
use crate::support::wait::look_for;
use crate::support::{
    BrokerKind, OwnBroker, TestApp, broker_kind, config, free_port, kafka_security,
    read_topic_with, rr_sale, unique,
};

#[tokio::test(flavor = "multi_thread")]
async fn posbridge_publishes_through_a_tls_listener_it_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    // Kept alive for the test on tansu.
    let mut _proxy = None;
    let (address, ca_file) = match broker_kind() {
        BrokerKind::Kafka => {
            let ssl = kafka_security().expect("scripts/test names Kafka's SSL listener");
            (ssl.ssl, ssl.ca_file)
        }
        BrokerKind::Tansu => {
            let broker = OwnBroker::start_tls(ca.acceptor()).await;
            let address = broker.address();
            _proxy = Some(broker);
            (address, ca.ca_file.display().to_string())
        }
    };
    let mut config = config(&address, &unique("tls"), dir.path());
    let tls = [
        ("security.protocol", "SSL"),
        ("ssl.ca.location", ca_file.as_str()),
    ];
    for (key, value) in tls {
        config.kafka.librdkafka.insert(key.into(), value.into());
    }
    assert_eq!(posbridge::app::problems(&config), vec![]);
    let app = TestApp::start_with(config).await;
    let body = rr_sale(
        "tls-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|0500",
        500,
    );
    let response = app.send("receiptroller", "main", &body).await;
    assert_eq!(response.status(), 200);
    let records = read_topic_with(&address, &app.topic("sales"), &tls);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key, "receiptroller:T1|2026-11|0500");
    app.stop().await;
}

#[tokio::test]
async fn the_redis_ledger_speaks_tls_to_a_server_signed_by_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let port = free_port();
    let mut server = std::process::Command::new("redis-server")
        // The real clock under a moved one (scripts/test's POSBRIDGE_TEST_CLOCK).
        .env_remove("LD_PRELOAD")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .arg("--tls-cert-file")
        .arg(&ca.cert_file)
        .arg("--tls-key-file")
        .arg(&ca.key_file)
        .arg("--tls-ca-cert-file")
        .arg(&ca.ca_file)
        .args([
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test needs it anyway)");
    let url = format!("rediss://127.0.0.1:{port}");
    let prefix = format!("{}:", unique("tls"));
    let connect = || {
        RedisLedger::connect(
            &url,
            &prefix,
            Duration::from_secs(3600),
            Duration::from_secs(10),
            Some(&ca.ca_file),
            false,
        )
    };
    // Until the server started beside the test listens.
    let ledger = match look_for(Duration::from_secs(15), async || connect().await.ok()).await {
        Some(ledger) => ledger,
        None => panic!(
            "no TLS connection to redis: {}",
            connect().await.unwrap_err()
        ),
    };
    crate::support::redis::mark_filled(&ledger).await;
    let key = DeliveryKey::new(ProviderKind::Mekari, "tls-1");
    assert_eq!(ledger.begin(&key).await.unwrap(), Begin::New);
    ledger
        .commit(&Commit::done(Done::published_now(key.clone())))
        .await
        .unwrap();
    assert_eq!(ledger.begin(&key).await.unwrap(), Begin::Done);
    // Without the CA the server's certificate is not trusted.
    let untrusted = RedisLedger::connect(
        &url,
        "x:",
        Duration::from_secs(3600),
        Duration::from_secs(10),
        None,
        false,
    )
    .await;
    assert!(
        untrusted.is_err(),
        "a certificate from an unknown CA is refused"
    );
    let _ = server.kill();
    let _ = server.wait();
}
