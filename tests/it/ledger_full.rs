//! A ledger whose disk fills up: deliveries are refused (503) instead of
//! being taken without a record, and everything works again once space is
//! freed, without a restart. The disk is a real tmpfs of a few MiB.

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

#[tokio::test]
async fn a_full_disk_fences_the_ledger_and_freeing_space_heals_it_without_a_restart() {
    let disk = Tmpfs::mount("4m");
    let prefix = unique("fulldisk");
    let app = TestApp::start_with(config(&brokers(), &prefix, disk.path())).await;
    let filler = disk.path().join("filler");
    fill(&filler, 32 * 1024);

    // Newer states of one sale until the ledger cannot record one.
    let mut answered = Vec::new();
    let mut refused_at = None;
    for i in 100..5100 {
        let delivery = format!("full-{i}");
        let response = app.send("receiptroller", "main", &sale(&delivery, i)).await;
        match response.status().as_u16() {
            200 => answered.push((delivery, i)),
            503 => {
                refused_at = Some(i);
                break;
            }
            other => panic!("{other}: {}", response.text().await.unwrap()),
        }
    }
    let refused_at = refused_at.expect("the full disk never made a write fail");
    let (last_delivery, newest) = answered.last().cloned().expect("nothing fit on the disk");

    // Fenced: an older state is refused, not published over the newer one,
    // and /readyz says why.
    let older = app
        .send("receiptroller", "main", &sale("full-older", 1))
        .await;
    assert_eq!(
        older.status(),
        503,
        "an older state was taken while the ledger cannot write"
    );
    assert!(older.headers().contains_key("retry-after"));
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert!(
        body["ledger"]
            .as_str()
            .unwrap_or_default()
            .contains("failing"),
        "{body}"
    );
    assert!(crate::support::metric(&app.metrics().await, "posbridge_ledger_writable", &[]) == 0.0);

    // Space comes back: the ledger heals by itself.
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

    // What was answered 2xx before the fence is remembered (a resend is a
    // duplicate), the newest state is known (the older one is stale), and
    // the refused delivery goes through on its retry.
    let again = app
        .send("receiptroller", "main", &sale(&last_delivery, newest))
        .await;
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );
    let older = app
        .send("receiptroller", "main", &sale("full-older", 1))
        .await;
    assert_eq!(
        older.json::<serde_json::Value>().await.unwrap()["status"],
        "stale"
    );
    let retried = app
        .send(
            "receiptroller",
            "main",
            &sale(&format!("full-{refused_at}"), refused_at),
        )
        .await;
    assert_eq!(
        retried.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );

    // The topic never went back: states in order, the last one the newest.
    let records = read_topic(&brokers(), &app.topic("sales"));
    let order: Vec<u32> = records
        .iter()
        .map(|r| {
            let id = &r.headers["posbridge-delivery-id"];
            assert_ne!(id, "full-older", "the older state reached the topic");
            id.trim_start_matches("full-").parse().unwrap()
        })
        .collect();
    assert!(
        order.is_sorted(),
        "the topic went back to an older state: {order:?}"
    );
    assert_eq!(order.last(), Some(&refused_at));
    println!(
        "{} deliveries recorded before the disk filled; the fence refused the next until space was freed",
        answered.len()
    );
    app.stop().await;
}
