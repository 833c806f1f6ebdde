//! The operator's page as a person sees it: posbridge against the real
//! broker, deliveries of every outcome, the watchdog finding a switched-off
//! ReceiptRoller webhook (the provider simulator's), and `/status` opened in
//! headless Chromium (`chromium --dump-dom`: the document after the browser
//! parsed and laid it out). Also writes `target/tmp/status-page.png`, the
//! screenshot `docs/status-page.png` is a copy of.

use std::path::PathBuf;
use std::process::Command;

use posbridge::config::AdminConfig;
use posbridge::domain::event::ProviderKind;
use posbridge::services::reconcile::Reconciler;
use posbridge::services::watchdog::Watchdog;
use serde_json::json;

use crate::catch_up::{MEKARI_CLIENT_SECRET, switched_off_receiptroller};
use crate::support::{OwnBroker, TestApp, mekari_order, rr_sale, spool_config, unique};

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

/// Serves `app`'s admin router on a free loopback port as `serve` serves
/// it (the admin listener's connection rules) and returns the page's URL.
async fn serve_status(app: &TestApp) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = listener.local_addr().unwrap();
    let router = posbridge::http::ingress::admin_router(app.admin_state(), &AdminConfig::default());
    // Served as `serve` serves it: the admin listener's connection rules.
    let limits = posbridge::http::ingress::ConnectionLimits {
        header_read_timeout: std::time::Duration::from_secs(2),
        max_connections: 512,
        shutdown_timeout: std::time::Duration::from_secs(1),
        retry_after_secs: 1,
    };
    tokio::spawn(posbridge::http::ingress::serve_admin(
        listener,
        router,
        limits,
        std::future::pending(),
    ));
    format!("http://{admin}/status")
}

/// Chromium's screenshot of `url`, decoded: width, height, RGB pixels.
async fn screenshot(url: &str, name: &str) -> (usize, usize, Vec<[u8; 3]>) {
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || run_chromium(&[&arg, "--window-size=1280,2600", &url]))
        .await
        .unwrap();
    let file = std::fs::File::open(&shot).expect("chromium wrote the screenshot");
    let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
    decoder.set_transformations(png::Transformations::normalize_to_color8());
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut buffer).unwrap();
    let channels = frame.color_type.samples();
    let pixels = buffer[..frame.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    (frame.width as usize, frame.height as usize, pixels)
}

/// The separate places (4-connected blobs) a screenshot shows exactly the
/// colour `hex` (`#rrggbb`) in, by their size in pixels.
fn blobs_of(shot: &(usize, usize, Vec<[u8; 3]>), hex: &str) -> Vec<usize> {
    let (width, height, pixels) = shot;
    let channel = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap();
    let colour = [channel(1), channel(3), channel(5)];
    let mut seen: Vec<bool> = pixels.iter().map(|p| *p != colour).collect();
    let mut blobs = Vec::new();
    for start in 0..pixels.len() {
        if seen[start] {
            continue;
        }
        seen[start] = true;
        let (mut size, mut stack) = (0, vec![start]);
        while let Some(at) = stack.pop() {
            size += 1;
            let (x, y) = (at % width, at / width);
            let neighbours = [
                (x > 0).then(|| at - 1),
                (x + 1 < *width).then(|| at + 1),
                (y > 0).then(|| at - width),
                (y + 1 < *height).then(|| at + width),
            ];
            for next in neighbours.into_iter().flatten() {
                if !seen[next] {
                    seen[next] = true;
                    stack.push(next);
                }
            }
        }
        blobs.push(size);
    }
    blobs
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
    let findings = Watchdog::new(reconciler, std::time::Duration::from_secs(60))
        .check()
        .await;
    assert!(
        findings
            .iter()
            .any(|f| f.provider == ProviderKind::ReceiptRoller && !f.resumed),
        "{findings:?}"
    );

    let url = serve_status(&app).await;

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

    let (width, height, _) = screenshot(&url, "status-page.png").await;
    assert!(width > 0 && height > 0);
    app.stop().await;
}

/// The charts as a new user first reads them: a sale published and its
/// duplicate in the last minute, then two sales spooled while the broker
/// is frozen. What Chromium drew (its screenshot, decoded) holds each of
/// those outcomes' colour twice, in its legend and as a bar in the answers
/// chart, the p99 chart's dot, and the spool chart's bar; and nothing in
/// the colours of what did not happen (503, refused, dead-lettered).
#[tokio::test(flavor = "multi_thread")]
async fn a_new_users_first_deliveries_are_drawn_in_the_charts() {
    use posbridge::http::status::chart::{P99_COLOUR, SERIES, SPOOL_COLOUR};

    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = TestApp::start_with(spool_config(
        &broker.address(),
        &unique("charts"),
        dir.path(),
    ))
    .await;
    let sale = |n: u32| {
        rr_sale(
            &format!("charts-{n}"),
            "sale.created",
            "2026-11-30T10:15:30Z",
            &format!("T1|2026-11|{n:04}"),
            100,
        )
    };
    let outcome = |body: serde_json::Value| {
        let app = &app;
        async move {
            let answer: serde_json::Value = app
                .send("receiptroller", "main", &body)
                .await
                .json()
                .await
                .unwrap();
            answer["status"].as_str().unwrap_or_default().to_owned()
        }
    };
    assert_eq!(outcome(sale(1)).await, "published");
    assert_eq!(outcome(sale(1)).await, "duplicate");
    broker.freeze();
    assert_eq!(outcome(sale(2)).await, "spooled");
    assert_eq!(outcome(sale(3)).await, "spooled");

    let url = serve_status(&app).await;
    let shot = screenshot(&url, "status-charts.png").await;
    broker.thaw();
    let colour = |title: &str| SERIES.iter().find(|s| s.0 == title).unwrap().1;
    for drawn in ["published", "duplicate", "spooled"] {
        let blobs = blobs_of(&shot, colour(drawn));
        assert!(
            blobs.len() >= 2,
            "`{drawn}` in the legend and as a bar: {blobs:?}"
        );
    }
    assert!(!blobs_of(&shot, P99_COLOUR).is_empty(), "the p99 dot");
    assert!(!blobs_of(&shot, SPOOL_COLOUR).is_empty(), "the spool's bar");
    for absent in ["503", "refused", "dead-lettered"] {
        assert_eq!(
            blobs_of(&shot, colour(absent)),
            Vec::<usize>::new(),
            "{absent}"
        );
    }
    app.stop().await;
}
