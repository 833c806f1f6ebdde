//! posbridge killed with SIGKILL under load, then restarted, with every
//! delivery sent again (those answered too, as a provider that lost the
//! answers would). The ledger's file holds nothing of the first life (its
//! checkpoint interval is longer than the test), so what the restart knows
//! it read from the topics. The guarantees:
//! * every delivery answered `published` is in Kafka (0 acknowledged lost);
//! * no sale's record of an older version follows one of a newer version;
//! * a delivery answered before the kill is not written again; only those
//!   in doubt (sent, no answer before the kill) may be written twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{
    brokers, config_text, free_port, read_topic, rr_sale, signed_request, spawn_serve, unique,
    wait_healthy,
};

/// Sales, and versions of each: every version a delivery of its own.
const SALES: usize = 100;
const VERSIONS: usize = 3;
const CONCURRENCY: usize = 12;

/// Delivery `n`: sale `n % SALES`, version `n / SALES`, so versions of one
/// sale arrive interleaved with the others and, sent from the top, newest
/// first. Event times of the last minutes (the restart restores the ids of
/// the deliveries that arrived within the dedup window, whatever their
/// events' times).
fn delivery(n: usize) -> (String, Vec<u8>) {
    static BASE: std::sync::LazyLock<time::OffsetDateTime> =
        std::sync::LazyLock::new(|| time::OffsetDateTime::now_utc() - time::Duration::minutes(5));
    let (sale, version) = (n % SALES, n / SALES);
    let id = format!("crash-{sale}-{version}");
    let at = (*BASE + time::Duration::seconds(version as i64))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let body = serde_json::to_vec(&rr_sale(
        &id,
        "sale.updated",
        &at,
        &format!("T1|2026-11|{sale}"),
        100 + version as u64,
    ))
    .unwrap();
    (id, body)
}

/// What the load saw: each delivery's last answer status, and those sent
/// without any answer.
#[derive(Default)]
struct Seen {
    answered: BTreeMap<usize, String>,
    unanswered: HashSet<usize>,
}

/// Sends `ids` with `CONCURRENCY` in flight into `seen`.
async fn send_all(http: &reqwest::Client, base: &str, ids: Vec<usize>, seen: Arc<Mutex<Seen>>) {
    let queue = Arc::new(Mutex::new(ids));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (http, base, queue, seen) =
            (http.clone(), base.to_owned(), queue.clone(), seen.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let Some(n) = queue.lock().unwrap().pop() else {
                    break;
                };
                let (id, body) = delivery(n);
                seen.lock().unwrap().unanswered.insert(n);
                let request =
                    signed_request(&http, &base, "receiptroller", "main", &id, body, None);
                let response = match request.send().await {
                    Ok(response) => response,
                    // Never reached posbridge: not in doubt.
                    Err(error) if error.is_connect() => {
                        seen.lock().unwrap().unanswered.remove(&n);
                        continue;
                    }
                    Err(_) => continue,
                };
                if !response.status().is_success() {
                    continue;
                }
                let Ok(answer) = response.json::<serde_json::Value>().await else {
                    continue;
                };
                let mut seen = seen.lock().unwrap();
                seen.unanswered.remove(&n);
                seen.answered
                    .insert(n, answer["status"].as_str().unwrap_or("").to_owned());
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

/// A record's version header as (event time, rank), ordered.
fn version(headers: &HashMap<String, String>) -> (i64, u32) {
    let (at, rank) = headers["posbridge-version"].split_once(':').unwrap();
    (at.parse().unwrap(), rank.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_under_load_loses_nothing_answered_and_rolls_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("crash");
    let port = free_port();
    let text = config_text(&brokers(), &prefix, dir.path())
        .replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replace("[ledger]", "[ledger]\ncheckpoint_interval_ms = 600000");
    assert!(text.contains("checkpoint_interval_ms"), "{text}");
    let config_path = dir.path().join("posbridge.toml");
    std::fs::write(&config_path, text).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let start = || spawn_serve(&config_path);
    let all = SALES * VERSIONS;

    let mut posbridge = start();
    wait_healthy(&http, &base).await;
    let first = Arc::new(Mutex::new(Seen::default()));
    let load = tokio::spawn({
        let (http, base, first) = (http.clone(), base.clone(), first.clone());
        async move { send_all(&http, &base, (0..all).collect(), first).await }
    });
    // Killed mid-load, with deliveries in flight.
    // Polled every 5 ms, not through the suite's 100 ms wait: the kill must
    // land while deliveries are in flight, not after the load ended.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while first.lock().unwrap().answered.len() < all / 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "a third of the first life's deliveries not answered within 120 s ({} of {all}): see posbridge's log",
            first.lock().unwrap().answered.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    posbridge.kill().unwrap();
    posbridge.wait().unwrap();
    load.await.unwrap();
    let (before, in_doubt) = {
        let first = first.lock().unwrap();
        (first.answered.clone(), first.unanswered.len())
    };

    // Everything is sent again, answered or not, until all is answered.
    let mut posbridge = start();
    wait_healthy(&http, &base).await;
    let second = Arc::new(Mutex::new(Seen::default()));
    for _ in 0..5 {
        let missing: Vec<usize> = (0..all)
            .filter(|n| !second.lock().unwrap().answered.contains_key(n))
            .collect();
        if missing.is_empty() {
            break;
        }
        send_all(&http, &base, missing, second.clone()).await;
    }
    posbridge.kill().unwrap();
    posbridge.wait().unwrap();
    let after = second.lock().unwrap().answered.clone();
    assert_eq!(after.len(), all, "every delivery answered 2xx in the end");

    let records = read_topic(&brokers(), &format!("{prefix}.sales"));
    let mut copies: HashMap<String, usize> = HashMap::new();
    let mut newest: HashMap<String, (i64, u32)> = HashMap::new();
    let mut rolled_back = Vec::new();
    for record in &records {
        *copies
            .entry(record.headers["posbridge-delivery-id"].clone())
            .or_default() += 1;
        let version = version(&record.headers);
        let held = newest.entry(record.key.clone()).or_insert(version);
        if version < *held {
            rolled_back.push(record.key.clone());
        }
        *held = (*held).max(version);
    }
    let published = |seen: &BTreeMap<usize, String>| -> Vec<usize> {
        seen.iter()
            .filter(|(_, status)| *status == "published")
            .map(|(n, _)| *n)
            .collect()
    };
    let lost: Vec<usize> = published(&before)
        .into_iter()
        .chain(published(&after))
        .filter(|n| !copies.contains_key(&delivery(*n).0))
        .collect();
    assert!(
        lost.is_empty(),
        "answered published but not in Kafka: {lost:?}"
    );
    assert!(
        rolled_back.is_empty(),
        "an older state after a newer one: {rolled_back:?}"
    );
    let again: Vec<&usize> = before
        .keys()
        .filter(|n| copies.get(&delivery(**n).0).copied().unwrap_or(0) > 1)
        .collect();
    assert!(
        again.is_empty(),
        "answered before the kill, written again: {again:?}"
    );
    let after_published = published(&after).len();
    let twice = copies.values().filter(|n| **n > 1).count();
    assert!(
        twice <= in_doubt,
        "{twice} written twice, {in_doubt} in doubt at the kill"
    );
    let duplicates = after.values().filter(|s| *s == "duplicate").count();
    println!(
        "crash test: {} answered before SIGKILL ({} published), {in_doubt} in doubt; after the restart {duplicates} duplicates, {after_published} published; {} records for {all} deliveries, {twice} written twice, 0 lost, 0 rolled back",
        before.len(),
        published(&before).len(),
        records.len()
    );
}
