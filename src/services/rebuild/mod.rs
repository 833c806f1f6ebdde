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
//! * Redis likewise, from the lowest offsets its replicas recorded, at
//!   every start and whenever the server may have lost its last writes
//!   (restarted from a snapshot, a replica promoted: [`Fill::kept_writes`],
//!   asked every second and before a decision after a reconnect); read
//!   whole when its [`GenerationMark`] is missing: new, or lost
//!   (`FLUSHALL`, a failover to an empty replica). With several replicas,
//!   one fills it whole under the ledger's [`RebuildLock`](crate::adapters::ledger::RebuildLock)
//!   and the others wait for it, then read on from its offsets.
//!
//! **A fill proves what it wrote survived** ([`Proof`]): a store flushed in
//! the middle of a fill holds only what came after it, so a fill whose
//! token (or, reading on over a marked store, whose mark) is gone starts
//! again instead of marking the store filled.
//!
//! **Done ids** are restored from records stamped within `dedup_ttl`. Why
//! deciding a delivery again is safe when its id was not restored (its
//! record older than the dedup window, or its outcome wrote nothing, as a
//! stale or unchanged event does): the entity states are restored, and a
//! retry carries the same body, so the guard finds the same version and
//! state hash (`unchanged`) or a newer one (`stale`): it publishes nothing,
//! exactly as the first decision did.
//!
//! **Memory** is bounded whatever a partition holds: [`Found`] folds at
//! most [`FOLD_AT_MOST`] records before what they say is written, and the
//! fill reads on. A key's later records overwrite what its earlier ones
//! wrote, which is right because posbridge writes a newer state of a key
//! only at a later offset; a state older than one written before (never
//! written by posbridge, or a key in two partitions of a topic that grew)
//! is left out by the store (Redis compares versions) or by a read of the
//! held state first (the embedded store).
//!
//! Reading is split from writing: [`Found`] folds records into what the
//! ledger should hold, without I/O; [`Rebuild`] reads the topics and
//! commits it.

mod found;
mod source;
#[cfg(test)]
mod tests;
mod verdict;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::adapters::ledger::{
    Commit, Fill, FillToken, Gate, Ledger, LedgerError, Offsets, TopicsSeen,
};
use crate::adapters::publish::TopicSets;
use crate::domain::event::EntityType;
use crate::observe::telemetry;
use crate::services::replay::{Extent, ReadError};
use found::{Found, Summary};
pub use source::{Kafka, TopicRead, TopicSource};
use verdict::{Look, Verdict, judge};

/// How many ledger writes a rebuild keeps in flight (a Redis round trip
/// each).
const WRITES_IN_FLIGHT: usize = 512;

/// Commits after which a rebuild makes the ledger durable, so memory stays
/// bounded however many entities the topics hold.
const PERSIST_EVERY: usize = 50_000;

/// Records a fill folds before it writes what they say: what memory holds
/// of a partition, whatever its size (10 M entities of one partition,
/// folded whole before writing, would not fit a small pod). In unit tests
/// a handful: the simulation drives the real rebuild, and its fills then
/// write each partition in several batches.
#[cfg(not(test))]
const FOLD_AT_MOST: u64 = 20_000;
#[cfg(test)]
const FOLD_AT_MOST: u64 = 3;

/// How often the store is asked whether it still holds every write made
/// to it ([`Fill::kept_writes`]: on Redis its generation mark, which a
/// cluster's scripts cannot look at, and the server's generation).
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Commits after which a fill looks whether what it wrote is still there,
/// so a store flushed early in a long fill starts it again early.
const PROOF_EVERY: usize = 10_000;

/// Why the ledger could not be rebuilt; tried again with a growing wait.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// A topic could not be read.
    #[error("reading the topics to rebuild the ledger: {0}")]
    Read(#[from] ReadError),
    /// The ledger refused a write or a read.
    #[error("writing the rebuilt ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The store lost what the fill wrote (its token or its mark is gone:
    /// a `FLUSHALL` in the middle of it): the fill starts again.
    #[error("the ledger lost what the fill wrote so far")]
    Flushed,
}

/// What proves that what a fill wrote is still in the store when it ends:
/// a store flushed in the middle of a fill holds only what came after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    /// The generation mark, there when the fill began (it reads on over
    /// what the store holds): gone, the store lost its keys.
    Mark,
    /// A random token this fill wrote when it began, for a store without
    /// the mark: the fill writes the mark only if its token is still there.
    Token(FillToken),
}

impl Proof {
    /// The proof of a fill that begins now, written when it is a token.
    async fn begin(store: &Fill<'_>) -> Result<Proof, LedgerError> {
        if store.generation_mark().await?.is_some() {
            return Ok(Proof::Mark);
        }
        Ok(Proof::Token(store.begin_fill().await?))
    }

    /// Whether what the fill wrote is still there.
    async fn holds(self, store: &Fill<'_>) -> Result<(), RebuildError> {
        let holds = match self {
            Proof::Mark => store.generation_mark().await?.is_some(),
            Proof::Token(token) => store.fill_token().await? == Some(token),
        };
        if holds {
            Ok(())
        } else {
            Err(RebuildError::Flushed)
        }
    }
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

/// What a fill wrote so far.
#[derive(Debug, Default)]
struct Written {
    /// In figures, for its log line.
    summary: Summary,
    /// Commits made, for when to make them durable.
    commits: usize,
}

/// The rebuild of one ledger: what it reads and where it writes.
pub struct Rebuild {
    /// The topics' records, the cluster's and the topics' ids, and the
    /// partitions the topic watch keeps.
    source: Arc<dyn TopicSource>,
    topics: TopicSets,
    /// The ledger, used through its fill's calls (not behind the gate).
    ledger: Arc<Ledger>,
    gate: Arc<Gate>,
    dedup_ttl: Duration,
}

impl Rebuild {
    /// A rebuild of `ledger` from `topics` read from `source`, behind `gate`.
    pub fn new(
        source: Arc<dyn TopicSource>,
        topics: &TopicSets,
        ledger: Arc<Ledger>,
        gate: Arc<Gate>,
        dedup_ttl: Duration,
    ) -> Rebuild {
        Rebuild {
            source,
            topics: topics.clone(),
            ledger,
            gate,
            dedup_ttl,
        }
    }

    /// Fills the ledger now, tried again with a growing wait until it
    /// works, then opens the gate; then watches whether the store still
    /// holds what was written to it, and fills it again when it was found
    /// lost. Until `stop`.
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
            let losses = tokio::select! {
                () = stop.cancelled() => return,
                filled = filled => filled,
            };
            if let Ok(losses) = losses {
                // A server that changed while it was read without dropping
                // the connection (a failover on one address) is read again
                // before anything is decided on it.
                if let Err(error @ (LedgerError::Lost | LedgerError::Changed { .. })) =
                    self.ledger.fill().kept_writes().await
                {
                    warn!(%error, "The ledger changed while it was filled: it is read again.");
                    continue;
                }
                if !self.gate.end_filled(losses) {
                    continue;
                }
            }
            metrics::gauge!(telemetry::REBUILD_RUNNING).set(0.0);
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    // A loss found before this fill began was read by it:
                    // its notice, left over, finds the gate still open.
                    () = self.gate.lost() => if !self.gate.is_open() {
                        break;
                    },
                    () = tokio::time::sleep(WATCH_EVERY) => {
                        match self.ledger.fill().kept_writes().await {
                            Err(error @ (LedgerError::Lost | LedgerError::Changed { .. })) => {
                                self.gate.found_lost(&error);
                                break;
                            }
                            // A store that does not answer decides nothing
                            // either; it is asked again.
                            Err(error) => debug!(%error, "The ledger cannot be watched now."),
                            Ok(()) => {}
                        }
                    }
                }
            }
        }
    }

    /// One fill, started again from the top while the store loses what it
    /// wrote (said once per restart); how many times the gate had found the
    /// ledger lost when the last attempt began ([`Gate::end_filled`]).
    async fn once(&self) -> Result<u64, RebuildError> {
        loop {
            let losses = self.gate.losses();
            match self.attempt().await {
                Err(RebuildError::Flushed) => {
                    self.gate.restarted();
                    warn!(
                        "The ledger lost what the fill had written (flushed in the middle of it): the fill starts again."
                    );
                }
                done => return done.map(|()| losses),
            }
        }
    }

    /// One fill: from the stored offsets (whole when they are of other
    /// topics than the cluster's), or whole, one replica at a time, when
    /// the store holds nothing it can vouch for (a Redis without its mark).
    async fn attempt(&self) -> Result<(), RebuildError> {
        let now = OffsetDateTime::now_utc();
        let done_since_ms =
            i64::try_from((now - self.dedup_ttl).unix_timestamp_nanos() / 1_000_000)
                .unwrap_or(i64::MIN);
        if let Some(cached) = self.ledger.fill().cached().await? {
            let look = self.look().await?;
            let (from, before, held) = match judge(&cached, &look) {
                Verdict::Same => (cached.offsets, cached.topics, Held::Kept),
                Verdict::Other(why) => {
                    self.forget(&look, why).await?;
                    (Offsets::new(), None, Held::Nothing)
                }
            };
            let proof = Proof::begin(&self.ledger.fill()).await?;
            let ends = self.fill(&look, &from, done_since_ms, held, proof).await?;
            let seen = look.seen(before.as_ref(), &self.source.kept_partitions());
            return self.finish(&ends, &seen, proof, now).await;
        }
        let _lock = self.ledger.fill().rebuild_lock().await?;
        if self.ledger.fill().generation_mark().await?.is_some() {
            // Another replica filled it meanwhile: read on from its offsets.
            return Box::pin(self.attempt()).await;
        }
        info!(
            "The ledger holds no generation mark (it is new, or lost its keys): filling it from the topics before deciding deliveries."
        );
        let look = self.look().await?;
        let proof = Proof::begin(&self.ledger.fill()).await?;
        let ends = self
            .fill(&look, &Offsets::new(), done_since_ms, Held::Nothing, proof)
            .await?;
        let seen = look.seen(None, &self.source.kept_partitions());
        self.finish(&ends, &seen, proof, now).await
    }

    /// The end of a fill: what it read up to is recorded and made durable;
    /// then, if what it wrote is still there, the mark (when the fill had to
    /// write a token: a store whose mark was there keeps it).
    async fn finish(
        &self,
        ends: &Offsets,
        seen: &TopicsSeen,
        proof: Proof,
        now: OffsetDateTime,
    ) -> Result<(), RebuildError> {
        self.ledger.fill().restore(ends, seen);
        self.ledger.fill().persist().await?;
        proof.holds(&self.ledger.fill()).await?;
        if let Proof::Token(_) = proof {
            self.ledger
                .fill()
                .mark_generation(now.unix_timestamp())
                .await?;
            self.ledger.fill().persist().await?;
        }
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
        self.ledger.fill().forget_topics().await?;
        self.source.keep_partitions_anew(&look.partitions());
        Ok(())
    }

    /// What the cluster holds now: its ids (when it gives them) and every
    /// topic's partitions.
    async fn look(&self) -> Result<Look, RebuildError> {
        let names: Vec<String> = self
            .all_topics()
            .into_iter()
            .map(|(topic, _)| topic)
            .collect();
        let described = self.source.describe(&names).await;
        let mut extents_of = BTreeMap::new();
        for name in names {
            let reader = self.source.reader(&name)?;
            extents_of.insert(name, extents(reader.as_ref()).await?);
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
        proof: Proof,
    ) -> Result<Offsets, RebuildError> {
        let started = Instant::now();
        let mut plan = Vec::new();
        for (topic, entity_type) in self.all_topics() {
            let reader = self.source.reader(&topic)?;
            let ranges: Vec<(Extent, i64)> = look
                .extents
                .get(&topic)
                .into_iter()
                .flatten()
                .map(|extent| (*extent, look.start(from, &topic, extent)))
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
        let mut written = Written::default();
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
                                found.entity_record((&topic, entity_type), &record, done_since_ms);
                            }
                            None => found.dead_letter(&topic, &record, done_since_ms),
                        }
                        self.gate.read(1, false);
                        read_counter.increment(1);
                        left -= 1;
                        if left % 1024 == 0 {
                            remaining.set(left as f64);
                        }
                        if found.records() >= FOLD_AT_MOST {
                            self.write(std::mem::take(&mut found), held, &mut written, proof)
                                .await?;
                        }
                    }
                }
                self.write(found, held, &mut written, proof).await?;
                proof.holds(&self.ledger.fill()).await?;
                self.gate.read(0, true);
            }
        }
        remaining.set(0.0);
        let summary = written.summary;
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
    fn all_topics(&self) -> Vec<(String, Option<EntityType>)> {
        self.topics
            .all()
            .iter()
            .flat_map(|set| {
                set.typed()
                    .map(|(topic, entity_type)| (topic.to_owned(), entity_type))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Commits what was found (a partition's records, or the last
    /// [`FOLD_AT_MOST`] of them) in chunks of [`PROOF_EVERY`], looking after
    /// each whether what was written is still there, and making the fill's
    /// commits durable every [`PERSIST_EVERY`]. Between chunks nothing is in
    /// flight: a Redis command awaited while commits wait unpolled in the
    /// stream timed out (redis-rs queues requests in a bounded channel whose
    /// free places go to the waiters in order, and those waiters are not
    /// polled until the loop goes on).
    ///
    /// A state older than the one the store holds is left out where the
    /// store may hold a newer one: a fill over what the store kept, or once
    /// this fill wrote states (a key's earlier batch; a key in two
    /// partitions of a topic that grew). A store that refuses older states
    /// itself is not asked first.
    async fn write(
        &self,
        found: Found,
        held: Held,
        written: &mut Written,
        proof: Proof,
    ) -> Result<(), RebuildError> {
        let store = &self.ledger.fill();
        let check_held =
            !store.refuses_older_states() && (held == Held::Kept || written.summary.entities > 0);
        written.summary.add(found.summary());
        let mut commits = found.into_commits();
        loop {
            let chunk: Vec<Commit> = commits.by_ref().take(PROOF_EVERY).collect();
            if chunk.is_empty() {
                return Ok(());
            }
            let before = written.commits;
            let mut commits_made = futures::stream::iter(chunk)
                .map(|commit| async move {
                    if check_held
                        && let Some((slot, state)) = commit.entity()
                        && let Some(held) = store.entity(slot).await?
                        && held.state.version > state.state.version
                    {
                        return Ok(());
                    }
                    store.commit(commit).await
                })
                .buffer_unordered(WRITES_IN_FLIGHT);
            while let Some(result) = commits_made.next().await {
                result?;
                written.commits += 1;
            }
            if before / PERSIST_EVERY != written.commits / PERSIST_EVERY {
                store.persist().await?;
            }
            proof.holds(store).await?;
        }
    }
}

/// A topic's partitions; none for a topic that does not exist.
async fn extents(reader: &dyn TopicRead) -> Result<Vec<Extent>, ReadError> {
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
