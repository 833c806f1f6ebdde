//! A three-node Apache Kafka cluster loses the leader of the busiest
//! partition under steady webhook traffic, and gets it back: every delivery
//! answered 2xx is in its topic, every answer came within the budget, and
//! the compacted view is each entity's newest state, though records of the
//! same entities were in flight when the leader died and newer events
//! followed. Topics get posbridge's defaults on a cluster of three:
//! replication factor 3, `min.insync.replicas` 2. Kafka only (`kafka_only`
//! in its name): tansu is a single node.

use crate::support::kafka_only;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use posbridge::adapters::encode::decode;
use serde_json::Value;

use crate::support::cluster::KafkaCluster;
use crate::support::wait::wait_until;
use crate::support::{
    TestApp, latest_per_key, mekari_order, read_topic, rr_sale, spool_config, timed, unique,
};

/// `delivery_timeout_ms` + `inflight_wait_ms` of the test configuration,
/// and HTTP over loopback on a loaded two-core machine on top.
const BUDGET: Duration = Duration::from_millis(3000 + 2000 + 500);
/// Entities per provider that every event of the traffic updates in turn.
const ENTITIES: u32 = 4;

/// One delivery of the traffic and its answer.
struct Sent {
    provider: &'static str,
    body: Value,
    status: u16,
    what: String,
    took: Duration,
}

/// The n-th event of each provider: the next state of entity n % ENTITIES,
/// a second newer than the one before.
fn events(tag: &str, n: u32) -> [(&'static str, Value); 2] {
    let at = |base: &str| format!("{base}{:02}:{:02}", n / 60, n % 60);
    let sale = rr_sale(
        &format!("{tag}-rr-{n}"),
        "sale.updated",
        &format!("{}Z", at("2026-11-29T10:")),
        &format!("T1|2026-11|{:04}", n % ENTITIES),
        100 + u64::from(n),
    );
    let order = mekari_order(
        &format!("{tag}-mk-{n}"),
        "order.updated",
        &format!("{}+07:00", at("2026-11-29T17:")),
        &format!("ORD-L{}", n % ENTITIES),
        &format!("step-{n}"),
    );
    [("receiptroller", sale), ("mekari", order)]
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_losing_a_partition_leader_under_load_loses_nothing_and_keeps_order() {
    kafka_only("tansu is a single node");
    let mut cluster = KafkaCluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let tag = "leader";
    let prefix = unique(tag);
    let config = spool_config(&cluster.bootstrap(), &prefix, dir.path());
    // The fair shares at their defaults: two sources at one rate pile up in
    // flight while the partition has no leader, past the busy mark, yet
    // neither holds twice the other, so neither is answered 429 (fixed
    // shares did): the answers asked here are the broker's (503 or spooled).
    let app = TestApp::start_with(config).await;
    let orders = app.topic("orders");
    assert_eq!(
        cluster.durability_of(&orders).await,
        (3, "2".to_owned()),
        "posbridge's defaults on three brokers: 3 replicas, 2 in sync"
    );

    // Steady traffic: a pair of events every 100 ms, each on its own task.
    let mut requests = Vec::new();
    let started = Instant::now();
    let mut killed = None;
    let mut restarted = false;
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(20) {
        for (provider, body) in events(tag, n) {
            let request = app.request(provider, "main", &body);
            requests.push(tokio::spawn(async move {
                let answer = timed(request).await;
                Sent {
                    provider,
                    body,
                    status: answer.status,
                    what: answer.what(),
                    took: answer.took,
                }
            }));
        }
        n += 1;
        if killed.is_none() && started.elapsed() > Duration::from_secs(4) {
            let leader = cluster.leader_of(&orders);
            cluster.kill(leader);
            killed = Some((leader, Instant::now()));
        }
        if let Some((leader, at)) = killed
            && !restarted
            && at.elapsed() > Duration::from_secs(8)
        {
            cluster.restart(leader).await;
            restarted = true;
        }
        // The load's pace: ten deliveries a second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut sent = Vec::new();
    for request in requests {
        sent.push(request.await.unwrap());
    }

    let slowest = sent.iter().map(|s| s.took).max().unwrap();
    let mut outcomes: BTreeMap<(&str, u16, &str), usize> = BTreeMap::new();
    for s in &sent {
        *outcomes
            .entry((s.provider, s.status, s.what.as_str()))
            .or_default() += 1;
    }
    println!(
        "leader loss: {} deliveries, node {:?} killed 4 s in and restarted 8 s later; slowest answer {slowest:?} (budget {BUDGET:?}); outcomes {outcomes:?}",
        sent.len(),
        killed.map(|(leader, _)| leader),
    );
    assert!(slowest <= BUDGET, "slowest answer {slowest:?}");

    // The 503s retried as the provider would, until each is handled.
    for s in sent.iter().filter(|s| s.status != 200) {
        assert_eq!(s.status, 503, "{} {}", s.status, s.what);
        wait_until(Duration::from_secs(90), "a retry to succeed", async || {
            app.send(s.provider, "main", &s.body).await.status() == 200
        })
        .await;
    }
    let spool = app.pipeline.spool().expect("a spooling configuration");
    wait_until(Duration::from_secs(60), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;

    // Every published delivery is in its topic; every entity ends on the
    // newest event sent for it.
    for (plural, provider) in [("sales", "receiptroller"), ("orders", "mekari")] {
        let records = read_topic(&cluster.bootstrap(), &app.topic(plural));
        let written: HashMap<String, ()> = records
            .iter()
            .map(|r| {
                (
                    decode(r.payload.as_deref().unwrap())
                        .unwrap()
                        .event_id
                        .into(),
                    (),
                )
            })
            .collect();
        for s in sent
            .iter()
            .filter(|s| s.provider == provider && s.what == "published")
        {
            let id = s.body["id"].as_str().unwrap();
            assert!(
                written.contains_key(id),
                "{id} answered published is in {plural}"
            );
        }
        let view = latest_per_key(&records);
        assert_eq!(view.len(), ENTITIES as usize, "{plural}");
        for entity in 0..ENTITIES {
            let newest = (0..n).rev().find(|i| i % ENTITIES == entity).unwrap();
            let key = match provider {
                "receiptroller" => format!("receiptroller:T1|2026-11|{entity:04}"),
                _ => format!("mekari:ORD-L{entity}"),
            };
            let latest = decode(view[&key].payload.as_deref().unwrap()).unwrap();
            let short = if provider == "receiptroller" {
                "rr"
            } else {
                "mk"
            };
            assert_eq!(
                latest.event_id,
                format!("{tag}-{short}-{newest}"),
                "{key}: the newest state"
            );
        }
    }
    app.stop().await;
}
