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

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use posbridge::services::pipeline::HEADER_DELIVERY_ID;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::support::schedule::{Redis, Serve};
use crate::support::{
    brokers, kafka_only, log_tail, mekari_order, read_topic, rr_sale, signed_request, unique,
};

/// Seeds the suite runs, and how many run at once: each takes 15-20 s in
/// a debug build, most of it waiting (process starts, leases lapsing).
const SEEDS: u64 = 6;
const AT_ONCE: usize = 3;

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

/// One delivery of the plan: event `index` of entity `entity`.
struct Event {
    id: String,
    provider: &'static str,
    entity: usize,
    index: usize,
    body: Vec<u8>,
}

/// A fault, as drawn.
#[derive(Debug, Clone)]
enum Fault {
    /// kill -9 of a process, started again `down` later.
    Kill { process: usize, down: Duration },
    /// A burst of the next deliveries sent to a process, which is killed
    /// `after` their sending, while it holds their leases; each is sent to
    /// the other process at once, and the killed one started again.
    LeaseOutlives {
        process: usize,
        burst: usize,
        after: Duration,
    },
    /// `SAVE` at delivery `snapshot`; Redis killed and started again from it.
    RedisRestart { snapshot: usize },
    /// The replica cut off at delivery `behind`; promoted, and posbridge's
    /// address moved to it.
    Failover { behind: usize },
    /// A process killed, Redis flushed, the process started again, and
    /// `FLUSHALL` again once the fill from the topics (which hold
    /// [`FILLER`] more records) wrote `share` of the filler's keys.
    FlushDuringFill { process: usize, share: f64 },
}

/// What the executor does at a point of the traffic.
#[derive(Debug, Clone)]
enum Action {
    Save,
    LeaveBehind,
    Fire(Fault),
}

/// A seed's plan: the deliveries, the attempts in order (an event and the
/// process it goes to), and the actions at points of the attempts.
struct Plan {
    events: Vec<Event>,
    sends: Vec<(usize, usize)>,
    actions: Vec<(usize, Action)>,
    faults: Vec<(usize, Fault)>,
}

impl Plan {
    fn draw(seed: u64, run: &str) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        let entities = rng.random_range(6..=10);
        let start = time::OffsetDateTime::now_utc() - time::Duration::minutes(10);
        let mut events = Vec::new();
        for entity in 0..entities {
            for index in 0..rng.random_range(3..=7) {
                let id = format!("{run}-e{entity}-{index}");
                let at = (start + time::Duration::seconds(index as i64))
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap();
                let (provider, body) = if entity % 2 == 0 {
                    let sale = format!("T1|2026-12|{run}-{entity}");
                    let verb = if index == 0 {
                        "sale.created"
                    } else {
                        "sale.updated"
                    };
                    let total = 1100 + 11 * index as u64;
                    ("receiptroller", rr_sale(&id, verb, &at, &sale, total))
                } else {
                    let order = format!("ORD-{run}-{entity}");
                    let kitchen = ["new", "preparing", "ready", "served"][index % 4];
                    let mut body = mekari_order(&id, "order.updated", &at, &order, kitchen);
                    body["data"]["total"] = json!(50_000 + index);
                    ("mekari", body)
                };
                let body = serde_json::to_vec(&body).unwrap();
                events.push(Event {
                    id,
                    provider,
                    entity,
                    index,
                    body,
                });
            }
        }
        // Events of one entity mostly in order, neighbours swapped.
        let mut order: Vec<(f64, usize)> = (0..events.len())
            .map(|n| (events[n].index as f64 + rng.random_range(0.0..2.5), n))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut sends: Vec<(usize, usize)> = order
            .iter()
            .map(|(_, n)| (*n, rng.random_range(0..2)))
            .collect();
        // Duplicates: the same delivery again, soon after or at once, to
        // either process.
        for _ in 0..events.len() / 6 {
            let at = rng.random_range(0..sends.len());
            let again = (sends[at].0, rng.random_range(0..2));
            let to = (at + rng.random_range(0..6)).min(sends.len());
            sends.insert(to, again);
        }
        let mut faults = Vec::new();
        // Two or three faults, of kinds apart.
        let mut kinds = [0, 1, 2, 3, 4];
        kinds.shuffle(&mut rng);
        for kind in &kinds[..rng.random_range(2..=3)] {
            let at = rng.random_range(8..sends.len() - 4);
            let process = rng.random_range(0..2);
            let fault = match kind {
                0 => Fault::Kill {
                    process,
                    down: Duration::from_millis(rng.random_range(0..1500)),
                },
                1 => Fault::LeaseOutlives {
                    process,
                    burst: rng.random_range(2..=4),
                    after: Duration::from_millis(rng.random_range(0..40)),
                },
                3 => Fault::Failover {
                    behind: at - rng.random_range(3..=8),
                },
                4 => Fault::FlushDuringFill {
                    process,
                    share: rng.random_range(0.1..1.5),
                },
                _ => Fault::RedisRestart {
                    snapshot: at - rng.random_range(2..=8),
                },
            };
            faults.push((at, fault));
        }
        faults.sort_by_key(|(at, _)| *at);
        let mut actions: Vec<(usize, Action)> = Vec::new();
        for (at, fault) in &faults {
            match fault {
                Fault::RedisRestart { snapshot } => actions.push((*snapshot, Action::Save)),
                Fault::Failover { behind } => actions.push((*behind, Action::LeaveBehind)),
                _ => {}
            }
            actions.push((*at, Action::Fire(fault.clone())));
        }
        // Stable: an action drawn at the same point as its fault comes first.
        actions.sort_by_key(|(at, _)| *at);
        Plan {
            events,
            sends,
            actions,
            faults,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill { process, down } => write!(f, "kill -9 p{process} (down {down:?})"),
            Fault::LeaseOutlives {
                process,
                burst,
                after,
            } => write!(f, "kill -9 p{process} {after:?} into a burst of {burst}"),
            Fault::RedisRestart { snapshot } => {
                write!(f, "Redis restarted from its snapshot at #{snapshot}")
            }
            Fault::Failover { behind } => write!(f, "failover to a replica cut off at #{behind}"),
            Fault::FlushDuringFill { process, share } => write!(
                f,
                "FLUSHALL, p{process} restarted, FLUSHALL at {:.0}% of the fill",
                share * 100.0
            ),
        }
    }
}

/// An attempt's answer.
#[derive(Debug, Clone)]
enum Answer {
    /// The status, and the body's `status` field (`published`, …).
    Status(u16, String),
    /// Never sent: the connection was refused (the process was down).
    Refused,
    /// Sent, and no answer: cut by a kill, or past the providers' limit.
    Cut,
}

impl Answer {
    fn is_2xx(&self) -> bool {
        matches!(self, Answer::Status(status, _) if (200..300).contains(status))
    }

    /// Whether the delivery may have been written without a 2xx.
    fn in_doubt(&self) -> bool {
        match self {
            Answer::Status(..) => !self.is_2xx(),
            Answer::Refused => false,
            Answer::Cut => true,
        }
    }

    fn label(&self) -> String {
        match self {
            Answer::Status(status, what) if (200..300).contains(status) => what.clone(),
            Answer::Status(status, _) => status.to_string(),
            Answer::Refused => "refused".to_owned(),
            Answer::Cut => "cut".to_owned(),
        }
    }
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
            Action::Fire(Fault::RedisRestart { .. }) => {
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
            Action::Fire(Fault::Failover { .. }) => {
                if let Some(missed) = self.redis.lock().await.fail_over().await {
                    self.note(format!("the promoted replica missed {missed} bytes"));
                }
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

    let records: Vec<crate::support::Record> = ["sales", "orders"]
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

/// The simulation's guarantees, from the topics' `records` (in order per
/// topic) and the attempts' answers, in words.
fn violations(
    plan: &Plan,
    attempts: &[(usize, Answer)],
    records: &[crate::support::Record],
) -> Vec<String> {
    let by_id: HashMap<&str, usize> = (plan.events.iter().enumerate())
        .map(|(n, event)| (event.id.as_str(), n))
        .collect();
    let mut broken = Vec::new();
    let mut copies: HashMap<usize, usize> = HashMap::new();
    let mut by_entity: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for record in records {
        let id = record.headers.get(HEADER_DELIVERY_ID).map(String::as_str);
        if id.is_some_and(|id| id.starts_with("fill-")) {
            continue;
        }
        let Some(&n) = id.and_then(|id| by_id.get(id)) else {
            broken.push(format!("a record of no delivery of the plan: {id:?}"));
            continue;
        };
        *copies.entry(n).or_default() += 1;
        by_entity.entry(plan.events[n].entity).or_default().push(n);
    }
    // No key's versions going back in the topic's order.
    for written in by_entity.values() {
        for pair in written.windows(2) {
            let (before, after) = (&plan.events[pair[0]], &plan.events[pair[1]]);
            if after.index < before.index {
                broken.push(format!(
                    "{} (event {}) written after {} (event {}): an older state after a newer one",
                    after.id, after.index, before.id, before.index
                ));
            }
        }
    }
    for (n, event) in plan.events.iter().enumerate() {
        let answers: Vec<&Answer> = (attempts.iter())
            .filter(|(e, _)| *e == n)
            .map(|(_, answer)| answer)
            .collect();
        // Written at most once, once more per answer in doubt.
        let allowed = 1 + answers.iter().filter(|a| a.in_doubt()).count();
        let written = copies.get(&n).copied().unwrap_or(0);
        if written > allowed {
            broken.push(format!(
                "{} written {written} times, {} time(s) in doubt ({:?})",
                event.id,
                allowed - 1,
                answers.iter().map(|a| a.label()).collect::<Vec<_>>()
            ));
        }
        // What a 2xx promised is in the topic: its own record for
        // `published`, else a state of its key at least as new.
        let newest = (by_entity.get(&event.entity).into_iter().flatten())
            .map(|m| plan.events[*m].index)
            .max();
        for answer in answers.iter().filter(|a| a.is_2xx()) {
            let kept = match answer.label().as_str() {
                "published" => written > 0,
                _ => newest.is_some_and(|newest| newest >= event.index),
            };
            if !kept {
                broken.push(format!(
                    "{} (event {}) answered {}, and the topic's newest state of its key is event {newest:?}",
                    event.id,
                    event.index,
                    answer.label()
                ));
            }
        }
    }
    // The last record of each key is its newest state.
    for (entity, written) in &by_entity {
        let last = written.last().map(|n| plan.events[*n].index);
        let newest = plan
            .events
            .iter()
            .filter(|e| e.entity == *entity)
            .map(|e| e.index)
            .max();
        if last != newest {
            broken.push(format!(
                "entity {entity}: the last record is event {last:?}, its newest is {newest:?}"
            ));
        }
    }
    broken
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
