//! Each delivery id produces at most one record, however often and from
//! however many sources it arrives, and across a restart. Copies of one
//! delivery at once are unit-tested on the fake broker
//! (`pipeline/tests/broker.rs`).

use crate::support::{Meter, TestApp, brokers, config, own_source, read_topic, rr_sale, unique};

#[tokio::test]
async fn duplicate_delivery_produces_one_record() {
    // Sources of its own, so their request counts are this test's alone.
    let (main, backup) = (unique("dup-main"), unique("dup-backup"));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&brokers(), &unique("dedup"), dir.path());
    own_source(&mut cfg, "receiptroller", "main", &main);
    own_source(&mut cfg, "receiptroller", "backup", &backup);
    let mut app = TestApp::start_with(cfg).await;
    app.keep(dir);
    let before = Meter::read(&app).await;
    let body = rr_sale(
        "dup-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|1",
        500,
    );
    let first = app.send("receiptroller", &main, &body).await;
    assert_eq!(first.status(), 200);
    let again = app.send("receiptroller", &main, &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );
    // ReceiptRoller repeats the id from every subscribed webhook.
    let other_source = app.send("receiptroller", &backup, &body).await;
    assert_eq!(other_source.status(), 200);
    assert_eq!(
        other_source.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );
    assert_eq!(read_topic(&brokers(), &app.topic("sales")).len(), 1);
    let after = Meter::read(&app).await;
    let requests = |source: &str, outcome: &str| {
        after.delta(
            &before,
            "posbridge_webhook_requests_total",
            &[
                ("provider", "receiptroller"),
                ("source", source),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(
        (
            requests(&main, "published"),
            requests(&main, "duplicate"),
            requests(&backup, "published"),
            requests(&backup, "duplicate"),
        ),
        (1.0, 1.0, 0.0, 1.0),
        "(main published, main duplicate, backup published, backup duplicate)"
    );
    app.stop().await;
}

#[tokio::test]
async fn restart_keeps_dedup() {
    let app = TestApp::start().await;
    let config = app.config.clone();
    let body = rr_sale(
        "dup-3",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|3",
        500,
    );
    assert_eq!(app.send("receiptroller", "main", &body).await.status(), 200);
    let topic = app.topic("sales");
    let dir = app.stop().await;

    let restarted = TestApp::start_with(config).await;
    let retry = restarted.send("receiptroller", "main", &body).await;
    assert_eq!(retry.status(), 200);
    assert_eq!(
        retry.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate"
    );
    assert_eq!(read_topic(&brokers(), &topic).len(), 1);
    restarted.stop().await;
    drop(dir);
}
