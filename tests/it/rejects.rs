//! Bad input gets a precise status, a clear message and produces nothing;
//! an event we cannot normalize is dead-lettered with its raw body.

use crate::support::{Meter, TestApp, brokers, config, own_source, read_topic, rr_sale, unique};

/// The test app with `provider`'s `main` source renamed to a name of its
/// own, returned: the series labelled with it count this test's requests
/// alone.
async fn app_with_own_source(provider: &str) -> (TestApp, String) {
    let source = unique("rejects");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&brokers(), &unique("rejects"), dir.path());
    own_source(&mut cfg, provider, "main", &source);
    let mut app = TestApp::start_with(cfg).await;
    app.keep(dir);
    (app, source)
}

#[tokio::test]
async fn bad_signature_is_401_and_produces_nothing() {
    let (app, source) = app_with_own_source("receiptroller").await;
    let before = Meter::read(&app).await;
    let body = rr_sale(
        "bad-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|9",
        500,
    );
    let bytes = serde_json::to_vec(&body).unwrap();
    let response = app
        .send_raw(
            "receiptroller",
            &source,
            "bad-1",
            bytes.clone(),
            Some("wrong-secret"),
        )
        .await;
    assert_eq!(response.status(), 401);
    let message = response.json::<serde_json::Value>().await.unwrap();
    assert!(message["error"].as_str().unwrap().contains("signature"));
    let unsigned = app
        .http
        .post(format!("{}/webhooks/receiptroller/{source}", app.base))
        .header("X-RR-Delivery", "bad-1")
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status(), 401);
    assert!(read_topic(&brokers(), &app.topic("sales")).is_empty());
    let after = Meter::read(&app).await;
    let labels = [("provider", "receiptroller"), ("source", source.as_str())];
    assert_eq!(
        after.delta(&before, "posbridge_signature_failures_total", &labels),
        2.0,
        "both refusals counted"
    );
    // The refused attempts did not mark the delivery: the correctly signed one publishes.
    let good = app.send("receiptroller", &source, &body).await;
    assert_eq!(
        good.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );
    app.stop().await;
}

#[tokio::test]
async fn unknown_event_goes_to_dead_letter_with_raw_body_and_is_200() {
    let (app, source) = app_with_own_source("mekari").await;
    let before = Meter::read(&app).await;
    let body = serde_json::json!({"id": "dl-1", "event": "shift.closed",
        "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "S-1"}});
    let response = app.send("mekari", &source, &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.json::<serde_json::Value>().await.unwrap()["status"],
        "dead_lettered"
    );
    let not_json = b"{not json".to_vec();
    let response = app
        .send_raw("mekari", &source, "dl-2", not_json.clone(), None)
        .await;
    assert_eq!(response.status(), 200);

    let letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].key, "mekari:dl-1");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(letters[0].payload.as_deref().unwrap())
            .unwrap(),
        body
    );
    assert!(letters[0].headers["posbridge-reason"].contains("shift.closed"));
    assert_eq!(letters[1].payload.as_deref().unwrap(), not_json.as_slice());
    // A retry of a dead-lettered delivery is a duplicate, not a second letter.
    assert_eq!(
        app.send("mekari", &source, &body)
            .await
            .json::<serde_json::Value>()
            .await
            .unwrap()["status"],
        "duplicate"
    );
    let after = Meter::read(&app).await;
    let requests = |outcome: &str| {
        after.delta(
            &before,
            "posbridge_webhook_requests_total",
            &[
                ("provider", "mekari"),
                ("source", source.as_str()),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(
        (requests("dead_lettered"), requests("duplicate")),
        (2.0, 1.0)
    );
    // Two letters written to this test's dead-letter topic, counted by reason.
    let topic = app.config.kafka.dead_letter_topic();
    assert_eq!(
        after.delta(
            &before,
            "posbridge_publish_duration_seconds_count",
            &[("topic", topic.as_str())]
        ),
        2.0
    );
    // By provider and reason only, so shared with the other tests of the
    // process; none of them gets a Mekari event of a type posbridge does
    // not know dead-lettered (topic_failure's is refused by Kafka, never
    // written), so this test's letter is the only one counted.
    assert_eq!(
        after.delta(
            &before,
            "posbridge_dead_letters_total",
            &[("provider", "mekari"), ("reason", "unknown_event_type")]
        ),
        1.0
    );
    app.stop().await;
}

/// A signed body that cannot be an event (not JSON, empty, an array, a
/// number, a numeric `id`) is dead-lettered with its raw body and answered
/// 2xx, like any body that cannot be normalized, and remembered by the
/// delivery id its provider sent: a retry under that id is a duplicate, the
/// same bytes under another id are another delivery with a dead letter of
/// its own. Both providers send the id in a header.
#[tokio::test]
async fn a_body_that_cannot_be_an_event_is_dead_lettered_once_per_delivery_id() {
    let app = TestApp::start().await;
    let bodies = [
        &b"[1,3]"[..],
        b"",
        b"[1, 2]",
        b"5",
        br#"{"id": 5, "type": "sale.created"}"#,
    ];
    let mut expected_letters = Vec::new();
    for provider in ["receiptroller", "mekari"] {
        for (n, body) in bodies.into_iter().enumerate() {
            let text = String::from_utf8_lossy(body);
            for (id, expected) in [
                (format!("odd-{n}-a"), "dead_lettered"),
                (format!("odd-{n}-a"), "duplicate"),
                (format!("odd-{n}-b"), "dead_lettered"),
            ] {
                let response = app
                    .send_raw(provider, "main", &id, body.to_vec(), None)
                    .await;
                assert_eq!(response.status(), 200, "{provider} {text:?} {id}");
                let status = response.json::<serde_json::Value>().await.unwrap()["status"].clone();
                assert_eq!(status, expected, "{provider} {text:?} {id}");
                if expected == "dead_lettered" {
                    expected_letters.push((provider.to_owned(), id, body.to_vec()));
                }
            }
        }
    }
    let letters: Vec<(String, String, Vec<u8>)> =
        read_topic(&brokers(), &app.config.kafka.dead_letter_topic())
            .into_iter()
            .map(|letter| {
                (
                    letter.headers["posbridge-provider"].clone(),
                    letter.headers["posbridge-delivery-id"].clone(),
                    letter.payload.unwrap_or_default(),
                )
            })
            .collect();
    assert_eq!(letters, expected_letters, "one dead letter per delivery id");
    app.stop().await;
}

/// An event too large for the record limit (a limit set below what
/// check-config allows, a broker's own, or a reconciled record) is a permanent outcome:
/// its dead letter keeps the body's head with its length and hash, and the
/// delivery is done, never a 503 the provider would retry forever.
#[tokio::test]
async fn an_event_too_large_for_kafka_is_dead_lettered_cut_not_retried_forever() {
    use sha2::Digest;
    let dir = tempfile::tempdir().unwrap();
    let prefix = crate::support::unique("huge");
    let mut config = crate::support::config(&brokers(), &prefix, dir.path());
    // A producer limit below what the body needs (check-config refuses
    // this; a broker's or an older topic's limit does the same).
    config.server.body_limit_bytes = 3 * 1024 * 1024;
    config
        .kafka
        .librdkafka
        .insert("message.max.bytes".into(), "1000000".into());
    let app = TestApp::start_with(config).await;
    let mut body = rr_sale(
        "huge-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|9",
        500,
    );
    body["data"]["note"] = serde_json::Value::String("x".repeat(1_200_000));
    for expected in ["dead_lettered", "duplicate"] {
        let response = app.send("receiptroller", "main", &body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.json::<serde_json::Value>().await.unwrap()["status"],
            expected
        );
    }
    assert!(read_topic(&brokers(), &app.topic("sales")).is_empty());
    let letters = read_topic(&brokers(), &app.config.kafka.dead_letter_topic());
    assert_eq!(letters.len(), 1);
    let sent = serde_json::to_vec(&body).unwrap();
    let letter = &letters[0];
    assert_eq!(
        letter.payload.as_deref(),
        Some(&sent[..posbridge::services::pipeline::DEAD_LETTER_KEPT_BYTES])
    );
    assert_eq!(
        letter.headers["posbridge-body-bytes"],
        sent.len().to_string()
    );
    assert_eq!(
        letter.headers["posbridge-body-sha256"],
        hex::encode(sha2::Sha256::digest(&sent))
    );
    app.stop().await;
}

/// An event near the body limit is published whole: records and the topics
/// posbridge creates are sized for the largest body it accepts.
#[tokio::test]
async fn an_event_near_the_body_limit_is_published_whole() {
    let app = TestApp::start().await;
    let mut body = rr_sale(
        "near-limit-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|10",
        500,
    );
    body["data"]["note"] = serde_json::Value::String("x".repeat(1_000_000));
    assert!(serde_json::to_vec(&body).unwrap().len() <= app.config.server.body_limit_bytes);
    let response = app.send("receiptroller", "main", &body).await;
    assert_eq!(
        response.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );
    assert_eq!(read_topic(&brokers(), &app.topic("sales")).len(), 1);
    app.stop().await;
}
