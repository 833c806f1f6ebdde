//! Where the records whose state the ledger holds lie in the topics: the
//! offset, per partition, up to which a checkpoint may say its state is
//! applied.
//!
//! A checkpoint must not name an offset past a record whose state it does
//! not hold. Records are acknowledged and committed concurrently, so the
//! highest committed offset of a partition is not enough: a record
//! acknowledged at offset 10 may be committed after the record at 11, and a
//! checkpoint taken between the two would skip 10 at the next start. So
//! every send takes a [`Sending`] in the current *epoch* before the record
//! leaves, and gives it back after its commit: the acknowledgement turns it
//! into the [`Placed`] the commit carries, so it cannot be given back before
//! the commit is done with it (a commit the fence keeps to write again holds
//! it until then); a checkpoint *seals* the
//! epoch (new sends take the next one) and counts only the offsets of
//! epochs older than the oldest one still sending. A partition's records
//! reach it in send order (the producer is idempotent), so every record of
//! a sealed, finished epoch lies below every record sent after it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::domain::record_at::RecordAt;

/// A topic's partition.
pub type Partition = (String, i32);

/// Per partition, the next offset to read: everything below it is applied.
pub type Offsets = HashMap<Partition, i64>;

/// A record the ledger holds the state of: where it lies, and the epoch its
/// send was taken in, carried in a [`crate::adapters::ledger::Commit`]. It
/// holds its send's [`Sending`] until the last copy of it is dropped: after
/// the commit, or once a commit the fence kept is written.
#[derive(Debug, Clone)]
pub struct Placed {
    /// Where it lies.
    pub at: RecordAt,
    /// The epoch of the [`Sending`] it was sent under.
    pub epoch: u64,
    /// The send, still open while this is (held, never read).
    _sending: Arc<Sending>,
}

/// Where a record lies: its send is not part of what it is.
impl PartialEq for Placed {
    fn eq(&self, other: &Placed) -> bool {
        (&self.at, self.epoch) == (&other.at, other.epoch)
    }
}

impl Eq for Placed {}

/// The sends in flight and the offsets committed, by epoch. Shared by the
/// ledger (which records commits and checkpoints) and every send.
#[derive(Debug, Default)]
pub struct Placements {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The epoch new sends take.
    epoch: u64,
    /// Sends not yet given back, by epoch.
    open: BTreeMap<u64, usize>,
    /// Offsets committed, by the epoch of their send, not yet counted;
    /// keyed by the records' shared topic names (no copy per commit), made
    /// [`Offsets`] when counted.
    applied: BTreeMap<u64, HashMap<(Arc<str>, i32), i64>>,
    /// What a checkpoint may record: the epochs counted so far, folded.
    safe: Offsets,
}

impl Placements {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts a send: held until its commit is made (or it failed).
    pub fn sending(self: &Arc<Self>) -> Sending {
        let mut inner = self.inner();
        let epoch = inner.epoch;
        *inner.open.entry(epoch).or_default() += 1;
        Sending {
            placements: self.clone(),
            epoch,
        }
    }

    /// A committed record's place, counted once its epoch is finished.
    pub fn applied(&self, placed: &Placed) {
        let mut inner = self.inner();
        let next = placed.at.offset + 1;
        let slot = inner
            .applied
            .entry(placed.epoch)
            .or_default()
            .entry((placed.at.topic.clone(), placed.at.partition))
            .or_insert(next);
        *slot = (*slot).max(next);
    }

    /// Offsets known applied by other means (a rebuild read the partitions
    /// up to them).
    pub fn restore(&self, offsets: &Offsets) {
        let mut inner = self.inner();
        for (partition, next) in offsets {
            let slot = inner.safe.entry(partition.clone()).or_insert(*next);
            *slot = (*slot).max(*next);
        }
    }

    /// Forgets every offset: the ledger forgot the topics they are of.
    /// Sends in flight stay counted.
    pub fn forget(&self) {
        let mut inner = self.inner();
        inner.applied.clear();
        inner.safe.clear();
    }

    /// Seals the current epoch: sends from now on take the next one. The
    /// epoch sealed.
    pub fn seal(&self) -> u64 {
        let mut inner = self.inner();
        let sealed = inner.epoch;
        inner.epoch += 1;
        sealed
    }

    /// Whether every send of an epoch up to `sealed` was given back.
    pub fn finished(&self, sealed: u64) -> bool {
        self.inner()
            .open
            .keys()
            .next()
            .is_none_or(|oldest| *oldest > sealed)
    }

    /// The offsets a checkpoint taken now may record: the epochs up to
    /// `sealed` that are older than every epoch still sending, folded in.
    pub fn safe(&self, sealed: u64) -> Offsets {
        let mut inner = self.inner();
        let oldest_open = inner.open.keys().next().copied().unwrap_or(u64::MAX);
        let through = sealed.min(oldest_open.saturating_sub(1));
        if oldest_open > 0 {
            let later = inner.applied.split_off(&(through + 1));
            let counted = std::mem::replace(&mut inner.applied, later);
            for offsets in counted.into_values() {
                for ((topic, partition), next) in offsets {
                    let slot = inner
                        .safe
                        .entry((topic.to_string(), partition))
                        .or_insert(next);
                    *slot = (*slot).max(next);
                }
            }
        }
        inner.safe.clone()
    }
}

/// A send in flight; given back when dropped.
#[derive(Debug)]
#[must_use = "a send is tracked until its commit is done with what `placed` made of it"]
pub struct Sending {
    placements: Arc<Placements>,
    epoch: u64,
}

impl Sending {
    /// Where the record of this send lies, to carry in its commit, which
    /// gives the send back when done with it.
    pub fn placed(self, at: RecordAt) -> Placed {
        Placed {
            at,
            epoch: self.epoch,
            _sending: Arc::new(self),
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        let mut inner = self.placements.inner();
        if let Some(count) = inner.open.get_mut(&self.epoch) {
            *count -= 1;
            if *count == 0 {
                inner.open.remove(&self.epoch);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offsets: &Offsets, topic: &str, partition: i32) -> Option<i64> {
        offsets.get(&(topic.to_owned(), partition)).copied()
    }

    /// The record at 10 is acknowledged, the one at 11 committed first: a
    /// checkpoint between them must not say 11 is applied.
    #[test]
    fn a_record_committed_out_of_order_holds_the_offset_back() {
        let placements = Arc::new(Placements::default());
        let slow = placements.sending();
        let fast = placements.sending();
        let placed_fast = fast.placed(RecordAt::new("t", 0, 11));
        placements.applied(&placed_fast);
        drop(placed_fast);
        let sealed = placements.seal();
        assert!(!placements.finished(sealed));
        assert_eq!(
            at(&placements.safe(sealed), "t", 0),
            None,
            "10 is not in yet"
        );

        let placed_slow = slow.placed(RecordAt::new("t", 0, 10));
        placements.applied(&placed_slow);
        drop(placed_slow);
        assert!(placements.finished(sealed));
        assert_eq!(at(&placements.safe(sealed), "t", 0), Some(12));
    }

    /// A send of a later epoch that finished does not count while an older
    /// epoch still sends: its offset may lie above the older one's.
    #[test]
    fn a_later_epoch_waits_for_an_older_one() {
        let placements = Arc::new(Placements::default());
        let old = placements.sending();
        let first = placements.seal();
        let new = placements.sending();
        placements.applied(&new.placed(RecordAt::new("t", 0, 20)));
        let second = placements.seal();
        assert_eq!(at(&placements.safe(second), "t", 0), None);
        placements.applied(&old.placed(RecordAt::new("t", 0, 5)));
        assert_eq!(at(&placements.safe(first), "t", 0), Some(6));
        assert_eq!(at(&placements.safe(second), "t", 0), Some(21));
    }

    #[test]
    fn restored_offsets_are_kept_and_never_lowered() {
        let placements = Arc::new(Placements::default());
        placements.restore(&[(("t".to_owned(), 1), 50)].into_iter().collect());
        let send = placements.sending();
        placements.applied(&send.placed(RecordAt::new("t", 1, 7)));
        let sealed = placements.seal();
        assert_eq!(at(&placements.safe(sealed), "t", 1), Some(50));
    }
}
