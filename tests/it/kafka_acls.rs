//! Kafka's authorizer refusing posbridge, named for what it is: at start-up
//! the headline is Kafka's answer (`TopicAuthorizationFailed`, an
//! `InvalidReplicationFactor`), not "cannot reach Kafka"; a producer the
//! cluster denies (`ClusterAuthorizationFailed`: no IdempotentWrite, no
//! WRITE on any topic) is not replaced once per delivery, its cause is
//! named where the failing topics are, and once the ACL is granted the
//! topic publishes and leaves `failing_topics`. Kafka only (`kafka_only`
//! in its name): tansu has no authorizer.

use crate::support::kafka_only;
use std::time::Duration;

use posbridge::app::App;
use serde_json::Value;

use crate::support::wait::wait_until;
use crate::support::{OwnBroker, TestApp, config, mekari_order, unique};

/// Grants `User:posbridge` each `PERMISSION:OPERATION:RESOURCE:PATTERN:name`
/// with Confluent's Python admin client over the PLAINTEXT listener (a
/// super user).
async fn grant(plaintext: &str, bindings: &[String]) {
    let script = r#"
import sys
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType,
                                   AdminClient, ResourcePatternType, ResourceType)
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
bindings = []
for spec in sys.argv[2:]:
    permission, operation, resource, pattern, name = spec.split(":", 4)
    bindings.append(AclBinding(ResourceType[resource], name, ResourcePatternType[pattern],
                               "User:posbridge", "*", AclOperation[operation],
                               AclPermissionType[permission]))
for future in admin.create_acls(bindings).values():
    future.result()
"#;
    let mut args = vec!["-c", script, plaintext];
    args.extend(bindings.iter().map(String::as_str));
    crate::support::python(&args).await;
}

/// A config for `broker`'s SASL_SSL listener as posbridge's SCRAM user.
fn scram_config(
    broker: &OwnBroker,
    prefix: &str,
    dir: &std::path::Path,
) -> posbridge::config::Config {
    let (sasl, _) = broker.sasl();
    let mut config = config(&sasl, prefix, dir);
    broker.as_scram_user(&mut config);
    config
}

/// Start-up's error: its message with its causes, and its hint.
async fn start_up_error(config: &posbridge::config::Config) -> (String, &'static str) {
    match App::build(config).await {
        Ok(_) => panic!("start-up must fail"),
        Err(error) => {
            let hint = error.hint();
            (format!("{:#}", anyhow::Error::new(error)), hint)
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_authorization_errors_are_named_and_a_denied_producer_is_not_replaced_in_a_loop()
{
    kafka_only("tansu has no authorizer");
    let broker = OwnBroker::start_with_acls().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("acl");

    // No ACL at all: the topics cannot be created, and start-up says so.
    let (error, hint) = start_up_error(&scram_config(&broker, &prefix, dir.path())).await;
    assert!(error.contains("TopicAuthorizationFailed"), "{error}");
    assert!(!error.contains("cannot reach Kafka"), "{error}");
    assert!(hint.contains("CREATE"), "{hint}");

    // More replicas than brokers (as the super user, so only that is wrong).
    let mut too_many = config(&broker.address(), &unique("rf"), dir.path());
    too_many.kafka.replication_factor = Some(50);
    too_many.ledger.path = dir.path().join("rf.redb");
    let (error, hint) = start_up_error(&too_many).await;
    assert!(error.contains("InvalidReplicationFactor"), "{error}");
    assert!(!error.contains("cannot reach Kafka"), "{error}");
    assert!(hint.contains("kafka.replication_factor"), "{hint}");

    // Everything on its topics but WRITE: the topics are made, the
    // idempotent producer is denied its producer id.
    let on_topics = |operation: &str| format!("ALLOW:{operation}:TOPIC:PREFIXED:{prefix}");
    grant(
        &broker.address(),
        &["CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"].map(on_topics),
    )
    .await;
    let mut app = TestApp::start_with(scram_config(&broker, &prefix, dir.path())).await;
    app.keep(dir);
    let orders = app.topic("orders");
    let order = |n: u32| {
        mekari_order(
            &format!("acl-mk-{n}"),
            "order.created",
            "2026-11-29T17:15:30+07:00",
            &format!("ORD-{n}"),
            "new",
        )
    };
    let deliveries = 20;
    for n in 0..deliveries {
        let answer = app.send("mekari", "main", &order(n)).await;
        assert_eq!(answer.status(), 503, "delivery {n}");
        assert!(answer.headers().contains_key("retry-after"));
    }
    let replaced = app.publisher.replacements();
    println!("{deliveries} denied deliveries replaced the producer {replaced} times");
    assert!(
        replaced <= 4,
        "{deliveries} deliveries replaced the producer {replaced} times"
    );
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    let why = ready["failing_topics"][&orders]
        .as_str()
        .unwrap_or_else(|| panic!("{orders} is named: {ready}"));
    assert!(why.contains("ClusterAuthorizationFailed"), "{why}");
    assert!(why.contains("IdempotentWrite"), "what to grant: {why}");

    // WRITE granted: the next producer gets its id, the topic publishes and
    // is no longer named.
    grant(&broker.address(), &[on_topics("WRITE")]).await;
    let mut n = deliveries;
    wait_until(Duration::from_secs(120), "a delivery to publish", || {
        n += 1;
        let delivery = order(n);
        let app = &app;
        async move { app.send("mekari", "main", &delivery).await.status() == 200 }
    })
    .await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["failing_topics"].get(&orders), None, "{ready}");
    app.stop().await;
}
