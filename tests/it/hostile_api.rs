//! The reconciler and the watchdog against a provider API that misbehaves
//! (`posbridge-sim --api-fault`): a list whose pages never end, a resume
//! answered 2xx while the webhook stays off, a resume redirected to another
//! host. Each must end as a failure the alerts see, not as a run that never
//! ends or a resume that never happened.

use std::time::Duration;

use posbridge::config::Config;
use posbridge::domain::event::ProviderKind;
use posbridge::services::reconcile::{ReconcileError, Reconciler};
use posbridge::services::watchdog::Watchdog;
use time::OffsetDateTime;

use crate::catch_up::{MEKARI_CLIENT_SECRET, Sim, switched_off_receiptroller_with};
use crate::support::{Meter, TestApp, metric, own_source, unique};

/// Far longer than any bounded run here takes: a run still going then is
/// taken for one that never ends.
const NEVER_ENDS: Duration = Duration::from_secs(120);

/// A simulator of twelve events, none dropped, whose ReceiptRoller API
/// answers with `fault`.
async fn sim_with_fault(app: &TestApp, fault: &str) -> Sim {
    Sim::start(
        &app.base,
        &[
            "--events",
            "12",
            "--seed",
            "21",
            "--drop",
            "0",
            "--api-fault",
            fault,
        ],
    )
    .await
}

/// A posbridge, a simulator whose Transactions API claims 10⁹ pages of the
/// same sales, and a config whose ReceiptRoller source (renamed, so its
/// series are this test's alone) reads it; the source's name.
async fn endless_list(tag: &str) -> (TestApp, Sim, Config, String) {
    let app = TestApp::start().await;
    let sim = sim_with_fault(&app, "endless-pages").await;
    sim.wait_done().await;
    let mut config = sim.configure_with(&app.config, MEKARI_CLIENT_SECRET, false);
    let source = unique(tag);
    own_source(&mut config, "receiptroller", "main", &source);
    (app, sim, config, source)
}

/// Reads the last hour of `source`'s sales; the run's error.
async fn failed_run(app: &TestApp, config: &Config, source: &str) -> ReconcileError {
    let reconciler = Reconciler::new(config, app.pipeline.clone()).unwrap();
    let now = OffsetDateTime::now_utc();
    let run = reconciler.run_window(
        ProviderKind::ReceiptRoller,
        Some(source),
        now - time::Duration::hours(1),
        now + time::Duration::minutes(1),
    );
    tokio::time::timeout(NEVER_ENDS, run)
        .await
        .expect("the run ended")
        .unwrap_err()
}

fn failed_runs(meter: &Meter, before: &Meter, source: &str) -> f64 {
    meter.delta(
        before,
        "posbridge_reconcile_runs_total",
        &[
            ("provider", "receiptroller"),
            ("source", source),
            ("outcome", "failed"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_whose_pages_never_end_fails_the_run_at_the_page_limit() {
    let (app, _sim, mut config, source) = endless_list("endless").await;
    config.reconcile.max_pages_per_run = 25;
    let before = Meter::read(&app).await;
    let error = failed_run(&app, &config, &source).await;
    assert!(error.to_string().contains("25 pages"), "{error}");
    let after = Meter::read(&app).await;
    assert_eq!(
        failed_runs(&after, &before, &source),
        1.0,
        "a failed run for PosbridgeReconcileFailing"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_past_its_time_limit_fails() {
    let (app, _sim, mut config, source) = endless_list("too-long").await;
    config.reconcile.max_pages_per_run = u32::MAX;
    config.reconcile.max_run_secs = 1;
    let before = Meter::read(&app).await;
    let error = failed_run(&app, &config, &source).await;
    assert!(error.to_string().contains("longer than 1 s"), "{error}");
    let after = Meter::read(&app).await;
    assert_eq!(failed_runs(&after, &before, &source), 1.0);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resume_counts_only_once_the_webhook_reads_back_on() {
    for fault in ["resume-unconfirmed", "resume-redirect"] {
        let (app, sim) =
            switched_off_receiptroller_with(fault, "12", "5", &["--api-fault", fault]).await;
        let mut config = sim.configure_with(&app.config, MEKARI_CLIENT_SECRET, true);
        let source = unique(fault);
        own_source(&mut config, "receiptroller", "main", &source);
        let reconciler = Reconciler::new(&config, app.pipeline.clone()).unwrap();
        let before = Meter::read(&app).await;
        let findings = Watchdog::new(reconciler, Duration::from_secs(60))
            .check()
            .await;
        let rr = findings
            .iter()
            .find(|f| f.provider == ProviderKind::ReceiptRoller)
            .expect("the ReceiptRoller webhook is watched");
        assert!(!rr.resumed, "{fault}: {findings:?}");
        let status = sim.get("/sim/status").await;
        assert_eq!(status["receiptroller_active"], false, "{fault}: {status}");
        assert_eq!(
            status["elsewhere_requests"], 0,
            "{fault}: nothing was sent to another host"
        );
        let after = Meter::read(&app).await;
        let labels = [("provider", "receiptroller"), ("source", source.as_str())];
        assert_eq!(
            after.delta(&before, "posbridge_webhook_resumes_total", &labels),
            0.0,
            "{fault}"
        );
        assert_eq!(
            metric(&app.metrics().await, "posbridge_webhook_active", &labels),
            0.0,
            "{fault}: still off, for PosbridgeWebhookOff"
        );
        app.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_too_large_cut_short_or_dripping_fails_the_run_and_is_counted() {
    let app = TestApp::start().await;
    for (fault, expected) in [
        ("oversized-page", "records where 7 asked"),
        ("oversized-body", "larger than 8388608 bytes"),
        ("cut-short", "failed after 3 attempts"),
        ("drip", "failed after 3 attempts"),
    ] {
        let sim = sim_with_fault(&app, fault).await;
        sim.wait_done().await;
        let mut config = sim.configure_with(&app.config, MEKARI_CLIENT_SECRET, false);
        if fault == "drip" {
            // Its page passes the timeout at once; wait less for it.
            config.reconcile.request_timeout_ms = 1000;
        }
        let source = unique(fault);
        own_source(&mut config, "receiptroller", "main", &source);
        let before = Meter::read(&app).await;
        let error = failed_run(&app, &config, &source).await;
        assert!(error.to_string().contains(expected), "{fault}: {error}");
        let after = Meter::read(&app).await;
        assert_eq!(failed_runs(&after, &before, &source), 1.0, "{fault}");
    }
    app.stop().await;
}
