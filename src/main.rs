//! The `posbridge` command: `serve` runs the bridge (and, where enabled, the
//! scheduled reconciler and the webhook watchdog), `reconcile` reads one
//! window from a provider's API, `reconciler` runs the catch-up side alone
//! (with `/healthz`, `/readyz` and `/metrics` on `server.listen`, no
//! webhooks), `replay-dead-letters` puts dead letters through again, `check-config`
//! explains every mistake in a configuration file. `anyhow` lives here only.

mod commands;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use commands::{
    accept_partitions, check_config, ledger_check, lookup, reconcile, reconciler, rederive_topics,
    replay_dead_letters, schema_check, serve,
};
use posbridge::domain::event::{EntityType, ProviderKind};
use posbridge::services::rederive;
use posbridge::services::replay;
use std::io::IsTerminal;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
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
        Command::CheckConfig { config } => check_config(config).await,
    }
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
