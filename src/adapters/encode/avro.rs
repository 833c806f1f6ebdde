//! A [`PosEvent`] and apache-avro's value tree of it, both ways: reading
//! records back (`decode`), comparing two events field by field
//! (`posbridge rederive`), and, in tests, the reference for the datum
//! `datum.rs` writes.

use apache_avro::types::Value;
use time::OffsetDateTime;

use super::DecodeError;
use crate::domain::event::{
    Decimal, EntityType, LineItem, Origin, PosEvent, ProviderKind, Version, from_micros, micros,
};

fn optional_string(value: Option<&str>) -> Value {
    match value {
        Some(s) => Value::Union(1, Box::new(Value::String(s.to_owned()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn optional_decimal(value: Option<Decimal>) -> Value {
    match value {
        Some(decimal) => {
            let bytes = decimal.unscaled.to_be_bytes();
            // Shortest two's-complement form: drop leading bytes that only
            // repeat the sign. Written apart from `Decimal::twos_complement`
            // on purpose: this is the reference the datum writer is held to.
            let mut start = 0;
            while start < bytes.len() - 1
                && ((bytes[start] == 0x00 && bytes[start + 1] & 0x80 == 0)
                    || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
            {
                start += 1;
            }
            Value::Union(
                1,
                Box::new(Value::Decimal(apache_avro::Decimal::from(
                    bytes[start..].to_vec(),
                ))),
            )
        }
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn optional<T>(value: Option<T>, to: impl FnOnce(T) -> Value) -> Value {
    match value {
        Some(value) => Value::Union(1, Box::new(to(value))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn lines(items: &[LineItem]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|item| {
                let LineItem {
                    sku,
                    name,
                    quantity,
                    unit_price,
                } = item;
                Value::Record(vec![
                    ("sku".into(), optional_string(sku.as_deref())),
                    ("name".into(), optional_string(name.as_deref())),
                    ("quantity".into(), optional_decimal(*quantity)),
                    ("unit_price".into(), optional_decimal(*unit_price)),
                ])
            })
            .collect(),
    )
}

fn symbol<T: Copy + PartialEq>(all: &[T], item: T, name: fn(T) -> &'static str) -> Value {
    let index = all.iter().position(|x| *x == item).unwrap_or(0);
    Value::Enum(
        u32::try_from(index).unwrap_or(0),
        name(item).to_ascii_uppercase(),
    )
}

/// The `Origin` enum's symbols in schema order.
pub(super) const ORIGINS: [Origin; 2] = [Origin::Webhook, Origin::Reconciler];

/// The Avro form of an event as apache-avro's value tree: the reference the
/// tests hold `datum::write` (what records are written with) to. Every field
/// of [`PosEvent`] is named here (no `..`), so a field added to the event
/// without a place in the schema fails to compile instead of silently going
/// missing.
pub fn to_avro(event: &PosEvent) -> Value {
    let PosEvent {
        event_id,
        provider,
        source,
        account,
        entity_type,
        entity_id,
        event_type,
        occurred_at,
        version,
        received_at,
        origin,
        outlet_id,
        store_id,
        terminal_id,
        currency,
        subtotal,
        tax,
        total,
        status,
        kitchen_status,
        items,
        // A deleted entity is written as a tombstone, never encoded.
        deleted: _,
        business_at,
        name,
        sku,
        price,
        active,
        product_ids,
        order_id,
        reason,
        payment_method,
        customer_id,
        items_given,
        raw,
        topic_prefix: _,
    } = event;
    Value::Record(vec![
        ("event_id".into(), Value::String(event_id.to_string())),
        (
            "provider".into(),
            symbol(&ProviderKind::ALL, *provider, ProviderKind::as_str),
        ),
        ("source".into(), Value::String(source.to_string())),
        ("account".into(), optional_string(account.as_deref())),
        (
            "entity_type".into(),
            symbol(&EntityType::ALL, *entity_type, EntityType::as_str),
        ),
        ("entity_id".into(), Value::String(entity_id.to_string())),
        ("event_type".into(), Value::String(event_type.to_string())),
        (
            "occurred_at".into(),
            Value::TimestampMicros(micros(*occurred_at)),
        ),
        (
            "version_at".into(),
            Value::TimestampMicros(version.at_micros),
        ),
        (
            "version_rank".into(),
            Value::Int(i32::try_from(version.rank).unwrap_or(i32::MAX)),
        ),
        (
            "received_at".into(),
            Value::TimestampMicros(micros(*received_at)),
        ),
        ("origin".into(), symbol(&ORIGINS, *origin, Origin::as_str)),
        ("outlet_id".into(), optional_string(outlet_id.as_deref())),
        ("store_id".into(), optional_string(store_id.as_deref())),
        (
            "terminal_id".into(),
            optional_string(terminal_id.as_deref()),
        ),
        ("currency".into(), optional_string(currency.as_deref())),
        ("subtotal".into(), optional_decimal(*subtotal)),
        ("tax".into(), optional_decimal(*tax)),
        ("total".into(), optional_decimal(*total)),
        ("status".into(), optional_string(status.as_deref())),
        (
            "kitchen_status".into(),
            optional_string(kitchen_status.as_deref()),
        ),
        ("items".into(), lines(items)),
        (
            "business_at".into(),
            optional(*business_at, |at| Value::TimestampMicros(micros(at))),
        ),
        ("name".into(), optional_string(name.as_deref())),
        ("sku".into(), optional_string(sku.as_deref())),
        ("price".into(), optional_decimal(*price)),
        ("active".into(), optional(*active, Value::Boolean)),
        (
            "product_ids".into(),
            optional(product_ids.as_ref(), |ids| {
                Value::Array(ids.iter().cloned().map(Value::String).collect())
            }),
        ),
        ("order_id".into(), optional_string(order_id.as_deref())),
        ("reason".into(), optional_string(reason.as_deref())),
        (
            "payment_method".into(),
            optional_string(payment_method.as_deref()),
        ),
        (
            "customer_id".into(),
            optional_string(customer_id.as_deref()),
        ),
        (
            "items_given".into(),
            optional(items_given.as_deref(), lines),
        ),
        (
            "raw".into(),
            Value::String(String::from_utf8_lossy(raw).into_owned()),
        ),
    ])
}

/// Field access on a decoded record, by name.
struct Fields(Vec<(String, Value)>);

impl Fields {
    /// A field's value; absent (`Null`) where the writer's schema has no
    /// such field (an older version, read with its own schema): as Avro's
    /// resolution reads it, with the `null` default every added field has.
    fn take(&mut self, name: &'static str) -> Result<Value, DecodeError> {
        let Some(i) = self.0.iter().position(|(n, _)| n == name) else {
            return Ok(Value::Null);
        };
        Ok(match self.0.swap_remove(i).1 {
            Value::Union(_, inner) => *inner,
            other => other,
        })
    }

    /// A string field, as whichever owner of it the event keeps.
    fn string<T: From<String>>(&mut self, name: &'static str) -> Result<T, DecodeError> {
        match self.take(name)? {
            Value::String(s) => Ok(s.into()),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn optional_string<T: From<String>>(
        &mut self,
        name: &'static str,
    ) -> Result<Option<T>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.into())),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn time(&mut self, name: &'static str) -> Result<OffsetDateTime, DecodeError> {
        match self.take(name)? {
            Value::TimestampMicros(us) => from_micros(us).ok_or(DecodeError::Field(name)),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn optional_time(&mut self, name: &'static str) -> Result<Option<OffsetDateTime>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::TimestampMicros(us) => from_micros(us).map(Some).ok_or(DecodeError::Field(name)),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn optional_bool(&mut self, name: &'static str) -> Result<Option<bool>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::Boolean(b) => Ok(Some(b)),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn optional_strings(&mut self, name: &'static str) -> Result<Option<Vec<String>>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::Array(values) => values
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(DecodeError::Field(name)),
                })
                .collect::<Result<_, _>>()
                .map(Some),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn lines(&mut self, name: &'static str) -> Result<Option<Vec<LineItem>>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::Array(items) => items
                .into_iter()
                .map(|item| {
                    let mut i = record(item, name)?;
                    Ok(LineItem {
                        sku: i.optional_string("sku")?,
                        name: i.optional_string("name")?,
                        quantity: i.decimal("quantity")?,
                        unit_price: i.decimal("unit_price")?,
                    })
                })
                .collect::<Result<_, DecodeError>>()
                .map(Some),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn decimal(&mut self, name: &'static str) -> Result<Option<Decimal>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::Decimal(d) => decimal_of(&d).map(Some).ok_or(DecodeError::Field(name)),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn symbol<T: Copy>(
        &mut self,
        name: &'static str,
        parse: fn(&str) -> Option<T>,
    ) -> Result<T, DecodeError> {
        match self.take(name)? {
            Value::Enum(_, symbol) => {
                parse(&symbol.to_ascii_lowercase()).ok_or(DecodeError::Field(name))
            }
            _ => Err(DecodeError::Field(name)),
        }
    }
}

fn record(value: Value, name: &'static str) -> Result<Fields, DecodeError> {
    match value {
        Value::Record(fields) => Ok(Fields(fields)),
        _ => Err(DecodeError::Field(name)),
    }
}

/// Reads an event from its Avro form.
///
/// # Errors
/// [`DecodeError::Field`] naming the first field that does not fit.
pub fn from_avro(value: Value) -> Result<PosEvent, DecodeError> {
    let mut f = record(value, "PosEvent")?;
    let items = f.lines("items")?.ok_or(DecodeError::Field("items"))?;
    let version_at = f.time("version_at")?;
    let rank = match f.take("version_rank")? {
        Value::Int(rank) => u32::try_from(rank).map_err(|_| DecodeError::Field("version_rank"))?,
        _ => return Err(DecodeError::Field("version_rank")),
    };
    Ok(PosEvent {
        event_id: f.string("event_id")?,
        provider: f.symbol("provider", ProviderKind::parse)?,
        source: f.string("source")?,
        account: f.optional_string("account")?,
        entity_type: f.symbol("entity_type", EntityType::parse)?,
        entity_id: f.string("entity_id")?,
        event_type: f.string("event_type")?,
        occurred_at: f.time("occurred_at")?,
        version: Version {
            at_micros: micros(version_at),
            rank,
        },
        received_at: f.time("received_at")?,
        origin: f.symbol("origin", |s| ORIGINS.into_iter().find(|o| o.as_str() == s))?,
        outlet_id: f.optional_string("outlet_id")?,
        store_id: f.optional_string("store_id")?,
        terminal_id: f.optional_string("terminal_id")?,
        currency: f.optional_string("currency")?,
        subtotal: f.decimal("subtotal")?,
        tax: f.decimal("tax")?,
        total: f.decimal("total")?,
        status: f.optional_string("status")?,
        kitchen_status: f.optional_string("kitchen_status")?,
        items,
        deleted: false,
        business_at: f.optional_time("business_at")?,
        name: f.optional_string("name")?,
        sku: f.optional_string("sku")?,
        price: f.decimal("price")?,
        active: f.optional_bool("active")?,
        product_ids: f.optional_strings("product_ids")?,
        order_id: f.optional_string("order_id")?,
        reason: f.optional_string("reason")?,
        payment_method: f.optional_string("payment_method")?,
        customer_id: f.optional_string("customer_id")?,
        items_given: f.lines("items_given")?,
        raw: f.string("raw")?,
        // Not in the record: the reader knows its topic.
        topic_prefix: None,
    })
}

/// An Avro decimal's unscaled value (big-endian two's complement, at most
/// 16 bytes) as a [`Decimal`]; `None` for one that is not.
pub(super) fn decimal_of(d: &apache_avro::Decimal) -> Option<Decimal> {
    let bytes = Vec::<u8>::try_from(d).ok()?;
    if bytes.is_empty() || bytes.len() > 16 {
        return None;
    }
    let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0x00 };
    let mut wide = [fill; 16];
    wide[16 - bytes.len()..].copy_from_slice(&bytes);
    Some(Decimal {
        unscaled: i128::from_be_bytes(wide),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field, the line items' too, says what it holds: the schema is
    /// the consumers' documentation.
    #[test]
    fn every_schema_field_has_a_doc() {
        let schema: serde_json::Value = serde_json::from_str(super::super::SCHEMA_JSON).unwrap();
        let fields = schema["fields"].as_array().unwrap();
        let items = fields.iter().find(|f| f["name"] == "items").unwrap();
        let lines = items["type"]["items"]["fields"].as_array().unwrap();
        for field in fields.iter().chain(lines) {
            assert!(
                field["doc"].as_str().is_some_and(|d| !d.is_empty()),
                "{}",
                field["name"]
            );
        }
    }

    /// The names of a schema record's fields, in order.
    fn names(fields: &serde_json::Value) -> Vec<&str> {
        fields
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect()
    }

    /// The schema file and [`to_avro`] name the same fields in the same
    /// order, the line items' too, so neither can gain a field the other
    /// lacks. (`PosEvent`'s own fields are held to [`to_avro`], the datum
    /// writer and the guard's hash by destructuring it whole in each: a
    /// field added to the struct alone does not compile.)
    #[test]
    fn to_avro_writes_every_schema_field_in_order() {
        let schema: serde_json::Value = serde_json::from_str(super::super::SCHEMA_JSON).unwrap();
        let Value::Record(fields) = to_avro(&PosEvent::with_every_field()) else {
            panic!("an event is a record");
        };
        let written: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(written, names(&schema["fields"]));

        let items = schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "items")
            .unwrap();
        let (_, Value::Array(lines)) = fields.iter().find(|(name, _)| name == "items").unwrap()
        else {
            panic!("items is an array");
        };
        let Some(Value::Record(line)) = lines.first() else {
            panic!("an event with every field has a line item, a record");
        };
        let written: Vec<&str> = line.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(written, names(&items["type"]["items"]["fields"]));
    }
}
