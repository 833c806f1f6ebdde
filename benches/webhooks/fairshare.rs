//! `fairshare` (after `--`): fair shares among `POSBRIDGE_BENCH_SOURCES`
//! sources from a directory (default 1,000, ReceiptRoller; `s0` spools),
//! on the embedded ledger and default share settings. The others (every
//! source but `s0`) send at half the closed-64 rate spread over every
//! source; they run alone (quiet) and beside `s0` flooding with 20 × its
//! share of deliveries in flight (`server.share_in_flight` 16: 320
//! connections in a closed loop on a thread of its own, opened with the
//! others' before the phase starts), in turns, `POSBRIDGE_BENCH_REPEAT`
//! times; between them the bare limit at the others' rate, the stalls any
//! server has on this machine and broker. Rows: the others' p50, p99,
//! answers other than 200 and five slowest answers (when in the phase: a
//! stall or a spread), the bare limit's, the flood's rate and answers other
//! than 200, what was done with the flood's deliveries over its share or
//! pace, and the spool drained after (every spooled delivery published);
//! last, the others' p99 beside the flood minus quiet, each repetition and
//! the median, and every repetition's answers pooled, beside issue 51's aim.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::Settings;
use crate::commands::limit_command;
use crate::limit::LimitKind;
use crate::load::{self, Dialect, Ids, Load, Measured};
use crate::server::{Server, free_addr};
use crate::sources::{directory_posbridge, metric, source_count, write_source};

/// Connections of the flood: 20 × the default share of 16 in flight.
const FLOOD_CONNECTIONS: usize = 20 * 16;

fn row(label: &str, measured: &Measured) {
    println!(
        "{label:>28}: {:>7.0} req/s, p50 {:>5.1} ms, p99 {:>6.1} ms, {} not 200 of {} ({} connections broke)",
        measured.rate(),
        measured.p50.as_secs_f64() * 1e3,
        measured.p99.as_secs_f64() * 1e3,
        measured.errors,
        measured.requests,
        measured.broken
    );
}

/// A phase's [`row`] and its five slowest answers (`short` names it).
fn rows(label: &str, short: &str, measured: &Measured) {
    row(label, measured);
    slowest(short, measured);
}

/// Five slowest answers of a phase: when in the phase and how slow, to
/// tell a stall from a spread.
fn slowest(label: &str, measured: &Measured) {
    let list: Vec<String> = measured
        .slowest
        .iter()
        .map(|(at, latency)| {
            format!(
                "{:.0} ms at {:.2} s",
                latency.as_secs_f64() * 1e3,
                at.as_secs_f64()
            )
        })
        .collect();
    println!("{:>28}: {}", format!("{label} slowest"), list.join(", "));
}

/// The flood's load on a thread and runtime of its own, its connections
/// opened there. On the bench's one runtime the flood's 320 requests at a
/// phase's start were made and signed before the others' due ones were
/// sent, and the others' latency counted the bench's own queue (20–57 ms
/// at 0.00 s in every phase beside the flood).
struct Flood {
    start: oneshot::Sender<()>,
    measured: oneshot::Receiver<Measured>,
}

impl Flood {
    /// The flood's connections to `addr`, open and waiting for
    /// [`Flood::run`].
    async fn connect(addr: SocketAddr, ids: Ids, phase: Duration) -> Flood {
        let (connected, ready) = oneshot::channel();
        let (start, started) = oneshot::channel();
        let (done, measured) = oneshot::channel();
        std::thread::Builder::new()
            .name("flood".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("flood runtime");
                runtime.block_on(async move {
                    let connections = load::connect_spread(&[addr], FLOOD_CONNECTIONS).await;
                    let _ = connected.send(());
                    if started.await.is_err() {
                        return;
                    }
                    let flood = Load::Closed {
                        connections: FLOOD_CONNECTIONS,
                    };
                    let s0 = Dialect::Spread { first: 0, count: 1 };
                    let _ =
                        done.send(load::run_connected(connections, s0, flood, ids, phase).await);
                });
            })
            .expect("flood thread");
        ready.await.expect("the flood connected");
        Flood { start, measured }
    }

    /// Runs the flood's phase; its figures at the end.
    async fn run(self) -> Measured {
        self.start.send(()).expect("the flood waits");
        self.measured.await.expect("the flood measured")
    }
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
    let log = work.path().join("fairshare.log");
    let _server = Server::start(command, addr, &log);
    let mut said = 0;
    // The bare limit at the others' rate, beside each repetition: the
    // stalls the machine and the broker give any server at that rate.
    let bare_addr = free_addr();
    let bare_topic = crate::limit_topic(settings, run).await;
    let bare = limit_command(settings, bare_addr, &bare_topic, LimitKind::Produce);
    let _bare = Server::start(bare, bare_addr, &work.path().join("limit.log"));
    crate::rebuild::ready(addr).await;
    // Unmeasured: the bare limit's first second (its connections, the
    // producer's first batches) stalled its first phase 27–75 ms.
    let warm = Ids::Fresh(format!("{run}-bare-warm"));
    load::run(
        bare_addr,
        Dialect::Bridge,
        Load::Closed { connections: 64 },
        warm,
        Duration::from_secs(2),
    )
    .await;
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
    let mut pooled = Pooled::default();
    for repetition in 0..settings.repeat {
        // The others' rate alone on one server: posbridge's quiet phase,
        // the bare limit's.
        let alone = |addr, dialect, name: &str| {
            let ids = Ids::Fresh(format!("{run}-{name}{repetition}"));
            load::run(addr, dialect, others, ids, settings.phase)
        };
        let quiet = alone(addr, others_spread, "quiet").await;
        rows(&format!("rep {repetition} others, quiet"), "quiet", &quiet);
        let floor = alone(bare_addr, Dialect::Bridge, "bare").await;
        let label = format!("rep {repetition} bare limit, same rate");
        rows(&label, "bare limit", &floor);
        let before = metric(addr, "posbridge_deliveries_over_share_total", &["s0\""]).await;
        // Both loads' connections open before either starts: the flood's
        // 320 handshakes would otherwise fall inside the others' phase, on
        // the CPU posbridge and the load share. The flood's first: made
        // after the others', they once took past posbridge's idle timeout
        // (`server.header_read_timeout_ms`, 2 s), the others' connections
        // were closed unused, and the flood ran alone, never paced.
        let flood = Flood::connect(
            addr,
            Ids::Fresh(format!("{run}-flood{repetition}")),
            settings.phase,
        )
        .await;
        let others_connected = load::connect_spread(&[addr], others.connections()).await;
        let loaded = load::run_connected(
            others_connected,
            others_spread,
            others,
            Ids::Fresh(format!("{run}-others{repetition}")),
            settings.phase,
        );
        let (loaded, flood) = tokio::join!(loaded, flood.run());
        let label = format!("rep {repetition} others, s0 flooding");
        rows(&label, "beside the flood", &loaded);
        deltas.push((loaded.p99.as_secs_f64() - quiet.p99.as_secs_f64()) * 1e3);
        pooled.add(&quiet, &loaded, &floor);
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
        said = warnings(&log, said);
    }
    deltas.sort_by(f64::total_cmp);
    let listed: Vec<String> = deltas.iter().map(|d| format!("{d:+.1}")).collect();
    println!(
        "the others' p99 beside the flood minus quiet: {} ms; median {:+.1} ms (aim: within 2 ms)",
        listed.join(", "),
        deltas.get(deltas.len() / 2).copied().unwrap_or_default()
    );
    pooled.print();
}

/// posbridge's warnings and errors past the first `said` of them, printed:
/// what it said of an answer other than 200 (a connection refused over
/// `max_connections`, a broker stall). Returns how many there are now.
fn warnings(log: &Path, said: usize) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect();
    for line in all.iter().skip(said) {
        println!("  posbridge said: {line}");
    }
    all.len()
}

/// Every repetition's answers together, per phase: a stall moves one
/// phase's p99 by as much as the flood is allowed (~300 answers wait in
/// one), and where stalls fall differs between phases; pooled, each phase
/// has the answers of every repetition, and one stall weighs its share.
#[derive(Default)]
struct Pooled {
    quiet: Vec<Duration>,
    loaded: Vec<Duration>,
    floor: Vec<Duration>,
}

impl Pooled {
    fn add(&mut self, quiet: &Measured, loaded: &Measured, floor: &Measured) {
        self.quiet.extend(&quiet.latencies);
        self.loaded.extend(&loaded.latencies);
        self.floor.extend(&floor.latencies);
    }

    fn print(mut self) {
        let p99 = |all: &mut Vec<Duration>| {
            all.sort_unstable();
            load::percentile(all, 0.99).as_secs_f64() * 1e3
        };
        let (quiet, loaded, floor) = (
            p99(&mut self.quiet),
            p99(&mut self.loaded),
            p99(&mut self.floor),
        );
        println!(
            "every repetition pooled ({} answers a phase): the others' p99 quiet {quiet:.1} ms, beside the flood {loaded:.1} ms ({:+.1} ms; aim: within 2 ms); the bare limit at their rate {floor:.1} ms",
            self.quiet.len(),
            loaded - quiet
        );
    }
}
