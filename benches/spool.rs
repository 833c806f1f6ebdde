//! The outage spool: deliveries of a spooling source answered while no
//! broker answers (the spool's fsync'd appends), and the drain of that spool
//! into Kafka (parallel lanes keyed by entity, for per-entity order), beside
//! the limit it is held to, measured in the same run: the live publish rate
//! of the same deliveries with the broker up (the drain should reach at
//! least half of it).
//!
//! Run with `scripts/bench spool` (starts a fresh broker), or
//! `POSBRIDGE_BENCH_BROKERS=host:port cargo bench --bench spool`.
//! Prints figures; asserts nothing about speed.

use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use posbridge::app::App;
use posbridge::config::Config;
use posbridge::domain::verify::SchemeName;
use posbridge::domain::verify::sign;

#[path = "shared/percentile.rs"]
mod percentile;
use percentile::percentile;

const SECRET: &str = "bench-secret-1";

/// The bench configuration; with `spool`, the source spools what Kafka
/// cannot take (and with no broker, topics are not created at start-up).
fn config(brokers: &str, prefix: &str, dir: &std::path::Path, spool: bool) -> Config {
    let on_unavailable = if spool { "spool" } else { "retry" };
    let text = format!(
        r#"
        [kafka]
        brokers = "{brokers}"
        topic_prefix = "{prefix}."
        partitions = 3
        create_topics = {create_topics}
        [kafka.librdkafka]
        "linger.ms" = "1"
        [ledger]
        path = "{}"
        [spool]
        path = "{}"
        [receiptroller.sources.main]
        secrets = ["{SECRET}"]
        on_broker_unavailable = "{on_unavailable}"
        "#,
        dir.join("ledger.redb").display(),
        dir.join("spool.redb").display(),
        create_topics = brokers != NO_BROKER,
    );
    Config::from_toml(&text).expect("bench config")
}

/// Nothing listens here: the broker of the spooling run.
const NO_BROKER: &str = "127.0.0.1:1";

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

/// Sends the deliveries `ids` at `concurrency`, prints a row and returns
/// the rate (requests/s).
async fn run(label: &str, base: &str, ids: &[usize], concurrency: usize) -> f64 {
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
    let pct = |p: f64| percentile(&latencies, p);
    println!(
        "{label:<28} {:>6} requests  concurrency {concurrency:>3}  {:>8.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
        ids.len(),
        ids.len() as f64 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3,
    );
    ids.len() as f64 / elapsed.as_secs_f64()
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("spool bench: run it with `scripts/bench spool` or `cargo bench --bench spool`");
        return;
    }
    let brokers =
        std::env::var("POSBRIDGE_BENCH_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let requests: usize = std::env::var("POSBRIDGE_BENCH_REQUESTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    spool_and_drain(&brokers, requests).await;
}

/// Publishes `requests` deliveries live (the limit), spools as many others
/// with no broker, then drains them into the real one, timing each.
async fn spool_and_drain(brokers: &str, requests: usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let prefix = format!("benchspool{}", std::process::id());
    // Topics first (so the drain does not wait for their creation), and the
    // live rate of the same kind of deliveries, on the same topics.
    let (base, stop, server) = serve(&config(brokers, &prefix, dir.path(), false)).await;
    let live_ids: Vec<usize> = (70_000_000..70_000_000 + requests).collect();
    let live = run("live (broker up)", &base, &live_ids, 16).await;
    let _ = stop.send(());
    let _ = server.await;
    let (base, stop, server) = serve(&config(NO_BROKER, &prefix, dir.path(), true)).await;
    let ids: Vec<usize> = (80_000_000..80_000_000 + requests).collect();
    run("spooled (no broker)", &base, &ids, 16).await;
    let _ = stop.send(());
    let _ = server.await;

    let app = loop {
        // The spooling app's ledger and spool files close as its last handles go.
        match App::build(&config(brokers, &prefix, dir.path(), true)).await {
            Ok(app) => break app,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let drainer = app.drainer().expect("a spooling app drains");
    let started = Instant::now();
    let drained = drainer.drain_all().await.expect("drain");
    let elapsed = started.elapsed();
    let rate = drained.entries as f64 / elapsed.as_secs_f64();
    println!(
        "{:<28} {:>6} deliveries  in lanes         {rate:>8.0} deliveries/s  ({:.2} s)",
        "spool drain (to Kafka)",
        drained.entries,
        elapsed.as_secs_f64(),
    );
    println!(
        "drain / live publish rate: {:.2} (held to at least 0.50: {})",
        rate / live,
        if rate >= live / 2.0 { "met" } else { "NOT MET" }
    );
}

/// Serves an app built from `config` on a loopback port.
async fn serve(
    config: &Config,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    // The ledger and spool files of the app served before close as its
    // last handles go.
    let mut tries = 0;
    let app = loop {
        match App::build(config).await {
            Ok(app) => break app,
            Err(_) if tries < 200 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("app: {error}"),
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.serve(listener, async {
        let _ = stopped.await;
    }));
    (base, stop, server)
}
