//! A Redis ledger that answers but refuses writes, and one that is gone, on
//! a `redis-server` of the test's own (its memory limit and its life are
//! the test's to change; the suite's shared Redis serves other tests).
//!
//! * At `maxmemory` under `noeviction` Redis answers PING and refuses every
//!   lease (`OOM command not allowed`): `/readyz` and the answers must say
//!   so, and recover once Redis takes writes again. (The gauge
//!   `posbridge_ledger_writable` is one series for the whole test process,
//!   where other apps run beside this one: `ledger::fence`'s unit test reads
//!   it on a recorder of its own.)
//! * With Redis gone, a replica whose ReceiptRoller source spools still
//!   accepts (into the spool): `/readyz` stays 200 (`degraded`), so a load
//!   balancer keeps sending it what it can take.
//! * A Redis that may evict posbridge's keys (`maxmemory-policy` other than
//!   `noeviction`) is refused at start and, set so later, on `/readyz`,
//!   unless `ledger.redis_allow_eviction` takes the risk.

use std::time::Duration;

use posbridge::config::{Config, LedgerBackend};
use serde_json::Value;

use crate::support::ports::free_port;
use crate::support::redis::RedisServer;
use crate::support::wait::wait_until;
use crate::support::{TestApp, brokers, config, mekari_order, rr_sale, spool_config, unique};

/// A private Redis under posbridge's eviction rule (or `policy`).
async fn own_redis(port: u16, policy: &str) -> RedisServer {
    RedisServer::start(port, &["--maxmemory-policy", policy]).await
}

/// `config` with its ledger on this Redis.
fn on_redis(redis: &RedisServer, prefix: &str, mut config: Config) -> Config {
    config.ledger.backend = LedgerBackend::Redis;
    config.ledger.redis_url = redis.url();
    config.ledger.redis_prefix = format!("{prefix}:");
    config
}

fn order(event_id: &str, order_id: &str) -> Value {
    mekari_order(
        event_id,
        "order.created",
        "2026-11-30T10:00:00Z",
        order_id,
        "pending",
    )
}

async fn readiness(app: &TestApp) -> (u16, Value) {
    let ready = app.get("/readyz").await;
    let status = ready.status().as_u16();
    (status, ready.json().await.unwrap())
}

#[tokio::test]
async fn a_redis_that_refuses_writes_is_shown_unwritable_and_heals_without_a_restart() {
    let redis = own_redis(free_port(), "noeviction").await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("redisoom");
    let app = TestApp::start_with(on_redis(
        &redis,
        &prefix,
        config(&brokers(), &prefix, dir.path()),
    ))
    .await;
    assert_eq!(readiness(&app).await.0, 200);

    // Any memory in use is above one byte: every write is refused from now.
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let refused = app.send("mekari", "main", &order("oom-1", "ORD-1")).await;
    assert_eq!(refused.status(), 503, "{}", refused.text().await.unwrap());
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["ledger"].as_str().unwrap_or_default().contains("OOM"),
        "{body}"
    );

    // Room again: readiness, the gauge and the delivery's retry recover.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).await;
    wait_until(
        Duration::from_secs(20),
        "/readyz to be 200 again",
        async || readiness(&app).await.0 == 200,
    )
    .await;
    let retried = app.send("mekari", "main", &order("oom-1", "ORD-1")).await;
    assert_eq!(
        retried.json::<Value>().await.unwrap()["status"],
        "published"
    );
}

#[tokio::test]
async fn with_redis_gone_a_replica_whose_source_spools_stays_ready_and_spools() {
    let port = free_port();
    let redis = own_redis(port, "noeviction").await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("redisgone");
    let app = TestApp::start_with(on_redis(
        &redis,
        &prefix,
        spool_config(&brokers(), &prefix, dir.path()),
    ))
    .await;
    drop(redis);

    let sale = rr_sale(
        "gone-1",
        "sale.created",
        "2026-11-30T10:00:00Z",
        "T1|2026-11|9",
        1200,
    );
    let spooled = app.send("receiptroller", "main", &sale).await;
    assert_eq!(
        spooled.json::<Value>().await.unwrap()["status"],
        "spooled",
        "ReceiptRoller's delivery goes to the spool while the ledger is gone"
    );
    let refused = app.send("mekari", "main", &order("gone-2", "ORD-2")).await;
    assert_eq!(refused.status(), 503, "Mekari (retry) is told to come back");
    let (status, body) = readiness(&app).await;
    assert_eq!(
        status, 200,
        "a load balancer must keep sending what the spool takes: {body}"
    );
    assert_eq!(body["status"], "degraded", "{body}");
    assert_ne!(body["ledger"], "ok", "{body}");

    // Redis back (empty, on the same port): the spool drains through it.
    let _redis = own_redis(port, "noeviction").await;
    wait_until(Duration::from_secs(20), "the spool to drain", async || {
        readiness(&app).await.1["spool"]["entries"] == 0
    })
    .await;
    // A check that began before the fill wrote the mark may find the ledger
    // lost once more and fill it again (nothing to read): ready after that.
    wait_until(
        Duration::from_secs(20),
        "the ledger to be ready",
        async || {
            let (status, body) = readiness(&app).await;
            status == 200 && body["status"] == "ok"
        },
    )
    .await;
}

#[tokio::test]
async fn a_redis_that_may_evict_our_keys_is_refused_unless_the_risk_is_taken() {
    let redis = own_redis(free_port(), "allkeys-lru").await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("redisevict");
    let mut config = on_redis(&redis, &prefix, config(&brokers(), &prefix, dir.path()));
    let refused = posbridge::app::App::build(&config)
        .await
        .err()
        .expect("an evicting Redis was taken");
    // The whole chain, as `serve` prints it.
    let refused = format!("{:#}", anyhow::Error::new(refused));
    assert!(
        refused.contains("maxmemory-policy allkeys-lru"),
        "{refused}"
    );

    config.ledger.redis_allow_eviction = true;
    let taken = TestApp::start_with(config.clone()).await;
    assert_eq!(readiness(&taken).await.0, 200, "the risk, taken");
    taken.stop().await;

    // Set to evict under a running posbridge: /readyz says so.
    redis
        .cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        .await;
    config.ledger.redis_allow_eviction = false;
    let app = TestApp::start_with(config).await;
    assert_eq!(readiness(&app).await.0, 200);
    redis
        .cli(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"])
        .await;
    // The policy is read again every few seconds, not on every probe.
    wait_until(
        Duration::from_secs(20),
        "/readyz to see the policy",
        async || readiness(&app).await.0 == 503,
    )
    .await;
    let (status, body) = readiness(&app).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["ledger"]
            .as_str()
            .unwrap_or_default()
            .contains("maxmemory-policy volatile-lru"),
        "{body}"
    );
}

/// A Redis whose user may not run `INFO` (a least-privilege ACL without
/// `@dangerous`): the policy cannot be read, which is said, and the ledger
/// still starts and is ready.
#[tokio::test]
async fn a_redis_that_refuses_info_is_still_taken() {
    let redis = own_redis(free_port(), "noeviction").await;
    redis
        .cli(&[
            "ACL",
            "SETUSER",
            "posbridge",
            "on",
            ">secret",
            "~*",
            "+@all",
            "-@dangerous",
        ])
        .await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("redisacl");
    let mut config = on_redis(&redis, &prefix, config(&brokers(), &prefix, dir.path()));
    config.ledger.redis_url = format!("redis://posbridge:secret@127.0.0.1:{}", redis.port);
    let app = TestApp::start_with(config).await;
    let (status, body) = readiness(&app).await;
    assert_eq!(
        (status, &body["ledger"]),
        (200, &Value::from("ok")),
        "{body}"
    );
}
