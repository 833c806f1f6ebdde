//! posbridge killed with SIGKILL under load: every delivery it ever answered
//! 2xx is in Kafka after a restart and the providers' resends. Records
//! written twice (acknowledged by Kafka, killed before the ledger noted it)
//! are counted and printed: the promise is at-least-once across a crash.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{
    brokers, config_text, free_port, read_topic, rr_sale, signed_request, spawn_serve, unique,
    wait_healthy,
};

const DELIVERIES: usize = 300;
const CONCURRENCY: usize = 12;

fn body(i: usize) -> Vec<u8> {
    serde_json::to_vec(&rr_sale(
        &format!("crash-{i}"),
        "sale.created",
        "2026-11-30T08:00:00Z",
        &format!("T1|2026-11|{i}"),
        100 + i as u64,
    ))
    .unwrap()
}

/// Sends `ids` with `CONCURRENCY` in flight; returns those answered 2xx.
async fn send_all(
    http: &reqwest::Client,
    base: &str,
    ids: Vec<usize>,
    answered: Arc<Mutex<BTreeSet<usize>>>,
) {
    let queue = Arc::new(Mutex::new(ids));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (http, base, queue, answered) = (
            http.clone(),
            base.to_owned(),
            queue.clone(),
            answered.clone(),
        );
        workers.push(tokio::spawn(async move {
            loop {
                let Some(i) = queue.lock().unwrap().pop() else {
                    break;
                };
                let request = signed_request(
                    &http,
                    &base,
                    "receiptroller",
                    "main",
                    &format!("crash-{i}"),
                    body(i),
                    None,
                );
                if let Ok(response) = request.send().await
                    && response.status().is_success()
                {
                    answered.lock().unwrap().insert(i);
                }
            }
        }));
    }
    for worker in workers {
        let _ = worker.await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_delivery_answered_2xx_survives_sigkill_under_load() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("crash");
    let port = free_port();
    let text = config_text(&brokers(), &prefix, dir.path()).replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    );
    let config_path = dir.path().join("posbridge.toml");
    std::fs::write(&config_path, text).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let start = || spawn_serve(&config_path);

    let mut posbridge = start();
    wait_healthy(&http, &base).await;
    let answered = Arc::new(Mutex::new(BTreeSet::new()));
    let load = tokio::spawn({
        let (http, base, answered) = (http.clone(), base.clone(), answered.clone());
        async move { send_all(&http, &base, (0..DELIVERIES).rev().collect(), answered).await }
    });
    // Killed mid-load, with deliveries in flight.
    // Polled every 5 ms, not through the suite's 100 ms wait: the kill must
    // land while deliveries are in flight, not after the load ended.
    while answered.lock().unwrap().len() < DELIVERIES / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    posbridge.kill().unwrap();
    posbridge.wait().unwrap();
    load.await.unwrap();
    let before_crash = answered.lock().unwrap().clone();

    // The providers resend everything not answered 2xx until it is.
    let mut posbridge = start();
    wait_healthy(&http, &base).await;
    let after = Arc::new(Mutex::new(BTreeSet::new()));
    for _ in 0..5 {
        let missing: Vec<usize> = (0..DELIVERIES)
            .filter(|i| !before_crash.contains(i) && !after.lock().unwrap().contains(i))
            .collect();
        if missing.is_empty() {
            break;
        }
        send_all(&http, &base, missing, after.clone()).await;
    }
    posbridge.kill().unwrap();
    posbridge.wait().unwrap();
    let after = after.lock().unwrap().clone();
    assert_eq!(
        before_crash.len() + after.len(),
        DELIVERIES,
        "every delivery answered 2xx in the end"
    );

    let records = read_topic(&brokers(), &format!("{prefix}.sales"));
    let mut copies: HashMap<String, usize> = HashMap::new();
    for record in &records {
        *copies
            .entry(record.headers["posbridge-delivery-id"].clone())
            .or_default() += 1;
    }
    let lost: Vec<&usize> = before_crash
        .iter()
        .chain(after.iter())
        .filter(|i| !copies.contains_key(&format!("crash-{i}")))
        .collect();
    assert!(lost.is_empty(), "answered 2xx but not in Kafka: {lost:?}");
    let twice = copies.values().filter(|n| **n > 1).count();
    println!(
        "crash test: {} answered before SIGKILL, {} after restart; {} records for {DELIVERIES} deliveries, {twice} written twice, 0 lost",
        before_crash.len(),
        after.len(),
        records.len()
    );
}
