//! Filling ledgers fast for the scale run, through the ledger's own commit
//! (the keys and values a real delivery leaves), with many commits in flight:
//! `ids` done delivery ids, the first `entities` of them with an entity
//! state, and before them `expired` ids whose time is already up (a
//! minute's worth at the bench's rate), so the sweep has work to do.
//! A bench helper, not a production command.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use posbridge::adapters::ledger::{
    self, Answered, Commit, Done, EntitySlot, Held, Ledger, Recorded,
};
use posbridge::config::{LedgerBackend, LedgerConfig};
use posbridge::domain::event::{DeliveryKey, EntityKey, EntityType, ProviderKind, Version};
use posbridge::domain::guard::EntityState;

/// Commits in flight while filling.
const IN_FLIGHT: usize = 4096;
/// A lease long enough for any commit here.
const LEASE: Duration = Duration::from_secs(60);

/// How much to remember.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    ids: usize,
    entities: usize,
    expired: usize,
}

impl Size {
    /// `POSBRIDGE_BENCH_IDS`, `POSBRIDGE_BENCH_ENTITIES`; expired: a minute
    /// at 4,000 deliveries a second.
    pub fn from_env() -> Size {
        let var = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Size {
            ids: var("POSBRIDGE_BENCH_IDS", 10_000_000),
            entities: var("POSBRIDGE_BENCH_ENTITIES", 1_000_000),
            expired: 240_000,
        }
    }
}

fn config(backend: LedgerBackend, dedup_ttl_secs: u64) -> LedgerConfig {
    LedgerConfig {
        backend,
        dedup_ttl_secs,
        ..LedgerConfig::default()
    }
}

/// Commits ids `from..to` (with entity states below `size.entities`).
async fn commit_range(ledger: &Arc<Ledger>, from: usize, to: usize, size: Size, tag: &str) {
    let at = time::OffsetDateTime::now_utc();
    stream::iter(from..to)
        .map(|n| {
            let ledger = ledger.clone();
            let delivery = DeliveryKey::new(ProviderKind::ReceiptRoller, &format!("{tag}-{n:09}"));
            let entity = (n < size.entities).then(|| {
                let key = EntityKey::new(
                    ProviderKind::ReceiptRoller,
                    None,
                    &format!("T1|{tag}|{n:09}"),
                );
                let mut state_hash = [0u8; 16];
                state_hash[..8].copy_from_slice(&(n as u64).to_be_bytes());
                let state = EntityState {
                    version: Version::new(at, 0),
                    state_hash,
                };
                let held = Held {
                    state,
                    offset: Some(n as i64),
                };
                (EntitySlot::new(EntityType::Sale, &key), held)
            });
            async move {
                ledger
                    .commit(match entity {
                        Some((slot, held)) => {
                            Commit::done(published(delivery, n)).and_state(slot, held)
                        }
                        None => Commit::done(published(delivery, n)),
                    })
                    .await
                    .expect("fill commit");
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<()>()
        .await;
    ledger.persist().await.expect("fill checkpoint");
}

/// Opens the embedded ledger at `path`, once its last user let go of it.
async fn open_embedded(path: &Path, dedup_ttl_secs: u64) -> Arc<Ledger> {
    let config = LedgerConfig {
        path: path.to_owned(),
        ..config(LedgerBackend::Embedded, dedup_ttl_secs)
    };
    loop {
        // The checkpoint thread holds the file until its last handle goes.
        match ledger::open(&config, LEASE).await {
            Ok(opened) => return opened.ledger,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Fills an embedded ledger at `path`, prints its size and what its purge
/// costs, and returns the path.
pub async fn embedded(path: &Path, size: Size) -> PathBuf {
    let started = Instant::now();
    let ledger = open_embedded(path, 1).await;
    commit_range(&ledger, 0, size.expired, size, "expired").await;
    drop(ledger);
    let ledger = open_embedded(path, 24 * 3600).await;
    commit_range(&ledger, 0, size.ids, size, "fill").await;
    drop(ledger);
    let bytes = std::fs::metadata(path).expect("ledger file").len();
    println!(
        "embedded ledger: {} ids ({} entities, {} expired) in {:.0} s; {:.0} MiB on disk, {:.0} MiB per million ids",
        size.ids + size.expired,
        size.entities,
        size.expired,
        started.elapsed().as_secs_f64(),
        bytes as f64 / 1048576.0,
        bytes as f64 / 1048576.0 / ((size.ids + size.expired) as f64 / 1e6),
    );
    purge_cost(path).await;
    path.to_owned()
}

/// Times the checkpoint, the one durable write left, on the filled ledger
/// (its sweep deleting expired ids as it goes) and on an empty one: ten
/// rounds of a second's new deliveries at the bench's rates taken in memory,
/// then made durable. A commit itself only writes memory; what a filled
/// B-tree costs shows in the checkpoint.
async fn purge_cost(path: &Path) {
    // Expired ids expire to the second.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let filled = checkpoint_times(path).await;
    let empty_dir = tempfile::tempdir().expect("temp dir");
    let empty = checkpoint_times(&empty_dir.path().join("empty.redb")).await;
    println!(
        "embedded checkpoint of {CHECKPOINT_WRITES} new deliveries: filled ledger, its sweep deleting expired ids {filled}; empty ledger {empty}"
    );
}

/// `delivery` done as a live one is: published now, at a place on the
/// sales topic (the ledger keeps both with the id).
fn published(delivery: DeliveryKey, n: usize) -> Done {
    Done {
        key: delivery,
        answered: Answered::now(
            Recorded::Published,
            Some(posbridge::domain::record_at::RecordAt::new(
                "sales",
                (n % 6) as i32,
                n as i64,
            )),
        ),
        read_back: false,
    }
}

/// New deliveries per timed checkpoint: about a second's at the bench's rates.
const CHECKPOINT_WRITES: usize = 10_000;

/// Ten checkpoints of [`CHECKPOINT_WRITES`] new deliveries each, described.
async fn checkpoint_times(path: &Path) -> String {
    let ledger = open_embedded(path, 24 * 3600).await;
    let mut times = Vec::new();
    for round in 0..10 {
        for n in 0..CHECKPOINT_WRITES {
            let delivery =
                DeliveryKey::new(ProviderKind::ReceiptRoller, &format!("timed-{round}-{n}"));
            ledger
                .commit(Commit::done(published(delivery, n)))
                .await
                .expect("commit");
        }
        let started = Instant::now();
        ledger.persist().await.expect("checkpoint");
        times.push(started.elapsed());
    }
    times.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "p50 {:.1} ms, max {:.1} ms",
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1])
    )
}

/// Fills Redis under `prefix` and prints the memory it took.
pub async fn redis(url: &str, prefix: &str, size: Size) {
    let client = redis::Client::open(url).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let used = |info: String| {
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .expect("info");
    let started = Instant::now();
    let config = |ttl| LedgerConfig {
        redis_url: url.to_owned(),
        redis_prefix: prefix.to_owned(),
        ..config(LedgerBackend::Redis, ttl)
    };
    let ledger = ledger::open(&config(1), LEASE)
        .await
        .expect("redis ledger")
        .ledger;
    commit_range(&ledger, 0, size.expired, size, "expired").await;
    let ledger = ledger::open(&config(24 * 3600), LEASE)
        .await
        .expect("redis ledger")
        .ledger;
    commit_range(&ledger, 0, size.ids, size, "fill").await;
    let after: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .expect("info");
    let bytes = used(after).saturating_sub(used(before));
    println!(
        "redis ledger: {} ids ({} entities) in {:.0} s; {:.0} MiB of Redis memory, {:.0} MiB per million ids (expired ids are Redis's own to delete)",
        size.ids,
        size.entities,
        started.elapsed().as_secs_f64(),
        bytes as f64 / 1048576.0,
        bytes as f64 / 1048576.0 / (size.ids as f64 / 1e6),
    );
}
