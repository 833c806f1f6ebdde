//! A dead-letter topic whose `max.message.bytes` an operator set below a
//! body posbridge must dead-letter: the letter is cut to what the topic
//! takes (the body's head, with its whole length, SHA-256 and why it was
//! cut in headers) and the delivery is done, 200 `dead_lettered` for both
//! providers. Not a 503 on every attempt (Mekari pauses an endpoint after
//! ten failures), and not a spooled ReceiptRoller delivery that never
//! leaves the spool. Kafka only (`kafka_only` in its name): tansu 0.6
//! answers AlterConfigs with UnsupportedFeature, so no topic limit can be
//! set there.

use crate::support::kafka_only;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::operator::set_topic_config;
use crate::support::{TestApp, brokers, read_topic, spool_config, unique};

/// What the operator sets the dead-letter topic's `max.message.bytes` to.
const LIMIT: usize = 4096;

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_dead_letter_bigger_than_its_topic_takes_is_cut_to_fit_and_the_delivery_is_done()
 {
    kafka_only("tansu 0.6 has no AlterConfigs");
    let dir = tempfile::tempdir().unwrap();
    let mut app =
        TestApp::start_with(spool_config(&brokers(), &unique("dlqsize"), dir.path())).await;
    app.keep(dir);
    let dead_letters = app.config.kafka.dead_letter_topic();
    let limit = LIMIT.to_string();
    set_topic_config(
        &brokers(),
        &dead_letters,
        &[("cleanup.policy", "delete"), ("max.message.bytes", &limit)],
    )
    .await;

    // No JSON, three times what the topic takes, and well under the 64 KiB a
    // cut letter kept before.
    let body = format!("not json: {}", "x".repeat(3 * LIMIT)).into_bytes();
    for (provider, id) in [("mekari", "big-mk-1"), ("receiptroller", "big-rr-1")] {
        let answer = app.send_raw(provider, "main", id, body.clone(), None).await;
        let status = answer.status();
        let answer: Value = answer.json().await.unwrap();
        assert_eq!(status, 200, "{provider}: {answer}");
        assert_eq!(answer["status"], "dead_lettered", "{provider}: {answer}");
    }
    assert_eq!(
        app.pipeline.spool().unwrap().stats().entries,
        0,
        "nothing left in the spool"
    );

    let letters = read_topic(&brokers(), &dead_letters);
    assert_eq!(letters.len(), 2, "{letters:?}");
    let sha256 = hex::encode(Sha256::digest(&body));
    for letter in &letters {
        let kept = letter.payload.as_deref().unwrap_or_default();
        assert!(
            !kept.is_empty() && kept.len() < LIMIT,
            "{} bytes kept",
            kept.len()
        );
        assert_eq!(kept, &body[..kept.len()], "the body's head");
        assert_eq!(
            letter.headers["posbridge-body-bytes"],
            body.len().to_string()
        );
        assert_eq!(letter.headers["posbridge-body-sha256"], sha256);
        assert_eq!(letter.headers["posbridge-reason-code"], "invalid_json");
        let why = &letter.headers["posbridge-cut-reason"];
        assert!(why.contains(&limit), "the topic's limit: {why}");
    }
    app.stop().await;
}
