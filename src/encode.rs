//! Avro encoding of [`PosEvent`]s, in one of two wire formats.
//!
//! * With a Schema Registry: the Confluent wire format (magic 0, 4-byte schema
//!   id, Avro datum) through `schema_registry_converter`, the schema registered
//!   under TopicNameStrategy (`{topic}-value`) at start-up, so an incompatible
//!   schema stops the service before it accepts anything.
//! * Without one: Avro single-object encoding (`C3 01`, 8-byte CRC-64-AVRO
//!   fingerprint, datum), the Avro spec's registry-less format, so the embedded
//!   default needs nothing else running.
//!
//! [`decode`] reads both back; consumers in Rust and the tests use it.

use std::sync::LazyLock;

use apache_avro::reader::datum::GenericDatumReader;
use apache_avro::types::Value;
use apache_avro::writer::datum::GenericDatumWriter;
use apache_avro::{Decimal, Schema};
use schema_registry_converter::async_impl::easy_avro::EasyAvroEncoder;
use schema_registry_converter::async_impl::schema_registry::{SrSettings, get_all_subjects};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{
    SchemaType, SubjectNameStrategy, SuppliedSchema,
};
use time::OffsetDateTime;

use crate::config::RegistryConfig;
use crate::event::{EntityType, LineItem, Money, Origin, PosEvent, ProviderKind, Version};

/// The event schema, the contract with consumers.
pub const SCHEMA_JSON: &str = include_str!("../schemas/pos_event.avsc");

/// The parsed event schema.
pub static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    // The schema file is part of the binary and covered by unit tests; a
    // parse failure here can only be a build from a broken checkout.
    Schema::parse_str(SCHEMA_JSON).expect("schemas/pos_event.avsc is valid Avro")
});

/// Writes datums of the event schema; resolved once.
static WRITER: LazyLock<GenericDatumWriter<'static>> = LazyLock::new(|| {
    // Resolving a schema that parsed cannot fail.
    GenericDatumWriter::builder(&SCHEMA)
        .build()
        .expect("the event schema resolves")
});

/// Reads datums of the event schema; resolved once.
static READER: LazyLock<GenericDatumReader<'static>> = LazyLock::new(|| {
    GenericDatumReader::builder(&SCHEMA)
        .build()
        .expect("the event schema resolves")
});

/// First two bytes of an Avro single-object encoded message.
const SINGLE_OBJECT_MAGIC: [u8; 2] = [0xC3, 0x01];
/// First byte of a Confluent wire-format message.
const CONFLUENT_MAGIC: u8 = 0;

/// Why an event could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The value does not fit the schema: a bug in normalization.
    #[error("event does not fit the Avro schema: {0}")]
    Avro(#[from] apache_avro::Error),
    /// The registry could not be reached or answered an error; retryable
    /// when `retriable` says so.
    #[error("schema registry: {0}")]
    Registry(#[from] SRCError),
    /// The registry refused the schema (typically incompatible with the
    /// subject's existing versions).
    #[error("schema registry refused the event schema for subject `{subject}`: {detail}")]
    Rejected {
        /// The subject, `{topic}-value`.
        subject: String,
        /// The registry's answer.
        detail: String,
    },
}

/// Why bytes could not be read back into a [`PosEvent`].
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Neither single-object nor Confluent framing.
    #[error("unknown framing (first byte {0:#04x})")]
    Framing(u8),
    /// The Avro datum is corrupt.
    #[error("avro: {0}")]
    Avro(#[from] apache_avro::Error),
    /// A field has a value this version of posbridge does not know.
    #[error("field `{0}` has an unexpected value")]
    Field(&'static str),
}

/// Encodes events for one service instance.
#[derive(Clone)]
pub enum Encoder {
    /// Avro single-object encoding; `header` is magic + fingerprint.
    SingleObject {
        /// `C3 01` + the schema's CRC-64-AVRO fingerprint, little-endian.
        header: Vec<u8>,
    },
    /// Confluent wire format through a registry.
    Registry {
        /// Caches the registered id per subject.
        encoder: EasyAvroEncoder,
        /// The connection settings, kept for readiness checks.
        settings: SrSettings,
    },
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoder::SingleObject { .. } => "Encoder::SingleObject",
            Encoder::Registry { .. } => "Encoder::Registry",
        })
    }
}

impl Encoder {
    /// Builds the encoder and, with a registry, registers the schema for
    /// every topic (subject `{topic}-value`).
    ///
    /// # Errors
    /// [`EncodeError::Rejected`] when the registry refuses the schema,
    /// [`EncodeError::Registry`] when it cannot be reached.
    pub async fn new(config: &RegistryConfig, topics: &[String]) -> Result<Encoder, EncodeError> {
        let Some(url) = &config.url else {
            let mut header = SINGLE_OBJECT_MAGIC.to_vec();
            header.extend_from_slice(&fingerprint().to_le_bytes());
            return Ok(Encoder::SingleObject { header });
        };
        let mut builder = SrSettings::new_builder(url.trim_end_matches('/').to_owned());
        builder
            .no_proxy()
            .set_timeout(std::time::Duration::from_secs(5));
        if let Some(user) = &config.username {
            builder.set_basic_authorization(user, config.password.as_ref().map(|p| p.expose()));
        }
        let settings = builder.build()?;
        let encoder = EasyAvroEncoder::new(settings.clone());
        for topic in topics {
            let strategy = strategy(topic);
            let subject = strategy.get_subject()?;
            encoder
                .get_schema_and_id(&subject, strategy)
                .await
                .map_err(|e| {
                    if e.retriable {
                        EncodeError::Registry(e)
                    } else {
                        EncodeError::Rejected {
                            subject: subject.clone(),
                            detail: e.to_string(),
                        }
                    }
                })?;
        }
        Ok(Encoder::Registry { encoder, settings })
    }

    /// Encodes one event for `topic`.
    ///
    /// # Errors
    /// [`EncodeError::Registry`] when the registry is needed and unreachable.
    pub async fn encode(&self, topic: &str, event: &PosEvent) -> Result<Vec<u8>, EncodeError> {
        let value = to_avro(event);
        match self {
            Encoder::SingleObject { header } => {
                let mut bytes = header.clone();
                WRITER.write_value(&mut bytes, value)?;
                Ok(bytes)
            }
            Encoder::Registry { encoder, .. } => {
                Ok(encoder.encode_value(value, &strategy(topic)).await?)
            }
        }
    }

    /// Whether the registry answers (always true without one).
    pub async fn registry_reachable(&self) -> bool {
        match self {
            Encoder::SingleObject { .. } => true,
            Encoder::Registry { settings, .. } => get_all_subjects(settings).await.is_ok(),
        }
    }
}

/// The schema's CRC-64-AVRO fingerprint over its Parsing Canonical Form, as
/// the Avro spec defines it for single-object encoding. Computed here rather
/// than by apache-avro, whose canonical form keeps logical-type attributes
/// and so disagrees with Java's `SchemaNormalization` and fastavro.
pub fn fingerprint() -> u64 {
    const EMPTY: u64 = 0xc15d_213a_a4d7_a795;
    let table: Vec<u64> = (0..256u64)
        .map(|i| (0..8).fold(i, |fp, _| (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg())))
        .collect();
    let schema: serde_json::Value =
        serde_json::from_str(SCHEMA_JSON).expect("schemas/pos_event.avsc is JSON");
    let mut canonical = String::new();
    canonical_form(&schema, "", &mut canonical);
    canonical.bytes().fold(EMPTY, |fp, b| {
        (fp >> 8) ^ table[usize::from((fp as u8) ^ b)]
    })
}

const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// Writes the Parsing Canonical Form (Avro spec): full names, only the
/// attributes that affect parsing, in the spec's order, no whitespace; a
/// primitive with attributes (a logical type) becomes the bare primitive.
fn canonical_form(schema: &serde_json::Value, namespace: &str, out: &mut String) {
    use serde_json::Value as Json;
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let full_name = |name: &str, ns: &str| {
        if name.contains('.') || ns.is_empty() || PRIMITIVES.contains(&name) {
            name.to_owned()
        } else {
            format!("{ns}.{name}")
        }
    };
    match schema {
        Json::String(name) => out.push_str(&quote(&full_name(name, namespace))),
        Json::Array(branches) => {
            out.push('[');
            for (i, branch) in branches.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_form(branch, namespace, out);
            }
            out.push(']');
        }
        Json::Object(map) => match map.get("type") {
            Some(Json::String(kind))
                if ["record", "error", "enum", "fixed"].contains(&kind.as_str()) =>
            {
                let ns = map
                    .get("namespace")
                    .and_then(Json::as_str)
                    .unwrap_or(namespace);
                let name = full_name(
                    map.get("name").and_then(Json::as_str).unwrap_or_default(),
                    ns,
                );
                let inner_ns = name.rsplit_once('.').map_or("", |(ns, _)| ns).to_owned();
                out.push_str(&format!(
                    "{{\"name\":{},\"type\":{}",
                    quote(&name),
                    quote(kind)
                ));
                if let Some(Json::Array(fields)) = map.get("fields") {
                    out.push_str(",\"fields\":[");
                    for (i, field) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let field_name =
                            field.get("name").and_then(Json::as_str).unwrap_or_default();
                        out.push_str(&format!("{{\"name\":{},\"type\":", quote(field_name)));
                        canonical_form(&field["type"], &inner_ns, out);
                        out.push('}');
                    }
                    out.push(']');
                }
                if let Some(symbols) = map.get("symbols") {
                    out.push_str(&format!(",\"symbols\":{symbols}"));
                }
                if let Some(size) = map.get("size") {
                    out.push_str(&format!(",\"size\":{size}"));
                }
                out.push('}');
            }
            Some(Json::String(kind)) if kind == "array" => {
                out.push_str("{\"type\":\"array\",\"items\":");
                canonical_form(&map["items"], namespace, out);
                out.push('}');
            }
            Some(Json::String(kind)) if kind == "map" => {
                out.push_str("{\"type\":\"map\",\"values\":");
                canonical_form(&map["values"], namespace, out);
                out.push('}');
            }
            Some(inner) => canonical_form(inner, namespace, out),
            None => {}
        },
        _ => {}
    }
}

fn strategy(topic: &str) -> SubjectNameStrategy {
    SubjectNameStrategy::TopicNameStrategyWithSchema(
        topic.to_owned(),
        false,
        SuppliedSchema::new(
            Some("io.posbridge.PosEvent".into()),
            SchemaType::Avro,
            SCHEMA_JSON.to_owned(),
        ),
    )
}

/// Reads a record value back, whichever framing it has. Confluent-framed
/// values are read with this build's schema (the id is not looked up).
///
/// # Errors
/// [`DecodeError`] when the bytes are not a posbridge event.
pub fn decode(bytes: &[u8]) -> Result<PosEvent, DecodeError> {
    let datum = match bytes {
        [0xC3, 0x01, rest @ ..] if rest.len() >= 8 => &rest[8..],
        [CONFLUENT_MAGIC, rest @ ..] if rest.len() >= 4 => &rest[4..],
        [first, ..] => return Err(DecodeError::Framing(*first)),
        [] => return Err(DecodeError::Framing(0xff)),
    };
    let mut reader = datum;
    from_avro(READER.read_value(&mut reader)?)
}

fn micros(at: OffsetDateTime) -> i64 {
    Version::new(at, 0).at_micros
}

fn optional_string(value: Option<&str>) -> Value {
    match value {
        Some(s) => Value::Union(1, Box::new(Value::String(s.to_owned()))),
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn optional_money(value: Option<Money>) -> Value {
    match value {
        Some(money) => {
            let bytes = money.unscaled.to_be_bytes();
            // Shortest two's-complement form: drop leading bytes that only
            // repeat the sign.
            let mut start = 0;
            while start < bytes.len() - 1
                && ((bytes[start] == 0x00 && bytes[start + 1] & 0x80 == 0)
                    || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
            {
                start += 1;
            }
            Value::Union(
                1,
                Box::new(Value::Decimal(Decimal::from(bytes[start..].to_vec()))),
            )
        }
        None => Value::Union(0, Box::new(Value::Null)),
    }
}

fn symbol<T: Copy + PartialEq>(all: &[T], item: T, name: fn(T) -> &'static str) -> Value {
    let index = all.iter().position(|x| *x == item).unwrap_or(0);
    Value::Enum(
        u32::try_from(index).unwrap_or(0),
        name(item).to_ascii_uppercase(),
    )
}

const ORIGINS: [Origin; 2] = [Origin::Webhook, Origin::Reconciler];

/// The Avro form of an event.
pub fn to_avro(event: &PosEvent) -> Value {
    Value::Record(vec![
        ("event_id".into(), Value::String(event.event_id.clone())),
        (
            "provider".into(),
            symbol(&ProviderKind::ALL, event.provider, ProviderKind::as_str),
        ),
        ("source".into(), Value::String(event.source.clone())),
        ("account".into(), optional_string(event.account.as_deref())),
        (
            "entity_type".into(),
            symbol(&EntityType::ALL, event.entity_type, EntityType::as_str),
        ),
        ("entity_id".into(), Value::String(event.entity_id.clone())),
        ("event_type".into(), Value::String(event.event_type.clone())),
        (
            "occurred_at".into(),
            Value::TimestampMicros(micros(event.occurred_at)),
        ),
        (
            "version_at".into(),
            Value::TimestampMicros(event.version.at_micros),
        ),
        (
            "version_rank".into(),
            Value::Int(i32::try_from(event.version.rank).unwrap_or(i32::MAX)),
        ),
        (
            "received_at".into(),
            Value::TimestampMicros(micros(event.received_at)),
        ),
        (
            "origin".into(),
            symbol(&ORIGINS, event.origin, Origin::as_str),
        ),
        (
            "outlet_id".into(),
            optional_string(event.outlet_id.as_deref()),
        ),
        (
            "store_id".into(),
            optional_string(event.store_id.as_deref()),
        ),
        (
            "terminal_id".into(),
            optional_string(event.terminal_id.as_deref()),
        ),
        (
            "currency".into(),
            optional_string(event.currency.as_deref()),
        ),
        ("subtotal".into(), optional_money(event.subtotal)),
        ("tax".into(), optional_money(event.tax)),
        ("total".into(), optional_money(event.total)),
        ("status".into(), optional_string(event.status.as_deref())),
        (
            "kitchen_status".into(),
            optional_string(event.kitchen_status.as_deref()),
        ),
        (
            "items".into(),
            Value::Array(
                event
                    .items
                    .iter()
                    .map(|item| {
                        Value::Record(vec![
                            ("sku".into(), optional_string(item.sku.as_deref())),
                            ("name".into(), optional_string(item.name.as_deref())),
                            ("quantity".into(), optional_money(item.quantity)),
                            ("unit_price".into(), optional_money(item.unit_price)),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("raw".into(), Value::String(event.raw.clone())),
    ])
}

/// Field access on a decoded record, by name.
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn take(&mut self, name: &'static str) -> Result<Value, DecodeError> {
        let i = self
            .0
            .iter()
            .position(|(n, _)| n == name)
            .ok_or(DecodeError::Field(name))?;
        Ok(match self.0.swap_remove(i).1 {
            Value::Union(_, inner) => *inner,
            other => other,
        })
    }

    fn string(&mut self, name: &'static str) -> Result<String, DecodeError> {
        match self.take(name)? {
            Value::String(s) => Ok(s),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn optional_string(&mut self, name: &'static str) -> Result<Option<String>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn time(&mut self, name: &'static str) -> Result<OffsetDateTime, DecodeError> {
        match self.take(name)? {
            Value::TimestampMicros(us) => {
                OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000)
                    .map_err(|_| DecodeError::Field(name))
            }
            _ => Err(DecodeError::Field(name)),
        }
    }

    fn money(&mut self, name: &'static str) -> Result<Option<Money>, DecodeError> {
        match self.take(name)? {
            Value::Null => Ok(None),
            Value::Decimal(d) => {
                let bytes = Vec::<u8>::try_from(&d).map_err(|_| DecodeError::Field(name))?;
                if bytes.is_empty() || bytes.len() > 16 {
                    return Err(DecodeError::Field(name));
                }
                let fill = if bytes[0] & 0x80 != 0 { 0xff } else { 0x00 };
                let mut wide = [fill; 16];
                wide[16 - bytes.len()..].copy_from_slice(&bytes);
                Ok(Some(Money {
                    unscaled: i128::from_be_bytes(wide),
                }))
            }
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
    let items = match f.take("items")? {
        Value::Array(items) => items
            .into_iter()
            .map(|item| {
                let mut i = record(item, "items")?;
                Ok(LineItem {
                    sku: i.optional_string("sku")?,
                    name: i.optional_string("name")?,
                    quantity: i.money("quantity")?,
                    unit_price: i.money("unit_price")?,
                })
            })
            .collect::<Result<_, DecodeError>>()?,
        _ => return Err(DecodeError::Field("items")),
    };
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
        version: Version::new(version_at, rank),
        received_at: f.time("received_at")?,
        origin: f.symbol("origin", |s| ORIGINS.into_iter().find(|o| o.as_str() == s))?,
        outlet_id: f.optional_string("outlet_id")?,
        store_id: f.optional_string("store_id")?,
        terminal_id: f.optional_string("terminal_id")?,
        currency: f.optional_string("currency")?,
        subtotal: f.money("subtotal")?,
        tax: f.money("tax")?,
        total: f.money("total")?,
        status: f.optional_string("status")?,
        kitchen_status: f.optional_string("kitchen_status")?,
        items,
        deleted: false,
        raw: f.string("raw")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn event() -> PosEvent {
        PosEvent {
            event_id: "d1".into(),
            provider: ProviderKind::Mekari,
            source: "main".into(),
            account: None,
            entity_type: EntityType::Return,
            entity_id: "R-1".into(),
            event_type: "return.created".into(),
            occurred_at: datetime!(2026-11-29 10:15:30.123456 UTC),
            version: Version::new(datetime!(2026-11-29 10:15:30.123456 UTC), 3),
            received_at: datetime!(2026-11-29 10:15:31 UTC),
            origin: Origin::Webhook,
            outlet_id: Some("OUT-9".into()),
            store_id: None,
            terminal_id: None,
            currency: Some("IDR".into()),
            subtotal: Money::parse("-0.0001"),
            tax: Money::parse("128"),
            total: Money::parse("-51000.5"),
            status: Some("done".into()),
            kitchen_status: None,
            items: vec![LineItem {
                sku: Some("A".into()),
                name: None,
                quantity: Money::parse("1.5"),
                unit_price: Money::parse("99999999999999.9999"),
            }],
            deleted: false,
            raw: "{\"id\":\"d1\"}".into(),
        }
    }

    #[tokio::test]
    async fn single_object_encoding_round_trips() {
        let encoder = Encoder::new(&RegistryConfig::default(), &[]).await.unwrap();
        let bytes = encoder.encode("pos.returns", &event()).await.unwrap();
        assert_eq!(&bytes[..2], &SINGLE_OBJECT_MAGIC);
        assert_eq!(decode(&bytes).unwrap(), event());
        assert_eq!(&bytes[2..10], &fingerprint().to_le_bytes());
    }

    #[test]
    fn fingerprint_matches_fastavro_and_java() {
        // fastavro's CRC-64-AVRO of this schema's Parsing Canonical Form
        // (computed with fastavro 1.x, which agrees with Java's
        // SchemaNormalization.parsingFingerprint64).
        // fastavro prints the fingerprint as the header's little-endian bytes.
        assert_eq!(hex::encode(fingerprint().to_le_bytes()), "ecb1a1634e293ff8");
    }

    #[test]
    fn decode_refuses_unknown_framing() {
        assert!(matches!(decode(&[7, 1, 2]), Err(DecodeError::Framing(7))));
    }
}
