//! What a world leaves for the checks: its events, the answers its
//! providers saw, the broker's logs, and what happened to them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::plan::Plan;
use crate::adapters::ledger::Remembered;
use crate::adapters::publish::OutgoingRecord;
use crate::domain::event::ProviderKind;
use crate::domain::record_at::RecordAt;
use crate::services::pipeline::Outcome;

/// One event of one entity: its key, and its place among its entity's
/// events (a higher index is a newer state).
#[derive(Debug, Clone)]
pub(super) struct Event {
    /// The entity's record key.
    pub(super) key: String,
    /// Its place: events of one entity are made with rising versions.
    pub(super) index: usize,
    /// Its provider.
    pub(super) provider: ProviderKind,
    /// Whether its body cannot be normalized (its data is not an entity):
    /// a dead letter, written once.
    pub(super) broken: bool,
    /// The body as the provider sent it (an API's record, for the
    /// reconciler's): every record of the event holds it as it was.
    pub(super) raw: Vec<u8>,
}

/// One attempt's answer, as its provider saw it.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    /// Which delivery.
    pub(super) delivery: String,
    /// 2xx with its outcome, or why its provider retries.
    pub(super) outcome: Result<Outcome, String>,
    /// How long the answer took.
    pub(super) took: Duration,
    /// How many records the broker's log held when it was answered.
    pub(super) log_len: usize,
    /// Whether its provider sends no further attempt after it.
    pub(super) last: bool,
    /// When it started, from the world's start.
    pub(super) at: Duration,
    /// Which broker answered: one more each time it was replaced.
    pub(super) era: usize,
}

/// What a world ended with, for the checks.
pub(super) struct Ended {
    /// Its plan as it ran: the plan it was given, with the broker's answer
    /// to each send and what the log took of the sends a crash cut.
    pub(super) kept: Plan,
    /// Every event, by delivery id.
    pub(super) events: BTreeMap<String, Event>,
    /// Every answer, in the order given.
    pub(super) answers: Vec<Answer>,
    /// The broker's log in each era, in order, each record with where it
    /// lies: a replaced broker's, then the one that replaced it.
    pub(super) eras: Vec<Vec<(RecordAt, OutgoingRecord)>>,
    /// Deliveries in doubt (an acknowledgement lost, a send a crash cut
    /// after the log took it), by delivery id: each lets one more copy be
    /// written.
    pub(super) in_doubt: BTreeMap<String, u32>,
    /// From when no fault of the broker or the process is left.
    pub(super) quiet_from: Duration,
    /// Whether ReceiptRoller's source spools (`on_broker_unavailable = "spool"`).
    pub(super) spools: bool,
    /// Deliveries the spool still held at the end.
    pub(super) spooled_at_end: usize,
    /// What the last life's ledger remembers of each webhook delivery, by
    /// delivery id: what a lookup answers.
    pub(super) remembered: BTreeMap<String, Remembered>,
    /// Spool entries found damaged and set aside, over every life.
    pub(super) quarantined: u64,
    /// What the checks inside the core found broken as it ran (a checkpoint
    /// past a record whose state the ledger does not hold).
    pub(super) internal: Vec<String>,
    /// The schedule, step by step.
    pub(super) steps: Vec<String>,
    /// The classes of fault and schedule the world drew ([`super::DRAWN`]).
    pub(super) drawn: BTreeSet<&'static str>,
    /// Where the ledger was lost or damaged at a crash: the era, and how
    /// long the broker's log was then. What it forgot of a delivery that
    /// wrote nothing (stale, unchanged), a retry after it decides again.
    pub(super) ledger_lost: Vec<(usize, usize)>,
}
