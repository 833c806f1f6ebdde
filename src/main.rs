//! The `posbridge` command: `serve` runs the bridge (and, where enabled, the
//! scheduled reconciler and the webhook watchdog), `reconcile` reads one
//! window from a provider's API, `reconciler` runs the catch-up side alone
//! (with `/healthz`, `/readyz` and `/metrics` on `server.listen`, no
//! webhooks), `replay-dead-letters` puts dead letters through again, `check-config`
//! explains every mistake in a configuration file. `anyhow` lives here only.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::time::Duration;

use posbridge::app::{self, App};
use posbridge::config::{Config, LedgerBackend};
use posbridge::domain::event::{EntityType, ProviderKind};
use posbridge::services::rederive::{self, Rederive};
use posbridge::services::replay::{self, Replay};
use posbridge::services::watchdog::Watchdog;
use std::io::IsTerminal;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// mimalloc instead of glibc's allocator: a webhook's short-lived buffers
/// (body, JSON, event, record) made glibc's malloc and free about 16% of
/// posbridge's CPU under load on Kafka (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `arena_eager_commit`: its number in mimalloc 3's option enum
/// (`libmimalloc-sys` names only some options).
#[cfg(target_os = "linux")]
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Runs before `main` and before the Rust runtime's first allocation (an
/// `.init_array` entry), so that mimalloc's first arena already obeys it:
/// mimalloc commits its arenas lazily instead of eagerly, which keeps peak
/// RSS under load ~48 MiB instead of ~60–70 at the same rate
/// (docs/BENCHMARKS.md). `MIMALLOC_ARENA_EAGER_COMMIT` in the environment
/// still decides when it is set. Linux only: `.init_array` is an ELF
/// section (elsewhere the environment variable does the same).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[used]
#[unsafe(link_section = ".init_array")]
static LAZY_ARENAS: extern "C" fn() = {
    extern "C" fn lazy_arenas() {
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
            // SAFETY: sets one integer option; mimalloc takes an option at
            // any time, before or after its own initialization.
            unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
        }
    }
    lazy_arenas
};

/// Point-of-sale webhooks in, one clean Kafka stream per entity type out.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "POSBRIDGE_LOG_JSON")]
    log_json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Receive webhooks and publish them to Kafka.
    Serve {
        /// TOML configuration file; `POSBRIDGE__SECTION__KEY` variables override it.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
    /// Read one window from a provider's API and publish what the topics lack, then exit.
    Reconcile {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
        /// Provider to read (its URL spelling, e.g. `mekari`).
        #[arg(long, value_parser = parse_provider)]
        provider: ProviderKind,
        /// Only this source (default: every source of the provider with an `api` section).
        #[arg(long)]
        source: Option<String>,
        /// Window start, RFC 3339 (e.g. 2026-11-29T00:00:00Z).
        #[arg(long, value_parser = parse_time)]
        from: OffsetDateTime,
        /// Window end, RFC 3339, or `now`.
        #[arg(long, value_parser = parse_time, default_value = "now")]
        to: OffsetDateTime,
    },
    /// Put dead letters through the pipeline again, once their cause is
    /// cleared: one JSON line per dead letter and a summary on stdout; exit
    /// status 1 when one could not be finished (run it again to resume).
    ReplayDeadLetters {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
        /// Only this provider's dead letters (its URL spelling, e.g. `mekari`).
        #[arg(long, value_parser = parse_provider)]
        provider: Option<ProviderKind>,
        /// Only those that came through this source.
        #[arg(long)]
        source: Option<String>,
        /// Only those that arrived at or after this time, RFC 3339.
        #[arg(long, value_parser = parse_time)]
        since: Option<OffsetDateTime>,
        /// Only those that arrived before this time, RFC 3339, or `now`.
        #[arg(long, value_parser = parse_time)]
        until: Option<OffsetDateTime>,
        /// Only those with this reason code (`invalid_field`, `publish_refused`, …).
        #[arg(long)]
        reason: Option<String>,
        /// Say what each would come to, publishing nothing and moving no checkpoint.
        #[arg(long)]
        dry_run: bool,
        /// Only this dead-letter topic (the shared one, or a source's own:
        /// `acme-dead-letter` for `topic_prefix = "acme."`); by default every
        /// one in use, the shared one first.
        #[arg(long)]
        topic: Option<String>,
    },
    /// Derive each key's state on the entity topics again from its record's
    /// raw body with this build's code, and publish it where it now differs
    /// (never over a newer state): one JSON line per changed key of the
    /// sample and a summary on stdout; exit status 1 when it stopped (run it
    /// again to resume).
    Rederive {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
        /// Only this entity type's topics (`sales`, `orders`, …).
        #[arg(long, value_parser = parse_entity)]
        entity: Option<EntityType>,
        /// Only this provider's records (its URL spelling, e.g. `mekari`).
        #[arg(long, value_parser = parse_provider)]
        provider: Option<ProviderKind>,
        /// Only the records that came through this source.
        #[arg(long)]
        source: Option<String>,
        /// Say what would change, field by field, publishing nothing.
        #[arg(long)]
        dry_run: bool,
        /// Derived records published per second at most (0: no limit).
        #[arg(long, default_value_t = 200)]
        rate: u32,
        /// How many changed keys are printed field by field.
        #[arg(long, default_value_t = 20)]
        sample: usize,
        /// Start over instead of resuming a run that stopped.
        #[arg(long)]
        from_start: bool,
    },
    /// What became of an entity (its records on every entity topic, its
    /// key's partition of each, with their places, headers and values, and
    /// the state the ledger holds) or of a delivery (what posbridge answered
    /// it, when, and its record); JSON on stdout.
    Lookup {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
        /// The record key (`mekari:ORD-5512`, `receiptroller:T001|2026-11|000123`).
        #[arg(
            long,
            required_unless_present = "delivery",
            conflicts_with = "delivery"
        )]
        entity: Option<String>,
        /// The provider's delivery id (`X-RR-Delivery`, `X-Mekari-Event-ID`),
        /// alone or as `{provider}:{id}`.
        #[arg(long)]
        delivery: Option<String>,
    },
    /// Run the scheduled reconciler and the webhook watchdog without the webhook
    /// route: only /healthz, /readyz and /metrics on server.listen.
    Reconciler {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
    /// The event schema and the Schema Registry.
    Schema {
        /// What to do.
        #[command(subcommand)]
        command: SchemaCommand,
    },
    /// The embedded ledger file.
    Ledger {
        /// What to do.
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// Read a configuration file and explain every mistake in it.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum SchemaCommand {
    /// Ask the registry whether this version's schema may be registered under
    /// every entity topic's subject (exit status 1 if a subject refuses it).
    Check {
        /// TOML configuration file (its schema_registry and kafka sections).
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum LedgerCommand {
    /// Check every page of the embedded ledger (and the spool, when one is
    /// configured, every entry's checksum too) and print what each holds, or
    /// why it cannot be read (`damaged`, which `serve` sets aside, `in_use`
    /// by the named process), changing nothing; exit status 1 unless both
    /// are `ok` without damaged entries. Run it with posbridge stopped: the
    /// files admit one process at a time.
    Check {
        /// TOML configuration file (its ledger and spool sections).
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
    /// Keep the partition count each entity topic has now (or only the
    /// `--topic`s named), after growing a topic on purpose: posbridge
    /// refuses a topic whose count differs from the one its ledger kept.
    /// Keys written before keep a stale state in their old partition until
    /// it is overwritten there. With the embedded ledger, run it with
    /// posbridge stopped; then start posbridge.
    AcceptPartitions {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
        /// A topic to accept (repeatable); every entity topic when none.
        #[arg(long)]
        topic: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("POSBRIDGE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,rdkafka=warn"));
    // The commands whose report is JSON on stdout log to stderr, so the
    // report pipes whole (`| jq`).
    let reports_on_stdout = matches!(
        cli.command,
        Command::ReplayDeadLetters { .. } | Command::Rederive { .. } | Command::Lookup { .. }
    );
    let (writer, terminal) = if reports_on_stdout {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        )
    };
    if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(writer)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer)
            .with_ansi(terminal)
            .init();
    }
    match cli.command {
        Command::Serve { config } => serve(config).await,
        Command::Reconcile {
            config,
            provider,
            source,
            from,
            to,
        } => reconcile(config, provider, source, from, to).await,
        Command::ReplayDeadLetters {
            config,
            provider,
            source,
            since,
            until,
            reason,
            dry_run,
            topic,
        } => {
            let filter = replay::Filter {
                provider,
                source,
                since,
                until,
                reason,
            };
            replay_dead_letters(config, replay::Options { filter, dry_run }, topic).await
        }
        Command::Rederive {
            config,
            entity,
            provider,
            source,
            dry_run,
            rate,
            sample,
            from_start,
        } => {
            let options = rederive::Options {
                entity,
                provider,
                source,
                dry_run,
                rate,
                sample,
                from_start,
            };
            rederive_topics(config, options).await
        }
        Command::Lookup {
            config,
            entity,
            delivery,
        } => lookup(config, entity, delivery).await,
        Command::Reconciler { config } => reconciler(config).await,
        Command::Schema {
            command: SchemaCommand::Check { config },
        } => schema_check(config).await,
        Command::Ledger {
            command: LedgerCommand::Check { config },
        } => ledger_check(config),
        Command::Ledger {
            command: LedgerCommand::AcceptPartitions { config, topic },
        } => accept_partitions(config, &topic).await,
        Command::CheckConfig { config } => check_config(config),
    }
}

async fn serve(path: PathBuf) -> anyhow::Result<()> {
    let config = load(&path)?;
    // Bound before the app is built: a delivery arriving while start-up
    // waits for Kafka or the registry waits in the listen backlog and is
    // answered once the app runs, instead of being refused a connection (a
    // failed attempt that counts toward a provider switching the webhook off).
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    let app = App::build(&config).await.map_err(start_error)?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
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
    app.serve(listener, shutdown.clone().cancelled_owned())
        .await
        .context("serving HTTP")?;
    shutdown.cancel();
    background.wait().await;
    info!("posbridge stopped.");
    Ok(())
}

async fn reconcile(
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
        .context("reconcile failed; nothing past the failing page was published")?;
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

async fn replay_dead_letters(
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

async fn rederive_topics(path: PathBuf, options: rederive::Options) -> anyhow::Result<()> {
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

async fn lookup(
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

async fn reconciler(path: PathBuf) -> anyhow::Result<()> {
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

fn ledger_check(path: PathBuf) -> anyhow::Result<()> {
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

async fn accept_partitions(path: PathBuf, topics: &[String]) -> anyhow::Result<()> {
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
        tracker.spawn(Watchdog::new(reconciler).run(
            Duration::from_secs(config.watchdog.interval_secs),
            shutdown.clone(),
        ));
    }
    tracker.close();
    Ok(tracker)
}

fn parse_entity(plural: &str) -> Result<EntityType, String> {
    EntityType::ALL
        .into_iter()
        .find(|t| t.plural() == plural)
        .ok_or_else(|| {
            let known: Vec<&str> = EntityType::ALL.iter().map(|t| t.plural()).collect();
            format!("one of {}", known.join(", "))
        })
}

fn parse_provider(name: &str) -> Result<ProviderKind, String> {
    ProviderKind::parse(name).ok_or_else(|| {
        let known: Vec<&str> = ProviderKind::ALL.iter().map(|p| p.as_str()).collect();
        format!("`{name}` is not one of {}", known.join(", "))
    })
}

fn parse_time(text: &str) -> Result<OffsetDateTime, String> {
    if text == "now" {
        return Ok(OffsetDateTime::now_utc());
    }
    OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("`{text}` is not an RFC 3339 time: {e}"))
}

async fn schema_check(path: PathBuf) -> anyhow::Result<()> {
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

fn check_config(path: PathBuf) -> anyhow::Result<()> {
    let config = read(&path)?;
    let mut problems = app::problems(&config);
    problems.extend(app::sources::dir_problems(&config));
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
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "Cannot listen for Ctrl-C.");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "Cannot listen for SIGTERM.");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    info!("Shutdown requested; finishing in-flight deliveries.");
    token.cancel();
}
