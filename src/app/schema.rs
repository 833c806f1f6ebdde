//! `posbridge schema check`: whether this version's schema may be
//! registered under every subject it would be registered under, by each
//! subject's own compatibility rules, asked of the registry itself. For CI
//! with `schema_registry.auto_register = false`, where only CI registers.

use crate::adapters::encode::{RegistryClient, RegistryError, SCHEMA_JSON, value_subject};
use crate::adapters::publish::Topics;
use crate::config::Config;

/// What the registry says of one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The schema is already registered under the subject.
    Registered,
    /// The subject's rules accept the schema as its next version.
    Compatible,
    /// No such subject yet: the schema would be its first version.
    NewSubject,
    /// The subject's rules refuse the schema.
    Incompatible,
}

impl Verdict {
    /// The word printed for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Registered => "registered",
            Verdict::Compatible => "compatible",
            Verdict::NewSubject => "new subject",
            Verdict::Incompatible => "INCOMPATIBLE",
        }
    }
}

/// Why the check could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SchemaCheckError {
    /// Without a registry there is nothing to check: records are
    /// single-object encoded and carry their schema's fingerprint.
    #[error(
        "schema_registry.url is not set: records use single-object encoding, nothing is registered"
    )]
    NoRegistry,
    /// The registry could not answer.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// Each entity topic's subject (`{topic}-value`), the sources' own topics'
/// too, with the registry's verdict.
///
/// # Errors
/// [`SchemaCheckError`] when there is no registry or it cannot answer.
pub async fn check(config: &Config) -> Result<Vec<(String, Verdict)>, SchemaCheckError> {
    let url = config
        .schema_registry
        .url
        .as_deref()
        .ok_or(SchemaCheckError::NoRegistry)?;
    let client = RegistryClient::new(&config.schema_registry, url)?;
    let mut verdicts = Vec::new();
    let sets = super::topics::configured(config, None);
    for topic in sets.iter().flat_map(Topics::entities) {
        let subject = value_subject(topic);
        let verdict = if client.lookup(&subject, SCHEMA_JSON).await?.is_some() {
            Verdict::Registered
        } else {
            match client.compatible(&subject, SCHEMA_JSON).await? {
                None => Verdict::NewSubject,
                Some(true) => Verdict::Compatible,
                Some(false) => Verdict::Incompatible,
            }
        };
        verdicts.push((subject, verdict));
    }
    Ok(verdicts)
}
