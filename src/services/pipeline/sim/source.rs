//! The simulated broker read back by the rebuild: its log, every partition
//! of each topic, with the ids and partition counts `DescribeTopics` would
//! give (new ids once the broker was replaced by an empty one).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::adapters::publish::{Described, FakeBroker, TopicIdentity};
use crate::services::rebuild::{TopicRead, TopicSource};
use crate::services::replay::{Extent, Letter, ReadError};

/// The fake broker as the rebuild reads it.
pub(super) struct FakeSource {
    pub(super) broker: Arc<FakeBroker>,
}

#[async_trait]
impl TopicSource for FakeSource {
    async fn describe(&self, topics: &[String]) -> Described {
        let (cluster, generation) = self.broker.ids();
        Described {
            cluster: Some(cluster),
            topics: topics
                .iter()
                .map(|topic| {
                    (
                        topic.clone(),
                        TopicIdentity {
                            id: Some(format!("{topic}-{generation}")),
                            partitions: self.broker.partitions_of(topic),
                        },
                    )
                })
                .collect(),
        }
    }

    fn reader(&self, topic: &str) -> Result<Box<dyn TopicRead>, ReadError> {
        Ok(Box::new(FakeReader {
            broker: self.broker.clone(),
            topic: topic.to_owned(),
            left: Vec::new(),
        }))
    }

    fn kept_partitions(&self) -> BTreeMap<String, usize> {
        self.broker.kept_partitions()
    }

    fn keep_partitions_anew(&self, now: &BTreeMap<String, usize>) {
        self.broker.keep_partitions_anew(now);
    }
}

/// One topic of the fake broker, read from its log.
struct FakeReader {
    broker: Arc<FakeBroker>,
    topic: String,
    /// The assigned range's records not read yet, last first.
    left: Vec<Letter>,
}

#[async_trait]
impl TopicRead for FakeReader {
    async fn extents(&self) -> Result<Vec<Extent>, ReadError> {
        let partitions = i32::try_from(self.broker.partitions_of(&self.topic)).unwrap_or(1);
        Ok((0..partitions)
            .map(|partition| Extent {
                partition,
                low: 0,
                high: self.broker.end_of(&self.topic, partition),
            })
            .collect())
    }

    fn assign(&mut self, partition: i32, from: i64, to: i64) -> Result<(), ReadError> {
        self.left = self
            .broker
            .log_of(&self.topic, partition, from..to)
            .into_iter()
            .rev()
            .map(|(offset, record)| Letter {
                partition,
                offset,
                timestamp_ms: Some(record.timestamp_ms),
                key: Some(record.key),
                body: record.payload.map(Bytes::from),
                headers: record
                    .headers
                    .into_iter()
                    .map(|(name, value)| (name.to_owned(), value.into()))
                    .collect(),
            })
            .collect();
        Ok(())
    }

    async fn next(&mut self) -> Result<Option<Letter>, ReadError> {
        Ok(self.left.pop())
    }
}
