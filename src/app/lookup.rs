//! What `posbridge lookup` opens: the ledger as a reader sees it and the
//! topics in use, and nothing else. No producer, no fill from the topics,
//! no wait for Kafka: a lookup answers what the ledger knows within
//! seconds while Kafka is away, and says the records could not be read.

use crate::adapters::ledger;
use crate::adapters::publish::TopicSets;
use crate::config::Config;
use crate::services::lookup::Lookup;

use super::BuildError;

/// Lookups on `config`'s ledger and topics (the sources' own included, as
/// the ledger last saw them).
///
/// # Errors
/// [`BuildError::Ledger`] when the ledger cannot be opened (on the embedded
/// ledger, while `serve` holds its file: ask `serve`'s admin listener
/// instead), [`BuildError::Reader`] when the registry's client cannot be
/// made.
pub async fn open(config: &Config) -> Result<Lookup, BuildError> {
    // A reader takes no lease: the lease's length does not matter here.
    let opened = ledger::open(&config.ledger, config.kafka.delivery_timeout()).await?;
    let cached = opened.ledger.read().cached().await?;
    let topics = TopicSets::new(&config.kafka);
    for prefix in super::topics::at_start(config, cached.as_ref()) {
        topics.open(&prefix);
    }
    Ok(Lookup::new(config, opened.ledger, topics)?)
}
