//! One topic's error is that topic's error: Kafka's own authorizer
//! (`StandardAuthorizer`) denies posbridge's SCRAM user WRITE on one entity
//! topic. That topic's deliveries are answered 503 (the provider retries),
//! every other topic publishes as before, Kafka is not taken for down, and
//! `/readyz` and the status page name the topic and the broker's reason.
//! Kafka only (`kafka_only` in its name): tansu has no authorizer.

use crate::support::kafka_only;
use serde_json::Value;

use crate::support::wait::look_for;
use crate::support::{
    OwnBroker, TestApp, config, mekari_order, read_topic, rr_sale, spool_config, unique,
};

/// Grants `User:posbridge` everything on topics starting with `prefix` and
/// denies it WRITE on `denied`, with Confluent's Python admin client over
/// the PLAINTEXT listener (a super user).
async fn set_acls(plaintext: &str, prefix: &str, denied: &str) {
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
    crate::support::python(&["-c", script, plaintext, prefix, denied]).await;
}

/// A config for `broker`'s SASL_SSL listener as posbridge's SCRAM user.
fn scram_config(
    broker: &OwnBroker,
    prefix: &str,
    dir: &std::path::Path,
    spool: bool,
) -> posbridge::config::Config {
    let (sasl, _) = broker.sasl();
    let mut config = if spool {
        spool_config(&sasl, prefix, dir)
    } else {
        config(&sasl, prefix, dir)
    };
    broker.as_scram_user(&mut config);
    config
}

/// A private Kafka with its authorizer on, the topic `{prefix}{denied}`
/// denied to posbridge's SCRAM user (everything else of the prefix
/// allowed), and posbridge on it (ReceiptRoller spooling with `spool`):
/// the broker, the app and the denied topic.
async fn with_denied_topic(tag: &str, denied: &str, spool: bool) -> (OwnBroker, TestApp, String) {
    let broker = OwnBroker::start_with_acls().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique(tag);
    let topic = format!("{prefix}{denied}");
    set_acls(&broker.address(), &prefix, &topic).await;
    let mut app = TestApp::start_with(scram_config(&broker, &prefix, dir.path(), spool)).await;
    app.keep(dir);
    (broker, app, topic)
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_topic_kafka_refuses_fails_alone_and_is_named() {
    kafka_only("tansu has no authorizer");
    let (broker, app, orders) = with_denied_topic("denied", ".orders", false).await;

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
    let page = app.status_page().await;
    assert!(
        page.contains("failing-topics") && page.contains(&orders),
        "{page}"
    );

    assert_eq!(read_topic(&broker.address(), &app.topic("sales")).len(), 3);
    assert!(read_topic(&broker.address(), &orders).is_empty());
    app.stop().await;
}

/// The distinct keys in the sales topic.
fn sale_keys(broker: &OwnBroker, app: &TestApp) -> usize {
    read_topic(&broker.address(), &app.topic("sales"))
        .into_iter()
        .map(|r| r.key)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// A spooled delivery whose topic Kafka refuses does not block the spool:
/// the deliveries spooled behind it drain, and after
/// `drain::MAX_ATTEMPTS` passes over `drain::SET_ASIDE_AFTER` it goes to
/// the dead-letter topic with its raw body (`spool_unpublishable`), from
/// where `posbridge replay` can publish it once the cause is cleared.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_spooled_delivery_its_topic_refuses_goes_aside_and_the_rest_drains() {
    kafka_only("tansu has no authorizer");
    let (broker, app, _orders) = with_denied_topic("aside", ".orders", true).await;

    // ReceiptRoller spools: the refused order first, then sales while the
    // broker is frozen (so they spool behind it).
    let order = serde_json::json!({"id": "as-order", "type": "order.created",
        "timestamp": "2026-11-29T10:10:00Z", "data": {"order_id": "O-AS", "status": "open"}});
    let answer: Value = app
        .send("receiptroller", "main", &order)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "spooled", "{answer}");
    broker.freeze();
    for n in 0..6 {
        let sale = rr_sale(
            &format!("as-rr-{n}"),
            "sale.created",
            "2026-11-29T10:15:30Z",
            &format!("T1|2026-11|{n:04}"),
            100,
        );
        let answer: Value = app
            .send("receiptroller", "main", &sale)
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "spooled", "{answer}");
    }
    broker.thaw();

    let spool = app.pipeline.spool().unwrap().clone();
    let started = std::time::Instant::now();
    let mut sales_drained_after = None;
    let drained = look_for(std::time::Duration::from_secs(120), async || {
        if sales_drained_after.is_none() && sale_keys(&broker, &app) == 6 {
            sales_drained_after = Some(started.elapsed());
        }
        (spool.stats().entries == 0).then_some(())
    })
    .await;
    assert!(
        drained.is_some(),
        "the spool never drained: {} left",
        spool.stats().entries
    );
    let emptied_after = started.elapsed();
    // Keys, not records: a sale whose record was in flight when the broker
    // froze may land and be published again from the spool (the documented
    // in-doubt case: the same state twice).
    assert_eq!(sale_keys(&broker, &app), 6);
    let letters = read_topic(&broker.address(), &app.config.kafka.dead_letter_topic());
    let aside: Vec<_> = letters
        .iter()
        .filter(|l| l.headers["posbridge-reason-code"] == "spool_unpublishable")
        .collect();
    assert_eq!(aside.len(), 1, "{letters:?}");
    let body: Value = serde_json::from_slice(aside[0].payload.as_deref().unwrap()).unwrap();
    assert_eq!(body, order, "the raw body");
    println!(
        "spool set-aside: the 6 sales behind the refused order drained after {:?}, the order set aside and the spool empty after {emptied_after:?}",
        sales_drained_after.unwrap_or(emptied_after)
    );
    app.stop().await;
}

/// A dead letter Kafka refuses for good (its topic's write denied): the
/// event cannot be lost and cannot be written, so each provider gets what
/// keeps it within its retry rules. ReceiptRoller (which switches the
/// webhook off after four failures) spools it: 200 `spooled`, kept until the
/// dead-letter topic takes it. Mekari (which retries for ~11 h, and pauses
/// only after ten failures in a row) gets 503 + Retry-After, while its
/// other deliveries publish, so its run of failures never grows. `/readyz`
/// names the dead-letter topic and the broker's reason.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_dead_letter_kafka_refuses_is_spooled_or_retried_and_named() {
    kafka_only("tansu has no authorizer");
    let (_broker, app, dead_letters) = with_denied_topic("dlq", "-dead-letter", true).await;
    assert_eq!(app.config.kafka.dead_letter_topic(), dead_letters);

    let rr_unknown = serde_json::json!({"id": "dl-rr-1", "type": "shift.closed",
        "timestamp": "2026-11-29T10:16:00Z", "data": {"id": "S-1"}});
    let answer = app.send("receiptroller", "main", &rr_unknown).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.json::<Value>().await.unwrap()["status"], "spooled");

    let mk_unknown = serde_json::json!({"id": "dl-mk-1", "event": "shift.closed",
        "occurred_at": "2026-11-29T17:16:00+07:00", "outlet_id": "OUT-9", "data": {"id": "S-1"}});
    let answer = app.send("mekari", "main", &mk_unknown).await;
    assert_eq!(answer.status(), 503, "Mekari retries it");
    assert!(answer.headers().contains_key("retry-after"));
    let order = mekari_order(
        "dl-mk-2",
        "order.created",
        "2026-11-29T17:15:30+07:00",
        "ORD-DL",
        "new",
    );
    assert_eq!(
        app.send("mekari", "main", &order).await.status(),
        200,
        "its other deliveries publish"
    );

    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    let why = ready["failing_topics"][&dead_letters]
        .as_str()
        .unwrap_or_else(|| panic!("{dead_letters} is named: {ready}"));
    assert!(why.to_lowercase().contains("authoriz"), "{why}");
    assert_eq!(
        app.pipeline.spool().unwrap().stats().entries,
        1,
        "ReceiptRoller's event is kept"
    );
    app.stop().await;
}
