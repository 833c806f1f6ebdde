//! What each of the binary's commands does (`src/main.rs` reads the
//! command line and calls one of these): build what the command needs,
//! run it, say how it ended. Part of the binary, not of the library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use posbridge::app::{self, App};
use posbridge::config::{Config, LedgerBackend};
use posbridge::domain::event::ProviderKind;
use posbridge::services::rederive::{self, Rederive};
use posbridge::services::replay::{self, Replay};
use posbridge::services::watchdog::Watchdog;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

pub(crate) async fn serve(path: PathBuf) -> anyhow::Result<()> {
    let config = load(&path)?;
    // Bound before the app is built: a delivery arriving while start-up
    // waits for Kafka or the registry waits in the listen backlog and is
    // answered once the app runs, instead of being refused a connection (a
    // failed attempt that counts toward a provider switching the webhook off).
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    let app = App::build(&config).await.map_err(start_error)?;
    // The first signal starts leaving the balancer (and stops the
    // background work); a second one stops accepting at once.
    let (shutdown, hurry) = (CancellationToken::new(), CancellationToken::new());
    tokio::spawn(cancel_on_signals([shutdown.clone(), hurry.clone()]));
    reload_secrets_on_hangup(&app)?;
    let background = spawn_background(&config, &app, &shutdown, false)?;
    if let Some(admin) = &config.admin.listen {
        let listener = tokio::net::TcpListener::bind(admin)
            .await
            .with_context(|| format!("binding the admin listener {admin}"))?;
        let admin_server = app.serve_admin(listener, &config, shutdown.clone().cancelled_owned());
        background.spawn(async move {
            if let Err(error) = admin_server.await {
                error!(%error, "The admin listener failed; the status page is gone.");
            }
        });
        info!(listen = %admin, "Status page at /status on the admin listener.");
    }
    info!(listen = %config.server.listen, "posbridge is accepting webhooks.");
    let stop_accepting =
        app.leave_after(shutdown.clone().cancelled_owned(), hurry.cancelled_owned());
    app.serve(listener, stop_accepting)
        .await
        .context("serving HTTP")?;
    shutdown.cancel();
    background.wait().await;
    info!("posbridge stopped.");
    Ok(())
}

pub(crate) async fn reconcile(
    path: PathBuf,
    provider: ProviderKind,
    source: Option<String>,
    from: OffsetDateTime,
    to: OffsetDateTime,
) -> anyhow::Result<()> {
    let config = load(&path)?;
    let app = App::build_for_catch_up(&config)
        .await
        .map_err(start_error)?;
    // The sources directory's sources too.
    let reconciler = app.reconciler(&config)?.with_live_progress();
    let summary = reconciler
        .run_window(provider, source.as_deref(), from, to)
        .await
        .context("reconcile failed; nothing past the failing page was published; run it again when the cause is fixed (a record the broker did not acknowledge is written by the next run)")?;
    println!(
        "{}",
        serde_json::json!({
            "pages": summary.pages, "records": summary.records, "published": summary.published,
            "unchanged": summary.unchanged, "stale": summary.stale, "dead_lettered": summary.dead_lettered,
        })
    );
    app.flush().await;
    Ok(())
}

pub(crate) async fn replay_dead_letters(
    path: PathBuf,
    options: replay::Options,
    topic: Option<String>,
) -> anyhow::Result<()> {
    let mut config = load(&path)?;
    let mut scratch = None;
    let app = match App::build_for_catch_up(&config).await {
        Ok(app) => app,
        // A dry run writes nothing: beside a running `serve` that holds the
        // embedded ledger, it plans against an empty one of its own.
        Err(app::BuildError::Ledger(error)) if options.dry_run && error.is_held_elsewhere() => {
            warn!(
                %error,
                "The ledger is held by a running posbridge: planning without the entities' states, so would_be_stale and would_be_unchanged show as would_publish."
            );
            config.ledger.path =
                std::env::temp_dir().join(format!("posbridge-dry-run-{}.redb", std::process::id()));
            let app = App::build_for_catch_up(&config)
                .await
                .map_err(start_error)?;
            scratch = Some(config.ledger.path.clone());
            app
        }
        Err(error) => return Err(start_error(error)),
    };
    let topics = match topic {
        Some(topic) => vec![topic],
        None => app.dead_letter_topics(),
    };
    let sources: replay::Sources = app
        .sources()
        .live()
        .load()
        .iter()
        .map(|(key, webhook)| (key.clone(), webhook.source.clone()))
        .collect();
    let mut result = Ok(());
    for topic in topics {
        let mut replay = Replay::new(&config, app.pipeline().clone(), sources.clone(), topic)?;
        result = replay.run(&options, &mut std::io::stdout()).await.map(drop);
        if result.is_err() {
            break;
        }
    }
    app.flush().await;
    drop(app);
    if let Some(scratch) = scratch {
        let _ = std::fs::remove_file(scratch);
    }
    result.context(
        "dead-letter replay stopped; run it again when the cause is fixed: it resumes at the record that failed",
    )?;
    Ok(())
}

pub(crate) async fn rederive_topics(
    path: PathBuf,
    options: rederive::Options,
) -> anyhow::Result<()> {
    let config = load(&path)?;
    let app = App::build_for_catch_up(&config)
        .await
        .map_err(start_error)?;
    // Ctrl-C or SIGTERM ends the run as an outage does: the sends under
    // way counted, the checkpoints kept, the summary written; exit status 1.
    let stop = CancellationToken::new();
    tokio::spawn(cancel_on_signal(stop.clone()));
    let run =
        Rederive::new(&config, app.pipeline().clone(), &app.topic_sets().all())?.stopped_by(stop);
    let result = run.run(&options, &mut std::io::stdout()).await;
    app.flush().await;
    drop(app);
    result.context(
        "rederive stopped; run it again when the cause is fixed: it resumes where it stopped",
    )?;
    Ok(())
}

pub(crate) async fn lookup(
    path: PathBuf,
    entity: Option<String>,
    delivery: Option<String>,
) -> anyhow::Result<()> {
    let config = load(&path)?;
    let lookup = app::lookup::open(&config).await.map_err(|error| {
        if matches!(&error, app::BuildError::Ledger(error) if error.is_held_elsewhere()) {
            anyhow::Error::new(error).context(
                "the embedded ledger is held by a running posbridge (one process per file): ask it instead, GET /admin/deliveries/{id} or /admin/entities/{key} on its admin listener, or its status page's lookup box (docs/LOOKUP.md)",
            )
        } else {
            start_error(error)
        }
    })?;
    let report = match (entity, delivery) {
        (Some(key), _) => serde_json::to_string_pretty(&lookup.entity(&key).await?)?,
        (None, Some(id)) => serde_json::to_string_pretty(&lookup.delivery(&id).await?)?,
        (None, None) => anyhow::bail!("--entity or --delivery"),
    };
    println!("{report}");
    Ok(())
}

pub(crate) async fn reconciler(path: PathBuf) -> anyhow::Result<()> {
    let config = load(&path)?;
    let app = App::build_for_catch_up(&config)
        .await
        .map_err(start_error)?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let background = spawn_background(&config, &app, &shutdown, true)?;
    background.spawn(app.sources().clone().watch(shutdown.clone()));
    let ops = app.serve_ops(listener, shutdown.clone().cancelled_owned());
    background.spawn(async move {
        if let Err(error) = ops.await {
            error!(%error, "The operations listener failed; /healthz, /readyz and /metrics are gone.");
        }
    });
    info!(listen = %config.server.listen, "Probes and /metrics on the server listener; no webhooks.");
    background.wait().await;
    app.flush().await;
    Ok(())
}

pub(crate) fn ledger_check(path: PathBuf) -> anyhow::Result<()> {
    let config = load(&path)?;
    if config.ledger.backend != LedgerBackend::Embedded {
        anyhow::bail!("ledger check reads the embedded ledger; this configuration uses Redis");
    }
    let checked = app::files::check(&config);
    println!("{}", checked.report);
    if !checked.problems.is_empty() {
        anyhow::bail!("{}", checked.problems.join("\n"));
    }
    Ok(())
}

pub(crate) async fn accept_partitions(path: PathBuf, topics: &[String]) -> anyhow::Result<()> {
    let config = load(&path)?;
    let accepted = app::partitions::accept_partitions(&config, topics)
        .await
        .map_err(start_error)?;
    for (topic, (before, now)) in accepted {
        match before {
            Some(before) if before != now => {
                println!("{topic}: {now} partitions kept (was {before})");
            }
            Some(_) => println!("{topic}: {now} partitions, as kept"),
            None => println!("{topic}: {now} partitions kept"),
        }
    }
    Ok(())
}

/// A start-up failure with what to check for its kind.
fn start_error(error: app::BuildError) -> anyhow::Error {
    let hint = error.hint();
    anyhow::Error::new(error).context(format!("posbridge could not start: {hint}"))
}

/// Reads a configuration without refusing its problems (the commands that
/// report them, or need only part of it).
fn read(path: &std::path::Path) -> anyhow::Result<Config> {
    Config::read(Some(path)).with_context(|| format!("reading {}", path.display()))
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    app::load(path).with_context(|| format!("loading {}", path.display()))
}

/// Starts the scheduled reconciler and the watchdog where enabled (or
/// always, for the `reconciler` command).
fn spawn_background(
    config: &Config,
    app: &App,
    shutdown: &CancellationToken,
    always: bool,
) -> anyhow::Result<TaskTracker> {
    let tracker = TaskTracker::new();
    let reconciler = app.reconciler(config)?;
    // A source with an `api` table may appear in the directory later.
    let dir = config.sources_dir.is_some();
    if !reconciler.has_sources() && !dir && always {
        anyhow::bail!("no source has an `api` section: nothing to reconcile or watch");
    }
    let runs = reconciler.has_sources() || dir;
    if runs && (always || config.reconcile.enabled) {
        info!(
            interval_secs = config.reconcile.interval_secs,
            "Scheduled reconciler running."
        );
        tracker.spawn(reconciler.clone().run_scheduled(shutdown.clone()));
    }
    if runs && (always || config.watchdog.enabled) {
        info!(
            interval_secs = config.watchdog.interval_secs,
            "Webhook watchdog running."
        );
        tracker.spawn(
            Watchdog::new(
                reconciler,
                Duration::from_secs(config.watchdog.interval_secs),
            )
            .run(shutdown.clone()),
        );
    }
    tracker.close();
    Ok(tracker)
}

pub(crate) async fn schema_check(path: PathBuf) -> anyhow::Result<()> {
    let config = read(&path)?;
    let verdicts = app::schema::check(&config)
        .await
        .context("asking the schema registry")?;
    let refused = verdicts
        .iter()
        .filter(|(_, verdict)| *verdict == app::schema::Verdict::Incompatible)
        .count();
    for (subject, verdict) in &verdicts {
        println!("{subject}: {}", verdict.as_str());
    }
    if refused > 0 {
        anyhow::bail!("{refused} subject(s) refuse this version's schema");
    }
    Ok(())
}

pub(crate) async fn check_config(path: PathBuf) -> anyhow::Result<()> {
    let config = read(&path)?;
    let mut problems = app::problems(&config);
    problems.extend(app::sources::dir_problems(&config).await);
    if problems.is_empty() {
        println!("{}: configuration is valid.", path.display());
        return Ok(());
    }
    for problem in &problems {
        println!("{problem}");
    }
    anyhow::bail!("{} problem(s) in {}", problems.len(), path.display())
}

/// Reads the secret files and the sources directory again on every SIGHUP.
/// Listening starts before posbridge accepts webhooks: a SIGHUP nobody
/// listens for ends the process.
fn reload_secrets_on_hangup(app: &App) -> anyhow::Result<()> {
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("listening for SIGHUP")?;
    let request = app.secrets_reload();
    let reads = app.reads_secret_files();
    let sources = app.sources_reload();
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            if reads {
                info!("SIGHUP: reading the secret files again.");
                request.request();
            }
            if let Some(sources) = &sources {
                info!("SIGHUP: reading the sources directory again.");
                sources.request();
            }
            if !reads && sources.is_none() {
                info!(
                    "SIGHUP: no source reads secret files and no sources directory is set; nothing to read again."
                );
            }
        }
    });
    Ok(())
}

/// Cancels `token` on Ctrl-C or SIGTERM.
async fn cancel_on_signal(token: CancellationToken) {
    cancel_on_signals([token]).await;
}

/// Cancels the first of `tokens` on the first Ctrl-C or SIGTERM, the next
/// on the next, and so on.
async fn cancel_on_signals<const N: usize>(tokens: [CancellationToken; N]) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::error!(%error, "Cannot listen for SIGTERM.");
                None
            }
        };
    for (n, token) in tokens.into_iter().enumerate() {
        let ctrl_c = async {
            if let Err(error) = tokio::signal::ctrl_c().await {
                tracing::error!(%error, "Cannot listen for Ctrl-C.");
                std::future::pending::<()>().await;
            }
        };
        let term = async {
            match terminate.as_mut() {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = ctrl_c => {},
            () = term => {},
        }
        if n == 0 {
            info!("Shutdown requested.");
        }
        token.cancel();
    }
}
