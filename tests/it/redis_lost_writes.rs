//! A Redis ledger that lost only its last writes, or was flushed while it
//! was being filled (issue 36, items 5 and 6), on a private `redis-server`:
//!
//! * restarted from its last RDB snapshot, it kept its generation mark and
//!   lost what came after the snapshot: posbridge sees the new `run_id`
//!   and reads the topics from the offsets the snapshot holds, so an older
//!   event is `stale` and a retry `duplicate`;
//! * promoted from a replica that had not received the last writes, the
//!   same: posbridge reads from the offsets the replica received;
//! * flushed in the middle of a fill, the fill starts again instead of
//!   marking a ledger that lost what it wrote.

use std::time::Duration;

use posbridge::config::{Config, LedgerBackend};
use posbridge::services::pipeline::{
    HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_STATE_HASH, HEADER_VERSION,
};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde_json::Value;

use crate::rebuild::status;
use crate::support::redis::RedisServer;
use crate::support::wait::wait_until;
use crate::support::{
    TestApp, brokers, config, free_port, kafka_only, mekari_order, read_topic, unique,
};

/// posbridge's config with its Redis ledger on `redis`.
fn on(redis: &RedisServer, prefix: &str, dir: &std::path::Path) -> Config {
    let mut config = config(&brokers(), prefix, dir);
    config.ledger.backend = LedgerBackend::Redis;
    config.ledger.redis_url = redis.url();
    config.ledger.redis_prefix = format!("{prefix}:");
    config
}

/// Waits until a replica's checkpoint in `redis` holds the offset past the
/// first record of `topic`'s partition 0: the state it wrote is covered.
async fn checkpointed(redis: &RedisServer, prefix: &str, topic: &str) {
    let key = format!("{prefix}:{{offsets}}:replicas");
    let field = format!("{topic}/0");
    wait_until(
        Duration::from_secs(10),
        "a checkpoint to record the first record's offset",
        async || {
            // HGETALL: replica, then its entry (the server's time, then JSON).
            redis.cli(&["HGETALL", &key]).await.lines().any(|line| {
                line.split_once(' ')
                    .and_then(|(_, json)| {
                        serde_json::from_str::<std::collections::BTreeMap<String, i64>>(json).ok()
                    })
                    .is_some_and(|offsets| offsets.get(&field).is_some_and(|next| *next >= 1))
            })
        },
    )
    .await;
}

/// An RFC 3339 time `minutes` ago: the order states, minutes apart.
fn ago(minutes: i64) -> String {
    (time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// The three states of `order`, "09:55", "10:01" and "10:05" (ids
/// `{tag}-0955`, …), all within the dedup window.
fn three_states(tag: &str, order: &str) -> [Value; 3] {
    [
        (10, "0955", "preparing"),
        (4, "1001", "ready"),
        (1, "1005", "served"),
    ]
    .map(|(minutes, at, kitchen)| {
        mekari_order(
            &format!("{tag}-{at}"),
            "order.updated",
            &ago(minutes),
            order,
            kitchen,
        )
    })
}

/// The order's records are `expected`, each once, the newest last. The
/// shared tansu compacts its topics every 5 s, so there the earlier states
/// of the key may be gone: what is read is then a suffix of `expected`,
/// never an older state after a newer one nor a state written twice.
fn assert_written(app: &TestApp, expected: [&str; 2]) {
    let records = read_topic(&brokers(), &app.topic("orders"));
    let written: Vec<&str> = records
        .iter()
        .map(|record| record.headers[HEADER_DELIVERY_ID].as_str())
        .collect();
    assert!(
        !written.is_empty() && expected.ends_with(&written),
        "{written:?} where {expected:?} (or, compacted, its end) was written"
    );
}

#[tokio::test]
async fn a_redis_restarted_from_its_last_snapshot_is_read_from_the_offsets_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let rdb = tempfile::tempdir().unwrap();
    let port = free_port();
    let rdb_dir = rdb.path().display().to_string();
    let args = ["--dir", &rdb_dir, "--dbfilename", "dump.rdb"];
    let redis = RedisServer::start(port, &args).await;
    let prefix = unique("rdb");
    let app = TestApp::start_with(on(&redis, &prefix, dir.path())).await;

    // "09:55", "10:01" and "10:05" of the issue, all within the dedup window.
    let [at_0955, at_1001, at_1005] = three_states("rdb", "ORD-RDB");
    assert_eq!(
        status(async || app.send("mekari", "main", &at_0955).await).await,
        "published"
    );
    // A checkpoint records the offsets, then Redis snapshots.
    checkpointed(&redis, &prefix, &app.topic("orders")).await;
    assert_eq!(redis.cli(&["SAVE"]).await.trim(), "OK");
    assert_eq!(
        status(async || app.send("mekari", "main", &at_1005).await).await,
        "published"
    );

    // Killed, and started again from dump.rdb on the same port: it holds
    // the 09:55 state and the generation mark, not the 10:05 state.
    drop(redis);
    let redis = RedisServer::start(port, &args).await;
    assert_ne!(
        redis.cli(&["DBSIZE"]).await.trim(),
        "0",
        "restarted from its snapshot"
    );

    assert_eq!(
        status(async || app.send("mekari", "main", &at_1001).await).await,
        "stale",
        "an older event than the 10:05 state the restarted Redis lost"
    );
    assert_eq!(
        status(async || app.send("mekari", "main", &at_1005).await).await,
        "duplicate",
        "the retry of the 10:05 delivery"
    );
    assert_written(&app, ["rdb-0955", "rdb-1005"]);
    app.stop().await;
    drop(redis);
}

/// The other ordinary way to lose only the last writes: a failover to a
/// replica that had not received them, posbridge then pointed at it.
#[tokio::test]
async fn a_replica_promoted_before_it_received_the_last_writes_is_read_from_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let primary = RedisServer::start(free_port(), &[]).await;
    let primary_port = primary.port.to_string();
    let replica =
        RedisServer::start(free_port(), &["--replicaof", "127.0.0.1", &primary_port]).await;
    let prefix = unique("promoted");
    let app = TestApp::start_with(on(&primary, &prefix, dir.path())).await;

    let [at_0955, at_1001, at_1005] = three_states("rep", "ORD-REP");
    assert_eq!(
        status(async || app.send("mekari", "main", &at_0955).await).await,
        "published"
    );
    // A checkpoint records the offsets, the replica receives everything so
    // far, and is promoted before the 10:05 publish.
    checkpointed(&primary, &prefix, &app.topic("orders")).await;
    assert_eq!(primary.cli(&["WAIT", "1", "5000"]).await.trim(), "1");
    assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]).await.trim(), "OK");
    assert_eq!(
        status(async || app.send("mekari", "main", &at_1005).await).await,
        "published"
    );
    app.stop().await;

    let app = TestApp::start_with(on(&replica, &prefix, dir.path())).await;
    assert_eq!(
        status(async || app.send("mekari", "main", &at_1001).await).await,
        "stale",
        "an older event than the 10:05 state the promoted replica never received"
    );
    assert_eq!(
        status(async || app.send("mekari", "main", &at_1005).await).await,
        "duplicate",
        "the retry of the 10:05 delivery"
    );
    assert_written(&app, ["rep-0955", "rep-1005"]);
    app.stop().await;
}

/// Records straight into the orders topic, each of its own order, with
/// the headers posbridge writes: what a fill reads.
pub(crate) async fn write_orders(topic: &str, count: usize) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("linger.ms", "20")
        .create()
        .unwrap();
    let at = time::OffsetDateTime::now_utc().unix_timestamp() * 1_000_000;
    for chunk in (0..count).collect::<Vec<_>>().chunks(5_000) {
        let sends = chunk.iter().map(|n| {
            let key = format!("mekari:F-{n:07}");
            let delivery = format!("fill-{n:07}");
            let version = format!("{at}:0");
            let hash = hex::encode([u8::try_from(n % 251).unwrap(); 16]);
            let producer = &producer;
            async move {
                let headers = OwnedHeaders::new()
                    .insert(Header {
                        key: HEADER_DELIVERY_ID,
                        value: Some(&delivery),
                    })
                    .insert(Header {
                        key: HEADER_PROVIDER,
                        value: Some("mekari"),
                    })
                    .insert(Header {
                        key: HEADER_VERSION,
                        value: Some(&version),
                    })
                    .insert(Header {
                        key: HEADER_STATE_HASH,
                        value: Some(&hash),
                    });
                producer
                    .send(
                        FutureRecord::to(topic)
                            .key(&key)
                            .payload("{}")
                            .headers(headers),
                        Duration::from_secs(30),
                    )
                    .await
                    .unwrap();
            }
        });
        futures::future::join_all(sends).await;
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// How many entity states the ledger under `prefix` holds.
async fn entity_keys(redis: &mut redis::aio::MultiplexedConnection, prefix: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:entity:*"))
        .query_async(redis)
        .await
        .unwrap();
    keys.len()
}

/// Apache Kafka only: 30,000 records written into tansu 0.6's SQLite
/// storage left the shared broker answering no metadata request for every
/// test after it (seen in CI); what the fill does with a flush is the
/// ledger's, the same on either broker.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_redis_flushed_in_the_middle_of_a_fill_is_filled_again() {
    kafka_only("30,000 records into tansu 0.6's SQLite storage stall the shared broker");
    const ORDERS: usize = 30_000;
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(free_port(), &[]).await;
    let prefix = unique("midfill");
    let config = on(&redis, &prefix, dir.path());
    // A first life makes the topics.
    let app = TestApp::start_with(config.clone()).await;
    let orders = app.topic("orders");
    app.stop().await;
    write_orders(&orders, ORDERS).await;
    assert_eq!(redis.cli(&["FLUSHALL"]).await.trim(), "OK");

    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // FLUSHALL again once a part of the orders is back, while the fill
    // writes the rest.
    let flusher = {
        let mut conn = conn.clone();
        async move {
            // The test's own server: its keys are the ledger's.
            wait_until(
                Duration::from_secs(120),
                "the fill to write a quarter of the orders",
                async || {
                    let keys: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
                    keys >= ORDERS / 4
                },
            )
            .await;
            let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        }
    };
    let (app, ()) = tokio::join!(TestApp::start_with(config), flusher);
    wait_until(
        Duration::from_secs(180),
        "the ledger to be filled",
        async || {
            let ready: Value = app.get("/readyz").await.json().await.unwrap();
            ready["ledger_rebuild"]["running"] == false && ready["ledger"] == "ok"
        },
    )
    .await;
    assert_eq!(
        entity_keys(&mut conn, &prefix).await,
        ORDERS,
        "every order's state is in Redis once the gate opens"
    );
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert!(
        ready["ledger_rebuild"]["restarted"].as_u64() >= Some(1),
        "the fill said it started again: {ready}"
    );
    app.stop().await;
}
