//! A downstream consumer of posbridge's topics, to copy: reads every record of
//! an entity topic in either framing posbridge writes, keeps the latest state
//! per key (the compacted view: a tombstone removes the key), and prints one
//! JSON line per entity. It depends on rdkafka, apache-avro, reqwest and
//! serde_json only, not on posbridge.
//!
//! ```sh
//! cargo run --example consumer -- --brokers 127.0.0.1:9092 --topic pos.orders \
//!     [--registry http://127.0.0.1:8081]
//! ```
//!
//! * Single-object encoding (`C3 01`, 8-byte fingerprint, datum): the writer
//!   schema is found by its fingerprint among the released versions, so
//!   records of every version are read.
//! * Confluent wire format (`00`, 4-byte schema id, datum): the writer schema
//!   is fetched from `--registry` by id, once per id.
//!
//! A real service would commit offsets with a consumer group and keep the
//! state in its own store; this reads from the beginning to the end once.

use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::time::Duration;

use apache_avro::Schema;
use apache_avro::types::Value;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

type Error = Box<dyn std::error::Error>;

/// Where the writer schemas come from.
struct Schemas {
    /// Single-object fingerprint (as the header's bytes) → schema.
    by_fingerprint: HashMap<[u8; 8], Schema>,
    /// The registry, for Confluent-framed records.
    registry: Option<String>,
    /// Schemas fetched from the registry, by id.
    by_id: HashMap<u32, Schema>,
}

/// Every released version of posbridge's schema with its single-object
/// fingerprint (as the header's bytes), as docs/SCHEMA.md lists them. Copy
/// the `.avsc` files into your project and add each new version here.
const VERSIONS: [(&str, &str); 2] = [
    (
        "ecb1a1634e293ff8",
        include_str!("../schemas/history/pos_event.v1.avsc"),
    ),
    (
        "29ef1678077fa4da",
        include_str!("../schemas/pos_event.avsc"),
    ),
];

impl Schemas {
    fn load(registry: Option<String>) -> Result<Schemas, Error> {
        let mut by_fingerprint = HashMap::new();
        for (fingerprint, text) in VERSIONS {
            let mut key = [0u8; 8];
            for (i, byte) in key.iter_mut().enumerate() {
                *byte = u8::from_str_radix(&fingerprint[2 * i..2 * i + 2], 16)?;
            }
            by_fingerprint.insert(key, Schema::parse_str(text)?);
        }
        Ok(Schemas {
            by_fingerprint,
            registry,
            by_id: HashMap::new(),
        })
    }

    /// Decodes one record value, whichever framing it has.
    async fn decode(&mut self, bytes: &[u8]) -> Result<Value, Error> {
        match bytes {
            [0xC3, 0x01, rest @ ..] if rest.len() >= 8 => {
                let key: [u8; 8] = rest[..8].try_into()?;
                let schema = self
                    .by_fingerprint
                    .get(&key)
                    .ok_or("single-object record of an unknown schema version")?;
                read(schema, &rest[8..])
            }
            [0, rest @ ..] if rest.len() >= 4 => {
                let id = u32::from_be_bytes(rest[..4].try_into()?);
                if !self.by_id.contains_key(&id) {
                    let registry = self
                        .registry
                        .as_deref()
                        .ok_or("Confluent-framed record: pass --registry")?;
                    let answer: serde_json::Value =
                        reqwest::get(format!("{registry}/schemas/ids/{id}"))
                            .await?
                            .error_for_status()?
                            .json()
                            .await?;
                    let text = answer["schema"]
                        .as_str()
                        .ok_or("registry answer without schema")?;
                    self.by_id.insert(id, Schema::parse_str(text)?);
                }
                read(&self.by_id[&id], &rest[4..])
            }
            _ => Err("not a posbridge record (dead letters are raw JSON)".into()),
        }
    }
}

/// One datum, read with the schema that wrote it.
fn read(schema: &Schema, datum: &[u8]) -> Result<Value, Error> {
    let reader = apache_avro::reader::datum::GenericDatumReader::builder(schema).build()?;
    Ok(reader.read_value(&mut Cursor::new(datum))?)
}

/// A decoded field as JSON: strings, numbers, decimals as 4-place strings.
fn field(record: &[(String, Value)], name: &str) -> serde_json::Value {
    let Some((_, value)) = record.iter().find(|(n, _)| n == name) else {
        return serde_json::Value::Null;
    };
    let value = match value {
        Value::Union(_, inner) => inner.as_ref(),
        other => other,
    };
    match value {
        Value::String(s) | Value::Enum(_, s) => s.clone().into(),
        Value::Decimal(d) => {
            let bytes: Vec<u8> = d.try_into().unwrap_or_default();
            let fill = if bytes.first().is_some_and(|b| b & 0x80 != 0) {
                0xff
            } else {
                0
            };
            let mut wide = [fill; 16];
            wide[16 - bytes.len().min(16)..]
                .copy_from_slice(&bytes[bytes.len().saturating_sub(16)..]);
            let unscaled = i128::from_be_bytes(wide);
            let sign = if unscaled < 0 { "-" } else { "" };
            let abs = unscaled.unsigned_abs();
            format!("{sign}{}.{:04}", abs / 10_000, abs % 10_000).into()
        }
        Value::Boolean(b) => (*b).into(),
        Value::Long(n) | Value::TimestampMicros(n) => (*n).into(),
        _ => serde_json::Value::Null,
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (mut brokers, mut topic, mut registry) = (None, None, None);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--brokers" => brokers = args.next(),
            "--topic" => topic = args.next(),
            "--registry" => registry = args.next().map(|r| r.trim_end_matches('/').to_owned()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let (brokers, topic) = (
        brokers.ok_or("--brokers is required")?,
        topic.ok_or("--topic is required")?,
    );
    let mut schemas = Schemas::load(registry)?;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "posbridge-example-consumer")
        .set("enable.auto.commit", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .flat_map(|t| {
            t.partitions()
                .iter()
                .map(rdkafka::metadata::MetadataPartition::id)
        })
        .collect();
    // The compacted view: latest state per key; a tombstone removes it.
    let mut latest: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for partition in partitions {
        let (_, high) = consumer.fetch_watermarks(&topic, partition, Duration::from_secs(10))?;
        if high == 0 {
            continue;
        }
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(&topic, partition, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let mut next = 0;
        while next < high {
            let Some(message) = consumer.poll(Duration::from_secs(10)) else {
                return Err(format!("{topic}/{partition}: nothing after offset {next}").into());
            };
            let message = message?;
            next = message.offset() + 1;
            let key = String::from_utf8_lossy(message.key().unwrap_or_default()).into_owned();
            match message.payload() {
                None => {
                    latest.remove(&key);
                }
                Some(bytes) => {
                    let Value::Record(record) = schemas.decode(bytes).await? else {
                        return Err("a record was expected".into());
                    };
                    let state = serde_json::json!({
                        "key": key,
                        "entity_type": field(&record, "entity_type"),
                        "entity_id": field(&record, "entity_id"),
                        "status": field(&record, "status"),
                        "total": field(&record, "total"),
                        "name": field(&record, "name"),
                        "version_at": field(&record, "version_at"),
                    });
                    latest.insert(key, state);
                }
            }
        }
    }
    for state in latest.values() {
        println!("{state}");
    }
    Ok(())
}
