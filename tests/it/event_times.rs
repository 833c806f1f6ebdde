//! Event times a Kafka record timestamp cannot carry (before 1970) or that
//! would freeze an entity (far ahead of posbridge's clock) are dead-lettered
//! with their raw body and a precise reason; the records written around them
//! stay readable.

use crate::support::kafka_only;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::compaction::create_topic;
use crate::support::{Meter, TestApp, brokers, config, mekari_order, read_topic, rr_sale, unique};

/// Times before the Unix epoch, as providers with a broken clock or a
/// zeroed field send them.
const BEFORE_1970: [&str; 4] = [
    "1969-12-31T23:59:59Z",
    "1900-01-01T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "0000-01-01T00:00:00Z",
];

/// The `status` of a webhook answer, with its HTTP status checked.
async fn answered(response: reqwest::Response) -> String {
    assert_eq!(response.status(), 200);
    response.json::<Value>().await.unwrap()["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap()
}

#[tokio::test]
async fn times_before_1970_are_dead_lettered_and_the_records_around_them_stay_readable() {
    let app = TestApp::start().await;
    let before = Meter::read(&app).await;
    let good = |n: usize| {
        rr_sale(
            &format!("rr-good-{n}"),
            "sale.created",
            "2026-11-29T10:15:30Z",
            &format!("T1|2026-11|{n}"),
            500,
        )
    };
    let good_order = |n: usize| {
        mekari_order(
            &format!("mk-good-{n}"),
            "order.updated",
            "2026-11-29T17:15:30+07:00",
            &format!("ORD-{n}"),
            "preparing",
        )
    };
    let mut bad = Vec::new();
    assert_eq!(
        answered(app.send("receiptroller", "main", &good(0)).await).await,
        "published"
    );
    assert_eq!(
        answered(app.send("mekari", "main", &good_order(0)).await).await,
        "published"
    );
    for (n, at) in BEFORE_1970.iter().enumerate() {
        let sale = rr_sale(
            &format!("rr-bad-{n}"),
            "sale.created",
            at,
            &format!("T1|2026-11|bad-{n}"),
            500,
        );
        let order = mekari_order(
            &format!("mk-bad-{n}"),
            "order.updated",
            at,
            &format!("ORD-bad-{n}"),
            "preparing",
        );
        for (provider, body) in [("receiptroller", sale), ("mekari", order)] {
            assert_eq!(
                answered(app.send(provider, "main", &body).await).await,
                "dead_lettered",
                "{provider} at {at}"
            );
            bad.push((provider, body));
        }
        assert_eq!(
            answered(app.send("receiptroller", "main", &good(n + 1)).await).await,
            "published"
        );
        assert_eq!(
            answered(app.send("mekari", "main", &good_order(n + 1)).await).await,
            "published"
        );
    }

    // A consumer reads every good record, those before the bad ones included.
    let sales = read_topic(&brokers(), &app.topic("sales"));
    let keys: Vec<&str> = sales.iter().map(|r| r.key.as_str()).collect();
    let expected: Vec<String> = (0..=BEFORE_1970.len())
        .map(|n| format!("receiptroller:T1|2026-11|{n}"))
        .collect();
    assert_eq!(keys, expected);
    let orders = read_topic(&brokers(), &app.topic("orders"));
    assert_eq!(orders.len(), BEFORE_1970.len() + 1);
    assert!(orders.iter().all(|r| !r.key.contains("bad")));
    for record in sales.iter().chain(&orders) {
        assert_eq!(
            record.timestamp_ms,
            Some(1_795_947_330_000),
            "{}",
            record.key
        );
    }

    // Each bad event is a dead letter with its raw body and a precise reason.
    let letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    assert_eq!(letters.len(), bad.len());
    for (letter, (provider, body)) in letters.iter().zip(&bad) {
        assert_eq!(
            letter.key,
            format!("{provider}:{}", body["id"].as_str().unwrap())
        );
        assert_eq!(
            serde_json::from_slice::<Value>(letter.payload.as_deref().unwrap()).unwrap(),
            *body
        );
        assert_eq!(letter.headers["posbridge-reason-code"], "time_before_epoch");
        assert!(
            letter.headers["posbridge-reason"].contains("1970"),
            "{:?}",
            letter.headers
        );
    }
    let after = Meter::read(&app).await;
    for provider in ["receiptroller", "mekari"] {
        assert_eq!(
            after.delta(
                &before,
                "posbridge_dead_letters_total",
                &[("provider", provider), ("reason", "time_before_epoch")]
            ),
            BEFORE_1970.len() as f64,
            "{provider}"
        );
    }
    app.stop().await;
}

/// A terminal with a wrong clock stamps an order in 2099: dead-lettered, so
/// the order's genuine later updates still publish instead of being stale
/// forever. A time a little ahead (clock skew within the bound) publishes.
#[tokio::test]
async fn an_event_far_ahead_of_the_clock_is_dead_lettered_and_does_not_freeze_its_entity() {
    let app = TestApp::start().await;
    let before = Meter::read(&app).await;
    let now = OffsetDateTime::now_utc();
    let future = mekari_order(
        "mk-2099",
        "order.updated",
        "2099-01-01T00:00:00Z",
        "ORD-F",
        "ready",
    );
    assert_eq!(
        answered(app.send("mekari", "main", &future).await).await,
        "dead_lettered"
    );
    let sale = rr_sale(
        "rr-2099",
        "sale.created",
        &rfc3339(now + time::Duration::hours(2)),
        "T1|2026-12|F",
        500,
    );
    assert_eq!(
        answered(app.send("receiptroller", "main", &sale).await).await,
        "dead_lettered"
    );
    let genuine = mekari_order(
        "mk-now",
        "order.updated",
        &rfc3339(now),
        "ORD-F",
        "preparing",
    );
    assert_eq!(
        answered(app.send("mekari", "main", &genuine).await).await,
        "published"
    );
    let skewed = mekari_order(
        "mk-skewed",
        "order.updated",
        &rfc3339(now + time::Duration::minutes(2)),
        "ORD-F",
        "ready",
    );
    assert_eq!(
        answered(app.send("mekari", "main", &skewed).await).await,
        "published"
    );

    let orders = read_topic(&brokers(), &app.topic("orders"));
    let ids: Vec<&str> = orders
        .iter()
        .map(|r| r.headers["posbridge-delivery-id"].as_str())
        .collect();
    assert_eq!(ids, ["mk-now", "mk-skewed"]);
    let letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    let codes: Vec<(&str, &str)> = letters
        .iter()
        .map(|r| (r.key.as_str(), r.headers["posbridge-reason-code"].as_str()))
        .collect();
    assert_eq!(
        codes,
        [
            ("mekari:mk-2099", "time_in_future"),
            ("receiptroller:rr-2099", "time_in_future")
        ]
    );
    assert!(
        letters[0].headers["posbridge-reason"].contains("server.max_event_ahead_ms"),
        "{:?}",
        letters[0].headers
    );
    let after = Meter::read(&app).await;
    for provider in ["receiptroller", "mekari"] {
        assert_eq!(
            after.delta(
                &before,
                "posbridge_dead_letters_total",
                &[("provider", provider), ("reason", "time_in_future")]
            ),
            1.0,
            "{provider}"
        );
    }
    app.stop().await;
}

/// A cluster that refuses old timestamps (`message.timestamp.before.max.ms`
/// on the topic) refuses an event time posbridge accepts: the event is
/// dead-lettered as `timestamp_refused`, not retried forever, and a current
/// one still publishes. Apache Kafka only: tansu does not enforce the setting.
#[tokio::test]
async fn kafka_only_a_timestamp_the_topic_refuses_is_dead_lettered() {
    kafka_only("tansu has no message.timestamp.before.max.ms");
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("event-times");
    create_topic(
        &format!("{prefix}.sales"),
        &[
            ("cleanup.policy", "compact"),
            ("message.timestamp.before.max.ms", "3600000"),
        ],
    )
    .await;
    let mut app = TestApp::start_with(config(&brokers(), &prefix, dir.path())).await;
    app.keep(dir);
    let old = rr_sale(
        "rr-old",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|old",
        500,
    );
    assert_eq!(
        answered(app.send("receiptroller", "main", &old).await).await,
        "dead_lettered"
    );
    let current = rr_sale(
        "rr-current",
        "sale.created",
        &rfc3339(OffsetDateTime::now_utc()),
        "T1|2026-12|now",
        500,
    );
    assert_eq!(
        answered(app.send("receiptroller", "main", &current).await).await,
        "published"
    );
    let sales = read_topic(&brokers(), &app.topic("sales"));
    let keys: Vec<&str> = sales.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["receiptroller:T1|2026-12|now"]);
    let letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].key, "receiptroller:rr-old");
    assert_eq!(
        letters[0].headers["posbridge-reason-code"],
        "timestamp_refused"
    );
    app.stop().await;
}
