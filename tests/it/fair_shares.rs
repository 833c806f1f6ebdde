//! Fair shares on a real broker: one source floods while another sends at
//! its rate. The other is never refused; the flooding Mekari source is
//! slowed with 429 + `Retry-After`; a flooding ReceiptRoller source is
//! answered 200 (`spooled` when its share did not come free within the
//! wait) and every delivery of it ends published; one with no spool is
//! answered 200 all the same. A source sending far more a second than the
//! others is paced: its deliveries wait for their slots, and past the wait
//! are slowed the same ways.

use std::collections::HashSet;
use std::time::Duration;

use posbridge::config::Config;
use serde_json::Value;

use crate::support::wait::wait_until;
use crate::support::{
    Meter, TestApp, brokers, mekari_order, own_source, read_topic, rr_sale, spool_config, timed,
    unique,
};

/// Requests of the flooding source, all sent at once: far past the busy
/// mark and its share.
const FLOOD: usize = 240;
/// The quiet source's deliveries, one every [`QUIET_PACE`], during the flood.
const QUIET: usize = 20;
const QUIET_PACE: Duration = Duration::from_millis(40);

/// What a request was answered: status, `status` field, `Retry-After`.
type Answer = (u16, String, Option<String>);

fn sale(tag: &str, n: usize) -> Value {
    rr_sale(
        &format!("{tag}-{n}"),
        "sale.created",
        "2026-11-29T10:15:30Z",
        &format!("{tag}|2026-11|{n:05}"),
        100,
    )
}

fn order(tag: &str, n: usize) -> Value {
    mekari_order(
        &format!("{tag}-{n}"),
        "order.updated",
        "2026-11-29T17:15:30+07:00",
        &format!("{tag}-ORD-{n}"),
        "new",
    )
}

/// Sends `flood` bodies to `flooder` all at once while `quiet` bodies go
/// to `calm` one every `pace`, the first answered before the flood begins
/// (the quiet merchant was sending at its rate when the other's flood
/// came); returns both sides' answers.
async fn flood_beside_quiet(
    app: &TestApp,
    provider: &str,
    (flooder, flood): (&str, Vec<Value>),
    (calm, quiet): (&str, Vec<Value>),
    pace: Duration,
) -> (Vec<Answer>, Vec<Answer>) {
    let answer = async |request| {
        let answer = timed(request).await;
        let what = answer.what();
        (answer.status, what, answer.retry_after)
    };
    let (first, rest) = quiet.split_first().expect("a quiet delivery at least");
    let before_the_flood = answer(app.request(provider, calm, first)).await;
    let flooding: Vec<_> = flood
        .iter()
        .map(|body| tokio::spawn(answer(app.request(provider, flooder, body))))
        .collect();
    let mut calm_answers = Vec::new();
    for body in rest {
        calm_answers.push(tokio::spawn(answer(app.request(provider, calm, body))));
        tokio::time::sleep(pace).await;
    }
    let mut flood_answers = Vec::new();
    for request in flooding {
        flood_answers.push(request.await.unwrap());
    }
    let mut quiet_answers = vec![before_the_flood];
    for request in calm_answers {
        quiet_answers.push(request.await.unwrap());
    }
    (flood_answers, quiet_answers)
}

/// Every sale of `sent` ends published: the drainer takes the spooled.
async fn all_published(app: &TestApp, sent: &[Value]) {
    let spool = app.pipeline.spool().expect("a spooling configuration");
    wait_until(Duration::from_secs(30), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;
    let keys: HashSet<String> = read_topic(&brokers(), &app.topic("sales"))
        .into_iter()
        .map(|record| record.key)
        .collect();
    let missing: Vec<_> = sent
        .iter()
        .map(|body| body["data"]["id"].as_str().unwrap())
        .filter(|id| !keys.iter().any(|key| key.ends_with(*id)))
        .collect();
    assert!(missing.is_empty(), "not published: {missing:?}");
}

/// A spooling configuration whose four sources are renamed for one test
/// alone (`{tag}-rr-main`, …), so the series it reads count its own
/// deliveries (the suite's apps share one recorder): ReceiptRoller `main`
/// (spools) and `backup` (does not), Mekari `main` and `acme`.
fn own_four_sources(tag: &str, dir: &std::path::Path) -> (Config, [String; 4]) {
    let mut config = spool_config(&brokers(), &unique(tag), dir);
    let names =
        ["rr-main", "rr-backup", "mk-main", "mk-acme"].map(|n| unique(&format!("{tag}-{n}")));
    for ((provider, from), to) in [
        ("receiptroller", "main"),
        ("receiptroller", "backup"),
        ("mekari", "main"),
        ("mekari", "acme"),
    ]
    .into_iter()
    .zip(&names)
    {
        own_source(&mut config, provider, from, to);
    }
    (config, names)
}

fn count(answers: &[Answer], status: u16, what: &str) -> usize {
    answers
        .iter()
        .filter(|(s, w, _)| *s == status && (what.is_empty() || w == what))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_source_is_slowed_as_its_provider_understands_and_the_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    // ReceiptRoller `main` spools; `backup` does not. Mekari `main` and
    // `acme`. The shares at their defaults, but busy from 8 in flight, and
    // ReceiptRoller `main` with a share of its own of one: its flood's tail
    // waits past the wait (`inflight_wait_ms`, 500 ms here) and is spooled.
    let (mut config, [rr_main, rr_backup, mk_main, mk_acme]) =
        own_four_sources("share", dir.path());
    config.server.busy_in_flight = 8;
    config.server.inflight_wait_ms = 500;
    // The bound in flight alone: the pace has a test of its own (below).
    config.server.share_per_second = 0;
    config
        .receiptroller
        .sources
        .get_mut(&rr_main)
        .unwrap()
        .max_in_flight = Some(1);
    let app = TestApp::start_with(config).await;
    let over_share = "posbridge_deliveries_over_share_total";
    let started = app.metrics().await;
    assert!(
        started
            .lines()
            .any(|line| line.starts_with(over_share)
                && line.contains(&format!("source=\"{mk_acme}\""))),
        "the series exist from start-up"
    );
    let before = Meter::read(&app).await;

    // Mekari `main` floods while `acme` sends at its rate.
    let mk_flood = (0..FLOOD).map(|n| order("mkf", n)).collect();
    let mk_quiet = (0..QUIET).map(|n| order("mkq", n)).collect();
    let (flood, quiet) = flood_beside_quiet(
        &app,
        "mekari",
        (mk_main.as_str(), mk_flood),
        (mk_acme.as_str(), mk_quiet),
        QUIET_PACE,
    )
    .await;
    let refused = count(&flood, 429, "");
    println!(
        "mekari: flood {refused} of {FLOOD} answered 429, {} published; quiet {} of {QUIET} published",
        count(&flood, 200, "published"),
        count(&quiet, 200, "published"),
    );
    assert_eq!(
        count(&quiet, 200, "published"),
        QUIET,
        "the quiet Mekari source is never refused: {quiet:?}"
    );
    assert!(
        refused > 0,
        "the flooding Mekari source is slowed by 429: 0 of {FLOOD} answered 429 ({} published)",
        count(&flood, 200, "published"),
    );
    assert_eq!(
        refused + count(&flood, 200, "published"),
        FLOOD,
        "the flood is answered 429 or published, nothing else: {flood:?}"
    );
    for (status, _, retry_after) in &flood {
        if *status == 429 {
            let secs: u64 = retry_after
                .as_deref()
                .expect("a 429 carries Retry-After")
                .parse()
                .expect("Retry-After in seconds");
            assert!((31..=3600).contains(&secs), "Retry-After {secs}");
        }
    }

    // ReceiptRoller `main` (spooling) floods while `backup` sends at its
    // rate. Over its share, a delivery waits for its share first.
    let rr_flood: Vec<Value> = (0..FLOOD).map(|n| sale("rrf", n)).collect();
    let rr_quiet = (0..QUIET).map(|n| sale("rrq", n)).collect();
    let (flood, quiet) = flood_beside_quiet(
        &app,
        "receiptroller",
        (rr_main.as_str(), rr_flood.clone()),
        (rr_backup.as_str(), rr_quiet),
        QUIET_PACE,
    )
    .await;
    let spooled = count(&flood, 200, "spooled");
    println!(
        "receiptroller: flood {spooled} of {FLOOD} spooled, {} published; quiet {} of {QUIET} published",
        count(&flood, 200, "published"),
        count(&quiet, 200, "published"),
    );
    assert_eq!(
        count(&quiet, 200, "published"),
        QUIET,
        "the quiet ReceiptRoller source is never refused: {quiet:?}"
    );
    assert_eq!(
        count(&flood, 200, ""),
        FLOOD,
        "a flooding ReceiptRoller source is never refused: {flood:?}"
    );
    assert!(
        spooled > 0,
        "the flooding ReceiptRoller source is slowed by the spool: 0 of {FLOOD} spooled"
    );
    all_published(&app, &rr_flood).await;

    // ReceiptRoller `backup` (no spool) floods while `main` sends at its
    // rate: both answered 200, none refused.
    let rr_flood = (0..FLOOD).map(|n| sale("rrn", n)).collect();
    let rr_quiet = (0..QUIET).map(|n| sale("rrm", n)).collect();
    let (flood, quiet) = flood_beside_quiet(
        &app,
        "receiptroller",
        (rr_backup.as_str(), rr_flood),
        (rr_main.as_str(), rr_quiet),
        QUIET_PACE,
    )
    .await;
    assert_eq!(count(&flood, 200, "published"), FLOOD, "{flood:?}");
    assert_eq!(count(&quiet, 200, ""), QUIET, "{quiet:?}");

    // Counted, by source and by what was done: this test's change alone.
    let after = Meter::read(&app).await;
    let slowed = |provider, source: &str, action| {
        after.delta(
            &before,
            over_share,
            &[
                ("provider", provider),
                ("source", source),
                ("action", action),
            ],
        )
    };
    assert_eq!(slowed("mekari", &mk_main, "refused"), refused as f64);
    assert_eq!(slowed("receiptroller", &rr_main, "spooled"), spooled as f64);
    assert!(slowed("receiptroller", &rr_main, "waited") > 0.0);
    assert!(slowed("receiptroller", &rr_backup, "waited") > 0.0);
    assert_eq!(slowed("mekari", &mk_acme, "refused"), 0.0);
    app.stop().await;
}

/// Each flooding source's rate here (`max_per_second`), and the flood: its
/// rate's worth at once and three times more.
const RATE: u32 = 20;
const PACED_FLOOD: usize = 4 * RATE as usize;
/// The quiet source's gap between two deliveries: 10 a second, so the
/// flood's pace is its own rate (twice the quiet one's is no more).
const QUIET_GAP: Duration = Duration::from_millis(100);

/// A source sending its rate's worth of deliveries at once and three times
/// more, beside one sending ten a second, the process never busy (the
/// bound in flight never applies): past its rate the flood is paced (a
/// burst of 100 ms at its rate, then a slot each 1/20 s), and what would
/// wait past the wait (`inflight_wait_ms`, 1 s here) is slowed: Mekari's at
/// once with 429 + `Retry-After`; ReceiptRoller's at the wait's end,
/// spooled, every delivery published. The quiet sources are never paced
/// nor refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_sending_far_more_a_second_than_the_others_is_paced() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, [rr_main, rr_backup, mk_main, mk_acme]) = own_four_sources("pace", dir.path());
    config.server.busy_in_flight = 100_000;
    config.server.inflight_wait_ms = 1000;
    config
        .receiptroller
        .sources
        .get_mut(&rr_main)
        .unwrap()
        .max_per_second = Some(RATE);
    config
        .mekari
        .sources
        .get_mut(&mk_main)
        .unwrap()
        .max_per_second = Some(RATE);
    let app = TestApp::start_with(config).await;
    let before = Meter::read(&app).await;

    let rr_flood: Vec<Value> = (0..PACED_FLOOD).map(|n| sale("prf", n)).collect();
    let rr_quiet: Vec<Value> = (0..QUIET).map(|n| sale("prq", n)).collect();
    let (flood, quiet) = flood_beside_quiet(
        &app,
        "receiptroller",
        (rr_main.as_str(), rr_flood.clone()),
        (rr_backup.as_str(), rr_quiet),
        QUIET_GAP,
    )
    .await;
    let spooled = count(&flood, 200, "spooled");
    println!(
        "receiptroller: flood {spooled} of {PACED_FLOOD} spooled, {} published",
        count(&flood, 200, "published")
    );
    assert_eq!(
        count(&flood, 200, ""),
        PACED_FLOOD,
        "never refused: {flood:?}"
    );
    assert!(spooled > 0, "past the wait, spooled: {flood:?}");
    assert_eq!(count(&quiet, 200, "published"), QUIET, "{quiet:?}");
    all_published(&app, &rr_flood).await;

    let mk_flood: Vec<Value> = (0..PACED_FLOOD).map(|n| order("pmf", n)).collect();
    let mk_quiet: Vec<Value> = (0..QUIET).map(|n| order("pmq", n)).collect();
    let (flood, quiet) = flood_beside_quiet(
        &app,
        "mekari",
        (mk_main.as_str(), mk_flood),
        (mk_acme.as_str(), mk_quiet),
        QUIET_GAP,
    )
    .await;
    let refused = count(&flood, 429, "");
    println!("mekari: flood {refused} of {PACED_FLOOD} answered 429");
    assert!(refused > 0, "past the wait, refused: {flood:?}");
    assert_eq!(
        refused + count(&flood, 200, "published"),
        PACED_FLOOD,
        "{flood:?}"
    );
    assert!(
        flood
            .iter()
            .all(|(status, _, retry_after)| *status != 429 || retry_after.is_some())
    );
    assert_eq!(count(&quiet, 200, "published"), QUIET, "{quiet:?}");

    let after = Meter::read(&app).await;
    let slowed = |provider, source: &str, action| {
        after.delta(
            &before,
            "posbridge_deliveries_over_share_total",
            &[
                ("provider", provider),
                ("source", source),
                ("action", action),
            ],
        )
    };
    // Its rate's worth, a burst of three, then up to 20 slots within the
    // wait: about 20 waited for theirs, in each flood.
    for (provider, source) in [("receiptroller", &rr_main), ("mekari", &mk_main)] {
        let paced = slowed(provider, source, "paced");
        assert!((10.0..=25.0).contains(&paced), "{provider} paced {paced}");
    }
    assert_eq!(slowed("receiptroller", &rr_main, "spooled"), spooled as f64);
    assert_eq!(slowed("mekari", &mk_main, "refused"), refused as f64);
    for (provider, source) in [("receiptroller", &rr_backup), ("mekari", &mk_acme)] {
        for action in ["paced", "refused", "spooled", "waited", "taken"] {
            assert_eq!(slowed(provider, source, action), 0.0, "{source} {action}");
        }
    }
    app.stop().await;
}
