//! A spool whose disk fills up during an outage: the delivery that does not
//! fit is answered 503, `/readyz` says the spool cannot write, what was
//! spooled still reaches Kafka once it is back, and once the disk has room
//! again the spool takes writes again without a restart (redb refuses every
//! write after one I/O error until its file is reopened). The disk is a real
//! tmpfs; the broker is cut and healed through the test's proxy.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::tmpfs::{Tmpfs, fill};
use crate::support::wait::look_for;
use crate::support::{
    Meter, OwnBroker, TestApp, own_source, read_topic, rr_sale, spool_config, unique,
};

/// A ReceiptRoller sale of about 50 KB (a long item name).
fn big_sale(n: u32) -> Value {
    let mut sale = rr_sale(
        &format!("full-spool-{n}"),
        "sale.created",
        "2026-11-29T10:15:30Z",
        &format!("T1|2026-11|{n:04}"),
        100 + u64::from(n),
    );
    sale["data"]["items"][0]["name"] = Value::from("x".repeat(50_000));
    sale
}

/// The `/readyz` body's `spool` object.
async fn spool_readiness(app: &TestApp) -> Value {
    let body: Value = app.get("/readyz").await.json().await.unwrap();
    body["spool"].clone()
}

/// Waits until `condition` holds of the app, 60 s at most; says what the
/// spool showed when it never did.
async fn until(app: &TestApp, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let held = look_for(Duration::from_secs(60), async || {
        condition().await.then_some(())
    })
    .await;
    if held.is_none() {
        panic!(
            "{what} never happened; spool: {}",
            spool_readiness(app).await
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spool_whose_disk_filled_takes_deliveries_again_once_it_has_room() {
    let disk = Tmpfs::mount("2m");
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = spool_config(&broker.address(), &unique("spoolfull"), dir.path());
    config.spool.path = disk.path().join("spool.redb");
    let source = unique("spoolfull");
    own_source(&mut config, "receiptroller", "main", &source);
    let app = TestApp::start_with(config).await;
    let spool = app.pipeline.spool().unwrap().clone();
    let filler = disk.path().join("filler");
    fill(&filler, 400 * 1024);

    // Kafka away: 50 KB sales are spooled until the disk is full.
    broker.cut();
    let mut spooled = Vec::new();
    let mut refused = None;
    for n in 0..40 {
        let response = app.send("receiptroller", &source, &big_sale(n)).await;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        match (status, body["status"].as_str()) {
            (200, Some("spooled")) => spooled.push(n),
            (503, _) => {
                refused = Some(n);
                break;
            }
            other => panic!("{other:?}: {body}"),
        }
    }
    let refused = refused.expect("the full disk never made an append fail");
    assert!(!spooled.is_empty(), "nothing fit on the disk");

    // Readiness tells the truth: no room while the spool cannot write.
    let shown = spool_readiness(&app).await;
    assert_eq!(shown["writable"], false, "{shown}");
    assert_eq!(shown["has_room"], false, "{shown}");
    assert!(shown["unwritable"].is_string(), "{shown}");
    assert_eq!(app.get("/readyz").await.status(), 503);

    // Kafka back: what was spooled reaches the topic, though the full disk
    // keeps the spool from removing it.
    broker.heal();
    let kafka_back = Instant::now();
    let before = Meter::read(&app).await;
    let topic = app.topic("sales");
    until(&app, "the spooled sales reaching the topic", async || {
        read_topic(&broker.address(), &topic).len() == spooled.len()
    })
    .await;

    // The disk has room again: the spool heals by itself, removes what it
    // replayed, and says so.
    std::fs::remove_file(&filler).unwrap();
    until(&app, "the spool healing and draining", async || {
        spool.stats().writable && spool.stats().entries == 0
    })
    .await;
    // By provider and outcome only: other tests' drains count too when
    // they run beside this one, so this is a figure, not an assertion.
    let replays = Meter::read(&app).await.delta(
        &before,
        "posbridge_spool_drained_total",
        &[("provider", "receiptroller"), ("outcome", "duplicate")],
    );
    println!(
        "{replays} duplicate replays in the {:.1} s from Kafka's return to the heal",
        kafka_back.elapsed().as_secs_f64()
    );
    let shown = spool_readiness(&app).await;
    assert_eq!(shown["writable"], true, "{shown}");
    assert!(shown.get("unwritable").is_none(), "{shown}");

    // The next outage is spooled again, not refused; and it drains.
    broker.cut();
    let retried = app.send("receiptroller", &source, &big_sale(refused)).await;
    let status = retried.status().as_u16();
    let body: Value = retried.json().await.unwrap();
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("spooled")),
        "the spool refused the next outage: {body}"
    );
    broker.heal();
    until(&app, "the second outage draining", async || {
        spool.stats().entries == 0
    })
    .await;

    let mut keys: Vec<String> = read_topic(&broker.address(), &topic)
        .into_iter()
        .map(|r| r.key)
        .collect();
    keys.sort_unstable();
    let mut expected: Vec<String> = spooled
        .iter()
        .chain([&refused])
        .map(|n| format!("receiptroller:T1|2026-11|{n:04}"))
        .collect();
    expected.sort_unstable();
    assert_eq!(keys, expected, "each sale exactly once");
    println!(
        "{} sales of 50 KB spooled before the disk filled; sale {refused} refused, then spooled after the heal",
        spooled.len()
    );
    app.stop().await;
}
