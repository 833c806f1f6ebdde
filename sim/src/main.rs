//! `posbridge-sim`: plays ReceiptRoller and Mekari POS against a posbridge,
//! for tests, demos and the docs.
//!
//! One truth, two faces. The simulator draws a script of events from a seed
//! ([`plan`]), makes them happen on the wall clock, changing each entity's
//! current state ([`truth`]), and delivers each one as a signed webhook by its
//! provider's rules on a compressed clock ([`deliver`]), with duplicates,
//! reordering and drops injected. Meanwhile it serves both providers' APIs
//! from that truth, including what never arrived, and its own report of every
//! entity's latest state ([`api`]), so a test can compare the compacted
//! topics with it.
//!
//! Standard output carries exactly two kinds of JSON line: first
//! `{"api":"http://HOST:PORT"}` as soon as the API listens, and a summary when
//! sending is done. Logs go to standard error (`POSBRIDGE_SIM_LOG` filter).
//!
//! # Layout
//!
//! * [`clock`]: the compressed retry clock, event times, timestamp formats, ids.
//! * [`fault`]: the ways `--api-fault` makes ReceiptRoller's API misbehave.
//! * [`plan`]: the seeded script: entities, events and the faults of each.
//! * [`truth`]: every entity's current state; builds webhook bodies.
//! * [`webhook_state`]: ReceiptRoller's webhook and Mekari's endpoint (on,
//!   off, paused), which both sides below change.
//! * [`state`]: the shared handle, event log and counters.
//! * [`deliver`]: the delivery side: makes events happen, injects faults,
//!   signs ([`deliver::outgoing`]) and applies each provider's delivery rules
//!   ([`deliver::receiptroller`], [`deliver::mekari`]).
//! * [`api`]: the HTTP side: the router and `/sim` endpoints, each provider's
//!   API and auth check ([`api::receiptroller`], [`api::mekari`]), errors and
//!   query parameters.
//!
//! A module imports only modules above it in this list, so there is no
//! import cycle: `api` and `deliver` never use each other, and `state` uses
//! neither.

mod api;
mod clock;
mod deliver;
mod fault;
mod plan;
mod state;
#[cfg(test)]
mod tests;
mod truth;
mod webhook_state;

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::info;
use tracing_subscriber::EnvFilter;

use crate::clock::TimeScale;
use crate::plan::PlanConfig;
use crate::state::{Settings, Sim};
use crate::truth::Truth;

/// Both point-of-sale providers, simulated: signed webhooks with retries and
/// faults to a posbridge, and the providers' APIs serving the same truth.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// posbridge's base URL; webhooks go to {target}/webhooks/{provider}/{source}.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    target: String,
    /// Where the simulated APIs listen (port 0: any free port; see stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// How many events happen.
    #[arg(long, default_value_t = 50)]
    events: usize,
    /// Seed of the script (random if absent; the summary shows it).
    #[arg(long)]
    seed: Option<u64>,
    /// Probability that a delivery is sent twice (the copy a bit later).
    #[arg(long, default_value_t = 0.1, value_parser = probability)]
    duplicates: f64,
    /// Send each duplicate copy at the same moment as the first attempt
    /// (two requests in flight at once: behind a load balancer, on two
    /// replicas) instead of 100–800 ms later.
    #[arg(long)]
    duplicates_at_once: bool,
    /// Probability that a delivery is held back until after a later one.
    #[arg(long, default_value_t = 0.1, value_parser = probability)]
    reorder: f64,
    /// Probability that an event is never sent (only events the APIs show:
    /// not ReceiptRoller orders, not product deletions).
    #[arg(long, default_value_t = 0.1, value_parser = probability)]
    drop: f64,
    /// Documented seconds per real second for retry waits (600: 1 h → 6 s).
    /// The 10 s answer timeout is not scaled.
    #[arg(long, default_value_t = 600.0, value_parser = positive)]
    time_scale: f64,
    /// Real seconds over which the events happen.
    #[arg(long, default_value_t = 3.0, value_parser = non_negative)]
    spread_secs: f64,
    /// Webhook requests in flight at once, at most.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// ReceiptRoller webhook secret (X-RR-Signature, hex).
    #[arg(long, default_value = "rr-demo-secret-change-me")]
    rr_secret: String,
    /// posbridge source name for ReceiptRoller.
    #[arg(long, default_value = "main")]
    rr_source: String,
    /// Mekari webhook secret (X-Mekari-Signature, base64).
    #[arg(long, default_value = "mekari-demo-secret-change-me")]
    mekari_secret: String,
    /// posbridge source name for Mekari.
    #[arg(long, default_value = "main")]
    mekari_source: String,
    /// Bearer token the ReceiptRoller API accepts.
    #[arg(long, default_value = "rr-api-token")]
    rr_token: String,
    /// Mekari API client id.
    #[arg(long, default_value = "sim-client")]
    mekari_client_id: String,
    /// Mekari API client secret.
    #[arg(long, default_value = "sim-client-secret")]
    mekari_client_secret: String,
    /// Mekari outlets, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "OUT-1,OUT-2")]
    outlets: Vec<String>,
    /// Probability that a Mekari order was sold offline (sold_at 1–30 min early).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    offline: f64,
    /// Fraction of API list requests answered 503 with Retry-After: 1.
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    api_fail_rate: f64,
    /// Seconds the Mekari API's clock is ahead of the real one (negative: behind).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    api_clock_offset_secs: i64,
    /// Makes ReceiptRoller's API misbehave one way: its list pages, or its
    /// answer to switching the webhook on.
    #[arg(long, value_enum)]
    api_fault: Option<fault::ApiFault>,
    /// Goes into every business id so runs never collide (default: from the clock).
    #[arg(long)]
    run_id: Option<String>,
    /// Keep serving the APIs after sending is done, until Ctrl-C / SIGTERM.
    #[arg(long)]
    hold: bool,
}

fn parse_f64(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| format!("`{text}` is not a number"))
}

fn probability(text: &str) -> Result<f64, String> {
    let value = parse_f64(text)?;
    if (0.0..=1.0).contains(&value) {
        Ok(value)
    } else {
        Err("must be between 0 and 1".into())
    }
}

fn positive(text: &str) -> Result<f64, String> {
    let value = parse_f64(text)?;
    if value > 0.0 {
        Ok(value)
    } else {
        Err("must be greater than 0".into())
    }
}

fn non_negative(text: &str) -> Result<f64, String> {
    let value = parse_f64(text)?;
    if value >= 0.0 {
        Ok(value)
    } else {
        Err("must not be negative".into())
    }
}

/// A short run id from the clock: base 36 of the seconds, last 5 digits.
fn default_run_id() -> String {
    const DIGITS: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut secs = time::OffsetDateTime::now_utc()
        .unix_timestamp()
        .unsigned_abs();
    let mut id = Vec::new();
    for _ in 0..5 {
        id.push(DIGITS[usize::try_from(secs % 36).unwrap_or(0)]);
        secs /= 36;
    }
    id.reverse();
    String::from_utf8_lossy(&id).into_owned()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("POSBRIDGE_SIM_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,hyper=warn,reqwest=warn"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();

    let target = cli.target.trim_end_matches('/').to_owned();
    reqwest::Url::parse(&target).with_context(|| format!("--target `{target}` is not a URL"))?;
    let outlets: Vec<String> = cli
        .outlets
        .iter()
        .map(|o| o.trim().to_owned())
        .filter(|o| !o.is_empty())
        .collect();
    if outlets.is_empty() {
        bail!("--outlets names no outlet");
    }
    let run_id = cli.run_id.clone().unwrap_or_else(default_run_id);
    if run_id.is_empty() || !run_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        bail!("--run-id must be letters and digits");
    }
    let seed = cli.seed.unwrap_or_else(rand::random);

    let plan = plan::generate(
        &PlanConfig {
            events: cli.events,
            outlets,
            duplicates: cli.duplicates,
            duplicates_at_once: cli.duplicates_at_once,
            reorder: cli.reorder,
            drop: cli.drop,
            offline: cli.offline,
            run_id: run_id.clone(),
        },
        &mut StdRng::seed_from_u64(seed),
    );

    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    let api_url = format!("http://{}", listener.local_addr()?);
    print_line(&json!({ "api": api_url }))?;

    let client = reqwest::Client::builder()
        // Both providers give up on an answer after 10 s; never scaled.
        .timeout(Duration::from_secs(10))
        // Mekari never follows redirects, and ReceiptRoller counts a 3xx as a failure.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("building the HTTP client")?;
    let settings = Settings {
        receiptroller_url: format!("{target}/webhooks/receiptroller/{}", cli.rr_source),
        mekari_url: format!("{target}/webhooks/mekari/{}", cli.mekari_source),
        target,
        receiptroller_secret: cli.rr_secret,
        mekari_secret: cli.mekari_secret,
        receiptroller_token: cli.rr_token,
        mekari_client_id: cli.mekari_client_id,
        mekari_client_secret: cli.mekari_client_secret,
        api_fail_rate: cli.api_fail_rate,
        api_clock_offset_secs: cli.api_clock_offset_secs,
        api_fault: cli.api_fault,
        scale: TimeScale::new(cli.time_scale),
        seed,
        run_id,
    };
    info!(api = %api_url, target = %settings.target, events = plan.steps.len(),
          entities = plan.entities.len(), seed, run_id = %settings.run_id,
          "Simulator started.");
    let sim = Sim::new(
        settings,
        Truth::new(plan.entities),
        plan.steps.len(),
        cli.concurrency,
        client,
    );

    let stop = CancellationToken::new();
    let server = tokio::spawn(
        axum::serve(listener, api::router(sim.clone()))
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .into_future(),
    );

    let spread = Duration::try_from_secs_f64(cli.spread_secs).unwrap_or_default();
    tokio::select! {
        () = deliver::run(sim.clone(), plan.steps, spread) => {
            print_line(&sim.summary())?;
            if cli.hold {
                info!(api = %api_url, "Sending is done; serving the APIs until Ctrl-C / SIGTERM.");
                shutdown_signal().await;
            }
        }
        () = shutdown_signal() => {
            info!("Stopped before sending was done.");
            print_line(&sim.summary())?;
        }
    }
    stop.cancel();
    server
        .await
        .context("the API server task failed")?
        .context("serving the APIs")?;
    info!("Simulator stopped.");
    Ok(())
}

/// Writes one JSON line to standard output and flushes it, so a test reading
/// the pipe sees it at once.
fn print_line(value: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").context("writing to stdout")?;
    out.flush().context("flushing stdout")
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        // Without a signal handler the simulator can still be stopped by
        // killing it; waiting forever here is the safe fallback.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
