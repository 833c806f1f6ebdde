//! The reconciler's records, the records `posbridge rederive` derives
//! again, and the dead letters of the reconciler and the drainer, top-down:
//! each on a task of its own (`tasks.rs`), so a pass cut at its budget
//! never cuts a record between Kafka's acknowledgement and its commit.

use super::outcome::ended;
use super::send::Outgoing;
use super::write::{Decided, Rule};
use super::{DeadLetter, Outcome, Pipeline, PipelineError};
use crate::domain::event::Normalized;
use crate::domain::guard::EntityState;
use crate::observe::traces::Origin as TraceOrigin;

impl Pipeline {
    /// Guards, encodes and publishes one normalized event, then records the
    /// outcome in the ledger; what cannot be written goes to the dead-letter
    /// topic. The reconciler's entry point.
    ///
    /// # Errors
    /// [`PipelineError`] when the record could not be acknowledged or the
    /// ledger could not be read.
    pub async fn apply(&self, normalized: Normalized) -> Result<Outcome, PipelineError> {
        let rule = Rule::Newer(normalized.event.origin);
        self.apply_by(TraceOrigin::Reconcile, rule, normalized)
            .await
    }

    /// Publishes `normalized`, a record's event derived again
    /// (`posbridge rederive`), in that record's place: only while the
    /// ledger holds the state the record wrote (`replaces`), else
    /// [`Outcome::Stale`] (a newer state arrived meanwhile). The new state
    /// is committed as the entity's, at the record's version.
    ///
    /// # Errors
    /// As [`Pipeline::apply`].
    pub async fn rederive(
        &self,
        normalized: Normalized,
        replaces: EntityState,
    ) -> Result<Outcome, PipelineError> {
        self.apply_by(TraceOrigin::Rederive, Rule::Replaces(replaces), normalized)
            .await
    }

    /// Guards `normalized` by `rule`, and publishes it, on its task.
    async fn apply_by(
        &self,
        origin: TraceOrigin,
        rule: Rule,
        normalized: Normalized,
    ) -> Result<Outcome, PipelineError> {
        let pipeline = self.clone();
        self.on_its_task(|answer| async move {
            answer.send(Box::pin(pipeline.apply_here(origin, rule, normalized)).await);
        })
        .await
    }

    /// [`Pipeline::apply_by`] on its task, under a trace of its own.
    async fn apply_here(
        &self,
        origin: TraceOrigin,
        rule: Rule,
        normalized: Normalized,
    ) -> Result<Outcome, PipelineError> {
        let entity = normalized.event.key();
        let event = &normalized.event;
        let trace =
            self.inner
                .traces
                .start_root(origin, event.provider, &event.source, &event.event_id);
        trace.event(event, &entity);
        let applied = match self
            .decide_by(rule, normalized, &entity, None, &trace)
            .await
        {
            Ok(Decided::Done(outcome)) => Ok(outcome),
            Ok(Decided::Send(state)) => self
                .send_or_dead_letter(Outgoing::State(state))
                .await
                .map(|(outcome, _)| outcome),
            Err(error) => Err(error),
        };
        ended(&trace, &applied);
        applied
    }

    /// Writes what could not become an event to the dead-letter topic, with
    /// the reason in a header: the entry point of the reconciler (records it
    /// cannot normalize) and the drainer (deliveries it sets aside), a trace
    /// of its own.
    ///
    /// # Errors
    /// [`PipelineError::Publish`] when the broker did not acknowledge it.
    pub async fn dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), PipelineError> {
        let trace = self.inner.traces.start_root(
            TraceOrigin::DeadLetter,
            letter.provider,
            letter.source,
            letter.delivery_id,
        );
        let code = letter.code;
        let outgoing = self.outgoing_letter(letter, None, &trace);
        let pipeline = self.clone();
        self.on_its_task(|answer| async move {
            let written = pipeline.send_letter(outgoing).await.map(drop);
            match &written {
                Ok(()) => trace.outcome(Outcome::DeadLettered.as_str(), Some(code)),
                Err(error) => trace.failed(error),
            }
            answer.send(written);
        })
        .await
    }

    /// Dead letters written since start (webhooks, the reconciler, the
    /// spool's drain), for the status page.
    pub fn dead_letters_written(&self) -> u64 {
        self.inner
            .dead_letters
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}
