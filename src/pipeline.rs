//! The data line, in one place: ledger → normalize → guard → encode → publish
//! → ledger.
//!
//! The webhook handler calls [`Pipeline::deliver`] with a verified body; the
//! reconciler calls [`Pipeline::apply`] with events it normalized from the
//! providers' APIs. Both end in the same guard and the same producer, so a
//! reconciled record can never roll an entity back.
//!
//! A delivery id becomes *done* only once its outcome is durable: the record
//! acknowledged by Kafka, the raw body dead-lettered, or the event judged
//! stale or unchanged. Any failure before that releases the lease and answers
//! "try again", so the provider's retry is processed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use time::OffsetDateTime;
use tracing::{debug, error, info, warn};

use crate::encode::{EncodeError, Encoder};
use crate::event::{DeliveryKey, EntityType, Origin, PosEvent, ProviderKind};
use crate::guard::{self, Decision};
use crate::ledger::{Begin, Commit, EntitySlot, EntityState, Ledger, LedgerError};
use crate::metrics::{self, Outcome};
use crate::providers::{self, Context, NormalizeError};
use crate::publish::{
    HEADER_DELIVERY_ID, HEADER_EVENT_TYPE, HEADER_ORIGIN, HEADER_PROVIDER, HEADER_REASON,
    HEADER_SOURCE, OutgoingRecord, PublishError, Publisher,
};
use crate::verify::VerifiedBody;

/// How often a duplicate re-checks the ledger while the first attempt runs.
const IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

/// Why a delivery was not handled. The ingress turns each into a status.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The request itself is wrong (delivery id does not match the body):
    /// retrying the same bytes cannot help.
    #[error("{0}")]
    Rejected(String),
    /// Something we depend on failed; the delivery stays retryable.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
}

impl From<LedgerError> for PipelineError {
    fn from(error: LedgerError) -> Self {
        PipelineError::Unavailable(error.to_string())
    }
}

impl From<PublishError> for PipelineError {
    fn from(error: PublishError) -> Self {
        PipelineError::Unavailable(error.to_string())
    }
}

impl From<EncodeError> for PipelineError {
    fn from(error: EncodeError) -> Self {
        PipelineError::Unavailable(error.to_string())
    }
}

/// Where a source's deliveries come from: its name and merchant account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// Configured name, the `{source}` in the URL.
    pub name: String,
    /// Merchant account, part of record keys when set.
    pub account: Option<String>,
}

/// One verified webhook delivery, owned, on its way down the line.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Who sent it.
    pub provider: ProviderKind,
    /// Through which configured webhook.
    pub source: Arc<SourceInfo>,
    /// The delivery-id header's value.
    pub delivery_id: String,
    /// The signed body.
    pub body: VerifiedBody,
    /// When it arrived.
    pub received_at: OffsetDateTime,
}

/// Topic names by entity type, plus the dead-letter topic.
#[derive(Debug, Clone)]
pub struct Topics {
    /// One compacted topic per entity type.
    pub entities: BTreeMap<EntityType, String>,
    /// Raw bodies that could not be normalized.
    pub dead_letter: String,
}

impl Topics {
    fn entity(&self, entity_type: EntityType) -> &str {
        // Built from EntityType::ALL at start-up; a missing entry is a bug.
        &self.entities[&entity_type]
    }
}

/// The pipeline handle, shared by the ingress and the reconciler. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Arc<dyn Ledger>,
    encoder: Encoder,
    publisher: Publisher,
    topics: Topics,
    inflight_wait: Duration,
}

impl Pipeline {
    /// Assembles the stages; each is built from config by `App::build`.
    pub fn new(
        ledger: Arc<dyn Ledger>,
        encoder: Encoder,
        publisher: Publisher,
        topics: Topics,
        inflight_wait: Duration,
    ) -> Pipeline {
        Pipeline {
            inner: Arc::new(Inner {
                ledger,
                encoder,
                publisher,
                topics,
                inflight_wait,
            }),
        }
    }

    /// The producer, for readiness checks and the shutdown flush.
    pub fn publisher(&self) -> &Publisher {
        &self.inner.publisher
    }

    /// The encoder, for readiness checks.
    pub fn encoder(&self) -> &Encoder {
        &self.inner.encoder
    }

    /// The ledger, for readiness checks.
    pub fn ledger(&self) -> &dyn Ledger {
        self.inner.ledger.as_ref()
    }

    /// Handles one webhook delivery from start to durable outcome.
    ///
    /// # Errors
    /// [`PipelineError::Rejected`] when the delivery id does not match the
    /// body; [`PipelineError::Unavailable`] when the outcome could not be made
    /// durable (the provider should retry).
    pub async fn deliver(&self, delivery: Delivery) -> Result<Outcome, PipelineError> {
        let body: Result<Value, _> = serde_json::from_slice(delivery.body.bytes());
        if let Ok(json) = &body
            && providers::body_id(json) != Some(delivery.delivery_id.as_str())
        {
            return Err(PipelineError::Rejected(
                "the delivery id header does not equal the body's `id`".into(),
            ));
        }
        let key = DeliveryKey::new(delivery.provider, &delivery.delivery_id);
        if !self.acquire(&key).await? {
            ::metrics::counter!(metrics::DUPLICATES, metrics::PROVIDER => delivery.provider.as_str())
                .increment(1);
            debug!("Duplicate delivery answered without producing.");
            return Ok(Outcome::Duplicate);
        }
        let _in_flight = InFlight::count(delivery.provider);
        let result = self.process(delivery, body, key.clone()).await;
        if result.is_err() {
            self.inner.ledger.release(&key).await;
        }
        result
    }

    /// Takes the delivery's lease. `Ok(false)` means it is already done. A
    /// duplicate of an attempt in flight waits for it: if that attempt fails
    /// and releases, this one takes over.
    async fn acquire(&self, key: &DeliveryKey) -> Result<bool, PipelineError> {
        let deadline = Instant::now() + self.inner.inflight_wait;
        loop {
            match self.inner.ledger.begin(key).await? {
                Begin::New => return Ok(true),
                Begin::Done => return Ok(false),
                Begin::InFlight if Instant::now() >= deadline => {
                    return Err(PipelineError::Unavailable(
                        "the same delivery is still being processed".into(),
                    ));
                }
                Begin::InFlight => tokio::time::sleep(IN_FLIGHT_POLL).await,
            }
        }
    }

    async fn process(
        &self,
        delivery: Delivery,
        body: Result<Value, serde_json::Error>,
        key: DeliveryKey,
    ) -> Result<Outcome, PipelineError> {
        let raw = String::from_utf8_lossy(delivery.body.bytes());
        let ctx = Context {
            event_id: &delivery.delivery_id,
            source: &delivery.source.name,
            account: delivery.source.account.as_deref(),
            received_at: delivery.received_at,
            raw: &raw,
            origin: Origin::Webhook,
        };
        let normalized = body
            .map_err(|e| NormalizeError::InvalidJson(e.to_string()))
            .and_then(|json| providers::for_kind(delivery.provider).normalize(&json, &ctx));
        match normalized {
            Ok(event) => self.apply(event, Some(key)).await,
            Err(reason) => {
                self.dead_letter(&delivery, reason.code(), &reason.to_string())
                    .await?;
                self.inner
                    .ledger
                    .commit(Commit {
                        delivery: Some(key),
                        ..Commit::default()
                    })
                    .await?;
                Ok(Outcome::DeadLettered)
            }
        }
    }

    /// Guards, encodes and publishes one normalized event, then records the
    /// outcome (and `delivery`, when there is one) in the ledger. The
    /// reconciler's entry point.
    ///
    /// # Errors
    /// [`PipelineError::Unavailable`] when the record could not be
    /// acknowledged or the ledger could not be read.
    pub async fn apply(
        &self,
        event: PosEvent,
        delivery: Option<DeliveryKey>,
    ) -> Result<Outcome, PipelineError> {
        let key = event.key();
        let slot = EntitySlot::new(event.entity_type, &key);
        let _lock = self.inner.ledger.lock_entity(&slot).await?;
        let written = self.inner.ledger.entity(&slot).await?;
        let incoming = EntityState {
            version: event.version,
            state_hash: guard::state_hash(&event),
        };
        let outcome = match guard::decide(written.as_ref(), &incoming, event.origin) {
            Decision::Stale => {
                ::metrics::counter!(
                    metrics::STALE_EVENTS,
                    metrics::PROVIDER => event.provider.as_str(),
                    metrics::ENTITY_TYPE => event.entity_type.as_str()
                )
                .increment(1);
                info!(
                    entity = %key,
                    event_type = %event.event_type,
                    "Stale event held back: the topic already has a newer state."
                );
                self.commit(delivery, None).await?;
                return Ok(Outcome::Stale);
            }
            Decision::Unchanged => {
                self.commit(delivery, None).await?;
                return Ok(Outcome::Unchanged);
            }
            Decision::Publish => Outcome::Published,
        };
        let topic = self.inner.topics.entity(event.entity_type).to_owned();
        let payload = if event.deleted {
            None
        } else {
            match self.inner.encoder.encode(&topic, &event).await {
                Ok(bytes) => Some(bytes),
                // Retrying cannot make an event fit the schema: keep it raw.
                Err(EncodeError::Avro(error)) => {
                    error!(entity = %key, %error, "Event does not fit the schema; dead-lettering it.");
                    self.dead_letter_event(&event, "encode_failed", &error.to_string())
                        .await?;
                    self.commit(delivery, None).await?;
                    return Ok(Outcome::DeadLettered);
                }
                Err(error) => return Err(error.into()),
            }
        };
        let record = OutgoingRecord {
            topic,
            key: key.as_str().to_owned(),
            payload,
            timestamp_ms: millis(event.occurred_at),
            headers: vec![
                (HEADER_DELIVERY_ID, event.event_id.clone()),
                (HEADER_PROVIDER, event.provider.as_str().to_owned()),
                (HEADER_EVENT_TYPE, event.event_type.clone()),
                (HEADER_SOURCE, event.source.clone()),
                (HEADER_ORIGIN, event.origin.as_str().to_owned()),
            ],
            provider: event.provider.as_str(),
        };
        match self.inner.publisher.send(record).await {
            Ok(_) => {}
            Err(PublishError::Refused(reason)) => {
                warn!(entity = %key, %reason, "Broker refused the record; dead-lettering it.");
                self.dead_letter_event(&event, "publish_refused", &reason)
                    .await?;
                self.commit(delivery, None).await?;
                return Ok(Outcome::DeadLettered);
            }
            Err(error) => return Err(error.into()),
        }
        // The record is in Kafka: failing to note that only risks publishing
        // the same state again on a retry, which compaction absorbs.
        if let Err(error) = self.commit(delivery, Some((slot, incoming))).await {
            error!(entity = %key, %error, "Published, but the ledger write failed; a retry may publish this state again.");
        }
        Ok(outcome)
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

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        code: &'static str,
        reason: &str,
    ) -> Result<(), PipelineError> {
        self.dead_letter_raw(
            delivery.provider,
            &delivery.source.name,
            &delivery.delivery_id,
            delivery.received_at,
            delivery.body.bytes().to_vec(),
            code,
            reason,
        )
        .await
    }

    /// Writes raw bytes that could not become an event to the dead-letter
    /// topic, with the reason in a header; the reconciler's entry point for
    /// records it cannot normalize.
    ///
    /// # Errors
    /// [`PipelineError::Unavailable`] when the broker did not acknowledge it.
    #[allow(clippy::too_many_arguments)]
    pub async fn dead_letter_raw(
        &self,
        provider: ProviderKind,
        source: &str,
        id: &str,
        received_at: OffsetDateTime,
        body: Vec<u8>,
        code: &'static str,
        reason: &str,
    ) -> Result<(), PipelineError> {
        self.send_dead_letter(DeadLetter {
            provider,
            delivery_id: id,
            source,
            received_at,
            body,
            code,
            reason,
        })
        .await
    }

    async fn dead_letter_event(
        &self,
        event: &PosEvent,
        code: &'static str,
        reason: &str,
    ) -> Result<(), PipelineError> {
        self.dead_letter_raw(
            event.provider,
            &event.source,
            &event.event_id,
            event.received_at,
            event.raw.clone().into_bytes(),
            code,
            reason,
        )
        .await
    }

    async fn send_dead_letter(&self, letter: DeadLetter<'_>) -> Result<(), PipelineError> {
        warn!(
            provider = %letter.provider,
            delivery_id = letter.delivery_id,
            reason = letter.reason,
            "Event dead-lettered with its raw body."
        );
        self.inner
            .publisher
            .send(OutgoingRecord {
                topic: self.inner.topics.dead_letter.clone(),
                key: DeliveryKey::new(letter.provider, letter.delivery_id)
                    .as_str()
                    .to_owned(),
                payload: Some(letter.body),
                timestamp_ms: millis(letter.received_at),
                headers: vec![
                    (HEADER_DELIVERY_ID, letter.delivery_id.to_owned()),
                    (HEADER_PROVIDER, letter.provider.as_str().to_owned()),
                    (HEADER_SOURCE, letter.source.to_owned()),
                    (HEADER_REASON, letter.reason.to_owned()),
                ],
                provider: letter.provider.as_str(),
            })
            .await?;
        ::metrics::counter!(
            metrics::DEAD_LETTERS,
            metrics::PROVIDER => letter.provider.as_str(),
            metrics::REASON => letter.code
        )
        .increment(1);
        Ok(())
    }
}

/// A record timestamp: milliseconds since the epoch.
fn millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// Counts a delivery in `posbridge_deliveries_in_flight` while it lives, so
/// the gauge stays right when a client hangs up and its request is dropped.
struct InFlight(::metrics::Gauge);

impl InFlight {
    fn count(provider: ProviderKind) -> InFlight {
        let gauge = ::metrics::gauge!(metrics::IN_FLIGHT, metrics::PROVIDER => provider.as_str());
        gauge.increment(1.0);
        InFlight(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// What a dead-letter record carries.
struct DeadLetter<'a> {
    provider: ProviderKind,
    delivery_id: &'a str,
    source: &'a str,
    received_at: OffsetDateTime,
    body: Vec<u8>,
    code: &'static str,
    reason: &'a str,
}
