//! The data line, in one place: ledger → normalize → guard → encode → publish
//! → ledger.
//!
//! The webhook handler calls [`Pipeline::deliver`] with a verified body; the
//! reconciler calls [`Pipeline::apply`] with events it normalized from the
//! providers' APIs; the dead-letter replay calls [`Pipeline::redeliver`] with
//! a dead letter's body. All end in the same guard and the same producer, so
//! neither a reconciled record nor an old dead letter can roll an entity
//! back. The records themselves are built without I/O in `record.rs`.
//!
//! A delivery id becomes *done* only once its outcome is durable: the record
//! acknowledged by Kafka, the raw body dead-lettered, or the event judged
//! stale or unchanged. Any failure before that releases the lease and answers
//! "try again", so the provider's retry is processed.

#[cfg(test)]
mod fuzz;
mod record;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use time::OffsetDateTime;
use tracing::{Instrument, debug, info, warn};

use crate::encode::{EncodeError, Encoder};
use crate::event::{
    Content, DeliveryKey, EntityKey, Normalized, Origin, PosEvent, ProviderKind, Source,
};
use crate::guard::{self, Decision};
use crate::ledger::{Begin, Commit, EntitySlot, EntityState, Ledger, LedgerError};
use crate::providers::{self, Context, NormalizeError};
use crate::publish::{PublishError, Publisher, Topics};
use crate::spool::{Spool, SpoolError, SpooledDelivery};
use crate::telemetry;
use crate::verify::VerifiedBody;

pub use record::{
    DEAD_LETTER_KEPT_BYTES, DeadLetter, HEADER_BODY_BYTES, HEADER_BODY_SHA256, HEADER_DELIVERY_ID,
    HEADER_EVENT_TYPE, HEADER_ORIGIN, HEADER_PROVIDER, HEADER_REASON, HEADER_REASON_CODE,
    HEADER_SOURCE, cut_dead_letter, dead_letter_record, entity_record,
};

/// How often a duplicate re-checks the ledger while the first attempt runs.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

/// What the pipeline did with an event; the `outcome` metric label of a
/// handled request and of a reconciled record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Produced and acknowledged (including tombstones).
    Published,
    /// Already handled, nothing produced.
    Duplicate,
    /// Older than the entity's written state, not produced.
    Stale,
    /// Same content as written, not produced.
    Unchanged,
    /// Written to the dead-letter topic.
    DeadLettered,
    /// Kafka could not take it in time: kept in the outage spool, to be
    /// published by the drainer.
    Spooled,
}

impl Outcome {
    /// Every outcome, for series that exist from start-up.
    pub const ALL: [Outcome; 6] = [
        Outcome::Published,
        Outcome::Duplicate,
        Outcome::Stale,
        Outcome::Unchanged,
        Outcome::DeadLettered,
        Outcome::Spooled,
    ];

    /// The label value, and the `status` of the 2xx answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Published => "published",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Unchanged => "unchanged",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Spooled => "spooled",
        }
    }
}

/// What became of a webhook delivery, with what the operator's page shows
/// of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The outcome, answered 2xx.
    pub outcome: Outcome,
    /// The provider's event type, once the body was read as an event.
    pub event_type: Option<String>,
    /// The entity's record key, once the event was normalized.
    pub entity_key: Option<String>,
    /// A dead letter's reason code, so the operator sees why without
    /// reading the dead-letter topic.
    pub dead_letter_reason: Option<&'static str>,
}

impl Handled {
    /// An outcome decided before the body was read as an event.
    fn bare(outcome: Outcome) -> Handled {
        Handled {
            outcome,
            event_type: None,
            entity_key: None,
            dead_letter_reason: None,
        }
    }
}

/// Why a delivery was not handled. The ingress turns each into a status.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The delivery id header does not equal the body's `id`: retrying the
    /// same bytes cannot help.
    #[error("the delivery id header does not equal the body's `id`")]
    DeliveryIdMismatch,
    /// A duplicate waited for the same delivery in flight, and it is still
    /// running.
    #[error("the same delivery is still being processed")]
    InFlight,
    /// The ledger could not be read or written.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The record was not acknowledged in time.
    #[error("publish: {0}")]
    Publish(#[from] PublishError),
    /// The event could not be encoded for its topic (none the encoder was
    /// built for: a bug, retried in case a restart mends it).
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The answer budget (`delivery_timeout_ms` + `inflight_wait_ms`) ran out.
    #[error("no durable outcome within the answer budget")]
    DeadlinePassed,
    /// The outage spool could not take the delivery (full, or its disk failed).
    #[error("spool: {0}")]
    Spool(#[from] SpoolError),
}

impl PipelineError {
    /// Whether the provider's retry may succeed: everything but a request
    /// that is wrong in itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, PipelineError::DeliveryIdMismatch)
    }

    /// Whether the cause is a state already logged once when it began (no
    /// broker answers, ledger writes failing), so each refused delivery need
    /// not say it again.
    pub fn is_announced(&self) -> bool {
        matches!(
            self,
            PipelineError::Publish(PublishError::BrokerDown)
                | PipelineError::Ledger(LedgerError::Unwritable { .. })
        )
    }

    /// Whether the spool may take the delivery instead: Kafka, the registry
    /// or the ledger could not make its outcome durable in time (not a wrong
    /// request, and not the same delivery still being processed).
    fn spoolable(&self) -> bool {
        !matches!(
            self,
            PipelineError::DeliveryIdMismatch | PipelineError::InFlight | PipelineError::Spool(_)
        )
    }
}

/// What putting a dead letter through again came to, or on a dry run would
/// come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redelivery {
    /// Through the guard: `Published`, `Stale` or `Unchanged` (on a dry run,
    /// what the guard decides against the ledger now).
    Applied {
        /// What the guard decided, and for a redelivery what was done.
        outcome: Outcome,
        /// The entity it is about.
        entity: EntityKey,
    },
    /// It still cannot be normalized, encoded or taken by the broker. It is
    /// not dead-lettered again: its dead letter is still on the topic.
    StillFailing {
        /// A bounded reason code, as on a dead letter.
        code: &'static str,
        /// The reason in words.
        reason: String,
    },
}

impl Redelivery {
    fn still_failing(code: &'static str, reason: impl ToString) -> Redelivery {
        Redelivery::StillFailing {
            code,
            reason: reason.to_string(),
        }
    }
}

/// The reason code of a body whose `id` names another delivery than its
/// dead letter's header: only a foreign record can look like that.
const MISMATCH_CODE: &str = "delivery_id_mismatch";

/// What guard → encode → publish → commit came to.
enum Written {
    /// A durable outcome.
    Done(Outcome),
    /// Refused for good before it reached its topic (the broker will not
    /// take it). Nothing is committed: the
    /// caller dead-letters it or reports it.
    Refused {
        /// The event, for its dead letter.
        event: Box<PosEvent>,
        /// A bounded reason code.
        code: &'static str,
        /// The reason in words.
        reason: String,
    },
}

/// One verified webhook delivery, owned, on its way down the line.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Through which configured webhook (and so which provider).
    pub source: Arc<Source>,
    /// The delivery-id header's value.
    pub delivery_id: String,
    /// The signed body.
    pub body: VerifiedBody,
    /// When it arrived.
    pub received_at: OffsetDateTime,
    /// When its request started: the answer budget counts from here.
    pub arrived: Instant,
    /// Whether its source spools what Kafka cannot take in time
    /// (`on_broker_unavailable = "spool"`).
    pub spools: bool,
}

/// The pipeline handle, shared by the ingress and the reconciler. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

struct Inner {
    /// Delivery ids, entity versions, locks.
    ledger: Arc<dyn Ledger>,
    /// Avro, with or without a registry.
    encoder: Encoder,
    /// The idempotent producer.
    publisher: Publisher,
    /// Where each record goes.
    topics: Topics,
    /// How long a duplicate waits for the same delivery in flight.
    inflight_wait: Duration,
    /// How long a webhook may take from its request to its answer.
    answer_budget: Duration,
    /// How far ahead of its arrival a webhook's event time may lie.
    max_event_ahead: Duration,
    /// The outage spool, when any source spools.
    spool: Option<Spool>,
    /// Dead letters written since start, whichever path wrote them.
    dead_letters: std::sync::atomic::AtomicU64,
    /// The webhook deliveries running, each on a task of its own; shutdown
    /// waits for them.
    deliveries: tokio_util::task::TaskTracker,
}

/// The part of the answer budget kept for the spool's fsync (at most a
/// quarter of the budget): a delivery that spools stops waiting for Kafka
/// this long before its deadline.
const SPOOL_MARGIN: Duration = Duration::from_millis(1000);

/// The stages a [`Pipeline`] joins; each is built from config by `App::build`.
pub struct Stages {
    /// Delivery ids, entity versions, locks.
    pub ledger: Arc<dyn Ledger>,
    /// Avro, with or without a registry.
    pub encoder: Encoder,
    /// The idempotent producer.
    pub publisher: Publisher,
    /// Where each record goes.
    pub topics: Topics,
    /// The outage spool, when any source spools.
    pub spool: Option<Spool>,
}

/// The pipeline's time limits, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a duplicate waits for the same delivery in flight.
    pub inflight_wait: Duration,
    /// How long a webhook may take from its request to its answer.
    pub answer_budget: Duration,
    /// How far ahead of its arrival a webhook's event time may lie
    /// (`server.max_event_ahead_ms`); later ones are dead-lettered.
    pub max_event_ahead: Duration,
}

impl Pipeline {
    /// Joins the stages; each is built from config by `App::build`.
    pub fn new(stages: Stages, timing: Timing) -> Pipeline {
        let Stages {
            ledger,
            encoder,
            publisher,
            topics,
            spool,
        } = stages;
        Pipeline {
            inner: Arc::new(Inner {
                ledger,
                encoder,
                publisher,
                topics,
                inflight_wait: timing.inflight_wait,
                answer_budget: timing.answer_budget,
                max_event_ahead: timing.max_event_ahead,
                spool,
                dead_letters: std::sync::atomic::AtomicU64::new(0),
                deliveries: tokio_util::task::TaskTracker::new(),
            }),
        }
    }

    /// A pipeline that needs no broker, for tests of everything short of an
    /// acknowledged record: an embedded ledger and a spool of three entries
    /// in `dir`, the registry-less encoder, and a broker address that refuses
    /// connections, so whatever would be produced fails retryably within 300 ms.
    #[cfg(test)]
    pub(crate) async fn without_broker(dir: &std::path::Path, inflight_wait: Duration) -> Pipeline {
        use crate::config::{Config, KafkaConfig, LedgerConfig, RegistryConfig};
        let kafka = KafkaConfig {
            // Nothing listens on port 1.
            brokers: "127.0.0.1:1".into(),
            delivery_timeout_ms: 300,
            ..KafkaConfig::default()
        };
        let ledger = LedgerConfig {
            path: dir.join("ledger.redb"),
            ..LedgerConfig::default()
        };
        Pipeline::new(
            Stages {
                ledger: crate::ledger::open(&ledger, Duration::from_secs(30))
                    .await
                    .expect("a fresh ledger file opens"),
                encoder: Encoder::new(&RegistryConfig::default(), &[])
                    .await
                    .expect("the registry-less encoder needs nothing"),
                publisher: Publisher::new(&kafka, Config::default().max_record_bytes())
                    .expect("default producer settings are valid"),
                topics: Topics::new(&kafka),
                spool: Some(
                    Spool::open(&crate::config::SpoolConfig {
                        path: dir.join("spool.redb"),
                        max_bytes: 1 << 20,
                        max_entries: 3,
                    })
                    .expect("a fresh spool file opens"),
                ),
            },
            Timing {
                inflight_wait,
                answer_budget: Duration::from_millis(300) + inflight_wait,
                max_event_ahead: crate::config::ServerConfig::default().max_event_ahead(),
            },
        )
    }

    /// The outage spool, when any source spools.
    pub fn spool(&self) -> Option<&Spool> {
        self.inner.spool.as_ref()
    }

    /// The producer, for readiness checks and the shutdown flush.
    pub fn publisher(&self) -> &Publisher {
        &self.inner.publisher
    }

    /// The encoder, for readiness checks.
    pub fn encoder(&self) -> &Encoder {
        &self.inner.encoder
    }

    /// The ledger, for readiness checks and the reconciler's checkpoints.
    pub fn ledger(&self) -> &dyn Ledger {
        self.inner.ledger.as_ref()
    }

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
        let span = tracing::Span::current();
        let task = self
            .inner
            .deliveries
            .spawn(async move { pipeline.deliver_here(delivery).await }.instrument(span));
        match task.await {
            Ok(result) => result,
            // A panic in the delivery: the ingress answers a panic 503.
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }

    /// Waits, at most `timeout`, for the deliveries still running (those
    /// whose requests went away included) to reach their outcome.
    pub async fn finish_deliveries(&self, timeout: Duration) {
        self.inner.deliveries.close();
        if tokio::time::timeout(timeout, self.inner.deliveries.wait())
            .await
            .is_err()
        {
            warn!(
                running = self.inner.deliveries.len(),
                "Deliveries still running at the end of the shutdown budget."
            );
        }
    }

    /// [`Pipeline::deliver`] on the caller's task.
    async fn deliver_here(&self, delivery: Delivery) -> Result<Handled, PipelineError> {
        let (key, envelope) = identify(&delivery)?;
        let deadline = delivery.arrived + self.inner.answer_budget;
        let spool = self.inner.spool.as_ref().filter(|_| delivery.spools);
        // A delivery that may spool stops waiting for Kafka early enough to
        // make the append durable before its deadline.
        let work_deadline = match spool {
            Some(_) => deadline - SPOOL_MARGIN.min(self.inner.answer_budget / 4),
            None => deadline,
        };
        let result = self
            .run(delivery.clone(), envelope, &key, work_deadline, true)
            .await;
        match (result, spool) {
            (Err(error), Some(spool)) if error.spoolable() => {
                let spooled = SpooledDelivery {
                    key,
                    source: delivery.source.as_ref().clone(),
                    delivery_id: delivery.delivery_id,
                    received_at: delivery.received_at,
                    body: delivery.body.bytes().clone(),
                };
                match tokio::time::timeout_at(deadline.into(), spool.append(&spooled)).await {
                    Ok(Ok(())) => {
                        debug!(%error, "Delivery spooled.");
                        metrics::counter!(
                            telemetry::SPOOLED,
                            telemetry::PROVIDER => spooled.source.provider.as_str(),
                            telemetry::SOURCE => spooled.source.name.clone()
                        )
                        .increment(1);
                        Ok(Handled::bare(Outcome::Spooled))
                    }
                    Ok(Err(spool_error)) => Err(spool_error.into()),
                    Err(_) => Err(PipelineError::DeadlinePassed),
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
    pub async fn replay(&self, delivery: Delivery) -> Result<Outcome, PipelineError> {
        let (key, envelope) = identify(&delivery)?;
        let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
        let handled = self.run(delivery, envelope, &key, deadline, false).await?;
        Ok(handled.outcome)
    }

    /// Takes the lease, processes, and gives the lease back on failure; all
    /// before `deadline`. With `spooled_is_duplicate` (a provider's delivery,
    /// not a replay), a delivery id the spool holds is a duplicate.
    async fn run(
        &self,
        delivery: Delivery,
        envelope: Envelope,
        key: &DeliveryKey,
        deadline: Instant,
        spooled_is_duplicate: bool,
    ) -> Result<Handled, PipelineError> {
        let provider = delivery.source.provider;
        let acquired = tokio::time::timeout_at(deadline.into(), self.acquire(key, false))
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed));
        if !acquired? {
            return Ok(Handled::bare(self.duplicate(provider)));
        }
        if let Some(spool) = &self.inner.spool
            && spooled_is_duplicate
        {
            match spool.contains(key) {
                Ok(false) => {}
                Ok(true) => {
                    self.inner.ledger.release(key).await;
                    return Ok(Handled::bare(self.duplicate(provider)));
                }
                Err(error) => {
                    self.inner.ledger.release(key).await;
                    return Err(error.into());
                }
            }
        }
        // Boxed: the processing future is a few KiB, and `leased` would
        // otherwise hold it twice (its argument and its timeout) inside every
        // future above it, each copied whole whenever the webhook handler's
        // future moves.
        let work = Box::pin(self.process(delivery, envelope, key.clone()));
        self.leased(key, provider, deadline, work, Result::is_ok)
            .await
    }

    /// Runs `work` for a delivery whose lease the caller took, before
    /// `deadline`, counted in flight; gives the lease back unless `ended`
    /// says the outcome's commit ended it.
    async fn leased<T>(
        &self,
        key: &DeliveryKey,
        provider: ProviderKind,
        deadline: Instant,
        work: impl Future<Output = Result<T, PipelineError>>,
        ended: impl FnOnce(&Result<T, PipelineError>) -> bool,
    ) -> Result<T, PipelineError> {
        let _in_flight = InFlight::count(provider);
        let result = tokio::time::timeout_at(deadline.into(), work)
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed));
        if !ended(&result) {
            self.inner.ledger.release(key).await;
        }
        result
    }

    fn duplicate(&self, provider: ProviderKind) -> Outcome {
        metrics::counter!(telemetry::DUPLICATES, telemetry::PROVIDER => provider.as_str())
            .increment(1);
        debug!("Duplicate delivery answered without producing.");
        Outcome::Duplicate
    }

    /// Takes the delivery's lease. `Ok(false)` means it is already done
    /// (never with `again`, which leases a done delivery too). A duplicate of
    /// an attempt in flight waits for it: if that attempt fails and releases,
    /// this one takes over.
    async fn acquire(&self, key: &DeliveryKey, again: bool) -> Result<bool, PipelineError> {
        let deadline = Instant::now() + self.inner.inflight_wait;
        loop {
            let begun = if again {
                self.inner.ledger.begin_again(key).await?
            } else {
                self.inner.ledger.begin(key).await?
            };
            match begun {
                Begin::New => return Ok(true),
                Begin::Done => return Ok(false),
                Begin::InFlight if Instant::now() >= deadline => {
                    return Err(PipelineError::InFlight);
                }
                Begin::InFlight => tokio::time::sleep(IN_FLIGHT_POLL).await,
            }
        }
    }

    async fn process(
        &self,
        delivery: Delivery,
        envelope: Envelope,
        key: DeliveryKey,
    ) -> Result<Handled, PipelineError> {
        match self.normalize(&delivery, envelope) {
            Ok(normalized) => {
                let event_type = Some(normalized.event.event_type.clone());
                let entity = normalized.event.key();
                let (outcome, dead_letter_reason) =
                    self.apply_as(normalized, &entity, Some(key)).await?;
                Ok(Handled {
                    outcome,
                    event_type,
                    entity_key: Some(entity.into_string()),
                    dead_letter_reason,
                })
            }
            Err(reason) => {
                let code = reason.code();
                self.dead_letter(DeadLetter {
                    provider: delivery.source.provider,
                    source: &delivery.source.name,
                    delivery_id: &delivery.delivery_id,
                    received_at: delivery.received_at,
                    body: delivery.body.bytes().to_vec(),
                    code,
                    reason: reason.to_string(),
                })
                .await?;
                self.commit(Some(key), None).await?;
                Ok(Handled {
                    dead_letter_reason: Some(code),
                    ..Handled::bare(Outcome::DeadLettered)
                })
            }
        }
    }

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
    pub async fn redeliver(&self, delivery: Delivery) -> Result<Redelivery, PipelineError> {
        let (key, envelope) = match identify(&delivery) {
            Ok(identified) => identified,
            Err(error) => return Ok(Redelivery::still_failing(MISMATCH_CODE, error)),
        };
        let deadline = Instant::now() + self.inner.inflight_wait + self.inner.answer_budget;
        tokio::time::timeout_at(deadline.into(), self.acquire(&key, true))
            .await
            .unwrap_or(Err(PipelineError::DeadlinePassed))?;
        let work = self.redeliver_leased(&delivery, envelope, key.clone());
        // A durable outcome ended the lease with its commit.
        let applied = |result: &Result<Redelivery, PipelineError>| {
            matches!(result, Ok(Redelivery::Applied { .. }))
        };
        self.leased(&key, delivery.source.provider, deadline, work, applied)
            .await
    }

    /// Normalize → guard → encode → publish → commit, a refusal reported.
    async fn redeliver_leased(
        &self,
        delivery: &Delivery,
        envelope: Envelope,
        key: DeliveryKey,
    ) -> Result<Redelivery, PipelineError> {
        let normalized = match self.normalize(delivery, envelope) {
            Ok(normalized) => normalized,
            Err(reason) => return Ok(Redelivery::still_failing(reason.code(), reason)),
        };
        let entity = normalized.event.key();
        Ok(match self.write(normalized, &entity, Some(key)).await? {
            Written::Done(outcome) => Redelivery::Applied { outcome, entity },
            Written::Refused { code, reason, .. } => Redelivery::StillFailing { code, reason },
        })
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

    /// Guards, encodes and publishes one normalized event, then records the
    /// outcome (and `delivery`, when there is one) in the ledger; what cannot
    /// be written goes to the dead-letter topic. The reconciler's entry point.
    ///
    /// # Errors
    /// [`PipelineError`] when the record could not be acknowledged or the
    /// ledger could not be read.
    pub async fn apply(
        &self,
        normalized: Normalized,
        delivery: Option<DeliveryKey>,
    ) -> Result<Outcome, PipelineError> {
        let entity = normalized.event.key();
        let (outcome, _) = self.apply_as(normalized, &entity, delivery).await?;
        Ok(outcome)
    }

    /// [`Pipeline::apply`] with the event's entity key, built once by a
    /// caller that needs it too; a dead letter's reason code with the outcome.
    async fn apply_as(
        &self,
        normalized: Normalized,
        key: &EntityKey,
        delivery: Option<DeliveryKey>,
    ) -> Result<(Outcome, Option<&'static str>), PipelineError> {
        match self.write(normalized, key, delivery.clone()).await? {
            Written::Done(outcome) => Ok((outcome, None)),
            Written::Refused {
                event,
                code,
                reason,
            } => {
                self.dead_letter(DeadLetter::of_event(&event, code, reason))
                    .await?;
                self.commit(delivery, None).await?;
                Ok((Outcome::DeadLettered, Some(code)))
            }
        }
    }

    /// Guard → encode → publish → commit, under the entity's lock; a record
    /// refused for good is handed back uncommitted. `key` is the event's
    /// entity key.
    async fn write(
        &self,
        normalized: Normalized,
        key: &EntityKey,
        delivery: Option<DeliveryKey>,
    ) -> Result<Written, PipelineError> {
        let Normalized { event, content } = normalized;
        let (slot, incoming) = entity_state(&event, key, &content);
        let _lock = self.inner.ledger.lock_entity(&slot).await?;
        let written = self.inner.ledger.entity(&slot).await?;
        match guard::decide(written.as_ref(), &incoming, event.origin) {
            Decision::Stale => {
                metrics::counter!(
                    telemetry::STALE_EVENTS,
                    telemetry::PROVIDER => event.provider.as_str(),
                    telemetry::ENTITY_TYPE => event.entity_type.as_str()
                )
                .increment(1);
                info!(
                    entity = %key,
                    event_type = %event.event_type,
                    "Stale event held back: the topic already has a newer state."
                );
                self.commit(delivery, None).await?;
                return Ok(Written::Done(Outcome::Stale));
            }
            Decision::Unchanged => {
                self.commit(delivery, None).await?;
                return Ok(Written::Done(Outcome::Unchanged));
            }
            Decision::Publish => {}
        }
        let topic = self.inner.topics.entity(event.entity_type);
        let payload = self.payload(&event)?;
        match self
            .inner
            .publisher
            .send(&entity_record(&event, key, topic, payload))
            .await
        {
            Ok(_) => {}
            Err(PublishError::Refused(reason)) => {
                return Ok(Written::Refused {
                    event: Box::new(event),
                    code: PublishError::refusal_code(&reason),
                    reason: reason.to_string(),
                });
            }
            Err(error) => return Err(error.into()),
        }
        // The record is in Kafka, so the delivery is answered 2xx. A failed
        // write raised the ledger's fence, which keeps it and writes it
        // before the ledger is read again; the fence logs the failure.
        if let Err(error) = self.commit(delivery, Some((slot, incoming))).await {
            debug!(entity = %key, %error, "Published; its ledger write waits behind the fence.");
        }
        Ok(Written::Done(Outcome::Published))
    }

    /// An event's record value on its topic: none for a deleted entity (a
    /// tombstone), else its encoding.
    fn payload(&self, event: &PosEvent) -> Result<Option<Vec<u8>>, EncodeError> {
        if event.deleted {
            return Ok(None);
        }
        let topic = self.inner.topics.entity(event.entity_type);
        self.inner.encoder.encode(topic, event).map(Some)
    }

    async fn commit(
        &self,
        delivery: Option<DeliveryKey>,
        entity: Option<(EntitySlot, EntityState)>,
    ) -> Result<(), LedgerError> {
        if delivery.is_none() && entity.is_none() {
            return Ok(());
        }
        self.inner
            .ledger
            .commit(Commit {
                delivery,
                entity,
                checkpoint: None,
            })
            .await
    }

    /// Writes what could not become an event to the dead-letter topic, with
    /// the reason in a header; also the reconciler's entry point for records
    /// it cannot normalize.
    ///
    /// # Errors
    /// [`PipelineError::Publish`] when the broker did not acknowledge it.
    pub async fn dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), PipelineError> {
        // The one log line of a dead letter, whichever stage could not go on.
        warn!(
            provider = %letter.provider,
            source = letter.source,
            delivery_id = letter.delivery_id,
            code = letter.code,
            reason = %letter.reason,
            "Event dead-lettered with its raw body."
        );
        let (provider, code) = (letter.provider, letter.code);
        let record = dead_letter_record(letter, self.inner.topics.dead_letter());
        match self.inner.publisher.send(&record).await {
            Ok(_) => {}
            // Too large whole: a cut copy is still a permanent outcome, where
            // refusing would ask the provider to retry what can never fit.
            Err(error) if error.is_too_large() => {
                warn!(%error, "Dead letter refused whole; writing its head with the body's length and hash.");
                self.inner.publisher.send(&cut_dead_letter(record)).await?;
            }
            Err(error) => return Err(error.into()),
        }
        metrics::counter!(
            telemetry::DEAD_LETTERS,
            telemetry::PROVIDER => provider.as_str(),
            telemetry::REASON => code
        )
        .increment(1);
        self.inner
            .dead_letters
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Dead letters written since start (webhooks, the reconciler, the
    /// spool's drain), for the status page.
    pub fn dead_letters_written(&self) -> u64 {
        self.inner
            .dead_letters
            .load(std::sync::atomic::Ordering::Relaxed)
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
    fn normalize(
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

/// The slot an event's entity is kept under, and the state it would write.
fn entity_state(event: &PosEvent, key: &EntityKey, content: &Content) -> (EntitySlot, EntityState) {
    (
        EntitySlot::new(event.entity_type, key),
        EntityState {
            version: event.version,
            state_hash: guard::state_hash(event, content),
        },
    )
}

/// What a signed body says of itself, before it is normalized.
enum Envelope {
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
fn identify(delivery: &Delivery) -> Result<(DeliveryKey, Envelope), PipelineError> {
    let key = DeliveryKey::new(delivery.source.provider, &delivery.delivery_id);
    let envelope = match serde_json::from_slice::<Value>(delivery.body.bytes()) {
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
    };
    Ok((key, envelope))
}

/// Counts a delivery in `posbridge_deliveries_in_flight` while it lives, so
/// the gauge stays right when a client hangs up and its request is dropped.
struct InFlight(metrics::Gauge);

impl InFlight {
    fn count(provider: ProviderKind) -> InFlight {
        let gauge = metrics::gauge!(telemetry::IN_FLIGHT, telemetry::PROVIDER => provider.as_str());
        gauge.increment(1.0);
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
