//! The `posbridge` command: `serve` runs the bridge, `check-config` explains
//! every mistake in a configuration file. `anyhow` lives here only.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use posbridge::app::App;
use posbridge::config::Config;
use tracing::info;
use tracing_subscriber::EnvFilter;

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
    /// Read a configuration file and explain every mistake in it.
    CheckConfig {
        /// TOML configuration file.
        #[arg(long, short, env = "POSBRIDGE_CONFIG")]
        config: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("POSBRIDGE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,rdkafka=warn"));
    if cli.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    match cli.command {
        Command::Serve { config } => serve(config).await,
        Command::CheckConfig { config } => check_config(config),
    }
}

async fn serve(path: PathBuf) -> anyhow::Result<()> {
    let config =
        Config::load(Some(&path)).with_context(|| format!("loading {}", path.display()))?;
    let app = App::build(&config).await.context("starting posbridge")?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen)
        .await
        .with_context(|| format!("binding {}", config.server.listen))?;
    info!(listen = %config.server.listen, "posbridge is accepting webhooks.");
    app.serve(listener, shutdown_signal())
        .await
        .context("serving HTTP")?;
    info!("posbridge stopped.");
    Ok(())
}

fn check_config(path: PathBuf) -> anyhow::Result<()> {
    let config =
        Config::read(Some(&path)).with_context(|| format!("reading {}", path.display()))?;
    let problems = config.problems();
    if problems.is_empty() {
        println!("{}: configuration is valid.", path.display());
        return Ok(());
    }
    for problem in &problems {
        println!("{problem}");
    }
    anyhow::bail!("{} problem(s) in {}", problems.len(), path.display())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
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
}
