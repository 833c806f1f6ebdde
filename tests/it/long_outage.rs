//! A broker outage longer than Mekari's whole retry window (issue 51 item
//! 3), both providers sending throughout, on the provider simulator's
//! clock at ×3600: Mekari's eight attempts over ~11 hours take ~11 s, the
//! outage's 14 provider-hours 14 s, ReceiptRoller's 71 minutes 1.2 s.
//! ReceiptRoller's source spools (it gives up within the outage and has no
//! orders API); each test is one of the two ways to lose no Mekari event.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use posbridge::config::ApiSection;
use posbridge::domain::event::ProviderKind;
use posbridge::services::reconcile::Reconciler;
use posbridge::services::watchdog::Watchdog;
use serde_json::Value;

use crate::catch_up::{MEKARI_CLIENT_SECRET, Sim, assert_view_equals_truth, view_against_truth};
use crate::support::wait::{look_for, wait_until};
use crate::support::{
    Meter, OwnBroker, TestApp, latest_per_key, own_source, read_topic, spool_config, unique,
};

/// 14 provider-hours at ×3600.
const OUTAGE: Duration = Duration::from_secs(14);

/// The simulator's arguments: events over the outage and a little after,
/// enough Mekari deliveries failing for good early in the outage (ten in a
/// row pause its endpoint).
fn sim_args<'a>(mekari_source: &'a str, seed: &'a str) -> Vec<&'a str> {
    vec![
        "--mekari-source",
        mekari_source,
        "--events",
        "160",
        "--seed",
        seed,
        "--drop",
        "0",
        "--duplicates",
        "0.1",
        "--reorder",
        "0.1",
        "--time-scale",
        "3600",
        "--spread-secs",
        "16",
        "--concurrency",
        "16",
    ]
}

/// A broker of the test's own (to cut), the app's directory, a spooling
/// configuration on it, and the name of a Mekari source of its own (so the
/// series labelled with it count this test's alone).
async fn beside_its_own_broker(
    tag: &str,
) -> (
    OwnBroker,
    tempfile::TempDir,
    posbridge::config::Config,
    String,
) {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = spool_config(&broker.address(), &unique(tag), dir.path());
    let mekari_source = unique(&format!("{tag}-mk"));
    own_source(&mut config, "mekari", "main", &mekari_source);
    (broker, dir, config, mekari_source)
}

/// Every entity the provider deleted is a tombstone in its topic: a delete
/// can only arrive as a webhook (a list omits deleted entities).
fn assert_deletes_are_tombstones(app: &TestApp, brokers: &str, truth: &Value) -> usize {
    let products = latest_per_key(&read_topic(brokers, &app.topic("products")));
    let mut deleted = 0;
    for entity in truth["entities"].as_array().unwrap() {
        if entity["deleted"] != true {
            continue;
        }
        let key = entity["key"].as_str().unwrap();
        let record = products
            .get(key)
            .unwrap_or_else(|| panic!("deleted {key} never reached the topic"));
        assert!(record.payload.is_none(), "deleted {key} is not a tombstone");
        deleted += 1;
    }
    deleted
}

/// Mekari on `retry` (503 + `Retry-After` while Kafka is away), the
/// watchdog checking its endpoint every 250 ms (a minute at ×3600: 17 ms)
/// with `resume_when_off`, no scheduled reconciler. Mekari gives up on the
/// deliveries of the outage's first ~3 provider-hours (failed for good
/// before Kafka is back), pauses the endpoint after ten of them in a row
/// (cancelling the retries of the rest and dropping what happens while it
/// is paused); the watchdog resumes it, and once Kafka answers catches up
/// from the last time the endpoint was seen delivering: before the outage.
/// Every Mekari entity ends in its final state. Before, the watchdog took
/// "active at Mekari" for delivering, so its mark moved through the outage
/// and its catch-up after the resume (which failed, Kafka still away)
/// covered only the lookback before the pause.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_longer_than_mekaris_retries_is_caught_up_by_the_watchdog() {
    let (broker, dir, mut config, mekari_source) = beside_its_own_broker("mekari-14h").await;
    // The reconciler's 90 min lookback at ×3600.
    config.reconcile.lookback_secs = 2;
    config.reconcile.max_attempts = 3;
    let mut app = TestApp::start_with(config.clone()).await;
    let before = Meter::read(&app).await;
    let sim = Sim::start(&app.base, &sim_args(&mekari_source, "31")).await;
    let api: ApiSection = ::config::Config::builder()
        .add_source(::config::File::from_str(
            &sim.api_toml(ProviderKind::Mekari, MEKARI_CLIENT_SECRET, true),
            ::config::FileFormat::Toml,
        ))
        .build()
        .unwrap()
        .try_deserialize()
        .unwrap();
    config.mekari.sources.get_mut(&mekari_source).unwrap().api = Some(api);
    let watchdog = Watchdog::new(
        Reconciler::new(&config, app.pipeline.clone()).unwrap(),
        Duration::from_millis(250),
    );
    let checks = Arc::new(AtomicUsize::new(0));
    let checking = {
        let checks = checks.clone();
        tokio::spawn(async move {
            loop {
                watchdog.check().await;
                checks.fetch_add(1, Ordering::SeqCst);
                // The watchdog's period (`Watchdog::run` keeps it too): a
                // schedule, not a wait; the checks are counted so the test
                // waits for two whole ones below.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    sim.outage(&broker, OUTAGE).await;
    let status = sim.wait_done().await;
    let mekari = &status["by_provider"]["mekari"];
    assert!(
        mekari["failed_for_good"].as_u64().unwrap() >= 10,
        "Mekari gave up on deliveries of the outage: {status}"
    );
    let spool = app.pipeline.spool().unwrap();
    wait_until(Duration::from_secs(60), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;
    // Two whole checks after the last delivery, and then until the view is
    // the truth: a catch-up that failed (the API slow on a loaded machine)
    // is tried again by the next check, from the same mark.
    let done = checks.load(Ordering::SeqCst);
    wait_until(
        Duration::from_secs(120),
        "two more watchdog checks",
        async || checks.load(Ordering::SeqCst) >= done + 2,
    )
    .await;
    let caught_up = look_for(Duration::from_secs(120), async || {
        let (_, differences) = view_against_truth(&app, &broker.address(), &sim).await;
        differences.is_empty().then_some(())
    })
    .await;
    checking.abort();
    assert!(
        caught_up.is_some(),
        "the view never came to the truth: {:?}",
        view_against_truth(&app, &broker.address(), &sim).await.1
    );

    let after = Meter::read(&app).await;
    assert!(
        after.delta(
            &before,
            "posbridge_webhook_resumes_total",
            &[("provider", "mekari"), ("source", mekari_source.as_str())]
        ) >= 1.0,
        "ten deliveries failing for good in a row paused the endpoint, and the watchdog resumed it: {status}"
    );
    assert_eq!(
        sim.get("/sim/status").await["mekari_status"],
        "active",
        "resumed"
    );
    let compared = assert_view_equals_truth(&app, &broker.address(), &sim).await;
    assert!(compared > 20, "compared {compared} entities");
    app.keep(dir);
    app.stop().await;
}

/// Mekari on `spool` too: every delivery of the outage is answered 200
/// `spooled` at once, so Mekari never retries, never gives up, never
/// pauses, and the drainer publishes it all once Kafka answers, deletions
/// included (no list API can show those). No reconciler, no watchdog.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_longer_than_mekaris_retries_loses_nothing_with_mekari_spooled() {
    let (broker, dir, mut config, mekari_source) = beside_its_own_broker("mekari-14h-spool").await;
    config
        .mekari
        .sources
        .get_mut(&mekari_source)
        .unwrap()
        .on_broker_unavailable = posbridge::config::OnBrokerUnavailable::Spool;
    let mut app = TestApp::start_with(config).await;
    let before = Meter::read(&app).await;
    let sim = Sim::start(&app.base, &sim_args(&mekari_source, "31")).await;

    sim.outage(&broker, OUTAGE).await;
    let status = sim.wait_done().await;
    assert_eq!(status["mekari_status"], "active", "{status}");
    assert_eq!(status["receiptroller_active"], true, "{status}");
    let mekari = &status["by_provider"]["mekari"];
    for fate in ["failed_for_good", "lost", "abandoned"] {
        assert_eq!(mekari[fate], 0, "no Mekari event {fate}: {status}");
    }
    let spool = app.pipeline.spool().unwrap();
    wait_until(Duration::from_secs(60), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;

    let after = Meter::read(&app).await;
    assert!(
        after.delta(
            &before,
            "posbridge_spooled_total",
            &[("provider", "mekari"), ("source", mekari_source.as_str())]
        ) > 0.0,
        "the outage was spooled"
    );
    let compared = assert_view_equals_truth(&app, &broker.address(), &sim).await;
    assert!(compared > 20, "compared {compared} entities");
    let deleted =
        assert_deletes_are_tombstones(&app, &broker.address(), &sim.get("/sim/truth").await);
    assert!(deleted > 0, "this seed deletes a product during the outage");
    app.keep(dir);
    app.stop().await;
}
