//! What a run did, counted.

use crate::services::pipeline::Outcome;

/// What a run did, for logs and the terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pages read.
    pub pages: u64,
    /// Records read.
    pub records: u64,
    /// Records published (new or changed state).
    pub published: u64,
    /// Records skipped because the topic already holds that state.
    pub unchanged: u64,
    /// Records older than what the topic holds.
    pub stale: u64,
    /// Records that could not be normalized, dead-lettered.
    pub dead_lettered: u64,
}

impl Summary {
    /// The counts in words, for the progress line.
    pub(super) fn line(&self) -> String {
        format!(
            "pages {} · records {} · published {} · not newer {} · stale {} · dead-lettered {}",
            self.pages,
            self.records,
            self.published,
            self.unchanged,
            self.stale,
            self.dead_lettered
        )
    }

    /// Counts one record's outcome.
    pub(super) fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Published => self.published += 1,
            Outcome::Stale => self.stale += 1,
            Outcome::DeadLettered => self.dead_lettered += 1,
            Outcome::Unchanged | Outcome::Duplicate | Outcome::Spooled => self.unchanged += 1,
        }
    }

    pub(super) fn add(&mut self, other: Summary) {
        self.pages += other.pages;
        self.records += other.records;
        self.published += other.published;
        self.unchanged += other.unchanged;
        self.stale += other.stale;
        self.dead_lettered += other.dead_lettered;
    }
}
