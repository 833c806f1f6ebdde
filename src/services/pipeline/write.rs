//! Guard → encode → publish → commit under the entity's lock, and the
//! dead-letter topic: where every path (webhook, reconciler, replay) ends.

use tracing::{debug, warn};

use super::lease::Lease;
use super::outcome::{Written, ended};
use super::{
    DeadLetter, Outcome, Pipeline, PipelineError, cut_dead_letter, dead_letter_record,
    entity_record,
};
use crate::adapters::encode::EncodeError;
use crate::adapters::ledger::{Commit, EntityLock, EntitySlot, LedgerError, Placed};
use crate::adapters::publish::PublishError;
use crate::domain::event::{Content, EntityKey, Normalized, Origin, PosEvent};
use crate::domain::guard::EntityState;
use crate::domain::guard::{self, Decision};
use crate::observe::delivery::{self as observe, DeadLetterSeen};
use crate::observe::traces::{DeliveryTrace, Origin as TraceOrigin, Stage};

impl Pipeline {
    /// Guards, encodes and publishes one normalized event, then records the
    /// outcome in the ledger; what cannot be written goes to the dead-letter
    /// topic. The reconciler's entry point.
    ///
    /// # Errors
    /// [`PipelineError`] when the record could not be acknowledged or the
    /// ledger could not be read.
    pub async fn apply(&self, normalized: Normalized) -> Result<Outcome, PipelineError> {
        let entity = normalized.event.key();
        let event = &normalized.event;
        let trace = self.inner.traces.start_root(
            TraceOrigin::Reconcile,
            event.provider,
            &event.source,
            &event.event_id,
        );
        trace.event(event, &entity);
        let applied = self
            .apply_as(normalized, &entity, None, &trace)
            .await
            .map(|(outcome, _)| outcome);
        ended(&trace, &applied);
        applied
    }

    /// [`Pipeline::apply`] with the event's entity key, built once by a
    /// caller that needs it too, under the span `trace`; a dead letter's
    /// reason code with the outcome.
    pub(super) async fn apply_as(
        &self,
        normalized: Normalized,
        key: &EntityKey,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Result<(Outcome, Option<&'static str>), PipelineError> {
        match self.write(normalized, key, lease, trace).await? {
            Written::Done(outcome) => Ok((outcome, None)),
            Written::Refused {
                event,
                lease,
                code,
                reason,
            } => {
                let letter = DeadLetter::of_event(&event, code, reason);
                self.dead_letter_in(letter, lease, trace).await?;
                Ok((Outcome::DeadLettered, Some(code)))
            }
        }
    }

    /// Guard → encode → publish → commit, under the entity's lock; a record
    /// refused for good is handed back uncommitted, with the delivery's
    /// `lease`. `key` is the event's entity key; each stage opens its span
    /// under `trace`.
    pub(super) async fn write(
        &self,
        normalized: Normalized,
        key: &EntityKey,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Result<Written, PipelineError> {
        let Normalized { event, content } = normalized;
        let (slot, incoming) = entity_state(&event, key, &content);
        let guarding = trace.stage(Stage::Guard);
        let (lock, decision) = guarding.result(self.guard(&slot, &incoming, event.origin).await)?;
        match decision {
            Decision::Stale => {
                observe::stale(&event, key);
                self.commit(lease, None, None, trace).await?;
                return Ok(Written::Done(Outcome::Stale));
            }
            Decision::Unchanged => {
                self.commit(lease, None, None, trace).await?;
                return Ok(Written::Done(Outcome::Unchanged));
            }
            Decision::Publish => {}
        }
        let topic = self.inner.topics.entity(event.entity_type);
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
        // From here on the record may reach Kafka, so its acknowledgement and
        // the commit run to their end under the entity's lock, the delivery's
        // lease held, even when the caller stops waiting (its answer deadline
        // passed): a record Kafka takes after that, with no state in the
        // ledger, would be written again by the provider's retry.
        let pipeline = self.clone();
        let trace = trace.clone();
        self.to_the_end(async move {
            let _lock = lock;
            // Held until the commit is done with where the record lies: no
            // checkpoint counts this record's partition past it before its
            // state is in the ledger.
            let sending = pipeline.inner.ledger.sending();
            let delivered = match producing.result(pipeline.inner.producer.send(&record).await) {
                Ok(delivered) => delivered,
                Err(PublishError::Refused(reason)) => {
                    return Ok(Written::Refused {
                        event: Box::new(event),
                        lease,
                        code: PublishError::refusal_code(&reason),
                        reason: reason.to_string(),
                    });
                }
                Err(error) => {
                    // The record may be in the topic: its state is kept in
                    // doubt, so no older event passes the guard meanwhile
                    // and lands after it; the delivery stays undone, and
                    // its retry publishes the state again. A failed write
                    // is the fence's, as a commit's is.
                    if error.is_in_doubt() {
                        let _ = pipeline
                            .commit(None, Some((slot, incoming.in_doubt())), None, &trace)
                            .await;
                    }
                    return Err(error.into());
                }
            };
            // The record is in Kafka, so the delivery is answered 2xx. A
            // failed write raised the ledger's fence, which keeps it and
            // writes it before the ledger is read again; the fence logs the
            // failure.
            let placed = Some(sending.placed(&record.topic, delivered.partition, delivered.offset));
            // In the simulation, the moment between an acknowledgement and
            // its commit that a thread beside them (a checkpoint) may see.
            #[cfg(test)]
            super::sim::between_ack_and_commit().await;
            let committed = pipeline
                .commit(lease, Some((slot, incoming)), placed, &trace)
                .await;
            if let Err(error) = committed {
                debug!(entity = %record.key, %error, "Published; its ledger write waits behind the fence.");
            }
            Ok(Written::Done(Outcome::Published))
        })
        .await
    }

    /// The guard's decision under the entity's lock, which the caller holds
    /// until the decision is carried out.
    async fn guard(
        &self,
        slot: &EntitySlot,
        incoming: &EntityState,
        origin: Origin,
    ) -> Result<(EntityLock, Decision), LedgerError> {
        let (lock, written) = self.inner.ledger.lock_and_read(slot).await?;
        Ok((lock, guard::decide(written.as_ref(), incoming, origin)))
    }

    /// An event's record value on its topic: none for a deleted entity (a
    /// tombstone), else its encoding.
    pub(super) fn payload(&self, event: &PosEvent) -> Result<Option<Vec<u8>>, EncodeError> {
        if event.deleted {
            return Ok(None);
        }
        let topic = self.inner.topics.entity(event.entity_type);
        self.inner.encoder.encode(topic, event).map(Some)
    }

    /// Records a durable outcome in the ledger: the delivery done (which
    /// ends its `lease`), the entity's new state, or both, with where its
    /// record lies (`placed`); nothing to write, nothing done. A commit
    /// that fails gives the lease back itself
    /// ([`crate::adapters::ledger::Ledger::commit`]): the lease is ended either way.
    pub(super) async fn commit(
        &self,
        lease: Option<Lease>,
        entity: Option<(EntitySlot, EntityState)>,
        placed: Option<Placed>,
        trace: &DeliveryTrace,
    ) -> Result<(), LedgerError> {
        if lease.is_none() && entity.is_none() && placed.is_none() {
            return Ok(());
        }
        let committing = trace.stage(Stage::Commit);
        let committed = committing.result(
            self.inner
                .ledger
                .commit(Commit {
                    delivery: lease.as_ref().map(|lease| lease.key().clone()),
                    entity,
                    checkpoint: None,
                    placed,
                })
                .await,
        );
        if let Some(lease) = lease {
            lease.ended();
        }
        committed
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
        let written = self.dead_letter_in(letter, None, &trace).await;
        match &written {
            Ok(()) => trace.outcome(Outcome::DeadLettered.as_str(), Some(code)),
            Err(error) => trace.failed(error),
        }
        written
    }

    /// [`Pipeline::dead_letter`] under the span `trace`, then the delivery
    /// of `lease` (when there is one) committed done. Like an entity's
    /// record, the letter's acknowledgement and the commit run to their end
    /// when the caller stops waiting, the lease held: a letter Kafka takes
    /// after the answer deadline is not written again by the retry.
    pub(super) async fn dead_letter_in(
        &self,
        letter: DeadLetter<'_>,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Result<(), PipelineError> {
        // Said once the letter is in the topic.
        let (provider, code) = (letter.provider, letter.code);
        let (source, delivery_id, reason) = (
            letter.source.to_owned(),
            letter.delivery_id.to_owned(),
            letter.reason.clone(),
        );
        let topic = self.inner.topics.dead_letter();
        let producing = trace.produce(topic);
        let record = dead_letter_record(letter, topic, producing.record_headers());
        let pipeline = self.clone();
        let trace = trace.clone();
        self.to_the_end(async move {
            let producer = &pipeline.inner.producer;
            let sending = pipeline.inner.ledger.sending();
            let topic = record.topic.clone();
            let sent = match producer.send(&record).await {
                // Too large whole: a cut copy is still a permanent outcome,
                // where refusing would ask the provider to retry what can
                // never fit. It is cut to what the topic takes now, and to
                // no body at all should even that be refused (the limit
                // lowered meanwhile).
                Err(error) if error.is_too_large() => {
                    let limit = producer.topic_limit(&record.topic).await;
                    let why = match limit {
                        Some(limit) => format!(
                            "the dead-letter topic takes at most {limit} bytes (max.message.bytes): {error}"
                        ),
                        None => error.to_string(),
                    };
                    warn!(%error, limit, "Dead letter refused whole; writing the head that fits, with the body's length and hash.");
                    match producer.send(&cut_dead_letter(record.clone(), limit, &why)).await {
                        Err(error) if error.is_too_large() => {
                            producer
                                .send(&cut_dead_letter(record, Some(0), &why))
                                .await
                        }
                        sent => sent,
                    }
                }
                sent => sent,
            };
            let delivered = producing.result(sent)?;
            observe::dead_lettered(DeadLetterSeen {
                provider,
                source: &source,
                delivery_id: &delivery_id,
                code,
                reason: &reason,
            });
            pipeline
                .inner
                .dead_letters
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let placed = Some(sending.placed(&topic, delivered.partition, delivered.offset));
            pipeline.commit(lease, None, placed, &trace).await?;
            Ok(())
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
