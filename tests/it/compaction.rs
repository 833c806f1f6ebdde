//! The central promise, on the component that keeps it: Apache Kafka's log
//! cleaner turns an entity topic into one record per live entity, its
//! newest state, however the deliveries came (shuffled, duplicated, some
//! entities deleted). Kafka only (`kafka_only` in its name): tansu compacts
//! on a maintenance tick of its own and may return a surviving record more
//! than once, so there this says so and passes without a cleaner to watch.
//! And an entity topic someone else made without compaction stops start-up.

use crate::support::kafka_only;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use posbridge::adapters::encode::decode;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;

use crate::support::{TestApp, brokers, config, mekari_order, read_topic, unique};

/// Orders, and updates per order.
const ORDERS: usize = 12;
const UPDATES: usize = 8;
/// The key of the records the test itself writes to roll segments: the
/// cleaner never touches the active segment, and a segment rolls only
/// when a record arrives after `segment.ms`.
const ROLLER: &str = "test:segment-roller";

/// Creates `topic` with one partition and `settings`, as someone other
/// than posbridge would.
pub async fn create_topic(topic: &str, settings: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let mut new_topic = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    for (key, value) in settings {
        new_topic = new_topic.set(key, value);
    }
    let results = admin
        .create_topics([&new_topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results[0].is_ok(), "{results:?}");
}

/// Settings that let the cleaner clean a compacted topic within a second
/// of a segment rolling.
const FAST_CLEANING: [(&str, &str); 6] = [
    ("cleanup.policy", "compact"),
    ("segment.ms", "100"),
    ("min.cleanable.dirty.ratio", "0.01"),
    ("min.compaction.lag.ms", "0"),
    ("delete.retention.ms", "100"),
    ("max.message.bytes", "2000000"),
];

/// A small deterministic shuffle (xorshift), so a failure can be replayed.
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_the_log_cleaner_leaves_exactly_the_newest_state_of_every_live_entity() {
    kafka_only("tansu's compaction is not Kafka's log cleaner");
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("compaction");
    let topic = format!("{prefix}.orders");
    create_topic(&topic, &FAST_CLEANING).await;
    let app = TestApp::start_with(config(&brokers(), &prefix, dir.path())).await;

    // Each order: UPDATES states a minute apart; every third order is
    // deleted a minute after its last update.
    let mut deliveries = Vec::new();
    let mut truth: BTreeMap<String, Option<String>> = BTreeMap::new();
    for order in 0..ORDERS {
        let id = format!("ORD-C{order}");
        for update in 0..UPDATES {
            let kitchen = format!("step-{update}");
            let at = format!("2026-11-29T17:{:02}:00+07:00", update + 1);
            let event = if update == 0 {
                "order.created"
            } else {
                "order.updated"
            };
            let body = mekari_order(&format!("c-{order}-{update}"), event, &at, &id, &kitchen);
            deliveries.push(body);
            truth.insert(id.clone(), Some(kitchen));
        }
        if order % 3 == 0 {
            let at = format!("2026-11-29T17:{:02}:00+07:00", UPDATES + 1);
            let body = mekari_order(
                &format!("c-{order}-delete"),
                "order.deleted",
                &at,
                &id,
                "done",
            );
            deliveries.push(body);
            truth.insert(id.clone(), None);
        }
    }
    // Shuffled, and every fourth delivery sent twice.
    let twice: Vec<Value> = deliveries.iter().step_by(4).cloned().collect();
    deliveries.extend(twice);
    shuffle(&mut deliveries, 0x5eed_c0ff_ee00_0001);
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for body in &deliveries {
        let response = app.send("mekari", "main", body).await;
        assert_eq!(response.status(), 200, "{body}");
        let outcome: Value = response.json().await.unwrap();
        *outcomes
            .entry(outcome["status"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        outcomes["duplicate"] > 0 && outcomes["stale"] > 0,
        "{outcomes:?}"
    );
    let written_before = read_topic(&brokers(), &topic).len();
    assert!(
        written_before > ORDERS,
        "several states per order were written before cleaning: {written_before}"
    );

    // Roll segments until the cleaner has done its work, tombstones included.
    let roller: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let live: BTreeMap<&String, &String> = truth
        .iter()
        .filter_map(|(id, state)| state.as_ref().map(|s| (id, s)))
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(90);
    let view = loop {
        // Each roll must fall in a new segment (segment.ms): a pace, then a look.
        tokio::time::sleep(Duration::from_millis(300)).await;
        roller
            .send(
                FutureRecord::to(&topic).key(ROLLER).payload("roll"),
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let records: Vec<_> = read_topic(&brokers(), &topic)
            .into_iter()
            .filter(|r| r.key != ROLLER)
            .collect();
        let clean = records.len() == live.len() && records.iter().all(|r| r.payload.is_some());
        if clean || Instant::now() > deadline {
            break records;
        }
    };
    let keys: Vec<&str> = view.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        view.len(),
        live.len(),
        "one record per live key after {:?}: {keys:?}",
        started.elapsed()
    );
    for record in &view {
        let event = decode(record.payload.as_deref().expect("no tombstone left")).unwrap();
        let id = record.key.trim_start_matches("mekari:");
        assert_eq!(
            event.kitchen_status.as_deref(),
            live.get(&id.to_owned()).map(|status| status.as_str()),
            "{}: the newest state",
            record.key
        );
    }
    eprintln!(
        "compaction: {} deliveries ({outcomes:?}), {written_before} records before cleaning, {} after, in {:?}",
        deliveries.len(),
        view.len(),
        started.elapsed()
    );
    app.stop().await;
}

/// An entity topic created by someone else with `cleanup.policy=delete`
/// would lose entities' latest states by age: start-up refuses it, naming
/// the topic, the setting and the fix; the other topics are not touched.
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_an_entity_topic_that_is_not_compacted_stops_start_up_naming_it() {
    kafka_only("tansu 0.6 describes no topic settings: nothing to check");
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("uncompacted");
    let topic = format!("{prefix}.orders");
    create_topic(&topic, &[("cleanup.policy", "delete")]).await;
    let error = match posbridge::app::App::build(&config(&brokers(), &prefix, dir.path())).await {
        Ok(_) => panic!("start-up must refuse an uncompacted entity topic"),
        Err(error) => format!("{:#}", anyhow::Error::new(error)),
    };
    assert!(error.contains(&format!("topic `{topic}`")), "{error}");
    assert!(error.contains("cleanup.policy is `delete`"), "{error}");
    assert!(error.contains("cleanup.policy=compact"), "the fix: {error}");
}
