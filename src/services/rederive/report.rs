//! What a run prints on stdout: a JSON line for each key it changed (or
//! would, or could not derive) while the sample lasts, then a summary line.

use std::collections::BTreeMap;

use serde::Serialize;

use super::diff::Change;

/// Counts of a run, the summary line.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Records read.
    pub read: u64,
    /// Tombstones (a deleted entity: nothing to derive).
    pub tombstones: u64,
    /// Records an entity's later record replaced (not its state now).
    pub superseded: u64,
    /// Records without the state headers (written before they existed):
    /// whether they are their key's state now cannot be told.
    pub without_state: u64,
    /// Keys whose record derives again to the same value.
    pub unchanged: u64,
    /// Keys whose record derives to another value.
    pub differed: u64,
    /// Of those, published in the record's place.
    pub published: u64,
    /// Of those, not published: a newer state arrived meanwhile.
    pub stale: u64,
    /// Records that could not be read or derived, by reason.
    pub failed: BTreeMap<&'static str, u64>,
    /// Whether nothing was published.
    pub dry_run: bool,
    /// Whether every selected topic was read to its end.
    pub complete: bool,
    /// Seconds the run took (the ledger's fill before it not counted).
    pub secs: f64,
}

impl Summary {
    /// The live progress line.
    pub fn line(&self) -> String {
        let failed: u64 = self.failed.values().sum();
        format!(
            "{} differed, {} published, {} stale, {} unchanged, {} failed",
            self.differed, self.published, self.stale, self.unchanged, failed
        )
    }
}

/// One key's line.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    /// Where its record is.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The record's key.
    pub key: &'a str,
    /// `published`, `stale`, `would_publish`, or `failed`.
    pub outcome: &'static str,
    /// What changed, field by field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// Why it could not be derived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
