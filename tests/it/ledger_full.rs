//! A ledger whose disk fills up: its checkpoints fail, not the deliveries
//! (their outcomes are in the topics and in memory), `/readyz` and the
//! gauge say so, and once space is freed the checkpoints work again without
//! a restart; what was answered meanwhile is remembered across a restart.
//! The disk is a real tmpfs of a few MiB.

use std::time::Duration;

use crate::support::tmpfs::{Tmpfs, fill};
use crate::support::wait::look_for;
use crate::support::{TestApp, brokers, config, read_topic, rr_sale, unique};

/// The `i`-th state of sale S-1: one second later each.
fn sale(delivery: &str, i: u32) -> serde_json::Value {
    let at = format!(
        "2026-11-30T{:02}:{:02}:{:02}Z",
        1 + i / 3600,
        i / 60 % 60,
        i % 60
    );
    rr_sale(
        delivery,
        "sale.updated",
        &at,
        "T1|2026-11|1",
        1000 + u64::from(i),
    )
}

/// The answer's status to the `i`-th state of sale S-1 under `delivery`.
async fn status(app: &TestApp, delivery: &str, i: u32) -> serde_json::Value {
    let response = app.send("receiptroller", "main", &sale(delivery, i)).await;
    response.json::<serde_json::Value>().await.unwrap()["status"].clone()
}

#[tokio::test]
async fn a_full_disk_fails_the_checkpoints_not_the_deliveries_and_freeing_space_heals_them() {
    let disk = Tmpfs::mount("4m");
    let prefix = unique("fulldisk");
    let mut config = config(&brokers(), &prefix, disk.path());
    config.ledger.checkpoint_interval_ms = 100;
    let app = TestApp::start_with(config.clone()).await;
    let filler = disk.path().join("filler");
    fill(&filler, 32 * 1024);

    // Newer states of one sale until a checkpoint cannot write them: every
    // one is still answered.
    let mut newest = 0;
    let mut failing = false;
    for i in 100..5100 {
        let response = app
            .send("receiptroller", "main", &sale(&format!("full-{i}"), i))
            .await;
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        newest = i;
        if i % 50 == 0 {
            let ready: serde_json::Value = app.get("/readyz").await.json().await.unwrap();
            if ready["ledger"]
                .as_str()
                .unwrap_or_default()
                .contains("failing")
            {
                failing = true;
                break;
            }
        }
    }
    assert!(failing, "the full disk never made a checkpoint fail");
    // The gauge `posbridge_ledger_writable` is process-wide, shared by the
    // suite's apps: its 0 is checked on a recorder of its own
    // (ledger::embedded::checkpoint's unit test); /readyz above is this app's.
    // Deliveries go on, decided from memory: an older state is stale.
    assert_eq!(status(&app, "full-older", 1).await, "stale");
    newest += 1;
    assert_eq!(
        status(&app, &format!("full-{newest}"), newest).await,
        "published",
        "taken while the checkpoints fail"
    );

    // Space comes back: the checkpoints work again by themselves.
    std::fs::remove_file(&filler).unwrap();
    let healed = look_for(Duration::from_secs(15), async || {
        (app.get("/readyz").await.status() == 200).then_some(())
    })
    .await;
    assert!(
        healed.is_some(),
        "the ledger did not heal: {}",
        app.get("/readyz").await.text().await.unwrap()
    );
    app.stop().await;

    // What was answered is remembered after a restart: a resend is a
    // duplicate (the older state's delivery too), and another older state
    // is stale.
    let app = TestApp::start_with(config).await;
    assert_eq!(
        status(&app, &format!("full-{newest}"), newest).await,
        "duplicate"
    );
    assert_eq!(status(&app, "full-older", 1).await, "duplicate");
    assert_eq!(status(&app, "full-older-2", 2).await, "stale");

    // The topic never went back: states in order, the last one the newest.
    let records = read_topic(&brokers(), &app.topic("sales"));
    let order: Vec<u32> = records
        .iter()
        .map(|r| {
            let id = &r.headers["posbridge-delivery-id"];
            assert!(
                !id.starts_with("full-older"),
                "an older state reached the topic"
            );
            id.trim_start_matches("full-").parse().unwrap()
        })
        .collect();
    assert!(
        order.is_sorted(),
        "the topic went back to an older state: {order:?}"
    );
    assert_eq!(order.last(), Some(&newest));
    println!(
        "{} deliveries answered, the checkpoints failing from some point until space was freed",
        order.len()
    );
    app.stop().await;
}
