//! A damaged ledger stops start-up instead of being taken for a new one.

use std::process::Output;

use crate::support::{TestApp, brokers, config_text, rr_sale, unique};

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

#[tokio::test]
async fn a_truncated_ledger_stops_start_up_and_ledger_check_reports_it() {
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

    std::fs::File::create(dir.path().join("ledger.redb")).unwrap();
    for args in [&["ledger", "check"][..], &["serve"][..]] {
        let output = posbridge(args, &path);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{args:?} accepted an empty ledger"
        );
        assert!(stderr.contains("exists but is empty"), "{args:?}: {stderr}");
    }
}
