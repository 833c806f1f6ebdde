//! The Redis ledger: the same delivery protocol shared by several posbridge
//! processes, against a real Redis (`POSBRIDGE_TEST_REDIS`, set by
//! `scripts/test`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use posbridge::adapters::encode::decode;
use posbridge::adapters::ledger::{
    Begin, Commit, Done, EntitySlot, Exclusive, Held, RedisLedger, Store,
};
use posbridge::config::LedgerBackend;
use posbridge::domain::event::{DeliveryKey, EntityKey, EntityType, ProviderKind, Version};
use posbridge::domain::guard::EntityState;

use crate::support::ports::free_port;
use crate::support::redis::{RedisServer, calls, waited_for_a_held_lock};
use crate::support::wait::{look_for, wait_until};
use crate::support::{
    TestApp, brokers, config, kafka_only, latest_per_key, mekari_order, read_topic, rr_sale, unique,
};

pub(crate) fn redis_url() -> String {
    std::env::var("POSBRIDGE_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A Redis ledger under `prefix`, marked as filled from the topics (there
/// are none here): without its generation mark it decides nothing.
async fn ledger(prefix: &str) -> RedisLedger {
    ledger_leasing(prefix, Duration::from_secs(10)).await
}

/// [`ledger`] whose locks and leases hold `lease` unless renewed.
async fn ledger_leasing(prefix: &str, lease: Duration) -> RedisLedger {
    ledger_at(&redis_url(), prefix, lease).await
}

/// A Redis ledger on the server at `url` under `prefix`, marked as filled.
async fn ledger_at(url: &str, prefix: &str, lease: Duration) -> RedisLedger {
    let ledger = RedisLedger::connect(url, prefix, Duration::from_secs(3600), lease, None, false)
        .await
        .expect("a Redis server");
    crate::support::redis::mark_filled(&ledger).await;
    ledger
}

/// Two replicas' ledgers on one Redis, under a prefix of their own named
/// after `name`, whose locks hold `lease` unless renewed.
async fn two_replicas_leasing(name: &str, lease: Duration) -> (RedisLedger, RedisLedger) {
    let prefix = format!("{}:", unique(name));
    (
        ledger_leasing(&prefix, lease).await,
        ledger_leasing(&prefix, lease).await,
    )
}

fn state(at_micros: i64, hash: u8) -> Held {
    Held {
        state: EntityState {
            version: Version { at_micros, rank: 0 },
            state_hash: [hash; 16],
        },
        offset: Some(at_micros),
    }
}

#[tokio::test]
async fn the_redis_ledger_keeps_the_delivery_protocol() {
    let ledger = ledger(&format!("{}:", unique("ledger"))).await;
    let id = DeliveryKey::new(ProviderKind::Mekari, "e1");
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::InFlight);
    ledger.release(&id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);

    let slot = EntitySlot::new(
        EntityType::Order,
        &EntityKey::new(ProviderKind::Mekari, None, "O-1"),
    );
    ledger
        .commit(
            &Commit::done(Done::published_now(id.clone()))
                .and_state(slot.clone(), state(200, 1))
                .and_checkpoint("mekari/main/OUT-1/orders", 77),
        )
        .await
        .unwrap();
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    // A dead letter's replay leases a done delivery (a live retry of it is
    // a duplicate either way), and a second replay waits for the first.
    assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::New);
    assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::InFlight);
    ledger.release(&id).await;
    assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
    assert_eq!(ledger.entity(&slot).await.unwrap(), Some(state(200, 1)));
    assert_eq!(
        ledger.checkpoint("mekari/main/OUT-1/orders").await.unwrap(),
        Some(77)
    );

    // Even a writer whose lock lapsed cannot roll the version back.
    ledger
        .commit(&Commit::state(slot.clone(), state(100, 2)))
        .await
        .unwrap();
    assert_eq!(ledger.entity(&slot).await.unwrap(), Some(state(200, 1)));
    ledger.check().await.unwrap();
}

/// A done delivery is remembered with what it was answered; an answer a fill
/// reads back from its record keeps the one held (it knows less: an entity
/// record's time is its event's), and is written where none is held.
#[tokio::test]
async fn the_redis_ledger_remembers_each_answer_and_a_fill_keeps_the_one_held() {
    use posbridge::adapters::ledger::{Answered, Recorded, Remembered};
    use posbridge::domain::record_at::RecordAt;
    let ledger = ledger(&format!("{}:", unique("answers"))).await;
    let place = |offset| Some(RecordAt::new("pos.orders", 2, offset));
    let answered = Answered {
        outcome: Recorded::Published,
        at_micros: 1_764_000_000_000_001,
        place: place(5),
    };
    let read_back = Answered {
        at_micros: 0,
        ..answered.clone()
    };
    let commit = |id: &DeliveryKey, answered: &Answered, read_back: bool| {
        Commit::done(Done {
            key: id.clone(),
            answered: answered.clone(),
            read_back,
        })
    };
    let held = DeliveryKey::new(ProviderKind::Mekari, "answered");
    let lost = DeliveryKey::new(ProviderKind::Mekari, "lost");
    let remembered = async |id: &DeliveryKey| match ledger.remembered(id).await.unwrap() {
        Remembered::Done { answered, until } => {
            assert!(until.is_some(), "a dedup TTL");
            answered
        }
        other => panic!("{id}: {other:?}"),
    };
    ledger
        .commit(&commit(&held, &answered, false))
        .await
        .unwrap();
    assert_eq!(remembered(&held).await, answered);
    ledger
        .commit(&commit(&held, &read_back, true))
        .await
        .unwrap();
    assert_eq!(
        remembered(&held).await,
        answered,
        "the answer given is kept"
    );
    ledger
        .commit(&commit(&lost, &read_back, true))
        .await
        .unwrap();
    assert_eq!(remembered(&lost).await, read_back, "written where none was");
    assert_eq!(
        ledger
            .remembered(&DeliveryKey::new(ProviderKind::Mekari, "never"))
            .await
            .unwrap(),
        Remembered::Nothing
    );
}

/// Without its generation mark (new, or its keys lost to a FLUSHALL) the
/// ledger decides nothing: the lease and the guard read say it is lost,
/// while the rebuild's lock is still taken.
#[tokio::test]
async fn a_redis_ledger_without_its_generation_mark_decides_nothing() {
    let prefix = format!("{}:", unique("unmarked"));
    let marked = ledger(&prefix).await;
    let delivery = DeliveryKey::new(ProviderKind::Mekari, "d-unmarked");
    let slot = EntitySlot::new(
        EntityType::Order,
        &EntityKey::new(ProviderKind::Mekari, None, "O-unmarked"),
    );
    assert_eq!(marked.begin(&delivery).await.unwrap(), Begin::New);
    marked.release(&delivery).await;

    let mut redis = redis::Client::open(redis_url().as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    // Where every version kept it: a replica of an older version and one
    // of this version, side by side while a deployment upgrades, must find
    // the same mark.
    let mark = format!("{prefix}checkpoint:posbridge:rebuilt-from-topics");
    let removed: i32 = redis::cmd("DEL").arg(&mark).query(&mut redis).unwrap();
    assert_eq!(removed, 1, "the mark is where the ledger keeps it");
    assert!(matches!(
        marked.begin(&delivery).await,
        Err(posbridge::adapters::ledger::LedgerError::Lost)
    ));
    assert!(matches!(
        marked.lock_and_read(&slot).await,
        Err(posbridge::adapters::ledger::LedgerError::Lost)
    ));
    assert_eq!(marked.generation_mark().await.unwrap(), None);
    drop(marked.exclusive(Exclusive::Fill).await.unwrap());
}

#[tokio::test]
async fn an_entity_lock_excludes_a_second_holder_until_released_and_reads_the_state_under_it() {
    let prefix = format!("{}:", unique("lock"));
    let (a, b) = (ledger(&prefix).await, ledger(&prefix).await);
    let slot = EntitySlot::new(
        EntityType::Product,
        &EntityKey::new(ProviderKind::Mekari, None, "P-1"),
    );
    let (held, _) = a.lock_and_read(&slot).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(300), b.lock_and_read(&slot)).await;
    assert!(
        waiting.is_err(),
        "the second process waits while the first holds the lock"
    );
    a.commit(&Commit::state(slot.clone(), state(300, 3)))
        .await
        .unwrap();
    drop(held);
    let (held, read) = tokio::time::timeout(Duration::from_secs(2), b.lock_and_read(&slot))
        .await
        .expect("released locks can be taken")
        .unwrap();
    assert_eq!(
        read,
        Some(state(300, 3).state),
        "the state read under the lock"
    );
    let waiting = tokio::time::timeout(Duration::from_millis(300), a.lock_and_read(&slot)).await;
    assert!(waiting.is_err(), "a lock taken with its state excludes too");
    drop(held);
    tokio::time::timeout(Duration::from_secs(2), a.lock_and_read(&slot))
        .await
        .expect("released locks can be taken")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_sharing_redis_publish_each_delivery_once_and_never_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("replicas");
    let mut shared = config(&brokers(), &prefix, dir.path());
    shared.ledger.backend = LedgerBackend::Redis;
    shared.ledger.redis_url = redis_url();
    shared.ledger.redis_prefix = format!("{prefix}:");
    // Two processes on one configuration: impossible with the embedded ledger.
    let first = TestApp::start_with(shared.clone()).await;
    let second = TestApp::start_with(shared).await;

    let sale = rr_sale(
        "rep-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|501",
        500,
    );
    let sends = (0..10).map(|i| {
        let replica = if i % 2 == 0 { &first } else { &second };
        replica.send(
            "receiptroller",
            if i % 3 == 0 { "backup" } else { "main" },
            &sale,
        )
    });
    let mut published = 0;
    for response in join_all(sends).await {
        assert_eq!(response.status(), 200);
        if response.json::<serde_json::Value>().await.unwrap()["status"] == "published" {
            published += 1;
        }
    }
    assert_eq!(published, 1);
    assert_eq!(read_topic(&brokers(), &first.topic("sales")).len(), 1);

    let newer = mekari_order(
        "rep-o2",
        "order.updated",
        "2026-11-29T17:20:00+07:00",
        "ORD-R",
        "ready",
    );
    let older = mekari_order(
        "rep-o1",
        "order.updated",
        "2026-11-29T17:10:00+07:00",
        "ORD-R",
        "preparing",
    );
    assert_eq!(first.send("mekari", "main", &newer).await.status(), 200);
    let late = second.send("mekari", "main", &older).await;
    assert_eq!(
        late.json::<serde_json::Value>().await.unwrap()["status"],
        "stale"
    );
    let view = latest_per_key(&read_topic(&brokers(), &first.topic("orders")));
    let latest = decode(view["mekari:ORD-R"].payload.as_deref().unwrap()).unwrap();
    assert_eq!(latest.kitchen_status.as_deref(), Some("ready"));
    first.stop().await;
    second.stop().await;
}

/// The rebuild's lock is renewed while it is held: a holder that keeps it
/// five leases long still holds it, and a second replica waits for it
/// rather than fill at the same time; once dropped, it is taken at once.
/// Its key is the one older versions took for the fill (an entity lock on a
/// sale named after the mark), so they exclude each other while a
/// deployment upgrades.
#[tokio::test]
async fn the_rebuild_lock_held_longer_than_its_lease_is_renewed_and_a_second_replica_waits() {
    let (a, b) = two_replicas_leasing("renewed", Duration::from_millis(300)).await;
    let held = a.exclusive(Exclusive::Fill).await.unwrap();
    let older_versions_lock =
        EntitySlot::of_record_key(EntityType::Sale, "posbridge:rebuilt-from-topics");
    let waiting = tokio::time::timeout(
        Duration::from_millis(300),
        b.lock_and_read(&older_versions_lock),
    )
    .await;
    assert!(
        waiting.is_err(),
        "an older version's replica waits for the rebuild's lock"
    );
    // A point on the lease's timeline, not a wait for an event: Redis
    // expires the key on its own clock, and what is tested is that nothing
    // happens (the lock is still held) five leases later.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let waiting =
        tokio::time::timeout(Duration::from_millis(600), b.exclusive(Exclusive::Fill)).await;
    assert!(
        waiting.is_err(),
        "the lock lapsed under its holder after its 300 ms lease"
    );
    drop(held);
    drop(
        tokio::time::timeout(Duration::from_secs(2), b.exclusive(Exclusive::Fill))
            .await
            .expect("a dropped lock is released")
            .unwrap(),
    );
}

/// Two rederive runs on one Redis ledger would move the same checkpoints:
/// while one process runs one, another's is refused at once, not made to
/// wait; once it ends, the next may run. (Its lease is renewed while held
/// by the same code as the rebuild's lock, whose test above holds one past
/// five leases.)
#[tokio::test]
async fn a_second_rederive_run_on_one_redis_ledger_is_refused_while_one_runs() {
    let (a, b) = two_replicas_leasing("rederive-lock", Duration::from_millis(300)).await;
    let running = a.exclusive(Exclusive::Rederive).await.unwrap();
    assert!(running.is_some(), "the first run takes the lock");
    assert!(
        b.exclusive(Exclusive::Rederive).await.unwrap().is_none(),
        "a second run, from another process, is refused"
    );
    let fill = tokio::time::timeout(Duration::from_secs(2), b.exclusive(Exclusive::Fill))
        .await
        .expect("a fill is not held back by a rederive run")
        .unwrap();
    drop(fill);
    drop(running);
    let next = look_for(Duration::from_secs(2), async || {
        b.exclusive(Exclusive::Rederive).await.unwrap()
    })
    .await;
    assert!(next.is_some(), "the next run may run once the first ended");
}

/// Two replicas start together on a Redis without the generation mark,
/// beside topics long enough that filling them outlasts the rebuild lock's
/// lease several times (a lease of 600 ms: twice `kafka.delivery_timeout_ms`
/// plus `server.inflight_wait_ms`). One fills the ledger whole under the
/// lock, renewed while it runs; the other waits for it, then finds the mark
/// and reads on from the offsets the first recorded: nothing. Were the lock
/// let go with its lease, the second would take it mid-fill, find no mark
/// and fill whole at the same time. Apache Kafka only, as
/// `redis_lost_writes`' fill: tansu 0.6's storage stalls under this many
/// records.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_fill_that_outlasts_its_locks_lease_keeps_it_and_a_second_replica_waits() {
    kafka_only("100,000 records into tansu 0.6's SQLite storage stall the shared broker");
    const ORDERS: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("longfill");
    let mut shared = config(&brokers(), &prefix, dir.path());
    // A first life, on the embedded ledger, makes the topics.
    let app = TestApp::start_with(shared.clone()).await;
    let orders = app.topic("orders");
    app.stop().await;
    crate::redis_lost_writes::write_orders(&orders, ORDERS).await;

    shared.ledger.backend = LedgerBackend::Redis;
    shared.ledger.redis_url = redis_url();
    shared.ledger.redis_prefix = format!("{prefix}:");
    shared.kafka.delivery_timeout_ms = 250;
    shared.server.inflight_wait_ms = 100;
    let lease = Duration::from_millis(2 * 250 + 100);
    let (first, second) = tokio::join!(
        TestApp::start_with(shared.clone()),
        TestApp::start_with(shared)
    );
    let mut fills = Vec::new();
    for replica in [&first, &second] {
        wait_until(
            Duration::from_secs(300),
            "the ledger to be filled",
            async || {
                let ready: serde_json::Value = replica.get("/readyz").await.json().await.unwrap();
                ready["ledger_rebuild"]["running"] == false && ready["ledger"] == "ok"
            },
        )
        .await;
        let ready: serde_json::Value = replica.get("/readyz").await.json().await.unwrap();
        fills.push(ready["ledger_rebuild"].clone());
    }
    fills.sort_by_key(|fill| fill["records_read"].as_u64());
    let (waited, filled) = (&fills[0], &fills[1]);
    assert_eq!(
        filled["records_read"].as_u64(),
        Some(ORDERS as u64),
        "one replica filled the ledger whole: {fills:?}"
    );
    let secs = filled["secs"].as_f64().unwrap();
    assert!(
        secs > 3.0 * lease.as_secs_f64(),
        "the fill ({secs} s) outlasted the lock's {lease:?} lease several times: {fills:?}"
    );
    assert_eq!(
        waited["records_read"].as_u64(),
        Some(0),
        "the other waited for it and read on from its offsets instead of filling at the same time: {fills:?}"
    );
    first.stop().await;
    second.stop().await;
}

/// The deliveries of one entity in one process wait for its lock in a
/// queue of their own, each handed the shared lock by the one before: no
/// waiter polls Redis while another holds it, and no turn releases and
/// takes it again. Ten waiters behind a holder of 200 ms cost a script call
/// each, not one every 5 ms (438 with the polling it replaced), counted by
/// the server (its `INFO commandstats`, the difference over the test, on a
/// Redis of the test's own).
#[tokio::test]
async fn one_entitys_deliveries_in_one_process_take_its_lock_in_turn_without_polling() {
    let redis = RedisServer::start(free_port(), &[]).await;
    let ledger = Arc::new(ledger_at(&redis.url(), "turns:", Duration::from_secs(10)).await);
    let slot = EntitySlot::of_record_key(EntityType::Sale, "receiptroller:T1|2026-12|1");
    let script_calls = async || {
        let stats = redis.cli(&["INFO", "commandstats"]).await;
        calls(&stats, |l| {
            l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:")
        })
    };
    let (held, _) = ledger.lock_and_read(&slot).await.unwrap();
    let before = script_calls().await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiters: Vec<_> = (0..10)
        .map(|n| {
            let (ledger, slot, order) = (ledger.clone(), slot.clone(), order.clone());
            tokio::spawn(async move {
                let (lock, _) = ledger.lock_and_read(&slot).await.unwrap();
                order.lock().unwrap().push(n);
                drop(lock);
            })
        })
        .collect();
    // A stretch of time, not a wait for an event: what is counted is what
    // the waiters do while the lock is held (a poller calls every 5 ms; a
    // queue, nothing), and nothing marks its end but the clock.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(order.lock().unwrap().is_empty(), "the lock was held");
    drop(held);
    join_all(waiters).await.into_iter().for_each(Result::unwrap);
    assert_eq!(order.lock().unwrap().len(), 10);
    let calls = script_calls().await - before;
    assert!(
        calls <= 15,
        "{calls} script calls for ten turns handed on: a renewal each, the last one's release"
    );
    // The last turn let the lock go: another process takes it at once.
    let other = ledger_at(&redis.url(), "turns:", Duration::from_secs(10)).await;
    let taken = look_for(Duration::from_secs(2), async || {
        tokio::time::timeout(Duration::from_millis(100), other.lock_and_read(&slot))
            .await
            .ok()
    })
    .await;
    assert!(taken.is_some(), "the lock was let go after the last turn");
}

/// Every command a Redis of the test's own ran so far, counted by the
/// server (`INFO commandstats`, the commands a script calls included),
/// but for the `INFO`s and `CLIENT`s that look and the subscriptions'
/// `PING`s (every 10 s).
async fn commands_run(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]).await;
    calls(&stats, |l| {
        !["cmdstat_info:", "cmdstat_client|", "cmdstat_ping:"]
            .iter()
            .any(|skipped| l.starts_with(skipped))
    })
}

/// A process's Redis ledger on the server at `url` under `prefix`, whose
/// locks hold `lease` unless renewed, and whose checkpoints do not run
/// during the test: a test of its own counts every command the server runs.
async fn quiet_ledger(url: &str, prefix: &str, lease: Duration) -> RedisLedger {
    let ledger = RedisLedger::connect_with(
        url,
        prefix,
        Duration::from_secs(3600),
        lease,
        None,
        false,
        Duration::from_secs(3600),
    )
    .await
    .expect("a Redis server");
    crate::support::redis::mark_filled(&ledger).await;
    ledger
}

/// Two processes' [`quiet_ledger`]s.
async fn two_quiet_processes(
    url: &str,
    prefix: &str,
    lease: Duration,
) -> (RedisLedger, RedisLedger) {
    (
        quiet_ledger(url, prefix, lease).await,
        quiet_ledger(url, prefix, lease).await,
    )
}

/// A delivery waiting for an entity's lock that another process holds is
/// woken by its release, not by polling: over 300 ms of waiting it costs
/// one try, a constant handful of commands (6 here; a try every 5 ms,
/// three commands each, with the polling it replaced: 144 here), and it takes
/// the lock within moments of the release, not at the end of the 10 s
/// lease. So again once the processes' subscriptions to the releases were
/// cut (`CLIENT KILL TYPE pubsub`) and made again.
#[tokio::test]
async fn a_lock_another_process_holds_is_taken_at_its_release_without_polling() {
    let redis = RedisServer::start(free_port(), &[]).await;
    let (a, b) = two_quiet_processes(&redis.url(), "wake:", Duration::from_secs(10)).await;
    let b = Arc::new(b);
    let slot = EntitySlot::of_record_key(EntityType::Order, "mekari:ORD-W");
    for round in ["subscribed", "subscribed again after the cut"] {
        if round != "subscribed" {
            redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
            wait_until(
                Duration::from_secs(30),
                "both processes subscribed again",
                async || {
                    redis
                        .cli(&["CLIENT", "LIST", "TYPE", "pubsub"])
                        .await
                        .lines()
                        .count()
                        == 2
                },
            )
            .await;
        }
        let (waiting, after) = waited_for_a_held_lock(&a, &b, &slot, || commands_run(&redis)).await;
        println!(
            "{round}: {waiting} commands while waiting 300 ms; taken {after:?} after the release"
        );
        assert!(
            waiting <= 12,
            "{round}: {waiting} commands while waiting 300 ms: one try (a script and the commands it calls), not one every 5 ms"
        );
        assert!(
            after < Duration::from_millis(250),
            "{round}: taken {after:?} after the release"
        );
    }
}

/// A holder that never releases its lock (its process killed) keeps a
/// waiter of another process out until the lock's lease lapses, and no
/// longer: the waiter takes it about a lease after it was taken, having
/// tried twice meanwhile (10 commands; 463 with the polling it replaced).
#[tokio::test]
async fn a_waiter_takes_a_lock_whose_holder_died_when_its_lease_lapses() {
    let redis = RedisServer::start(free_port(), &[]).await;
    let lease = Duration::from_secs(1);
    let (a, b) = two_quiet_processes(&redis.url(), "lapse:", lease).await;
    let slot = EntitySlot::of_record_key(EntityType::Order, "mekari:ORD-L");
    let (held, _) = a.lock_and_read(&slot).await.unwrap();
    let locked = Instant::now();
    // Its holder dies: the lock is never released.
    std::mem::forget(held);
    let before = commands_run(&redis).await;
    let (lock, _) = tokio::time::timeout(Duration::from_secs(10), b.lock_and_read(&slot))
        .await
        .expect("the waiter takes the lock once its lease lapsed")
        .unwrap();
    let waited = locked.elapsed();
    let commands = commands_run(&redis).await - before;
    println!("taken {waited:?} after a lock of a {lease:?} lease was taken; {commands} commands");
    assert!(
        waited >= lease - Duration::from_millis(50) && waited < lease + Duration::from_millis(500),
        "taken {waited:?} after a lock of a {lease:?} lease was taken"
    );
    assert!(
        commands <= 30,
        "{commands} commands while waiting for the lease to lapse"
    );
    drop(lock);
}

/// A lock held by a replica of an older version, whose release publishes
/// nothing (its token is hex digits alone, without the `w` of a holder
/// that publishes its release), is tried every 5 ms as before: while a
/// deployment upgrades one replica at a time, a waiter takes it within
/// moments of its release, not at the end of its 10 s lease.
#[tokio::test]
async fn a_lock_an_older_version_holds_is_tried_again_every_few_milliseconds() {
    let redis = RedisServer::start(free_port(), &[]).await;
    let ledger = quiet_ledger(&redis.url(), "older:", Duration::from_secs(10)).await;
    let slot = EntitySlot::of_record_key(EntityType::Order, "mekari:ORD-O");
    // An older version's entity lock, as it takes it: `SET NX PX`, a token
    // of 32 hex digits.
    let key = "older:lock:orders/mekari:ORD-O";
    let token = format!("{:032x}", rand::random::<u128>());
    redis.cli(&["SET", key, &token, "NX", "PX", "10000"]).await;
    let waiter = tokio::spawn({
        let (ledger, slot) = (ledger.clone(), slot.clone());
        async move {
            let (lock, _) = ledger.lock_and_read(&slot).await.unwrap();
            (Instant::now(), lock)
        }
    });
    // Until the waiter has found the lock held twice (its tries are the
    // only scripts this server runs): it tries again, it does not wait for
    // a release the older holder will never publish.
    let tries = async || {
        let stats = redis.cli(&["INFO", "commandstats"]).await;
        calls(&stats, |l| l.starts_with("cmdstat_evalsha:"))
    };
    let before = tries().await;
    wait_until(
        Duration::from_secs(5),
        "the waiter's second try",
        async || tries().await >= before + 2,
    )
    .await;
    assert!(!waiter.is_finished(), "the lock was held");
    // Its release: the older version's compare-and-delete, without a word.
    let released = Instant::now();
    redis.cli(&["DEL", key]).await;
    let (taken, lock) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter takes the lock before the end of its lease")
        .unwrap();
    let after = taken - released;
    assert!(
        after < Duration::from_millis(250),
        "taken {after:?} after the release"
    );
    drop(lock);
}
