//! A delivery's way in, shared by the webhook, the spool's replay and the
//! dead letter's redelivery: the lease on its delivery id (a duplicate
//! waits for the attempt in flight), the body read and normalized, and the
//! guard's decision (`write.rs`), up to a record ready to send.

use std::time::Duration;

use tokio::time::Instant;

use super::lease::{Lease, Released};
use super::send::Outgoing;
use super::write::Decided;
use super::{DeadLetter, Delivery, Handled, Outcome, Pipeline, PipelineError};
use crate::adapters::ledger::Begin;
use crate::adapters::providers::{self, Context, Json, NormalizeError};
use crate::domain::event::{DeliveryKey, EntityKey, Normalized, Origin, ProviderKind};
use crate::observe::delivery as observe;
use crate::observe::traces::Stage;

/// How often a duplicate re-checks the ledger while the first attempt runs.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

/// A delivery taken in: what is left to do for its outcome.
#[expect(
    clippy::large_enum_variant,
    reason = "the record ready to send is the common case: a box would be one more allocation per delivery to save a copy of a few hundred bytes"
)]
pub(super) enum Taken {
    /// Its outcome is durable already: a duplicate, a stale or unchanged
    /// event.
    Done(Handled),
    /// A record is ready to send (the entity's state, or the body's dead
    /// letter): the delivery is `Handled` so once it is acknowledged.
    Sending(Outgoing, Handled),
}

impl Pipeline {
    /// Takes the lease and decides before `deadline`, up to a record ready
    /// to send. For a provider's `attempt`, a delivery id the spool holds
    /// is a duplicate. Cut at the deadline or failed, the lease is given
    /// back before this returns.
    ///
    /// The body is parsed only once the lease is held: a delivery id already
    /// done is answered from the ledger alone, as both providers advise (a
    /// retry repeats the signed bytes of a delivery already checked).
    pub(super) async fn take_in(
        &self,
        delivery: &Delivery,
        key: &DeliveryKey,
        deadline: Instant,
        attempt: Attempt,
    ) -> Result<Taken, PipelineError> {
        let provider = delivery.source.provider;
        let dedup = delivery.trace.stage(Stage::Dedup);
        if !dedup.result(self.lease(key, deadline, attempt).await)? {
            return Ok(Taken::Done(Handled::bare(self.duplicate(provider))));
        }
        let (lease, released) = self.held(key);
        // Boxed: the processing future is a few KiB, and `until` would
        // otherwise hold it twice (its argument and its timeout) inside the
        // task's future, which the spawn copies whole, several times.
        let work = Box::pin(self.process(delivery, lease));
        self.until(deadline, work, released).await
    }

    /// Runs `work`, which holds a lease, until `deadline`; cut there or
    /// failed, its lease (dropped) is given back before this returns.
    pub(super) async fn until<T>(
        &self,
        deadline: Instant,
        work: impl Future<Output = Result<T, PipelineError>>,
        released: Released,
    ) -> Result<T, PipelineError> {
        let result = tokio::time::timeout_at(deadline, work)
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed));
        released.wait().await;
        result
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

    /// Parses, normalizes and decides a leased delivery, up to its record;
    /// a body naming another id than its header gives the lease back unused.
    async fn process(&self, delivery: &Delivery, lease: Lease) -> Result<Taken, PipelineError> {
        let envelope = envelope_of(delivery)?;
        let trace = &delivery.trace;
        let normalized = trace
            .stage(Stage::Normalize)
            .result(self.normalize(delivery, envelope));
        match normalized {
            Ok(normalized) => {
                let event_type = Some(normalized.event.event_type.clone());
                let entity = normalized.event.key();
                trace.event(&normalized.event, &entity);
                let decided = self.decide(normalized, &entity, Some(lease), trace).await?;
                let handled = |outcome| Handled {
                    outcome,
                    event_type,
                    entity_key: Some(entity.into_string()),
                    dead_letter_reason: None,
                };
                Ok(match decided {
                    Decided::Done(outcome) => Taken::Done(handled(outcome)),
                    Decided::Send(state) => {
                        Taken::Sending(Outgoing::State(state), handled(Outcome::Published))
                    }
                })
            }
            Err(reason) => {
                let code = reason.code();
                let letter = DeadLetter {
                    provider: delivery.source.provider,
                    source: &delivery.source.name,
                    topic_prefix: delivery.source.topic_prefix.as_deref(),
                    delivery_id: &delivery.delivery_id,
                    received_at: delivery.received_at,
                    body: delivery.body.bytes().to_vec(),
                    code,
                    reason: reason.to_string(),
                };
                let outgoing = Outgoing::Letter(self.outgoing_letter(letter, Some(lease), trace));
                let handled = Handled {
                    dead_letter_reason: Some(code),
                    ..Handled::bare(Outcome::DeadLettered)
                };
                Ok(Taken::Sending(outgoing, handled))
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
        envelope: Envelope<'_>,
    ) -> Result<Normalized, NormalizeError> {
        let ctx = Context {
            event_id: &delivery.delivery_id,
            source: &delivery.source,
            received_at: delivery.received_at,
            raw: delivery.body.bytes(),
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
pub(super) enum Attempt {
    /// A provider's delivery: a copy in the spool is a duplicate, which the
    /// drainer publishes.
    Provider,
    /// The drainer's replay of that copy.
    SpoolReplay,
}

/// What a signed body says of itself, before it is normalized.
pub(super) enum Envelope<'a> {
    /// JSON whose `id` is the delivery id, borrowing from the body.
    Event(Json<'a>),
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
pub(super) fn identify(delivery: &Delivery) -> Result<(DeliveryKey, Envelope<'_>), PipelineError> {
    Ok((key_of(delivery), envelope_of(delivery)?))
}

/// A delivery's dedup key: its provider and the id in its header.
pub(super) fn key_of(delivery: &Delivery) -> DeliveryKey {
    DeliveryKey::new(delivery.source.provider, &delivery.delivery_id)
}

/// What a delivery's body says of itself ([`identify`]).
pub(super) fn envelope_of(delivery: &Delivery) -> Result<Envelope<'_>, PipelineError> {
    Ok(match Json::parse(delivery.body.bytes()) {
        Err(error) => Envelope::Unusable(NormalizeError::InvalidJson(error)),
        Ok(json) => match json.get("id") {
            Some(Json::String(id)) if *id == delivery.delivery_id => Envelope::Event(json),
            Some(Json::String(_)) => return Err(PipelineError::DeliveryIdMismatch),
            None => Envelope::Unusable(NormalizeError::MissingField("id")),
            Some(_) => Envelope::Unusable(NormalizeError::InvalidField {
                field: "id",
                reason: "is not a string",
            }),
        },
    })
}
