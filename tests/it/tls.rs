//! TLS on the way out: to a Kafka listener that speaks TLS (a
//! TLS-terminating proxy in front of the test broker, with a CA the test
//! makes) and to Redis over `rediss://`, each trusting only that CA.

use std::time::Duration;

use posbridge::event::{DeliveryKey, ProviderKind};
use posbridge::ledger::{Begin, Commit, Ledger, RedisLedger};

use crate::support::registry_fake::RegistryFake;
use crate::support::tls::TestCa;
use crate::support::{OwnBroker, TestApp, brokers, config, read_topic_with, rr_sale, unique};

#[tokio::test(flavor = "multi_thread")]
async fn posbridge_publishes_through_a_tls_listener_it_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let broker = OwnBroker::start_tls(ca.acceptor()).await;
    let mut config = config(&broker.address(), &unique("tls"), dir.path());
    let ca_file = ca.ca_file.display().to_string();
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
    let records = read_topic_with(&broker.address(), &app.topic("sales"), &tls);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key, "receiptroller:T1|2026-11|0500");
    app.stop().await;
}

#[tokio::test]
async fn the_redis_ledger_speaks_tls_to_a_server_signed_by_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new("redis-server")
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
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let ledger = loop {
        match RedisLedger::connect(
            &url,
            &format!("{}:", unique("tls")),
            Duration::from_secs(3600),
            Duration::from_secs(10),
            Some(&ca.ca_file),
        )
        .await
        {
            Ok(ledger) => break ledger,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("no TLS connection to redis: {error}"),
        }
    };
    let key = DeliveryKey::new(ProviderKind::Mekari, "tls-1");
    assert_eq!(ledger.begin(&key).await.unwrap(), Begin::New);
    ledger
        .commit(Commit {
            delivery: Some(key.clone()),
            ..Commit::default()
        })
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
    )
    .await;
    assert!(
        untrusted.is_err(),
        "a certificate from an unknown CA is refused"
    );
    let _ = server.kill();
    let _ = server.wait();
}

/// The Schema Registry over HTTPS with a private CA and a bearer token:
/// posbridge registers with both set, and is refused without the CA or with
/// the wrong token.
#[tokio::test(flavor = "multi_thread")]
async fn the_registry_client_trusts_the_configured_ca_and_sends_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let registry = RegistryFake::start_tls(ca.acceptor(), "registry-token").await;
    let prefix = unique("registry-tls");
    let mut config = config(&brokers(), &prefix, dir.path());
    config.schema_registry.url = Some(registry.url.clone());
    config.schema_registry.ca_file = Some(ca.ca_file.clone());
    config.schema_registry.token =
        Some(serde_json::from_value(serde_json::json!("registry-token")).unwrap());
    assert_eq!(posbridge::app::problems(&config), vec![]);
    posbridge::app::App::build(&config)
        .await
        .expect("registers over TLS with the token");
    assert!(registry.id_of(&format!("{prefix}.sales-value")).is_some());

    // Each attempt with a ledger of its own: the first app's is still closing.
    let mut untrusting = config.clone();
    untrusting.ledger.path = dir.path().join("untrusting.redb");
    untrusting.schema_registry.ca_file = None;
    assert!(
        posbridge::app::App::build(&untrusting).await.is_err(),
        "an unknown CA is refused"
    );
    let mut wrong = config.clone();
    wrong.ledger.path = dir.path().join("wrong.redb");
    wrong.schema_registry.token =
        Some(serde_json::from_value(serde_json::json!("not-the-token")).unwrap());
    let error = match posbridge::app::App::build(&wrong).await {
        Ok(_) => panic!("a wrong token is refused"),
        Err(error) => format!("{:#}", anyhow::Error::new(error)),
    };
    assert!(error.contains("schema registry"), "{error}");
}
