//! posbridge beside the limit, in one run on one broker.
//!
//! The limit server (`limit.rs`) does the least any bridge must do per
//! webhook: verify, parse, produce with posbridge's producer settings, await
//! the ack. The release posbridge runs with its default settings. Both are
//! child processes of this bench, loaded by the same generator (`load.rs`),
//! alternately and repeatedly, so drift on a shared machine hits both:
//!
//! 1. closed loop on 64 connections, then on 256, every request a new
//!    delivery of a new entity (every request produces);
//! 2. a fixed rate of half the limit's closed-loop rate of that repetition;
//! 3. duplicates: deliveries already answered, replayed (nothing produced),
//!    beside the limit server with producing turned off.
//!
//! It prints a row per phase and then the ratios posbridge/limit with the
//! targets. Run it with `scripts/bench` (starts a fresh tansu broker).
//! Settings, by environment: `POSBRIDGE_BENCH_BROKERS`, `POSBRIDGE_BENCH_SECS`
//! (per phase, default 8), `POSBRIDGE_BENCH_REPEAT` (default 2),
//! `POSBRIDGE_BENCH_REDIS` (a Redis URL: posbridge uses the Redis ledger),
//! `POSBRIDGE_BENCH_LIBRDKAFKA` (`key=value,…` for both producers),
//! `POSBRIDGE_BENCH_PARTITIONS` (both layouts), `POSBRIDGE_BENCH_BROKER_PID`
//! (to report the broker's CPU too), `POSBRIDGE_BENCH_LEDGER_DIR` (start
//! posbridge on a copy of this prepared ledger directory).
//!
//! Asserts nothing about speed: it prints figures.

mod limit;
mod load;
mod report;
mod server;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use load::{Ids, Load, Measured};
use posbridge::config::{Config, KafkaConfig};
use posbridge::publish::{Publisher, Topics};
use report::{Phase, Row};
use server::{Server, Usage, free_addr};

/// The settings of one bench run.
#[derive(Debug, Clone)]
struct Settings {
    brokers: String,
    phase: Duration,
    repeat: usize,
    redis: Option<String>,
    librdkafka: BTreeMap<String, String>,
    partitions: i32,
    broker_pid: Option<u32>,
    ledger_dir: Option<std::path::PathBuf>,
}

impl Settings {
    fn from_env() -> Settings {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        Settings {
            brokers: var("POSBRIDGE_BENCH_BROKERS").unwrap_or_else(|| "127.0.0.1:19093".into()),
            phase: Duration::from_secs(
                var("POSBRIDGE_BENCH_SECS").map_or(8, |v| v.parse().expect("seconds")),
            ),
            repeat: var("POSBRIDGE_BENCH_REPEAT").map_or(2, |v| v.parse().expect("count")),
            redis: var("POSBRIDGE_BENCH_REDIS"),
            librdkafka: var("POSBRIDGE_BENCH_LIBRDKAFKA")
                .map(|v| {
                    v.split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                        .collect()
                })
                .unwrap_or_default(),
            partitions: var("POSBRIDGE_BENCH_PARTITIONS")
                .map_or(KafkaConfig::default().partitions, |v| {
                    v.parse().expect("partitions")
                }),
            broker_pid: var("POSBRIDGE_BENCH_BROKER_PID").map(|v| v.parse().expect("pid")),
            ledger_dir: var("POSBRIDGE_BENCH_LEDGER_DIR").map(Into::into),
        }
    }

    /// The `[kafka]` section both servers share, under `prefix`.
    fn kafka(&self, prefix: &str) -> KafkaConfig {
        KafkaConfig {
            brokers: self.brokers.clone(),
            topic_prefix: prefix.to_owned(),
            partitions: self.partitions,
            librdkafka: self.librdkafka.clone(),
            ..KafkaConfig::default()
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some(LIMIT_SERVER) => return limit_server(&args[2..]),
        Some(LOAD_ONLY) => return load_only(&args[2..]),
        _ => {}
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("webhooks bench: run it with `scripts/bench` or `cargo bench --bench webhooks`");
        return;
    }
    let settings = Settings::from_env();
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(bench(settings));
}

/// The first argument that makes this binary the limit server.
const LIMIT_SERVER: &str = "limit-server";

/// The first argument that makes this binary only the load generator, for
/// profiling a server someone else started.
const LOAD_ONLY: &str = "load";

/// `load ADDR CONNECTIONS SECONDS`: new deliveries on a closed loop, then
/// the client's figures.
fn load_only(args: &[String]) {
    let [addr, connections, seconds] = args else {
        panic!("load ADDR CONNECTIONS SECONDS");
    };
    let load = Load::Closed {
        connections: connections.parse().expect("connections"),
    };
    let ids = Ids::Fresh(format!("load{}", std::process::id()));
    let duration = Duration::from_secs(seconds.parse().expect("seconds"));
    let measured = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(load::run(
            addr.parse().expect("address"),
            load,
            ids,
            duration,
        ));
    println!(
        "{:.0} req/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
        measured.rate(),
        measured.p50.as_secs_f64() * 1e3,
        measured.p99.as_secs_f64() * 1e3,
        measured.errors
    );
}

/// `limit-server LISTEN BROKERS TOPIC PRODUCE [key=value…]`.
fn limit_server(args: &[String]) {
    let [listen, brokers, topic, produce, librdkafka @ ..] = args else {
        panic!("limit-server LISTEN BROKERS TOPIC PRODUCE [key=value…]");
    };
    let settings = limit::LimitSettings {
        listen: listen.parse().expect("listen address"),
        brokers: brokers.clone(),
        topic: topic.clone(),
        secret: load::SECRET.to_owned(),
        produce: produce == "true",
        librdkafka: librdkafka
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    };
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(limit::serve(settings));
}

/// Which server a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The limit server, producing.
    Limit,
    /// The limit server answering after verify + parse.
    LimitNoProduce,
    /// The release posbridge.
    Posbridge,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Limit => "limit",
            Kind::LimitNoProduce => "limit (no produce)",
            Kind::Posbridge => "posbridge",
        }
    }
}

async fn bench(settings: Settings) {
    let run = format!(
        "b{}{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            % 100_000
    );
    let work = tempfile::tempdir().expect("work dir");
    let limit_prefix = format!("{run}.limit.");
    // The limit's topics: posbridge's layout (every entity topic compacted,
    // the dead-letter topic, the same partitions), made by posbridge's own code.
    let limit_kafka = settings.kafka(&limit_prefix);
    let publisher =
        Publisher::new(&limit_kafka, Config::default().max_record_bytes()).expect("publisher");
    publisher
        .ensure_topics(
            &Topics::new(&limit_kafka).all(),
            limit_kafka.partitions,
            limit_kafka.replication_factor,
        )
        .await
        .expect("limit topics");
    drop(publisher);
    let limit_topic = limit_kafka.topic(posbridge::event::EntityType::Sale);

    report::header(&settings_line(&settings));
    let mut rows = Vec::new();
    for rep in 1..=settings.repeat {
        let mut half_limit = None;
        for kind in [Kind::Limit, Kind::LimitNoProduce, Kind::Posbridge] {
            let addr = free_addr();
            let log = work
                .path()
                .join(format!("{}-{rep}.log", kind.name().replace(' ', "_")));
            let command = match kind {
                Kind::Limit | Kind::LimitNoProduce => {
                    limit_command(&settings, addr, &limit_topic, kind == Kind::Limit)
                }
                Kind::Posbridge => posbridge_command(
                    &settings,
                    addr,
                    &format!("{run}.posbridge."),
                    work.path(),
                    rep,
                ),
            };
            let server = Server::start(command, addr, &log);
            let prefix = format!("{run}-{rep}-{}", kind.name().len());
            let phases = if kind == Kind::LimitNoProduce {
                vec![Phase::Duplicates]
            } else {
                vec![
                    Phase::Closed(64),
                    Phase::Closed(256),
                    Phase::Fixed,
                    Phase::Duplicates,
                ]
            };
            if kind != Kind::LimitNoProduce {
                // Warm-up: connections, producer, topics' metadata.
                load::run(
                    addr,
                    Load::Closed { connections: 64 },
                    Ids::Fresh(format!("{prefix}-warm")),
                    Duration::from_secs(2),
                )
                .await;
            }
            for phase in phases {
                if kind == Kind::Limit && phase == Phase::Duplicates {
                    continue;
                }
                let (load, ids) = match phase {
                    Phase::Closed(connections) => (
                        Load::Closed { connections },
                        Ids::Fresh(format!("{prefix}-c{connections}")),
                    ),
                    Phase::Fixed => (
                        Load::Fixed {
                            per_second: half_limit.expect("the limit runs first"),
                            connections: 128,
                        },
                        Ids::Fresh(format!("{prefix}-fixed")),
                    ),
                    Phase::Duplicates => (
                        Load::Closed { connections: 64 },
                        Ids::Replay(prime(addr, &format!("{prefix}-dup")).await),
                    ),
                };
                let row = measure(&settings, &server, rep, kind.name(), phase, || {
                    load::run(addr, load, ids, settings.phase)
                })
                .await;
                if kind == Kind::Limit && phase == Phase::Closed(64) {
                    half_limit = Some(row.measured.rate() / 2.0);
                }
                report::row(&row);
                rows.push(row);
            }
        }
    }
    report::ratios(&rows);
}

/// Sends 2,000 new deliveries once, so they can be replayed as duplicates.
async fn prime(addr: SocketAddr, prefix: &str) -> Arc<Vec<String>> {
    let ids = Arc::new(
        (0..2000)
            .map(|n| format!("{prefix}-{n}"))
            .collect::<Vec<_>>(),
    );
    let once = Load::Once { connections: 64 };
    load::run(addr, once, Ids::Replay(ids.clone()), Duration::ZERO).await;
    ids
}

/// Runs one phase between two readings of the server's (and the broker's) usage.
async fn measure<F, Fut>(
    settings: &Settings,
    server: &Server,
    rep: usize,
    server_name: &'static str,
    phase: Phase,
    run: F,
) -> Row
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Measured>,
{
    let broker = || settings.broker_pid.map(Usage::of).unwrap_or_default();
    let (server_before, broker_before) = (server.usage(), broker());
    let measured = run().await;
    let (server_after, broker_after) = (server.usage(), broker());
    Row {
        rep,
        server: server_name,
        phase,
        server_cpu: server_after.cpu_since(&server_before),
        broker_cpu: settings
            .broker_pid
            .map(|_| broker_after.cpu_since(&broker_before)),
        peak_rss: server_after.peak_rss,
        measured,
    }
}

fn limit_command(settings: &Settings, addr: SocketAddr, topic: &str, produce: bool) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("bench binary"));
    command
        .arg(LIMIT_SERVER)
        .arg(addr.to_string())
        .arg(&settings.brokers)
        .arg(topic)
        .arg(produce.to_string())
        .args(settings.librdkafka.iter().map(|(k, v)| format!("{k}={v}")));
    command
}

/// The release posbridge, `serve` with its defaults but for the listener,
/// broker, topic prefix, ledger and the bench's secret.
fn posbridge_command(
    settings: &Settings,
    addr: SocketAddr,
    prefix: &str,
    work: &std::path::Path,
    rep: usize,
) -> Command {
    let dir = work.join(format!("posbridge-{rep}"));
    std::fs::create_dir_all(&dir).expect("posbridge dir");
    let ledger = match (&settings.redis, &settings.ledger_dir) {
        (Some(url), _) => {
            format!("backend = \"redis\"\nredis_url = \"{url}\"\nredis_prefix = \"{prefix}{rep}:\"")
        }
        (None, Some(prepared)) => {
            let copy = dir.join("ledger.redb");
            std::fs::copy(prepared.join("ledger.redb"), &copy).expect("copy the prepared ledger");
            format!("path = \"{}\"", copy.display())
        }
        (None, None) => format!("path = \"{}\"", dir.join("ledger.redb").display()),
    };
    let librdkafka: String = settings
        .librdkafka
        .iter()
        .map(|(k, v)| format!("\"{k}\" = \"{v}\"\n"))
        .collect();
    let text = format!(
        "[server]\nlisten = \"{addr}\"\n\
         [kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{prefix}\"\npartitions = {}\n\
         [kafka.librdkafka]\n{librdkafka}\
         [ledger]\n{ledger}\n\
         [receiptroller.sources.main]\nsecrets = [\"{}\"]\n",
        settings.brokers,
        settings.partitions,
        load::SECRET,
    );
    let path = dir.join("posbridge.toml");
    std::fs::write(&path, text).expect("posbridge config");
    let mut command = Command::new(env!("CARGO_BIN_EXE_posbridge"));
    command.arg("serve").arg("--config").arg(path);
    command
}

fn settings_line(settings: &Settings) -> String {
    format!(
        "broker {}, {} s per phase, {} repetitions, {} partitions, ledger {}, librdkafka {:?}",
        settings.brokers,
        settings.phase.as_secs(),
        settings.repeat,
        settings.partitions,
        match (&settings.redis, &settings.ledger_dir) {
            (Some(url), _) => format!("redis ({url})"),
            (None, Some(dir)) => format!("embedded, prepared ({})", dir.display()),
            (None, None) => "embedded".into(),
        },
        settings.librdkafka,
    )
}
