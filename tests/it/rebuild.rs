//! A lost ledger is filled from the topics: the embedded ledger's file
//! deleted while posbridge was stopped (a lost volume), a Redis ledger's keys
//! gone while it was stopped, and gone while it serves (`FLUSHALL`, a
//! failover to an empty replica). After it, the retry of a published
//! delivery is a duplicate, an older event of the same sale is stale, and the
//! retry of a dead-lettered delivery is a duplicate too: nothing is written
//! twice, nothing rolled back.

use posbridge::config::{Config, LedgerBackend};
use serde_json::Value;

use std::time::Duration;

use crate::support::wait::look_for;
use crate::support::{TestApp, brokers, config, read_topic, rr_sale, unique};

/// What the first life of posbridge leaves: a sale's newer state published,
/// a delivery dead-lettered. Returns the deliveries to send again.
async fn first_life(config: Config) -> (Value, Value, (String, Vec<u8>)) {
    let app = TestApp::start_with(config).await;
    let sent = publish_and_dead_letter(&app).await;
    app.stop().await;
    sent
}

/// A sale's newer state published, a delivery dead-lettered; the deliveries
/// to send again.
async fn publish_and_dead_letter(app: &TestApp) -> (Value, Value, (String, Vec<u8>)) {
    // Events three days old, delivered now (a POS that was offline, a
    // backfill): a delivery id is remembered for the dedup window (a day)
    // after its delivery arrived, not after its event happened, so the
    // published one is restored from its record.
    let ago = |minutes: i64| {
        (time::OffsetDateTime::now_utc()
            - time::Duration::days(3)
            - time::Duration::minutes(minutes))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
    };
    let newer = rr_sale("rb-2", "sale.updated", &ago(1), "T1|2026-11|77", 2000);
    let older = rr_sale("rb-1", "sale.created", &ago(2), "T1|2026-11|77", 1000);
    // Sent as a provider does, again while it is answered 503: a first
    // fill slowed by a loaded machine may outlast the start's wait.
    assert_eq!(
        status(async || app.send("receiptroller", "main", &newer).await).await,
        "published"
    );
    let letter = ("rb-3".to_owned(), b"{\"id\":\"rb-3\", not json".to_vec());
    assert_eq!(
        status(async || {
            app.send_raw("receiptroller", "main", &letter.0, letter.1.clone(), None)
                .await
        })
        .await,
        "dead_lettered"
    );
    (newer, older, letter)
}

/// The second life, on a ledger that forgot everything: each delivery gets
/// what it would have got from the ledger the first life left.
async fn second_life(config: Config, newer: &Value, older: &Value, letter: (String, Vec<u8>)) {
    let app = TestApp::start_with(config).await;
    remembers(&app, newer, older, letter).await;
    app.stop().await;
}

/// The status of the answer to what `send` sends, sent again as a
/// provider would while it is answered 503 (the ledger being filled): each
/// 503 carries `Retry-After` and a JSON error.
pub(crate) async fn status(mut send: impl AsyncFnMut() -> reqwest::Response) -> Value {
    let answered = look_for(Duration::from_secs(30), async || {
        let response = send().await;
        if response.status() == 503 {
            assert!(response.headers().contains_key("retry-after"));
            let body: Value = response.json().await.unwrap();
            assert!(body["error"].is_string(), "{body}");
            return None;
        }
        Some(response.json::<Value>().await.unwrap()["status"].clone())
    })
    .await;
    answered.expect("still 503 after 30 s")
}

/// Each delivery gets what it got before the ledger forgot: nothing is
/// written again.
async fn remembers(app: &TestApp, newer: &Value, older: &Value, letter: (String, Vec<u8>)) {
    assert_eq!(
        status(async || app.send("receiptroller", "main", newer).await).await,
        "duplicate",
        "the retry of a published delivery"
    );
    assert_eq!(
        status(async || app.send("receiptroller", "main", older).await).await,
        "stale",
        "an older event of the same sale"
    );
    assert_eq!(
        status(async || {
            app.send_raw("receiptroller", "main", &letter.0, letter.1.clone(), None)
                .await
        })
        .await,
        "duplicate",
        "the retry of a dead-lettered delivery"
    );
    let sales = read_topic(&brokers(), &app.topic("sales"));
    assert_eq!(sales.len(), 1, "written once: {:?}", sales.len());
}

/// The Redis ledger of `prefix` on the suite's server.
fn redis_config(mut config: Config, prefix: &str) -> Config {
    config.ledger.backend = LedgerBackend::Redis;
    config.ledger.redis_url =
        std::env::var("POSBRIDGE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    config.ledger.redis_prefix = format!("{prefix}:");
    config
}

/// Deletes every key of this deployment, as a FLUSHALL leaves a shared
/// server (the suite's Redis serves other tests, so only ours go).
fn forget_keys(config: &Config) {
    let mut redis = redis::Client::open(config.ledger.redis_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", config.ledger.redis_prefix))
        .query(&mut redis)
        .unwrap();
    assert!(!keys.is_empty(), "nothing was written to Redis");
    let () = redis::cmd("DEL").arg(&keys).query(&mut redis).unwrap();
}

#[tokio::test]
async fn a_lost_embedded_ledger_is_rebuilt_from_the_topics() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rebuild");
    let config = config(&brokers(), &prefix, dir.path());
    let (newer, older, letter) = first_life(config.clone()).await;

    // The volume is lost while posbridge is stopped.
    std::fs::remove_file(&config.ledger.path).unwrap();

    second_life(config, &newer, &older, letter).await;
}

#[tokio::test]
async fn a_redis_ledger_that_lost_its_keys_is_rebuilt_from_the_topics() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rebuild-redis");
    let config = redis_config(config(&brokers(), &prefix, dir.path()), &prefix);
    let (newer, older, letter) = first_life(config.clone()).await;
    forget_keys(&config);
    second_life(config, &newer, &older, letter).await;
}

/// The keys go while posbridge serves: the next lease finds the generation
/// mark gone, and posbridge fills the ledger again before deciding it.
#[tokio::test]
async fn a_redis_ledger_that_loses_its_keys_while_serving_is_filled_again() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("flush-redis");
    let config = redis_config(config(&brokers(), &prefix, dir.path()), &prefix);
    let app = TestApp::start_with(config.clone()).await;
    let (newer, older, letter) = publish_and_dead_letter(&app).await;
    forget_keys(&config);
    remembers(&app, &newer, &older, letter).await;
    // The fill read this deployment's records again.
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    let rebuild = &ready["ledger_rebuild"];
    assert_eq!(rebuild["running"], false, "{ready}");
    assert!(rebuild["records_read"].as_u64() >= Some(2), "{ready}");
    app.stop().await;
}
