//! What becomes of one record of a run: whether it is its key's state now,
//! what its `raw` derives to today and how that differs (`Judged`), and how
//! its end is counted and shown (`Verdict`, `count`). Kept apart from the
//! reading in `mod.rs`, which only orders records, sends and checkpoints.

use crate::adapters::encode::Writers;
use crate::adapters::ledger::{EntitySlot, Ledger};
use crate::domain::event::{EntityType, Normalized};
use crate::domain::guard::EntityState;
use crate::services::pipeline::{
    HEADER_PROVIDER, HEADER_SOURCE, HEADER_STATE_HASH, HEADER_VERSION, Outcome, PipelineError,
    state_from_headers,
};
use crate::services::replay::Letter;

use super::current::is_current;
use super::diff::{self, Change};
use super::report::{Line, Summary};
use super::{Options, derive};

/// One entity topic to read.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub(super) topic: String,
    pub(super) entity_type: EntityType,
    /// Its source's own topics' prefix; none for the shared ones.
    pub(super) prefix: Option<String>,
}

/// A record judged, before anything is sent.
pub(super) enum Judged {
    /// Nothing to send.
    Done(Verdict),
    /// Its state derived again differs: what to send in place of which
    /// state, and the changes.
    Differs(Box<(Normalized, EntityState)>, Vec<Change>),
}

/// What became of one record.
pub(super) enum Verdict {
    /// Not its key's state now, or nothing to derive: counted only.
    Passed(fn(&mut Summary)),
    /// Derives to the same value.
    Unchanged,
    /// Derives to another value: `changes`, and what became of it.
    Differed(Vec<Change>, Outcome),
    /// Derives to another value; a dry run.
    WouldPublish(Vec<Change>),
    /// Could not be read or derived.
    Failed(&'static str, String),
}

/// Judges one record, without publishing anything.
pub(super) async fn judge(
    ledger: &Ledger,
    writers: &Writers,
    target: &Target,
    record: &Letter,
    options: &Options,
) -> Result<Judged, PipelineError> {
    let done = |verdict| Ok(Judged::Done(verdict));
    let (Some(key), Some(value)) = (&record.key, &record.body) else {
        return done(Verdict::Passed(|s| s.tombstones += 1));
    };
    let selected = options
        .provider
        .is_none_or(|p| record.header(HEADER_PROVIDER) == Some(p.as_str()))
        && options
            .source
            .as_deref()
            .is_none_or(|s| record.header(HEADER_SOURCE) == Some(s));
    if !selected {
        return done(Verdict::Passed(|_| {}));
    }
    let Some(state) = record
        .header(HEADER_VERSION)
        .zip(record.header(HEADER_STATE_HASH))
        .and_then(|(version, hash)| state_from_headers(version.as_bytes(), hash.as_bytes()))
    else {
        return done(Verdict::Passed(|s| s.without_state += 1));
    };
    let slot = EntitySlot::of_record_key(target.entity_type, key);
    let held = ledger.entity(&slot).await?;
    if !held.is_some_and(|held| is_current(&held, &state, record.offset)) {
        return done(Verdict::Passed(|s| s.superseded += 1));
    }
    let was = match writers.decode(value).await {
        Ok(was) => was,
        Err(error) => return done(Verdict::Failed("undecodable", error.to_string())),
    };
    let derived = match derive::derive(&was, target.prefix.as_deref()) {
        Ok(derived) => derived,
        Err(error) => return done(Verdict::Failed(error.code(), error.to_string())),
    };
    let changes = diff::changes(&was, &derived.event);
    if changes.is_empty() {
        return done(Verdict::Unchanged);
    }
    Ok(Judged::Differs(Box::new((derived, state)), changes))
}

/// Counts `verdict` into `summary`; the line a changed or failed key gets.
pub(super) fn count<'a>(
    verdict: &Verdict,
    summary: &mut Summary,
    target: &'a Target,
    record: &'a Letter,
) -> Option<Line<'a>> {
    let line = |outcome, changes, reason| Line {
        topic: &target.topic,
        partition: record.partition,
        offset: record.offset,
        key: record.key.as_deref().unwrap_or_default(),
        outcome,
        changes,
        reason,
    };
    match verdict {
        Verdict::Passed(counted) => {
            counted(summary);
            None
        }
        Verdict::Unchanged => {
            summary.unchanged += 1;
            None
        }
        Verdict::WouldPublish(changes) => {
            summary.differed += 1;
            Some(line("would_publish", changes.clone(), None))
        }
        Verdict::Differed(changes, outcome) => {
            summary.differed += 1;
            let outcome = match outcome {
                Outcome::Published => {
                    summary.published += 1;
                    "published"
                }
                Outcome::Stale => {
                    summary.stale += 1;
                    "stale"
                }
                other => {
                    *summary.failed.entry(other.as_str()).or_default() += 1;
                    other.as_str()
                }
            };
            Some(line(outcome, changes.clone(), None))
        }
        Verdict::Failed(code, reason) => {
            *summary.failed.entry(code).or_default() += 1;
            Some(line("failed", Vec::new(), Some(reason.clone())))
        }
    }
}
