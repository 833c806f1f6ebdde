//! What the records of one partition (or of a batch of its records) say
//! the ledger held, folded without I/O: each key's newest state and the
//! recent delivery ids.

use std::collections::HashMap;

use crate::adapters::ledger::{Answered, Commit, Done, EntitySlot, Held, Recorded};
use crate::domain::event::{DeliveryKey, EntityType, ProviderKind};
use crate::domain::record_at::RecordAt;
use crate::services::pipeline::{
    HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_RECEIVED_AT, HEADER_STATE_HASH, HEADER_VERSION,
    received_at_from_header, state_from_headers,
};
use crate::services::replay::Letter;

/// What a rebuild read and wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Summary {
    /// Records read.
    pub(super) records: u64,
    /// Entity records without the state headers (written before they
    /// existed): their state is unknown, and left out.
    pub(super) unknown: u64,
    /// Entity states written.
    pub(super) entities: u64,
    /// Delivery ids marked done.
    pub(super) done: u64,
}

impl Summary {
    pub(super) fn add(&mut self, other: Summary) {
        self.records += other.records;
        self.unknown += other.unknown;
        self.entities += other.entities;
        self.done += other.done;
    }
}

/// What the records of one partition, or of a batch of its records, say
/// the ledger held.
#[derive(Debug, Default)]
pub(super) struct Found {
    /// Each key's newest state, and its record's offset.
    entities: HashMap<EntitySlot, Held>,
    /// Recent delivery ids, with what their records say they were answered.
    done: HashMap<DeliveryKey, Answered>,
    records: u64,
    unknown: u64,
}

impl Found {
    /// An entity record of `entity_type`'s `topic`. Its delivery id counts
    /// as done (published, at the record's place) when its delivery arrived
    /// at or after `done_since_ms` ([`arrived_ms`]).
    pub(super) fn entity_record(
        &mut self,
        (topic, entity_type): (&str, EntityType),
        record: &Letter,
        done_since_ms: i64,
    ) {
        self.records += 1;
        let state = record
            .header(HEADER_VERSION)
            .zip(record.header(HEADER_STATE_HASH))
            .and_then(|(version, hash)| state_from_headers(version.as_bytes(), hash.as_bytes()));
        let (Some(key), Some(state)) = (&record.key, state) else {
            self.unknown += 1;
            return;
        };
        let slot = EntitySlot::of_record_key(entity_type, key);
        let newer = self
            .entities
            .get(&slot)
            .is_none_or(|held| held.state.version <= state.version);
        if newer {
            let offset = Some(record.offset);
            self.entities.insert(slot, Held { state, offset });
        }
        if arrived_ms(record).is_some_and(|at| at >= done_since_ms)
            && let Some(provider) = record.header(HEADER_PROVIDER).and_then(ProviderKind::parse)
            && let Some(delivery) = record.header(HEADER_DELIVERY_ID)
        {
            // An entity record's time is its event's, not its answer's.
            let mut published = answered(Recorded::Published, topic, record);
            published.at_micros = 0;
            self.done
                .insert(DeliveryKey::new(provider, delivery), published);
        }
    }

    /// A dead letter of `topic`: its key is its delivery, done when recent.
    pub(super) fn dead_letter(&mut self, topic: &str, record: &Letter, done_since_ms: i64) {
        self.records += 1;
        if record.timestamp_ms.is_some_and(|at| at >= done_since_ms)
            && let Some(key) = &record.key
        {
            self.done.insert(
                DeliveryKey::from_stored(key.clone()),
                answered(Recorded::DeadLettered, topic, record),
            );
        }
    }

    /// Records folded so far.
    pub(super) fn records(&self) -> u64 {
        self.records
    }

    /// What was found, in figures.
    pub(super) fn summary(&self) -> Summary {
        Summary {
            records: self.records,
            unknown: self.unknown,
            entities: self.entities.len() as u64,
            done: self.done.len() as u64,
        }
    }

    /// The commits that write it into a ledger: every entity state, then
    /// every done id.
    pub(super) fn into_commits(self) -> impl Iterator<Item = Commit> {
        let entities = self
            .entities
            .into_iter()
            .map(|(slot, state)| Commit::state(slot, state));
        let done = self.done.into_iter().map(|(key, answered)| {
            Commit::done(Done {
                key,
                answered,
                read_back: true,
            })
        });
        entities.chain(done)
    }
}

/// What a record says its delivery was answered: `outcome`, at the
/// record's time (a dead letter's is its delivery's arrival) and place.
fn answered(outcome: Recorded, topic: &str, record: &Letter) -> Answered {
    Answered {
        outcome,
        at_micros: record.timestamp_ms.unwrap_or_default().saturating_mul(1000),
        place: Some(RecordAt::new(topic, record.partition, record.offset)),
    }
}

/// When an entity record's delivery arrived, in milliseconds since the
/// epoch: its arrival header; for a record written before the header
/// existed, its timestamp (its event's time, the best it tells).
fn arrived_ms(record: &Letter) -> Option<i64> {
    match record.header(HEADER_RECEIVED_AT) {
        Some(micros) => received_at_from_header(micros).map(|micros| micros.div_euclid(1000)),
        None => record.timestamp_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Version;

    fn record(key: &str, delivery: &str, at: i64, rank: u32, hash: u8, time_ms: i64) -> Letter {
        Letter {
            partition: 0,
            offset: 0,
            timestamp_ms: Some(time_ms),
            key: Some(key.to_owned()),
            body: None,
            headers: [
                (HEADER_DELIVERY_ID, delivery.to_owned()),
                (HEADER_PROVIDER, "mekari".to_owned()),
                (HEADER_VERSION, format!("{at}:{rank}")),
                (HEADER_STATE_HASH, hex::encode([hash; 16])),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect(),
        }
    }

    #[test]
    fn a_delivery_id_is_restored_by_its_arrival_not_its_events_time() {
        let since_ms = 1_000_000;
        let mut found = Found::default();
        let arrived = |key: &str, delivery: &str, event_ms: i64, arrival_ms: Option<i64>| {
            let mut record = record(key, delivery, 1, 0, 1, event_ms);
            if let Some(ms) = arrival_ms {
                record
                    .headers
                    .insert(HEADER_RECEIVED_AT.to_owned(), (ms * 1000 + 7).to_string());
            }
            record
        };
        let orders = ("orders", EntityType::Order);
        // An event days old, delivered within the window (a POS that was
        // offline, a late retry, a backfill).
        found.entity_record(
            orders,
            &arrived("mekari:O-1", "late", 10, Some(since_ms)),
            since_ms,
        );
        // A recent event whose delivery arrived before the window.
        found.entity_record(
            orders,
            &arrived("mekari:O-2", "gone", since_ms + 5, Some(since_ms - 1)),
            since_ms,
        );
        // Written before the arrival header existed: its event's time.
        found.entity_record(
            orders,
            &arrived("mekari:O-3", "old-recent", since_ms, None),
            since_ms,
        );
        found.entity_record(
            orders,
            &arrived("mekari:O-4", "old-gone", since_ms - 1, None),
            since_ms,
        );
        let mut done: Vec<String> = found
            .into_commits()
            .filter_map(|commit| commit.delivery().map(|done| done.key.as_str().to_owned()))
            .collect();
        done.sort_unstable();
        assert_eq!(done, ["mekari:late", "mekari:old-recent"]);
    }

    #[test]
    fn the_newest_state_of_each_key_and_the_recent_delivery_ids_are_found() {
        let mut found = Found::default();
        found.entity_record(
            ("orders", EntityType::Order),
            &record("mekari:O-1", "d1", 10, 0, 1, 500),
            1000,
        );
        found.entity_record(
            ("orders", EntityType::Order),
            &record("mekari:O-1", "d2", 20, 0, 2, 1500),
            1000,
        );
        // A compacted topic keeps the newest; an older one after it (never
        // written by posbridge) does not roll it back.
        found.entity_record(
            ("orders", EntityType::Order),
            &record("mekari:O-1", "d0", 5, 0, 9, 1600),
            1000,
        );
        found.entity_record(
            ("products", EntityType::Product),
            &record("mekari:O-1", "d3", 1, 0, 3, 2000),
            1000,
        );
        let mut old = record("mekari:O-2", "d4", 1, 0, 4, 2000);
        old.headers.remove(HEADER_VERSION);
        found.entity_record(("orders", EntityType::Order), &old, 1000);
        let mut letter = record("mekari:d5", "d5", 0, 0, 0, 2000);
        letter.headers.clear();
        found.dead_letter("dead-letter", &letter, 1000);

        let summary = found.summary();
        let commits: Vec<Commit> = found.into_commits().collect();
        assert_eq!(
            summary,
            Summary {
                records: 6,
                unknown: 1,
                entities: 2,
                done: 4
            }
        );
        let order = commits
            .iter()
            .find_map(|c| {
                c.entity()
                    .filter(|(slot, _)| slot.as_str() == "orders/mekari:O-1")
            })
            .unwrap();
        assert_eq!(
            order.1.state.version,
            Version {
                at_micros: 20,
                rank: 0
            }
        );
        let mut done: Vec<(&str, Recorded, &str, i64)> = commits
            .iter()
            .filter_map(Commit::delivery)
            .map(|done| {
                let place = done.answered.place.as_ref().unwrap();
                (
                    done.key.as_str(),
                    done.answered.outcome,
                    &*place.topic,
                    done.answered.at_micros,
                )
            })
            .collect();
        done.sort_unstable_by_key(|(key, ..)| *key);
        assert_eq!(
            done,
            [
                ("mekari:d0", Recorded::Published, "orders", 0),
                ("mekari:d2", Recorded::Published, "orders", 0),
                ("mekari:d3", Recorded::Published, "products", 0),
                (
                    "mekari:d5",
                    Recorded::DeadLettered,
                    "dead-letter",
                    2_000_000
                ),
            ]
        );
    }
}
