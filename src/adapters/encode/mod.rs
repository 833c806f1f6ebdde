//! Avro encoding of [`PosEvent`]s, in one of two wire formats.
//!
//! * With a Schema Registry: the Confluent wire format (magic 0, 4-byte schema
//!   id, Avro datum), the schema registered through `schema_registry_converter`
//!   under TopicNameStrategy (`{topic}-value`) at start-up (or only looked up),
//!   so an incompatible schema stops the service before it accepts anything;
//!   the ids it gave frame every record.
//! * Without one: Avro single-object encoding (`C3 01`, 8-byte CRC-64-AVRO
//!   fingerprint, datum), the Avro spec's registry-less format, so the embedded
//!   default needs nothing else running.
//!
//! [`decode`] reads both back; consumers in Rust and the tests use it.
//! The datum is written in `datum.rs`, read back in `avro.rs` (whose value
//! tree is also the tests' reference for the written bytes); the fingerprint
//! is in `fingerprint.rs`.

mod avro;
mod datum;
mod fingerprint;
mod json;
mod registry;
mod writers;

use std::sync::LazyLock;

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;
use arc_swap::ArcSwap;
use schema_registry_converter::async_impl::easy_avro::EasyAvroEncoder;
use schema_registry_converter::async_impl::schema_registry::{SrSettings, get_all_subjects};
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{
    SchemaType, SubjectNameStrategy, SuppliedSchema,
};

use crate::config::RegistryConfig;
use crate::domain::event::PosEvent;

pub use avro::{from_avro, to_avro};
pub use fingerprint::fingerprint;
pub use json::{event_json, shown};
pub use registry::{RegistryClient, RegistryError};
pub use writers::{WriterError, Writers};

/// The event schema, the contract with consumers.
pub const SCHEMA_JSON: &str = include_str!("../../../schemas/pos_event.avsc");

/// The revision of the schema's text (its `posbridge.revision`), which every
/// entity record carries in its `posbridge-schema` header: raised with any
/// change of the text a consumer may need to tell apart, including one the
/// canonical form (and so the single-object fingerprint) does not see. 3 names
/// the time types for Kafka Connect (`connect.name`), so a sink tells this
/// revision's exact microsecond times from earlier records' plain longs.
pub const SCHEMA_REVISION: &str = "3";

/// The parsed event schema.
pub static SCHEMA: LazyLock<Schema> = LazyLock::new(|| {
    // The schema file is part of the binary and covered by unit tests; a
    // parse failure here can only be a build from a broken checkout.
    Schema::parse_str(SCHEMA_JSON).expect("schemas/pos_event.avsc is valid Avro")
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
    /// The registry could not be reached or answered an error; retryable
    /// when `retriable` says so.
    #[error("schema registry: {0}")]
    Registry(#[from] SRCError),
    /// The registry's client could not be set up (CA file, settings), or a
    /// lookup failed.
    #[error("schema registry: {0}")]
    Client(#[from] RegistryError),
    /// With `auto_register = false`, the schema is not registered under a
    /// subject: register it first (`posbridge schema check` says whether it may be).
    #[error(
        "the event schema is not registered for subject `{subject}` (schema_registry.auto_register = false)"
    )]
    NotRegistered {
        /// The subject, `{topic}-value`.
        subject: String,
    },
    /// The registry refused the schema (typically incompatible with the
    /// subject's existing versions).
    #[error("schema registry refused the event schema for subject `{subject}`: {answer}")]
    Rejected {
        /// The subject, `{topic}-value`.
        subject: String,
        /// The registry's answer.
        #[source]
        answer: SRCError,
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
    /// Confluent wire format with each topic's schema id, registered
    /// (`auto_register`) or looked up at start-up.
    Registered {
        /// Schema id by topic; a source's own topics are added as it
        /// appears ([`Encoder::register`]).
        ids: std::sync::Arc<ArcSwap<std::collections::HashMap<String, u32>>>,
        /// The connection settings, kept for readiness checks.
        settings: SrSettings,
    },
}

impl EncodeError {
    /// Whether the registry did not answer at all (not a refusal, not a
    /// missing registration): an outage a start may ride out.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            EncodeError::Registry(_) | EncodeError::Client(RegistryError::Unreachable { .. })
        )
    }
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
        let settings = RegistryClient::settings(config, url)?;
        let encoder = Encoder::Registered {
            ids: std::sync::Arc::default(),
            settings,
        };
        encoder.register(config, topics).await?;
        Ok(encoder)
    }

    /// Registers the schema (or, without `auto_register`, looks it up) for
    /// each of `topics` not known yet: a source with topics of its own,
    /// before it takes a delivery. Nothing to do without a registry.
    ///
    /// # Errors
    /// As [`Encoder::new`]; no topic of `topics` is added then.
    pub async fn register(
        &self,
        config: &RegistryConfig,
        topics: &[String],
    ) -> Result<(), EncodeError> {
        let (Encoder::Registered { ids, settings }, Some(url)) = (self, &config.url) else {
            return Ok(());
        };
        let known = ids.load_full();
        let new: Vec<&String> = topics.iter().filter(|t| !known.contains_key(*t)).collect();
        if new.is_empty() {
            return Ok(());
        }
        // Each topic's id, registered (or only looked up) once here: every
        // record then carries it, written without asking the registry again.
        let registrar = config
            .auto_register
            .then(|| EasyAvroEncoder::new(settings.clone()));
        let client = RegistryClient::new(config, url)?;
        let mut found = Vec::new();
        for topic in new {
            let id = match &registrar {
                Some(registrar) => register(registrar, topic).await?,
                None => {
                    let subject = value_subject(topic);
                    client
                        .lookup(&subject, SCHEMA_JSON)
                        .await?
                        .ok_or(EncodeError::NotRegistered { subject })?
                }
            };
            found.push((topic.clone(), id));
        }
        ids.rcu(|ids| {
            let mut ids = std::collections::HashMap::clone(ids);
            ids.extend(found.iter().cloned());
            ids
        });
        Ok(())
    }

    /// The Confluent-framing encoder with ids an earlier start took from
    /// the registry (for this very schema), for a start while the registry
    /// is away: records need no registry once their ids are known.
    ///
    /// # Errors
    /// [`EncodeError::Client`] when the registry settings cannot be built.
    pub fn with_known_ids(
        config: &RegistryConfig,
        url: &str,
        ids: std::collections::HashMap<String, u32>,
    ) -> Result<Encoder, EncodeError> {
        Ok(Encoder::Registered {
            ids: std::sync::Arc::new(ArcSwap::from_pointee(ids)),
            settings: RegistryClient::settings(config, url)?,
        })
    }

    /// Each topic's schema id, in the Confluent framing.
    pub fn ids(&self) -> Option<std::sync::Arc<std::collections::HashMap<String, u32>>> {
        match self {
            Encoder::SingleObject { .. } => None,
            Encoder::Registered { ids, .. } => Some(ids.load_full()),
        }
    }

    /// Encodes one event for `topic`, without I/O: the registry's ids were
    /// taken at start-up.
    ///
    /// # Errors
    /// [`EncodeError::NotRegistered`] for a topic the encoder was not built
    /// for.
    pub fn encode(&self, topic: &str, event: &PosEvent) -> Result<Vec<u8>, EncodeError> {
        match self {
            Encoder::SingleObject { header } => Ok(framed(header, event)),
            Encoder::Registered { ids, .. } => {
                let id = *ids
                    .load()
                    .get(topic)
                    .ok_or_else(|| EncodeError::NotRegistered {
                        subject: value_subject(topic),
                    })?;
                let mut header = [CONFLUENT_MAGIC; 5];
                header[1..].copy_from_slice(&id.to_be_bytes());
                Ok(framed(&header, event))
            }
        }
    }

    /// The wire format's name, for the start-up log, `/readyz` and
    /// `posbridge_build_info`: `avro-single-object` or `confluent`.
    pub fn name(&self) -> &'static str {
        match self {
            Encoder::SingleObject { .. } => "avro-single-object",
            Encoder::Registered { .. } => "confluent",
        }
    }

    /// Whether records go through a schema registry (Confluent framing).
    pub fn uses_registry(&self) -> bool {
        !matches!(self, Encoder::SingleObject { .. })
    }

    /// Whether the schema registry answers (always, without one).
    pub async fn registry_reachable(&self) -> bool {
        match self {
            Encoder::SingleObject { .. } => true,
            Encoder::Registered { settings, .. } => get_all_subjects(settings).await.is_ok(),
        }
    }
}

/// The framing `header`, then the event's datum, in one allocation sized
/// for the usual event (its raw body and a few hundred bytes of fields).
fn framed(header: &[u8], event: &PosEvent) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(header.len() + event.raw.len() + 512);
    bytes.extend_from_slice(header);
    datum::write(event, &mut bytes);
    bytes
}

/// Registers the event schema under `topic`'s subject (or finds it
/// registered) and gives its id.
async fn register(registrar: &EasyAvroEncoder, topic: &str) -> Result<u32, EncodeError> {
    let strategy = strategy(topic);
    let subject = strategy.get_subject()?;
    let schema = registrar
        .get_schema_and_id(&subject, strategy)
        .await
        .map_err(|e| {
            if e.retriable {
                EncodeError::Registry(e)
            } else {
                EncodeError::Rejected {
                    subject: subject.clone(),
                    answer: e,
                }
            }
        })?;
    Ok(schema.id)
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

/// The registry subject of a topic's values (Confluent's TopicNameStrategy),
/// the one spelling of it.
pub fn value_subject(topic: &str) -> String {
    format!("{topic}-value")
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn event() -> PosEvent {
        PosEvent::with_every_field()
    }

    #[tokio::test]
    async fn single_object_encoding_round_trips() {
        let encoder = Encoder::new(&RegistryConfig::default(), &[]).await.unwrap();
        let bytes = encoder.encode("pos.returns", &event()).unwrap();
        assert_eq!(&bytes[..2], &SINGLE_OBJECT_MAGIC);
        assert_eq!(decode(&bytes).unwrap(), event());
        assert_eq!(&bytes[2..10], &fingerprint().to_le_bytes());
    }

    /// The header's revision is the schema file's, and the file names every
    /// time type for Kafka Connect (exact microseconds through its sinks).
    #[test]
    fn the_schema_revision_is_the_files_and_its_times_are_named_for_connect() {
        let schema: serde_json::Value = serde_json::from_str(SCHEMA_JSON).unwrap();
        assert_eq!(schema["posbridge.revision"].to_string(), SCHEMA_REVISION);
        let micros = SCHEMA_JSON.matches("\"timestamp-micros\"").count();
        let named = SCHEMA_JSON
            .matches("\"connect.name\": \"io.debezium.time.MicroTimestamp\"")
            .count();
        assert!(micros > 0);
        assert_eq!(named, micros, "every timestamp-micros is named for Connect");
    }

    /// The bytes of one event under schema v1, as the first release wrote
    /// them (its tests pinned these).
    pub(super) const V1_BYTES: &str = "c301ecb1a1634e293ff804643102086d61696e000606522d311c72657475726e2e6372656174656480dbadaaf2d9b00680dbadaaf2d9b0060680db98abf2d9b00600020a4f55542d39000002064944520202ff02061388000208e199f0f80208646f6e6500020202410002043a9802100de0b6b3a763ffff00167b226964223a226431227d";

    /// The bytes of one event: consumers decode these, so a change that is
    /// symmetric in `to_avro`/`from_avro` (and passes the round trip) still
    /// fails here. v2 writes v1's datum with the new optional fields, all
    /// null here, before `raw`.
    #[tokio::test]
    async fn the_encoded_bytes_are_pinned() {
        let encoder = Encoder::new(&RegistryConfig::default(), &[]).await.unwrap();
        let bytes = encoder.encode("pos.returns", &event()).unwrap();
        assert_eq!(
            hex::encode(bytes),
            "c30129ef1678077fa4da04643102086d61696e000606522d311c72657475726e2e6372656174656480dbadaaf2d9b00680dbadaaf2d9b0060680db98abf2d9b00600020a4f55542d39000002064944520202ff02061388000208e199f0f80208646f6e6500020202410002043a9802100de0b6b3a763ffff000000000000000000000000167b226964223a226431227d"
        );
    }

    /// Schema evolution both ways: this version reads what the last one
    /// wrote (BACKWARD: a consumer upgraded first, or a topic holding older
    /// records) and the last one reads what this one writes (FORWARD: a
    /// consumer not yet upgraded). The bytes themselves are read across
    /// versions by fastavro in `tests/it/registry.rs` (apache-avro 0.22
    /// cannot resolve decimals across schemas).
    #[test]
    fn the_schema_evolves_compatibly_both_ways() {
        use apache_avro::schema_compatibility::SchemaCompatibility;
        let v1 =
            Schema::parse_str(include_str!("../../../schemas/history/pos_event.v1.avsc")).unwrap();
        SchemaCompatibility::can_read(&v1, &SCHEMA).expect("v2 reads v1");
        SchemaCompatibility::can_read(&SCHEMA, &v1).expect("v1 reads v2");
        assert_eq!(
            &hex::decode(V1_BYTES).unwrap()[2..10],
            &hex::decode("ecb1a1634e293ff8").unwrap()[..]
        );
    }

    #[test]
    fn decode_refuses_unknown_framing() {
        assert!(matches!(decode(&[7, 1, 2]), Err(DecodeError::Framing(7))));
    }
}
