//! A deterministic simulation of the delivery core: the real pipeline and
//! the real embedded ledger, over a fake broker whose every answer a seeded
//! schedule decides, driven by providers that retry, duplicate and reorder
//! as their documented rules allow, on a virtual clock. One `u64` seed
//! decides every choice; a failing seed replays exactly.
//!
//! **Mechanism.** Each seed runs on a tokio current-thread runtime with its
//! clock paused: timers fire in virtual time the moment every task waits,
//! so a schedule of minutes runs in milliseconds, and tasks are polled in
//! the order they were woken, the same on every run. The core counts its
//! deadlines, leases and retries in `tokio::time::Instant` for this. The
//! fakes (the broker's faults, the providers' timings) draw from one
//! `StdRng` seeded with the seed. madsim and turmoil were the other
//! candidates: madsim replaces tokio and libc's clock and randomness for
//! the whole crate (a second build of every dependency, rdkafka's C code
//! not covered), turmoil simulates a network posbridge's core does not
//! have behind its `Producer` seam; a paused current-thread runtime needs
//! neither and drives the same code production runs.
//!
//! **Crashes.** Each life of posbridge runs on a runtime of its own; a
//! crash ends it, and every task and all memory with it. The ledger's and
//! the spool's files are copied as they were on disk (then lost, or bytes
//! of them changed, as the seed says), the broker keeps its log (sends the
//! crash cut may or may not be in it: in doubt), and the next life starts
//! over those files through the real start-up: the ledger opened (a
//! damaged file set aside), the spool opened (damaged entries quarantined,
//! a damaged file salvaged), the rebuild reading the broker's log through
//! the [`crate::services::rebuild::TopicSource`] seam behind the closed
//! gate. The broker may be replaced by an empty one while posbridge is
//! down (another cluster id, other topic ids). Some stops are clean
//! instead (requests refused, the ledger made durable, the files closed).
//! **The disk** (`disk.rs`): the ledger's and the spool's redb files lie
//! on a simulated disk (redb's `StorageBackend`, through the
//! [`crate::adapters::store_file::Disk`] seam): what was synced is the file
//! itself, what was written since is held apart and, at a crash that takes
//! the machine down, lost, kept or torn at a sector boundary. Writes and
//! syncs take virtual time; a crash whose time falls in one, or aimed at a
//! store, lands in that op. A window may fail a store's writes (no space,
//! I/O errors), and a spooling world's spool may hold a few entries only.
//! Between an acknowledgement and its commit the core awaits the world's
//! pause (`hooks.rs`), and after each checkpoint the world checks that the
//! ledger holds the state of every record below the offsets it recorded.
//!
//! **What is not deterministic, or not simulated**, named: the ledger's
//! checkpoints are taken on the virtual clock by the simulation
//! (`EmbeddedLedger::open_driven`: no thread), but the spool's writes run
//! on tokio's blocking pool (the clock does not move while one runs; a task
//! it wakes is queued when the write ends, and a crash that lands in one of
//! its ops is seen by the world when the runtime next looks, so the tasks
//! of that instant it runs first vary with the threads' timing); wall-clock
//! reads (record timestamps) are offset from the world's epoch and decide
//! nothing within a world; not simulated: Redis, latent sector faults on
//! reads, bytes changed under a running process.
//!
//! **Partitions** (`partitions.rs`): half the worlds give each topic one
//! to four partitions; the fake broker puts a record in the partition its
//! key's murmur2 names, as the producer's `murmur2_random` does, with
//! offsets per partition, and the rebuild reads every partition and
//! checkpoints each one's offset. Order is promised per key, which is per
//! partition: the checks below hold per key whatever the count. A topic
//! may grow while posbridge is stopped: the next start must refuse it,
//! named, and write nothing to it, and the start after the operator's
//! `accept-partitions` (the command's code) must take it again.
//!
//! **The reconciler** runs in half the worlds through the real pipeline,
//! over a fake API (`api.rs`) showing each entity's newest state by the
//! fetch; **outages** (every send failing for 2-90 s while deliveries
//! arrive) in a quarter, so crashes meet a spool that holds entries.
//!
//! **Invariants** (`check.rs`), checked after every schedule from the
//! broker's log and the providers' record of answers: no delivery answered
//! 2xx is missing (its record, or a newer state of its key, is in the log);
//! no key's versions go back; no retry of a delivery answered 2xx wrote a
//! record; no delivery written more than once unless it was in doubt, and
//! then at most once more per doubt (an acknowledgement lost, a send a
//! crash cut after the log took it); an event that cannot be normalized
//! written once, to the dead-letter topic; every answer within the
//! providers' 10 s; every last attempt after the faults and the restarts
//! ended taken; the spool empty at the end. Each broker's log is checked
//! against the answers given while it was the one (a spooled delivery may
//! reach the one that replaced it, and so may the newer state a `stale`
//! answer was judged against while it was in doubt, by its own retry); a
//! spooled delivery is excused only as
//! many times as spool entries were quarantined as damaged.
//!
//! **Plans** (`plan.rs`): a seed draws a world's plan (its parameters,
//! events and attempts, crashes, disk faults and partitions) and the world
//! runs the plan, noting the broker's answer to each send into it. A
//! schedule the simulation found is kept as that plan, in `kept/` (JSON),
//! and its regression test replays the plan: the same faults, whatever a
//! later change to the world makes each seed draw.
//!
//! **Running it.** `cargo test --lib sim` runs [`SEEDS`] seeds (or
//! `POSBRIDGE_SIM_SEEDS`); `POSBRIDGE_SIM_SEED=N cargo test --lib sim --
//! --nocapture` replays seed `N` alone and prints its schedule step by
//! step (with `POSBRIDGE_SIM_KEEP=FILE` it writes its plan there, to keep;
//! `POSBRIDGE_SIM_PLAN=FILE` replays a kept plan); `scripts/simulate
//! --seeds N` is the long run.

use std::time::Duration;

mod api;
mod check;
mod clock;
mod crash;
mod disk;
mod disk_plan;
mod ended;
mod hooks;
mod kept;
mod partitions;
mod plan;
mod process;
mod providers;
mod shared;
mod source;
mod world;

pub(super) use hooks::between_ack_and_commit;
use plan::Plan;
use world::World;

/// Seeds `cargo test` runs, spread over the cores.
const SEEDS: u64 = 2000;

/// Every class of fault and schedule a world may draw, and the share of
/// the budget's worlds that must draw each (about half the share 2,000
/// seeds drew when it was set): a change that stops a world
/// drawing one (a range made empty, a fault no longer planned) fails the
/// budget instead of leaving the simulation blind to it.
pub(super) const DRAWN: [(&str, f64); 23] = [
    ("broker outage", 0.10),
    ("retryable failure", 0.25),
    ("acknowledgement lost", 0.07),
    ("send never taken", 0.06),
    ("late acknowledgement", 0.30),
    ("crash", 0.25),
    ("clean stop", 0.10),
    ("ledger lost", 0.08),
    ("ledger damaged", 0.07),
    ("spool damaged", 0.08),
    ("broker replaced", 0.04),
    ("spooling source", 0.25),
    ("reconciler", 0.25),
    ("cannot be normalized", 0.30),
    ("state repeated", 0.30),
    ("state brought back", 0.15),
    ("crash in a disk op", 0.05),
    ("unsynced writes lost", 0.02),
    ("disk write failed", 0.035),
    ("disk full", 0.008),
    ("spool full", 0.07),
    ("several partitions", 0.25),
    ("topic grown while stopped", 0.05),
];

/// Real time a world may take before it counts as stopped: a world takes
/// well under a second of it (its clock is virtual), so one that has not
/// ended in this long is a task spinning without yielding, or tasks that
/// all wait for something no timer wakes (the virtual clock never moves).
const WORLD_LIMIT: Duration = Duration::from_secs(120);

/// What a run of the simulation runs.
enum Runs {
    /// A budget of seeds, from the first.
    Budget(std::ops::Range<u64>),
    /// One world, step by step: a seed's, or a kept plan's.
    Replay(Box<Plan>),
}

/// What to run: a kept plan (`POSBRIDGE_SIM_PLAN`, a file), a seed
/// (`POSBRIDGE_SIM_SEED`), or a budget (`POSBRIDGE_SIM_SEEDS` seeds from
/// `POSBRIDGE_SIM_FIRST`, else [`SEEDS`] from 0).
fn runs() -> Runs {
    if let Ok(path) = std::env::var("POSBRIDGE_SIM_PLAN") {
        let kept = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("POSBRIDGE_SIM_PLAN={path}: {error}"));
        return Runs::Replay(Box::new(Plan::read(&kept)));
    }
    if let Some(seed) = std::env::var("POSBRIDGE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return Runs::Replay(Box::new(Plan::draw(seed)));
    }
    let budget = match std::env::var("POSBRIDGE_SIM_SEEDS") {
        Ok(seeds) => seeds
            .parse()
            .ok()
            .filter(|seeds| *seeds > 0)
            .unwrap_or_else(|| {
                panic!("POSBRIDGE_SIM_SEEDS={seeds:?}: a number of seeds to run, at least one")
            }),
        Err(_) => SEEDS,
    };
    let first = std::env::var("POSBRIDGE_SIM_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Runs::Budget(first..first + budget)
}

/// A world run to its end: its schedule, the classes of fault and
/// schedule it drew, its plan as it ran (to keep), and the guarantees it
/// broke.
struct Ran {
    steps: Vec<String>,
    drawn: std::collections::BTreeSet<&'static str>,
    kept: Option<Plan>,
    violations: Vec<String>,
}

/// Runs `plan`'s world to its end and checks it.
fn run(plan: Plan) -> Ran {
    // The ledger's and the spool's files: in memory where the machine has
    // a tmpfs (their fsyncs cost nothing there; what is durable is the
    // same), else in the temporary directory.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a temporary directory");
    let ended = World::new(plan).run(dir.path());
    Ran {
        violations: check::violations(&ended),
        steps: ended.steps,
        drawn: ended.drawn,
        kept: Some(ended.kept),
    }
}

/// Runs `plan`, a panic in its world (the core refused to start, say)
/// counted as a violation that names the seed too, and so is a world that
/// stops moving ([`WORLD_LIMIT`]).
fn run_caught(plan: Plan) -> Ran {
    within(WORLD_LIMIT, move || run(plan)).unwrap_or_else(|why| Ran {
        steps: Vec::new(),
        drawn: std::collections::BTreeSet::new(),
        kept: None,
        violations: vec![why],
    })
}

/// What `world` returns, run on a thread of its own: its panic, or its
/// taking longer than `limit` of real time, in words. A world that stopped
/// is left behind on its thread (nothing can stop a thread), and the run
/// fails naming its seed instead of hanging.
fn within<T: Send + 'static>(
    limit: Duration,
    world: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let (ended, end) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("sim-world".to_owned())
        .spawn(move || {
            let _ = ended.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                world,
            )));
        })
        .expect("a world's thread starts");
    match end.recv_timeout(limit) {
        Ok(Ok(ran)) => Ok(ran),
        Ok(Err(panic)) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(format!("the world panicked: {why}"))
        }
        Err(_) => Err(format!(
            "the world stopped moving: not ended after {} s of real time (a task that never yields, or every task waiting on what no timer wakes)",
            limit.as_secs()
        )),
    }
}

/// A world that never ends is named, not waited for.
#[test]
fn a_world_that_stops_moving_is_a_violation_not_a_hung_run() {
    let (_keep, never) = std::sync::mpsc::channel::<()>();
    let stopped = within(Duration::from_millis(200), move || never.recv());
    assert!(
        stopped.is_err_and(|why| why.starts_with("the world stopped moving")),
        "a world waiting for what never comes"
    );
    let panicked = within(Duration::from_secs(10), || panic!("refused to start"));
    assert_eq!(
        panicked.err().as_deref(),
        Some("the world panicked: refused to start")
    );
    assert_eq!(within(Duration::from_secs(10), || 7), Ok(7));
}

/// Runs the seeds on every core, each thread its share in rising order;
/// the lowest failing seed and its violations, or how many worlds drew
/// each class of fault and schedule. Worlds share nothing, so which thread
/// runs a seed changes nothing in it.
fn lowest_failure(
    seeds: std::ops::Range<u64>,
) -> Result<std::collections::BTreeMap<&'static str, u64>, (u64, Vec<String>)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let lowest = AtomicU64::new(u64::MAX);
    let failures = std::sync::Mutex::new(Vec::new());
    let drawn = std::sync::Mutex::new(std::collections::BTreeMap::new());
    std::thread::scope(|scope| {
        for first in 0..threads {
            let (seeds, lowest, failures, drawn) = (seeds.clone(), &lowest, &failures, &drawn);
            scope.spawn(move || {
                for seed in seeds.skip(first as usize).step_by(threads as usize) {
                    if seed > lowest.load(Ordering::Relaxed) {
                        return;
                    }
                    let ran = run_caught(Plan::draw(seed));
                    if ran.violations.is_empty() {
                        let mut drawn = drawn.lock().expect("not poisoned");
                        for class in ran.drawn {
                            *drawn.entry(class).or_insert(0) += 1;
                        }
                    } else {
                        lowest.fetch_min(seed, Ordering::Relaxed);
                        failures
                            .lock()
                            .expect("not poisoned")
                            .push((seed, ran.violations));
                        return;
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().expect("not poisoned");
    match failures.into_iter().min_by_key(|(seed, _)| *seed) {
        Some(failure) => Err(failure),
        None => Ok(drawn.into_inner().expect("not poisoned")),
    }
}

/// The classes of [`DRAWN`] fewer of `count` worlds drew than their share
/// asks, in words; each class's share printed.
fn undrawn(drawn: &std::collections::BTreeMap<&'static str, u64>, count: u64) -> Vec<String> {
    let mut short = Vec::new();
    for (class, floor) in DRAWN {
        let share = drawn.get(class).copied().unwrap_or(0) as f64 / count as f64;
        println!("simulation: {class}: {:.1} % of worlds", share * 100.0);
        if share < floor {
            short.push(format!(
                "{class} drawn in {:.1} % of the worlds, fewer than {:.0} %",
                share * 100.0,
                floor * 100.0
            ));
        }
    }
    short
}

#[test]
fn every_guarantee_holds_over_the_seed_budget() {
    let started = std::time::Instant::now();
    let (failure, count) = match runs() {
        Runs::Replay(plan) => (replay(*plan), 1),
        Runs::Budget(seeds) => {
            let count = seeds.end - seeds.start;
            let failure = match lowest_failure(seeds) {
                Err(failure) => Some(failure),
                // A budget too small to say (a long run's slice is not).
                Ok(_) if count < 1000 => None,
                Ok(drawn) => {
                    let short = undrawn(&drawn, count);
                    assert!(
                        short.is_empty(),
                        "the worlds no longer draw what they must:\n  {}",
                        short.join("\n  ")
                    );
                    None
                }
            };
            (failure, count)
        }
    };
    if let Some((seed, violations)) = failure {
        panic!(
            "seed {seed} broke a guarantee:\n  {}\nreplay it step by step: POSBRIDGE_SIM_SEED={seed} cargo test --lib sim -- --nocapture\nkeep its plan (docs/TESTING.md): POSBRIDGE_SIM_SEED={seed} POSBRIDGE_SIM_KEEP=src/services/pipeline/sim/kept/{seed}.json cargo test --lib sim -- --nocapture",
            violations.join("\n  ")
        );
    }
    println!(
        "simulation: {count} worlds in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Runs one world and prints its schedule step by step; its plan as it ran
/// written where `POSBRIDGE_SIM_KEEP` says, if it does. Its seed and the
/// guarantees it broke, if it broke one.
fn replay(plan: Plan) -> Option<(u64, Vec<String>)> {
    let seed = plan.seed;
    let ran = run_caught(plan);
    println!("{}", ran.steps.join("\n"));
    let keep = std::env::var("POSBRIDGE_SIM_KEEP").ok();
    if let (Some(path), Some(kept)) = (keep.filter(|path| !path.is_empty()), &ran.kept) {
        std::fs::write(&path, kept.to_kept() + "\n")
            .unwrap_or_else(|error| panic!("POSBRIDGE_SIM_KEEP={path}: {error}"));
        println!("simulation: the plan as it ran is kept in {path}");
    }
    (!ran.violations.is_empty()).then_some((seed, ran.violations))
}
