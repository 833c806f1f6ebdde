//! "What became of this sale?": an entity's records on its topics, each
//! with its place, headers and value, beside the state the ledger holds for
//! it (`posbridge lookup --entity`, `GET /admin/entities/{key}`); and what
//! posbridge answered one delivery, when, and the record it wrote
//! (`posbridge lookup --delivery`, `GET /admin/deliveries/{id}`,
//! `delivery.rs`).
//!
//! The cost is bounded by one partition per entity topic: a record key
//! lands where the producer's murmur2 of it says (`murmur2_random`, as a
//! Java producer chooses, `partition.rs`), so only that partition is read,
//! from its start to its end as the lookup began; on a compacted topic it
//! holds about `entities / partitions` records. A delivery costs one ledger
//! read and one record: the ledger keeps its record's place with its id.

mod delivery;
mod partition;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::adapters::encode::{Writers, event_json};
use crate::adapters::ledger::{EntitySlot, Held, Ledger};
use crate::adapters::publish::TopicSets;
use crate::config::Config;
use crate::domain::event::EntityType;
use crate::services::replay::{Letter, ReadError, Reader};

pub use delivery::{DeliveryFound, DeliveryReport, PlacedRecord, provider_scoped};
pub use partition::partition_of;

/// The records a lookup keeps of one key: its last ones.
const KEPT: usize = 50;

/// How long one lookup waits for the topics in all: what the ledger knows
/// is answered within a few seconds whatever Kafka does, with a note where
/// a topic could not be read.
const READ_WITHIN: Duration = Duration::from_secs(5);

/// What a lookup says of a ledger not filled from the topics: its answer
/// may miss the outcomes of the last deliveries before a crash.
const NOT_FILLED: &str = "the ledger has not read the topics' last records yet (it is being filled, Kafka cannot be reached, or the command reads the ledger as it was left): the outcomes of the last deliveries before a crash may be missing";

/// How many lookups run at once. Each reads a partition through a
/// consumer of its own, whose fetch buffers take tens of MB on a large
/// partition: more lookups at once are told to come back, not queued.
pub const LOOKUPS_AT_ONCE: usize = 2;

/// Why a lookup could not answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The ledger could not be read.
    #[error("ledger: {0}")]
    Ledger(#[from] crate::adapters::ledger::LedgerError),
    /// [`LOOKUPS_AT_ONCE`] lookups are running.
    #[error("{LOOKUPS_AT_ONCE} lookups are running; try again in a moment")]
    Busy,
}

/// Why a topic was not read, said in a report beside what the ledger knows.
#[derive(Debug, thiserror::Error)]
enum Unread {
    /// The read failed.
    #[error("{0}")]
    Read(#[from] ReadError),
    /// Kafka did not answer within the lookup's [`READ_WITHIN`].
    #[error("Kafka did not answer within {} s", READ_WITHIN.as_secs())]
    Late,
}

/// One lookup's time for the topics, shared by its reads: a broker that
/// does not answer costs [`READ_WITHIN`] once, not once a topic.
struct Deadline(tokio::time::Instant);

impl Deadline {
    fn start() -> Deadline {
        Deadline(tokio::time::Instant::now() + READ_WITHIN)
    }

    async fn read<T>(&self, read: impl Future<Output = Result<T, ReadError>>) -> Result<T, Unread> {
        Ok(tokio::time::timeout_at(self.0, read)
            .await
            .map_err(|_| Unread::Late)??)
    }
}

/// Every topic a key was found on.
#[derive(Debug, Serialize)]
pub struct EntityReport {
    /// The record key looked up.
    pub key: String,
    /// Each entity topic holding a record of it, or a ledger state.
    pub found: Vec<TopicReport>,
    /// Records read to find them.
    pub read: u64,
    /// Why the ledger's states may be behind, when they may.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_note: Option<&'static str>,
    /// Why the topics were not all read (Kafka unreachable): the report
    /// holds the ledger's states and the records read before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topics_note: Option<String>,
}

/// A key on one entity topic.
#[derive(Debug, Serialize)]
pub struct TopicReport {
    /// The topic.
    pub topic: String,
    /// The key's partition; none when the topic could not be read.
    pub partition: Option<i32>,
    /// Its entity type (`sales`, …).
    pub entity_type: &'static str,
    /// The state the ledger holds: the newest record's, while it remembers.
    pub ledger_state: Option<StateView>,
    /// Its records, oldest first (the last [`KEPT`]).
    pub records: Vec<RecordView>,
}

/// An entity state as its record headers spell it.
#[derive(Debug, Serialize)]
pub struct StateView {
    /// `{µs since the epoch}:{rank}`.
    pub version: String,
    /// 32 hex digits.
    pub state_hash: String,
    /// The offset of the record that wrote it; none for a state in doubt
    /// (its record may not be in the topic) or stored before offsets were
    /// kept.
    pub offset: Option<i64>,
}

/// One record of the key.
#[derive(Debug, Serialize)]
pub struct RecordView {
    /// Its offset.
    pub offset: i64,
    /// Its timestamp (when the change happened), ms since the epoch.
    pub timestamp_ms: Option<i64>,
    /// Its headers.
    pub headers: BTreeMap<String, String>,
    /// Its value, read with the schema that wrote it; none for a tombstone.
    pub value: Option<serde_json::Value>,
    /// Why its value could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Looks entities up on the topics in use. Cheap to clone.
#[derive(Clone)]
pub struct Lookup {
    config: Arc<Config>,
    ledger: Arc<Ledger>,
    writers: Arc<Writers>,
    sets: TopicSets,
    /// [`LOOKUPS_AT_ONCE`] permits.
    running: Arc<tokio::sync::Semaphore>,
}

impl Lookup {
    /// Lookups on the entity topics in use (`sets`, the sources' own as
    /// they open), reading `ledger` as a reader does ([`Ledger::read`]).
    ///
    /// # Errors
    /// [`crate::adapters::encode::WriterError`] when the registry's client
    /// cannot be made.
    pub fn new(
        config: &Config,
        ledger: Arc<Ledger>,
        sets: TopicSets,
    ) -> Result<Lookup, crate::adapters::encode::WriterError> {
        Ok(Lookup {
            config: Arc::new(config.clone()),
            ledger,
            writers: Arc::new(Writers::new(&config.schema_registry)?),
            sets,
            running: Arc::new(tokio::sync::Semaphore::new(LOOKUPS_AT_ONCE)),
        })
    }

    /// A permit to look up, or [`LookupError::Busy`].
    fn permit(&self) -> Result<tokio::sync::SemaphorePermit<'_>, LookupError> {
        self.running.try_acquire().map_err(|_| LookupError::Busy)
    }

    /// Lookups on the default configuration's shared topics, for tests of
    /// the routes around it.
    #[cfg(test)]
    pub fn idle(pipeline: crate::services::pipeline::Pipeline) -> Lookup {
        let config = Config::from_toml("").expect("the defaults read");
        let sets = TopicSets::new(&config.kafka);
        Lookup::new(&config, pipeline.shared_ledger(), sets).expect("no registry to set up")
    }

    /// What a report says of the ledger: nothing while it is filled.
    fn ledger_note(&self) -> Option<&'static str> {
        (!self.ledger.read().filled()).then_some(NOT_FILLED)
    }

    /// Every record of `key` on every entity topic (the key's partition
    /// of each), and the ledger's state of it.
    ///
    /// # Errors
    /// [`LookupError`] when the ledger cannot be read; a topic that cannot
    /// be read is said in the report's `topics_note`.
    pub async fn entity(&self, key: &str) -> Result<EntityReport, LookupError> {
        let _running = self.permit()?;
        let mut report = EntityReport {
            key: key.to_owned(),
            found: Vec::new(),
            read: 0,
            ledger_note: self.ledger_note(),
            topics_note: None,
        };
        let deadline = Deadline::start();
        for entity_type in EntityType::ALL {
            let state = self.ledger_state(entity_type, key).await?;
            let mut of_type = Vec::new();
            for set in self.sets.all() {
                let topic = set.entity(entity_type);
                let on_topic = |partition, records| TopicReport {
                    topic: topic.to_string(),
                    partition,
                    entity_type: entity_type.plural(),
                    ledger_state: None,
                    records,
                };
                // Once a topic could not be read, the rest are not tried:
                // each is listed without its records, for the ledger's state.
                if report.topics_note.is_some() {
                    of_type.push(on_topic(None, Vec::new()));
                    continue;
                }
                match self.on_topic(topic, key, &mut report.read, &deadline).await {
                    Ok(Some((partition, records))) => {
                        of_type.push(on_topic(Some(partition), records));
                    }
                    Ok(None) => {}
                    Err(unread) => {
                        report.topics_note = Some(format!(
                            "{topic} and the topics after it were not read: {unread}"
                        ));
                        of_type.push(on_topic(None, Vec::new()));
                    }
                }
            }
            // The ledger holds one state per key and entity type, whichever
            // topic set its records went to: shown beside the topic that
            // holds them (the first, the shared one, when none does).
            let holder = of_type
                .iter()
                .position(|topic| !topic.records.is_empty())
                .or_else(|| (state.is_some() && !of_type.is_empty()).then_some(0));
            if let Some(holder) = holder {
                of_type[holder].ledger_state = state;
            }
            report.found.extend(
                of_type
                    .into_iter()
                    .filter(|topic| !topic.records.is_empty() || topic.ledger_state.is_some()),
            );
        }
        Ok(report)
    }

    /// The state the ledger holds for `key` of `entity_type`.
    async fn ledger_state(
        &self,
        entity_type: EntityType,
        key: &str,
    ) -> Result<Option<StateView>, LookupError> {
        let slot = EntitySlot::of_record_key(entity_type, key);
        Ok(self
            .ledger
            .read()
            .entity(&slot)
            .await?
            .map(|Held { state, offset }| StateView {
                version: format!("{}:{}", state.version.at_micros, state.version.rank),
                state_hash: hex::encode(state.state_hash),
                offset,
            }))
    }

    /// An entity record as a lookup shows it: its value read with the
    /// schema that wrote it.
    async fn entity_view(&self, record: Letter) -> RecordView {
        let (value, error) = match &record.body {
            None => (None, None),
            Some(bytes) => match self.writers.decode(bytes).await {
                Ok(event) => (Some(event_json(&event)), None),
                Err(error) => (None, Some(error.to_string())),
            },
        };
        RecordView {
            offset: record.offset,
            timestamp_ms: record.timestamp_ms,
            headers: record.headers,
            value,
            error,
        }
    }

    /// `key`'s partition of `topic` and the key's last [`KEPT`] records in
    /// it, oldest first, decoded once the partition is read; `None` when the
    /// topic does not exist.
    async fn on_topic(
        &self,
        topic: &str,
        key: &str,
        read: &mut u64,
        deadline: &Deadline,
    ) -> Result<Option<(i32, Vec<RecordView>)>, Unread> {
        let mut reader = Reader::new(&self.config.kafka, topic)?;
        let extents = deadline.read(reader.extents()).await?;
        let partition = partition_of(key.as_bytes(), extents.len());
        let Some(extent) = extents.into_iter().find(|e| e.partition == partition) else {
            return Ok(None);
        };
        let mut kept = VecDeque::with_capacity(KEPT + 1);
        if extent.low < extent.high {
            reader.assign(partition, extent.low, extent.high)?;
            while let Some(record) = deadline.read(reader.next()).await? {
                *read += 1;
                if record.key.as_deref() != Some(key) {
                    continue;
                }
                kept.push_back(record);
                if kept.len() > KEPT {
                    kept.pop_front();
                }
            }
        }
        let mut records = Vec::with_capacity(kept.len());
        for record in kept {
            records.push(self.entity_view(record).await);
        }
        Ok(Some((partition, records)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::services::pipeline::Pipeline;

    /// Past the lookups allowed at once, a lookup is told to come back
    /// (503 on the admin listener), not queued behind the others.
    #[tokio::test]
    async fn lookups_past_the_bound_are_told_to_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100))
            .await
            .0;
        let lookup = Lookup::idle(pipeline);
        let held: Vec<_> = (0..LOOKUPS_AT_ONCE)
            .map(|_| lookup.running.try_acquire().unwrap())
            .collect();
        assert!(matches!(
            lookup.delivery("d-1").await,
            Err(LookupError::Busy)
        ));
        assert!(matches!(
            lookup.entity("mekari:P-1").await,
            Err(LookupError::Busy)
        ));
        drop(held);
        let report = lookup.delivery("d-1").await.unwrap();
        assert!(report.found.is_empty());
    }
}
