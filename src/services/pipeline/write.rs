//! Guard → encode → record, under the entity's lock: what every path
//! (webhook, spool replay, reconciler, redelivery) decides before anything
//! may reach Kafka. Nothing here has sent a record, so a caller may stop
//! waiting at any point: the lock and the lease are given back as they drop.

use super::lease::Lease;
use super::send::{Durable, NewState};
use super::{Outcome, Pipeline, PipelineError, entity_record};
use crate::adapters::encode::EncodeError;
use crate::adapters::ledger::{EntityLock, EntitySlot, LedgerError, Recorded};
use crate::domain::event::{Content, EntityKey, Normalized, Origin, PosEvent};
use crate::domain::guard::EntityState;
use crate::domain::guard::{self, Decision};
use crate::observe::delivery as observe;
use crate::observe::traces::{DeliveryTrace, Stage};

/// What the guard decided of an event, carried out up to the send.
#[expect(
    clippy::large_enum_variant,
    reason = "the record ready to send is the common case: a box would be one more allocation per delivery to save a copy of a few hundred bytes"
)]
pub(super) enum Decided {
    /// Nothing to publish (stale, unchanged), the delivery committed done.
    Done(Outcome),
    /// A new state, its record ready to send under the entity's lock.
    Send(NewState),
}

/// Which states the guard lets through.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rule {
    /// A newer one (a delivery, a reconciled record, a replay).
    Newer(Origin),
    /// One derived again from a record of the topic: only while the ledger
    /// still holds the state that record wrote.
    Replaces(EntityState),
}

impl Pipeline {
    /// Guard → encode → record, under the entity's lock: a stale or
    /// unchanged event is committed done with the `lease`; a new state
    /// comes back as its record, ready to send with the lock and the lease.
    /// `key` is the event's entity key; each stage opens its span under
    /// `trace`.
    ///
    /// # Errors
    /// [`PipelineError`] when the ledger cannot be read or written, or the
    /// event cannot be encoded; the lease is given back as it drops.
    pub(super) async fn decide(
        &self,
        normalized: Normalized,
        key: &EntityKey,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Result<Decided, PipelineError> {
        let rule = Rule::Newer(normalized.event.origin);
        self.decide_by(rule, normalized, key, lease, trace).await
    }

    /// [`Pipeline::decide`] by `rule`.
    pub(super) async fn decide_by(
        &self,
        rule: Rule,
        normalized: Normalized,
        key: &EntityKey,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Result<Decided, PipelineError> {
        let Normalized { event, content } = normalized;
        let (slot, incoming) = entity_state(&event, key, &content);
        let guarding = trace.stage(Stage::Guard);
        let (lock, decision) = guarding.result(self.guard(&slot, &incoming, rule).await)?;
        let (outcome, recorded) = match decision {
            Decision::Stale => {
                observe::stale(&event, key);
                (Outcome::Stale, Recorded::Stale)
            }
            Decision::Unchanged => (Outcome::Unchanged, Recorded::Unchanged),
            Decision::Publish => {
                let topics = self.inner.topics.of(event.topic_prefix.as_deref());
                let topic = topics.entity(event.entity_type);
                let payload = trace.stage(Stage::Encode).result(self.payload(&event))?;
                let producing = trace.produce(topic);
                let record = entity_record(
                    &event,
                    key,
                    &incoming,
                    topic,
                    payload,
                    producing.record_headers(),
                );
                let locked = (lock, slot, incoming);
                return Ok(Decided::Send(
                    self.outgoing_state(record, producing, locked, event, lease, trace),
                ));
            }
        };
        self.commit(Durable::Decided(lease, recorded), trace)
            .await?;
        Ok(Decided::Done(outcome))
    }

    /// The guard's decision under the entity's lock, which the caller holds
    /// until the decision is carried out.
    async fn guard(
        &self,
        slot: &EntitySlot,
        incoming: &EntityState,
        rule: Rule,
    ) -> Result<(EntityLock, Decision), LedgerError> {
        let (lock, written) = self.inner.ledger.lock_and_read(slot).await?;
        let decision = match rule {
            Rule::Newer(origin) => guard::decide(written.as_ref(), incoming, origin),
            Rule::Replaces(replaces) => guard::decide_replacing(written.as_ref(), &replaces),
        };
        Ok((lock, decision))
    }

    /// An event's record value on its topic: none for a deleted entity (a
    /// tombstone), else its encoding.
    pub(super) fn payload(&self, event: &PosEvent) -> Result<Option<Vec<u8>>, EncodeError> {
        if event.deleted {
            return Ok(None);
        }
        let topics = self.inner.topics.of(event.topic_prefix.as_deref());
        self.inner
            .encoder
            .encode(topics.entity(event.entity_type), event)
            .map(Some)
    }
}

/// The slot an event's entity is kept under, and the state it would write.
pub(super) fn entity_state(
    event: &PosEvent,
    key: &EntityKey,
    content: &Content,
) -> (EntitySlot, EntityState) {
    (
        EntitySlot::new(event.entity_type, key),
        EntityState {
            version: event.version,
            state_hash: guard::state_hash(event, content),
        },
    )
}
