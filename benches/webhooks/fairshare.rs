//! `fairshare` (after `--`): fair shares among `POSBRIDGE_BENCH_SOURCES`
//! sources from a directory (default 1,000, ReceiptRoller; `s0` spools),
//! on the embedded ledger and default share settings. The others (every
//! source but `s0`) send at half the closed-64 rate spread over every
//! source; they run alone (quiet) and beside `s0` flooding with 20 × its
//! share of deliveries in flight (`server.share_in_flight` 16: 320
//! connections in a closed loop, opened with the others' before the phase
//! starts), in turns, `POSBRIDGE_BENCH_REPEAT` times. Rows: the others'
//! p50, p99, answers other than 200 and five slowest answers (when in the
//! phase: a stall or a spread), the flood's rate and answers other than
//! 200, what was done with the flood's deliveries over its share or pace,
//! and the spool drained after (every spooled delivery published); last,
//! the others' p99 beside the flood minus quiet, each repetition and the
//! median, beside issue 51's aim.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::Settings;
use crate::load::{self, Dialect, Ids, Load, Measured};
use crate::server::Server;
use crate::sources::{directory_posbridge, metric, source_count, write_source};

/// Connections of the flood: 20 × the default share of 16 in flight.
const FLOOD_CONNECTIONS: usize = 20 * 16;

fn row(label: &str, measured: &Measured) {
    println!(
        "{label:>28}: {:>7.0} req/s, p50 {:>5.1} ms, p99 {:>6.1} ms, {} not 200 of {}",
        measured.rate(),
        measured.p50.as_secs_f64() * 1e3,
        measured.p99.as_secs_f64() * 1e3,
        measured.errors,
        measured.requests
    );
}

/// The others' five slowest answers in both phases: when in the phase and
/// how slow, to tell a stall from a spread.
fn slowest(quiet: &Measured, loaded: &Measured) {
    let list = |measured: &Measured| {
        measured
            .slowest
            .iter()
            .map(|(at, latency)| {
                format!(
                    "{:.0} ms at {:.2} s",
                    latency.as_secs_f64() * 1e3,
                    at.as_secs_f64()
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "{:>28}: quiet {}; beside the flood {}",
        "slowest",
        list(quiet),
        list(loaded)
    );
}

pub async fn run(settings: &Settings, run: &str) {
    let count = source_count();
    let work = tempfile::tempdir().expect("work dir");
    let write = |dir: &Path, n: usize| {
        let spools = if n == 0 {
            "on_broker_unavailable = \"spool\"\n"
        } else {
            ""
        };
        write_source(dir, &format!("s{n}"), &[load::SECRET], spools);
    };
    // Room for every spooled delivery of the flood.
    let spool = "max_entries = 10000000\nmax_bytes = 8589934592\n";
    let (command, addr) = directory_posbridge(settings, run, work.path(), count, write, spool);
    let _server = Server::start(command, addr, &work.path().join("fairshare.log"));
    crate::rebuild::ready(addr).await;
    let spread = Dialect::Spread { first: 0, count };
    // The others: every source but `s0`, so the flood's pace is the
    // flood's alone.
    let others_spread = Dialect::Spread {
        first: 1,
        count: count - 1,
    };
    let limit = load::run(
        addr,
        spread,
        Load::Closed { connections: 64 },
        Ids::Fresh(format!("{run}-limit")),
        settings.phase,
    )
    .await;
    row("closed 64 over all (limit)", &limit);
    let others = Load::Fixed {
        per_second: limit.rate() / 2.0,
        connections: 64,
    };
    println!(
        "{count} sources, the others at {:.0} req/s; the flood: s0 on {FLOOD_CONNECTIONS} connections (20 × its share of 16 in flight), s0 spools",
        limit.rate() / 2.0
    );
    let mut deltas = Vec::new();
    for repetition in 0..settings.repeat {
        let quiet = load::run(
            addr,
            others_spread,
            others,
            Ids::Fresh(format!("{run}-quiet{repetition}")),
            settings.phase,
        )
        .await;
        row(&format!("rep {repetition} others, quiet"), &quiet);
        let before = metric(addr, "posbridge_deliveries_over_share_total", &["s0\""]).await;
        // Both loads' connections open before either starts: the flood's
        // 320 handshakes would otherwise fall inside the others' phase, on
        // the CPU posbridge and the load share.
        let others_connected = load::connect_spread(&[addr], others.connections()).await;
        let flood_connected = load::connect_spread(&[addr], FLOOD_CONNECTIONS).await;
        let (loaded, flood) = tokio::join!(
            load::run_connected(
                others_connected,
                others_spread,
                others,
                Ids::Fresh(format!("{run}-others{repetition}")),
                settings.phase,
            ),
            load::run_connected(
                flood_connected,
                Dialect::Spread { first: 0, count: 1 },
                Load::Closed {
                    connections: FLOOD_CONNECTIONS,
                },
                Ids::Fresh(format!("{run}-flood{repetition}")),
                settings.phase,
            ),
        );
        row(&format!("rep {repetition} others, s0 flooding"), &loaded);
        slowest(&quiet, &loaded);
        deltas.push((loaded.p99.as_secs_f64() - quiet.p99.as_secs_f64()) * 1e3);
        row(&format!("rep {repetition} the flood (s0)"), &flood);
        let mut actions = Vec::new();
        for action in ["paced", "spooled", "waited", "taken"] {
            let label = format!("action=\"{action}\"");
            let n = metric(
                addr,
                "posbridge_deliveries_over_share_total",
                &["source=\"s0\"", &label],
            )
            .await;
            actions.push(format!("{action} {n:.0}"));
        }
        let after = metric(addr, "posbridge_deliveries_over_share_total", &["s0\""]).await;
        let drained = Instant::now();
        while metric(addr, "posbridge_spool_entries", &[]).await > 0.0 {
            assert!(
                drained.elapsed() < Duration::from_secs(300),
                "the spool never drained"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "rep {repetition}: the flood's deliveries over its share {:.0} (so far: {}), the spool drained {:.1} s after the flood",
            after - before,
            actions.join(", "),
            drained.elapsed().as_secs_f64()
        );
    }
    deltas.sort_by(f64::total_cmp);
    let listed: Vec<String> = deltas.iter().map(|d| format!("{d:+.1}")).collect();
    println!(
        "the others' p99 beside the flood minus quiet: {} ms; median {:+.1} ms (aim: within 2 ms)",
        listed.join(", "),
        deltas.get(deltas.len() / 2).copied().unwrap_or_default()
    );
}
