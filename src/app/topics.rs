//! A source's own topics (`topic_prefix`): the prefixes start-up opens with
//! the shared topics, and opening one while running, before its source
//! takes a delivery.

use std::collections::BTreeSet;

use tracing::info;

use crate::adapters::encode::{EncodeError, Encoder};
use crate::adapters::ledger::Cached;
use crate::adapters::publish::{PublishError, Publisher, TopicSets, Topics, zero_change_gauges};
use crate::config::{Config, KafkaConfig, RegistryConfig};
use crate::domain::event::EntityType;

/// Why a source's own topics could not be put in use.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// They could not be made or are not fit (not compacted).
    #[error("its topics are not ready: {0}")]
    Topics(#[from] PublishError),
    /// The registry did not take the schema for them.
    #[error("its topics' schema subjects are not ready: {0}")]
    Schema(#[from] EncodeError),
}

/// The prefixes start-up opens with the shared topics: each main-file
/// source's, and each the ledger's checkpoint names (a source that wrote
/// there before: its records are read by the ledger's fill, and what it
/// spooled drains there, whether it is still configured or not). A sources
/// directory's files open theirs as they are read (`Sources`): a file
/// whose topics cannot be made is refused alone.
pub fn at_start(config: &Config, cached: Option<&Cached>) -> BTreeSet<String> {
    let mut prefixes: BTreeSet<String> = config
        .sources()
        .filter_map(|entry| entry.config.topic_prefix.clone())
        .collect();
    if let Some(cached) = cached {
        let named = cached
            .offsets
            .keys()
            .map(|(topic, _)| topic.as_str())
            .chain(
                cached
                    .topics
                    .iter()
                    .flat_map(|seen| seen.topics.keys().map(String::as_str)),
            );
        prefixes.extend(named.filter_map(|topic| prefix_of(&config.kafka, topic)));
    }
    prefixes.retain(|prefix| config.kafka.shared_topic_clash(prefix).is_none());
    prefixes
}

/// Every set of topics `config` names, for the commands that look at them
/// without serving: the shared set, then each prefix start-up opens
/// ([`at_start`]) and each a sources directory's readable file names.
pub fn configured(config: &Config, cached: Option<&Cached>) -> Vec<Topics> {
    let mut prefixes = at_start(config, cached);
    if let Some(listing) = config.sources_dir.as_deref().and_then(|dir| {
        crate::config::source_files::read_dir(dir, crate::adapters::providers::api_keys).ok()
    }) {
        prefixes.extend(
            listing
                .files
                .into_iter()
                .filter_map(|file| file.config.topic_prefix)
                .filter(|prefix| config.kafka.shared_topic_clash(prefix).is_none()),
        );
    }
    std::iter::once(Topics::new(&config.kafka))
        .chain(prefixes.iter().map(|prefix| Topics::prefixed(prefix)))
        .collect()
}

/// The prefix of a source's own entity topic (`acme.sales` gives `acme.`);
/// none for a shared topic or a dead-letter topic.
fn prefix_of(kafka: &KafkaConfig, topic: &str) -> Option<String> {
    if kafka.shared_topics().iter().any(|shared| shared == topic) {
        return None;
    }
    EntityType::ALL
        .iter()
        .find_map(|t| topic.strip_suffix(t.plural()))
        .filter(|prefix| crate::config::topic_prefix_problem(prefix).is_none())
        .map(str::to_owned)
}

/// Opens a source's own topics while running: made (with
/// `kafka.create_topics`), checked as start-up checks the shared ones, the
/// schema registered for them, then in use. Cheap to clone.
#[derive(Clone)]
pub struct OwnTopics {
    sets: TopicSets,
    publisher: Publisher,
    encoder: Encoder,
    kafka: KafkaConfig,
    registry: RegistryConfig,
}

impl OwnTopics {
    /// Opens prefixes into `sets` with these pieces of a running app.
    pub fn new(
        sets: TopicSets,
        publisher: Publisher,
        encoder: Encoder,
        config: &Config,
    ) -> OwnTopics {
        OwnTopics {
            sets,
            publisher,
            encoder,
            kafka: config.kafka.clone(),
            registry: config.schema_registry.clone(),
        }
    }

    /// Whether `prefix`'s topics are in use already.
    pub fn is_open(&self, prefix: &str) -> bool {
        self.sets.is_open(prefix)
    }

    /// Puts `prefix`'s topics in use; nothing to do when they are.
    ///
    /// # Errors
    /// [`OpenError`] naming what is not ready; nothing is in use then, and
    /// a later call tries again.
    pub async fn open(&self, prefix: &str) -> Result<(), OpenError> {
        if self.sets.is_open(prefix) {
            return Ok(());
        }
        let topics = Topics::prefixed(prefix);
        if self.kafka.create_topics {
            self.publisher
                .ensure_topics(
                    &topics.all(),
                    self.kafka.partitions,
                    self.kafka.replication_factor,
                )
                .await?;
        }
        self.publisher.check_topic_settings(&topics).await?;
        let entity_topics: Vec<String> = topics.entities().map(str::to_owned).collect();
        self.encoder
            .register(&self.registry, &entity_topics)
            .await?;
        zero_change_gauges(&topics);
        self.sets.open(prefix);
        info!(prefix, topics = ?topics.all().keys().collect::<Vec<_>>(), "A source's own topics are ready.");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_names_the_prefixes_of_sources_own_topics_only() {
        let kafka = KafkaConfig::default();
        assert_eq!(prefix_of(&kafka, "acme.sales").as_deref(), Some("acme."));
        assert_eq!(prefix_of(&kafka, "pos.sales"), None, "shared");
        assert_eq!(prefix_of(&kafka, "acme-dead-letter"), None);
        assert_eq!(prefix_of(&kafka, "sales"), None, "no prefix");
    }
}
