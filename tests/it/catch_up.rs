//! Catching up through the providers' APIs, against the provider simulator
//! (`posbridge-sim`): it sends signed webhooks by each provider's delivery
//! rules and serves the list and webhook-state APIs from the same truth.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use posbridge::adapters::encode::decode;
use posbridge::config::{ApiSection, Config};
use posbridge::domain::event::{EntityType, ProviderKind};
use posbridge::services::reconcile::{ReconcileError, Reconciler, Summary};
use posbridge::services::watchdog::Watchdog;
use serde_json::Value;
use time::OffsetDateTime;

use crate::support::wait::{look_for, wait_until};
use crate::support::{
    MEKARI_SECRET, Meter, OwnBroker, RR_SECRET, Record, TestApp, config, latest_per_key,
    own_source, read_topic, unique,
};

const RR_TOKEN: &str = "rr-api-token";
const MEKARI_CLIENT: &str = "sim-client";
pub(crate) const MEKARI_CLIENT_SECRET: &str = "sim-client-secret";

/// Overrides where the simulator binary is looked for.
const SIM_BIN_VAR: &str = "POSBRIDGE_SIM_BIN";

/// The `posbridge-sim` binary. It is its own package in the workspace, so
/// `cargo test` does not build it for this one (`scripts/test` does, first):
/// `POSBRIDGE_SIM_BIN` if set, else `target/<profile>/posbridge-sim`, found
/// from this test binary, which runs from `target/<profile>/deps/`.
fn sim_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(SIM_BIN_VAR) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{SIM_BIN_VAR} names {}, which is not a file",
            path.display()
        );
        return path;
    }
    let mut dir = std::env::current_exe().expect("the test binary's own path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(format!("posbridge-sim{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "the simulator binary is not at {}: run `cargo build -p posbridge-sim` first \
         (scripts/test does), or set {SIM_BIN_VAR} to its path",
        path.display()
    );
    crate::support::assert_fresh(&path);
    path
}

/// A running simulator; killed on drop.
pub(crate) struct Sim {
    api: String,
    http: reqwest::Client,
    _child: tokio::process::Child,
}

impl Sim {
    pub(crate) async fn start(target: &str, extra: &[&str]) -> Sim {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(sim_binary())
            .args(["--target", target, "--hold"])
            .args(["--rr-secret", RR_SECRET, "--mekari-secret", MEKARI_SECRET])
            .args(["--rr-token", RR_TOKEN])
            .args([
                "--mekari-client-id",
                MEKARI_CLIENT,
                "--mekari-client-secret",
                MEKARI_CLIENT_SECRET,
            ])
            .args(["--outlets", "OUT-1,OUT-2"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = lines
            .next_line()
            .await
            .unwrap()
            .expect("the sim prints its API address");
        let api = serde_json::from_str::<Value>(&first).unwrap()["api"]
            .as_str()
            .unwrap()
            .to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Sim {
            api,
            http: reqwest::Client::new(),
            _child: child,
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.api))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A broker outage during this simulator's run: cut once some delivery
    /// of it was answered 2xx (the run under way, Kafka taking records),
    /// healed `lasting` later. The outage's length is the scenario itself,
    /// a span of the providers' clock (its retry windows at the run's time
    /// scale), not a wait for something to happen: nothing but time marks
    /// its end, so it is slept.
    pub(crate) async fn outage(&self, broker: &OwnBroker, lasting: Duration) {
        wait_until(
            Duration::from_secs(10),
            "a first delivery of the simulator answered 2xx",
            async || {
                let by = self.get("/sim/status").await["by_provider"].clone();
                ["receiptroller", "mekari"]
                    .iter()
                    .any(|provider| by[provider]["succeeded"].as_u64().unwrap_or(0) > 0)
            },
        )
        .await;
        broker.cut();
        tokio::time::sleep(lasting).await;
        broker.heal();
    }

    /// Waits until every event was sent and every retry finished or was abandoned.
    pub(crate) async fn wait_done(&self) -> Value {
        let done = look_for(Duration::from_secs(180), async || {
            let status = self.get("/sim/status").await;
            (status["sending_done"] == true).then_some(status)
        })
        .await;
        match done {
            Some(status) => status,
            None => panic!("sim never finished: {}", self.get("/sim/status").await),
        }
    }

    /// A config whose `main` sources read this simulator's APIs, and whose
    /// watchdog switches a webhook it finds off back on.
    fn configure(&self, config: &Config, mekari_secret: &str) -> Config {
        self.configure_with(config, mekari_secret, true)
    }

    /// The same, with `resume_when_off` as given.
    pub(crate) fn configure_with(
        &self,
        config: &Config,
        mekari_secret: &str,
        resume: bool,
    ) -> Config {
        let mut config = config.clone();
        let api = |provider| -> ApiSection {
            let text = self.api_toml(provider, mekari_secret, resume);
            config::Config::builder()
                .add_source(config::File::from_str(&text, config::FileFormat::Toml))
                .build()
                .unwrap()
                .try_deserialize()
                .unwrap()
        };
        config.receiptroller.sources.get_mut("main").unwrap().api =
            Some(api(ProviderKind::ReceiptRoller));
        config.mekari.sources.get_mut("main").unwrap().api = Some(api(ProviderKind::Mekari));
        config.reconcile.max_attempts = 3;
        config
    }

    /// The `api` table (its keys, as TOML) of a `main` source of `provider`
    /// that reads this simulator's API and lets the watchdog watch its webhook.
    pub(crate) fn api_toml(
        &self,
        provider: ProviderKind,
        mekari_secret: &str,
        resume: bool,
    ) -> String {
        match provider {
            ProviderKind::ReceiptRoller => format!(
                "base_url = \"{}/receiptroller\"\ntoken = \"{RR_TOKEN}\"\nwebhook_id = \"wh_sim\"\nresume_when_off = {resume}\nper_page = 7",
                self.api
            ),
            ProviderKind::Mekari => format!(
                "base_url = \"{}/mekari\"\nclient_id = \"{MEKARI_CLIENT}\"\nclient_secret = \"{mekari_secret}\"\noutlets = [\"OUT-1\", \"OUT-2\"]\nendpoint_key = \"ep_sim\"\nresume_when_off = {resume}\nper_page = 5",
                self.api
            ),
        }
    }
}

/// One reconcile of both providers' `main` source over `[from, now + 1 min)`,
/// summed.
pub(crate) async fn reconcile_both(reconciler: &Reconciler, from: OffsetDateTime) -> Summary {
    let to = OffsetDateTime::now_utc() + time::Duration::minutes(1);
    let mut total = Summary::default();
    for provider in ProviderKind::ALL {
        let s = reconciler
            .run_window(provider, Some("main"), from, to)
            .await
            .unwrap();
        total.published += s.published;
        total.records += s.records;
        total.pages += s.pages;
    }
    total
}

/// Compares the compacted view of every entity topic with the simulator's
/// truth; returns how many entities were compared.
pub(crate) async fn assert_view_equals_truth(app: &TestApp, brokers: &str, sim: &Sim) -> usize {
    let (compared, differences) = view_against_truth(app, brokers, sim).await;
    assert_eq!(
        differences,
        Vec::<String>::new(),
        "the view against the truth"
    );
    compared
}

/// How many entities the compacted view of every entity topic was compared
/// on with the simulator's truth, and where it differs, in words.
pub(crate) async fn view_against_truth(
    app: &TestApp,
    brokers: &str,
    sim: &Sim,
) -> (usize, Vec<String>) {
    let truth = sim.get("/sim/truth").await;
    let mut views: HashMap<String, HashMap<String, Record>> = HashMap::new();
    for entity in EntityType::ALL {
        let topic = app.topic(entity.plural());
        views.insert(
            entity.as_str().to_owned(),
            latest_per_key(&read_topic(brokers, &topic)),
        );
    }
    let mut compared = 0;
    let mut differences = Vec::new();
    for entity in truth["entities"].as_array().unwrap() {
        let key = entity["key"].as_str().unwrap();
        let view = &views[entity["entity_type"].as_str().unwrap()];
        if entity["deleted"] == true {
            // A dropped delete cannot be read back from a list that omits
            // deleted entities; a delivered one left a tombstone.
            continue;
        }
        let Some(record) = view.get(key) else {
            differences.push(format!("{key} missing from the view"));
            continue;
        };
        let Some(payload) = record.payload.as_deref() else {
            differences.push(format!("{key} is a tombstone"));
            continue;
        };
        let event = decode(payload).unwrap();
        let mut differs = |field: &str, seen: Option<&str>, wanted: Option<&str>| {
            if seen != wanted {
                differences.push(format!("{key} {field}: {seen:?}, the truth {wanted:?}"));
            }
        };
        differs("status", event.status.as_deref(), entity["status"].as_str());
        differs(
            "kitchen",
            event.kitchen_status.as_deref(),
            entity["kitchen_status"].as_str(),
        );
        differs(
            "total",
            event.total.map(|t| t.to_string()).as_deref(),
            entity["total"].as_str(),
        );
        if matches!(
            event.entity_type,
            EntityType::Product | EntityType::Collection
        ) {
            differs("name", event.name.as_deref(), entity["name"].as_str());
        }
        compared += 1;
    }
    (compared, differences)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_reconcile_fills_what_webhooks_dropped_and_a_second_publishes_nothing() {
    let app = TestApp::start().await;
    let from = OffsetDateTime::now_utc() - time::Duration::hours(1);
    let sim = Sim::start(
        &app.base,
        &[
            "--events",
            "80",
            "--seed",
            "11",
            "--duplicates",
            "0.1",
            "--reorder",
            "0.1",
            "--drop",
            "0.1",
            "--time-scale",
            "3600",
        ],
    )
    .await;
    let status = sim.wait_done().await;
    assert!(
        status["deliveries"]["dropped"].as_u64().unwrap() > 0,
        "{status}"
    );

    let reconciler = Reconciler::new(
        &sim.configure(&app.config, MEKARI_CLIENT_SECRET),
        app.pipeline.clone(),
    )
    .unwrap();
    let first = reconcile_both(&reconciler, from).await;
    assert!(
        first.published > 0,
        "dropped events were published: {first:?}"
    );
    assert!(first.pages > 2, "paged through the lists: {first:?}");
    let compared = assert_view_equals_truth(&app, &crate::support::brokers(), &sim).await;
    assert!(compared > 20, "compared {compared} entities");

    let second = reconcile_both(&reconciler, from).await;
    assert_eq!(
        second.published, 0,
        "re-running the window publishes nothing: {second:?}"
    );
    assert_eq!(second.records, first.records);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broker_outage_shorter_than_the_retry_windows_loses_nothing() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app =
        TestApp::start_with(config(&broker.address(), &unique("sim-outage"), dir.path())).await;
    let from = OffsetDateTime::now_utc() - time::Duration::hours(1);
    let sim = Sim::start(
        &app.base,
        &[
            "--events",
            "40",
            "--seed",
            "5",
            "--drop",
            "0",
            "--duplicates",
            "0",
            "--reorder",
            "0",
            "--time-scale",
            "300",
        ],
    )
    .await;
    // Longer than the 3 s delivery deadline, so attempts fail; well inside
    // both providers' retry windows (14 s / 130 s at this time scale), so a
    // machine busy with the other tests still has time to recover.
    sim.outage(&broker, Duration::from_secs(4)).await;
    let status = sim.wait_done().await;
    assert_eq!(status["receiptroller_active"], true, "{status}");
    assert_eq!(status["mekari_status"], "active", "{status}");
    assert!(
        status["deliveries"]["failed"].as_u64().unwrap() > 0,
        "the outage made attempts fail: {status}"
    );
    assert_eq!(
        status["deliveries"]["succeeded"], status["events"],
        "every event arrived through retries: {status}"
    );

    let reconciler = Reconciler::new(
        &sim.configure(&app.config, MEKARI_CLIENT_SECRET),
        app.pipeline.clone(),
    )
    .unwrap();
    reconcile_both(&reconciler, from).await;
    assert_view_equals_truth(&app, &broker.address(), &sim).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_mekari_secret_or_a_skewed_clock_is_a_clear_reconciler_error() {
    let app = TestApp::start().await;
    let now = OffsetDateTime::now_utc();
    let window = (now - time::Duration::hours(1), now);
    for (secret, offset, expected) in [
        ("not-the-secret", "0", "signature mismatch"),
        (MEKARI_CLIENT_SECRET, "900", "clock skew"),
    ] {
        let sim = Sim::start(
            &app.base,
            &[
                "--events",
                "3",
                "--seed",
                "3",
                "--api-clock-offset-secs",
                offset,
            ],
        )
        .await;
        let reconciler =
            Reconciler::new(&sim.configure(&app.config, secret), app.pipeline.clone()).unwrap();
        let error = reconciler
            .run_window(ProviderKind::Mekari, Some("main"), window.0, window.1)
            .await
            .unwrap_err();
        assert!(matches!(error, ReconcileError::Fetch { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("401") && message.contains(expected),
            "{message}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn api_pages_are_retried_and_a_failing_run_leaves_its_checkpoint() {
    let app = TestApp::start().await;
    let checkpoint = "mekari/main/OUT-1/orders";
    let failing = Sim::start(
        &app.base,
        &["--events", "10", "--seed", "4", "--api-fail-rate", "1.0"],
    )
    .await;
    failing.wait_done().await;
    let reconciler = Reconciler::new(
        &failing.configure(&app.config, MEKARI_CLIENT_SECRET),
        app.pipeline.clone(),
    )
    .unwrap();
    let error = reconciler.run_due().await.unwrap_err();
    assert!(
        error.to_string().contains("failed after 3 attempts"),
        "{error}"
    );
    assert_eq!(
        app.pipeline.ledger().checkpoint(checkpoint).await.unwrap(),
        None
    );

    let flaky = Sim::start(
        &app.base,
        &["--events", "30", "--seed", "4", "--api-fail-rate", "0.3"],
    )
    .await;
    flaky.wait_done().await;
    let mut config = flaky.configure(&app.config, MEKARI_CLIENT_SECRET);
    config.reconcile.max_attempts = 8;
    let reconciler = Reconciler::new(&config, app.pipeline.clone()).unwrap();
    let before = OffsetDateTime::now_utc().unix_timestamp();
    reconciler.run_due().await.unwrap();
    let moved = app
        .pipeline
        .ledger()
        .checkpoint(checkpoint)
        .await
        .unwrap()
        .unwrap();
    assert!(moved >= before, "checkpoint moved to the end of the window");
    assert_view_equals_truth(&app, &crate::support::brokers(), &flaky).await;
    app.stop().await;
}

/// A Mekari source that first exists only as a file of the sources
/// directory written after its webhooks were sent (every one answered 404,
/// which Mekari never retries): its reconciler starts with the file and
/// reads back what the webhook never delivered, a second run publishes
/// nothing, and the file removed ends its reconciling.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_file_added_while_running_is_reconciled_and_removed_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let mut config = config(&crate::support::brokers(), &unique("dirapi"), dir.path());
    config.mekari.sources.remove("main");
    config.sources_dir = Some(sources.clone());
    config.spool.path = dir.path().join("spool.redb");
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let reconciler = app.reconciler(&app.config);
    assert!(!reconciler.has_sources());
    let from = OffsetDateTime::now_utc() - time::Duration::hours(1);
    let sim = Sim::start(
        &app.base,
        &["--events", "40", "--seed", "23", "--time-scale", "3600"],
    )
    .await;
    sim.wait_done().await;
    let to = OffsetDateTime::now_utc() + time::Duration::minutes(1);

    let file = sources.join("mekari.main.toml");
    std::fs::write(
        &file,
        format!(
            "secrets = [\"{MEKARI_SECRET}\"]\n[api]\n{}\n",
            sim.api_toml(ProviderKind::Mekari, MEKARI_CLIENT_SECRET, false)
        ),
    )
    .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the file's reconciler",
        async || reconciler.has_sources(),
    )
    .await;
    let first = reconciler
        .run_window(ProviderKind::Mekari, Some("main"), from, to)
        .await
        .unwrap();
    assert!(first.published > 0, "{first:?}");
    let second = reconciler
        .run_window(ProviderKind::Mekari, Some("main"), from, to)
        .await
        .unwrap();
    assert_eq!(second.published, 0, "{second:?}");

    std::fs::remove_file(&file).unwrap();
    wait_until(
        Duration::from_secs(10),
        "the reconciler to let go",
        async || !reconciler.has_sources(),
    )
    .await;
    let gone = reconciler
        .run_window(ProviderKind::Mekari, Some("main"), from, to)
        .await;
    assert!(matches!(gone, Err(ReconcileError::NoSource(_))), "{gone:?}");
    app.stop().await;
}

/// posbridge with a wrong ReceiptRoller secret, and a simulator that has
/// sent `events` (seed `seed`): every ReceiptRoller delivery was refused and
/// four failures switched its webhook off.
pub(crate) async fn switched_off_receiptroller(
    tag: &str,
    events: &str,
    seed: &str,
) -> (TestApp, Sim) {
    switched_off_receiptroller_with(tag, events, seed, &[]).await
}

/// The same, with `extra` arguments to the simulator.
pub(crate) async fn switched_off_receiptroller_with(
    tag: &str,
    events: &str,
    seed: &str,
    extra: &[&str],
) -> (TestApp, Sim) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&crate::support::brokers(), &unique(tag), dir.path());
    cfg.receiptroller.sources.get_mut("main").unwrap().secrets =
        serde_json::from_value(serde_json::json!(["a-wrong-secret"])).unwrap();
    let mut app = TestApp::start_with(cfg).await;
    app.keep(dir);
    let sim = Sim::start(
        &app.base,
        &[
            "--events",
            events,
            "--seed",
            seed,
            "--drop",
            "0",
            "--time-scale",
            "3600",
        ]
        .iter()
        .chain(extra)
        .copied()
        .collect::<Vec<_>>(),
    )
    .await;
    let status = sim.wait_done().await;
    assert_eq!(
        status["receiptroller_active"], false,
        "four failures switched it off: {status}"
    );
    (app, sim)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watchdog_resumes_a_switched_off_webhook_and_catches_up() {
    let (app, sim) = switched_off_receiptroller("watchdog", "20", "9").await;

    let reconciler = Reconciler::new(
        &sim.configure(&app.config, MEKARI_CLIENT_SECRET),
        app.pipeline.clone(),
    )
    .unwrap();
    let findings = Watchdog::new(reconciler, Duration::from_secs(60))
        .check()
        .await;
    let rr = findings
        .iter()
        .find(|f| f.provider == ProviderKind::ReceiptRoller)
        .expect("the ReceiptRoller webhook is watched");
    assert!(rr.resumed, "{findings:?}");
    assert_eq!(sim.get("/sim/status").await["receiptroller_active"], true);
    let sales = latest_per_key(&read_topic(&crate::support::brokers(), &app.topic("sales")));
    let truth = sim.get("/sim/truth").await;
    let expected = truth["entities"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["entity_type"] == "sale")
        .count();
    assert!(expected > 0);
    assert_eq!(
        sales.len(),
        expected,
        "the catch-up published every sale the webhook never delivered"
    );
    app.stop().await;
}

/// A broker outage longer than ReceiptRoller's whole retry window (7 s at
/// this time scale; Mekari's is ~65 s). With ReceiptRoller's source spooling,
/// its webhook stays on and every entity of both providers ends in the
/// compacted topics in its final state, with no reconcile (ReceiptRoller
/// orders could not be read back). With `retry`, the same outage switches
/// the ReceiptRoller webhook off: the difference the spool makes.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_longer_than_receiptrollers_retries_loses_nothing_with_the_spool() {
    for spools in [true, false] {
        let broker = OwnBroker::start().await;
        let dir = tempfile::tempdir().unwrap();
        let prefix = unique(if spools { "long-spool" } else { "long-retry" });
        let mut config = if spools {
            crate::support::spool_config(&broker.address(), &prefix, dir.path())
        } else {
            config(&broker.address(), &prefix, dir.path())
        };
        // A ReceiptRoller source of its own, so the series labelled with it
        // count this test's deliveries alone.
        let rr_source = unique("long");
        own_source(&mut config, "receiptroller", "main", &rr_source);
        let app = TestApp::start_with(config).await;
        let before = Meter::read(&app).await;
        let sim = Sim::start(
            &app.base,
            &[
                "--rr-source",
                &rr_source,
                "--events",
                "40",
                "--seed",
                "6",
                "--drop",
                "0",
                "--duplicates",
                "0.1",
                "--reorder",
                "0.1",
                "--time-scale",
                "600",
            ],
        )
        .await;
        sim.outage(&broker, Duration::from_secs(12)).await;
        let status = sim.wait_done().await;
        assert_eq!(status["mekari_status"], "active", "{status}");
        if !spools {
            assert_eq!(
                status["receiptroller_active"], false,
                "without the spool the outage switches the webhook off: {status}"
            );
            app.stop().await;
            continue;
        }
        assert_eq!(status["receiptroller_active"], true, "{status}");
        let spool = app.pipeline.spool().unwrap();
        wait_until(Duration::from_secs(60), "the spool to drain", async || {
            spool.stats().entries == 0
        })
        .await;
        let compared = assert_view_equals_truth(&app, &broker.address(), &sim).await;
        assert!(compared > 0);
        let after = Meter::read(&app).await;
        assert!(
            after.delta(
                &before,
                "posbridge_spooled_total",
                &[
                    ("provider", "receiptroller"),
                    ("source", rr_source.as_str())
                ]
            ) > 0.0,
            "the outage was spooled"
        );
        app.stop().await;
    }
}
