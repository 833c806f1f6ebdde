//! A dead letter put through the line again, or planned on a dry run.

use tokio::time::Instant;

use super::intake::{Envelope, identify};
use super::lease::Lease;
use super::outcome::{MISMATCH_CODE, Written};
use super::write::entity_state;
use super::{Delivery, Outcome, Pipeline, PipelineError, Redelivery};
use crate::domain::event::Normalized;
use crate::domain::guard::{self, Decision};
use crate::observe::traces::{Origin as TraceOrigin, Stage};

impl Pipeline {
    /// Puts a dead letter's body through the line again as its original
    /// delivery, without the signature check (it was verified on arrival) and
    /// without the done-id check (dead-lettering marked it done), but under
    /// its lease, so it cannot race a live delivery of the same id. What
    /// normalizes goes through the guard, so an old dead letter never rolls
    /// an entity back (`Stale`); what still fails is reported, not
    /// dead-lettered again.
    ///
    /// # Errors
    /// [`PipelineError`] when the outcome could not be made durable (Kafka,
    /// registry or ledger unavailable; the same id in flight): worth trying again.
    pub async fn redeliver(&self, mut delivery: Delivery) -> Result<Redelivery, PipelineError> {
        let trace = self.trace_of_its_own(TraceOrigin::Redelivery, &mut delivery);
        let redelivered = self.redeliver_traced(delivery).await;
        match &redelivered {
            Ok(Redelivery::Applied { outcome, .. }) => trace.outcome(outcome.as_str(), None),
            Ok(Redelivery::StillFailing { code, .. }) => trace.outcome("still_failing", Some(code)),
            Err(error) => trace.failed(error),
        }
        redelivered
    }

    /// [`Pipeline::redeliver`] under the delivery's span.
    async fn redeliver_traced(&self, delivery: Delivery) -> Result<Redelivery, PipelineError> {
        let (key, envelope) = match identify(&delivery) {
            Ok(identified) => identified,
            Err(error) => return Ok(Redelivery::still_failing(MISMATCH_CODE, error)),
        };
        let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
        let dedup = delivery.trace.stage(Stage::Dedup);
        dedup.result(
            tokio::time::timeout_at(deadline, self.acquire_again(&key))
                .await
                .unwrap_or(Err(PipelineError::DeadlinePassed)),
        )?;
        let (lease, released) = self.held(&key);
        let work = self.redeliver_leased(&delivery, envelope, lease);
        self.leased(delivery.source.provider, deadline, work, released)
            .await
    }

    /// Normalize → guard → encode → publish → commit, a refusal reported.
    async fn redeliver_leased(
        &self,
        delivery: &Delivery,
        envelope: Envelope,
        lease: Lease,
    ) -> Result<Redelivery, PipelineError> {
        let trace = &delivery.trace;
        let normalized = match trace
            .stage(Stage::Normalize)
            .result(self.normalize(delivery, envelope))
        {
            Ok(normalized) => normalized,
            Err(reason) => return Ok(Redelivery::still_failing(reason.code(), reason)),
        };
        let entity = normalized.event.key();
        trace.event(&normalized.event, &entity);
        Ok(
            match self.write(normalized, &entity, Some(lease), trace).await? {
                Written::Done(outcome) => Redelivery::Applied { outcome, entity },
                Written::Refused { code, reason, .. } => Redelivery::StillFailing { code, reason },
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
        let written = self.inner.ledger.entity(&slot).await?;
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
