//! A damaged ledger or spool is reported by `ledger check` and set aside by
//! `serve`, which serves on a new file; a file another process holds is
//! refused.

use std::process::Output;

use crate::support::{TestApp, brokers, config_text, read_topic, rr_sale, unique};

fn posbridge(args: &[&str], config: &std::path::Path) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(args)
        .arg("--config")
        .arg(config)
        .env("POSBRIDGE_LOG", "off")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// The case: a sale published, posbridge stopped, one bit changed
/// in its delivery id inside the ledger file. `ledger check` reports the file
/// damaged and says what `serve` does; `serve` then sets it aside, fills a
/// new ledger from the topics and serves: the sale's retry finds its state,
/// known from its record in the topic, and publishes nothing.
#[tokio::test]
async fn a_damaged_ledger_is_set_aside_and_filled_again_from_the_topics() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("damaged");
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, config_text(&brokers(), &prefix, dir.path())).unwrap();

    let app = TestApp::start_with(crate::support::config(&brokers(), &prefix, dir.path())).await;
    let sale = rr_sale(
        "d-1",
        "sale.created",
        "2026-11-30T08:00:00Z",
        "T1|2026-11|1",
        1200,
    );
    assert_eq!(app.send("receiptroller", "main", &sale).await.status(), 200);
    app.stop().await;

    let checked = posbridge(&["ledger", "check"], &path);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(report["ledger"]["done_deliveries"], 1, "{report}");
    assert_eq!(report["ledger"]["entities"], 1, "{report}");

    let ledger = dir.path().join("ledger.redb");
    let mut bytes = std::fs::read(&ledger).unwrap();
    // Every copy the file holds (freed pages keep older ones).
    let copies: Vec<usize> = (0..bytes.len() - 2)
        .filter(|&at| &bytes[at..at + 3] == b"d-1")
        .collect();
    assert!(!copies.is_empty(), "the delivery id is in the file");
    for at in copies {
        bytes[at + 2] ^= 0x01;
    }
    std::fs::write(&ledger, &bytes).unwrap();

    let checked = posbridge(&["ledger", "check"], &path);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(
        !checked.status.success(),
        "a damaged ledger passed: {stderr}"
    );
    assert!(
        stderr.contains("fills a new ledger from the topics"),
        "{stderr}"
    );
    assert!(!stderr.contains("publish again"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(report["ledger"]["status"], "damaged", "{report}");

    let app = TestApp::start_with(crate::support::config(&brokers(), &prefix, dir.path())).await;
    // The delivery arrived within dedup_ttl (its record carries its
    // arrival), so its id is restored: the retry is a duplicate.
    let again = app.send("receiptroller", "main", &sale).await;
    assert_eq!(again.status(), 200);
    assert_eq!(
        again.json::<serde_json::Value>().await.unwrap()["status"],
        "duplicate",
        "the new ledger holds the delivery's id from its record"
    );
    // Its state is restored too: the same sale under another delivery id
    // writes nothing.
    let mut resent = sale.clone();
    resent["id"] = "d-2".into();
    let other = app.send("receiptroller", "main", &resent).await;
    assert_eq!(
        other.json::<serde_json::Value>().await.unwrap()["status"],
        "unchanged",
        "the new ledger holds the sale's state from its record"
    );
    assert_eq!(read_topic(&brokers(), &app.topic("sales")).len(), 1);
    let set_aside = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|file| {
            file.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("ledger.redb.damaged-")
        })
        .count();
    assert_eq!(set_aside, 1, "the damaged file is kept for a look");
    app.stop().await;
}

/// A ledger a running posbridge holds is in use, not damaged: `ledger check`
/// and a second `serve` name the process that holds it and say not to move
/// the file, instead of calling it damaged and advising to move it aside.
#[tokio::test]
async fn a_ledger_held_by_a_running_posbridge_is_in_use_not_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("held");
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, config_text(&brokers(), &prefix, dir.path())).unwrap();
    let app = TestApp::start_with(crate::support::config(&brokers(), &prefix, dir.path())).await;

    let holder = format!("in use by process {}", std::process::id());
    for args in [&["ledger", "check"][..], &["serve"][..]] {
        let output = posbridge(args, &path);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} opened a held ledger");
        assert!(stderr.contains(&holder), "{args:?}: {stderr}");
        assert!(stderr.contains("is not damaged"), "{args:?}: {stderr}");
        assert!(!stderr.contains("is damaged"), "{args:?}: {stderr}");
    }
    let checked = posbridge(&["ledger", "check"], &path);
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(report["ledger"]["status"], "in_use", "{report}");
    app.stop().await;
}

/// `ledger check` on a spool whose pages redb panics on reports it damaged,
/// with the ledger's counts beside it, and prints no panic.
#[tokio::test]
async fn ledger_check_reports_a_damaged_spool_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("posbridge.toml");
    let text = crate::support::spool_config_text(&brokers(), &unique("dspool"), dir.path());
    std::fs::write(&path, &text).unwrap();
    let config = posbridge::config::Config::from_toml(&text).unwrap();
    {
        let spool = posbridge::adapters::spool::Spool::open(&config.spool).unwrap();
        for i in 0..3 {
            let id = format!("dspool-{i}");
            let body = serde_json::to_vec(&rr_sale(
                &id,
                "sale.created",
                "2026-11-30T08:00:00Z",
                "T1|2026-11|1",
                100,
            ))
            .unwrap();
            spool
                .append(&posbridge::adapters::spool::SpooledDelivery {
                    key: posbridge::domain::event::DeliveryKey::new(
                        posbridge::domain::event::ProviderKind::ReceiptRoller,
                        &id,
                    ),
                    source: posbridge::domain::event::Source {
                        provider: posbridge::domain::event::ProviderKind::ReceiptRoller,
                        name: "main".into(),
                        account: None,
                        topic_prefix: None,
                    },
                    delivery_id: id,
                    received_at: time::OffsetDateTime::now_utc(),
                    body: body.into(),
                })
                .await
                .unwrap();
        }
    }
    // 16 KB overwritten after the header: redb panics reading its tables.
    let spool_file = dir.path().join("spool.redb");
    let mut bytes = std::fs::read(&spool_file).unwrap();
    bytes[4096..4096 + 16384].fill(0xa5);
    std::fs::write(&spool_file, bytes).unwrap();

    let checked = posbridge(&["ledger", "check"], &path);
    let stderr = String::from_utf8_lossy(&checked.stderr);
    assert!(
        !checked.status.success(),
        "a damaged spool passed: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("spool.redb is damaged"), "{stderr}");
    assert!(stderr.contains("moves every intact entry"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout).unwrap();
    assert_eq!(report["spool"]["status"], "damaged", "{report}");
    assert_eq!(report["ledger"]["status"], "ok", "{report}");
}
