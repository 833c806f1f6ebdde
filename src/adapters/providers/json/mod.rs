//! Reading the providers' JSON: typed field access whose errors name the
//! documented field path, shared by every provider's normalizer.

mod tree;

use compact_str::{CompactString, ToCompactString as _};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Context, NormalizeError};
use crate::domain::event::{Content, Decimal, LineItem, micros};

pub use tree::Json;

/// The earliest event time accepted, 1970-01-01T00:00:00.001Z in
/// nanoseconds since the epoch: the first instant whose Kafka record
/// timestamp (milliseconds since the epoch) is positive. A negative one is
/// outside what Kafka defines (a broker that stores it may then fail every
/// fetch of its partition), and librdkafka sends 0 as "the time of sending".
const EARLIEST_EVENT_NANOS: i128 = 1_000_000;

pub(super) fn required_str<'a>(
    value: &'a Json<'_>,
    field: &'static str,
) -> Result<&'a str, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Json::Null) => Err(NormalizeError::MissingField(field)),
        Some(Json::String(s)) if !s.is_empty() => Ok(s.as_ref()),
        Some(Json::String(_)) => Err(NormalizeError::InvalidField {
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
    body: &'a Json<'_>,
    name_field: &'static str,
    time_field: &'static str,
    ctx: &Context<'_>,
) -> Result<(&'a str, OffsetDateTime, &'a Json<'a>), NormalizeError> {
    let name = required_str(body, name_field)?;
    let at = event_time(body, time_field, ctx)?;
    let data = body
        .get("data")
        .ok_or(NormalizeError::MissingField("data"))?;
    Ok((name, at, data))
}

/// A string or number field as text (ids are sometimes numbers).
pub(super) fn optional_text(value: &Json<'_>, field: &str) -> Option<CompactString> {
    match value.get(field)? {
        Json::String(s) | Json::Number(s) => Some(CompactString::from(s.as_ref())),
        Json::Integer(n) => Some(n.to_compact_string()),
        _ => None,
    }
}

pub(super) fn required_time(
    value: &Json<'_>,
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
    value: &Json<'_>,
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
    value: &Json<'_>,
    field: &'static str,
) -> Result<Option<Decimal>, NormalizeError> {
    let decimal = match value.get(leaf(field)) {
        None | Some(Json::Null) => return Ok(None),
        Some(Json::Integer(n)) => Decimal::of_integer(*n),
        Some(Json::Number(text) | Json::String(text)) => Decimal::parse(text),
        Some(_) => {
            return Err(NormalizeError::InvalidField {
                field,
                reason: "is not a number",
            });
        }
    };
    decimal.map(Some).ok_or(NormalizeError::InvalidField {
        field,
        reason: "is not a decimal of at most 38 digits with at most 4 places",
    })
}

/// The first present of several alternative decimal fields (a provider names
/// one amount or quantity differently in different payloads).
pub(super) fn first_decimal(
    value: &Json<'_>,
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
pub(super) fn items(data: &Json<'_>) -> Result<Vec<LineItem>, NormalizeError> {
    Ok(lines(data, "data.items")?.unwrap_or_default())
}

/// Line items at a documented field (`data.items_given`), when present.
pub(super) fn lines(
    data: &Json<'_>,
    field: &'static str,
) -> Result<Option<Vec<LineItem>>, NormalizeError> {
    let Some(list) = data.get(leaf(field)).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Json::Array(list) = list else {
        return Err(NormalizeError::InvalidField {
            field,
            reason: "is not an array",
        });
    };
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
    value: &Json<'_>,
    field: &'static str,
) -> Result<Option<OffsetDateTime>, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Json::Null) => Ok(None),
        Some(_) => required_time(value, field).map(Some),
    }
}

/// An optional boolean.
pub(super) fn optional_bool(
    value: &Json<'_>,
    field: &'static str,
) -> Result<Option<bool>, NormalizeError> {
    match value.get(leaf(field)) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(NormalizeError::InvalidField {
            field,
            reason: "is not a boolean",
        }),
    }
}

/// An optional list of ids (strings or numbers, as text).
pub(super) fn optional_ids(
    value: &Json<'_>,
    field: &'static str,
) -> Result<Option<Vec<String>>, NormalizeError> {
    let invalid = || NormalizeError::InvalidField {
        field,
        reason: "is not a list of ids",
    };
    match value.get(leaf(field)) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::Array(ids)) => ids
            .iter()
            .map(|id| match id {
                Json::String(id) | Json::Number(id) => Ok(id.to_string()),
                Json::Integer(id) => Ok(id.to_string()),
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
pub(super) fn content(data: &Json<'_>, volatile: &[&str]) -> Content {
    // One allocation for a usual entity's content, which runs to a few
    // hundred bytes.
    let mut out = String::with_capacity(512);
    canonical(data, volatile, &mut out);
    Content::new(out)
}

/// Writes `value` in canonical form, leaving out the members of a top-level
/// object named in `skip` (nested objects keep all theirs). Every delivery
/// goes through here, so it writes straight into `out`.
fn canonical(value: &Json<'_>, skip: &[&str], out: &mut String) {
    use std::fmt::Write as _;
    match value {
        Json::Object(members) => {
            // Sorted here, whatever order they were sent in; the sort is
            // stable, so of a repeated key the last member sent comes last
            // and is the one kept, as `serde_json::Value` keeps it.
            let mut sorted: Vec<(&str, &Json<'_>)> = members
                .iter()
                .filter(|(key, _)| !skip.contains(&key.as_ref()))
                .map(|(key, value)| (key.as_ref(), value))
                .collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            let mut first = true;
            for (i, &(key, value)) in sorted.iter().enumerate() {
                let repeated = sorted.get(i + 1).is_some_and(|next| next.0 == key);
                if repeated || value.is_null() {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                json_string(key, out);
                out.push(':');
                canonical(value, &[], out);
            }
            out.push('}');
        }
        Json::Array(values) => {
            out.push('[');
            for (i, value) in values.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(value, &[], out);
            }
            out.push(']');
        }
        Json::Integer(n) => match Decimal::of_integer(*n) {
            Some(decimal) => {
                let _ = write!(out, "{decimal}");
            }
            None => {
                let _ = write!(out, "{n}");
            }
        },
        Json::Number(n) => match Decimal::parse(n) {
            Some(decimal) => {
                let _ = write!(out, "{decimal}");
            }
            None => out.push_str(n),
        },
        Json::String(s) => match rfc3339(s) {
            Some(at) => {
                let _ = write!(out, "\"@{}\"", micros(at));
            }
            None => json_string(s, out),
        },
        Json::Bool(true) => out.push_str("true"),
        Json::Bool(false) => out.push_str("false"),
        Json::Null => out.push_str("null"),
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
            raw: &crate::adapters::providers::TEST_RAW,
            origin: Origin::Webhook,
            max_event_ahead: Duration::from_secs(300),
        };
        let at = |text: &str| {
            let body = json!({ "occurred_at": text });
            event_time(&Json::from(&body), "occurred_at", &ctx)
        };
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
        let data = Json::parse(
            br#"{"big": 123456789012345678901234567, "fine": 12345678901234.5678,
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
        let data = Json::from(&data);
        assert_eq!(
            content(&data, &["updated_at"]).as_str(),
            r#"{"a":"@1795947242000000","b":51000.5000,"items":[{"q":1.0000,"updated_at":"y"}]}"#
        );
    }

    /// The content of a body read into the borrowing tree is the content
    /// the same body had read into a `serde_json::Value`, the reading the
    /// ledgers' stored state hashes were made with: a repeated key's last
    /// member counts (null or not), escapes are unescaped alike.
    #[test]
    fn content_from_the_tree_is_content_from_a_value() {
        for body in [
            &br#"{"a": 1, "b": 2, "a": 3}"#[..],
            br#"{"a": 1, "a": null, "z": [{"k": "x", "k": "y"}]}"#,
            br#"{"a": null, "a": 1.50}"#,
            br#"{"t\u0061b": "l\\ine\"", "at": "2026-11-29T17:14:02+07:00", "n": -0.0001e3}"#,
            br#"{"updated_at": 1, "updated_at": 2, "u": {"updated_at": 3}}"#,
        ] {
            let value: serde_json::Value = serde_json::from_slice(body).unwrap();
            let tree = Json::parse(body).unwrap();
            assert_eq!(
                content(&tree, &["updated_at"]).as_str(),
                content(&Json::from(&value), &["updated_at"]).as_str(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn decimal_fields_parse_numbers_and_strings_exactly() {
        let data = json!({"a": 51000.5, "b": "12.34", "c": true, "d": 0.00001});
        let data = Json::from(&data);
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
