//! How many partitions each of a world's topics has, drawn from a
//! generator of its own (so that a seed's other draws are what they were
//! when every topic had one): half the worlds keep one partition per
//! topic, the others give each of the providers' topics one to four. The
//! fake broker puts each record in the partition its key's murmur2 names,
//! as the producer does; the rebuild reads every partition and the ledger
//! checkpoints each one's offset.

use std::collections::BTreeMap;

use rand::RngExt;
use rand::rngs::StdRng;

use super::providers::topics_of;
use super::world::Shared;
use crate::adapters::publish::FakeBroker;
use crate::domain::event::ProviderKind;

/// Each topic's partition count, where a world gives it more than one.
pub(super) struct Partitions(BTreeMap<String, usize>);

impl Partitions {
    /// The counts of one world.
    pub(super) fn draw(rng: &mut StdRng) -> Partitions {
        let mut counts = BTreeMap::new();
        if rng.random_bool(0.5) {
            for provider in ProviderKind::ALL {
                for (topic, _) in topics_of(provider).typed() {
                    counts.insert(topic.to_owned(), rng.random_range(1..=4));
                }
            }
        }
        Partitions(counts)
    }

    /// Gives `broker`'s topics their counts, and says so in the schedule.
    pub(super) fn make(&self, broker: &FakeBroker, shared: &Shared) {
        for (topic, count) in &self.0 {
            broker.partitions(topic, *count);
        }
        if self.0.values().any(|count| *count > 1) {
            shared.drew("several partitions");
            let said: Vec<String> = self
                .0
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
