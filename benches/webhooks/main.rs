//! posbridge beside two limits, in one run on one broker.
//!
//! The limit server (`limit.rs`) does the least any bridge must do per
//! webhook: verify, parse, produce with posbridge's producer settings, await
//! the ack (the bare limit); as the dedup limit it also makes one durable
//! insert-if-absent of the delivery id before the produce, the least a
//! bridge that drops duplicates across restarts must do. The release
//! posbridge runs with its default settings. All are
//! child processes of this bench, loaded by the same generator (`load.rs`),
//! alternately and repeatedly, so drift on a shared machine hits all:
//!
//! 1. closed loop on 64 connections, then on 256, every request a new
//!    delivery of a new entity (every request produces);
//! 2. a fixed rate of half the bare limit's closed-loop rate of that repetition;
//! 3. duplicates: deliveries already answered, replayed (nothing produced),
//!    beside the limit server with producing turned off.
//!
//! With `POSBRIDGE_BENCH_CAMEL` (a peer's start script, run as `SCRIPT PORT
//! BOOTSTRAP TOPIC`, e.g. Apache Camel's HTTP→Kafka route: idempotent,
//! `acks=all`, 202 after the ack) the peer runs last in each repetition, in
//! the phases of new deliveries, and gets rows of its own: what a
//! general-purpose integration framework costs beside the same limit.
//!
//! It prints a row per phase and then the ratios posbridge/limits with the
//! aims, and the peer's to the bare limit. Run it with `scripts/bench`
//! (starts a fresh broker, Apache Kafka by default, pinned to a core of its
//! own).
//! Settings, by environment: `POSBRIDGE_BENCH_BROKERS`, `POSBRIDGE_BENCH_SECS`
//! (per phase, default 8), `POSBRIDGE_BENCH_REPEAT` (default 2),
//! `POSBRIDGE_BENCH_REDIS` (a Redis URL: posbridge uses the Redis ledger),
//! `POSBRIDGE_BENCH_LIBRDKAFKA` (`key=value,…` for both producers),
//! `POSBRIDGE_BENCH_PARTITIONS` (both layouts), `POSBRIDGE_BENCH_BROKER_PID`
//! (to report the broker's CPU too), `POSBRIDGE_BENCH_BASELINE` (the path of
//! another posbridge binary, e.g. a build of the last commit: it runs beside
//! this one in every repetition, so a change is measured against what it
//! changes in one run instead of across runs), `POSBRIDGE_BENCH_CAMEL`.
//!
//! `scale` (after `--`) first fills an embedded and a Redis ledger with
//! `POSBRIDGE_BENCH_IDS` done delivery ids (default 10 million) and
//! `POSBRIDGE_BENCH_ENTITIES` entity states (default 1 million), reports
//! their size and the purge's cost (`fill.rs`), then runs posbridge on empty
//! and on filled ledgers side by side.
//!
//! `sources` (after `--`): posbridge with a directory of a thousand sources
//! (`sources.rs`).
//!
//! `fairshare` (after `--`): a thousand sources, the others' p99 and
//! refusals alone and beside one source flooding 20 × its share
//! (`fairshare.rs`).
//!
//! `fleet` (after `--`): two replicas on one Redis ledger beside one on it
//! and the bare limit (`fleet.rs`; `POSBRIDGE_BENCH_REDIS_PID` for Redis's CPU).
//!
//! `rebuild` (after `--`) times the ledger's rebuild from the topics: the
//! tail after a SIGKILL under load and the whole after a lost ledger, on
//! `POSBRIDGE_BENCH_ENTITIES` entities (`rebuild.rs`).
//!
//! Asserts nothing about speed: it prints figures.

mod commands;
mod fairshare;
mod fill;
mod fleet;
mod limit;
mod load;
#[path = "../shared/percentile.rs"]
mod percentile;
mod rebuild;
mod rederive;
mod report;
mod scale;
mod server;
mod sources;
#[path = "../../tests/it/support/v1.rs"]
#[allow(dead_code, reason = "the tests' helpers the bench does not use")]
mod v1;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use commands::{camel_command, limit_command, posbridge_command};
use load::{Dialect, Ids, Load, Measured};
use posbridge::adapters::publish::{Publisher, Topics};
use posbridge::config::{Config, KafkaConfig};
use report::{Phase, Row};
use server::{Group, Server, Usage, free_addr};

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
    redis_pid: Option<u32>,
    baseline: Option<PathBuf>,
    camel: Option<PathBuf>,
    broker_warmup: Duration,
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
            redis_pid: var("POSBRIDGE_BENCH_REDIS_PID").map(|v| v.parse().expect("pid")),
            baseline: var("POSBRIDGE_BENCH_BASELINE").map(PathBuf::from),
            camel: var("POSBRIDGE_BENCH_CAMEL").map(PathBuf::from),
            broker_warmup: Duration::from_secs(
                var("POSBRIDGE_BENCH_BROKER_WARMUP_SECS")
                    .map_or(20, |v| v.parse().expect("seconds")),
            ),
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
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let run = run_id();
    if args.iter().any(|a| a == "scale") {
        runtime.block_on(scale::run(&settings, &run));
    } else if args.iter().any(|a| a == "fleet") {
        runtime.block_on(fleet::run(&settings, &run));
    } else if args.iter().any(|a| a == "rebuild") {
        runtime.block_on(rebuild::run(&settings, &run));
    } else if args.iter().any(|a| a == "fairshare") {
        runtime.block_on(fairshare::run(&settings, &run));
    } else if args.iter().any(|a| a == "sources") {
        runtime.block_on(sources::run(&settings, &run));
    } else if args.iter().any(|a| a == "rederive") {
        runtime.block_on(rederive::run(&settings, &run));
    } else {
        if settings.camel.is_none() {
            println!(
                "{}: row skipped, POSBRIDGE_BENCH_CAMEL (the peer's start script, run as SCRIPT PORT BOOTSTRAP TOPIC) is not set",
                report::CAMEL
            );
        }
        let rows = runtime.block_on(bench(&settings, &run, &side_by_side(&settings)));
        report::ratios(&rows);
        report::peer(&rows);
    }
}

/// `POSBRIDGE_BENCH_ENTITIES`: how many entities the rebuild and rederive
/// runs write (default a million).
fn entities_from_env() -> usize {
    std::env::var("POSBRIDGE_BENCH_ENTITIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// The first argument that makes this binary the limit server.
const LIMIT_SERVER: &str = "limit-server";

/// The first argument that makes this binary only the load generator, for
/// profiling a server someone else started.
const LOAD_ONLY: &str = "load";

/// `load ADDR CONNECTIONS SECONDS [duplicates]`: new deliveries on a closed
/// loop (with `duplicates`, 2,000 deliveries sent once and then replayed),
/// then the client's figures.
fn load_only(args: &[String]) {
    let (addr, connections, seconds, duplicates) = match args {
        [addr, connections, seconds] => (addr, connections, seconds, false),
        [addr, connections, seconds, mode] if mode == "duplicates" => {
            (addr, connections, seconds, true)
        }
        _ => panic!("load ADDR CONNECTIONS SECONDS [duplicates]"),
    };
    let addr: SocketAddr = addr.parse().expect("address");
    let load = Load::Closed {
        connections: connections.parse().expect("connections"),
    };
    let duration = Duration::from_secs(seconds.parse().expect("seconds"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let prefix = format!("load{}", std::process::id());
    let ids = if duplicates {
        Ids::Replay(runtime.block_on(prime(addr, Dialect::Bridge, &prefix)))
    } else {
        Ids::Fresh(prefix)
    };
    let measured = runtime.block_on(load::run(addr, Dialect::Bridge, load, ids, duration));
    println!(
        "{} requests, {:.0} req/s, p50 {:.1} ms, p99 {:.1} ms, {} errors",
        measured.requests,
        measured.rate(),
        measured.p50.as_secs_f64() * 1e3,
        measured.p99.as_secs_f64() * 1e3,
        measured.errors
    );
}

/// `limit-server LISTEN BROKERS TOPIC verify|produce|dedup [key=value…]`.
fn limit_server(args: &[String]) {
    let [listen, brokers, topic, kind, librdkafka @ ..] = args else {
        panic!("limit-server LISTEN BROKERS TOPIC verify|produce|dedup [key=value…]");
    };
    let settings = limit::LimitSettings {
        listen: listen.parse().expect("listen address"),
        brokers: brokers.clone(),
        topic: topic.clone(),
        secret: load::SECRET.to_owned(),
        kind: limit::LimitKind::parse(kind),
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

/// The ledger a posbridge under test uses.
#[derive(Debug, Clone)]
pub enum LedgerChoice {
    /// A redb file: a new one, or a copy of this prepared one.
    Embedded(Option<PathBuf>),
    /// Redis at `url`: under a new prefix, or under this prepared one.
    Redis {
        /// Server URL.
        url: String,
        /// The prefix of a prepared ledger.
        prefix: Option<String>,
    },
}

/// What a server process runs.
#[derive(Debug, Clone)]
enum Under {
    /// The limit server of this kind.
    Limit(limit::LimitKind),
    /// The release posbridge.
    Posbridge(LedgerChoice),
    /// Another posbridge binary, with the same settings.
    Baseline(LedgerChoice, PathBuf),
    /// The peer, by its start script.
    Camel(PathBuf),
    /// This many replicas of the release posbridge on one ledger (`fleet.rs`).
    Fleet(LedgerChoice, usize),
}

impl Under {
    /// The posbridge binary it runs: this build's, or the baseline's.
    fn binary(&self) -> &Path {
        match self {
            Under::Baseline(_, binary) => binary,
            _ => Path::new(env!("CARGO_BIN_EXE_posbridge")),
        }
    }

    /// The ledger of a posbridge (or of each replica of a fleet).
    fn ledger(&self) -> Option<&LedgerChoice> {
        match self {
            Under::Posbridge(ledger) | Under::Baseline(ledger, _) | Under::Fleet(ledger, _) => {
                Some(ledger)
            }
            Under::Limit(_) | Under::Camel(_) => None,
        }
    }

    /// How it takes a delivery.
    fn dialect(&self) -> Dialect {
        match self {
            Under::Camel(_) => Dialect::Peer,
            _ => Dialect::Bridge,
        }
    }

    /// How long it may take to listen: the peer's first start fetches its
    /// jars from Maven Central.
    fn start_within(&self) -> Duration {
        match self {
            Under::Camel(_) => Duration::from_secs(600),
            _ => Duration::from_secs(60),
        }
    }

    /// Its unmeasured load before its first phase of new deliveries:
    /// connections, producer, topics' metadata; for the peer also its JVM's
    /// JIT, which compiles the hot paths in its first seconds under load
    /// (as the broker's does, see [`warm_broker`]).
    fn warmup(&self) -> Duration {
        match self {
            Under::Camel(_) => Duration::from_secs(15),
            _ => Duration::from_secs(2),
        }
    }
}

/// One server of the run and the phases it is measured in.
#[derive(Debug, Clone)]
struct Spec {
    name: &'static str,
    under: Under,
    phases: Vec<Phase>,
}

/// The side-by-side run: the bare limit, the dedup limit, the limit
/// without producing (for the duplicates), posbridge, then the baseline
/// and the peer when they are given.
fn side_by_side(settings: &Settings) -> Vec<Spec> {
    let ledger = match &settings.redis {
        Some(url) => LedgerChoice::Redis {
            url: url.clone(),
            prefix: None,
        },
        None => LedgerChoice::Embedded(None),
    };
    let posbridge_phases = vec![
        Phase::Closed(64),
        Phase::Closed(256),
        Phase::Fixed,
        Phase::Duplicates,
    ];
    let baseline = settings.baseline.as_ref().map(|binary| Spec {
        name: report::BASELINE,
        under: Under::Baseline(ledger.clone(), binary.clone()),
        phases: posbridge_phases.clone(),
    });
    // No duplicates: the peer drops none, it produces every request again.
    let camel = settings.camel.as_ref().map(|script| Spec {
        name: report::CAMEL,
        under: Under::Camel(script.clone()),
        phases: vec![Phase::Closed(64), Phase::Closed(256), Phase::Fixed],
    });
    [
        Spec {
            name: report::LIMIT,
            under: Under::Limit(limit::LimitKind::Produce),
            phases: vec![Phase::Closed(64), Phase::Closed(256), Phase::Fixed],
        },
        Spec {
            name: report::DEDUP_LIMIT,
            under: Under::Limit(limit::LimitKind::Dedup),
            phases: vec![
                Phase::Closed(64),
                Phase::Closed(256),
                Phase::Fixed,
                Phase::Duplicates,
            ],
        },
        Spec {
            name: report::LIMIT_NO_PRODUCE,
            under: Under::Limit(limit::LimitKind::VerifyOnly),
            phases: vec![Phase::Duplicates],
        },
        Spec {
            name: report::POSBRIDGE,
            under: Under::Posbridge(ledger),
            phases: posbridge_phases,
        },
    ]
    .into_iter()
    .chain(baseline)
    .chain(camel)
    .collect()
}

/// The run id: names the topics, Redis prefixes and delivery ids of one run.
fn run_id() -> String {
    format!(
        "b{}{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
            % 100_000
    )
}

/// The limits' sale topic, after making their topics: posbridge's layout
/// (every entity topic compacted, the dead-letter topic, the same
/// partitions), made by posbridge's own code.
pub(crate) async fn limit_topic(settings: &Settings, run: &str) -> String {
    let limit_kafka = settings.kafka(&format!("{run}.limit."));
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
    limit_kafka.topic(posbridge::domain::event::EntityType::Sale)
}

/// Runs `specs`, `settings.repeat` times in turn, printing a row per phase.
async fn bench(settings: &Settings, run: &str, specs: &[Spec]) -> Vec<Row> {
    let work = tempfile::tempdir().expect("work dir");
    let limit_topic = limit_topic(settings, run).await;

    report::header(&settings_line(settings, specs));
    warm_broker(settings, &limit_topic, work.path()).await;
    let mut rows = Vec::new();
    for rep in 1..=settings.repeat {
        let mut half_limit = None;
        for (index, spec) in specs.iter().enumerate() {
            let tag = format!("{rep}-{index}");
            let (server, addrs) = match &spec.under {
                Under::Fleet(ledger, replicas) => {
                    fleet::start(settings, run, ledger, *replicas, work.path(), &tag).await
                }
                under => {
                    let addr = free_addr();
                    let log = work.path().join(format!("server-{tag}.log"));
                    let command = match under {
                        Under::Limit(kind) => limit_command(settings, addr, &limit_topic, *kind),
                        Under::Camel(script) => camel_command(settings, script, addr, &limit_topic),
                        _ => {
                            let dir = work.path().join(format!("posbridge-{tag}"));
                            let ledger = under.ledger().expect("a posbridge");
                            posbridge_command(settings, addr, run, ledger, &dir, under.binary())
                        }
                    };
                    let server = Server::start_within(command, addr, &log, under.start_within());
                    (Group::of(vec![server]), vec![addr])
                }
            };
            let addr = addrs[0];
            let prefix = format!("{run}-{tag}");
            let dialect = spec.under.dialect();
            if spec.phases.iter().any(|p| *p != Phase::Duplicates) {
                let warm = Load::Closed { connections: 64 };
                let ids = Ids::Fresh(format!("{prefix}-warm"));
                load::run_spread(&addrs, dialect, warm, ids, spec.under.warmup()).await;
            }
            for &phase in &spec.phases {
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
                        Ids::Replay(prime(addr, dialect, &format!("{prefix}-dup")).await),
                    ),
                };
                let row = measure(settings, &server, rep, spec.name, phase, || {
                    load::run_spread(&addrs, dialect, load, ids, settings.phase)
                })
                .await;
                if spec.name == report::LIMIT && phase == Phase::Closed(64) {
                    half_limit = Some(row.measured.rate() / 2.0);
                }
                report::row(&row);
                rows.push(row);
            }
        }
    }
    rows
}

/// Loads a fresh broker through the bare limit, unmeasured, before the
/// first repetition: Apache Kafka's JVM compiles its hot paths in its first
/// seconds under load, and without this the first server measured (the
/// limit) ran against a slower broker than every later one (its closed-64
/// rate was a third to a half of the second repetition's).
async fn warm_broker(settings: &Settings, topic: &str, work: &Path) {
    if settings.broker_warmup.is_zero() {
        return;
    }
    let addr = free_addr();
    let command = limit_command(settings, addr, topic, limit::LimitKind::Produce);
    let _server = Server::start(command, addr, &work.join("broker-warmup.log"));
    let ids = Ids::Fresh("broker-warmup".into());
    let warmed = load::run(
        addr,
        Dialect::Bridge,
        Load::Closed { connections: 256 },
        ids,
        settings.broker_warmup,
    )
    .await;
    println!(
        "broker warmed up: {} s of the bare limit's load at 256 connections, not measured ({:.0} req/s)",
        settings.broker_warmup.as_secs(),
        warmed.rate()
    );
}

/// Sends 2,000 new deliveries once, so they can be replayed as duplicates.
async fn prime(addr: SocketAddr, dialect: Dialect, prefix: &str) -> Arc<Vec<String>> {
    let ids = Arc::new(
        (0..2000)
            .map(|n| format!("{prefix}-{n}"))
            .collect::<Vec<_>>(),
    );
    let once = Load::Once { connections: 64 };
    load::run(
        addr,
        dialect,
        once,
        Ids::Replay(ids.clone()),
        Duration::ZERO,
    )
    .await;
    ids
}

/// Runs one phase between two readings of the server's (and the broker's) usage.
async fn measure<F, Fut>(
    settings: &Settings,
    server: &Group,
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
    let redis = || settings.redis_pid.map(Usage::of).unwrap_or_default();
    let (server_before, broker_before, redis_before) = (server.usage(), broker(), redis());
    let measured = run().await;
    let (server_after, broker_after, redis_after) = (server.usage(), broker(), redis());
    Row {
        rep,
        server: server_name,
        phase,
        server_cpu: server_after.cpu_since(&server_before),
        broker_cpu: settings
            .broker_pid
            .map(|_| broker_after.cpu_since(&broker_before)),
        redis_cpu: settings
            .redis_pid
            .map(|_| redis_after.cpu_since(&redis_before)),
        peak_rss: server_after.peak_rss,
        measured,
    }
}

fn settings_line(settings: &Settings, specs: &[Spec]) -> String {
    let ledgers: Vec<String> = specs
        .iter()
        .filter_map(|spec| match &spec.under {
            Under::Posbridge(LedgerChoice::Embedded(None)) => Some("embedded".into()),
            Under::Posbridge(LedgerChoice::Embedded(Some(_))) => Some("embedded, filled".into()),
            Under::Posbridge(LedgerChoice::Redis { url, prefix }) => Some(format!(
                "redis at {url}{}",
                if prefix.is_some() { ", filled" } else { "" }
            )),
            Under::Baseline(_, binary) => Some(format!("baseline {}", binary.display())),
            Under::Fleet(LedgerChoice::Redis { url, .. }, n) => {
                Some(format!("{n} replicas on redis at {url}"))
            }
            Under::Fleet(LedgerChoice::Embedded(_), n) => Some(format!("{n} replicas, embedded")),
            Under::Limit(_) | Under::Camel(_) => None,
        })
        .collect();
    // Set by `scripts/bench`, which pins the processes itself.
    let pinned = std::env::var("POSBRIDGE_BENCH_PIN")
        .ok()
        .filter(|pin| !pin.is_empty())
        .and_then(|pin| {
            let (broker, rest) = pin.split_once(':')?;
            Some(format!(
                ", pinned: broker on CPU {broker}, servers and load on CPU {rest}"
            ))
        })
        .unwrap_or_else(|| ", not pinned".into());
    let kind = std::env::var("POSBRIDGE_BENCH_BROKER").unwrap_or_else(|_| "a broker".into());
    format!(
        "{kind} at {}, {} s per phase, {} repetitions, {} partitions, posbridge ledger {}, librdkafka {:?}{pinned}",
        settings.brokers,
        settings.phase.as_secs(),
        settings.repeat,
        settings.partitions,
        ledgers.join(" / "),
        settings.librdkafka,
    )
}
