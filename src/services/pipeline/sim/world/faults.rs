//! The broker's answer to each send in a world: its faults while their
//! window lasts, acknowledgements (some late) outside it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::error::RDKafkaErrorCode;

use super::{World, delivery_of};
use crate::adapters::publish::Fault;

/// Broker errors a send may meet that a later attempt may not: never a
/// refusal for good (that is a dead letter, a decision of its own).
const RETRYABLE: [RDKafkaErrorCode; 4] = [
    RDKafkaErrorCode::NotEnoughReplicas,
    RDKafkaErrorCode::RequestTimedOut,
    RDKafkaErrorCode::NetworkException,
    RDKafkaErrorCode::LeaderNotAvailable,
];

impl World {
    /// The broker's answer to each send: faults while the window lasts,
    /// acknowledgements (some late) outside it.
    pub(super) fn plan_faults(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.rng.random());
        let (shared, clock, (from, to)) = (self.shared.clone(), self.clock.clone(), self.faults);
        let outage = self.outage;
        self.broker.plan(move |sent| {
            let now = clock.now();
            let fault = if now >= from && now < to {
                match if outage { 0 } else { rng.random_range(0..100) } {
                    0..40 => Fault::Fail(RETRYABLE[rng.random_range(0..RETRYABLE.len())]),
                    40..48 => Fault::LoseAck,
                    // A send the broker never took, reported timed out as
                    // a lost acknowledgement is: in doubt, not in the log.
                    48..55 => Fault::Fail(RDKafkaErrorCode::MessageTimedOut),
                    55..75 => Fault::Late(Duration::from_millis(rng.random_range(0..3_000))),
                    _ => Fault::Take,
                }
            } else if rng.random_bool(0.1) {
                Fault::Late(Duration::from_millis(rng.random_range(0..400)))
            } else {
                Fault::Take
            };
            let delivery = delivery_of(sent).unwrap_or_default();
            if fault == Fault::LoseAck {
                shared.in_doubt(delivery.clone());
            }
            let class = match fault {
                Fault::LoseAck => Some("acknowledgement lost"),
                Fault::Fail(RDKafkaErrorCode::MessageTimedOut) => Some("send never taken"),
                Fault::Fail(_) => Some("retryable failure"),
                Fault::Late(_) => Some("late acknowledgement"),
                Fault::Take => None,
            };
            if let Some(class) = class {
                shared.drew(class);
            }
            if fault != Fault::Take {
                shared.step(
                    now,
                    format!("broker: {fault:?} for {delivery} on {}", sent.topic),
                );
            }
            fault
        });
    }
}
