//! A dead letter put through the line again, or planned on a dry run.

use tokio::time::Instant;

use super::intake::{Envelope, identify};
use super::lease::Lease;
use super::outcome::MISMATCH_CODE;
use super::send::{NewState, Refusal, StateSent};
use super::tasks::Answer;
use super::write::{Decided, entity_state};
use super::{Delivery, Outcome, Pipeline, PipelineError, Redelivery};
use crate::domain::event::{EntityKey, Normalized};
use crate::domain::guard::{self, Decision};
use crate::observe::traces::{DeliveryTrace, Origin as TraceOrigin, Stage};

/// A redelivery decided, up to its record.
#[expect(
    clippy::large_enum_variant,
    reason = "the record ready to send is the common case: a box would be one more allocation per delivery to save a copy of a few hundred bytes"
)]
enum Redecided {
    /// Nothing to send: what it came to.
    Done(Redelivery),
    /// The entity's new state, ready to send.
    Send(NewState, EntityKey),
}

impl Pipeline {
    /// Puts a dead letter's body through the line again as its original
    /// delivery, without the signature check (it was verified on arrival) and
    /// without the done-id check (dead-lettering marked it done), but under
    /// its lease, so it cannot race a live delivery of the same id. What
    /// normalizes goes through the guard, so an old dead letter never rolls
    /// an entity back (`Stale`); what still fails is reported, not
    /// dead-lettered again. On a task of its own, as every delivery.
    ///
    /// # Errors
    /// [`PipelineError`] when the outcome could not be made durable (Kafka,
    /// registry or ledger unavailable; the same id in flight): worth trying again.
    pub async fn redeliver(&self, delivery: Delivery) -> Result<Redelivery, PipelineError> {
        let pipeline = self.clone();
        self.on_its_task(|answer| pipeline.redeliver_on_its_task(delivery, answer))
            .await
    }

    /// [`Pipeline::redeliver`] on its task: identified, leased, normalized
    /// and decided within the in-flight wait and an answer budget, then
    /// sent; past that the caller is told "try again" while a record
    /// already sent runs on to its commit.
    async fn redeliver_on_its_task(
        self,
        mut delivery: Delivery,
        answer: Answer<Result<Redelivery, PipelineError>>,
    ) {
        let trace = self.trace_of_its_own(TraceOrigin::Redelivery, &mut delivery);
        let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
        let (redelivered, answer) = match self.redeliver_decided(&delivery, deadline).await {
            Ok(Redecided::Done(redelivery)) => (Ok(redelivery), answer),
            Ok(Redecided::Send(outgoing, entity)) => {
                let late = async || {
                    let late = Err(PipelineError::DeadlinePassed);
                    reported(&trace, &late);
                    late
                };
                let sending = Box::pin(self.send_state(outgoing));
                let Some((sent, answer)) = answer.sent_by(deadline, sending, late).await else {
                    return;
                };
                let redelivered = sent.map(|sent| match sent {
                    StateSent::Published => Redelivery::Applied {
                        outcome: Outcome::Published,
                        entity,
                    },
                    StateSent::Refused(Refusal { code, reason, .. }) => {
                        Redelivery::StillFailing { code, reason }
                    }
                });
                (redelivered, answer)
            }
            Err(error) => (Err(error), answer),
        };
        reported(&trace, &redelivered);
        answer.send(redelivered);
    }

    /// Identify → lease → normalize → guard → encode, before `deadline`;
    /// what still fails to normalize is reported.
    async fn redeliver_decided(
        &self,
        delivery: &Delivery,
        deadline: Instant,
    ) -> Result<Redecided, PipelineError> {
        let (key, envelope) = match identify(delivery) {
            Ok(identified) => identified,
            Err(error) => {
                return Ok(Redecided::Done(Redelivery::still_failing(
                    MISMATCH_CODE,
                    error,
                )));
            }
        };
        let dedup = delivery.trace.stage(Stage::Dedup);
        dedup.result(
            tokio::time::timeout_at(deadline, self.acquire_again(&key))
                .await
                .unwrap_or(Err(PipelineError::DeadlinePassed)),
        )?;
        let (lease, released) = self.held(&key);
        let work = Box::pin(self.redeliver_leased(delivery, envelope, lease));
        self.until(deadline, work, released).await
    }

    /// Normalize → guard → encode, under the delivery's lease.
    async fn redeliver_leased(
        &self,
        delivery: &Delivery,
        envelope: Envelope<'_>,
        lease: Lease,
    ) -> Result<Redecided, PipelineError> {
        let trace = &delivery.trace;
        let normalized = match trace
            .stage(Stage::Normalize)
            .result(self.normalize(delivery, envelope))
        {
            Ok(normalized) => normalized,
            Err(reason) => {
                return Ok(Redecided::Done(Redelivery::still_failing(
                    reason.code(),
                    reason,
                )));
            }
        };
        let entity = normalized.event.key();
        trace.event(&normalized.event, &entity);
        Ok(
            match self.decide(normalized, &entity, Some(lease), trace).await? {
                Decided::Done(outcome) => Redecided::Done(Redelivery::Applied { outcome, entity }),
                Decided::Send(outgoing) => Redecided::Send(outgoing, entity),
            },
        )
    }

    /// What [`Pipeline::redeliver`] would do with a dead letter now, without
    /// writing anything: normalize, ask the guard against the ledger, encode.
    /// Whether the broker would take the record is not known until it is sent.
    ///
    /// # Errors
    /// [`PipelineError`] when the ledger or the registry cannot be read.
    pub async fn plan_redelivery(&self, delivery: &Delivery) -> Result<Redelivery, PipelineError> {
        let envelope = match identify(delivery) {
            Ok((_, envelope)) => envelope,
            Err(error) => return Ok(Redelivery::still_failing(MISMATCH_CODE, error)),
        };
        let Normalized { event, content } = match self.normalize(delivery, envelope) {
            Ok(normalized) => normalized,
            Err(reason) => return Ok(Redelivery::still_failing(reason.code(), reason)),
        };
        let entity = event.key();
        let (slot, incoming) = entity_state(&event, &entity, &content);
        let written = self
            .inner
            .ledger
            .entity(&slot)
            .await?
            .map(|held| held.state);
        let outcome = match guard::decide(written.as_ref(), &incoming, event.origin) {
            Decision::Stale => Outcome::Stale,
            Decision::Unchanged => Outcome::Unchanged,
            Decision::Publish => {
                self.payload(&event)?;
                Outcome::Published
            }
        };
        Ok(Redelivery::Applied { outcome, entity })
    }
}

/// Puts what a redelivery came to on its span.
fn reported(trace: &DeliveryTrace, redelivered: &Result<Redelivery, PipelineError>) {
    match redelivered {
        Ok(Redelivery::Applied { outcome, .. }) => trace.outcome(outcome.as_str(), None),
        Ok(Redelivery::StillFailing { code, .. }) => trace.outcome("still_failing", Some(code)),
        Err(error) => trace.failed(error),
    }
}
