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
//! have behind its `Produce` seam; a paused current-thread runtime needs
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
//! **Running it.** `cargo test --lib sim` runs [`SEEDS`] seeds (or
//! `POSBRIDGE_SIM_SEEDS`); `POSBRIDGE_SIM_SEED=N cargo test --lib sim --
//! --nocapture` replays seed `N` alone and prints its schedule step by
//! step; `scripts/simulate --seeds N` is the long run.

use std::time::Duration;

mod api;
mod check;
mod clock;
mod crash;
mod disk;
mod disk_plan;
mod ended;
mod hooks;
mod partitions;
mod process;
mod providers;
mod shared;
mod source;
mod world;

pub(super) use hooks::between_ack_and_commit;
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

/// The seeds to run: one to replay, or a budget from 0.
fn seeds() -> (std::ops::Range<u64>, bool) {
    if let Some(seed) = std::env::var("POSBRIDGE_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return (seed..seed + 1, true);
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
    (first..first + budget, false)
}

/// A world that kept every guarantee: its schedule, and the classes of
/// fault and schedule it drew.
pub(super) struct Ran {
    steps: Vec<String>,
    drawn: std::collections::BTreeSet<&'static str>,
}

/// Runs one seed's world to its end and checks it; the violations, with
/// the schedule that led to them.
pub(super) fn run(seed: u64) -> Result<Ran, (Vec<String>, Vec<String>)> {
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
    let ended = World::new(seed).run(dir.path());
    let violations = check::violations(&ended);
    if violations.is_empty() {
        Ok(Ran {
            steps: ended.steps,
            drawn: ended.drawn,
        })
    } else {
        Err((violations, ended.steps))
    }
}

/// Runs `seed`, a panic in its world (the core refused to start, say)
/// counted as a violation that names the seed too, and so is a world that
/// stops moving ([`WORLD_LIMIT`]).
fn run_caught(seed: u64) -> Result<Ran, (Vec<String>, Vec<String>)> {
    within(WORLD_LIMIT, move || run(seed)).unwrap_or_else(|why| Err((vec![why], Vec::new())))
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
                    match run_caught(seed) {
                        Ok(ran) => {
                            let mut drawn = drawn.lock().expect("not poisoned");
                            for class in ran.drawn {
                                *drawn.entry(class).or_insert(0) += 1;
                            }
                        }
                        Err((violations, _)) => {
                            lowest.fetch_min(seed, Ordering::Relaxed);
                            failures
                                .lock()
                                .expect("not poisoned")
                                .push((seed, violations));
                            return;
                        }
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
    let (seeds, replay) = seeds();
    let started = std::time::Instant::now();
    let count = seeds.end - seeds.start;
    let failure = if replay {
        let ran = run_caught(seeds.start);
        match &ran {
            Ok(ran) => println!("{}", ran.steps.join("\n")),
            Err((_, steps)) => println!("{}", steps.join("\n")),
        }
        ran.err().map(|(violations, _)| (seeds.start, violations))
    } else {
        match lowest_failure(seeds) {
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
        }
    };
    if let Some((seed, violations)) = failure {
        panic!(
            "seed {seed} broke a guarantee:\n  {}\nreplay it step by step: POSBRIDGE_SIM_SEED={seed} cargo test --lib sim -- --nocapture",
            violations.join("\n  ")
        );
    }
    println!(
        "simulation: {count} seeds in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Replays `seed`, failing with its violations and its schedule; under the
/// same watchdog as the budget's worlds, so a kept seed whose world stops
/// moving fails by name instead of hanging the run. Its schedule.
fn replays_green(seed: u64) -> Vec<String> {
    match run_caught(seed) {
        Ok(ran) => ran.steps,
        Err((violations, steps)) => panic!("{}\n{}", violations.join("\n"), steps.join("\n")),
    }
}

/// Found by the simulation: a record whose acknowledgement was lost (in
/// the topic, unknown to the ledger) let an older event of its key pass the
/// guard and land after it. The state is now kept in doubt. Seed 61 of this
/// world is the first the old behaviour fails (a change to what a world
/// draws renumbers its seeds: it was seed 10, then 6, then 7, then 23; this
/// one is found again by putting the old behaviour back, docs/TESTING.md).
#[test]
fn seed_61_an_older_event_does_not_land_after_a_record_in_doubt() {
    replays_green(61);
}

/// Found by the long run: a restart onto a replaced broker during a window
/// of failing ledger writes; the rebuild's write of the forgotten ledger
/// failed, redb took no write after that I/O error, and nothing reopened
/// the file (only a failed checkpoint did, and a checkpoint with nothing
/// to write cleared the failure), so the gate never opened: every
/// delivery refused for good. The ledger's writes now reopen the file
/// first after any failed one, the rebuild's among them.
#[test]
fn seed_8035_a_rebuild_whose_write_failed_reopens_the_ledger_and_fills_it() {
    replays_green(8035);
}

/// Found by the simulation: the salvage of a damaged spool file dropped a
/// frame that failed its checksum and only logged it, so a spooled delivery
/// was lost with no count and no alert. Every damaged frame it finds now
/// goes to the quarantine. Seed 455 of this world is the first the old
/// behaviour fails (it was seed 215 of the trial world that found it, then
/// 619 before the simulated disk).
#[test]
fn seed_455_a_damaged_spooled_delivery_is_quarantined_not_lost_silently() {
    replays_green(455);
}

/// Found by the long run: changed bytes that ran from the end of one
/// spooled entry over the next one's frame header left one damaged run
/// holding both, which the salvage quarantined (and counted) as one: two
/// deliveries lost, one counted. Each entry header found in a damaged run
/// is now kept and counted on its own.
#[test]
fn seed_3421_a_damaged_run_over_two_spooled_entries_counts_both() {
    replays_green(3421);
}

/// Found by the long run: changed bytes took a spooled entry's whole frame
/// header, so the salvage's scan, which starts at each frame's magic, never
/// saw it: a delivery lost with nothing counted. The salvage now finds
/// entry headers outside every frame and quarantines each.
#[test]
fn seed_17265_an_entry_whose_frame_header_is_gone_is_counted() {
    replays_green(17265);
}

/// Found when the drainer's paused passes began to back off: a valid
/// spooled delivery went to the dead-letter topic after half a minute of
/// retryable broker faults (five failed passes "while Kafka answered").
/// Only a failure that may be the entry's own counts toward setting it
/// aside now; a slow, unreachable or short-of-replicas broker does not.
#[test]
fn seed_668_a_valid_spooled_delivery_is_not_set_aside_for_a_flaky_broker() {
    replays_green(668);
}

/// Found by the long run, a check too strict: a delivery spooled while one
/// broker was the one, answered `duplicate` (it waits in the spool) after
/// that broker was replaced, is drained into the new one. The check now
/// carries what was spooled from one broker's era into the next.
#[test]
fn seed_60199_a_delivery_spooled_before_a_broker_was_replaced_is_drained_into_the_new_one() {
    replays_green(60199);
}

/// Found by the simulated disk: one failed spool write left the spool
/// unwritable for the rest of the world, its drained entries never
/// removed: the heal's wait was counted on the system's clock, which the
/// world's does not move. It is counted on tokio's now, as the core's other
/// retries (seen failing without it).
#[test]
fn seed_1635_a_spool_whose_write_failed_heals_on_the_worlds_clock() {
    replays_green(1635);
}

/// Found when the disk came, a world too strict: the last life took no
/// periodic checkpoints, so a reopen of the ledger that failed in a window
/// of failing writes was never tried again and the ledger stayed closed;
/// the service's checkpoint thread tries it again at its next interval.
/// The last life now checkpoints while the disk fails and a minute after.
#[test]
fn seed_699_a_failed_reopen_of_the_ledger_is_tried_again() {
    replays_green(699);
}

/// Found by the long run once sends could time out without landing: a
/// reconciled record left in doubt held a webhook's older event back as
/// `stale`, and the world ended before the reconciler's next run, which
/// replaces such a record. A world with a reconciler now lets one whole run
/// follow its faults; the promise a `stale` answer against a reconciled
/// record in doubt rests on is that run.
#[test]
fn seed_2321_a_reconciled_record_in_doubt_is_replaced_by_the_next_run() {
    replays_green(2321);
}

/// Found by the long run, a check too strict: a delivery answered `stale`
/// against a newer state in doubt (sent, never taken), then the ledger lost
/// at a crash, is not remembered (it wrote nothing) and its duplicate is
/// decided again against what the topic holds, where that newer state never
/// landed: it writes its own state, once, before the newer one's retry. The
/// check now allows that write after a lost ledger.
#[test]
fn seed_15879_a_stale_delivery_decided_again_after_a_lost_ledger_may_write_its_state() {
    replays_green(15879);
}

/// Found by the long run on the simulated disk: a spool append whose
/// commit failed at its last sync (`d-1` answered 503) left an entry the
/// heal's reopen read, and `d-1`'s retry was answered `duplicate` on it,
/// though nothing said it was durable; the drainer published it after. A
/// failed append's entry is now in doubt until the heal takes it out, and
/// the retry is spooled anew.
#[test]
fn seed_13924_a_retry_of_a_failed_spool_append_is_spooled_not_a_duplicate() {
    let steps = replays_green(13924);
    let failed = steps
        .iter()
        .position(|step| step.contains("d-1 → retry (spool: spool storage"));
    let spooled = steps
        .iter()
        .rposition(|step| step.contains("d-1 → spooled"));
    assert!(
        failed
            .zip(spooled)
            .is_some_and(|(failed, spooled)| failed < spooled),
        "the world no longer reaches the case (d-1's append failing, then its retry spooled): put the old behaviour back to find the seed again (docs/TESTING.md)\n{}",
        steps.join("\n")
    );
}

/// Seed 72901 (the long run, this stop): with Kafka back, the drainer's
/// removal of the entries it had published failed (an I/O error of the
/// spool's disk) yet landed; the heal reopened the file, which no longer
/// held them, while the counts still did: the drainer looked for five
/// entries it never found, and the spool "held" them an hour later. A heal
/// now takes its counts from the file.
#[test]
fn seed_72901_a_removal_that_failed_but_landed_leaves_the_counts_right() {
    let steps = replays_green(72901);
    let time =
        |step: &str| -> Option<f64> { step.strip_prefix("t=")?.split('s').next()?.parse().ok() };
    let outage_end = steps.iter().find_map(|step| {
        let (_, end) = step
            .split_once("broker outage from ")?
            .1
            .split_once(" to ")?;
        end.trim_end_matches('s').parse::<f64>().ok()
    });
    let failed_after = outage_end.is_some_and(|end| {
        steps.iter().any(|step| {
            step.contains("an op of spool.redb fails") && time(step).is_some_and(|at| at > end)
        })
    });
    assert!(
        failed_after,
        "the world no longer reaches the case (a spool write failing once Kafka is back, while the drainer removes what it published): put the old behaviour back to find the seed again (docs/TESTING.md)\n{}",
        steps.join("\n")
    );
}

/// A sale spooled while `pos.sales` was refused for the partitions it
/// grew while posbridge was stopped is set aside to the dead-letter topic
/// after five drain passes (raw, `spool_unpublishable`, for `posbridge
/// replay`): the entries behind it drain. The simulation first read it as
/// lost; a helper's fix that kept such entries waiting instead let a
/// refused topic's entries hold the whole spool once a batch of them led it.
#[test]
fn seed_92_a_delivery_spooled_while_its_topic_is_refused_as_grown_is_set_aside() {
    let steps = replays_green(92);
    assert!(
        steps.iter().any(|step| step.contains("pos.sales grows")),
        "the world no longer grows a topic: put the old behaviour back to find the seed again (docs/TESTING.md)\n{}",
        steps.join("\n")
    );
}
