//! Everything that differs between providers, behind one trait.
//!
//! A provider knows its delivery-id header, its default signature scheme and
//! header, and how to turn its JSON into a [`PosEvent`]. The rest of the
//! pipeline never looks at a provider's JSON. One file per provider; this file
//! holds only the trait and the JSON helpers both use.

mod mekari;
mod receiptroller;

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::event::{EntityType, LineItem, Money, Origin, PosEvent, ProviderKind};
use crate::verify::SchemeName;

pub use mekari::{API_CLOCK_SKEW_SECS, Mekari, api_authorization};
pub use receiptroller::ReceiptRoller;

/// Why an event cannot be normalized. Such an event goes to the dead-letter
/// topic with its raw body and this reason, and is answered 2xx.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum NormalizeError {
    /// The body is not JSON.
    #[error("body is not valid JSON: {0}")]
    InvalidJson(String),
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
}

impl NormalizeError {
    /// A bounded metric label for the reason.
    pub fn code(&self) -> &'static str {
        match self {
            NormalizeError::InvalidJson(_) => "invalid_json",
            NormalizeError::UnknownEventType(_) => "unknown_event_type",
            NormalizeError::MissingField(_) => "missing_field",
            NormalizeError::InvalidField { .. } => "invalid_field",
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
    /// Configured source name.
    pub source: &'a str,
    /// Merchant account of the source, if any.
    pub account: Option<&'a str>,
    /// When posbridge received the delivery.
    pub received_at: OffsetDateTime,
    /// The raw body as text, kept in the event.
    pub raw: &'a str,
    /// Webhook or reconciler; reconciled records are versioned by `received_at`.
    pub origin: Origin,
}

/// One provider's wire format.
pub trait Provider: Send + Sync + 'static {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;
    /// Header carrying the delivery id, equal to the body's `id`.
    fn delivery_id_header(&self) -> &'static str;
    /// Signature scheme when a source names none (payloads.md).
    fn default_scheme(&self) -> SchemeName;
    /// Signature header for hex/base64 schemes when a source names none.
    fn default_signature_header(&self) -> &'static str;
    /// Turns a webhook body into the one event schema.
    ///
    /// # Errors
    /// [`NormalizeError`] when the event cannot be represented; the caller
    /// dead-letters it.
    fn normalize(&self, body: &Value, ctx: &Context<'_>) -> Result<PosEvent, NormalizeError>;
    /// Builds the event from an entity's data, the part both webhooks and
    /// API records share; `at` is the version time.
    ///
    /// # Errors
    /// [`NormalizeError`] when the data cannot be represented.
    fn entity_event(
        &self,
        event_type: &str,
        at: OffsetDateTime,
        data: &Value,
        ctx: &Context<'_>,
    ) -> Result<PosEvent, NormalizeError>;
    /// Turns one record read from the provider's API (the entity's data, as
    /// in a webhook's `data`) into the same schema; `ctx.received_at` is the
    /// fetch time and becomes the version.
    ///
    /// # Errors
    /// [`NormalizeError`] when the record cannot be represented.
    fn normalize_record(
        &self,
        entity_type: EntityType,
        data: &Value,
        ctx: &Context<'_>,
    ) -> Result<PosEvent, NormalizeError> {
        let event_type = format!("{}.{RECONCILED_VERB}", entity_type.as_str());
        self.entity_event(&event_type, ctx.received_at, data, ctx)
    }
}

/// The provider implementation for a kind.
pub fn for_kind(kind: ProviderKind) -> &'static dyn Provider {
    match kind {
        ProviderKind::ReceiptRoller => &ReceiptRoller,
        ProviderKind::Mekari => &Mekari,
    }
}

/// The body's `id`, which must equal the delivery-id header.
pub fn body_id(body: &Value) -> Option<&str> {
    body.get("id").and_then(Value::as_str)
}

fn required_str<'a>(value: &'a Value, field: &'static str) -> Result<&'a str, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Value::Null) => Err(NormalizeError::MissingField(field)),
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(Value::String(_)) => Err(NormalizeError::InvalidField {
            field,
            reason: "is empty",
        }),
        Some(_) => Err(NormalizeError::InvalidField {
            field,
            reason: "is not a string",
        }),
    }
}

/// A string or number field as text (ids are sometimes numbers).
fn optional_text(value: &Value, field: &str) -> Option<String> {
    match value.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn required_time(value: &Value, field: &'static str) -> Result<OffsetDateTime, NormalizeError> {
    OffsetDateTime::parse(required_str(value, field)?, &Rfc3339).map_err(|_| {
        NormalizeError::InvalidField {
            field,
            reason: "is not an RFC 3339 time",
        }
    })
}

fn optional_money(value: &Value, field: &'static str) -> Result<Option<Money>, NormalizeError> {
    let text = match value.get(leaf(field)) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(NormalizeError::InvalidField {
                field,
                reason: "is not a number",
            });
        }
    };
    Money::parse(&text)
        .map(Some)
        .ok_or(NormalizeError::InvalidField {
            field,
            reason: "is not a decimal with at most 4 places",
        })
}

/// The first present of several alternative money fields.
fn first_money(value: &Value, fields: &[&'static str]) -> Result<Option<Money>, NormalizeError> {
    for field in fields {
        if let Some(money) = optional_money(value, field)? {
            return Ok(Some(money));
        }
    }
    Ok(None)
}

/// Line items under `data.items`; absent means none.
fn items(data: &Value) -> Result<Vec<LineItem>, NormalizeError> {
    let Some(list) = data.get("items").filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = list.as_array().ok_or(NormalizeError::InvalidField {
        field: "data.items",
        reason: "is not an array",
    })?;
    list.iter()
        .map(|item| {
            Ok(LineItem {
                sku: optional_text(item, "sku").or_else(|| optional_text(item, "product_id")),
                name: optional_text(item, "name"),
                quantity: first_money(item, &["data.items[].quantity", "data.items[].qty"])?,
                unit_price: first_money(item, &["data.items[].unit_price", "data.items[].price"])?,
            })
        })
        .collect()
}

/// The last segment of a documented field path (`data.items[].qty` → `qty`):
/// errors name the full path, lookups use the leaf within the given object.
fn leaf(field: &str) -> &str {
    field.rsplit('.').next().unwrap_or(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn money_fields_parse_numbers_and_strings_exactly() {
        let data = json!({"a": 51000.5, "b": "12.34", "c": true, "d": 0.00001});
        assert_eq!(
            optional_money(&data, "data.a")
                .unwrap()
                .unwrap()
                .to_string(),
            "51000.5000"
        );
        assert_eq!(
            optional_money(&data, "data.b")
                .unwrap()
                .unwrap()
                .to_string(),
            "12.3400"
        );
        assert_eq!(optional_money(&data, "data.x").unwrap(), None);
        assert_eq!(
            optional_money(&data, "data.c").unwrap_err().code(),
            "invalid_field"
        );
        assert_eq!(
            optional_money(&data, "data.d").unwrap_err().code(),
            "invalid_field"
        );
    }
}
