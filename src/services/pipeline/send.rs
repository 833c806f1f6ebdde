//! The last stage of every path: a record sent, its acknowledgement
//! awaited, and what it makes durable committed to the ledger. Once a
//! record is [`Outgoing`] it may reach Kafka, so this stage is never cut:
//! it runs to its commit on the work's own task (`tasks.rs`), the entity's
//! lock and the delivery's lease held, even when the caller stopped
//! waiting. A record Kafka takes after that, with no state in the ledger,
//! would otherwise be written again by the provider's retry.

use super::lease::Lease;
use super::{DeadLetter, Outcome, Pipeline, PipelineError, cut_dead_letter, dead_letter_record};
use crate::adapters::ledger::{
    Answered, Commit, Done, EntityLock, EntitySlot, Held, LedgerError, Placed, Recorded, Sending,
};
use crate::adapters::publish::{OutgoingRecord, PublishError};
use crate::domain::event::{PosEvent, ProviderKind};
use crate::domain::guard::EntityState;
use crate::domain::record_at::RecordAt;
use crate::observe::delivery::{self as observe, DeadLetterSeen};
use crate::observe::traces::{DeliveryTrace, Stage, StageSpan};

/// A record ready to send: an entity's new state, or a dead letter.
pub(super) enum Outgoing {
    /// An entity's new state.
    State(NewState),
    /// A body that could not become an event.
    Letter(Letter),
}

/// An entity's new state ready to send, its lock held until the state is
/// committed.
pub(super) struct NewState {
    ready: Ready,
    /// The entity's lock, taken for the guard's decision.
    _lock: EntityLock,
    slot: EntitySlot,
    state: EntityState,
    /// For its dead letter, should the broker refuse it for good.
    event: Box<PosEvent>,
}

/// A dead letter ready to send.
pub(super) struct Letter {
    ready: Ready,
    said: Said,
}

/// What every record ready to send carries to its commit.
struct Ready {
    record: OutgoingRecord,
    /// Taken before the record may reach Kafka and held until the commit
    /// is done with where it lies: no checkpoint counts its partition past
    /// it before its outcome is in the ledger.
    sending: Sending,
    /// The produce stage's span, whose context the record carries.
    producing: StageSpan,
    /// The delivery's lease (none for a reconciled record or a dead letter
    /// of the drainer's or the reconciler's): ended by the commit, given
    /// back on a failure.
    lease: Option<Lease>,
    trace: DeliveryTrace,
}

/// What a dead letter says once it is in its topic.
struct Said {
    provider: ProviderKind,
    source: String,
    delivery_id: String,
    code: &'static str,
    reason: String,
}

/// What sending an entity's new state came to.
pub(super) enum StateSent {
    /// The state is in its topic and in the ledger.
    Published,
    /// The broker will not take the record, ever (too large, the topic
    /// gone): nothing is committed, and the caller dead-letters it or
    /// reports it.
    Refused(Refusal),
}

/// An entity's record the broker refused for good.
pub(super) struct Refusal {
    /// The event, for its dead letter.
    pub(super) event: Box<PosEvent>,
    /// The delivery's lease, for the dead letter's commit.
    pub(super) lease: Option<Lease>,
    pub(super) trace: DeliveryTrace,
    /// A bounded reason code.
    pub(super) code: &'static str,
    /// The reason in words.
    pub(super) reason: String,
}

/// One durable outcome, as the ledger records it.
pub(super) enum Durable {
    /// Nothing to write to a topic (stale, unchanged, the outcome): the
    /// delivery of the lease, when there is one, is done.
    Decided(Option<Lease>, Recorded),
    /// An entity's state acknowledged: the state, and the delivery done.
    Published {
        lease: Option<Lease>,
        slot: EntitySlot,
        state: EntityState,
        placed: Placed,
    },
    /// An entity's record that may be in its topic: its state kept in
    /// doubt, so no older event passes the guard meanwhile and lands after
    /// it. The delivery stays undone, and its retry publishes the state
    /// again.
    InDoubt {
        slot: EntitySlot,
        state: EntityState,
    },
    /// A dead letter acknowledged: the delivery done.
    DeadLettered {
        lease: Option<Lease>,
        placed: Placed,
    },
}

impl Pipeline {
    /// An entity's record, ready to send under its lock.
    pub(super) fn outgoing_state(
        &self,
        record: OutgoingRecord,
        producing: StageSpan,
        (lock, slot, state): (EntityLock, EntitySlot, EntityState),
        event: PosEvent,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> NewState {
        NewState {
            ready: self.ready(record, producing, lease, trace),
            _lock: lock,
            slot,
            state,
            event: Box::new(event),
        }
    }

    /// A dead letter, ready to send.
    pub(super) fn outgoing_letter(
        &self,
        letter: DeadLetter<'_>,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Letter {
        let said = Said {
            provider: letter.provider,
            source: letter.source.to_owned(),
            delivery_id: letter.delivery_id.to_owned(),
            code: letter.code,
            reason: letter.reason.clone(),
        };
        let topics = self.inner.topics.of(letter.topic_prefix);
        let topic = topics.dead_letter();
        let producing = trace.produce(topic);
        let record = dead_letter_record(letter, topic, producing.record_headers());
        Letter {
            ready: self.ready(record, producing, lease, trace),
            said,
        }
    }

    /// `record`, about to be handed to the producer: its send opened.
    fn ready(
        &self,
        record: OutgoingRecord,
        producing: StageSpan,
        lease: Option<Lease>,
        trace: &DeliveryTrace,
    ) -> Ready {
        Ready {
            record,
            sending: self.inner.ledger.sending(),
            producing,
            lease,
            trace: trace.clone(),
        }
    }

    /// Sends an entity's new state, then commits it. On a failure the
    /// delivery's lease is given back before this returns, so that a retry
    /// may take it at once.
    ///
    /// # Errors
    /// [`PipelineError::Publish`] when the broker did not acknowledge it.
    /// A failed commit after the acknowledgement is not an error: the
    /// ledger's fence keeps the write and makes it before the ledger is
    /// read again (and logs the failure).
    pub(super) async fn send_state(&self, outgoing: NewState) -> Result<StateSent, PipelineError> {
        let NewState {
            ready,
            _lock,
            slot,
            state,
            event,
        } = outgoing;
        let Ready {
            record,
            sending,
            producing,
            lease,
            trace,
        } = ready;
        let delivered = match producing.result(self.inner.producer.send(&record).await) {
            Ok(delivered) => delivered,
            Err(PublishError::Refused(reason)) => {
                return Ok(StateSent::Refused(Refusal {
                    event,
                    lease,
                    trace,
                    code: PublishError::refusal_code(&reason),
                    reason: reason.to_string(),
                }));
            }
            Err(error) => {
                if error.is_in_doubt() {
                    let in_doubt = Durable::InDoubt {
                        slot,
                        state: state.in_doubt(),
                    };
                    let _ = self.commit(in_doubt, &trace).await;
                }
                give_back(lease).await;
                return Err(error.into());
            }
        };
        let placed = sending.placed(delivered);
        // In the simulation, the moment between an acknowledgement and its
        // commit that a thread beside them (a checkpoint) may see.
        #[cfg(test)]
        super::sim::between_ack_and_commit().await;
        let published = Durable::Published {
            lease,
            slot,
            state,
            placed,
        };
        if let Err(error) = self.commit(published, &trace).await {
            observe::committed_behind_fence(&record.key, &error);
        }
        Ok(StateSent::Published)
    }

    /// Sends a dead letter, then commits its delivery done; its reason
    /// code. On a failure the delivery's lease is given back before this
    /// returns.
    ///
    /// # Errors
    /// [`PipelineError::Publish`] when the broker did not acknowledge it;
    /// [`PipelineError::Ledger`] when the commit failed.
    pub(super) async fn send_letter(
        &self,
        outgoing: Letter,
    ) -> Result<&'static str, PipelineError> {
        let Letter { ready, said } = outgoing;
        let Ready {
            record,
            sending,
            producing,
            lease,
            trace,
        } = ready;
        let delivered = match producing.result(self.send_letter_record(&record).await) {
            Ok(delivered) => delivered,
            Err(error) => {
                give_back(lease).await;
                return Err(error.into());
            }
        };
        observe::dead_lettered(DeadLetterSeen {
            provider: said.provider,
            source: &said.source,
            delivery_id: &said.delivery_id,
            code: said.code,
            reason: &said.reason,
        });
        self.inner
            .dead_letters
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let placed = sending.placed(delivered);
        self.commit(Durable::DeadLettered { lease, placed }, &trace)
            .await?;
        Ok(said.code)
    }

    /// Sends `outgoing`, and an entity's record the broker refuses for
    /// good dead-lettered in its place: the outcome, with a dead letter's
    /// reason code.
    ///
    /// # Errors
    /// As [`Pipeline::send_state`] and [`Pipeline::send_letter`].
    pub(super) async fn send_or_dead_letter(
        &self,
        outgoing: Outgoing,
    ) -> Result<(Outcome, Option<&'static str>), PipelineError> {
        let refusal = match outgoing {
            Outgoing::Letter(letter) => {
                let code = self.send_letter(letter).await?;
                return Ok((Outcome::DeadLettered, Some(code)));
            }
            Outgoing::State(state) => match self.send_state(state).await? {
                StateSent::Published => return Ok((Outcome::Published, None)),
                StateSent::Refused(refusal) => refusal,
            },
        };
        let Refusal {
            event,
            lease,
            trace,
            code,
            reason,
        } = refusal;
        let letter = DeadLetter::of_event(&event, code, reason);
        let letter = self.outgoing_letter(letter, lease, &trace);
        Ok((Outcome::DeadLettered, Some(self.send_letter(letter).await?)))
    }

    /// Sends a dead letter. Too large whole, a cut copy is still a
    /// permanent outcome, where refusing would ask the provider to retry
    /// what can never fit: it is cut to what the topic takes now, and to no
    /// body at all should even that be refused (the limit lowered
    /// meanwhile).
    async fn send_letter_record(&self, record: &OutgoingRecord) -> Result<RecordAt, PublishError> {
        let producer = &self.inner.producer;
        match producer.send(record).await {
            Err(error) if error.is_too_large() => {
                let limit = producer.topic_limit(&record.topic).await;
                let why = match limit {
                    Some(limit) => format!(
                        "the dead-letter topic takes at most {limit} bytes (max.message.bytes): {error}"
                    ),
                    None => error.to_string(),
                };
                observe::dead_letter_cut(&error, limit);
                match producer
                    .send(&cut_dead_letter(record.clone(), limit, &why))
                    .await
                {
                    Err(error) if error.is_too_large() => {
                        producer
                            .send(&cut_dead_letter(record.clone(), Some(0), &why))
                            .await
                    }
                    sent => sent,
                }
            }
            sent => sent,
        }
    }

    /// Records a durable outcome in the ledger, which ends the lease it
    /// holds. A commit that fails gives the lease back itself
    /// ([`crate::adapters::ledger::Ledger::commit`]): the lease is ended
    /// either way.
    pub(super) async fn commit(
        &self,
        durable: Durable,
        trace: &DeliveryTrace,
    ) -> Result<(), LedgerError> {
        // What the delivery holding `lease` came to, written with it.
        let done = |lease: &Lease, recorded, placed: Option<&Placed>| Done {
            key: lease.key().clone(),
            answered: Answered::now(recorded, placed.map(|placed| placed.at.clone())),
            read_back: false,
        };
        let (lease, commit) = match durable {
            Durable::Decided(None, _) => return Ok(()),
            Durable::Decided(Some(lease), recorded) => {
                let commit = Commit::done(done(&lease, recorded, None));
                (Some(lease), commit)
            }
            Durable::Published {
                lease,
                slot,
                state,
                placed,
            } => {
                let done = lease
                    .as_ref()
                    .map(|lease| done(lease, Recorded::Published, Some(&placed)));
                (lease, Commit::published(done, slot, state, placed))
            }
            Durable::InDoubt { slot, state } => (None, Commit::state(slot, Held::unplaced(state))),
            Durable::DeadLettered { lease, placed } => {
                let done = lease
                    .as_ref()
                    .map(|lease| done(lease, Recorded::DeadLettered, Some(&placed)));
                (lease, Commit::dead_lettered(done, placed))
            }
        };
        let committing = trace.stage(Stage::Commit);
        let committed = committing.result(self.inner.ledger.commit(commit).await);
        if let Some(lease) = lease {
            lease.ended();
        }
        committed
    }
}

/// Gives a failed delivery's lease back before its answer, so that the
/// retry may take the delivery at once.
async fn give_back(lease: Option<Lease>) {
    if let Some(lease) = lease {
        lease.give_back().await;
    }
}
