//! Rebuilding a lost ledger from the topics.
//!
//! Every entity record posbridge writes carries, in its headers, the state
//! the stale guard compared (`posbridge-version`, `posbridge-state-hash`)
//! and its delivery id; every dead letter its delivery id as its key. The
//! compacted topics therefore hold what the ledger must know: each entity's
//! newest state (the last record of its key, as posbridge only ever writes
//! a newer state) and the recent delivery ids. A ledger that holds no
//! [`REBUILT`] checkpoint is new or was lost (a deleted file or volume, a
//! Redis `FLUSHALL`, a failover to an empty replica): before it answers for
//! anything, it is filled from the topics, then marked.
//!
//! Why deciding a delivery again is safe when its id was not restored (its
//! record older than the dedup window, or its outcome wrote nothing): the
//! entity states are restored, and a retry carries the same body, so the
//! guard finds the same version and state hash (`unchanged`) or a newer one
//! (`stale`): it publishes nothing, exactly as the first decision did.
//!
//! Reading is split from writing: [`Found`] folds records into what the
//! ledger should hold, without I/O; [`rebuild_if_lost`] reads the topics and
//! commits it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use time::OffsetDateTime;
use tracing::{debug, info};

use crate::config::KafkaConfig;
use crate::event::{DeliveryKey, EntityType, ProviderKind};
use crate::ledger::{Commit, EntitySlot, EntityState, Ledger, LedgerError};
use crate::pipeline::{
    HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_STATE_HASH, HEADER_VERSION, state_from_headers,
};
use crate::publish::Topics;
use crate::replay::{Letter, ReadError, Reader};

/// The checkpoint a ledger holds once it was filled from the topics (or
/// found them empty): the unix second it was.
pub const REBUILT: &str = "posbridge:rebuilt-from-topics";

/// How many ledger writes a rebuild keeps in flight: the embedded ledger
/// groups concurrent commits into one durable write.
const WRITES_IN_FLIGHT: usize = 512;

/// Why the ledger could not be rebuilt; start-up stops on it.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// A topic could not be read.
    #[error("reading the topics to rebuild the ledger: {0}")]
    Read(#[from] ReadError),
    /// The ledger refused a write or a read.
    #[error("writing the rebuilt ledger: {0}")]
    Ledger(#[from] LedgerError),
}

/// What a rebuild read and wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Summary {
    /// Records read.
    records: u64,
    /// Entity records without the state headers (written before they
    /// existed): their state is unknown, and left out.
    unknown: u64,
    /// Entity states written.
    entities: u64,
    /// Delivery ids marked done.
    done: u64,
}

/// What the records read so far say the ledger held.
#[derive(Debug, Default)]
struct Found {
    entities: HashMap<EntitySlot, EntityState>,
    done: HashSet<DeliveryKey>,
    records: u64,
    unknown: u64,
}

impl Found {
    /// An entity record of `entity_type`'s topic. Its delivery id counts
    /// as done when its record time is at or after `done_since_ms`.
    fn entity_record(&mut self, entity_type: EntityType, record: &Letter, done_since_ms: i64) {
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
            .is_none_or(|held| held.version <= state.version);
        if newer {
            self.entities.insert(slot, state);
        }
        if recent(record, done_since_ms)
            && let Some(provider) = record.header(HEADER_PROVIDER).and_then(ProviderKind::parse)
            && let Some(delivery) = record.header(HEADER_DELIVERY_ID)
        {
            self.done.insert(DeliveryKey::new(provider, delivery));
        }
    }

    /// A dead letter: its key is its delivery, done when recent.
    fn dead_letter(&mut self, record: &Letter, done_since_ms: i64) {
        self.records += 1;
        if recent(record, done_since_ms)
            && let Some(key) = &record.key
        {
            self.done.insert(DeliveryKey::from_stored(key.clone()));
        }
    }

    /// What was found, in figures.
    fn summary(&self) -> Summary {
        Summary {
            records: self.records,
            unknown: self.unknown,
            entities: self.entities.len() as u64,
            done: self.done.len() as u64,
        }
    }

    /// The commits that write it into a ledger: every entity state, then
    /// every done id.
    fn into_commits(self) -> impl Iterator<Item = Commit> {
        let entities = self.entities.into_iter().map(|(slot, state)| Commit {
            entity: Some((slot, state)),
            ..Commit::default()
        });
        let done = self.done.into_iter().map(|delivery| Commit {
            delivery: Some(delivery),
            ..Commit::default()
        });
        entities.chain(done)
    }
}

fn recent(record: &Letter, done_since_ms: i64) -> bool {
    record.timestamp_ms.is_some_and(|at| at >= done_since_ms)
}

/// Whether `ledger` holds the [`REBUILT`] mark: start-up waits for Kafka
/// as long as it can when it does not, since the rebuild needs Kafka.
///
/// # Errors
/// [`LedgerError`] when the ledger cannot be read.
pub async fn is_marked(ledger: &dyn Ledger) -> Result<bool, LedgerError> {
    Ok(ledger.checkpoint(REBUILT).await?.is_some())
}

/// Fills `ledger` from the topics unless it holds the [`REBUILT`] mark,
/// then sets the mark. A ledger known to hold state (one written before the
/// mark existed) is marked without reading. With several replicas on one
/// Redis, one rebuilds under a lock in the ledger and the others wait for
/// it, then find the mark.
///
/// # Errors
/// [`RebuildError`] when a topic cannot be read or the ledger written; the
/// mark is then not set, so the next start rebuilds again (the writes are
/// idempotent: a state is never replaced by an older one).
pub async fn rebuild_if_lost(
    kafka: &KafkaConfig,
    topics: &Topics,
    ledger: &dyn Ledger,
    dedup_ttl: Duration,
) -> Result<(), RebuildError> {
    if is_marked(ledger).await? {
        return Ok(());
    }
    let _lock = ledger
        .lock_entity(&EntitySlot::of_record_key(EntityType::Sale, REBUILT))
        .await?;
    if is_marked(ledger).await? {
        return Ok(());
    }
    let now = OffsetDateTime::now_utc();
    if ledger.may_be_empty().await? {
        rebuild(kafka, topics, ledger, now - dedup_ttl).await?;
    } else {
        info!(
            "The ledger holds state from before it was marked as filled from the topics: marked, not read again."
        );
    }
    ledger
        .commit(Commit {
            checkpoint: Some((REBUILT.to_owned(), now.unix_timestamp())),
            ..Commit::default()
        })
        .await?;
    Ok(())
}

/// Reads the topics into `ledger`: each key's newest state, and the
/// delivery ids of records stamped at or after `done_since`.
async fn rebuild(
    kafka: &KafkaConfig,
    topics: &Topics,
    ledger: &dyn Ledger,
    done_since: OffsetDateTime,
) -> Result<(), RebuildError> {
    info!(
        "The ledger holds no record of being filled from the topics (it is new, or was lost): rebuilding it from them before taking deliveries."
    );
    let started = Instant::now();
    let done_since_ms =
        i64::try_from(done_since.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MIN);
    let mut found = Found::default();
    for entity_type in EntityType::ALL {
        read_topic(kafka, topics.entity(entity_type), |record| {
            found.entity_record(entity_type, record, done_since_ms);
        })
        .await?;
    }
    read_topic(kafka, topics.dead_letter(), |record| {
        found.dead_letter(record, done_since_ms);
    })
    .await?;
    let summary = found.summary();
    let mut written = futures::stream::iter(found.into_commits())
        .map(|commit| ledger.commit(commit))
        .buffer_unordered(WRITES_IN_FLIGHT);
    while let Some(result) = written.next().await {
        result?;
    }
    info!(
        records = summary.records,
        without_state = summary.unknown,
        entities = summary.entities,
        done_ids = summary.done,
        secs = started.elapsed().as_secs_f64(),
        "Ledger rebuilt from the topics."
    );
    Ok(())
}

/// Every record of `topic` up to its end now, partition by partition;
/// nothing for a topic that does not exist.
async fn read_topic(
    kafka: &KafkaConfig,
    topic: &str,
    mut each: impl FnMut(&Letter),
) -> Result<(), ReadError> {
    let mut reader = Reader::new(kafka, topic)?;
    // A topic created a moment ago (this start, or a replica's beside it)
    // may have partitions without a leader yet: asked again for a while.
    let extents = (|| reader.extents())
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(2))
                .with_max_times(15),
        )
        .when(|error| matches!(error, ReadError::Broker { .. }))
        .notify(|error: &ReadError, wait: Duration| {
            debug!(%error, ?wait, "A topic's partitions cannot be read yet; asking again.");
        })
        .sleep(tokio::time::sleep)
        .await?;
    for extent in extents {
        if extent.low >= extent.high {
            continue;
        }
        reader.assign(extent.partition, extent.low, extent.high)?;
        while let Some(record) = reader.next().await? {
            each(&record);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Version;

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
    fn the_newest_state_of_each_key_and_the_recent_delivery_ids_are_found() {
        let mut found = Found::default();
        found.entity_record(
            EntityType::Order,
            &record("mekari:O-1", "d1", 10, 0, 1, 500),
            1000,
        );
        found.entity_record(
            EntityType::Order,
            &record("mekari:O-1", "d2", 20, 0, 2, 1500),
            1000,
        );
        // A compacted topic keeps the newest; an older one after it (never
        // written by posbridge) does not roll it back.
        found.entity_record(
            EntityType::Order,
            &record("mekari:O-1", "d0", 5, 0, 9, 1600),
            1000,
        );
        found.entity_record(
            EntityType::Product,
            &record("mekari:O-1", "d3", 1, 0, 3, 2000),
            1000,
        );
        let mut old = record("mekari:O-2", "d4", 1, 0, 4, 2000);
        old.headers.remove(HEADER_VERSION);
        found.entity_record(EntityType::Order, &old, 1000);
        let mut letter = record("mekari:d5", "d5", 0, 0, 0, 2000);
        letter.headers.clear();
        found.dead_letter(&letter, 1000);

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
                c.entity
                    .as_ref()
                    .filter(|(slot, _)| slot.as_str() == "orders/mekari:O-1")
            })
            .unwrap();
        assert_eq!(
            order.1.version,
            Version {
                at_micros: 20,
                rank: 0
            }
        );
        let mut done: Vec<&str> = commits
            .iter()
            .filter_map(|c| c.delivery.as_ref().map(DeliveryKey::as_str))
            .collect();
        done.sort_unstable();
        assert_eq!(done, ["mekari:d0", "mekari:d2", "mekari:d3", "mekari:d5"]);
    }

    /// A ledger written before the mark existed is marked without reading
    /// the topics (an upgrade costs no read): the broker here answers nothing,
    /// so any read would fail the call.
    #[tokio::test]
    async fn a_ledger_that_holds_state_is_marked_without_reading_the_topics() {
        use crate::ledger::EmbeddedLedger;
        let dir = tempfile::tempdir().unwrap();
        let ledger = EmbeddedLedger::open(
            &dir.path().join("ledger.redb"),
            Duration::from_secs(3600),
            Duration::from_secs(30),
        )
        .unwrap();
        ledger
            .commit(Commit {
                delivery: Some(DeliveryKey::new(ProviderKind::Mekari, "d-1")),
                ..Commit::default()
            })
            .await
            .unwrap();
        let kafka = KafkaConfig {
            brokers: "127.0.0.1:1".into(),
            ..KafkaConfig::default()
        };
        rebuild_if_lost(
            &kafka,
            &Topics::new(&kafka),
            &ledger,
            Duration::from_secs(3600),
        )
        .await
        .unwrap();
        assert!(is_marked(&ledger).await.unwrap());
    }
}
