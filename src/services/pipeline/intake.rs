//! A webhook delivery's way in: its own task, the lease on its delivery
//! id (a duplicate waits for the attempt in flight), the spool when Kafka
//! cannot take it in time, normalization; and the spool's replay.

use std::time::Duration;

use tokio::time::Instant;

use serde_json::Value;

use super::lease::{Lease, Released};
use super::outcome::ended;
use super::{DeadLetter, Delivery, Handled, Outcome, Pipeline, PipelineError};
use crate::adapters::ledger::Begin;
use crate::adapters::providers::{self, Context, NormalizeError};
use crate::adapters::spool::SpooledDelivery;
use crate::domain::event::{DeliveryKey, EntityKey, Normalized, Origin, ProviderKind};
use crate::observe::delivery as observe;
use crate::observe::traces::{Origin as TraceOrigin, Stage};

/// How often a duplicate re-checks the ledger while the first attempt runs.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

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
        // On a task of its own: hyper drops the request's future when the
        // client goes away or shutdown aborts the connection, and a delivery
        // cancelled between Kafka's acknowledgement and the ledger commit
        // would lose the entity's version (an older event would then
        // publish) and its delivery id (the retry would publish again).
        let pipeline = self.clone();
        self.to_the_end(async move { pipeline.deliver_here(delivery).await })
            .await
    }

    /// [`Pipeline::deliver`] on the caller's task.
    async fn deliver_here(&self, delivery: Delivery) -> Result<Handled, PipelineError> {
        let key = key_of(&delivery);
        let deadline = delivery.arrived + self.inner.answer_budget;
        let spool = self.inner.spool.as_ref().filter(|_| delivery.spools);
        // A delivery that may spool stops waiting for Kafka early enough to
        // make the append durable before its deadline.
        let work_deadline = match spool {
            Some(_) => deadline - SPOOL_MARGIN.min(self.inner.answer_budget / 4),
            None => deadline,
        };
        let result = self
            .run(delivery.clone(), &key, work_deadline, Attempt::Provider)
            .await;
        match (result, spool) {
            (Err(error), Some(spool)) if error.spoolable() => {
                // The lease may have failed before the body was read: a body
                // naming another id is the request's mistake, never spooled.
                envelope_of(&delivery)?;
                let spooled = SpooledDelivery {
                    key,
                    source: delivery.source.as_ref().clone(),
                    delivery_id: delivery.delivery_id,
                    received_at: delivery.received_at,
                    body: delivery.body.bytes().clone(),
                };
                let spooling = delivery.trace.stage(Stage::Spool);
                let appended = spooling.result(
                    tokio::time::timeout_at(deadline, spool.append(&spooled))
                        .await
                        .map_err(|_| PipelineError::DeadlinePassed)
                        .and_then(|appended| appended.map_err(PipelineError::from)),
                );
                match appended {
                    Ok(()) => {
                        observe::spooled(&spooled.source, &error);
                        Ok(Handled::bare(Outcome::Spooled))
                    }
                    Err(error) => Err(error),
                }
            }
            (result, _) => result,
        }
    }

    /// Replays one spooled delivery: the same line as [`Pipeline::deliver`],
    /// without the spool and without an answer budget (nobody waits for an
    /// answer; the producer's own deadline still bounds each record).
    ///
    /// # Errors
    /// As [`Pipeline::deliver`]; the drainer keeps the entry and tries again.
    pub async fn replay(&self, mut delivery: Delivery) -> Result<Outcome, PipelineError> {
        let trace = self.trace_of_its_own(TraceOrigin::SpoolReplay, &mut delivery);
        let replayed = async {
            let key = key_of(&delivery);
            let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
            self.run(delivery, &key, deadline, Attempt::SpoolReplay)
                .await
        }
        .await;
        let outcome = replayed.map(|handled| handled.outcome);
        ended(&trace, &outcome);
        outcome
    }

    /// Takes the lease and processes before `deadline`; the lease goes down
    /// the line with the delivery ([`Lease`]). For a provider's `attempt`, a
    /// delivery id the spool holds is a duplicate.
    ///
    /// The body is parsed only once the lease is held: a delivery id already
    /// done is answered from the ledger alone, as both providers advise (a
    /// retry repeats the signed bytes of a delivery already checked).
    async fn run(
        &self,
        delivery: Delivery,
        key: &DeliveryKey,
        deadline: Instant,
        attempt: Attempt,
    ) -> Result<Handled, PipelineError> {
        let provider = delivery.source.provider;
        let dedup = delivery.trace.stage(Stage::Dedup);
        if !dedup.result(self.lease(key, deadline, attempt).await)? {
            return Ok(Handled::bare(self.duplicate(provider)));
        }
        // Boxed: the processing future is a few KiB, and `leased` would
        // otherwise hold it twice (its argument and its timeout) inside every
        // future above it, each copied whole whenever the webhook handler's
        // future moves.
        let (lease, released) = self.held(key);
        let work = Box::pin(self.process(delivery, lease));
        self.leased(provider, deadline, work, released).await
    }

    /// The lease the ledger just gave for `key`, as a value.
    pub(super) fn held(&self, key: &DeliveryKey) -> (Lease, Released) {
        Lease::held(
            key.clone(),
            self.inner.ledger.clone(),
            self.inner.deliveries.clone(),
        )
    }

    /// Takes the lease of a new delivery before `deadline`; `Ok(false)`
    /// when it is a duplicate (done, or for a provider's `attempt` in the
    /// spool), and then no lease is held.
    async fn lease(
        &self,
        key: &DeliveryKey,
        deadline: Instant,
        attempt: Attempt,
    ) -> Result<bool, PipelineError> {
        let acquired = tokio::time::timeout_at(deadline, self.acquire(key))
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed));
        if !acquired? {
            return Ok(false);
        }
        if let Some(spool) = &self.inner.spool
            && matches!(attempt, Attempt::Provider)
        {
            match spool.contains(key) {
                Ok(false) => {}
                Ok(true) => {
                    self.inner.ledger.release(key).await;
                    return Ok(false);
                }
                Err(error) => {
                    self.inner.ledger.release(key).await;
                    return Err(error.into());
                }
            }
        }
        Ok(true)
    }

    /// Runs `work`, which holds a delivery's lease, before `deadline`,
    /// counted in flight. Cut at the deadline, the work gives its lease back
    /// unless a record of it is still in the producer ([`Lease`]).
    pub(super) async fn leased<T>(
        &self,
        provider: ProviderKind,
        deadline: Instant,
        work: impl Future<Output = Result<T, PipelineError>>,
        released: Released,
    ) -> Result<T, PipelineError> {
        let _in_flight = observe::InFlight::count(provider);
        let result = tokio::time::timeout_at(deadline, work)
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed));
        released.wait().await;
        result
    }

    pub(super) fn duplicate(&self, provider: ProviderKind) -> Outcome {
        observe::duplicate(provider);
        Outcome::Duplicate
    }

    /// Takes the delivery's lease; `Ok(false)` when it is already done.
    async fn acquire(&self, key: &DeliveryKey) -> Result<bool, PipelineError> {
        self.wait_out_in_flight(|| self.inner.ledger.begin(key))
            .await
    }

    /// Takes the lease of a delivery done or not (a dead letter put through
    /// again).
    pub(super) async fn acquire_again(&self, key: &DeliveryKey) -> Result<(), PipelineError> {
        self.wait_out_in_flight(|| self.inner.ledger.begin_again(key))
            .await
            .map(drop)
    }

    /// Asks `begin` until the delivery is not in flight: a duplicate of an
    /// attempt in flight waits for it, and if that attempt fails and
    /// releases, this one takes over. `Ok(false)` when it is done.
    async fn wait_out_in_flight<F>(&self, begin: impl Fn() -> F) -> Result<bool, PipelineError>
    where
        F: Future<Output = Result<Begin, crate::adapters::ledger::LedgerError>>,
    {
        let deadline = Instant::now() + self.inner.inflight_wait;
        loop {
            match begin().await? {
                Begin::New => return Ok(true),
                Begin::Done => return Ok(false),
                Begin::InFlight if Instant::now() >= deadline => {
                    return Err(PipelineError::InFlight);
                }
                Begin::InFlight => tokio::time::sleep(IN_FLIGHT_POLL).await,
            }
        }
    }

    /// Parses, normalizes and writes a leased delivery; a body naming
    /// another id than its header gives the lease back unused.
    async fn process(&self, delivery: Delivery, lease: Lease) -> Result<Handled, PipelineError> {
        let envelope = envelope_of(&delivery)?;
        let trace = &delivery.trace;
        let normalized = trace
            .stage(Stage::Normalize)
            .result(self.normalize(&delivery, envelope));
        match normalized {
            Ok(normalized) => {
                let event_type = Some(normalized.event.event_type.clone());
                let entity = normalized.event.key();
                trace.event(&normalized.event, &entity);
                let (outcome, dead_letter_reason) = self
                    .apply_as(normalized, &entity, Some(lease), trace)
                    .await?;
                Ok(Handled {
                    outcome,
                    event_type,
                    entity_key: Some(entity.into_string()),
                    dead_letter_reason,
                })
            }
            Err(reason) => {
                let code = reason.code();
                let letter = DeadLetter {
                    provider: delivery.source.provider,
                    source: &delivery.source.name,
                    delivery_id: &delivery.delivery_id,
                    received_at: delivery.received_at,
                    body: delivery.body.bytes().to_vec(),
                    code,
                    reason: reason.to_string(),
                };
                self.dead_letter_in(letter, Some(lease), trace).await?;
                Ok(Handled {
                    dead_letter_reason: Some(code),
                    ..Handled::bare(Outcome::DeadLettered)
                })
            }
        }
    }

    /// The entity a delivery is about, when its body normalizes: what the
    /// spool's drainer orders its lanes by.
    pub fn entity_of(&self, delivery: &Delivery) -> Option<EntityKey> {
        let (_, envelope) = identify(delivery).ok()?;
        self.normalize(delivery, envelope)
            .ok()
            .map(|normalized| normalized.event.key())
    }

    /// The provider's event for a delivery, or why there is none.
    pub(super) fn normalize(
        &self,
        delivery: &Delivery,
        envelope: Envelope,
    ) -> Result<Normalized, NormalizeError> {
        let raw = String::from_utf8_lossy(delivery.body.bytes());
        let ctx = Context {
            event_id: &delivery.delivery_id,
            source: &delivery.source,
            received_at: delivery.received_at,
            raw: &raw,
            origin: Origin::Webhook,
            max_event_ahead: self.inner.max_event_ahead,
        };
        match envelope {
            Envelope::Event(json) => {
                providers::for_kind(delivery.source.provider).normalize(&json, &ctx)
            }
            Envelope::Unusable(reason) => Err(reason),
        }
    }
}

/// Which attempt of a delivery runs the line: what a copy of it in the
/// spool means.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    /// A provider's delivery: a copy in the spool is a duplicate, which the
    /// drainer publishes.
    Provider,
    /// The drainer's replay of that copy.
    SpoolReplay,
}

/// What a signed body says of itself, before it is normalized.
pub(super) enum Envelope {
    /// JSON whose `id` is the delivery id.
    Event(Value),
    /// It cannot become an event, and why: not JSON, or no string `id`. It is
    /// dead-lettered (2xx), never refused: retrying the same signed bytes
    /// cannot help, and a refusal counts toward switching the webhook off.
    Unusable(NormalizeError),
}

/// A delivery's dedup key and envelope. Every delivery is keyed by the id
/// its provider sent in the header, whatever its body: the provider repeats
/// that id on each retry of one delivery and only there, so a body without a
/// usable `id` is dead-lettered once per delivery and its retries are
/// duplicates, while two deliveries that happen to carry the same bytes (an
/// empty body, the same junk) stay two, each dead-lettered under its own id.
///
/// # Errors
/// [`PipelineError::DeliveryIdMismatch`] when the body names another id.
pub(super) fn identify(delivery: &Delivery) -> Result<(DeliveryKey, Envelope), PipelineError> {
    Ok((key_of(delivery), envelope_of(delivery)?))
}

/// A delivery's dedup key: its provider and the id in its header.
fn key_of(delivery: &Delivery) -> DeliveryKey {
    DeliveryKey::new(delivery.source.provider, &delivery.delivery_id)
}

/// What a delivery's body says of itself ([`identify`]).
fn envelope_of(delivery: &Delivery) -> Result<Envelope, PipelineError> {
    Ok(
        match serde_json::from_slice::<Value>(delivery.body.bytes()) {
            Err(error) => Envelope::Unusable(NormalizeError::InvalidJson(error)),
            Ok(json) => match json.get("id") {
                Some(Value::String(id)) if *id == delivery.delivery_id => Envelope::Event(json),
                Some(Value::String(_)) => return Err(PipelineError::DeliveryIdMismatch),
                None => Envelope::Unusable(NormalizeError::MissingField("id")),
                Some(_) => Envelope::Unusable(NormalizeError::InvalidField {
                    field: "id",
                    reason: "is not a string",
                }),
            },
        },
    )
}
