//! `posbridge replay-dead-letters` against the real broker and ledger: dead
//! letters whose cause was cleared are published, an old one is held back by
//! the guard, one that still cannot be normalized is reported and stays a
//! dead letter, and a second run starts where the first stopped.

use std::path::Path;

use posbridge::config::Config;
use serde_json::Value;

use crate::support::{TestApp, brokers, config_text, read_topic, rr_sale, unique};

/// Runs the command as its own process: whether it exited 0, and its stdout
/// as JSON lines.
async fn replay(config: &Path, args: &[&str]) -> (bool, Vec<Value>) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(["replay-dead-letters", "--config"])
        .arg(config)
        .args(args)
        .env("POSBRIDGE_LOG", "warn")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect();
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    }
    (output.status.success(), lines)
}

/// The `outcome` of each record line (the summary line has none).
fn outcomes(lines: &[Value]) -> Vec<&str> {
    lines.iter().filter_map(|l| l["outcome"].as_str()).collect()
}

/// The summary, the last line.
fn summary(lines: &[Value]) -> &Value {
    &lines.last().expect("a summary line")["summary"]
}

#[tokio::test]
async fn dead_letters_are_published_once_their_cause_is_cleared_and_never_twice() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("replay");
    let text = config_text(&brokers(), &prefix, dir.path());
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, &text).unwrap();

    // The cause: a record limit below what a sale's record needs, so the
    // record is refused for good and the body dead-lettered (whole: it is
    // half the record). Set on the producer (check-config refuses it there),
    // after the topics were made with room for every record by the file's
    // own settings: Kafka enforces a topic's `max.message.bytes` (tansu 0.6
    // does not), so the topics must outlast the cause.
    drop(
        posbridge::app::App::build(&Config::from_toml(&text).unwrap())
            .await
            .unwrap(),
    );
    let mut limited = Config::from_toml(&text).unwrap();
    limited.kafka.create_topics = false;
    limited
        .kafka
        .librdkafka
        .insert("message.max.bytes".into(), "1000000".into());
    let app = TestApp::start_with(limited).await;
    let huge = |delivery_id: &str, sale_id: &str| {
        let mut sale = rr_sale(
            delivery_id,
            "sale.created",
            "2026-11-29T10:15:30Z",
            sale_id,
            500,
        );
        // In the record twice (the line's name and `raw`), in the body once.
        sale["data"]["items"][0]["name"] = Value::String("x".repeat(600_000));
        sale
    };
    let newer = rr_sale(
        "rp-3",
        "sale.updated",
        "2026-11-29T10:20:00Z",
        "T1|2026-11|78",
        900,
    );
    let unknown = serde_json::json!({"id": "rp-4", "type": "shift.closed",
        "timestamp": "2026-11-29T10:16:00Z", "data": {"id": "S-1"}});
    for (body, status) in [
        (huge("rp-1", "T1|2026-11|77"), "dead_lettered"),
        (huge("rp-2", "T1|2026-11|78"), "dead_lettered"),
        (newer, "published"),
        (unknown, "dead_lettered"),
    ] {
        let response = app.send("receiptroller", "main", &body).await;
        assert_eq!(response.json::<Value>().await.unwrap()["status"], status);
    }
    let dead_letter_topic = app.config.kafka.dead_letter_topic();
    let sales_topic = app.topic("sales");
    app.stop().await;
    let letters = read_topic(&brokers(), &dead_letter_topic);
    let codes: Vec<&str> = letters
        .iter()
        .map(|l| l.headers["posbridge-reason-code"].as_str())
        .collect();
    assert_eq!(
        codes,
        ["publish_refused", "publish_refused", "unknown_event_type"]
    );

    // With the limit gone (the file has none): a dry run says what would
    // happen and writes nothing.
    let (ok, lines) = replay(&path, &["--dry-run"]).await;
    assert!(ok);
    assert_eq!(
        outcomes(&lines),
        ["would_publish", "would_be_stale", "would_still_fail"]
    );
    assert_eq!(lines[0]["entity"], "receiptroller:T1|2026-11|77");
    assert_eq!(lines[0]["delivery_id"], "rp-1");
    assert_eq!(summary(&lines)["checkpoints"], "kept: dry run");
    assert_eq!(read_topic(&brokers(), &sales_topic).len(), 1);

    // A run filtered by reason: the refused ones only; the older one is
    // stale (the topic has rp-3's newer state), nothing is rolled back.
    let (ok, lines) = replay(&path, &["--reason", "publish_refused"]).await;
    assert!(ok);
    assert_eq!(outcomes(&lines), ["published", "stale", "skipped"]);
    assert_eq!(lines[2]["reason_code"], "filtered");
    assert_eq!(summary(&lines)["checkpoints"], "kept: filters");
    let sales = read_topic(&brokers(), &sales_topic);
    assert_eq!(sales.len(), 2);
    let replayed = &sales[1];
    assert_eq!(replayed.key, "receiptroller:T1|2026-11|77");
    assert_eq!(replayed.headers["posbridge-delivery-id"], "rp-1");
    let event = posbridge::adapters::encode::decode(replayed.payload.as_deref().unwrap()).unwrap();
    assert_eq!(
        Some((event.received_at.unix_timestamp_nanos() / 1_000_000) as i64),
        letters[0].timestamp_ms,
        "received when the dead letter arrived"
    );

    // The unfiltered run reads from the same place: rp-1 is now unchanged,
    // rp-4 still cannot be normalized and is reported, not dead-lettered again.
    let (ok, lines) = replay(&path, &[]).await;
    assert!(ok);
    assert_eq!(outcomes(&lines), ["unchanged", "stale", "still_failing"]);
    assert_eq!(lines[2]["reason_code"], "unknown_event_type");
    assert!(
        lines[2]["reason"]
            .as_str()
            .unwrap()
            .contains("shift.closed")
    );
    assert_eq!(summary(&lines)["complete"], true);
    assert_eq!(summary(&lines)["checkpoints"], "moved");
    assert_eq!(read_topic(&brokers(), &dead_letter_topic).len(), 3);
    assert_eq!(read_topic(&brokers(), &sales_topic).len(), 2);

    // The checkpoint moved past what is done and holds at what still fails:
    // the next run reads only rp-4 again, for the day its normalizer is fixed.
    let (ok, lines) = replay(&path, &[]).await;
    assert!(ok);
    assert_eq!(outcomes(&lines), ["still_failing"], "{lines:?}");
    assert_eq!(lines[0]["delivery_id"], "rp-4");
}
