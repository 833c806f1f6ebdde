//! The operator's page as a person sees it: posbridge against the real
//! broker, deliveries of every outcome, the watchdog finding a switched-off
//! ReceiptRoller webhook (the provider simulator's), and `/status` opened in
//! headless Chromium (`chromium --dump-dom`: the document after the browser
//! parsed and laid it out). Also writes `target/tmp/status-page.png`, the
//! screenshot `docs/status-page.png` is a copy of.

use std::path::PathBuf;
use std::process::Command;

use posbridge::config::AdminConfig;
use posbridge::event::ProviderKind;
use posbridge::reconcile::Reconciler;
use posbridge::watchdog::Watchdog;
use serde_json::json;

use crate::catch_up::{MEKARI_CLIENT_SECRET, switched_off_receiptroller};
use crate::support::mekari_order;

/// Which Chromium to drive: `POSBRIDGE_TEST_CHROMIUM`, else `chromium`
/// (Debian's package, which `.ci/run` installs).
fn chromium() -> String {
    std::env::var("POSBRIDGE_TEST_CHROMIUM").unwrap_or_else(|_| "chromium".to_owned())
}

/// Runs headless Chromium with `args` and returns its standard output.
fn run_chromium(args: &[&str]) -> String {
    let output = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
        ])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{}` ({e}): install Debian's chromium package or set POSBRIDGE_TEST_CHROMIUM",
                chromium()
            )
        });
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The visible text of an HTML document: its tags dropped, entities of the
/// page's own escaping read back, runs of white space made one.
fn visible_text(html: &str) -> String {
    let body = html.split("<body>").nth(1).unwrap_or(html);
    let mut text = String::new();
    let mut in_tag = false;
    for c in body.chars() {
        match c {
            '<' => in_tag = true,
            '>' => {
                in_tag = false;
                text.push(' ');
            }
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text of the section of one source.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(title)
        .unwrap_or_else(|| panic!("no section `{title}` in: {text}"));
    let rest = &text[start + title.len()..];
    let end = rest.find(" / main").map_or(rest.len(), |i| {
        // The next section's title starts with its provider's name.
        rest[..i].rfind(' ').unwrap_or(i)
    });
    &rest[..end]
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_sees_the_sources_their_deliveries_and_a_switched_off_webhook() {
    // The simulator's ReceiptRoller deliveries are refused (401s on the
    // page) until its webhook switches off.
    let (app, sim) = switched_off_receiptroller("status", "12", "5").await;

    // Every outcome on the Mekari source, beside what the simulator sent.
    let send = |body: serde_json::Value| {
        let app = &app;
        async move { app.send("mekari", "main", &body).await.status().as_u16() }
    };
    let newer = mekari_order(
        "ops-new",
        "order.updated",
        "2026-11-30T10:00:00+07:00",
        "ORD-OPS",
        "done",
    );
    assert_eq!(send(newer.clone()).await, 200);
    assert_eq!(send(newer).await, 200, "duplicate");
    let older = mekari_order(
        "ops-old",
        "order.updated",
        "2026-11-30T09:00:00+07:00",
        "ORD-OPS",
        "queued",
    );
    assert_eq!(send(older).await, 200, "stale");
    let broken = json!({"id": "ops-broken", "event": "order.updated", "occurred_at": "2026-11-30T10:00:00+07:00"});
    assert_eq!(send(broken).await, 200, "dead-lettered");
    let body = serde_json::to_vec(&mekari_order(
        "ops-a",
        "order.created",
        "2026-11-30T10:00:00+07:00",
        "ORD-A",
        "queued",
    ))
    .unwrap();
    let mismatched = app
        .send_raw("mekari", "main", "ops-b", body.clone(), None)
        .await;
    assert_eq!(mismatched.status(), 400);
    let forged = app
        .send_raw("mekari", "main", "ops-forged", body, Some("not-the-secret"))
        .await;
    assert_eq!(forged.status(), 401);
    let huge = vec![b' '; app.config.server.body_limit_bytes + 1];
    let too_large = app.send_raw("mekari", "main", "ops-huge", huge, None).await;
    assert_eq!(too_large.status(), 413);

    // The watchdog checks the webhooks (it leaves ReceiptRoller's off) and
    // catches up through the API: both show on the board.
    let watched = sim.configure_with(&app.config, MEKARI_CLIENT_SECRET, false);
    let reconciler = Reconciler::new(&watched, app.pipeline.clone())
        .unwrap()
        .with_board(app.board.clone());
    let findings = Watchdog::new(reconciler).check().await;
    assert!(
        findings
            .iter()
            .any(|f| f.provider == ProviderKind::ReceiptRoller && !f.resumed),
        "{findings:?}"
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let router = posbridge::ingress::admin_router(
        posbridge::ingress::AdminState {
            pipeline: app.pipeline.clone(),
            board: app.board.clone(),
        },
        &AdminConfig::default(),
    );
    // Served as `serve` serves it: the admin listener's connection rules.
    let limits = posbridge::ingress::ConnectionLimits {
        header_read_timeout: std::time::Duration::from_secs(2),
        max_connections: 512,
        shutdown_timeout: std::time::Duration::from_secs(1),
        retry_after_secs: 1,
    };
    tokio::spawn(posbridge::ingress::serve_admin(
        listener,
        router,
        limits,
        std::future::pending(),
    ));
    let url = format!("http://{admin}/status");

    let dom = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_chromium(&["--dump-dom", &url])
    })
    .await
    .unwrap();
    let text = visible_text(&dom);
    assert!(
        text.contains("broker ledger schema registry spool"),
        "{text}"
    );

    let rr = section(&text, "receiptroller / main");
    assert!(rr.contains("Webhook: switched off / paused"), "{rr}");
    assert!(rr.contains("Last reconcile run"), "{rr}");
    assert!(
        rr.contains("401 unauthorized"),
        "the simulator's refused deliveries: {rr}"
    );
    let failures: u64 = rr
        .split("Signature failures since start: ")
        .nth(1)
        .and_then(|rest| rest.split([',', '.']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no signature failure count: {rr}"));
    assert!(failures >= 4, "four refusals switched it off: {rr}");

    let mekari = section(&text, "mekari / main");
    assert!(mekari.contains("Webhook: active"), "{mekari}");
    // Each delivery's row as a person reads it: id, event type and entity
    // key (when there is one), outcome.
    for row in [
        "ops-new order.updated mekari:ORD-OPS published",
        "ops-new duplicate",
        "ops-old order.updated mekari:ORD-OPS stale",
        "ops-broken dead-lettered (missing_field)",
        "ops-b 400 rejected",
        "ops-forged 401 unauthorized",
        "ops-huge 413 rejected",
    ] {
        assert!(mekari.contains(row), "no row `{row}`: {mekari}");
    }
    // The counts row of the last five minutes: published, duplicate, stale,
    // unchanged, dead-lettered, spooled, then refusals 401, 400, 408, 413, 503.
    let row: Vec<u64> = mekari
        .split("last 5 min ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .take(11)
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        row[0] >= 1 && row[1] >= 1 && row[2] >= 1 && row[4] >= 1,
        "{row:?}"
    );
    assert_eq!(
        &row[6..],
        &[1, 1, 0, 1, 0],
        "one 401, one 400, one 413: {row:?}"
    );

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || run_chromium(&[&arg, "--window-size=1280,2600", &url]))
        .await
        .unwrap();
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    app.stop().await;
}
