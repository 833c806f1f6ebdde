//! The Redis ledger's checkpoints: how far the topics are applied, kept in
//! Redis beside what they describe, so a Redis that lost its last writes
//! (restarted from its last snapshot, a replica promoted before it received
//! them) is read from the topics again from there.
//!
//! **The invariant.** An offset is written only after the state of every
//! record below it is committed, and Redis applies writes in order, so any
//! snapshot or replica that holds an offset holds every state below it. A
//! Redis that lost writes lost them *after* the offsets it kept.
//!
//! **Per replica.** Several replicas write into the same partitions, and one
//! replica's safe offset says nothing of another's records (the record at 10
//! may be another replica's, still being committed). So each replica keeps
//! its own, a field of one hash `P{offsets}:replicas` stamped with the
//! server's time, and the ledger's offset of a partition is the lowest of
//! them ([`lowest`]). A replica that stopped leaves its last checkpoint
//! (read from there: harmless) until the others drop it after
//! [`GONE_AFTER`]: that write lands after its last commit, so a Redis
//! without its entry holds its commits. A replica with nothing in flight
//! claims the highest offset any replica had recorded when it last looked
//! ([`claim`]): every record it sends later lies above it, so an idle
//! replica does not hold the offsets back where it started.
//!
//! The hash and `P{offsets}:topics` (the cluster and topics they are of, as
//! JSON) share the hash tag `{offsets}`, so one script writes both on a
//! cluster too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use super::connection::Counted;
use super::generation::Watch;
use super::scripts::CHECKPOINT;
use crate::adapters::ledger::placements::{Offsets, Placed, Placements};
use crate::adapters::ledger::{LedgerError, TopicsSeen};

/// How long a checkpoint waits for the sends of the epoch it sealed to end
/// (as the embedded ledger's): their offsets are counted now, not at the
/// next checkpoint.
const SEAL_WAIT: Duration = Duration::from_millis(200);

/// After how long without a checkpoint a replica's offsets are dropped: it
/// stopped. Longer than a lease (a stopped replica's commits are over) and
/// than many checkpoint intervals; short enough that a replica that stopped
/// does not make every later tail fill read what came since.
pub(super) const GONE_AFTER: Duration = Duration::from_secs(120);

/// Keys and what this replica knows of its offsets.
#[derive(Debug)]
pub(super) struct Checkpoints {
    /// `P{offsets}:replicas`: every replica's offsets.
    offsets_key: String,
    /// `P{offsets}:topics`: the cluster and topics they are of.
    topics_key: String,
    /// This replica's field in the hash, random per process.
    replica: String,
    /// The sends in flight and the offsets committed.
    pub(super) placements: Arc<Placements>,
    /// The cluster and topics a rebuild found, for the next checkpoint.
    seen: Mutex<Option<TopicsSeen>>,
    /// Commits carrying a record's place that failed: until the fence
    /// writes them again, this replica's offsets do not move.
    failed: Mutex<Vec<Placed>>,
    /// One checkpoint at a time (the task's and `persist`'s), with what
    /// the last wrote.
    written: tokio::sync::Mutex<Written>,
    /// Whether the last checkpoint failed, said once per change.
    failing: Mutex<bool>,
}

/// What this replica's checkpoints wrote last.
#[derive(Debug, Default)]
struct Written {
    offsets: Offsets,
    topics: Option<TopicsSeen>,
}

impl Checkpoints {
    pub(super) fn new(prefix: &str) -> Checkpoints {
        Checkpoints {
            offsets_key: format!("{prefix}{{offsets}}:replicas"),
            topics_key: format!("{prefix}{{offsets}}:topics"),
            replica: format!("{:016x}", rand::random::<u64>()),
            placements: Arc::default(),
            seen: Mutex::default(),
            failed: Mutex::default(),
            written: tokio::sync::Mutex::default(),
            failing: Mutex::default(),
        }
    }

    /// A commit was written: its place counts, and stops holding the
    /// offsets if it had failed before.
    pub(super) fn committed(&self, placed: &Placed) {
        self.placements.applied(placed);
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|failed| failed != placed);
    }

    /// A commit carrying `placed` failed: the fence keeps it.
    pub(super) fn failed(&self, placed: &Placed) {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(placed.clone());
    }

    /// What a rebuild read the topics up to, and what they are.
    pub(super) fn restore(&self, offsets: &Offsets, topics: &TopicsSeen) {
        self.placements.restore(offsets);
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(topics.clone());
    }

    /// Everything this replica knew of the topics is forgotten (the keys
    /// are deleted by the caller).
    pub(super) async fn forget(&self) {
        let mut written = self.written.lock().await;
        self.placements.forget();
        *self.seen.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *written = Written::default();
    }

    /// Every replica's offsets, as the hash holds them.
    async fn entries(&self, conn: &Counted) -> Result<Vec<Offsets>, LedgerError> {
        let all: BTreeMap<String, String> = conn.clone().hgetall(&self.offsets_key).await?;
        Ok(all.values().filter_map(|value| decode(value)).collect())
    }

    /// The ledger's offsets: each partition's lowest over the replicas,
    /// and the cluster and topics they are of.
    pub(super) async fn cached(
        &self,
        conn: &Counted,
    ) -> Result<(Offsets, Option<TopicsSeen>), LedgerError> {
        let offsets = lowest(self.entries(conn).await?);
        let topics: Option<String> = conn.clone().get(&self.topics_key).await?;
        // A JSON this version cannot read is taken as none: the offsets
        // alone are judged.
        let topics = topics.and_then(|json| serde_json::from_str(&json).ok());
        Ok((offsets, topics))
    }

    /// One checkpoint: look at the others' offsets, seal the epoch, wait
    /// briefly for its sends, then write what is safe, on the server the
    /// last fill read against only: a server that replaced it (restarted
    /// from a snapshot, promoted) does not hold the states below these
    /// offsets until a fill has read the topics into it.
    pub(super) async fn take(&self, conn: &Counted, watch: &Watch) -> Result<(), LedgerError> {
        let mut written = self.written.lock().await;
        let (generation, suspect) = watch.accepted(conn);
        let (run_ids, replids) = match &generation {
            Some(generation) => generation.ids(),
            // A server that refuses INFO cannot be told from another after
            // a reconnect: nothing is written until a fill.
            None if suspect => return Ok(()),
            None => (String::new(), String::new()),
        };
        let others = highest(self.entries(conn).await?);
        let placements = &self.placements;
        let sealed = placements.seal();
        let deadline = Instant::now() + SEAL_WAIT;
        while !placements.finished(sealed) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let safe = placements.safe(sealed);
        let failed = !self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty();
        let offsets = if failed {
            written.offsets.clone()
        } else {
            claim(safe, &others, placements.finished(u64::MAX))
        };
        let topics = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|topics| written.topics.as_ref() != Some(topics));
        let topics_json = match &topics {
            Some(topics) => serde_json::to_string(topics).unwrap_or_default(),
            None => String::new(),
        };
        let taken: i32 = CHECKPOINT
            .key(&self.offsets_key)
            .key(&self.topics_key)
            .arg(&self.replica)
            .arg(encode(&offsets))
            .arg(u64::try_from(GONE_AFTER.as_millis()).unwrap_or(u64::MAX))
            .arg(topics_json)
            .arg(run_ids)
            .arg(replids)
            .invoke_async(&mut conn.clone())
            .await?;
        if taken == 0 {
            // Another server: the fill that reads against it comes first.
            return Ok(());
        }
        written.offsets = offsets;
        if topics.is_some() {
            written.topics = topics;
        }
        Ok(())
    }

    /// Checkpoints every `every` until `stop`; a failure is said once, and
    /// its working again.
    pub(super) async fn run(
        self: Arc<Self>,
        conn: Counted,
        watch: Arc<Watch>,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            let outcome = self.take(&conn, &watch).await;
            let mut failing = self.failing.lock().unwrap_or_else(PoisonError::into_inner);
            match (&outcome, *failing) {
                (Err(error), false) => tracing::warn!(
                    %error,
                    "The Redis ledger's checkpoint failed: deliveries go on; should Redis lose its last writes meanwhile, the topics are read from the last offsets it recorded."
                ),
                (Ok(()), true) => tracing::info!("The Redis ledger's checkpoints work again."),
                _ => {}
            }
            *failing = outcome.is_err();
        }
    }
}

/// A partition's field name in an entry: its topic and number (a topic's
/// name holds no `/`).
fn field(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

/// An entry as the hash holds it: its offsets as JSON (the script puts the
/// server's time before it).
fn encode(offsets: &Offsets) -> String {
    let fields: BTreeMap<String, i64> = offsets
        .iter()
        .map(|((topic, partition), next)| (field(topic, *partition), *next))
        .collect();
    serde_json::to_string(&fields).unwrap_or_default()
}

/// An entry's offsets; `None` when it is not one this version wrote.
fn decode(value: &str) -> Option<Offsets> {
    let (_at, json) = value.split_once(' ')?;
    let fields: BTreeMap<String, i64> = serde_json::from_str(json).ok()?;
    fields
        .into_iter()
        .map(|(name, next)| {
            let (topic, partition) = name.rsplit_once('/')?;
            Some(((topic.to_owned(), partition.parse().ok()?), next))
        })
        .collect()
}

/// Each partition's lowest offset over the replicas that hold one: every
/// replica's records below it are applied.
pub(super) fn lowest(entries: impl IntoIterator<Item = Offsets>) -> Offsets {
    fold(entries, i64::min)
}

/// Each partition's highest offset over the replicas: below the end of
/// the partition when they were written.
fn highest(entries: impl IntoIterator<Item = Offsets>) -> Offsets {
    fold(entries, i64::max)
}

fn fold(entries: impl IntoIterator<Item = Offsets>, pick: fn(i64, i64) -> i64) -> Offsets {
    let mut folded = Offsets::new();
    for entry in entries {
        for (partition, next) in entry {
            folded
                .entry(partition)
                .and_modify(|held| *held = pick(*held, next))
                .or_insert(next);
        }
    }
    folded
}

/// What this replica claims: its safe offsets, or, when nothing of its is
/// in flight (`idle`, looked at after `others` was read), at least the
/// highest any replica had recorded then: every offset recorded lay below
/// its partition's end, and every record this replica sends from now on
/// lies at or past that end.
pub(super) fn claim(safe: Offsets, others: &Offsets, idle: bool) -> Offsets {
    if !idle {
        return safe;
    }
    highest([safe, others.clone()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(pairs: &[(&str, i32, i64)]) -> Offsets {
        pairs
            .iter()
            .map(|(topic, partition, next)| (((*topic).to_owned(), *partition), *next))
            .collect()
    }

    #[test]
    fn the_ledgers_offset_is_the_lowest_over_the_replicas() {
        let a = offsets(&[("pos.orders", 0, 10), ("pos.orders", 1, 7)]);
        let b = offsets(&[("pos.orders", 0, 4), ("pos.sales", 0, 3)]);
        assert_eq!(
            lowest([a, b]),
            offsets(&[
                ("pos.orders", 0, 4),
                ("pos.orders", 1, 7),
                ("pos.sales", 0, 3)
            ])
        );
        assert_eq!(
            lowest([]),
            Offsets::new(),
            "no replica: read from the start"
        );
    }

    #[test]
    fn an_idle_replica_claims_what_the_others_recorded_a_busy_one_only_its_own() {
        let safe = offsets(&[("pos.orders", 0, 5)]);
        let others = offsets(&[("pos.orders", 0, 40), ("pos.sales", 0, 9)]);
        assert_eq!(claim(safe.clone(), &others, false), safe);
        assert_eq!(
            claim(safe, &others, true),
            offsets(&[("pos.orders", 0, 40), ("pos.sales", 0, 9)])
        );
    }

    #[test]
    fn an_entry_reads_back_what_was_written_and_a_foreign_one_is_none() {
        let written = offsets(&[("pos.orders", 3, 12), ("dead/letters", 0, 2)]);
        let value = format!("1733000000000 {}", encode(&written));
        assert_eq!(decode(&value), Some(written));
        assert_eq!(decode("1733000000000 not json"), None);
        assert_eq!(decode("no time"), None);
    }
}
