//! What a world's providers send: its entities and their events, and
//! each delivery's attempts as its provider makes them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt;

use super::{Event, World};
use crate::domain::event::ProviderKind;
use crate::services::pipeline::sim::providers::{Sender, Senders, body};

impl World {
    /// A few entities of each provider, each with a few events of rising
    /// versions: delivery id → event and body.
    pub(super) fn events(&mut self) -> BTreeMap<String, (Event, Vec<u8>)> {
        let mut events = BTreeMap::new();
        let mut next = 0;
        for provider in ProviderKind::ALL {
            for entity in 0..self.rng.random_range(1..4) {
                let mut states = Vec::new();
                for index in 0..self.rng.random_range(1..5) {
                    next += 1;
                    let delivery = format!("d-{next}");
                    let broken = self.rng.random_bool(0.1);
                    let state = self.state_of(index, &states);
                    if broken {
                        self.shared.drew("cannot be normalized");
                    } else if states.last() == Some(&state) {
                        self.shared.drew("state repeated");
                    } else if states.contains(&state) {
                        self.shared.drew("state brought back");
                    }
                    states.push(state);
                    let (key, body) = body(provider, &delivery, (entity, index, state), broken);
                    events.insert(
                        delivery,
                        (
                            Event {
                                key,
                                index,
                                provider,
                                broken,
                                raw: body.clone(),
                            },
                            body,
                        ),
                    );
                }
            }
        }
        events
    }

    /// The state event `index` of an entity brings, given the states of the
    /// ones before: mostly a new one (its index), sometimes the last one
    /// again (an update that changes nothing the state hash covers), or an
    /// earlier one back (A → B → A); all delivered out of order like any.
    fn state_of(&mut self, index: usize, before: &[usize]) -> usize {
        match (before.last(), self.states.random_range(0..10)) {
            (Some(last), 0..2) => *last,
            (Some(_), 2..4) if before.len() >= 2 => {
                before[self.states.random_range(0..before.len() - 1)]
            }
            _ => index,
        }
    }

    /// Each delivery as its provider sends it: a first attempt in the first
    /// minute, sometimes two copies (a duplicate, at once or minutes
    /// later), and a jitter on each retry's wait; and when each delivery's
    /// first attempt comes.
    pub(super) fn senders(
        &mut self,
        events: &BTreeMap<String, (Event, Vec<u8>)>,
    ) -> (Senders, BTreeMap<String, Duration>) {
        let mut senders = Vec::new();
        let mut firsts = BTreeMap::new();
        for (delivery, (event, body)) in events {
            let first = Duration::from_millis(self.rng.random_range(0..self.spread));
            firsts.insert(delivery.clone(), first);
            let copies = if self.rng.random_bool(0.2) { 2 } else { 1 };
            for copy in 0..copies {
                let jitter = (0..8).map(|_| self.rng.random_range(0..5_000)).collect();
                let offset = Duration::from_millis(
                    copy * if self.rng.random_bool(0.7) {
                        self.rng.random_range(0..500)
                    } else {
                        self.rng.random_range(1_000..600_000)
                    },
                );
                senders.push(Sender::new(
                    delivery.clone(),
                    body.clone(),
                    event.provider,
                    self.spools && event.provider == ProviderKind::ReceiptRoller,
                    first + offset,
                    jitter,
                ));
            }
        }
        (Arc::new(Mutex::new(senders)), firsts)
    }
}
