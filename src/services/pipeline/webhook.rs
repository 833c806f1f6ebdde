//! A webhook delivery, top-down: on its own task (`tasks.rs`), taken in
//! (`intake.rs`: the lease, the body normalized, the guard's decision),
//! its record sent and committed (`send.rs`), and the spool when Kafka
//! cannot make its outcome durable within the answer budget.

use std::time::Duration;

use tokio::time::Instant;

use super::intake::{Attempt, Taken, envelope_of, key_of};
use super::tasks::Answer;
use super::{Delivery, Handled, Outcome, Pipeline, PipelineError};
use crate::adapters::spool::{Spool, SpooledDelivery};
use crate::observe::delivery as observe;
use crate::observe::traces::Stage;

/// The part of the answer budget kept for the spool's fsync (at most a
/// quarter of the budget): a delivery that spools stops waiting for Kafka
/// this long before its deadline.
const SPOOL_MARGIN: Duration = Duration::from_millis(1000);

impl Pipeline {
    /// Handles one webhook delivery from start to durable outcome, within
    /// the answer budget counted from `delivery.arrived`. A delivery of a
    /// source that spools goes to the spool when Kafka (or the ledger)
    /// cannot make its outcome durable in time.
    ///
    /// # Errors
    /// [`PipelineError::DeliveryIdMismatch`] when the delivery id does not
    /// match the body; any other [`PipelineError`] when the outcome could not
    /// be made durable (the provider should retry).
    pub async fn deliver(&self, delivery: Delivery) -> Result<Handled, PipelineError> {
        self.deliver_holding(delivery, ()).await
    }

    /// [`Pipeline::deliver`], with `held` kept until the delivery reaches
    /// its outcome, not only until its answer: the ingress's place in the
    /// source's fair share, which a provider hanging up must not free
    /// while the delivery still runs.
    ///
    /// # Errors
    /// As [`Pipeline::deliver`].
    pub async fn deliver_holding(
        &self,
        delivery: Delivery,
        held: impl Send + 'static,
    ) -> Result<Handled, PipelineError> {
        let pipeline = self.clone();
        self.on_its_task(|answer| async move {
            pipeline.deliver_on_its_task(delivery, answer).await;
            drop(held);
        })
        .await
    }

    /// [`Pipeline::deliver`], on the delivery's task: taken in before the
    /// deadline, then sent; at the deadline the answer goes out (spooled,
    /// or "try again") while a record already sent runs on to its commit.
    pub(super) async fn deliver_on_its_task(
        self,
        delivery: Delivery,
        answer: Answer<Result<Handled, PipelineError>>,
    ) {
        let _in_flight = self.inner.in_flight.count(delivery.source.provider);
        let deadline = delivery.arrived + self.inner.answer_budget;
        let spool = self.inner.spool.as_ref().filter(|_| delivery.spools);
        // A delivery that may spool stops waiting for Kafka early enough to
        // make the append durable before its deadline.
        let work_deadline = match spool {
            Some(_) => deadline - SPOOL_MARGIN.min(self.inner.answer_budget / 4),
            None => deadline,
        };
        let key = key_of(&delivery);
        let (handled, answer) = match self
            .take_in(&delivery, &key, work_deadline, Attempt::Provider)
            .await
        {
            Ok(Taken::Done(handled)) => (Ok(handled), answer),
            Ok(Taken::Sending(outgoing, handled)) => {
                let late = async || {
                    let late = Err(PipelineError::DeadlinePassed);
                    self.or_spooled(late, &delivery, spool, deadline).await
                };
                let sending = Box::pin(self.send_or_dead_letter(outgoing));
                let Some((sent, answer)) = answer.sent_by(work_deadline, sending, late).await
                else {
                    return;
                };
                (
                    sent.map(|(outcome, code)| handled.sent(outcome, code)),
                    answer,
                )
            }
            Err(error) => (Err(error), answer),
        };
        answer.send(self.or_spooled(handled, &delivery, spool, deadline).await);
    }

    /// `handled`, or when Kafka (or the ledger) could not make the outcome
    /// durable in time and the source spools, the delivery kept in the
    /// `spool` before `deadline`.
    async fn or_spooled(
        &self,
        handled: Result<Handled, PipelineError>,
        delivery: &Delivery,
        spool: Option<&Spool>,
        deadline: Instant,
    ) -> Result<Handled, PipelineError> {
        let (error, spool) = match (handled, spool) {
            (Err(error), Some(spool)) if error.spoolable() => (error, spool),
            (handled, _) => return handled,
        };
        self.append(delivery, spool, deadline, &error).await
    }

    /// Keeps a delivery of a source that spools in the spool at once,
    /// without taking it in: a source over its fair share whose provider
    /// counts every refusal against the webhook. The drainer publishes it.
    /// A delivery id the spool holds already is a duplicate. `None` when
    /// the delivery's source does not spool.
    ///
    /// # Errors
    /// [`PipelineError::DeliveryIdMismatch`] when the body names another
    /// id; [`PipelineError::Spool`] (or a deadline passed) when the spool
    /// cannot take it, and the caller then takes it in some other way.
    pub async fn spool_at_once(
        &self,
        delivery: &Delivery,
    ) -> Option<Result<Handled, PipelineError>> {
        let spool = self.inner.spool.as_ref().filter(|_| delivery.spools)?;
        Some(match spool.contains(&key_of(delivery)) {
            Ok(true) => Ok(Handled::bare(self.duplicate(delivery.source.provider))),
            Ok(false) => {
                let deadline = delivery.arrived + self.inner.answer_budget;
                self.append(delivery, spool, deadline, &"over its fair share")
                    .await
            }
            Err(error) => Err(error.into()),
        })
    }

    /// Appends `delivery` to `spool` before `deadline`: 200 `spooled`.
    async fn append(
        &self,
        delivery: &Delivery,
        spool: &Spool,
        deadline: Instant,
        reason: &(dyn std::fmt::Display + Sync),
    ) -> Result<Handled, PipelineError> {
        // The lease may have failed before the body was read: a body naming
        // another id is the request's mistake, never spooled.
        envelope_of(delivery)?;
        let spooled = SpooledDelivery {
            key: key_of(delivery),
            source: delivery.source.as_ref().clone(),
            delivery_id: delivery.delivery_id.to_string(),
            received_at: delivery.received_at,
            body: delivery.body.bytes().clone(),
        };
        let spooling = delivery.trace.stage(Stage::Spool);
        spooling.result(
            tokio::time::timeout_at(deadline, spool.append(&spooled))
                .await
                .map_err(|_| PipelineError::DeadlinePassed)
                .and_then(|appended| appended.map_err(PipelineError::from)),
        )?;
        observe::spooled(&spooled.source, reason);
        Ok(Handled::bare(Outcome::Spooled))
    }
}
