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

mod found;
mod verdict;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::adapters::ledger::{Commit, EntitySlot, Gate, Ledger, LedgerError, Offsets};
use crate::adapters::publish::{Described, Publisher, Topics};
use crate::config::KafkaConfig;
use crate::domain::event::EntityType;
use crate::observe::telemetry;
use crate::services::replay::{Extent, ReadError, Reader};
use found::{Found, Summary};
use verdict::{Look, Verdict, judge};

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

/// Whether a fill reads on over what the ledger holds or into an empty one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// The store may hold newer states than the records read: an older
    /// state than the one held is left out (Redis itself refuses one).
    Kept,
    /// The store held nothing of the topics when the fill began.
    Nothing,
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
    /// For the cluster's and the topics' ids, and the partitions it keeps.
    publisher: Publisher,
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
        publisher: Publisher,
        store: Arc<dyn Ledger>,
        gate: Arc<Gate>,
        dedup_ttl: Duration,
    ) -> Rebuild {
        Rebuild {
            kafka: kafka.clone(),
            topics: topics.clone(),
            publisher,
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
            let keeps_offsets = matches!(self.store.cached().await, Ok(Some(_)));
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

    /// One fill: from the stored offsets (whole when they are of other
    /// topics than the cluster's), or whole when the mark is gone.
    async fn once(&self) -> Result<(), RebuildError> {
        let now = OffsetDateTime::now_utc();
        let done_since_ms =
            i64::try_from((now - self.dedup_ttl).unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MIN);
        if let Some(cached) = self.store.cached().await? {
            let look = self.look().await?;
            let (from, before, held) = match judge(&cached, &look) {
                Verdict::Same => (cached.offsets, cached.topics, Held::Kept),
                Verdict::Other(why) => {
                    self.forget(&look, why).await?;
                    (Offsets::new(), None, Held::Nothing)
                }
            };
            let ends = self.fill(&look, &from, done_since_ms, held).await?;
            let seen = look.seen(before.as_ref(), &self.publisher.kept_partitions());
            self.store.restore(&ends, &seen);
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
        let look = self.look().await?;
        self.fill(&look, &Offsets::new(), done_since_ms, Held::Nothing)
            .await?;
        self.store
            .commit(Commit {
                checkpoint: Some((REBUILT.to_owned(), now.unix_timestamp())),
                ..Commit::default()
            })
            .await?;
        Ok(())
    }

    /// The ledger caches other topics than the cluster's (`why`): what it
    /// holds is forgotten, said loudly, and the partitions the topic watch
    /// keeps are the cluster's now.
    async fn forget(&self, look: &Look, why: String) -> Result<(), RebuildError> {
        error!(
            %why,
            "The ledger caches other topics than the cluster holds now: it forgets them (done ids, entity states, offsets, reconciler and replay checkpoints) and is filled again from what the topics hold before any delivery is decided."
        );
        metrics::counter!(telemetry::LEDGER_TOPICS_REPLACED).increment(1);
        self.gate.filled_whole_because(why);
        self.store.forget_topics().await?;
        self.publisher.keep_partitions_anew(&look.partitions());
        Ok(())
    }

    /// What the cluster holds now: its ids (when it gives them) and every
    /// topic's partitions.
    async fn look(&self) -> Result<Look, RebuildError> {
        let names: Vec<String> = self
            .all_topics()
            .into_iter()
            .map(|(topic, _)| topic.to_owned())
            .collect();
        let described = match self.publisher.describe(&names).await {
            Ok(described) => described,
            Err(error) => {
                // Where a broker gives no ids, the offsets alone tell other
                // topics (`verdict`).
                debug!(%error, "The cluster does not describe its topics' ids.");
                Described::default()
            }
        };
        let mut extents_of = BTreeMap::new();
        for name in names {
            let reader = Reader::new(&self.kafka, &name)?;
            extents_of.insert(name, extents(&reader).await?);
        }
        Ok(Look {
            described,
            extents: extents_of,
        })
    }

    /// Reads every partition from `from` (its beginning where it has no
    /// offset) to its end as `look` found it, and commits what it says;
    /// the ends read.
    async fn fill(
        &self,
        look: &Look,
        from: &Offsets,
        done_since_ms: i64,
        held: Held,
    ) -> Result<Offsets, RebuildError> {
        let started = Instant::now();
        let mut plan = Vec::new();
        for (topic, entity_type) in self.all_topics() {
            let reader = Reader::new(&self.kafka, topic)?;
            let ranges: Vec<(Extent, i64)> = look
                .extents
                .get(topic)
                .into_iter()
                .flatten()
                .map(|extent| (*extent, look.start(from, topic, extent)))
                .collect();
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
                self.write(found, held == Held::Kept || written_before)
                    .await?;
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
