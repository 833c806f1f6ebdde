//! A world's plan: everything its seed draws before the world runs, and
//! the broker's answer to each send as the world ran, as data.
//!
//! A schedule the simulation found is kept as its plan (`kept/`), not as
//! its seed: a change to what a world draws renumbers the seeds, so a kept
//! seed would quietly stop reaching its case, while a kept plan replays the
//! same events, attempts, crashes, disk faults, partitions and broker
//! answers whatever the world draws now. A plan drawn from a seed and the
//! plan kept from that seed's run replay the same world step for step.
//!
//! What stays drawn from the plan's seeds, not kept: the pauses between an
//! acknowledgement and its commit, the bytes damage changes in a file, how
//! long each disk op takes and where an unsynced write tears, and the
//! broker's answers to sends the plan holds none for (a replay whose core
//! now sends more than the run that kept it): those are drawn by the rule
//! the world draws them by.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::error::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

use super::crash::{Crash, crashes};
use super::disk_plan::{DiskPlan, plan as disk_plan};
use super::partitions::Partitions;
use crate::adapters::publish::Fault;
use crate::domain::event::ProviderKind;

/// Mixed into the seed for the states' draws.
const STATES_SEED: u64 = 0x57a7_e5ee_d000_0001;

/// Mixed into the seed for the disk's draws.
const DISK_SEED: u64 = 0xd15c_5eed_0000_0001;

/// Mixed into the seed for the topics' partitions.
const PARTITIONS_SEED: u64 = 0x9a27_5eed_0000_0001;

/// One world, as data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Plan {
    /// The seed it was drawn from (said in its steps).
    pub(super) seed: u64,
    /// The broker's fault window: from, to.
    pub(super) faults: (Duration, Duration),
    /// Every send in the fault window fails (retryably).
    pub(super) outage: bool,
    /// ReceiptRoller's source spools.
    pub(super) spools: bool,
    pub(super) crashes: Vec<Crash>,
    /// `ledger.checkpoint_interval_ms`: how much memory a crash may lose.
    pub(super) checkpoint_every: Duration,
    /// How often the reconciler runs, in worlds where it does.
    pub(super) reconcile_every: Option<Duration>,
    pub(super) disk: DiskPlan,
    /// Seeds the disk's op times and where its writes tear.
    pub(super) disk_seed: u64,
    pub(super) partitions: Partitions,
    /// Every event, in the order drawn.
    pub(super) events: Vec<Planned>,
    pub(super) broker: Broker,
    /// Seeds each life's draws (its commit pauses, the damage at its end).
    pub(super) lives: Vec<u64>,
}

/// One event of one entity, and how its provider sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Planned {
    pub(super) delivery: String,
    pub(super) provider: ProviderKind,
    pub(super) entity: usize,
    /// Its place among its entity's events: a higher one is newer.
    pub(super) index: usize,
    /// The state it brings (its amounts): mostly its index, sometimes an
    /// earlier event's again.
    pub(super) state: usize,
    /// Its data is no entity: a dead letter.
    pub(super) broken: bool,
    /// When its first attempt comes, from the world's start.
    pub(super) first: Duration,
    /// Each copy its provider sends (a second is a duplicate).
    pub(super) copies: Vec<Copy>,
}

/// One copy of a delivery as its provider sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Copy {
    /// After the delivery's first attempt.
    pub(super) offset: Duration,
    /// Added to each retry's wait, in ms.
    pub(super) jitter: Vec<u64>,
}

/// What the broker answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Broker {
    /// Seeds its answers to the sends it holds none for.
    pub(super) seed: u64,
    /// Its answer to each send, by delivery and topic (`d-3 pos.sales`),
    /// in the order the sends came.
    pub(super) answers: BTreeMap<String, Vec<Reply>>,
    /// Whether the log took each send a crash cut, by life, delivery and
    /// topic (`1 d-3 pos.sales`), in the order the crash met them.
    pub(super) cut_taken: BTreeMap<String, Vec<bool>>,
}

/// The broker's answer to one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Reply {
    Take,
    /// Acknowledged after this many ms (in the log at once).
    Late(u64),
    /// In the log, its acknowledgement lost.
    LoseAck,
    /// Never in the log, reported timed out.
    NeverTaken,
    NotEnoughReplicas,
    RequestTimedOut,
    NetworkException,
    LeaderNotAvailable,
}

/// Broker errors a send may meet that a later attempt may not: never a
/// refusal for good (that is a dead letter, a decision of its own).
pub(super) const RETRYABLE: [Reply; 4] = [
    Reply::NotEnoughReplicas,
    Reply::RequestTimedOut,
    Reply::NetworkException,
    Reply::LeaderNotAvailable,
];

impl Reply {
    /// What the fake broker does for it.
    pub(super) fn fault(self) -> Fault {
        match self {
            Reply::Take => Fault::Take,
            Reply::Late(ms) => Fault::Late(Duration::from_millis(ms)),
            Reply::LoseAck => Fault::LoseAck,
            // A send the broker never took, reported timed out as a lost
            // acknowledgement is: in doubt, not in the log.
            Reply::NeverTaken => Fault::Fail(RDKafkaErrorCode::MessageTimedOut),
            Reply::NotEnoughReplicas => Fault::Fail(RDKafkaErrorCode::NotEnoughReplicas),
            Reply::RequestTimedOut => Fault::Fail(RDKafkaErrorCode::RequestTimedOut),
            Reply::NetworkException => Fault::Fail(RDKafkaErrorCode::NetworkException),
            Reply::LeaderNotAvailable => Fault::Fail(RDKafkaErrorCode::LeaderNotAvailable),
        }
    }

    /// The class of fault it is ([`super::DRAWN`]), if it is one.
    pub(super) fn class(self) -> Option<&'static str> {
        match self {
            Reply::Take => None,
            Reply::Late(_) => Some("late acknowledgement"),
            Reply::LoseAck => Some("acknowledgement lost"),
            Reply::NeverTaken => Some("send never taken"),
            _ => Some("retryable failure"),
        }
    }
}

impl Plan {
    /// The world of `seed`, drawn in the order worlds drew it before they
    /// were plans (so a seed is the world it was).
    pub(super) fn draw(seed: u64) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed);
        // Some worlds send everything within a second or two, so that
        // deliveries, acknowledgements and checkpoints overlap.
        let spread = rng.random_range(1_000..60_000);
        // In some worlds the faults are an outage while deliveries arrive:
        // every send fails while it lasts, so the spool holds entries and
        // crashes meet them there.
        let outage = rng.random_bool(0.25);
        let (start, length) = if outage {
            (rng.random_range(0..spread), rng.random_range(2_000..90_000))
        } else {
            (rng.random_range(0..120_000), rng.random_range(0..900_000))
        };
        let (start, length) = (Duration::from_millis(start), Duration::from_millis(length));
        let spools = rng.random_bool(0.5);
        let crashes = crashes(&mut rng, spread, outage.then_some(start));
        let checkpoint_every =
            Duration::from_millis([250, 1_000, 1_000, 5_000][rng.random_range(0..4)]);
        let reconcile_every = rng
            .random_bool(0.5)
            .then(|| Duration::from_millis(rng.random_range(5_000..120_000)));
        let mut disk_rng = StdRng::seed_from_u64(seed ^ DISK_SEED);
        let disk = disk_plan(
            &mut disk_rng,
            crashes.len(),
            spools,
            outage.then_some((start, start + length)),
            spread,
        );
        let partitions =
            Partitions::draw(&mut StdRng::seed_from_u64(seed ^ PARTITIONS_SEED), &crashes);
        let broker = Broker {
            seed: rng.random(),
            ..Broker::default()
        };
        let mut events = draw_events(&mut rng, &mut StdRng::seed_from_u64(seed ^ STATES_SEED));
        draw_sends(&mut rng, &mut events, spread);
        Plan {
            seed,
            faults: (start, start + length),
            outage,
            spools,
            lives: (0..=crashes.len()).map(|_| rng.random()).collect(),
            crashes,
            checkpoint_every,
            reconcile_every,
            disk_seed: disk_rng.random(),
            disk,
            partitions,
            events,
            broker,
        }
    }

    /// The plan `kept` as JSON (`kept/`).
    pub(super) fn read(kept: &str) -> Plan {
        serde_json::from_str(kept).unwrap_or_else(|error| panic!("a kept plan reads: {error}"))
    }

    /// The plan as it is kept: JSON, a field, an event or a send's answers
    /// to a line.
    pub(super) fn to_kept(&self) -> String {
        let plan = serde_json::to_value(self).expect("a plan serializes");
        let mut kept = String::new();
        spread_out(&plan, "", 2, &mut kept);
        kept
    }
}

/// `value` as JSON into `out`, its objects' fields and its arrays' items a
/// line each down to `depth` levels (the broker's answers a level more),
/// each line indented after `indent`.
fn spread_out(value: &serde_json::Value, indent: &str, depth: usize, out: &mut String) {
    use serde_json::Value;
    let inner = format!("{indent}  ");
    let compact = |value: &Value| serde_json::to_string(value).expect("JSON serializes");
    match value {
        Value::Object(fields) if depth > 0 && !fields.is_empty() => {
            out.push_str("{\n");
            for (at, (name, value)) in fields.iter().enumerate() {
                out.push_str(&format!(
                    "{inner}{}: ",
                    compact(&Value::from(name.as_str()))
                ));
                let deeper = if name == "broker" { depth } else { depth - 1 };
                spread_out(value, &inner, deeper, out);
                out.push_str(if at + 1 < fields.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{indent}}}"));
        }
        Value::Array(items) if depth > 0 && !items.is_empty() => {
            out.push_str("[\n");
            for (at, item) in items.iter().enumerate() {
                out.push_str(&inner);
                spread_out(item, &inner, depth - 1, out);
                out.push_str(if at + 1 < items.len() { ",\n" } else { "\n" });
            }
            out.push_str(&format!("{indent}]"));
        }
        _ => out.push_str(&compact(value)),
    }
}

/// A few entities of each provider, each with a few events of rising
/// versions; their states drawn from `states`, apart from `rng`, so that a
/// seed's schedule is the one it drew before states repeated.
fn draw_events(rng: &mut StdRng, states: &mut StdRng) -> Vec<Planned> {
    let mut events = Vec::new();
    let mut next = 0;
    for provider in ProviderKind::ALL {
        for entity in 0..rng.random_range(1..4) {
            let mut before = Vec::new();
            for index in 0..rng.random_range(1..5) {
                next += 1;
                let broken = rng.random_bool(0.1);
                let state = state_of(states, index, &before);
                before.push(state);
                events.push(Planned {
                    delivery: format!("d-{next}"),
                    provider,
                    entity,
                    index,
                    state,
                    broken,
                    first: Duration::ZERO,
                    copies: Vec::new(),
                });
            }
        }
    }
    events
}

/// The state event `index` of an entity brings, given the states of the
/// ones before: mostly a new one (its index), sometimes the last one again
/// (an update that changes nothing the state hash covers), or an earlier
/// one back (A → B → A); all delivered out of order like any.
fn state_of(states: &mut StdRng, index: usize, before: &[usize]) -> usize {
    match (before.last(), states.random_range(0..10)) {
        (Some(last), 0..2) => *last,
        (Some(_), 2..4) if before.len() >= 2 => before[states.random_range(0..before.len() - 1)],
        _ => index,
    }
}

/// Each delivery as its provider sends it, drawn in the order of the
/// deliveries' ids: a first attempt within `spread` ms, sometimes two
/// copies (a duplicate, at once or minutes later), and a jitter on each
/// retry's wait.
fn draw_sends(rng: &mut StdRng, events: &mut [Planned], spread: u64) {
    let mut by_id: Vec<&mut Planned> = events.iter_mut().collect();
    by_id.sort_by(|a, b| a.delivery.cmp(&b.delivery));
    for event in by_id {
        event.first = Duration::from_millis(rng.random_range(0..spread));
        let copies = if rng.random_bool(0.2) { 2 } else { 1 };
        for copy in 0..copies {
            let jitter = (0..8).map(|_| rng.random_range(0..5_000)).collect();
            let offset = copy
                * if rng.random_bool(0.7) {
                    rng.random_range(0..500)
                } else {
                    rng.random_range(1_000..600_000)
                };
            event.copies.push(Copy {
                offset: Duration::from_millis(offset),
                jitter,
            });
        }
    }
}
