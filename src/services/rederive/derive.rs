//! A record's event derived again from its `raw` with today's code: the
//! webhook normalizer for a webhook's record, the API normalizer for a
//! reconciled one, as the record itself says, with what made the record
//! kept (its delivery id, arrival, source and account, version and topics).

use std::sync::Arc;
use std::time::Duration;

use crate::adapters::providers::{self, Context, Json, NormalizeError};
use crate::domain::event::{Normalized, Origin, PosEvent, Source};

/// Why a record could not be derived again.
#[derive(Debug, thiserror::Error)]
pub enum Underivable {
    /// Today's normalizer refuses its `raw`.
    #[error(transparent)]
    Normalize(#[from] NormalizeError),
    /// It derives to another entity (another type or id): not a state of
    /// the key it is under, so not written in its place.
    #[error("it derives to {now}, not to the {was} it is under")]
    Moved {
        /// The record's entity.
        was: String,
        /// The derived event's.
        now: String,
    },
}

impl Underivable {
    /// A bounded code, for the summary.
    pub fn code(&self) -> &'static str {
        match self {
            Underivable::Normalize(error) => error.code(),
            Underivable::Moved { .. } => "moved",
        }
    }
}

/// `was`'s event derived again from its `raw`, on the topics of
/// `topic_prefix` (the record's own), at the record's version.
///
/// # Errors
/// [`Underivable`] when today's code refuses it or makes another entity of it.
pub fn derive(was: &PosEvent, topic_prefix: Option<&str>) -> Result<Normalized, Underivable> {
    let source = Source {
        provider: was.provider,
        name: was.source.to_string(),
        account: was.account.as_deref().map(String::from),
        topic_prefix: topic_prefix.map(Arc::from),
    };
    let ctx = Context {
        event_id: &was.event_id,
        source: &source,
        received_at: was.received_at,
        raw: &was.raw,
        origin: was.origin,
        // Accepted once: its time is not judged again.
        max_event_ahead: Duration::MAX,
    };
    let json = Json::parse(&was.raw).map_err(NormalizeError::InvalidJson)?;
    let provider = providers::for_kind(was.provider);
    let mut normalized = match was.origin {
        Origin::Webhook => provider.normalize(&json, &ctx)?,
        Origin::Reconciler => provider.normalize_record(was.entity_type, &json, &ctx)?,
    };
    let now = &mut normalized.event;
    if now.entity_type != was.entity_type || now.key() != was.key() {
        return Err(Underivable::Moved {
            was: format!("{} {}", was.entity_type.as_str(), was.key()),
            now: format!("{} {}", now.entity_type.as_str(), now.key()),
        });
    }
    // What made the record stays the record's: only what its body says is
    // derived again.
    now.event_id.clone_from(&was.event_id);
    now.received_at = was.received_at;
    now.version = was.version;
    Ok(normalized)
}
