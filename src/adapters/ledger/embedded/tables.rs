//! What the ledger file holds, its tables as one read transaction sees
//! them, and the one write transaction every checkpoint goes through (with
//! the sweep that forgets expired done ids a few at a time).

use std::ops::Bound;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::adapters::ledger::placements::Offsets;
use crate::adapters::ledger::{Answered, TopicsSeen};

/// One write the ledger makes. Ordered by kind, then key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Write<'a> {
    /// A delivery id done: its stored value ([`done_value`]).
    Done(&'a str, &'a [u8]),
    /// An entity slot's stored state (`EntityState::to_bytes`).
    Entity(&'a str, [u8; 36]),
    /// A reconciler checkpoint and its unix second.
    Checkpoint(&'a str, i64),
}

/// Done delivery ids → the unix second they may be forgotten (8 bytes,
/// big-endian) and what they were answered ([`Answered::to_bytes`]): one
/// value under the id, so remembering the answer costs no second index.
pub(super) const DONE: TableDefinition<&str, &[u8]> = TableDefinition::new("deliveries");
/// Done delivery ids → unix second they may be forgotten, as earlier
/// versions kept them: moved into [`DONE`] when a file is opened, with an
/// outcome unknown.
pub(super) const OLD_DONE: TableDefinition<&str, u64> = TableDefinition::new("done_deliveries");
/// An index of done ids by expiry that earlier versions kept for the purge;
/// dropped when a file is opened (the sweep needs no index).
pub(super) const OLD_DONE_BY_EXPIRY: TableDefinition<(u64, &str), ()> =
    TableDefinition::new("done_by_expiry");
/// Entity slot → version and state hash (`EntityState::to_bytes`).
pub(super) const ENTITIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entities");
/// Reconciler checkpoint name → unix second its window is complete up to.
pub(super) const CHECKPOINTS: TableDefinition<&str, i64> = TableDefinition::new("checkpoints");
/// The redo log's generation that earlier versions recorded; dropped when a
/// file is opened (the topics are the record now, see `placements`).
pub(super) const OLD_REDO: TableDefinition<&str, u64> = TableDefinition::new("redo_log");
/// (topic, partition) → the next offset to read: the state of every record
/// below it is in this file.
pub(super) const OFFSETS: TableDefinition<(&str, i32), i64> = TableDefinition::new("offsets");

/// What the file knows of itself: [`TOPICS_SEEN`], the cluster and topics
/// its offsets are of (JSON, so a field added later reads as absent).
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// [`META`]'s key for the [`TopicsSeen`].
const TOPICS_SEEN: &str = "topics_seen";

/// How many done ids each commit looks at, in key order from where the last
/// one stopped, deleting those expired: the sweep walks the whole table in
/// turn, a few leaf pages per commit, so forgetting costs the same small
/// amount on every commit instead of a long transaction now and then, and
/// needs no second index by expiry (which cost a B-tree path per id on
/// every commit and half the file).
pub(super) const SWEEP_PER_COMMIT: usize = 128;

/// The tables as one read transaction sees them.
pub(super) struct Tables {
    pub(super) done: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    pub(super) entities: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    pub(super) checkpoints: redb::ReadOnlyTable<&'static str, i64>,
}

impl Tables {
    pub(super) fn open(db: &Database) -> Result<Arc<Tables>, redb::Error> {
        let txn = db.begin_read()?;
        Ok(Arc::new(Tables {
            done: txn.open_table(DONE)?,
            entities: txn.open_table(ENTITIES)?,
            checkpoints: txn.open_table(CHECKPOINTS)?,
        }))
    }
}

/// Where the sweep of expired ids goes on.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    /// The last id the previous commit looked at; `None`: from the start.
    after: Option<String>,
}

/// Writes `writes` and the `offsets` they cover (with the `topics` those
/// are of, when they changed) in one durable transaction at unix second
/// `now`, with the next step of the sweep; how many expired ids the sweep
/// deleted. The sweep looks at
/// [`SWEEP_PER_COMMIT`] ids and two more per id written, so it keeps up
/// with what is added however many ids each commit holds.
pub(super) fn write_batch(
    db: &Database,
    writes: &[Write<'_>],
    offsets: &Offsets,
    topics: Option<&TopicsSeen>,
    sweep: &mut Sweep,
    now: u64,
) -> Result<usize, redb::Error> {
    let txn = db.begin_write()?;
    let (swept, after) = {
        let mut done = txn.open_table(DONE)?;
        let mut entities = txn.open_table(ENTITIES)?;
        let mut checkpoints = txn.open_table(CHECKPOINTS)?;
        let mut added = 0;
        for write in writes {
            match write {
                Write::Done(id, value) => {
                    done.insert(*id, *value)?;
                    added += 1;
                }
                Write::Entity(slot, state) => {
                    entities.insert(*slot, state.as_slice())?;
                }
                Write::Checkpoint(name, at) => {
                    checkpoints.insert(*name, *at)?;
                }
            }
        }
        let mut stored = txn.open_table(OFFSETS)?;
        for ((topic, partition), next) in offsets {
            stored.insert((topic.as_str(), *partition), *next)?;
        }
        if let Some(topics) = topics {
            // Plain data of strings and numbers: it always serializes.
            let json = serde_json::to_vec(topics).expect("the topics seen serialize");
            txn.open_table(META)?.insert(TOPICS_SEEN, json.as_slice())?;
        }
        let range = match &sweep.after {
            Some(after) => {
                done.range::<&str>((Bound::Excluded(after.as_str()), Bound::Unbounded))?
            }
            None => done.range::<&str>(..)?,
        };
        let look_at = SWEEP_PER_COMMIT + 2 * added;
        let (mut looked_at, mut expired, mut last) = (0, Vec::new(), None);
        for entry in range.take(look_at) {
            let (id, at) = entry?;
            looked_at += 1;
            if expiry(at.value()) <= now {
                expired.push(id.value().to_owned());
            }
            if looked_at == look_at {
                last = Some(id.value().to_owned());
            }
        }
        for id in &expired {
            done.remove(id.as_str())?;
        }
        // At the end of the table (`last` is none) the next sweep starts over.
        (expired.len(), last)
    };
    txn.commit()?;
    sweep.after = after;
    Ok(swept)
}

/// A done id's stored value: when it may be forgotten, then what it was
/// answered.
pub(super) fn done_value(expires: u64, answered: &Answered) -> Vec<u8> {
    let mut value = Vec::with_capacity(48);
    value.extend_from_slice(&expires.to_be_bytes());
    answered.write_to(&mut value);
    value
}

/// The unix second a done id's stored value may be forgotten after (0, at
/// once, for a value that is not one).
pub(super) fn expiry(value: &[u8]) -> u64 {
    value
        .get(..8)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// What a done id's stored value says it was answered.
pub(super) fn answered(value: &[u8]) -> Answered {
    Answered::from_bytes(value.get(8..).unwrap_or_default())
}

/// Moves an earlier version's done ids (`id → expiry`) into [`DONE`], with
/// an outcome unknown, and drops their table; how many moved. In the
/// transaction that opens the file, once.
pub(super) fn move_old_done(txn: &redb::WriteTransaction) -> Result<u64, redb::Error> {
    let unknown = Answered {
        outcome: crate::adapters::ledger::Recorded::Unknown,
        at_micros: 0,
        place: None,
    };
    let mut moved = 0;
    {
        let old = txn.open_table(OLD_DONE)?;
        let count = old.len()?;
        if count > 0 {
            tracing::info!(
                done_ids = count,
                "Moving an earlier version's done delivery ids into the table that keeps their answers (once; the file grows by about four times their size)."
            );
        }
        let mut done = txn.open_table(DONE)?;
        for entry in old.range::<&str>(..)? {
            let (id, expires) = entry?;
            done.insert(id.value(), done_value(expires.value(), &unknown).as_slice())?;
            moved += 1;
        }
    }
    txn.delete_table(OLD_DONE)?;
    Ok(moved)
}

/// Every offset the file records.
pub(super) fn offsets(db: &Database) -> Result<Offsets, redb::Error> {
    let txn = db.begin_read()?;
    let table = txn.open_table(OFFSETS)?;
    let mut offsets = Offsets::new();
    for entry in table.range::<(&str, i32)>(..)? {
        let (key, next) = entry?;
        let (topic, partition) = key.value();
        offsets.insert((topic.to_owned(), partition), next.value());
    }
    Ok(offsets)
}

/// The cluster and topics the file's offsets are of; `None` in a file
/// written before they were kept (or one whose record does not read).
pub(super) fn topics_seen(db: &Database) -> Result<Option<TopicsSeen>, redb::Error> {
    let txn = db.begin_read()?;
    let table = txn.open_table(META)?;
    Ok(table
        .get(TOPICS_SEEN)?
        .and_then(|json| serde_json::from_slice(json.value()).ok()))
}

/// Empties every table in one durable transaction: the file cached other
/// topics than the cluster's.
pub(super) fn forget(db: &Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.open_table(DONE)?.retain(|_, _| false)?;
    txn.open_table(ENTITIES)?.retain(|_, _| false)?;
    txn.open_table(CHECKPOINTS)?.retain(|_, _| false)?;
    txn.open_table(OFFSETS)?.retain(|_, _| false)?;
    txn.open_table(META)?.retain(|_, _| false)?;
    txn.commit()?;
    Ok(())
}
