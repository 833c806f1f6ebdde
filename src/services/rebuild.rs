//! Filling the ledger from the topics, which are the record.
//!
//! Every entity record posbridge writes carries, in its headers, the state
//! the stale guard compared (`posbridge-version`, `posbridge-state-hash`)
//! and its delivery id; every dead letter its delivery id as its key. The
//! topics therefore hold what the ledger must know: each entity's newest
//! state (posbridge only ever writes a newer state of a key) and the recent
//! delivery ids. Records written before these headers existed have no known
//! state: they are counted, and left out.
//!
//! **When.** At every start, and whenever the ledger is found lost while
//! serving, the ledger's [`Gate`] is closed while it is filled:
//! * a store that records offsets (embedded) is read from its last
//!   checkpoint's offsets to the end of each partition (a partition it has
//!   no offset for, from its beginning: a new or lost file reads
//!   everything), then checkpointed;
//! * a store whose commits are durable when made (Redis) is read whole
//!   only when its generation mark ([`REBUILT`]) is missing: new, or lost
//!   (`FLUSHALL`, a failover to an empty replica). With several replicas,
//!   one rebuilds under a lock in the ledger and the others wait for it,
//!   then find the mark.
//!
//! **Done ids** are restored from records stamped within `dedup_ttl`. Why
//! deciding a delivery again is safe when its id was not restored (its
//! record older than the dedup window, or its outcome wrote nothing, as a
//! stale or unchanged event does): the entity states are restored, and a
//! retry carries the same body, so the guard finds the same version and
//! state hash (`unchanged`) or a newer one (`stale`): it publishes nothing,
//! exactly as the first decision did.
//!
//! Reading is split from writing: [`Found`] folds records into what the
//! ledger should hold, without I/O; [`Rebuild`] reads the topics and
//! commits it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::adapters::ledger::{Commit, EntitySlot, Gate, Ledger, LedgerError, Offsets};
use crate::adapters::publish::Topics;
use crate::config::KafkaConfig;
use crate::domain::event::{DeliveryKey, EntityType, ProviderKind};
use crate::domain::guard::EntityState;
use crate::observe::telemetry;
use crate::services::pipeline::{
    HEADER_DELIVERY_ID, HEADER_PROVIDER, HEADER_STATE_HASH, HEADER_VERSION, state_from_headers,
};
use crate::services::replay::{Extent, Letter, ReadError, Reader};

/// The generation mark: the unix second the store was last filled.
const REBUILT: &str = crate::adapters::ledger::GENERATION_MARK;

/// How many ledger writes a rebuild keeps in flight (a Redis round trip
/// each).
const WRITES_IN_FLIGHT: usize = 512;

/// Commits after which a rebuild makes the ledger durable, so memory stays
/// bounded however many entities the topics hold.
const PERSIST_EVERY: usize = 50_000;

/// How often a store without offsets is asked whether its mark is still
/// there (a Redis Cluster, whose scripts cannot look at it: one server's
/// scripts see it with every lease and guard read).
const MARK_CHECK: Duration = Duration::from_secs(5);

/// Why the ledger could not be rebuilt; tried again with a growing wait.
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

impl Summary {
    fn add(&mut self, other: Summary) {
        self.records += other.records;
        self.unknown += other.unknown;
        self.entities += other.entities;
        self.done += other.done;
    }
}

/// What the records of one partition say the ledger held.
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

/// Whether `ledger` holds the [`REBUILT`] mark.
///
/// # Errors
/// [`LedgerError`] when the ledger cannot be read.
pub async fn is_marked(ledger: &dyn Ledger) -> Result<bool, LedgerError> {
    Ok(ledger.checkpoint(REBUILT).await?.is_some())
}

/// The rebuild of one ledger: what it reads and where it writes.
pub struct Rebuild {
    kafka: KafkaConfig,
    topics: Topics,
    /// The store itself (not behind the gate).
    store: Arc<dyn Ledger>,
    gate: Arc<Gate>,
    dedup_ttl: Duration,
}

impl Rebuild {
    /// A rebuild of `store` from `topics`, behind `gate`.
    pub fn new(
        kafka: &KafkaConfig,
        topics: &Topics,
        store: Arc<dyn Ledger>,
        gate: Arc<Gate>,
        dedup_ttl: Duration,
    ) -> Rebuild {
        Rebuild {
            kafka: kafka.clone(),
            topics: topics.clone(),
            store,
            gate,
            dedup_ttl,
        }
    }

    /// Fills the ledger now, tried again with a growing wait until it
    /// works, then opens the gate; then waits for the ledger to be found
    /// lost, and fills it again. Until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            metrics::gauge!(telemetry::REBUILD_RUNNING).set(1.0);
            let filled = (|| self.once())
                .retry(
                    ExponentialBuilder::default()
                        .with_min_delay(Duration::from_secs(1))
                        .with_max_delay(Duration::from_secs(30))
                        .without_max_times(),
                )
                .notify(|error: &RebuildError, wait: Duration| {
                    self.gate.end(Err(error.to_string()));
                    warn!(%error, ?wait, "The ledger cannot be filled from the topics yet; deliveries wait (sources that spool take them), and it is tried again.");
                })
                .sleep(tokio::time::sleep);
            tokio::select! {
                () = stop.cancelled() => return,
                filled = filled => if filled.is_ok() { self.gate.end(Ok(())) },
            }
            metrics::gauge!(telemetry::REBUILD_RUNNING).set(0.0);
            let keeps_offsets = matches!(self.store.stored_offsets().await, Ok(Some(_)));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.gate.lost() => break,
                    () = tokio::time::sleep(MARK_CHECK), if !keeps_offsets => {
                        if let Ok(false) = is_marked(self.store.as_ref()).await {
                            self.gate.found_lost();
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One fill: from the stored offsets, or whole when the mark is gone.
    async fn once(&self) -> Result<(), RebuildError> {
        let now = OffsetDateTime::now_utc();
        let done_since_ms =
            i64::try_from((now - self.dedup_ttl).unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MIN);
        if let Some(offsets) = self.store.stored_offsets().await? {
            let ends = self.fill(&offsets, done_since_ms, true).await?;
            self.store.restore_offsets(&ends);
            self.store
                .commit(Commit {
                    checkpoint: Some((REBUILT.to_owned(), now.unix_timestamp())),
                    ..Commit::default()
                })
                .await?;
            self.store.persist().await?;
            return Ok(());
        }
        if is_marked(self.store.as_ref()).await? {
            return Ok(());
        }
        let _lock = self
            .store
            .lock_entity(&EntitySlot::of_record_key(EntityType::Sale, REBUILT))
            .await?;
        if is_marked(self.store.as_ref()).await? {
            return Ok(());
        }
        info!(
            "The ledger holds no generation mark (it is new, or lost its keys): filling it from the topics before deciding deliveries."
        );
        self.fill(&Offsets::new(), done_since_ms, false).await?;
        self.store
            .commit(Commit {
                checkpoint: Some((REBUILT.to_owned(), now.unix_timestamp())),
                ..Commit::default()
            })
            .await?;
        Ok(())
    }

    /// Reads every partition from `from` (its beginning where it has no
    /// offset) to its end now, and commits what it says; the ends read.
    /// With `check_held`, a state older than the one held is left out
    /// (the store may hold newer ones than the records read; Redis itself
    /// refuses an older state).
    async fn fill(
        &self,
        from: &Offsets,
        done_since_ms: i64,
        check_held: bool,
    ) -> Result<Offsets, RebuildError> {
        let started = Instant::now();
        let mut plan = Vec::new();
        for (topic, entity_type) in self.all_topics() {
            let reader = Reader::new(&self.kafka, topic)?;
            let mut ranges = Vec::new();
            for extent in extents(&reader).await? {
                let start = from
                    .get(&(topic.to_owned(), extent.partition))
                    .map_or(extent.low, |next| (*next).clamp(extent.low, extent.high));
                ranges.push((extent, start));
            }
            plan.push((topic, entity_type, reader, ranges));
        }
        let partitions: usize = plan.iter().map(|(_, _, _, ranges)| ranges.len()).sum();
        let to_read: i64 = plan
            .iter()
            .flat_map(|(_, _, _, ranges)| ranges)
            .map(|(extent, start)| extent.high - start)
            .sum();
        self.gate
            .begin(partitions as u64, u64::try_from(to_read).unwrap_or(0));
        let remaining = metrics::gauge!(telemetry::REBUILD_REMAINING);
        let read_counter = metrics::counter!(telemetry::REBUILD_RECORDS);
        let mut left = to_read;
        remaining.set(left as f64);
        let mut summary = Summary::default();
        let mut ends = Offsets::new();
        for (topic, entity_type, mut reader, ranges) in plan {
            for (extent, start) in ranges {
                ends.insert((topic.to_owned(), extent.partition), extent.high);
                let mut found = Found::default();
                if start < extent.high {
                    reader.assign(extent.partition, start, extent.high)?;
                    while let Some(record) = reader.next().await? {
                        match entity_type {
                            Some(entity_type) => {
                                found.entity_record(entity_type, &record, done_since_ms);
                            }
                            None => found.dead_letter(&record, done_since_ms),
                        }
                        self.gate.read(1, false);
                        read_counter.increment(1);
                        left -= 1;
                        if left % 1024 == 0 {
                            remaining.set(left as f64);
                        }
                    }
                }
                // A key's records are in one partition, so what it found
                // is written before the next is read: memory holds one
                // partition's states, not every topic's. Only a topic whose
                // partitions grew has a key in two: once states are
                // written, an older state than the one written is left out.
                let written_before = summary.entities > 0;
                summary.add(found.summary());
                self.write(found, check_held || written_before).await?;
                self.gate.read(0, true);
            }
        }
        remaining.set(0.0);
        if summary.records > 0 || from.is_empty() {
            info!(
                records = summary.records,
                without_state = summary.unknown,
                entities = summary.entities,
                done_ids = summary.done,
                secs = started.elapsed().as_secs_f64(),
                "Ledger filled from the topics."
            );
        }
        Ok(ends)
    }

    /// Every topic posbridge writes, with its entity type (none: the
    /// dead-letter topic).
    fn all_topics(&self) -> Vec<(&str, Option<EntityType>)> {
        EntityType::ALL
            .into_iter()
            .map(|t| (self.topics.entity(t), Some(t)))
            .chain([(self.topics.dead_letter(), None)])
            .collect()
    }

    /// Commits what was found, made durable every [`PERSIST_EVERY`].
    async fn write(&self, found: Found, check_held: bool) -> Result<(), RebuildError> {
        let store = self.store.as_ref();
        let mut written = futures::stream::iter(found.into_commits())
            .map(|commit| async move {
                if check_held
                    && let Some((slot, state)) = &commit.entity
                    && let Some(held) = store.entity(slot).await?
                    && held.version > state.version
                {
                    return Ok(());
                }
                store.commit(commit).await
            })
            .buffer_unordered(WRITES_IN_FLIGHT);
        let mut count = 0;
        while let Some(result) = written.next().await {
            result?;
            count += 1;
            if count % PERSIST_EVERY == 0 {
                store.persist().await?;
            }
        }
        Ok(())
    }
}

/// A topic's partitions; none for a topic that does not exist.
async fn extents(reader: &Reader) -> Result<Vec<Extent>, ReadError> {
    // A topic created a moment ago (this start, or a replica's beside it)
    // may have partitions without a leader yet: asked again for a while.
    (|| reader.extents())
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
        .await
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
}
