//! The Redis ledger under seeded faults, on real servers (issue 50, item 7):
//! per seed, a Redis master with a replica, two `posbridge serve` processes
//! sharing it as their ledger, and the suite's Apache Kafka. A driver sends
//! signed deliveries of both providers (events of one entity out of order,
//! duplicates, retries of the same delivery id) to either process while the
//! seed's fault plan fires: kill -9 of a process, Redis killed and started
//! again from its last snapshot, a failover to a replica left behind,
//! `FLUSHALL` while a restarted process fills its ledger, a lease outliving
//! the process killed in the middle of its deliveries. Then the faults end,
//! every delivery not yet answered 2xx is retried until it is (as providers
//! do), and the simulation's guarantees (`src/services/pipeline/sim/check.rs`)
//! are checked from the topics.
//!
//! A seed decides the plan: the deliveries, their order, which process each
//! attempt goes to, the faults and the points of the traffic where they
//! fire. The servers' timing is real, so a seed replays its plan, not every
//! interleaving. `POSBRIDGE_REDIS_SCHEDULES=N` runs seeds `0..N` (default
//! [`SEEDS`]), `POSBRIDGE_REDIS_SCHEDULE=N` replays seed `N` alone.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use serde_json::Value;
use tokio::sync::watch;

use crate::support::schedule::{Redis, Serve};
use crate::support::schedule_plan::{Action, Answer, Fault, Plan, violations};
use crate::support::{Record, brokers, kafka_only, log_tail, read_topic, signed_request, unique};

/// Seeds the suite runs (two dozen: 24 in 135 s on two cores, four at
/// once), and how many run at once: each takes 15-20 s in a debug build,
/// most of it waiting (process starts, leases lapsing).
const SEEDS: u64 = 24;
const AT_ONCE: usize = 4;

/// Senders at once, and the pause of each between its deliveries (a pace:
/// the traffic lasts while the faults fire).
const SENDERS: usize = 4;
const PACE: Duration = Duration::from_millis(60);

/// Records written into the orders topic when a schedule flushes Redis
/// during a fill, so that the fill takes long enough to be met: a batch of
/// the fill writes them at 512 at once.
const FILLER: usize = 4_000;

/// The providers give up on an answer after this long.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// How long, once the faults ended, every delivery must take to be
/// answered 2xx: leases of killed processes lapse (7 s) and fills end.
const SETTLE: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_the_redis_ledger_keeps_the_guarantees_under_seeded_faults() {
    kafka_only(
        "tansu compacts the shared topics every 5 s: a record gone could not be told from one lost",
    );
    let seeds = seeds();
    let count = seeds.len();
    // Seeds at once on this task (their futures are not `Send`): each
    // mostly waits on its servers.
    let ended: Vec<(u64, std::thread::Result<()>)> = futures::stream::iter(seeds)
        .map(|seed| async move {
            eprintln!("redis_schedules: seed {seed} (replay: {})", replay(seed));
            let ran = std::panic::AssertUnwindSafe(run(seed)).catch_unwind().await;
            (seed, ran)
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let failed: BTreeMap<u64, String> = ended
        .into_iter()
        .filter_map(|(seed, ended)| Some((seed, panic_message(ended.err()?))))
        .collect();
    if let Some((seed, message)) = failed.first_key_value() {
        panic!(
            "{} of {count} seeds failed ({:?}); the lowest, {seed}:\n{message}",
            failed.len(),
            failed.keys().collect::<Vec<_>>()
        );
    }
}

/// What a seed panicked with.
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

fn seeds() -> Vec<u64> {
    let number = |name: &str| {
        std::env::var(name).ok().map(|text| {
            text.parse::<u64>()
                .unwrap_or_else(|_| panic!("{name}={text} is not a number"))
        })
    };
    if let Some(seed) = number("POSBRIDGE_REDIS_SCHEDULE") {
        return vec![seed];
    }
    let count = number("POSBRIDGE_REDIS_SCHEDULES").unwrap_or(SEEDS);
    assert!(
        count > 0,
        "POSBRIDGE_REDIS_SCHEDULES=0 runs nothing: it proves nothing"
    );
    (0..count).collect()
}

fn replay(seed: u64) -> String {
    format!("POSBRIDGE_REDIS_SCHEDULE={seed} scripts/test --test it -- redis_schedules --nocapture")
}

/// Every attempt so far: the event, and its answer.
type Attempts = Arc<Mutex<Vec<(usize, Answer)>>>;

/// The cast of one seed, and what its driver needs.
struct World {
    plan: Plan,
    redis: tokio::sync::Mutex<Redis>,
    processes: [tokio::sync::Mutex<Serve>; 2],
    bases: [String; 2],
    http: reqwest::Client,
    attempts: Attempts,
    /// Notes of what the faults found (bytes a replica missed, a fill
    /// running at a `FLUSHALL`).
    notes: Mutex<Vec<String>>,
}

impl World {
    /// Sends event `n` to process `to`, and records the answer.
    async fn send(&self, n: usize, to: usize) -> Answer {
        let event = &self.plan.events[n];
        let request = signed_request(
            &self.http,
            &self.bases[to],
            event.provider,
            "main",
            &event.id,
            event.body.clone(),
            None,
        );
        let answer = match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let json: Value = response.json().await.unwrap_or(Value::Null);
                let what = json["status"].as_str().unwrap_or("error").to_owned();
                Answer::Status(status, what)
            }
            Err(error) if error.is_connect() => Answer::Refused,
            Err(_) => Answer::Cut,
        };
        self.attempts.lock().unwrap().push((n, answer.clone()));
        answer
    }

    async fn restart(&self, process: usize) {
        let mut serve = self.processes[process].lock().await;
        serve.kill().await;
        serve.spawn();
        serve.wait_ready().await;
    }

    async fn act(&self, action: &Action, next: usize) {
        match action {
            Action::Save => {
                let saved = self.redis.lock().await.master.cli(&["SAVE"]).await;
                assert_eq!(saved.trim(), "OK", "SAVE");
            }
            Action::LeaveBehind => self.redis.lock().await.leave_replica_behind(),
            Action::Fire(Fault::Kill { process, down }) => {
                self.processes[*process].lock().await.kill().await;
                // A point on the outage's timeline: how long it stays down.
                tokio::time::sleep(*down).await;
                let mut serve = self.processes[*process].lock().await;
                serve.spawn();
                serve.wait_ready().await;
            }
            Action::Fire(Fault::LeaseOutlives {
                process,
                burst,
                after,
            }) => {
                let burst: Vec<usize> = (next..next + burst)
                    .filter_map(|at| self.plan.sends.get(at).map(|(n, _)| *n))
                    .collect();
                let sent = burst.iter().map(|n| self.send(*n, *process));
                let killed = async {
                    // A moment no answer announces: while the process holds
                    // the burst's leases.
                    tokio::time::sleep(*after).await;
                    self.processes[*process].lock().await.kill().await;
                };
                tokio::join!(futures::future::join_all(sent), killed);
                let other = 1 - process;
                let retries = burst.iter().map(|n| self.send(*n, other));
                futures::future::join_all(retries).await;
                self.restart(*process).await;
            }
            Action::Fire(Fault::RedisRestart { snapshot }) => {
                {
                    let mut redis = self.redis.lock().await;
                    let before = redis.master.cli(&["DBSIZE"]).await;
                    redis.master.kill_and_restart().await;
                    let after = redis.master.cli(&["DBSIZE"]).await;
                    self.note(format!(
                        "Redis restarted with {} of its {} keys",
                        after.trim(),
                        before.trim()
                    ));
                }
                self.resend(*snapshot..next).await;
            }
            Action::Fire(Fault::Failover { behind }) => {
                if let Some(missed) = self.redis.lock().await.fail_over().await {
                    self.note(format!("the promoted replica missed {missed} bytes"));
                }
                self.resend(*behind..next).await;
            }
            Action::Fire(Fault::FlushDuringFill { process, share }) => {
                let mut serve = self.processes[*process].lock().await;
                serve.kill().await;
                let port = self.redis.lock().await.master.port;
                let mut redis = redis::Client::open(format!("redis://127.0.0.1:{port}"))
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap();
                let () = redis::cmd("FLUSHALL")
                    .query_async(&mut redis)
                    .await
                    .unwrap();
                serve.spawn();
                let keys = (*share * FILLER as f64) as usize;
                let met = fill_reaches(&mut redis, keys).await;
                let () = redis::cmd("FLUSHALL")
                    .query_async(&mut redis)
                    .await
                    .unwrap();
                serve.wait_ready().await;
                drop(serve);
                let mut restarted = Vec::new();
                for serve in &self.processes {
                    let ready = serve.lock().await.readyz().await.unwrap_or_default();
                    restarted.push(ready["ledger_rebuild"]["restarted"].to_string());
                }
                self.note(format!(
                    "the second FLUSHALL at {met} keys, fills restarted {restarted:?}"
                ));
            }
        }
    }

    /// The providers' retries of what they sent while Redis took the
    /// writes it lost, at once, each to the other process than before: a
    /// ledger that did not notice would publish them again.
    async fn resend(&self, lost: std::ops::Range<usize>) {
        let sent = &self.plan.sends[lost];
        let retries = sent.iter().map(|(n, to)| self.send(*n, 1 - to));
        futures::future::join_all(retries).await;
    }

    fn note(&self, note: String) {
        self.notes.lock().unwrap().push(note);
    }

    /// The plan's attempts by [`SENDERS`] at their pace, each action fired
    /// once the attempts before its point were sent, and the attempts after
    /// it held until it began.
    async fn drive(self: &Arc<World>) {
        let (dispatched, dispatching) = watch::channel(0usize);
        let (begun, beginning) = watch::channel(0usize);
        let next = Arc::new(Mutex::new(0usize));
        let mut senders = tokio::task::JoinSet::new();
        for _ in 0..SENDERS {
            let (world, next, dispatched) = (self.clone(), next.clone(), dispatched.clone());
            let mut beginning = beginning.clone();
            senders.spawn(async move {
                loop {
                    let at = {
                        let mut next = next.lock().unwrap();
                        *next += 1;
                        *next - 1
                    };
                    let Some(&(n, to)) = world.plan.sends.get(at) else {
                        break;
                    };
                    let before = world.plan.actions.iter().filter(|(p, _)| *p <= at).count();
                    let _ = beginning.wait_for(|begun| *begun >= before).await;
                    dispatched.send_modify(|sent| *sent = (*sent).max(at + 1));
                    world.send(n, to).await;
                    tokio::time::sleep(PACE).await;
                }
            });
        }
        for (point, action) in &self.plan.actions {
            let mut dispatching = dispatching.clone();
            let _ = dispatching.wait_for(|sent| *sent >= *point).await;
            begun.send_modify(|begun| *begun += 1);
            self.act(action, *point).await;
        }
        while let Some(sender) = senders.join_next().await {
            sender.unwrap();
        }
    }

    /// Once the faults ended: every delivery not yet answered 2xx is sent
    /// again, to either process in turn, until each is.
    async fn settle(&self) {
        for process in &self.processes {
            process.lock().await.wait_ready().await;
        }
        let deadline = Instant::now() + SETTLE;
        for round in 0.. {
            let pending: Vec<usize> = {
                let attempts = self.attempts.lock().unwrap();
                (0..self.plan.events.len())
                    .filter(|n| !attempts.iter().any(|(e, a)| e == n && a.is_2xx()))
                    .collect()
            };
            if pending.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} deliveries still not answered 2xx {SETTLE:?} after the faults ended: {:?}",
                pending.len(),
                self.last_answers(&pending)
            );
            let sends = pending.iter().map(|n| self.send(*n, (n + round) % 2));
            futures::future::join_all(sends).await;
            // A pace: a provider's retry interval.
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn last_answers(&self, events: &[usize]) -> Vec<(String, String)> {
        let attempts = self.attempts.lock().unwrap();
        events
            .iter()
            .take(5)
            .map(|n| {
                let last = attempts.iter().rev().find(|(e, _)| e == n);
                (
                    self.plan.events[*n].id.clone(),
                    last.map_or("none".to_owned(), |(_, a)| a.label()),
                )
            })
            .collect()
    }
}

/// Waits until Redis holds `keys` keys: the fill under way wrote that far.
/// How many it held then. Polled in a loop of round trips, not every 100 ms
/// (`wait_until`): a fill writes the filler in a fraction of a second.
async fn fill_reaches(redis: &mut redis::aio::MultiplexedConnection, keys: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held: usize = redis::cmd("DBSIZE").query_async(redis).await.unwrap();
        if held >= keys || Instant::now() > deadline {
            return held;
        }
    }
}

/// One seed: its cast started, its plan driven, its guarantees checked.
async fn run(seed: u64) {
    let started = Instant::now();
    let run = unique(&format!("sched{seed}"));
    let plan = Plan::draw(seed, &run);
    let work = tempfile::tempdir().unwrap();
    let redis = Redis::start().await;
    let mut processes = [0, 1].map(|n| {
        Serve::new(
            &format!("p{n}"),
            work.path(),
            &brokers(),
            &redis.url(),
            &run,
        )
    });
    // The first creates the topics; the second finds them.
    for process in &mut processes {
        process.spawn();
        process.wait_ready().await;
    }
    let flushes = (plan.faults.iter()).any(|(_, f)| matches!(f, Fault::FlushDuringFill { .. }));
    if flushes {
        crate::redis_lost_writes::write_orders(&format!("{run}.orders"), FILLER).await;
    }
    let world = Arc::new(World {
        bases: [processes[0].base(), processes[1].base()],
        plan,
        redis: tokio::sync::Mutex::new(redis),
        processes: processes.map(tokio::sync::Mutex::new),
        http: reqwest::Client::builder()
            .timeout(ANSWER_LIMIT)
            .pool_idle_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
        attempts: Arc::default(),
        notes: Mutex::default(),
    });
    world.drive().await;
    world.settle().await;

    let records: Vec<Record> = ["sales", "orders"]
        .iter()
        .flat_map(|plural| read_topic(&brokers(), &format!("{run}.{plural}")))
        .collect();
    let broken = violations(&world.plan, &world.attempts.lock().unwrap(), &records);
    let summary = summary(seed, &world, started.elapsed());
    eprintln!("{summary}");
    if !broken.is_empty() {
        let mut logs = String::new();
        for process in &world.processes {
            let process = process.lock().await;
            logs += &format!("{}:\n{}\n", process.name, log_tail(&process.log));
        }
        panic!(
            "seed {seed} broke {} guarantee(s):\n  {}\n{summary}\nreplay: {}\n{logs}",
            broken.len(),
            broken.join("\n  "),
            replay(seed)
        );
    }
}

/// One line: the faults drawn, the deliveries, the answers by kind.
fn summary(seed: u64, world: &World, took: Duration) -> String {
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let attempts = world.attempts.lock().unwrap();
    for (_, answer) in attempts.iter() {
        *answers.entry(answer.label()).or_default() += 1;
    }
    let faults: Vec<String> = (world.plan.faults.iter())
        .map(|(at, fault)| format!("#{at} {fault}"))
        .collect();
    format!(
        "redis_schedules: seed {seed}: {}; {} deliveries, {} attempts: {answers:?}; {took:.1?}{}",
        faults.join(", "),
        world.plan.events.len(),
        attempts.len(),
        (world.notes.lock().unwrap().iter())
            .map(|note| format!("; {note}"))
            .collect::<String>()
    )
}

/// The seeds the suite runs draw every kind of fault: a change to the plan
/// that stops drawing one fails here instead of leaving the suite blind
/// to it. No server: the plans alone.
#[test]
fn the_suites_seeds_draw_every_kind_of_fault() {
    let mut drawn: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for seed in 0..SEEDS {
        for (_, fault) in Plan::draw(seed, "plan").faults {
            let kind = match fault {
                Fault::Kill { .. } => "kill -9",
                Fault::LeaseOutlives { .. } => "a lease outliving its process",
                Fault::RedisRestart { .. } => "Redis restarted from its snapshot",
                Fault::Failover { .. } => "a failover to a replica left behind",
                Fault::FlushDuringFill { .. } => "FLUSHALL during a fill",
            };
            drawn.entry(kind).or_default().push(seed);
        }
    }
    eprintln!("{drawn:?}");
    assert_eq!(drawn.len(), 5, "seeds 0..{SEEDS} draw only {drawn:?}");
}
