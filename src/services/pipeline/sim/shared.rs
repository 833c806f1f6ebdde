//! What the world notes as it runs: the providers' answers, the steps a
//! failing seed prints, the doubts that allow a copy more, the classes of
//! fault drawn.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::ended::{Answer, Event};
use super::plan::Reply;
use crate::adapters::publish::FakeBroker;

/// What the world notes as it runs, shared by the providers, the broker's
/// plan and the crashes.
#[derive(Clone)]
pub(super) struct Shared {
    record: Arc<Mutex<Record>>,
    broker: Arc<FakeBroker>,
}

/// What the world noted, to its end.
#[derive(Default)]
pub(super) struct Record {
    pub(super) answers: Vec<Answer>,
    /// What the checks inside the core found broken as it ran.
    pub(super) internal: Vec<String>,
    pub(super) in_doubt: BTreeMap<String, u32>,
    pub(super) steps: Vec<String>,
    /// Which broker is the one: one more each time it was replaced.
    pub(super) era: usize,
    /// The reconciler's records: derived id → the event whose state each holds.
    pub(super) reconciled: BTreeMap<String, Event>,
    pub(super) drawn: BTreeSet<&'static str>,
    /// The broker's answer to each send, as the plan keeps them.
    pub(super) replies: BTreeMap<String, Vec<Reply>>,
    /// Whether the log took each send a crash cut, as the plan keeps them.
    pub(super) cut_taken: BTreeMap<String, Vec<bool>>,
}

impl Shared {
    /// What `broker` answers and the world's parts say, noted from now.
    pub(super) fn new(broker: Arc<FakeBroker>) -> Shared {
        Shared {
            record: Arc::default(),
            broker,
        }
    }

    pub(super) fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a record the reconciler is about to publish.
    pub(super) fn reconciled(&self, id: String, event: Event) {
        self.record().reconciled.insert(id, event);
    }

    /// Notes an answer, and the broker's log and era when it was given.
    pub(super) fn answered(&self, mut answer: Answer) {
        answer.log_len = self.broker.taken_count();
        let mut record = self.record();
        answer.era = record.era;
        let step = format!(
            "t={:.3}s {} → {} in {} ms",
            answer.at.as_secs_f64(),
            answer.delivery,
            match &answer.outcome {
                Ok(outcome) => outcome.as_str().to_owned(),
                Err(error) => format!("retry ({error})"),
            },
            answer.took.as_millis()
        );
        record.steps.push(step);
        record.answers.push(answer);
    }

    pub(super) fn step(&self, at: Duration, step: impl std::fmt::Display) {
        self.record()
            .steps
            .push(format!("t={:.3}s {step}", at.as_secs_f64()));
    }

    /// Notes that the world drew a class of fault or schedule.
    pub(super) fn drew(&self, class: &'static str) {
        self.record().drawn.insert(class);
    }

    /// Notes one more doubt of `delivery`: one more copy it may write.
    pub(super) fn in_doubt(&self, delivery: String) {
        *self.record().in_doubt.entry(delivery).or_default() += 1;
    }
}
