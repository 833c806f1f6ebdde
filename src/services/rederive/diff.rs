//! Two events of one entity compared field by field, in the schema's order
//! and spelling: what a record derived again would change.

use apache_avro::types::Value;
use serde::Serialize;

use crate::adapters::encode::to_avro;
use crate::domain::event::{Decimal, PosEvent, from_micros};

/// One field whose value differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The schema's field name.
    pub field: String,
    /// Its value in the record.
    pub was: serde_json::Value,
    /// Its value derived again.
    pub now: serde_json::Value,
}

/// The fields of `now` whose values differ from `was`'s.
pub fn changes(was: &PosEvent, now: &PosEvent) -> Vec<Change> {
    let (Value::Record(was), Value::Record(now)) = (to_avro(was), to_avro(now)) else {
        return Vec::new();
    };
    was.into_iter()
        .zip(now)
        .filter(|((_, a), (_, b))| a != b)
        .map(|((field, a), (_, b))| Change {
            field,
            was: shown(a),
            now: shown(b),
        })
        .collect()
}

/// A value as a reader of the report would write it: times in RFC 3339,
/// decimals as their digits, symbols as names, absent as `null`.
fn shown(value: Value) -> serde_json::Value {
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
        Value::Decimal(d) => Vec::<u8>::try_from(&d)
            .ok()
            .filter(|bytes| !bytes.is_empty() && bytes.len() <= 16)
            .map_or(Json::Null, |bytes| {
                let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0x00 };
                let mut wide = [fill; 16];
                wide[16 - bytes.len()..].copy_from_slice(&bytes);
                let unscaled = i128::from_be_bytes(wide);
                Json::String(Decimal { unscaled }.to_string())
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_fields_that_differ_are_named_with_both_values() {
        let was = PosEvent::sample();
        assert_eq!(changes(&was, &was), []);
        let mut now = was.clone();
        now.name = Some("Kopi Susu".into());
        now.total = Some(Decimal { unscaled: 185_000 });
        let changed = changes(&was, &now);
        let fields: Vec<&str> = changed.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["total", "name"]);
        assert_eq!(changed[1].was, serde_json::Value::Null);
        assert_eq!(changed[1].now, "Kopi Susu");
        assert_eq!(changed[0].now, "18.5000");
    }
}
