//! How far replays got, per partition of the dead-letter topic: the next
//! offset to read, a ledger checkpoint named `dead-letters/{topic}/{partition}`.
//!
//! A checkpoint moves past a record only once its outcome is final, and only
//! on a run without filters and not dry. A record that still fails (or whose
//! source is not configured) holds it: the checkpoint stays at the first
//! such record, so the run after a fix reads it again (and the records after
//! it, which then come out `unchanged`). Also only a filtered run passes over records
//! it did not select, which a later run must still see. It is written at
//! most once a second and at the end of each partition (or when a run
//! stops), so a crash redoes at most a second of records, which then come
//! out `unchanged`. Pure decisions, no I/O.

use std::time::{Duration, Instant};

/// How often a moving checkpoint is written while a partition is read.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The checkpoint name of one partition.
pub fn name(topic: &str, partition: i32) -> String {
    format!("dead-letters/{topic}/{partition}")
}

/// Where to start reading a partition whose records run from `low` to
/// `high` (exclusive): the checkpoint, or `low` without one or when
/// retention already deleted what it points to. A checkpoint past `high`
/// belongs to an earlier topic of the same name (deleted and created
/// again): then the whole partition is read, and `true` says so.
pub fn start(checkpoint: Option<i64>, low: i64, high: i64) -> (i64, bool) {
    match checkpoint {
        Some(next) if next > high => (low, true),
        Some(next) => (next.max(low), false),
        None => (low, false),
    }
}

/// One partition's progress: what the ledger holds and how far the final
/// outcomes reach.
#[derive(Debug)]
pub struct Cursor {
    /// Whether this run moves checkpoints at all.
    moves: bool,
    /// The offset the ledger holds (or the start, when it holds none).
    saved: i64,
    /// One past the last record whose outcome is final.
    next: i64,
    /// A record that a later run must read again was met: `next` stays at it.
    held: bool,
    /// When the checkpoint was last written (or the partition started).
    saved_at: Instant,
}

impl Cursor {
    /// A cursor at `start`; `moves` is false for filtered and dry runs.
    pub fn new(start: i64, moves: bool, now: Instant) -> Cursor {
        Cursor {
            moves,
            saved: start,
            next: start,
            held: false,
            saved_at: now,
        }
    }

    /// The record at `offset` reached its final outcome (and with it every
    /// offset before it: records are handled in order).
    pub fn passed(&mut self, offset: i64) {
        if !self.held {
            self.next = self.next.max(offset + 1);
        }
    }

    /// The record at `offset` is not done for good (it still fails, or its
    /// source is not configured): later runs start at it.
    pub fn hold(&mut self, offset: i64) {
        if !self.held {
            self.next = self.next.max(offset);
            self.held = true;
        }
    }

    /// The offset to write now, if any: the checkpoint moved and a second
    /// passed since the last write, or `end` (the partition is done, or the
    /// run stops).
    pub fn due(&self, now: Instant, end: bool) -> Option<i64> {
        let moved = self.moves && self.next > self.saved;
        (moved && (end || now.duration_since(self.saved_at) >= SAVE_EVERY)).then_some(self.next)
    }

    /// The ledger now holds `offset`.
    pub fn saved(&mut self, offset: i64, now: Instant) {
        self.saved = offset;
        self.saved_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_starts_at_the_checkpoint_within_what_the_partition_holds() {
        assert_eq!(start(None, 0, 10), (0, false));
        assert_eq!(start(None, 4, 10), (4, false), "retention deleted 0..4");
        assert_eq!(start(Some(7), 0, 10), (7, false));
        assert_eq!(start(Some(10), 0, 10), (10, false), "nothing new");
        assert_eq!(start(Some(2), 4, 10), (4, false), "deleted since");
        assert_eq!(start(Some(12), 0, 3), (0, true), "a topic created again");
    }

    #[test]
    fn the_checkpoint_moves_past_final_outcomes_at_most_once_a_second() {
        let t0 = Instant::now();
        let mut cursor = Cursor::new(5, true, t0);
        assert_eq!(cursor.due(t0, true), None, "nothing passed yet");
        cursor.passed(5);
        cursor.passed(6);
        assert_eq!(cursor.due(t0 + Duration::from_millis(500), false), None);
        assert_eq!(cursor.due(t0 + SAVE_EVERY, false), Some(7));
        cursor.saved(7, t0 + SAVE_EVERY);
        assert_eq!(cursor.due(t0 + SAVE_EVERY * 3, false), None, "nothing new");
        cursor.passed(8);
        assert_eq!(
            cursor.due(t0 + SAVE_EVERY + Duration::from_millis(1), true),
            Some(9),
            "the end of a partition (or a stop) writes at once"
        );
    }

    #[test]
    fn a_record_that_failed_retryably_holds_the_checkpoint_before_it() {
        let t0 = Instant::now();
        let mut cursor = Cursor::new(0, true, t0);
        cursor.passed(0);
        // Offset 1 failed: never passed, so the run stops with 1 as next.
        assert_eq!(cursor.due(t0, true), Some(1));
    }

    #[test]
    fn a_filtered_or_dry_run_moves_nothing() {
        let t0 = Instant::now();
        let mut cursor = Cursor::new(3, false, t0);
        cursor.passed(3);
        cursor.passed(4);
        assert_eq!(cursor.due(t0 + SAVE_EVERY * 10, true), None);
    }

    #[test]
    fn a_repeated_record_does_not_move_the_cursor_back() {
        let mut cursor = Cursor::new(0, true, Instant::now());
        cursor.passed(4);
        cursor.passed(2);
        assert_eq!(cursor.due(Instant::now(), true), Some(5));
    }

    #[test]
    fn a_record_that_still_fails_holds_the_checkpoint_at_it() {
        let t0 = Instant::now();
        let mut cursor = Cursor::new(10, true, t0);
        cursor.passed(10);
        cursor.hold(11);
        cursor.passed(11);
        cursor.passed(12);
        cursor.hold(13);
        cursor.passed(19);
        assert_eq!(cursor.due(t0, true), Some(11));
    }

    #[test]
    fn checkpoints_are_named_by_topic_and_partition() {
        assert_eq!(name("pos-dead-letter", 3), "dead-letters/pos-dead-letter/3");
    }
}
