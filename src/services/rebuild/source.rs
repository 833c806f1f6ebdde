//! Where a rebuild reads the topics from: the cluster ([`Kafka`]), or the
//! simulation's broker, which keeps its log in memory. The rebuild asks
//! only what this seam offers: the cluster's and the topics' ids, each
//! topic's partitions and their records, and the partition counts the
//! topic watch keeps.

use std::collections::BTreeMap;

use async_trait::async_trait;
use tracing::debug;

use crate::adapters::publish::{Described, Publisher};
use crate::config::KafkaConfig;
use crate::services::replay::{Extent, Letter, ReadError, Reader};

/// The topics a rebuild reads.
#[async_trait]
pub trait TopicSource: Send + Sync {
    /// The cluster's and `topics`' ids; empty where the broker gives none
    /// (the offsets alone then tell other topics).
    async fn describe(&self, topics: &[String]) -> Described;

    /// A reader of `topic`.
    ///
    /// # Errors
    /// [`ReadError::Config`] when no reader can be made.
    fn reader(&self, topic: &str) -> Result<Box<dyn TopicRead>, ReadError>;

    /// The partition count kept for each topic (the topic watch's).
    fn kept_partitions(&self) -> BTreeMap<String, usize>;

    /// The ledger was found caching other topics: `now` is kept instead.
    fn keep_partitions_anew(&self, now: &BTreeMap<String, usize>);
}

/// One topic, read one partition range at a time.
#[async_trait]
pub trait TopicRead: Send + Sync {
    /// Every partition with its offsets now; none when the topic does not exist.
    async fn extents(&self) -> Result<Vec<Extent>, ReadError>;

    /// Starts reading `partition` at `from`, up to `to` (exclusive).
    fn assign(&mut self, partition: i32, from: i64, to: i64) -> Result<(), ReadError>;

    /// The next record of the assigned range, or `None` at its end.
    async fn next(&mut self) -> Result<Option<Letter>, ReadError>;
}

/// The cluster posbridge produces to.
pub struct Kafka {
    config: KafkaConfig,
    /// For the ids and the partitions kept.
    publisher: Publisher,
}

impl Kafka {
    /// The cluster `config` names, described through `publisher`.
    pub fn new(config: &KafkaConfig, publisher: Publisher) -> Kafka {
        Kafka {
            config: config.clone(),
            publisher,
        }
    }
}

#[async_trait]
impl TopicSource for Kafka {
    async fn describe(&self, topics: &[String]) -> Described {
        self.publisher
            .describe(topics)
            .await
            .unwrap_or_else(|error| {
                debug!(%error, "The cluster does not describe its topics' ids.");
                Described::default()
            })
    }

    fn reader(&self, topic: &str) -> Result<Box<dyn TopicRead>, ReadError> {
        Ok(Box::new(Reader::new(&self.config, topic)?))
    }

    fn kept_partitions(&self) -> BTreeMap<String, usize> {
        self.publisher.kept_partitions()
    }

    fn keep_partitions_anew(&self, now: &BTreeMap<String, usize>) {
        self.publisher.keep_partitions_anew(now);
    }
}

#[async_trait]
impl TopicRead for Reader {
    async fn extents(&self) -> Result<Vec<Extent>, ReadError> {
        Reader::extents(self).await
    }

    fn assign(&mut self, partition: i32, from: i64, to: i64) -> Result<(), ReadError> {
        Reader::assign(self, partition, from, to)
    }

    async fn next(&mut self) -> Result<Option<Letter>, ReadError> {
        Reader::next(self).await
    }
}
