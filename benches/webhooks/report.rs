//! The bench's table: a row per phase as it ends, then posbridge's figures
//! as ratios to the bare limit's and the dedup limit's of the same
//! repetition, beside the aims, and the peer's (when it ran) to the bare
//! limit's.

use std::time::Duration;

use crate::load::Measured;

/// The limit server's name in the table.
pub const LIMIT: &str = "limit";
/// The limit server with a durable dedup record per delivery id.
pub const DEDUP_LIMIT: &str = "dedup limit";
/// The limit server without producing.
pub const LIMIT_NO_PRODUCE: &str = "limit (no produce)";
/// posbridge on a new ledger.
pub const POSBRIDGE: &str = "posbridge";
/// Another posbridge binary (`POSBRIDGE_BENCH_BASELINE`), on a new ledger.
pub const BASELINE: &str = "posbridge (baseline)";
/// Apache Camel's HTTP→Kafka route (`POSBRIDGE_BENCH_CAMEL`).
pub const CAMEL: &str = "Apache Camel (peer)";

/// One phase of the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Closed loop on this many connections, new deliveries.
    Closed(usize),
    /// Half the limit's closed-loop rate (64 connections), new deliveries.
    Fixed,
    /// Closed loop on 64 connections, deliveries already answered.
    Duplicates,
}

impl Phase {
    fn label(self) -> String {
        match self {
            Phase::Closed(n) => format!("new, closed {n}"),
            Phase::Fixed => "new, fixed rate".into(),
            Phase::Duplicates => "duplicates, closed 64".into(),
        }
    }
}

/// What one phase measured, client and server side.
#[derive(Debug, Clone)]
pub struct Row {
    /// Repetition, from 1.
    pub rep: usize,
    /// Which server.
    pub server: &'static str,
    /// Which load.
    pub phase: Phase,
    /// The client's view.
    pub measured: Measured,
    /// CPU the server used during the phase.
    pub server_cpu: Duration,
    /// CPU the broker used during the phase, when its pid is known.
    pub broker_cpu: Option<Duration>,
    /// CPU Redis used during the phase, when its pid is known.
    pub redis_cpu: Option<Duration>,
    /// The server process's peak RSS so far.
    pub peak_rss: u64,
}

impl Row {
    /// The server's CPU (a fleet's replicas' summed) per answer.
    pub fn cpu_per_request(&self) -> Duration {
        self.server_cpu
            .checked_div(self.measured.requests.max(1) as u32)
            .unwrap_or_default()
    }
}

const MIB: f64 = 1024.0 * 1024.0;

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Prints the settings and the table's header.
pub fn header(settings: &str) {
    println!("{settings}");
    println!(
        "{:>3}  {:<23}  {:<22} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>7} {:>8}",
        "rep",
        "server",
        "load",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "cores",
        "µs/req",
        "broker",
        "peak RSS"
    );
}

/// Prints one row.
pub fn row(row: &Row) {
    let m = &row.measured;
    let secs = m.elapsed.as_secs_f64();
    let behind = if m.behind > Duration::from_millis(100) {
        format!(
            "  (ended {:.1} s behind the schedule)",
            m.behind.as_secs_f64()
        )
    } else {
        String::new()
    };
    println!(
        "{:>3}  {:<23}  {:<22} {:>8.0} {:>8.1} {:>8.1} {:>6} {:>8.2} {:>8.0} {:>7} {:>6.0} MiB{behind}",
        row.rep,
        row.server,
        row.phase.label(),
        m.rate(),
        ms(m.p50),
        ms(m.p99),
        m.errors,
        row.server_cpu.as_secs_f64() / secs,
        row.cpu_per_request().as_secs_f64() * 1e6,
        row.broker_cpu
            .map_or("-".into(), |cpu| format!("{:.2}", cpu.as_secs_f64() / secs)),
        row.peak_rss as f64 / MIB,
    );
}

/// The row of `server` in `phase` of repetition `rep`.
pub fn find<'a>(rows: &'a [Row], rep: usize, server: &str, phase: Phase) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.rep == rep && r.server == server && r.phase == phase)
}

/// `server`'s highest peak RSS in repetition `rep`, MiB.
fn peak_rss_mib(rows: &[Row], rep: usize, server: &str) -> f64 {
    rows.iter()
        .filter(|r| r.rep == rep && r.server == server)
        .map(|r| r.peak_rss)
        .max()
        .unwrap_or(0) as f64
        / MIB
}

/// One server over one limit in one repetition, in one phase or summed
/// over both closed loops.
struct Against {
    throughput_64: f64,
    throughput_256: f64,
    p99_fixed_ms: f64,
    cpu_per_request: f64,
}

impl Against {
    fn of(rows: &[Row], rep: usize, server: &str, limit: &str) -> Option<Against> {
        let both = |phase| {
            Some((
                find(rows, rep, server, phase)?,
                find(rows, rep, limit, phase)?,
            ))
        };
        let cpu = |r: &Row| r.cpu_per_request().as_secs_f64();
        let (s64, l64) = both(Phase::Closed(64))?;
        let (s256, l256) = both(Phase::Closed(256))?;
        let (sf, lf) = both(Phase::Fixed)?;
        Some(Against {
            throughput_64: s64.measured.rate() / l64.measured.rate(),
            throughput_256: s256.measured.rate() / l256.measured.rate(),
            p99_fixed_ms: ms(sf.measured.p99) - ms(lf.measured.p99),
            cpu_per_request: (cpu(s64) + cpu(s256)) / (cpu(l64) + cpu(l256)),
        })
    }
}

/// posbridge against the limits in one repetition: `(bare, dedup)` pairs
/// of ratios.
struct Ratios {
    throughput_64: (f64, f64),
    throughput_256: (f64, f64),
    p99_fixed_ms: (f64, f64),
    cpu_per_request: (f64, f64),
    peak_rss_mib: f64,
    duplicates: f64,
}

impl Ratios {
    fn of(rows: &[Row], rep: usize, posbridge: &str) -> Option<Ratios> {
        let bare = Against::of(rows, rep, posbridge, LIMIT)?;
        let dedup = Against::of(rows, rep, posbridge, DEDUP_LIMIT)?;
        let pd = find(rows, rep, posbridge, Phase::Duplicates)?;
        let ld = find(rows, rep, LIMIT_NO_PRODUCE, Phase::Duplicates)?;
        Some(Ratios {
            throughput_64: (bare.throughput_64, dedup.throughput_64),
            throughput_256: (bare.throughput_256, dedup.throughput_256),
            p99_fixed_ms: (bare.p99_fixed_ms, dedup.p99_fixed_ms),
            cpu_per_request: (bare.cpu_per_request, dedup.cpu_per_request),
            peak_rss_mib: peak_rss_mib(rows, rep, posbridge),
            duplicates: pd.measured.rate() / ld.measured.rate(),
        })
    }
}

/// A pair of ratios, bare / dedup.
fn pair((bare, dedup): (f64, f64)) -> String {
    format!("{bare:.2}× / {dedup:.2}×")
}

/// Prints the ratios of each repetition and the aims.
pub fn ratios(rows: &[Row]) {
    println!();
    println!(
        "posbridge against the bare limit / the dedup limit, per repetition (CPU per request over both closed loops; duplicates against the limit without producing):"
    );
    println!(
        "{:>3}  {:>17} {:>17} {:>21} {:>17} {:>10} {:>11}",
        "rep",
        "req/s @64",
        "req/s @256",
        "p99 diff @fixed",
        "CPU per request",
        "peak RSS",
        "duplicates"
    );
    let reps = rows.iter().map(|r| r.rep).max().unwrap_or(0);
    for rep in 1..=reps {
        for (name, mark) in [(POSBRIDGE, ""), (BASELINE, "  baseline")] {
            let Some(r) = Ratios::of(rows, rep, name) else {
                continue;
            };
            println!(
                "{rep:>3}  {:>17} {:>17} {:>21} {:>17} {:>6.0} MiB {:>10.2}×{mark}",
                pair(r.throughput_64),
                pair(r.throughput_256),
                format!("{:.1} / {:.1} ms", r.p99_fixed_ms.0, r.p99_fixed_ms.1),
                pair(r.cpu_per_request),
                r.peak_rss_mib,
                r.duplicates
            );
        }
    }
    println!(
        "{:>3}  {:>17} {:>17} {:>21} {:>17} {:>10} {:>11}",
        "aim",
        "≥ 0.90× bare",
        "≥ 0.90× bare",
        "≤ 3.0 ms bare",
        "≤ 1.80× bare",
        "≤ 64 MiB",
        "≥ 0.80×"
    );
}

/// Prints the peer against the bare limit, per repetition, or nothing when
/// the peer did not run (the bench said why at its start).
pub fn peer(rows: &[Row]) {
    if !rows.iter().any(|r| r.server == CAMEL) {
        return;
    }
    println!();
    println!(
        "{CAMEL} against the bare limit, per repetition (CPU per request over both closed loops):"
    );
    println!(
        "{:>3}  {:>10} {:>10} {:>16} {:>16} {:>10}",
        "rep", "req/s @64", "req/s @256", "p99 diff @fixed", "CPU per request", "peak RSS"
    );
    let reps = rows.iter().map(|r| r.rep).max().unwrap_or(0);
    for rep in 1..=reps {
        let Some(r) = Against::of(rows, rep, CAMEL, LIMIT) else {
            continue;
        };
        println!(
            "{rep:>3}  {:>9.2}× {:>9.2}× {:>13.1} ms {:>15.2}× {:>6.0} MiB",
            r.throughput_64,
            r.throughput_256,
            r.p99_fixed_ms,
            r.cpu_per_request,
            peak_rss_mib(rows, rep, CAMEL),
        );
    }
}

/// Prints, per repetition and phase, each filled ledger's throughput
/// against the same backend's empty one.
pub fn scale(rows: &[Row]) {
    println!();
    println!("filled ledger against an empty one of the same backend, req/s (aim: within 10%):");
    let pairs = [
        ("posbridge, filled", POSBRIDGE),
        ("posbridge, redis filled", "posbridge, redis"),
    ];
    for row in rows {
        let Some((_, empty)) = pairs.iter().find(|(filled, _)| *filled == row.server) else {
            continue;
        };
        let Some(base) = rows
            .iter()
            .find(|r| r.rep == row.rep && r.server == *empty && r.phase == row.phase)
        else {
            continue;
        };
        println!(
            "{:>3}  {:<23}  {:<22} {:>8.0} against {:>8.0}  {:>6.2}×",
            row.rep,
            row.server,
            row.phase.label(),
            row.measured.rate(),
            base.measured.rate(),
            row.measured.rate() / base.measured.rate()
        );
    }
}
