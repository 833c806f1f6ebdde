//! One record read from a provider's API, as the reconciler publishes it.

use bytes::Bytes;
use serde_json::Value;
use time::OffsetDateTime;

use super::RECONCILED_ID_PREFIX;
use crate::adapters::providers::{self, Context, Json, NormalizeError};
use crate::domain::event::{EntityType, Normalized, Origin, Source, Version};

/// A record that could not be normalized, and why: its id and its body,
/// for the dead-letter topic.
pub(crate) struct Unnormalized {
    /// `reconcile:{µs}`.
    pub(crate) event_id: String,
    /// The record as read.
    pub(crate) raw: Bytes,
    /// Why.
    pub(crate) reason: NormalizeError,
}

/// `record`, read from `source`'s API at `fetched_at`, as the reconciler
/// publishes it: origin reconciler, the fetch time its version, its id
/// derived from both and its key. One function, so that the simulation's
/// reconciler writes exactly what this one does.
pub(crate) fn reconciled(
    source: &Source,
    entity_type: EntityType,
    record: &Value,
    fetched_at: OffsetDateTime,
) -> Result<Normalized, Box<Unnormalized>> {
    let raw = Bytes::from(record.to_string());
    let event_id = format!(
        "{RECONCILED_ID_PREFIX}{}",
        Version::new(fetched_at, 0).at_micros
    );
    let ctx = Context {
        event_id: &event_id,
        source,
        received_at: fetched_at,
        raw: &raw,
        origin: Origin::Reconciler,
        // An API record's version is its fetch time: no event time to bound.
        max_event_ahead: std::time::Duration::ZERO,
    };
    match providers::for_kind(source.provider).normalize_record(
        entity_type,
        &Json::from(record),
        &ctx,
    ) {
        Ok(mut normalized) => {
            let event = &mut normalized.event;
            event.event_id = compact_str::format_compact!("{event_id}:{}", event.key());
            Ok(normalized)
        }
        Err(reason) => Err(Box::new(Unnormalized {
            event_id,
            raw,
            reason,
        })),
    }
}
