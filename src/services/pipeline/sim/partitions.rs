//! How many partitions each of a world's topics has, drawn from a
//! generator of its own (so that a seed's other draws are what they were
//! when every topic had one): half the worlds keep one partition per
//! topic, the others give each of the providers' topics one to four. The
//! fake broker puts each record in the partition its key's murmur2 names,
//! as the producer does; the rebuild reads every partition and the ledger
//! checkpoints each one's offset.
//!
//! **A topic grown while posbridge is stopped**: in a world of two crashes
//! or more, where the ledger outlives the first, one entity topic may gain
//! partitions while posbridge is down after it (the broker kept, as an
//! operator's `kafka-topics --alter` leaves it): its keys then map to other
//! partitions. posbridge refuses such a topic from its next start, named,
//! because a key's next state would land beside its last in another
//! partition; the world checks that it is refused and that nothing is
//! written to it, and then plays the operator who accepts the new count
//! (`posbridge ledger accept-partitions`, the same code) while posbridge
//! is stopped at the next crash: from the start after that it publishes
//! again, each key into the partition the new count gives it.

use std::collections::BTreeMap;

use rand::RngExt;
use rand::rngs::StdRng;

use super::crash::Crash;
use super::process::LedgerFate;
use super::providers::{entity_type, topics_of};
use super::world::Shared;
use crate::adapters::publish::FakeBroker;
use crate::domain::event::ProviderKind;

/// Each topic's partition count, where a world gives it more than one,
/// and the topic grown while posbridge is stopped, if one is.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Partitions {
    counts: BTreeMap<String, usize>,
    pub(super) grown: Option<Grown>,
}

/// An entity topic grown while posbridge is down after a crash.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Grown {
    /// After which crash (its index).
    pub(super) after: usize,
    pub(super) topic: String,
    /// Its partitions before, and after.
    pub(super) from: usize,
    pub(super) to: usize,
}

/// What a start of posbridge meets of a grown topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtStart {
    /// The first start after the topic grew: it must be refused.
    Refused,
    /// The start after the operator accepted the new count.
    Accepted,
}

impl Grown {
    /// What the start of life `life` (from 0) meets of it.
    pub(super) fn at_start(&self, life: usize) -> Option<AtStart> {
        match life.checked_sub(self.after) {
            Some(1) => Some(AtStart::Refused),
            Some(2) => Some(AtStart::Accepted),
            _ => None,
        }
    }
}

impl Partitions {
    /// The counts of one world, and the topic grown after one of its
    /// `crashes`.
    pub(super) fn draw(rng: &mut StdRng, crashes: &[Crash]) -> Partitions {
        let mut counts = BTreeMap::new();
        if rng.random_bool(0.5) {
            for provider in ProviderKind::ALL {
                for (topic, _) in topics_of(provider).typed() {
                    counts.insert(topic.to_owned(), rng.random_range(1..=4));
                }
            }
        }
        let grown = (crashes.len() >= 2 && rng.random_bool(0.6))
            .then(|| {
                let after = rng.random_range(0..crashes.len() - 1);
                let provider = ProviderKind::ALL[rng.random_range(0..ProviderKind::ALL.len())];
                let topic = topics_of(provider)
                    .entity(entity_type(provider))
                    .to_string();
                let from = counts.get(&topic).copied().unwrap_or(1);
                let to = from + rng.random_range(1..=3);
                Grown {
                    after,
                    topic,
                    from,
                    to,
                }
            })
            // A ledger lost at the crash keeps no count to refuse the topic
            // by (its start takes the topic as it is), and a replaced
            // broker's topics are new ones.
            .filter(|grown| {
                let crash = &crashes[grown.after];
                crash.ledger == LedgerFate::Kept && !crash.broker_replaced
            });
        Partitions { counts, grown }
    }

    /// Gives `broker`'s topics their counts, and says so in the schedule.
    pub(super) fn make(&self, broker: &FakeBroker, shared: &Shared) {
        if let Some(grown) = &self.grown {
            shared.drew("topic grown while stopped");
            shared.step(
                std::time::Duration::ZERO,
                format!(
                    "{} grows from {} to {} partitions after crash {}",
                    grown.topic, grown.from, grown.to, grown.after
                ),
            );
        }
        for (topic, count) in &self.counts {
            broker.partitions(topic, *count);
        }
        if self.counts.values().any(|count| *count > 1) {
            shared.drew("several partitions");
            let said: Vec<String> = self
                .counts
                .iter()
                .map(|(topic, count)| format!("{topic}: {count}"))
                .collect();
            shared.step(
                std::time::Duration::ZERO,
                format!("partitions: {}", said.join(", ")),
            );
        }
    }
}
