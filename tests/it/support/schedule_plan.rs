//! The plan of a seeded Redis schedule (`tests/it/redis_schedules.rs`):
//! the deliveries, the order of their attempts, the faults and where they
//! fire, all drawn from the seed; and the simulation's guarantees
//! (`src/services/pipeline/sim/check.rs`) checked from the topics against
//! the attempts' answers.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use posbridge::services::pipeline::HEADER_DELIVERY_ID;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use super::{Record, mekari_order, rr_sale};

/// One delivery of the plan: event `index` of entity `entity`.
pub struct Event {
    pub id: String,
    pub provider: &'static str,
    pub entity: usize,
    pub index: usize,
    pub body: Vec<u8>,
}

/// A fault, as drawn.
#[derive(Debug, Clone)]
pub enum Fault {
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
    /// the filler's records) wrote `share` of the filler's keys.
    FlushDuringFill { process: usize, share: f64 },
}

/// What the executor does at a point of the traffic.
#[derive(Debug, Clone)]
pub enum Action {
    Save,
    LeaveBehind,
    Fire(Fault),
}

/// A seed's plan: the deliveries, the attempts in order (an event and the
/// process it goes to), and the actions at points of the attempts.
pub struct Plan {
    pub events: Vec<Event>,
    pub sends: Vec<(usize, usize)>,
    pub actions: Vec<(usize, Action)>,
    pub faults: Vec<(usize, Fault)>,
}

impl Plan {
    /// The plan of `seed`; delivery ids and entities under `run`.
    pub fn draw(seed: u64, run: &str) -> Plan {
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
pub enum Answer {
    /// The status, and the body's `status` field (`published`, …).
    Status(u16, String),
    /// Never sent: the connection was refused (the process was down).
    Refused,
    /// Sent, and no answer: cut by a kill, or past the providers' limit.
    Cut,
}

impl Answer {
    pub fn is_2xx(&self) -> bool {
        matches!(self, Answer::Status(status, _) if (200..300).contains(status))
    }

    /// Whether the delivery may have been written without a 2xx.
    pub fn in_doubt(&self) -> bool {
        match self {
            Answer::Status(..) => !self.is_2xx(),
            Answer::Refused => false,
            Answer::Cut => true,
        }
    }

    pub fn label(&self) -> String {
        match self {
            Answer::Status(status, what) if (200..300).contains(status) => what.clone(),
            Answer::Status(status, _) => status.to_string(),
            Answer::Refused => "refused".to_owned(),
            Answer::Cut => "cut".to_owned(),
        }
    }
}

/// The simulation's guarantees, from the topics' `records` (in order per
/// topic) and the attempts' answers, in words.
pub fn violations(plan: &Plan, attempts: &[(usize, Answer)], records: &[Record]) -> Vec<String> {
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
