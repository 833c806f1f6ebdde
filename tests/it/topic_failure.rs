//! One topic's error is that topic's error: Kafka's own authorizer
//! (`StandardAuthorizer`) denies posbridge's SCRAM user WRITE on one entity
//! topic. That topic's deliveries are answered 503 (the provider retries),
//! every other topic publishes as before, Kafka is not taken for down, and
//! `/readyz` and the status page name the topic and the broker's reason.
//! Kafka only (`kafka_only` in its name): tansu has no authorizer.

use serde_json::Value;

use crate::support::{
    BrokerKind, OwnBroker, TestApp, broker_kind, config, mekari_order, read_topic, rr_sale, unique,
};

/// Grants `User:posbridge` everything on topics starting with `prefix` and
/// denies it WRITE on `denied`, with Confluent's Python admin client over
/// the PLAINTEXT listener (a super user).
async fn set_acls(plaintext: &str, prefix: &str, denied: &str) {
    let python = std::env::var("POSBRIDGE_TEST_PYTHON")
        .expect("POSBRIDGE_TEST_PYTHON (Confluent's client) is set by scripts/test");
    let script = r#"
import sys
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                   AdminClient, ResourcePatternType, ResourceType)
brokers, prefix, denied = sys.argv[1:4]
admin = AdminClient({"bootstrap.servers": brokers})
bindings = [
    AclBinding(ResourceType.TOPIC, prefix, ResourcePatternType.PREFIXED, "User:posbridge",
               "*", AclOperation.ALL, AclPermissionType.ALLOW),
    AclBinding(ResourceType.TOPIC, denied, ResourcePatternType.LITERAL, "User:posbridge",
               "*", AclOperation.WRITE, AclPermissionType.DENY),
]
for future in admin.create_acls(bindings).values():
    future.result()
"#;
    let output = tokio::process::Command::new(python)
        .args(["-c", script, plaintext, prefix, denied])
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_topic_kafka_refuses_fails_alone_and_is_named() {
    if broker_kind() == BrokerKind::Tansu {
        eprintln!("topic failure: Apache Kafka only (tansu has no authorizer)");
        return;
    }
    let broker = OwnBroker::start_with_acls().await;
    let (sasl, ca_file) = broker.sasl();
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("denied");
    let orders = format!("{prefix}.orders");
    set_acls(&broker.address(), &prefix, &orders).await;
    let mut config = config(&sasl, &prefix, dir.path());
    for (key, value) in [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "posbridge"),
        ("sasl.password", "posbridge-scram-secret"),
        ("ssl.ca.location", ca_file.as_str()),
    ] {
        config.kafka.librdkafka.insert(key.into(), value.into());
    }
    let app = TestApp::start_with(config).await;

    // Denied, then at once a sale: the sale is not refused for the order's sake.
    for round in 0..3 {
        let order = mekari_order(
            &format!("dn-mk-{round}"),
            "order.created",
            "2026-11-29T17:15:30+07:00",
            &format!("ORD-{round}"),
            "new",
        );
        let refused = app.send("mekari", "main", &order).await;
        assert_eq!(refused.status(), 503, "the denied topic's delivery");
        let sale = rr_sale(
            &format!("dn-rr-{round}"),
            "sale.created",
            "2026-11-29T10:15:30Z",
            &format!("T1|2026-11|{round:04}"),
            100,
        );
        let published = app.send("receiptroller", "main", &sale).await;
        assert_eq!(
            published.status(),
            200,
            "round {round}: another topic publishes"
        );
        let outcome: Value = published.json().await.unwrap();
        assert_eq!(outcome["status"], "published");
    }

    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status(),
        200,
        "one refused topic does not make the pod unready"
    );
    let ready: Value = ready.json().await.unwrap();
    assert_eq!(ready["broker"], "ok", "{ready}");
    let why = ready["failing_topics"][&orders]
        .as_str()
        .unwrap_or_else(|| panic!("{orders} is named: {ready}"));
    assert!(
        why.to_lowercase().contains("authoriz"),
        "the broker's reason: {why}"
    );
    let status_router = posbridge::ingress::admin_router(
        posbridge::ingress::AdminState {
            pipeline: app.pipeline.clone(),
            board: app.board.clone(),
        },
        &posbridge::config::AdminConfig::default(),
    );
    let page = tower::ServiceExt::oneshot(
        status_router,
        axum::http::Request::get("/status")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let page = axum::body::to_bytes(page.into_body(), 1 << 20)
        .await
        .unwrap();
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains("failing-topics") && page.contains(&orders),
        "{page}"
    );

    assert_eq!(read_topic(&broker.address(), &app.topic("sales")).len(), 3);
    assert!(read_topic(&broker.address(), &orders).is_empty());
    app.stop().await;
}
