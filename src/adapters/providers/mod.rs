//! Everything that differs between providers, behind one trait, one folder
//! per provider.
//!
//! A provider knows its delivery-id header, its default signature scheme and
//! header, how to turn its JSON into a [`crate::domain::event::PosEvent`] (and the
//! entity's business content), how its `api` settings
//! look and how to read its API ([`api::ProviderApi`]). The rest of the
//! service never looks at a provider's JSON or names a provider: adding one
//! means a folder here, a line in [`ALL`], and its name in
//! [`ProviderKind`] (which is also an Avro enum symbol).
//!
//! Each provider's delivery rules, as posbridge relies on them, are in
//! `docs/PROVIDERS.md`.

pub mod api;
mod json;
pub mod mekari;
pub mod receiptroller;

use std::time::Duration;

use bytes::Bytes;

use time::OffsetDateTime;

use crate::config::ApiSection;
use crate::domain::event::{EntityType, Normalized, Origin, ProviderKind, Source};
use crate::domain::verify::SchemeName;

use api::{ApiOptions, FetchError, ProviderApi};
pub use json::Json;

/// Why an event cannot be normalized. Such an event goes to the dead-letter
/// topic with its raw body and this reason, and is answered 2xx.
#[derive(Debug, thiserror::Error)]
pub enum NormalizeError {
    /// The body is not JSON.
    #[error("body is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// The event name is not one posbridge knows for this provider.
    #[error("unknown event type `{0}`")]
    UnknownEventType(String),
    /// A field posbridge needs is absent or null.
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    /// A field is present but unusable.
    #[error("field `{field}` {reason}")]
    InvalidField {
        /// The field's path.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The event time lies before the first millisecond after the Unix
    /// epoch: a Kafka record timestamp cannot carry it (a negative one can
    /// make its partition unreadable, and librdkafka replaces 0 with the
    /// time of sending).
    #[error(
        "field `{field}` is `{sent}`, before 1970-01-01T00:00:00.001Z (a Kafka record timestamp cannot hold it)"
    )]
    TimeBeforeEpoch {
        /// The field's path.
        field: &'static str,
        /// The time as the provider sent it.
        sent: String,
    },
    /// The event time lies further ahead of posbridge's clock than
    /// `server.max_event_ahead_ms`: a wrong clock, whose version would hold
    /// every genuine later state of the entity back as stale.
    #[error(
        "field `{field}` is `{sent}`, {ahead_ms} ms ahead of posbridge's clock; at most {limit_ms} ms is accepted (server.max_event_ahead_ms)"
    )]
    TimeInFuture {
        /// The field's path.
        field: &'static str,
        /// The time as the provider sent it.
        sent: String,
        /// How far ahead of the time posbridge received the event.
        ahead_ms: i128,
        /// The bound it passed.
        limit_ms: u128,
    },
}

impl NormalizeError {
    /// Every code [`NormalizeError::code`] gives, for series that exist from
    /// start-up (an alert on dead letters sees the first of each reason).
    pub const CODES: [&'static str; 6] = [
        "invalid_json",
        "unknown_event_type",
        "missing_field",
        "invalid_field",
        "time_before_epoch",
        "time_in_future",
    ];

    /// A bounded metric label for the reason.
    pub fn code(&self) -> &'static str {
        match self {
            NormalizeError::InvalidJson(_) => "invalid_json",
            NormalizeError::UnknownEventType(_) => "unknown_event_type",
            NormalizeError::MissingField(_) => "missing_field",
            NormalizeError::InvalidField { .. } => "invalid_field",
            NormalizeError::TimeBeforeEpoch { .. } => "time_before_epoch",
            NormalizeError::TimeInFuture { .. } => "time_in_future",
        }
    }
}

/// The event type verb of a record read from an API rather than pushed
/// (`order.reconciled`): an API record has no event name of its own.
pub const RECONCILED_VERB: &str = "reconciled";

/// What a normalizer knows about an event besides the provider's JSON.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The delivery id (already checked to equal the body's `id`), or a
    /// derived id for reconciled records.
    pub event_id: &'a str,
    /// The source it came through (name and merchant account).
    pub source: &'a Source,
    /// When posbridge received the delivery.
    pub received_at: OffsetDateTime,
    /// The raw body, kept in the event: UTF-8 (a body that parsed is).
    pub raw: &'a Bytes,
    /// Webhook or reconciler; reconciled records are versioned by `received_at`.
    pub origin: Origin,
    /// How far after `received_at` a webhook's event time may lie
    /// (`server.max_event_ahead_ms`). Judged against the arrival, not the
    /// moment of normalizing, so a spooled delivery or a dead letter put
    /// through again is decided as it was on arrival.
    pub max_event_ahead: Duration,
}

/// What a provider's delivery rules ask of posbridge's settings: the
/// configuration is checked against every provider's (`app::check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryRules {
    /// An attempt without an answer within this counts as failed.
    pub answer_timeout: Duration,
    /// How long after its first attempt a delivery's last retry may come:
    /// a done delivery id must be remembered longer.
    pub retry_window: Duration,
    /// The longest `Retry-After` the provider honours; `None` when it
    /// ignores the header.
    pub longest_retry_after: Option<Duration>,
}

/// One provider: its wire format, its API settings and its API.
pub trait Provider: Send + Sync + 'static {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;
    /// Its delivery rules, as far as settings must respect them.
    fn delivery_rules(&self) -> DeliveryRules;
    /// Header carrying the delivery id, equal to the body's `id`.
    fn delivery_id_header(&self) -> &'static str;
    /// Signature scheme when a source names none.
    fn default_scheme(&self) -> SchemeName;
    /// Signature header for hex/base64 schemes when a source names none.
    fn default_signature_header(&self) -> &'static str;
    /// Turns a webhook body into the one event schema, with the entity's
    /// business content for the guard.
    ///
    /// # Errors
    /// [`NormalizeError`] when the event cannot be represented; the caller
    /// dead-letters it.
    fn normalize(&self, body: &Json<'_>, ctx: &Context<'_>) -> Result<Normalized, NormalizeError>;
    /// Builds the event from an entity's data, the part both webhooks and
    /// API records share; `at` is the version time.
    ///
    /// # Errors
    /// [`NormalizeError`] when the data cannot be represented.
    fn entity_event(
        &self,
        event_type: &str,
        at: OffsetDateTime,
        data: &Json<'_>,
        ctx: &Context<'_>,
    ) -> Result<Normalized, NormalizeError>;
    /// Turns one record read from the provider's API (the entity's data, as
    /// in a webhook's `data`) into the same schema; `ctx.received_at` is the
    /// fetch time and becomes the version.
    ///
    /// # Errors
    /// [`NormalizeError`] when the record cannot be represented.
    fn normalize_record(
        &self,
        entity_type: EntityType,
        data: &Json<'_>,
        ctx: &Context<'_>,
    ) -> Result<Normalized, NormalizeError> {
        let event_type = format!("{}.{RECONCILED_VERB}", entity_type.as_str());
        self.entity_event(&event_type, ctx.received_at, data, ctx)
    }
    /// The mistakes in a source's `api` table, as (field, what is wrong);
    /// the field is relative to the table (`outlets`, `paths`).
    fn api_problems(&self, api: &ApiSection) -> Vec<(String, String)>;
    /// The keys a source's `api` table may hold (its settings' and their
    /// path names): the others are refused by their place in a source
    /// file, never by their name (a secret pasted as a key).
    fn api_keys(&self) -> Vec<&'static str>;
    /// The provider's API for one source, ready to read.
    ///
    /// # Errors
    /// [`FetchError`] when the settings or the HTTP client are unusable
    /// (`api_problems` reports the same mistakes beforehand).
    fn connect_api(
        &self,
        api: &ApiSection,
        options: &ApiOptions,
    ) -> Result<Box<dyn ProviderApi>, FetchError>;
}

/// Every provider, the registry: adding a provider adds one line here.
pub const ALL: [&dyn Provider; 2] = [&receiptroller::ReceiptRoller, &mekari::Mekari];

/// The keys a source's `api` table takes, by provider (what
/// [`crate::config::source_files::read_dir`] needs of the providers).
pub fn api_keys(kind: ProviderKind) -> Vec<&'static str> {
    for_kind(kind).api_keys()
}

/// The provider implementation for a kind.
pub fn for_kind(kind: ProviderKind) -> &'static dyn Provider {
    ALL.into_iter()
        .find(|provider| provider.kind() == kind)
        // ALL lists every ProviderKind; the registry test checks it.
        .expect("every provider kind is registered")
}

/// The raw body normalizer tests give their context.
#[cfg(test)]
pub(crate) static TEST_RAW: Bytes = Bytes::from_static(b"{}");

/// A source for normalizer tests, alive for the whole test run.
#[cfg(test)]
pub(crate) fn test_source(provider: ProviderKind, account: Option<&str>) -> &'static Source {
    Box::leak(Box::new(Source {
        provider,
        name: "main".into(),
        account: account.map(str::to_owned),
        topic_prefix: None,
    }))
}

#[cfg(test)]
mod tests;
