//! Reading the providers' JSON: typed field access whose errors name the
//! documented field path, shared by every provider's normalizer.

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Context, NormalizeError};
use crate::domain::event::{Content, Decimal, LineItem, micros};

/// The earliest event time accepted, 1970-01-01T00:00:00.001Z in
/// nanoseconds since the epoch: the first instant whose Kafka record
/// timestamp (milliseconds since the epoch) is positive. A negative one is
/// outside what Kafka defines (a broker that stores it may then fail every
/// fetch of its partition), and librdkafka sends 0 as "the time of sending".
const EARLIEST_EVENT_NANOS: i128 = 1_000_000;

pub(super) fn required_str<'a>(
    value: &'a Value,
    field: &'static str,
) -> Result<&'a str, NormalizeError> {
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

/// A webhook body's envelope: the event name at `name_field`, the version
/// time at `time_field` (checked by [`event_time`]), and the entity's `data`.
pub(super) fn envelope<'a>(
    body: &'a Value,
    name_field: &'static str,
    time_field: &'static str,
    ctx: &Context<'_>,
) -> Result<(&'a str, OffsetDateTime, &'a Value), NormalizeError> {
    let name = required_str(body, name_field)?;
    let at = event_time(body, time_field, ctx)?;
    let data = body
        .get("data")
        .ok_or(NormalizeError::MissingField("data"))?;
    Ok((name, at, data))
}

/// A string or number field as text (ids are sometimes numbers).
pub(super) fn optional_text(value: &Value, field: &str) -> Option<String> {
    match value.get(field)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(super) fn required_time(
    value: &Value,
    field: &'static str,
) -> Result<OffsetDateTime, NormalizeError> {
    parse_time(required_str(value, field)?, field)
}

fn parse_time(text: &str, field: &'static str) -> Result<OffsetDateTime, NormalizeError> {
    OffsetDateTime::parse(text, &Rfc3339).map_err(|_| NormalizeError::InvalidField {
        field,
        reason: "is not an RFC 3339 time",
    })
}

/// A webhook's event time: the entity's version and its Kafka record
/// timestamp. Accepted from 1970-01-01T00:00:00.001Z (the first instant a
/// record timestamp can carry, [`EARLIEST_EVENT_NANOS`]) to
/// `ctx.max_event_ahead` after the arrival. The upper bound is kept well
/// under the hour Kafka's `message.timestamp.after.max.ms` allows by default
/// because a version from a clock running ahead would hold every genuine
/// later state of its entity back as stale until that time came.
///
/// # Errors
/// [`NormalizeError::TimeBeforeEpoch`] and [`NormalizeError::TimeInFuture`]
/// for a time outside those bounds, with the field as sent.
pub(super) fn event_time(
    value: &Value,
    field: &'static str,
    ctx: &Context<'_>,
) -> Result<OffsetDateTime, NormalizeError> {
    let text = required_str(value, field)?;
    let at = parse_time(text, field)?;
    if at.unix_timestamp_nanos() < EARLIEST_EVENT_NANOS {
        return Err(NormalizeError::TimeBeforeEpoch {
            field,
            sent: text.to_owned(),
        });
    }
    let ahead = at - ctx.received_at;
    if ahead > ctx.max_event_ahead {
        return Err(NormalizeError::TimeInFuture {
            field,
            sent: text.to_owned(),
            ahead_ms: ahead.whole_milliseconds(),
            limit_ms: ctx.max_event_ahead.as_millis(),
        });
    }
    Ok(at)
}

pub(super) fn optional_decimal(
    value: &Value,
    field: &'static str,
) -> Result<Option<Decimal>, NormalizeError> {
    let text = match value.get(leaf(field)) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_str(),
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(NormalizeError::InvalidField {
                field,
                reason: "is not a number",
            });
        }
    };
    Decimal::parse(text)
        .map(Some)
        .ok_or(NormalizeError::InvalidField {
            field,
            reason: "is not a decimal of at most 38 digits with at most 4 places",
        })
}

/// The first present of several alternative decimal fields (a provider names
/// one amount or quantity differently in different payloads).
pub(super) fn first_decimal(
    value: &Value,
    fields: &[&'static str],
) -> Result<Option<Decimal>, NormalizeError> {
    for field in fields {
        if let Some(decimal) = optional_decimal(value, field)? {
            return Ok(Some(decimal));
        }
    }
    Ok(None)
}

/// Line items under `data.items`; absent means none.
pub(super) fn items(data: &Value) -> Result<Vec<LineItem>, NormalizeError> {
    Ok(lines(data, "data.items")?.unwrap_or_default())
}

/// Line items at a documented field (`data.items_given`), when present.
pub(super) fn lines(
    data: &Value,
    field: &'static str,
) -> Result<Option<Vec<LineItem>>, NormalizeError> {
    let Some(list) = data.get(leaf(field)).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let list = list.as_array().ok_or(NormalizeError::InvalidField {
        field,
        reason: "is not an array",
    })?;
    list.iter()
        .map(|item| {
            Ok(LineItem {
                sku: optional_text(item, "sku").or_else(|| optional_text(item, "product_id")),
                name: optional_text(item, "name"),
                quantity: first_decimal(item, &["data.items[].quantity", "data.items[].qty"])?,
                unit_price: first_decimal(
                    item,
                    &["data.items[].unit_price", "data.items[].price"],
                )?,
            })
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// An optional RFC 3339 time.
pub(super) fn optional_time(
    value: &Value,
    field: &'static str,
) -> Result<Option<OffsetDateTime>, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => required_time(value, field).map(Some),
    }
}

/// An optional boolean.
pub(super) fn optional_bool(
    value: &Value,
    field: &'static str,
) -> Result<Option<bool>, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(NormalizeError::InvalidField {
            field,
            reason: "is not a boolean",
        }),
    }
}

/// An optional list of ids (strings or numbers, as text).
pub(super) fn optional_ids(
    value: &Value,
    field: &'static str,
) -> Result<Option<Vec<String>>, NormalizeError> {
    let invalid = || NormalizeError::InvalidField {
        field,
        reason: "is not a list of ids",
    };
    match value.get(leaf(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| match id {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                _ => Err(invalid()),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(invalid()),
    }
}

/// The entity's business content: `data` in canonical form (keys sorted,
/// null members left out, numbers as exact decimals, RFC 3339 times as UTC
/// microseconds), without the top-level `volatile` keys (times of sending,
/// not of the entity). The same state pushed and read from an API compares
/// equal; reordered keys and `51000.5` against `51000.50` do not differ.
pub(super) fn content(data: &Value, volatile: &[&str]) -> Content {
    let mut out = String::new();
    canonical(data, volatile, &mut out);
    Content::new(out)
}

/// Writes `value` in canonical form, leaving out the members of a top-level
/// object named in `skip` (nested objects keep all theirs). Every delivery
/// goes through here, so it writes straight into `out`.
fn canonical(value: &Value, skip: &[&str], out: &mut String) {
    use std::fmt::Write as _;
    match value {
        Value::Object(map) => {
            // Sorted here, whatever order the map keeps its keys in.
            let mut members: Vec<(&String, &Value)> = map
                .iter()
                .filter(|(key, v)| !v.is_null() && !skip.contains(&key.as_str()))
                .collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_string(key, out);
                out.push(':');
                canonical(value, &[], out);
            }
            out.push('}');
        }
        Value::Array(values) => {
            out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(value, &[], out);
            }
            out.push(']');
        }
        Value::Number(n) => match Decimal::parse(n.as_str()) {
            Some(decimal) => {
                let _ = write!(out, "{decimal}");
            }
            None => out.push_str(n.as_str()),
        },
        Value::String(s) => match rfc3339(s) {
            Some(at) => {
                let _ = write!(out, "\"@{}\"", micros(at));
            }
            None => json_string(s, out),
        },
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Null => out.push_str("null"),
    }
}

/// A string as a JSON string, escaped as `serde_json` escapes it.
fn json_string(s: &str, out: &mut String) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(s);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

/// The time a string holds in RFC 3339, if it does; the shortest such
/// string (`2026-11-30T12:00:00Z`) has 20 bytes and a `-` after the year,
/// so most strings are told apart without parsing.
fn rfc3339(s: &str) -> Option<OffsetDateTime> {
    if s.len() < 20 || s.as_bytes()[4] != b'-' {
        return None;
    }
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// The last segment of a documented field path (`data.items[].qty` → `qty`):
/// errors name the full path, lookups use the leaf within the given object.
fn leaf(field: &str) -> &str {
    field.rsplit('.').next().unwrap_or(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{Origin, ProviderKind};
    use serde_json::json;
    use std::time::Duration;
    use time::macros::datetime;

    /// The event time is the record timestamp and the version: one a Kafka
    /// record cannot carry, or one further ahead of the arrival than the
    /// bound, is refused with a code of its own, named with the field.
    #[test]
    fn event_times_before_1970_or_too_far_ahead_are_refused() {
        let ctx = Context {
            event_id: "e-1",
            source: crate::adapters::providers::test_source(ProviderKind::Mekari, None),
            received_at: datetime!(2026-11-29 10:00 UTC),
            raw: "{}",
            origin: Origin::Webhook,
            max_event_ahead: Duration::from_secs(300),
        };
        let at = |text: &str| event_time(&json!({ "occurred_at": text }), "occurred_at", &ctx);
        let code = |text: &str| at(text).map_err(|error| error.code());
        for before in [
            "1969-12-31T23:59:59Z",
            "1969-12-31T23:59:59.999Z",
            "1970-01-01T06:59:59+07:00",
            "1970-01-01T00:00:00Z",
            "1970-01-01T00:00:00.000999999Z",
            "1900-01-01T00:00:00Z",
            "0001-01-01T00:00:00Z",
            "0000-01-01T00:00:00Z",
        ] {
            assert_eq!(code(before), Err("time_before_epoch"), "{before}");
        }
        assert_eq!(
            at("1970-01-01T00:00:00.001Z").unwrap(),
            datetime!(1970-01-01 00:00:00.001 UTC)
        );
        assert_eq!(
            at("2026-11-29T10:05:00Z").unwrap(),
            datetime!(2026-11-29 10:05 UTC),
            "the bound itself is accepted"
        );
        for ahead in [
            "2026-11-29T10:05:00.000000001Z",
            "2026-11-29T17:05:01+07:00",
            "2099-01-01T00:00:00Z",
            "9999-12-31T23:59:59Z",
        ] {
            assert_eq!(code(ahead), Err("time_in_future"), "{ahead}");
        }
        assert_eq!(code("1969-13-01T00:00:00Z"), Err("invalid_field"));
        assert_eq!(
            at("1969-12-31T23:59:59Z").unwrap_err().to_string(),
            "field `occurred_at` is `1969-12-31T23:59:59Z`, before 1970-01-01T00:00:00.001Z (a Kafka record timestamp cannot hold it)"
        );
        assert_eq!(
            at("2026-11-29T11:00:00Z").unwrap_err().to_string(),
            "field `occurred_at` is `2026-11-29T11:00:00Z`, 3600000 ms ahead of posbridge's clock; at most 300000 ms is accepted (server.max_event_ahead_ms)"
        );
    }

    /// JSON numbers are read from their text, not through f64: no amount is
    /// rounded, and one the schema cannot hold exactly is refused.
    #[test]
    fn amounts_are_exact_from_the_json_text() {
        let data: Value = serde_json::from_str(
            r#"{"big": 123456789012345678901234567, "fine": 12345678901234.5678,
                "wide": "12345678901234567890123456789012345", "places": 0.12345}"#,
        )
        .unwrap();
        let read = |field| optional_decimal(&data, field).map(|d| d.map(|d| d.to_string()));
        assert_eq!(
            read("data.big").unwrap().as_deref(),
            Some("123456789012345678901234567.0000")
        );
        assert_eq!(
            read("data.fine").unwrap().as_deref(),
            Some("12345678901234.5678")
        );
        assert_eq!(read("data.wide").unwrap_err().code(), "invalid_field");
        assert_eq!(read("data.places").unwrap_err().code(), "invalid_field");
    }

    #[test]
    fn content_is_canonical_and_leaves_out_only_top_level_volatile_keys() {
        let data = json!({"b": 51000.50, "a": "2026-11-29T17:14:02+07:00", "gone": null,
                          "updated_at": "x", "items": [{"updated_at": "y", "q": 1}]});
        assert_eq!(
            content(&data, &["updated_at"]).as_str(),
            r#"{"a":"@1795947242000000","b":51000.5000,"items":[{"q":1.0000,"updated_at":"y"}]}"#
        );
    }

    #[test]
    fn decimal_fields_parse_numbers_and_strings_exactly() {
        let data = json!({"a": 51000.5, "b": "12.34", "c": true, "d": 0.00001});
        assert_eq!(
            optional_decimal(&data, "data.a")
                .unwrap()
                .unwrap()
                .to_string(),
            "51000.5000"
        );
        assert_eq!(
            optional_decimal(&data, "data.b")
                .unwrap()
                .unwrap()
                .to_string(),
            "12.3400"
        );
        assert_eq!(optional_decimal(&data, "data.x").unwrap(), None);
        assert_eq!(
            optional_decimal(&data, "data.c").unwrap_err().code(),
            "invalid_field"
        );
        assert_eq!(
            optional_decimal(&data, "data.d").unwrap_err().code(),
            "invalid_field"
        );
    }
}
