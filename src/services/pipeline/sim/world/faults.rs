//! The broker's answer to each send in a world: the plan's where it holds
//! one, else its faults while their window lasts and acknowledgements (some
//! late) outside it; every answer noted, so that the plan kept from the run
//! holds it.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::{World, delivery_of};
use crate::adapters::publish::{Fault, OutgoingRecord};
use crate::services::pipeline::sim::plan::{RETRYABLE, Reply};

impl World {
    /// The broker's answer to each send.
    pub(super) fn plan_faults(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.plan.broker.seed);
        let kept = self.plan.broker.answers.clone();
        let (shared, clock, (from, to)) =
            (self.shared.clone(), self.clock.clone(), self.plan.faults);
        let outage = self.plan.outage;
        let mut sent: BTreeMap<String, usize> = BTreeMap::new();
        self.broker.plan(move |record| {
            let now = clock.now();
            // Drawn whether the plan holds the answer or not, so that the
            // draws after it are those of the run that kept it.
            let drawn = if now >= from && now < to {
                match if outage { 0 } else { rng.random_range(0..100) } {
                    0..40 => RETRYABLE[rng.random_range(0..RETRYABLE.len())],
                    40..48 => Reply::LoseAck,
                    48..55 => Reply::NeverTaken,
                    55..75 => Reply::Late(rng.random_range(0..3_000)),
                    _ => Reply::Take,
                }
            } else if rng.random_bool(0.1) {
                Reply::Late(rng.random_range(0..400))
            } else {
                Reply::Take
            };
            let delivery = delivery_of(record).unwrap_or_default();
            let send = sent_key(&delivery, record);
            let nth = sent.entry(send.clone()).or_default();
            let reply = kept
                .get(&send)
                .and_then(|replies| replies.get(*nth).copied())
                .unwrap_or(drawn);
            *nth += 1;
            shared.record().replies.entry(send).or_default().push(reply);
            let fault = reply.fault();
            if fault == Fault::LoseAck {
                shared.in_doubt(delivery.clone());
            }
            if let Some(class) = reply.class() {
                shared.drew(class);
            }
            if fault != Fault::Take {
                shared.step(
                    now,
                    format!("broker: {fault:?} for {delivery} on {}", record.topic),
                );
            }
            fault
        });
    }
}

/// A send's delivery and topic, as the plan keeps its answers by.
pub(super) fn sent_key(delivery: &str, record: &OutgoingRecord) -> String {
    format!("{delivery} {}", record.topic)
}
