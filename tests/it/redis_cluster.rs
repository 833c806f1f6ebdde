//! The Redis ledger on a real Redis Cluster the test starts itself: three
//! masters with a replica each (`redis-cli --cluster create`), on loopback.
//! A cluster refuses (`CROSSSLOT`) a script whose keys lie in different hash
//! slots, so the whole delivery protocol runs here over deliveries and
//! entities spread across every master; then a master fails over to its
//! replica (`CLUSTER FAILOVER`) while deliveries keep coming, and nothing an
//! acknowledged commit wrote may be lost, nor any delivery begin `New` twice.
//! Between the two, a process waiting for a lock another holds is woken by
//! its release, published on one node and heard on another.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use posbridge::adapters::ledger::{
    Begin, Commit, Done, EntitySlot, Held, RedisLedger, Remembered, Store,
};
use posbridge::domain::event::{DeliveryKey, EntityKey, EntityType, ProviderKind, Version};
use posbridge::domain::guard::EntityState;

use crate::support::redis::{RedisServer, calls, cli, waited_for_a_held_lock};
use crate::support::unique;
use crate::support::wait::wait_until;

/// How long a wait for the cluster or its traffic may take: each is a
/// condition met within a second or two alone, but the suite runs a hundred
/// other tests beside this one on two cores, and a bound missed there says
/// nothing about the ledger.
const PATIENCE: Duration = Duration::from_secs(60);

/// Six nodes: after `create`, three masters with one replica each.
struct TestCluster {
    nodes: Vec<RedisServer>,
}

/// A loopback port that is free, with its cluster bus port (`port + 10000`)
/// free too, below the ephemeral range so an outgoing connection is
/// unlikely to take it meanwhile.
fn free_cluster_port(taken: &[u16]) -> u16 {
    loop {
        let port = 20_000 + rand::random::<u16>() % 10_000;
        if !taken.contains(&port)
            && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}

/// A node's role (`master`, `slave`) and, for a replica, its master's port
/// and whether its link to the master is up.
async fn role(port: u16) -> (String, Option<u16>, bool) {
    let info = cli(port, &["INFO", "replication"]).await;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    (
        field("role").unwrap_or_default(),
        field("master_port").and_then(|p| p.parse().ok()),
        field("master_link_status").as_deref() == Some("up"),
    )
}

impl TestCluster {
    async fn start() -> TestCluster {
        let mut nodes: Vec<RedisServer> = Vec::new();
        for _ in 0..6 {
            let taken: Vec<u16> = nodes.iter().map(|n| n.port).collect();
            let port = free_cluster_port(&taken);
            let conf = format!("nodes-{port}.conf");
            nodes.push(
                RedisServer::start(
                    port,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
                .await,
            );
        }
        let cluster = TestCluster { nodes };
        let addresses: Vec<String> = cluster.ports().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = tokio::process::Command::new("redis-cli")
            .env_remove("LD_PRELOAD")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .await
            .expect("redis-cli");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        for port in cluster.ports() {
            wait_until(PATIENCE, "cluster_state:ok", async || {
                let info = cli(port, &["CLUSTER", "INFO"]).await;
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:6")
            })
            .await;
            wait_until(PATIENCE, "replicas in sync", async || {
                let (role, _, link_up) = role(port).await;
                role == "master" || link_up
            })
            .await;
        }
        cluster
    }

    fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.nodes.iter().map(|n| n.port)
    }

    async fn masters(&self) -> Vec<u16> {
        let mut masters = Vec::new();
        for port in self.ports() {
            if role(port).await.0 == "master" {
                masters.push(port);
            }
        }
        masters
    }

    /// A replica and its master.
    async fn replica(&self) -> (u16, u16) {
        for port in self.ports() {
            if let (role, Some(master), true) = role(port).await
                && role == "slave"
            {
                return (port, master);
            }
        }
        panic!("no replica in the cluster");
    }
}

async fn connect(url: &str, prefix: &str) -> RedisLedger {
    RedisLedger::connect(
        url,
        prefix,
        Duration::from_secs(3600),
        // Short, so a lease a lost reply left behind lapses within the test.
        Duration::from_secs(2),
        None,
        false,
    )
    .await
    .expect("the test cluster")
}

/// [`connect`] whose checkpoints do not run during the test: what every
/// node runs is counted.
async fn quiet(url: &str, prefix: &str) -> RedisLedger {
    RedisLedger::connect_with(
        url,
        prefix,
        Duration::from_secs(3600),
        // A lease longer than the test's waits: a waiter woken at its end
        // would fail them.
        Duration::from_secs(10),
        None,
        false,
        Duration::from_secs(3600),
    )
    .await
    .expect("the test cluster")
}

/// Whether the node on `port` holds `key`'s hash slot.
async fn holds(port: u16, key: &str) -> bool {
    let slot: u16 = cli(port, &["CLUSTER", "KEYSLOT", key])
        .await
        .trim()
        .parse()
        .unwrap();
    let nodes = cli(port, &["CLUSTER", "NODES"]).await;
    let myself = nodes
        .lines()
        .find(|line| line.contains("myself"))
        .expect("CLUSTER NODES names the node asked");
    // After eight fields, the slot ranges it serves: `0-5460`, `5461`.
    myself.split_whitespace().skip(8).any(|range| {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        matches!(
            (first.parse::<u16>(), last.parse::<u16>()),
            (Ok(first), Ok(last)) if (first..=last).contains(&slot)
        )
    })
}

/// Every command the cluster's masters ran so far (`INFO commandstats`, the
/// commands a script calls included), but for the `INFO`s that look, the
/// cluster client's `CLUSTER` and `CLIENT` commands, the replicas'
/// acknowledgements (`REPLCONF`, every second) and the subscriptions'
/// `PING`s (every 10 s). A replica's copies of its master's writes are not
/// commands anyone sent.
async fn commands_run(cluster: &TestCluster) -> u64 {
    let mut total = 0;
    for port in cluster.masters().await {
        let stats = cli(port, &["INFO", "commandstats"]).await;
        total += calls(&stats, |l| {
            [
                "cmdstat_info:",
                "cmdstat_cluster|",
                "cmdstat_client|",
                "cmdstat_replconf:",
                "cmdstat_ping:",
            ]
            .iter()
            .all(|skipped| !l.starts_with(skipped))
        });
    }
    total
}

fn delivery(i: usize) -> DeliveryKey {
    DeliveryKey::new(ProviderKind::Mekari, &format!("e{i}"))
}

fn entity(n: usize) -> EntitySlot {
    EntitySlot::new(
        EntityType::Order,
        &EntityKey::new(ProviderKind::Mekari, None, &format!("O-{n}")),
    )
}

/// Delivery `i`'s entity state: versions grow with `i`.
fn state(i: usize) -> Held {
    Held {
        state: EntityState {
            version: Version {
                at_micros: i64::try_from(i).unwrap() + 1,
                rank: 0,
            },
            state_hash: [u8::try_from(i % 251).unwrap(); 16],
        },
        offset: Some(i64::try_from(i).unwrap()),
    }
}

/// What the traffic saw, shared by its workers.
#[derive(Default)]
struct Traffic {
    next: AtomicUsize,
    stop: AtomicBool,
    /// Delivery index → when its commit was acknowledged.
    committed: Mutex<BTreeMap<usize, Instant>>,
    /// `New` answers per delivery index: one each, or it would publish twice.
    news: Mutex<BTreeMap<usize, u32>>,
    /// Calls that failed (and were tried again): when.
    errors: Mutex<Vec<Instant>>,
    /// Commits that failed at least once before one was acknowledged: the
    /// in-doubt case the fence writes again.
    in_doubt: AtomicUsize,
    /// A committed delivery that began `New` again: must stay empty.
    duplicates: Mutex<Vec<usize>>,
}

impl Traffic {
    fn failed(&self) {
        self.errors.lock().unwrap().push(Instant::now());
    }
}

const ENTITIES: usize = 64;
/// A bound on the traffic whatever the time: it stops by itself.
const MOST_DELIVERIES: usize = 200_000;

/// One worker: deliveries one after another, each begun until `New` (a
/// provider retrying after a 503), under its entity's lock, committed until
/// acknowledged (the fence writing a failed commit again), then checked
/// `Done`, with a retry of an earlier committed delivery beside it.
async fn worker(ledger: RedisLedger, traffic: Arc<Traffic>) {
    while !traffic.stop.load(Ordering::Relaxed) {
        let i = traffic.next.fetch_add(1, Ordering::Relaxed);
        if i >= MOST_DELIVERIES {
            return;
        }
        let id = delivery(i);
        loop {
            match ledger.begin(&id).await {
                Ok(Begin::New) => break,
                // A lease whose `begin` answer was lost lapses by itself.
                Ok(Begin::InFlight) => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(Begin::Done) => panic!("{id} done before it was committed"),
                Err(_) => {
                    traffic.failed();
                    // A client's pause before trying a failed node again.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        *traffic.news.lock().unwrap().entry(i).or_default() += 1;
        let slot = entity(i % ENTITIES);
        let _lock = loop {
            match ledger.lock_and_read(&slot).await {
                Ok((lock, _)) => break lock,
                Err(_) => traffic.failed(),
            }
        };
        let mut tries = 0;
        loop {
            tries += 1;
            let commit =
                Commit::done(Done::published_now(id.clone())).and_state(slot.clone(), state(i));
            match ledger.commit(&commit).await {
                Ok(()) => break,
                Err(_) => {
                    traffic.failed();
                    // As above: a retry's pause.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        if tries > 1 {
            traffic.in_doubt.fetch_add(1, Ordering::Relaxed);
        }
        traffic.committed.lock().unwrap().insert(i, Instant::now());
        // A late retry of a delivery committed earlier, if that one is.
        let earlier = i.saturating_sub(1 + rand::random::<u32>() as usize % 500);
        let earlier = traffic
            .committed
            .lock()
            .unwrap()
            .contains_key(&earlier)
            .then_some(earlier);
        for retried in std::iter::once(i).chain(earlier) {
            match ledger.begin(&delivery(retried)).await {
                Ok(Begin::New) => traffic.duplicates.lock().unwrap().push(retried),
                Ok(_) => {}
                Err(_) => traffic.failed(),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_redis_ledger_works_on_a_cluster_and_loses_nothing_in_a_failover() {
    let cluster = TestCluster::start().await;
    let masters = cluster.masters().await;
    assert_eq!(masters.len(), 3);
    let prefix = format!("{}:", unique("cluster"));
    // One node's URL is enough: the server says it is a cluster node.
    let one = format!("redis://127.0.0.1:{}", masters[0]);
    let ledger = connect(&one, &prefix).await;
    assert!(
        format!("{ledger:?}").contains("cluster: true"),
        "{ledger:?}"
    );

    // The whole protocol over deliveries and entities in slots of every master.
    for i in 0..300 {
        let id = delivery(i);
        assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New, "{id}");
        assert_eq!(ledger.begin(&id).await.unwrap(), Begin::InFlight);
        if i % 3 == 0 {
            ledger.release(&id).await;
            assert_eq!(ledger.begin(&id).await.unwrap(), Begin::New);
        }
        let slot = entity(i % 100);
        let (lock, _) = ledger.lock_and_read(&slot).await.unwrap();
        let checkpoint = format!("mekari/main/OUT-{}/orders", i % 7);
        ledger
            .commit(&{
                let commit =
                    Commit::done(Done::published_now(id.clone())).and_state(slot.clone(), state(i));
                if i % 5 == 0 {
                    commit.and_checkpoint(checkpoint.clone(), i64::try_from(i).unwrap())
                } else {
                    commit
                }
            })
            .await
            .unwrap();
        drop(lock);
        assert_eq!(ledger.begin(&id).await.unwrap(), Begin::Done);
        if i % 10 == 0 {
            // An answer a fill reads back keeps the one held (MARK_DONE's
            // `keep`, the cluster's path).
            let answered = |found| match found {
                Remembered::Done { answered, .. } => answered,
                other => panic!("{id}: {other:?}"),
            };
            let held = answered(ledger.remembered(&id).await.unwrap());
            let mut read_back = Done::published_now(id.clone());
            read_back.answered.at_micros = 0;
            read_back.read_back = true;
            ledger.commit(&Commit::done(read_back)).await.unwrap();
            assert_eq!(answered(ledger.remembered(&id).await.unwrap()), held);
            assert_ne!(held.at_micros, 0);
        }
        assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::New);
        assert_eq!(ledger.begin_again(&id).await.unwrap(), Begin::InFlight);
        ledger.release(&id).await;
        assert_eq!(ledger.entity(&slot).await.unwrap(), Some(state(i)));
        if i % 5 == 0 {
            assert_eq!(
                ledger.checkpoint(&checkpoint).await.unwrap(),
                Some(i64::try_from(i).unwrap())
            );
        }
    }
    // An older state never replaces a newer one, even without a delivery.
    ledger
        .commit(&Commit::state(entity(7), state(1)))
        .await
        .unwrap();
    assert_eq!(ledger.entity(&entity(7)).await.unwrap(), Some(state(207)));
    // A dead letter's commit: the delivery alone.
    ledger.begin(&delivery(1000)).await.unwrap();
    ledger
        .commit(&Commit::done(Done::published_now(delivery(1000))))
        .await
        .unwrap();
    assert_eq!(ledger.begin(&delivery(1000)).await.unwrap(), Begin::Done);
    // A lock excludes a second holder on another connection until released.
    let other = connect(&one, &prefix).await;
    let (held, _) = ledger.lock_and_read(&entity(1)).await.unwrap();
    let waiting =
        tokio::time::timeout(Duration::from_millis(300), other.lock_and_read(&entity(1))).await;
    assert!(waiting.is_err(), "the second holder waits");
    drop(held);
    tokio::time::timeout(Duration::from_secs(2), other.lock_and_read(&entity(1)))
        .await
        .expect("a released lock can be taken")
        .unwrap();
    ledger.check().await.unwrap();
    for master in &masters {
        let keys: u64 = cli(*master, &["DBSIZE"]).await.trim().parse().unwrap();
        assert!(keys > 50, "master {master} holds only {keys} keys");
    }

    // Another process waiting for a lock is woken by its release, not by
    // polling: the release is published from the lock's master, and a
    // cluster's PUBLISH reaches every node, so the waiter's subscription
    // on the node it was given hears it, whether that node holds the lock
    // or not. Over 300 ms of waiting it costs one try (a SET every 5 ms with
    // the polling it replaced: about 50 here), counted over every master, and it
    // takes the lock within moments of the release, not at the end of the
    // lease. The ledgers above checkpoint every second: gone, they run
    // nothing.
    drop((ledger, other));
    let (holder, waiter) = (quiet(&one, &prefix).await, quiet(&one, &prefix).await);
    let waiter = Arc::new(waiter);
    let lock_key = |n| format!("{prefix}lock:orders/mekari:O-{n}");
    let mut on_subscribed_node = None;
    let mut elsewhere = None;
    for n in 2..100 {
        let found = if holds(masters[0], &lock_key(n)).await {
            &mut on_subscribed_node
        } else {
            &mut elsewhere
        };
        found.get_or_insert(n);
    }
    for (n, lying) in [
        (on_subscribed_node.unwrap(), "on the node subscribed to"),
        (elsewhere.unwrap(), "on another node"),
    ] {
        let (commands, after) =
            waited_for_a_held_lock(&holder, &waiter, &entity(n), || commands_run(&cluster)).await;
        println!(
            "a lock {lying}: {commands} commands while waiting 300 ms; taken {after:?} after the release"
        );
        assert!(
            commands <= 12,
            "a lock {lying}: {commands} commands while waiting 300 ms: one try, not one every 5 ms"
        );
        assert!(
            after < Duration::from_millis(250),
            "a lock {lying}: taken {after:?} after the release"
        );
    }

    // A master fails over to its replica while deliveries keep coming.
    let prefix = format!("{}:", unique("failover"));
    let all: Vec<String> = cluster
        .ports()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let ledger = connect(&all.join(","), &prefix).await;
    let (replica, master) = cluster.replica().await;
    let traffic = Arc::new(Traffic::default());
    let workers: Vec<_> = (0..8)
        .map(|_| tokio::spawn(worker(ledger.clone(), traffic.clone())))
        .collect();
    wait_until(PATIENCE, "traffic before the failover", async || {
        traffic.committed.lock().unwrap().len() >= 200
    })
    .await;
    let before = traffic.committed.lock().unwrap().len();
    let started = Instant::now();
    assert_eq!(
        cli(replica, &["CLUSTER", "FAILOVER"]).await.trim(),
        "OK",
        "CLUSTER FAILOVER on {replica}"
    );
    wait_until(PATIENCE, "the failover", async || {
        role(replica).await.0 == "master"
            && role(master).await.0 == "slave"
            && cli(replica, &["CLUSTER", "INFO"])
                .await
                .contains("cluster_state:ok")
    })
    .await;
    let failover = started.elapsed();
    let ended = Instant::now();
    let at_end = traffic.committed.lock().unwrap().len();
    wait_until(PATIENCE, "traffic after the failover", async || {
        traffic.committed.lock().unwrap().len() >= at_end + 200
    })
    .await;
    traffic.stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }

    let committed = traffic.committed.lock().unwrap().clone();
    let during = committed
        .values()
        .filter(|at| **at >= started && **at <= ended)
        .count();
    let after_start: HashSet<usize> = committed
        .iter()
        .filter(|(_, at)| **at >= started)
        .map(|(i, _)| *i)
        .collect();
    let errors = traffic.errors.lock().unwrap().clone();
    let errors_during = errors.iter().filter(|at| **at >= started).count();
    // Deliveries whose keys the failed-over shard holds, now on its new master.
    let on_shard: HashSet<usize> = cli(
        replica,
        &[
            "--scan",
            "--pattern",
            &format!("{prefix}{{d:mekari:e*}}:done"),
        ],
    )
    .await
    .lines()
    .filter_map(|key| {
        key.strip_prefix(&format!("{prefix}{{d:mekari:e"))?
            .strip_suffix("}:done")?
            .parse()
            .ok()
    })
    .collect();
    let shard_after_start = on_shard.intersection(&after_start).count();
    println!(
        "failover of master {master} to replica {replica}: {} ms; deliveries committed: {before} before it, {during} during it, {} in all; {} on the failed-over shard since it began; {errors_during} failed calls since it began ({} in all), {} commits in doubt (acknowledged on a later try)",
        failover.as_millis(),
        committed.len(),
        shard_after_start,
        errors.len(),
        traffic.in_doubt.load(Ordering::Relaxed),
    );
    assert!(before > 100, "traffic before the failover: {before}");
    assert!(
        shard_after_start > 10,
        "traffic reached the failed-over shard after it began: {shard_after_start}"
    );

    // Nothing lost, nothing twice: seen from a fresh connection to the new master.
    assert_eq!(*traffic.duplicates.lock().unwrap(), Vec::<usize>::new());
    let news = traffic.news.lock().unwrap().clone();
    assert!(news.values().all(|n| *n == 1), "a delivery began New twice");
    assert_eq!(news.len(), committed.len());
    let check = connect(&format!("redis://127.0.0.1:{replica}"), &prefix).await;
    for i in committed.keys() {
        assert_eq!(
            check.begin(&delivery(*i)).await.unwrap(),
            Begin::Done,
            "delivery {i}"
        );
    }
    let mut newest: BTreeMap<usize, usize> = BTreeMap::new();
    for i in committed.keys() {
        newest.insert(i % ENTITIES, *i);
    }
    for (n, i) in newest {
        assert_eq!(
            check.entity(&entity(n)).await.unwrap(),
            Some(state(i)),
            "entity {n}"
        );
    }
}
