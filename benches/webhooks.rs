//! Throughput and latency of the whole webhook path against a real broker:
//! signed HTTP request → verify → ledger → normalize → guard → encode →
//! idempotent produce (acks=all) → ledger commit → 200.
//!
//! Run with `scripts/bench` (starts a fresh tansu broker), or
//! `POSBRIDGE_BENCH_BROKERS=host:port cargo bench --bench webhooks`.
//! Prints figures; asserts nothing about speed.

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use posbridge::app::App;
use posbridge::config::Config;
use posbridge::config::SchemeName;
use posbridge::verify::sign;

const SECRET: &str = "bench-secret-1";

fn config(brokers: &str, prefix: &str, dir: &std::path::Path) -> Config {
    let text = format!(
        r#"
        [kafka]
        brokers = "{brokers}"
        topic_prefix = "{prefix}."
        partitions = 3
        [kafka.librdkafka]
        "linger.ms" = "1"
        [ledger]
        path = "{}"
        [receiptroller.sources.main]
        secrets = ["{SECRET}"]
        "#,
        dir.join("ledger.redb").display()
    );
    Config::from_toml(&text).expect("bench config")
}

fn body(i: usize) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "id": format!("bench-{i}"), "type": "sale.created",
        "timestamp": "2026-11-29T10:15:30.123Z", "webhook_id": "wh_1",
        "data": {"id": format!("T1|2026-11|{i:08}"), "terminal_id": "T1", "store_id": "S1",
                 "currency": "JPY", "sub_total": 1000, "tax_total": 100, "grand_total": 1100,
                 "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
    }))
    .expect("json")
}

async fn run(label: &str, base: &str, ids: &[usize], concurrency: usize) {
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut latencies: Vec<Duration> = stream::iter(ids.iter().copied())
        .map(|i| {
            let http = http.clone();
            let url = format!("{base}/webhooks/receiptroller/main");
            async move {
                let bytes = body(i);
                let mut request = http.post(url).header("X-RR-Delivery", format!("bench-{i}"));
                for (k, v) in sign(SchemeName::Hex, "X-RR-Signature", SECRET, "", 0, &bytes) {
                    request = request.header(k, v);
                }
                let t = Instant::now();
                let response = request.body(bytes).send().await.expect("request");
                assert_eq!(response.status(), 200, "bench request failed");
                t.elapsed()
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p) as usize];
    println!(
        "{label:<28} {:>6} requests  concurrency {concurrency:>3}  {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
        ids.len(),
        ids.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3,
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("webhooks bench: run it with `scripts/bench` or `cargo bench --bench webhooks`");
        return;
    }
    let brokers =
        std::env::var("POSBRIDGE_BENCH_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let requests: usize = std::env::var("POSBRIDGE_BENCH_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = format!("bench{}", std::process::id());
    let app = App::build(&config(&brokers, &prefix, dir.path()))
        .await
        .expect("app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.serve(listener, async {
        let _ = stopped.await;
    }));

    let warm: Vec<usize> = (requests..requests + 200).collect();
    run("warm-up", &base, &warm, 16).await;
    let fresh: Vec<usize> = (0..requests).collect();
    for concurrency in [1, 16, 64] {
        let ids: Vec<usize> = fresh.iter().map(|i| i + concurrency * 1_000_000).collect();
        run("new deliveries (produce)", &base, &ids, concurrency).await;
    }
    let dups: Vec<usize> = (64_000_000..64_000_000 + requests).collect();
    run("duplicates (no produce)", &base, &dups, 64).await;

    let _ = stop.send(());
    let _ = server.await;
}
