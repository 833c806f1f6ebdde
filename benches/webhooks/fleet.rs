//! `fleet` (after `--`): two posbridge replicas on one Redis ledger, the
//! deployment a Service spreads webhooks over, beside the bare limit and
//! one posbridge on the same Redis, in one run on one broker.
//!
//! The load generator spreads its connections over the replicas itself
//! (connection `i` to replica `i % 2`, [`crate::load::run_spread`]), as a
//! Kubernetes Service does in the kernel: a user-space balancer such as
//! HAProxy would put its own CPU and a second hop into every figure, which a
//! Service does not cost, and on a small machine it would take its core
//! from the replicas. Both replicas share the topics and the Redis prefix,
//! each has its own config; CPU per request is both replicas' CPU summed,
//! Redis's is shown apart (`POSBRIDGE_BENCH_REDIS_PID`, set by
//! `scripts/bench fleet`, which starts the redis-server).

use std::net::SocketAddr;
use std::path::Path;

use crate::report::{self, Phase, Row, find, ms};
use crate::server::{Group, Server, free_addr};
use crate::{LedgerChoice, Settings, Spec, Under, bench, limit, posbridge_command};

/// One posbridge on the Redis ledger, in the table.
pub const ONE: &str = "posbridge, redis";
/// Two replicas on one Redis ledger, in the table.
pub const FLEET: &str = "2 × posbridge, redis";

/// The phases every server of this run is measured in.
const PHASES: [Phase; 3] = [Phase::Closed(64), Phase::Closed(256), Phase::Fixed];

/// The limit, one posbridge on Redis and two replicas on one Redis ledger,
/// `settings.repeat` times, then the table.
pub(crate) async fn run(settings: &Settings, run: &str) {
    let url = settings.redis.clone().expect(
        "POSBRIDGE_BENCH_REDIS: the Redis the replicas share (scripts/bench fleet starts one)",
    );
    let redis = LedgerChoice::Redis { url, prefix: None };
    let specs = [
        Spec {
            name: report::LIMIT,
            under: Under::Limit(limit::LimitKind::Produce),
            phases: PHASES.to_vec(),
        },
        Spec {
            name: ONE,
            under: Under::Posbridge(redis.clone()),
            phases: PHASES.to_vec(),
        },
        Spec {
            name: FLEET,
            under: Under::Fleet(redis, 2),
            phases: PHASES.to_vec(),
        },
    ];
    let rows = bench(settings, run, &specs).await;
    table(&rows);
}

/// Starts `replicas` replicas of this build's posbridge on `ledger`, each
/// with its own config and directory but the same topics and ledger
/// prefix (named after the shared directory name `fleet-TAG`). The first
/// creates the topics, so the others start once it is ready.
pub(crate) async fn start(
    settings: &Settings,
    run: &str,
    ledger: &LedgerChoice,
    replicas: usize,
    work: &Path,
    tag: &str,
) -> (Group, Vec<SocketAddr>) {
    let binary = Path::new(env!("CARGO_BIN_EXE_posbridge"));
    let mut servers = Vec::new();
    let mut addrs = Vec::new();
    for n in 1..=replicas {
        let addr = free_addr();
        // One directory name for all (it names the topics and the prefix),
        // under a folder per replica.
        let dir = work.join(format!("r{n}")).join(format!("fleet-{tag}"));
        let command = posbridge_command(settings, addr, run, ledger, &dir, binary);
        let log = work.join(format!("server-{tag}-r{n}.log"));
        servers.push(Server::start(command, addr, &log));
        addrs.push(addr);
        crate::rebuild::ready(addr).await;
    }
    (Group::of(servers), addrs)
}

/// Each server's figures per repetition beside the limit's of the same
/// repetition: req/s at 64 and 256 connections, CPU per request over both
/// closed loops (a fleet's replicas summed; Redis's apart), p99 at half the
/// limit's rate.
fn table(rows: &[Row]) {
    println!();
    println!(
        "the fleet beside the bare limit, per repetition (µs of CPU per request: mean of both closed loops, the replicas' summed; Redis's apart; p99 at half the limit's closed-64 rate):"
    );
    println!(
        "{:>3}  {:<21} {:>15} {:>15} {:>15} {:>10} {:>17} {:>9}",
        "rep", "server", "req/s @64", "req/s @256", "µs CPU/req", "Redis µs", "p99 @fixed", "RSS"
    );
    let reps = rows.iter().map(|r| r.rep).max().unwrap_or(0);
    let cpu = |r: &Row| r.cpu_per_request().as_secs_f64() * 1e6;
    let redis = |r: &Row| {
        r.redis_cpu.map_or(0.0, |c| {
            c.as_secs_f64() * 1e6 / r.measured.requests.max(1) as f64
        })
    };
    for rep in 1..=reps {
        let get = |server, phase| find(rows, rep, server, phase);
        let Some((l64, l256, lf)) = (|| {
            Some((
                get(report::LIMIT, Phase::Closed(64))?,
                get(report::LIMIT, Phase::Closed(256))?,
                get(report::LIMIT, Phase::Fixed)?,
            ))
        })() else {
            continue;
        };
        let limit_cpu = (cpu(l64) + cpu(l256)) / 2.0;
        for server in [report::LIMIT, ONE, FLEET] {
            let (Some(s64), Some(s256), Some(sf)) = (
                get(server, Phase::Closed(64)),
                get(server, Phase::Closed(256)),
                get(server, Phase::Fixed),
            ) else {
                continue;
            };
            let server_cpu = (cpu(s64) + cpu(s256)) / 2.0;
            let rss = [s64, s256, sf]
                .iter()
                .map(|r| r.peak_rss)
                .max()
                .unwrap_or(0);
            println!(
                "{rep:>3}  {server:<21} {:>15} {:>15} {:>15} {:>10.0} {:>17} {:>5.0} MiB",
                format!(
                    "{:.0} ({:.2}×)",
                    s64.measured.rate(),
                    s64.measured.rate() / l64.measured.rate()
                ),
                format!(
                    "{:.0} ({:.2}×)",
                    s256.measured.rate(),
                    s256.measured.rate() / l256.measured.rate()
                ),
                format!("{server_cpu:.0} ({:.2}×)", server_cpu / limit_cpu),
                (redis(s64) + redis(s256)) / 2.0,
                format!(
                    "{:.1} ms ({:+.1})",
                    ms(sf.measured.p99),
                    ms(sf.measured.p99) - ms(lf.measured.p99)
                ),
                rss as f64 / (1024.0 * 1024.0),
            );
        }
    }
}
