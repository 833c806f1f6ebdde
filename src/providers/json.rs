//! Reading the providers' JSON: typed field access whose errors name the
//! documented field path, shared by every provider's normalizer.

use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::NormalizeError;
use crate::event::{Decimal, LineItem};

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
/// time at `time_field`, and the entity's `data`.
pub(super) fn envelope<'a>(
    body: &'a Value,
    name_field: &'static str,
    time_field: &'static str,
) -> Result<(&'a str, OffsetDateTime, &'a Value), NormalizeError> {
    let name = required_str(body, name_field)?;
    let at = required_time(body, time_field)?;
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
    OffsetDateTime::parse(required_str(value, field)?, &Rfc3339).map_err(|_| {
        NormalizeError::InvalidField {
            field,
            reason: "is not an RFC 3339 time",
        }
    })
}

pub(super) fn optional_decimal(
    value: &Value,
    field: &'static str,
) -> Result<Option<Decimal>, NormalizeError> {
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
    Decimal::parse(&text)
        .map(Some)
        .ok_or(NormalizeError::InvalidField {
            field,
            reason: "is not a decimal with at most 4 places",
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
                quantity: first_decimal(item, &["data.items[].quantity", "data.items[].qty"])?,
                unit_price: first_decimal(
                    item,
                    &["data.items[].unit_price", "data.items[].price"],
                )?,
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
