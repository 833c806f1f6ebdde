//! `posbridge rederive` on `POSBRIDGE_BENCH_ENTITIES` entities (default
//! 1 million), timed on the release posbridge:
//!
//! 1. the entities' records are written as an older build wrote them
//!    (schema v1, which has no product name, SKU, price or state; their raw
//!    bodies Mekari `product.created` webhooks), straight to the products
//!    topic, with the state headers;
//! 2. `rederive --dry-run --rate 0`: the ledger filled from the topics, then
//!    every record read, derived again and compared: every one differs;
//! 3. `rederive --rate 0`: every one published in its record's place;
//! 4. `rederive --rate 0` again: every key's record derives to itself, its
//!    v1 record passed over as superseded; nothing written.
//!
//! Each row: the run's own summary (records read, what became of them, its
//! seconds without the ledger's fill), its records per second, the
//! process's wall seconds (fill included), CPU and peak RSS.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

use crate::server::{Usage, free_addr};
use crate::v1;
use crate::{LedgerChoice, Settings, posbridge_command};

/// Records in flight while writing.
const IN_FLIGHT: usize = 10_000;

pub async fn run(settings: &Settings, run: &str) {
    let entities = crate::entities_from_env();
    let work = tempfile::tempdir().expect("work dir");
    let dir = work.path().join("rederive");
    let binary = Path::new(env!("CARGO_BIN_EXE_posbridge"));
    // The config (its topics `{run}.rederive.…`); serve itself never runs.
    let command = posbridge_command(
        settings,
        free_addr(),
        run,
        &LedgerChoice::Embedded(None),
        &dir,
        binary,
    );
    let config = command
        .get_args()
        .nth(2)
        .map(Path::new)
        .expect("the config argument")
        .to_owned();
    let topic = format!("{run}.rederive.products");
    let began = Instant::now();
    write_v1(settings, &topic, entities).await;
    println!(
        "written: {entities} v1 product records to {topic} in {:.0} s",
        began.elapsed().as_secs_f64()
    );
    println!(
        "{:<34} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10} {:>8} {:>9}",
        "rederive",
        "read",
        "differed",
        "published",
        "unchanged",
        "run s",
        "records/s",
        "wall s",
        "peak RSS"
    );
    for (label, args) in [
        ("dry run (fill, then every key)", &["--dry-run"][..]),
        ("publishing every key", &[][..]),
        ("again: nothing differs", &[][..]),
    ] {
        row(binary, &config, label, args).await;
    }
}

/// Runs `posbridge rederive` with `args` and prints its row.
async fn row(binary: &Path, config: &Path, label: &str, args: &[&str]) {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .arg("rederive")
        .arg("--config")
        .arg(config)
        .args(["--rate", "0", "--sample", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("posbridge rederive");
    let pid = child.id();
    let mut usage = Usage::default();
    while child.try_wait().expect("wait").is_none() {
        let now = Usage::of(pid);
        if now.peak_rss > 0 {
            usage = now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = started.elapsed();
    let out = child.wait_with_output().expect("its output");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|l| l.get("summary").cloned())
        .unwrap_or(Value::Null);
    let n = |field: &str| summary[field].as_u64().unwrap_or(0);
    let secs = summary["secs"].as_f64().unwrap_or(0.0);
    println!(
        "{label:<34} {:>9} {:>9} {:>10} {:>10} {secs:>9.1} {:>10.0} {:>8.1} {:>6} MiB{}",
        n("read"),
        n("differed"),
        n("published"),
        n("unchanged"),
        n("read") as f64 / secs.max(1e-9),
        wall.as_secs_f64(),
        usage.peak_rss >> 20,
        if summary["complete"] == true {
            ""
        } else {
            "  (stopped)"
        }
    );
}

/// Writes `entities` products as schema v1 wrote them.
async fn write_v1(settings: &Settings, topic: &str, entities: usize) {
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()
        .expect("admin client");
    let new = NewTopic::new(topic, settings.partitions, TopicReplication::Fixed(1))
        .set("cleanup.policy", "compact");
    for created in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .expect("create the topic")
    {
        created.expect("the topic");
    }
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let base = 1_795_946_400_000_000_i64;
    stream::iter(0..entities)
        .map(|n| {
            let micros = base + i64::try_from(n).expect("count") * 1000;
            let id = format!("P-{n}");
            let delivery = format!("v1-{n}");
            let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
                .expect("a time")
                .format(&time::format_description::well_known::Rfc3339)
                .expect("RFC 3339");
            let body = v1::product_created(&delivery, &id, &format!("Kopi {id}"), &at);
            let (key, value, headers) = v1::product_record(&body, micros);
            let producer = producer.clone();
            let topic = topic.to_owned();
            async move {
                producer
                    .send(
                        FutureRecord::to(&topic)
                            .key(&key)
                            .payload(&value)
                            .headers(headers),
                        Duration::from_secs(60),
                    )
                    .await
                    .expect("the broker takes it");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
}
