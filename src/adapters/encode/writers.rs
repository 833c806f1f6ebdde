//! Reading a record whatever version of the schema wrote it: the writer's
//! schema is found by the record's framing (a single-object fingerprint
//! among the versions this build knows, `schemas/history/`; a Confluent
//! schema id, asked of the registry once), the datum read with it, and the
//! fields a version lacks read as absent, as Avro's resolution reads them
//! with their `null` defaults.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use apache_avro::Schema;
use apache_avro::reader::datum::GenericDatumReader;

use super::fingerprint::fingerprint_of;
use super::{CONFLUENT_MAGIC, DecodeError, RegistryClient, SCHEMA_JSON, SINGLE_OBJECT_MAGIC};
use crate::config::RegistryConfig;
use crate::domain::event::PosEvent;

/// Every version of the event schema this build reads, by fingerprint.
static KNOWN: LazyLock<HashMap<u64, Arc<Schema>>> = LazyLock::new(|| {
    [
        SCHEMA_JSON,
        include_str!("../../../schemas/history/pos_event.v1.avsc"),
    ]
    .into_iter()
    .map(|json| {
        let schema = Schema::parse_str(json).expect("a schema of this build parses");
        (fingerprint_of(json), Arc::new(schema))
    })
    .collect()
});

/// Why a record's writer schema could not be had.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// The record is not one posbridge could have written.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A single-object fingerprint of no version this build knows.
    #[error("written with schema fingerprint {0:016x}, not a version this build knows")]
    UnknownFingerprint(u64),
    /// A Confluent schema id the registry does not know, or there is none.
    #[error("written with schema id {0}, which the registry does not know (or none is configured)")]
    UnknownId(u32),
    /// The registry's schema for an id does not parse.
    #[error("the registry's schema {id} does not parse: {source}")]
    Unparsable {
        /// The schema id.
        id: u32,
        /// Why.
        #[source]
        source: apache_avro::Error,
    },
    /// The registry could not answer.
    #[error(transparent)]
    Registry(#[from] super::RegistryError),
}

/// Reads records of any version. Cheap to share; the registry's schemas are
/// asked once per id.
pub struct Writers {
    registry: Option<RegistryClient>,
    by_id: Mutex<HashMap<u32, Arc<Schema>>>,
}

impl Writers {
    /// A reader of records with `config`'s registry (none: single-object
    /// records only).
    ///
    /// # Errors
    /// [`WriterError::Registry`] when the registry's client cannot be made.
    pub fn new(config: &RegistryConfig) -> Result<Writers, WriterError> {
        let registry = match &config.url {
            Some(url) => Some(RegistryClient::new(config, url)?),
            None => None,
        };
        Ok(Writers {
            registry,
            by_id: Mutex::default(),
        })
    }

    /// The event a record's value holds, read with its writer's schema.
    ///
    /// # Errors
    /// [`WriterError`] naming what could not be read.
    pub async fn decode(&self, bytes: &[u8]) -> Result<PosEvent, WriterError> {
        let (schema, datum) = match bytes {
            [m0, m1, rest @ ..] if [*m0, *m1] == SINGLE_OBJECT_MAGIC && rest.len() >= 8 => {
                let (print, datum) = rest.split_at(8);
                let print = u64::from_le_bytes(print.try_into().unwrap_or_default());
                let schema = KNOWN
                    .get(&print)
                    .cloned()
                    .ok_or(WriterError::UnknownFingerprint(print))?;
                (schema, datum)
            }
            [CONFLUENT_MAGIC, rest @ ..] if rest.len() >= 4 => {
                let (id, datum) = rest.split_at(4);
                let id = u32::from_be_bytes(id.try_into().unwrap_or_default());
                (self.schema_of(id).await?, datum)
            }
            [first, ..] => return Err(DecodeError::Framing(*first).into()),
            [] => return Err(DecodeError::Framing(0xff).into()),
        };
        let reader = GenericDatumReader::builder(&schema)
            .build()
            .map_err(DecodeError::from)?;
        let mut datum = datum;
        let value = reader.read_value(&mut datum).map_err(DecodeError::from)?;
        Ok(super::from_avro(value)?)
    }

    /// The schema registered under `id`, asked once.
    async fn schema_of(&self, id: u32) -> Result<Arc<Schema>, WriterError> {
        if let Some(schema) = self
            .by_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
        {
            return Ok(schema.clone());
        }
        let registry = self.registry.as_ref().ok_or(WriterError::UnknownId(id))?;
        let json = registry
            .schema_of(id)
            .await?
            .ok_or(WriterError::UnknownId(id))?;
        let schema = Arc::new(
            Schema::parse_str(&json).map_err(|source| WriterError::Unparsable { id, source })?,
        );
        self.by_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, schema.clone());
        Ok(schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record schema v1 wrote (the first release's pinned bytes) reads
    /// with v1, the fields v1 lacks absent; one this build writes reads as
    /// written.
    #[tokio::test]
    async fn records_of_every_known_version_read_with_their_writers_schema() {
        let writers = Writers::new(&RegistryConfig::default()).unwrap();
        let v1 = hex::decode(super::super::tests::V1_BYTES).unwrap();
        let old = writers.decode(&v1).await.unwrap();
        assert_eq!(old.entity_id, "R-1");
        assert_eq!(old.name, None, "a field v1 lacks");
        let event = PosEvent::with_every_field();
        let encoder = super::super::Encoder::new(&RegistryConfig::default(), &[])
            .await
            .unwrap();
        let now = encoder.encode("pos.returns", &event).unwrap();
        assert_eq!(writers.decode(&now).await.unwrap(), event);
        let mut unknown = now.clone();
        unknown[2] ^= 0xff;
        assert!(matches!(
            writers.decode(&unknown).await,
            Err(WriterError::UnknownFingerprint(_))
        ));
    }
}
