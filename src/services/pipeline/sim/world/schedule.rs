//! What a world's providers send, from its plan: its entities and their
//! events, and each delivery's attempts as its provider makes them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Event, World};
use crate::domain::event::ProviderKind;
use crate::services::pipeline::sim::providers::{Sender, Senders, body};

impl World {
    /// The plan's events: delivery id → event and body; the classes of
    /// schedule they draw noted (a dead letter, a state repeated or brought
    /// back).
    pub(super) fn events(&self) -> BTreeMap<String, (Event, Vec<u8>)> {
        let mut events = BTreeMap::new();
        let mut states: BTreeMap<(ProviderKind, usize), Vec<usize>> = BTreeMap::new();
        for planned in &self.plan.events {
            let before = states
                .entry((planned.provider, planned.entity))
                .or_default();
            if planned.broken {
                self.shared.drew("cannot be normalized");
            } else if before.last() == Some(&planned.state) {
                self.shared.drew("state repeated");
            } else if before.contains(&planned.state) {
                self.shared.drew("state brought back");
            }
            before.push(planned.state);
            let (key, body) = body(
                planned.provider,
                &planned.delivery,
                (planned.entity, planned.index, planned.state),
                planned.broken,
            );
            let event = Event {
                key,
                index: planned.index,
                provider: planned.provider,
                broken: planned.broken,
                raw: body.clone(),
            };
            events.insert(planned.delivery.clone(), (event, body));
        }
        events
    }

    /// Each copy of each delivery as its provider sends it, in the order of
    /// the deliveries' ids; and when each delivery's first attempt comes.
    pub(super) fn senders(
        &self,
        events: &BTreeMap<String, (Event, Vec<u8>)>,
    ) -> (Senders, BTreeMap<String, Duration>) {
        let planned: BTreeMap<&str, _> = self
            .plan
            .events
            .iter()
            .map(|planned| (planned.delivery.as_str(), planned))
            .collect();
        let mut senders = Vec::new();
        let mut firsts = BTreeMap::new();
        for (delivery, (event, body)) in events {
            let planned = planned[delivery.as_str()];
            firsts.insert(delivery.clone(), planned.first);
            for copy in &planned.copies {
                senders.push(Sender::new(
                    delivery.clone(),
                    body.clone(),
                    event.provider,
                    self.plan.spools && event.provider == ProviderKind::ReceiptRoller,
                    planned.first + copy.offset,
                    copy.jitter.clone(),
                ));
            }
        }
        (Arc::new(Mutex::new(senders)), firsts)
    }
}
