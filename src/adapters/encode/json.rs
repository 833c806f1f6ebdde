//! An event as JSON for a reader: the schema's field names, times
//! in RFC 3339, decimals as their digits, symbols as names, absent as
//! `null` (`posbridge rederive`'s changes, `posbridge lookup`'s values).

use apache_avro::types::Value;

use super::to_avro;
use crate::domain::event::{PosEvent, from_micros};

/// `event` as JSON.
pub fn event_json(event: &PosEvent) -> serde_json::Value {
    shown(to_avro(event))
}

/// One value of the event's Avro tree as JSON.
pub fn shown(value: Value) -> serde_json::Value {
    use serde_json::Value as Json;
    match value {
        Value::Null => Json::Null,
        Value::Boolean(b) => Json::Bool(b),
        Value::Int(n) => Json::from(n),
        Value::Long(n) => Json::from(n),
        Value::String(s) | Value::Enum(_, s) => Json::String(s),
        Value::Union(_, inner) => shown(*inner),
        Value::TimestampMicros(us) => from_micros(us)
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .map_or(Json::from(us), Json::String),
        Value::Decimal(d) => super::avro::decimal_of(&d)
            .map_or(Json::Null, |decimal| Json::String(decimal.to_string())),
        Value::Array(items) => Json::Array(items.into_iter().map(shown).collect()),
        Value::Record(fields) => Json::Object(
            fields
                .into_iter()
                .map(|(name, value)| (name, shown(value)))
                .collect(),
        ),
        other => Json::String(format!("{other:?}")),
    }
}
