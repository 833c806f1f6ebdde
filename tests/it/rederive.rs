//! `posbridge rederive` against real topics: records an older build wrote
//! with schema v1 (which has no product name, SKU, price or state) are
//! derived again from their raw bodies with today's code and published in
//! their place; keys today's code wrote are not rewritten; a key a newer
//! webhook changed keeps the newer state; a second run publishes nothing;
//! a dry run prints what would change, field by field, and publishes
//! nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use posbridge::adapters::encode::decode;
use posbridge::adapters::publish::Topics;
use posbridge::services::rederive::{Options, Rederive, Summary};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use serde_json::{Value, json};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use tower::ServiceExt;

use crate::support::v1;
use crate::support::wait::wait_until;
use crate::support::{
    OwnBroker, Record, TestApp, brokers, config, config_text, kafka_only, produce, produce_all,
    read_topic, unique,
};

/// Writes what an older build wrote for `body` (a product's webhook) to
/// `topic` on `brokers`.
async fn write_v1_product(brokers: &str, topic: &str, body: &Value, micros: i64) {
    produce(brokers, topic, v1::product_record(body, micros)).await;
}

/// A run of `options` over `app`'s shared topics: its summary and its lines.
async fn rederive(app: &TestApp, options: &Options) -> (Summary, Vec<Value>) {
    let sets = [Arc::new(Topics::new(&app.config.kafka))];
    let run = Rederive::new(&app.config, app.pipeline.clone(), &sets).unwrap();
    let mut out = Vec::new();
    let summary = run.run(options, &mut out).await.unwrap();
    let lines = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (summary, lines)
}

/// A run of `options` over `app`'s shared topics, `broker` cut once
/// `topic` holds `records` records and healed once the run stopped: what
/// the run wrote (its summary line among it).
async fn run_cut_at(
    app: &TestApp,
    broker: &OwnBroker,
    (topic, records): (&str, usize),
    options: &Options,
) -> String {
    let sets = [Arc::new(Topics::new(&app.config.kafka))];
    let run = Rederive::new(&app.config, app.pipeline.clone(), &sets).unwrap();
    let cut = async {
        let (address, topic) = (broker.address(), topic.to_owned());
        wait_until(
            Duration::from_secs(60),
            "the records to cut at",
            async || {
                let (address, topic) = (address.clone(), topic.clone());
                tokio::task::spawn_blocking(move || read_topic(&address, &topic).len() >= records)
                    .await
                    .unwrap()
            },
        )
        .await;
        broker.cut();
    };
    let mut out = Vec::new();
    let (stopped, ()) = tokio::join!(run.run(options, &mut out), cut);
    assert!(stopped.is_err(), "the outage stops it");
    broker.heal();
    wait_until(
        Duration::from_secs(30),
        "the broker to answer again",
        async || app.pipeline.producer().health().is_up(),
    )
    .await;
    String::from_utf8(out).unwrap()
}

/// What an older build wrote for six products `P-1` … `P-6`, a minute
/// apart, to `products` on `brokers`.
async fn write_six_v1_products(brokers: &str, products: &str) {
    for n in 1..=6 {
        let (time, micros) = at(n);
        let body = v1::product_created(
            &format!("v1-{n}"),
            &format!("P-{n}"),
            &format!("Kopi {n}"),
            &time,
        );
        write_v1_product(brokers, products, &body, micros).await;
    }
}

/// `products` made as posbridge makes it (compacted, one partition).
async fn products_topic(brokers: &str, products: &str) {
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let new =
        NewTopic::new(products, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    for created in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .unwrap()
    {
        created.unwrap();
    }
}

/// The time of `minute` past 10:00 on the test's day, and its microseconds.
fn at(minute: u32) -> (String, i64) {
    (
        format!("2026-11-29T10:{minute:02}:00Z"),
        1_795_946_400_000_000 + i64::from(minute) * 60_000_000,
    )
}

/// A run the broker's outage stops resumes where it stopped: the records
/// before were done, the rest are done by the next run, none twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_stopped_by_an_outage_resumes_where_it_stopped() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rederive-resume");
    let mut config = config(&broker.address(), &prefix, dir.path());
    config.kafka.delivery_timeout_ms = 1000;
    let products = format!("{prefix}.products");
    // A private broker, whose tansu compacts only hourly
    // (support/broker.rs): every record written stays there to be counted,
    // on either broker.
    products_topic(&broker.address(), &products).await;
    write_six_v1_products(&broker.address(), &products).await;
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    // One a second: the outage comes once two are in the topic.
    let slow = Options {
        rate: 1,
        ..Options::default()
    };
    let text = run_cut_at(&app, &broker, (&products, 8), &slow).await;
    let summary: Value = text
        .lines()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()?
                .get("summary")
                .cloned()
        })
        .expect("the summary is written on a stop too");
    assert_eq!(summary["complete"], false);
    let done = summary["published"].as_u64().unwrap();
    assert!((1..6).contains(&done), "{summary}");
    // A dry run meanwhile previews the whole, and leaves the stop's place.
    let preview = Options {
        dry_run: true,
        ..Options::default()
    };
    let (summary, _) = rederive(&app, &preview).await;
    assert_eq!(
        (summary.differed, summary.superseded),
        (6 - done, done),
        "read from the start: {summary:?}"
    );
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.published, 6 - done, "the rest: {summary:?}");
    assert_eq!(
        (summary.superseded, summary.unchanged),
        (0, done),
        "resumed where it stopped (its own records read, not the ones before): {summary:?}"
    );
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert_eq!(
        (summary.unchanged, summary.published),
        (6, 0),
        "read whole again, nothing left to do: {summary:?}"
    );
    let derived: Vec<String> = read_topic(&broker.address(), &products)
        .iter()
        .filter_map(|r| decode(r.payload.as_deref()?).ok())
        .filter(|event| event.name.is_some())
        .map(|event| event.entity_id.into())
        .collect();
    let mut keys = derived.clone();
    keys.sort();
    keys.dedup();
    assert_eq!(
        (derived.len(), keys.len()),
        (6, 6),
        "each key derived once, none twice: {derived:?}"
    );
    app.stop().await;
}

/// A broker cut while a run has derived records on the wire leaves their
/// keys' states in doubt; none of those keys keeps its wrong value: the run
/// that resumes derives each again, and the run after it finds nothing to do.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_cut_with_records_on_the_wire_leaves_no_key_unfixed() {
    const PRODUCTS: u32 = 300;
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rederive-cut");
    let mut config = config(&broker.address(), &prefix, dir.path());
    config.kafka.delivery_timeout_ms = 1000;
    let products = format!("{prefix}.products");
    products_topic(&broker.address(), &products).await;
    let records = (1..=PRODUCTS).map(|n| {
        let micros = 1_795_946_400_000_000 + i64::from(n) * 1_000_000;
        let body = v1::product_created(
            &format!("v1-{n}"),
            &format!("P-{n}"),
            &format!("Kopi {n}"),
            &format!("2026-11-29T10:{:02}:{:02}Z", n / 60, n % 60),
        );
        v1::product_record(&body, micros)
    });
    produce_all(&broker.address(), &products, records).await;
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    // A hundred a second: once the broker is cut, every send started
    // waits out the delivery timeout on the wire, its state in doubt.
    let paced = Options {
        rate: 100,
        ..Options::default()
    };
    // Fifty derived records in, the broker is cut.
    run_cut_at(&app, &broker, (&products, 350), &paced).await;
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert!(summary.complete, "{summary:?}");
    let mut last: BTreeMap<String, bool> = BTreeMap::new();
    for record in read_topic(&broker.address(), &products) {
        // Schema v1 is not today's: its records do not decode.
        let derived =
            decode(record.payload.as_deref().unwrap()).is_ok_and(|event| event.name.is_some());
        last.insert(record.key, derived);
    }
    let unfixed: Vec<&String> = last.iter().filter(|(_, d)| !**d).map(|(k, _)| k).collect();
    assert_eq!(last.len(), PRODUCTS as usize);
    assert!(
        unfixed.is_empty(),
        "{} keys keep their wrong value after the resumed run ({summary:?}): {unfixed:?}",
        unfixed.len()
    );
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert_eq!((summary.differed, summary.published), (0, 0), "{summary:?}");
    app.stop().await;
}

/// A fix to a field the state hash leaves out (an event time a time-zone
/// bug wrote 7 h off) is published once: the corrected record carries the
/// very state (version and hash) of the one it replaces, and the next run
/// tells them apart by the offset the ledger holds, and publishes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_fix_to_a_field_the_hash_leaves_out_is_published_once() {
    // A private broker, whose tansu compacts only hourly
    // (support/broker.rs): every record written stays there to be counted.
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rederive-once");
    let config = config(&broker.address(), &prefix, dir.path());
    let products = format!("{prefix}.products");
    products_topic(&broker.address(), &products).await;
    let (time, micros) = at(1);
    let body = v1::product_created("d-1", "P-1", "Kopi 1", &time);
    // Today's code writes the product, and says the state's hash.
    let mut app = TestApp::start_with(config.clone()).await;
    assert_eq!(app.send("mekari", "main", &body).await.status(), 200);
    let hash = read_topic(&broker.address(), &products)[0].headers["posbridge-state-hash"].clone();
    // An older build's record of the same delivery, its event time 7 h off,
    // is the key's last record; a restart takes its state in.
    let off = -7 * 3_600_000_000;
    produce(
        &broker.address(),
        &products,
        v1::product_record_misdated(&body, micros, off, &hash),
    )
    .await;
    app.keep(dir);
    let dir = app.stop().await.unwrap();
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let shown = Options {
        sample: 10,
        ..Options::default()
    };
    let (summary, lines) = rederive(&app, &shown).await;
    assert_eq!(
        (summary.published, summary.differed),
        (1, 1),
        "{summary:?} {lines:?}"
    );
    let occurred_at = lines[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "occurred_at")
        .expect("the event time is among the changes");
    assert_ne!(occurred_at["was"], occurred_at["now"]);
    for run in ["second", "third"] {
        let (summary, lines) = rederive(&app, &shown).await;
        assert_eq!(
            (summary.published, summary.differed),
            (0, 0),
            "the {run} run: {summary:?} {lines:?}"
        );
        assert_eq!(
            (summary.unchanged, summary.superseded),
            (1, 2),
            "the fixed record, and the two before it: {summary:?}"
        );
    }
    let records = read_topic(&broker.address(), &products);
    assert_eq!(records.len(), 3, "the fixed record written once");
    assert_eq!(records[2].headers["posbridge-state-hash"], hash);
    app.stop().await;
}

/// `posbridge rederive` as its own process: stdout holds JSON lines only
/// (the log goes to stderr, so `| jq` reads the report whole), and Ctrl-C
/// ends a run as an outage does: the sends under way counted, the summary
/// written, exit status 1; the next run does the rest.
#[tokio::test(flavor = "multi_thread")]
async fn the_command_writes_only_json_on_stdout_and_ctrl_c_ends_it_with_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rederive-cli");
    let products = format!("{prefix}.products");
    products_topic(&brokers(), &products).await;
    write_six_v1_products(&brokers(), &products).await;
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, config_text(&brokers(), &prefix, dir.path())).unwrap();
    let command = |rate: &str| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_posbridge"));
        command
            .args(["rederive", "--config"])
            .arg(&path)
            .args(["--rate", rate])
            .env("POSBRIDGE_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        command
    };
    // One a second: Ctrl-C comes once two are in the topic.
    let child = command("1").spawn().unwrap();
    wait_until(Duration::from_secs(60), "two derived records", async || {
        let topic = products.clone();
        tokio::task::spawn_blocking(move || read_topic(&brokers(), &topic).len() >= 8)
            .await
            .unwrap()
    })
    .await;
    std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("rederive ends within a minute of Ctrl-C")
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}")))
        .collect();
    assert_eq!(
        output.status.code(),
        Some(1),
        "a stopped run's status; stderr: {stderr}"
    );
    let summary = &lines.last().expect("a summary line")["summary"];
    assert_eq!(summary["complete"], false, "{summary}");
    let done = summary["published"].as_u64().unwrap();
    assert!((1..6).contains(&done), "{summary}");
    assert!(
        stderr.contains("Rederive finished"),
        "the log is on stderr: {stderr}"
    );

    let output = command("0").output().await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last: Value = serde_json::from_str(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        (
            last["summary"]["complete"].clone(),
            last["summary"]["published"].as_u64()
        ),
        (Value::Bool(true), Some(6 - done)),
        "the next run does the rest: {last}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_records_of_an_older_schema_are_derived_again_and_only_what_differs_is_published()
 {
    // Records are counted, and found, by their places in the topic; tansu
    // 0.6 compacts the test's topic while it runs, taking superseded
    // records away under it. What posbridge does is the same on either.
    kafka_only("tansu compacts the topic while the test counts its records");
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("rederive");
    let config = config(&brokers(), &prefix, dir.path());
    let products = format!("{prefix}.products");
    let admin: AdminClient<_> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let new =
        NewTopic::new(&products, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    for created in admin
        .create_topics([&new], &AdminOptions::new())
        .await
        .unwrap()
    {
        created.unwrap();
    }
    // 1. Three products an older build wrote with schema v1.
    let at = |minute: u32| format!("2026-11-29T10:{minute:02}:00Z");
    let micros = |minute: i64| 1_795_946_400_000_000 + minute * 60_000_000;
    for n in 1..=3 {
        let body = v1::product_created(
            &format!("v1-{n}"),
            &format!("P-{n}"),
            &format!("Kopi {n}"),
            &at(n),
        );
        write_v1_product(&brokers(), &products, &body, micros(i64::from(n))).await;
    }
    // 2. posbridge starts on them (its ledger filled from their headers);
    // a product today's code writes, and a newer state of P-3.
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let today = v1::product_created("now-4", "P-4", "Teh 4", &at(4));
    assert_eq!(app.send("mekari", "main", &today).await.status(), 200);
    let newer = v1::product_created("now-3", "P-3", "Kopi 3 Baru", &at(30));
    assert_eq!(app.send("mekari", "main", &newer).await.status(), 200);
    let before = read_topic(&brokers(), &products).len();
    assert_eq!(before, 5);

    // 3. A dry run: what would change, field by field; nothing written.
    let dry = Options {
        dry_run: true,
        sample: 10,
        ..Options::default()
    };
    let (summary, lines) = rederive(&app, &dry).await;
    assert_eq!((summary.differed, summary.published), (2, 0), "{summary:?}");
    assert_eq!(
        summary.unchanged, 2,
        "P-4 and P-3's newer state, written by today's code"
    );
    assert_eq!(
        summary.superseded, 1,
        "P-3's v1 record, replaced by a newer state"
    );
    assert_eq!(lines.len(), 3, "two keys and the summary: {lines:?}");
    let name = lines[0]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["field"] == "name")
        .expect("the name v1 had no place for");
    assert_eq!(
        (name["was"].clone(), name["now"].clone()),
        (Value::Null, json!("Kopi 1"))
    );
    assert_eq!(lines[0]["outcome"], "would_publish");
    assert_eq!(read_topic(&brokers(), &products).len(), before);

    // 4. The run: P-1 and P-2 published in their records' places.
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert_eq!(
        (
            summary.differed,
            summary.published,
            summary.stale,
            summary.unchanged
        ),
        (2, 2, 0, 2),
        "{summary:?}"
    );
    assert!(summary.complete && summary.failed.is_empty(), "{summary:?}");
    let records = read_topic(&brokers(), &products);
    let mut written: Vec<&Record> = records[before..].iter().collect();
    written.sort_by(|a, b| a.key.cmp(&b.key));
    let keys: Vec<&str> = written.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["mekari:P-1", "mekari:P-2"], "no other key rewritten");
    for (record, n) in written.into_iter().zip(1..) {
        let event = decode(record.payload.as_deref().unwrap()).unwrap();
        assert_eq!(event.name.as_deref(), Some(format!("Kopi {n}").as_str()));
        assert_eq!(event.sku.as_deref(), Some(format!("SKU-P-{n}").as_str()));
        assert_eq!(
            event.event_id,
            format!("v1-{n}"),
            "the record's own delivery"
        );
        assert_eq!(
            record.headers["posbridge-version"],
            format!("{}:0", micros(n))
        );
    }
    let p3 = records
        .iter()
        .rev()
        .find(|r| r.key == "mekari:P-3")
        .unwrap();
    assert_eq!(
        decode(p3.payload.as_deref().unwrap())
            .unwrap()
            .name
            .as_deref(),
        Some("Kopi 3 Baru"),
        "the newer state stays"
    );

    // 5. Again: nothing differs, nothing is written.
    let (summary, _) = rederive(&app, &Options::default()).await;
    assert_eq!((summary.differed, summary.published), (0, 0), "{summary:?}");
    assert_eq!(
        (summary.unchanged, summary.superseded),
        (4, 3),
        "{summary:?}"
    );
    assert_eq!(read_topic(&brokers(), &products).len(), before + 2);

    // 6. The same inside the serving process, from the admin listener (the
    // way with an embedded ledger `serve` holds): a dry run, watched to its end.
    let admin = posbridge::http::ingress::admin_router(app.admin_state(), &app.config.admin);
    let started = admin
        .clone()
        .oneshot(
            Request::post("/admin/rederive")
                .body(Body::from(r#"{"dry_run": true, "entity": "products"}"#))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let mut view = Value::Null;
    wait_until(Duration::from_secs(30), "the run to end", async || {
        let answer = admin
            .clone()
            .oneshot(Request::get("/admin/rederive").body(Body::empty()).unwrap())
            .await
            .unwrap();
        view = serde_json::from_slice(&answer.into_body().collect().await.unwrap().to_bytes())
            .unwrap();
        view["running"] == false
    })
    .await;
    assert_eq!(view["error"], Value::Null, "{view}");
    assert_eq!(view["summary"]["complete"], true, "{view}");
    assert_eq!(view["summary"]["differed"], 0, "{view}");
    assert_eq!(view["summary"]["unchanged"], 4, "{view}");
    assert_eq!(view["options"]["entity"], "products");
    app.stop().await;
}
