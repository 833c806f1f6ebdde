//! Reading the dead-letter topic: one partition at a time, from an offset to
//! the high watermark seen when the run started.
//!
//! One partition at a time because tansu 0.6, after a restart, was seen to
//! deliver nothing to a consumer assigned every partition at once, while one
//! partition at a time works; records of one delivery share a partition (the
//! key is the delivery), so nothing needs them interleaved. No consumer
//! group is joined and no offset committed: how far a replay got is the
//! ledger's checkpoint.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::config::KafkaConfig;

use super::select::Letter;

/// How long a metadata or watermark request may take.
const METADATA_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a read waits for the next record before the run stops: the
/// records are there (below the high watermark), so silence is a broker
/// problem.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the dead-letter topic could not be read. All retryable: the run
/// stops, its checkpoints stay before what was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// librdkafka refused the consumer configuration.
    #[error("kafka consumer configuration: {0}")]
    Config(#[source] KafkaError),
    /// A metadata, watermark or assignment request failed.
    #[error("{topic}: {source}")]
    Broker {
        /// The dead-letter topic.
        topic: String,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// A fetch failed.
    #[error("{topic}/{partition}: {source}")]
    Fetch {
        /// The dead-letter topic.
        topic: String,
        /// The partition being read.
        partition: i32,
        /// librdkafka's error.
        #[source]
        source: KafkaError,
    },
    /// Nothing arrived for [`STALL_TIMEOUT`] below the high watermark.
    #[error("{topic}/{partition}: no record after offset {offset} within {secs} s", secs = STALL_TIMEOUT.as_secs())]
    Stalled {
        /// The dead-letter topic.
        topic: String,
        /// The partition being read.
        partition: i32,
        /// The next offset expected.
        offset: i64,
    },
    /// The runtime is shutting down: a request to the broker was cancelled
    /// before it ran.
    #[error("the process is shutting down")]
    ShuttingDown,
}

/// One partition's range as the run found it at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The partition.
    pub partition: i32,
    /// Its first offset still kept.
    pub low: i64,
    /// Its high watermark: one past its last record.
    pub high: i64,
}

/// A reader of the dead-letter topic.
pub struct Reader {
    /// Shared with the blocking metadata calls.
    consumer: Arc<StreamConsumer>,
    /// The dead-letter topic.
    topic: String,
    /// The partition assigned now, the next offset wanted and the end.
    reading: Option<(i32, i64, i64)>,
}

/// What librdkafka fetches ahead of the reading loop, in KiB.
const QUEUED_KBYTES: &str = "8192";

/// How long the broker may hold a fetch that finds no new record, in ms.
const FETCH_WAIT_MS: &str = "10";

impl Reader {
    /// A consumer of `topic` with the producer's connection settings.
    ///
    /// # Errors
    /// [`ReadError::Config`] when librdkafka refuses a property.
    pub fn new(config: &KafkaConfig, topic: &str) -> Result<Reader, ReadError> {
        let mut client = ClientConfig::new();
        for (key, value) in config.consumer_properties() {
            client.set(key, value);
        }
        let consumer: StreamConsumer = client
            // librdkafka wants a group for a consumer; none is joined (assign only).
            .set("group.id", "posbridge-replay-dead-letters")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // Offsets below `low` were deleted meanwhile: start at the first kept.
            .set("auto.offset.reset", "earliest")
            // The end of a partition ends its read even when its last offsets
            // hold no record.
            .set("enable.partition.eof", "true")
            // One partition is read at a time, by a loop that keeps up with
            // the fetches: librdkafka's default queue of 64 MiB ahead of it
            // is memory for nothing. A full queue postpones the next fetch
            // by a second by default, which a queue this small reaches at
            // once: ask again soon instead.
            .set("queued.max.messages.kbytes", QUEUED_KBYTES)
            .set("fetch.queue.backoff.ms", "10")
            // Past a partition's end the broker holds a fetch this long for
            // new records, and the next partition's fetch waits behind it on
            // the same connection: librdkafka's 500 ms made every partition
            // read cost half a second.
            .set("fetch.wait.max.ms", FETCH_WAIT_MS)
            .create()
            .map_err(ReadError::Config)?;
        Ok(Reader {
            consumer: Arc::new(consumer),
            topic: topic.to_owned(),
            reading: None,
        })
    }

    /// Every partition of the topic with its offsets now; none when the
    /// topic does not exist.
    ///
    /// # Errors
    /// [`ReadError::Broker`] when the broker does not answer.
    pub async fn extents(&self) -> Result<Vec<Extent>, ReadError> {
        let consumer = self.consumer.clone();
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || -> Result<Vec<Extent>, ReadError> {
            let broker = |source| ReadError::Broker {
                topic: topic.clone(),
                source,
            };
            let metadata = consumer
                .fetch_metadata(Some(topic.as_str()), METADATA_TIMEOUT)
                .map_err(broker)?;
            let mut extents = Vec::new();
            for found in metadata.topics().iter().filter(|t| t.name() == topic) {
                if found.error().is_some() {
                    continue;
                }
                for partition in found.partitions() {
                    let (low, high) = consumer
                        .fetch_watermarks(&topic, partition.id(), METADATA_TIMEOUT)
                        .map_err(broker)?;
                    extents.push(Extent {
                        partition: partition.id(),
                        low,
                        high,
                    });
                }
            }
            extents.sort_by_key(|e| e.partition);
            Ok(extents)
        })
        .await
        .unwrap_or_else(|error| match error.try_into_panic() {
            // The closure only asks librdkafka, which reports failures as
            // errors: a panic in it is a bug, and goes on as one.
            Ok(panic) => std::panic::resume_unwind(panic),
            // The runtime is shutting down: its blocking pool cancelled the
            // request before it ran.
            Err(_) => Err(ReadError::ShuttingDown),
        })
    }

    /// Starts reading `partition` at `from`, up to `to` (exclusive).
    ///
    /// # Errors
    /// [`ReadError::Broker`] when the assignment is refused.
    pub fn assign(&mut self, partition: i32, from: i64, to: i64) -> Result<(), ReadError> {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&self.topic, partition, Offset::Offset(from))
            .and_then(|()| self.consumer.assign(&assignment))
            .map_err(|source| ReadError::Broker {
                topic: self.topic.clone(),
                source,
            })?;
        self.reading = Some((partition, from, to));
        Ok(())
    }

    /// The next record of the assigned partition, or `None` at its end.
    /// Records seen before (tansu may repeat some) and records of other
    /// partitions (fetched before the assignment changed) are passed over.
    ///
    /// # Errors
    /// [`ReadError::Fetch`] or [`ReadError::Stalled`] when the broker does
    /// not deliver what it holds.
    pub async fn next(&mut self) -> Result<Option<Letter>, ReadError> {
        let Some((partition, next, end)) = self.reading else {
            return Ok(None);
        };
        if next >= end {
            return Ok(None);
        }
        loop {
            let received = tokio::time::timeout(STALL_TIMEOUT, self.consumer.recv())
                .await
                .map_err(|_| ReadError::Stalled {
                    topic: self.topic.clone(),
                    partition,
                    offset: next,
                })?;
            let message = match received {
                Ok(message) => message,
                Err(KafkaError::PartitionEOF(at)) if at == partition => {
                    self.reading = Some((partition, end, end));
                    return Ok(None);
                }
                Err(KafkaError::PartitionEOF(_)) => continue,
                Err(source) => {
                    return Err(ReadError::Fetch {
                        topic: self.topic.clone(),
                        partition,
                        source,
                    });
                }
            };
            if message.partition() != partition || message.offset() < next {
                continue;
            }
            if message.offset() >= end {
                self.reading = Some((partition, end, end));
                return Ok(None);
            }
            self.reading = Some((partition, message.offset() + 1, end));
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| {
                            let value = String::from_utf8_lossy(h.value.unwrap_or_default());
                            (h.key.to_owned(), value.into_owned())
                        })
                        .collect()
                })
                .unwrap_or_default();
            return Ok(Some(Letter {
                partition,
                offset: message.offset(),
                timestamp_ms: message.timestamp().to_millis(),
                key: message
                    .key()
                    .map(|key| String::from_utf8_lossy(key).into_owned()),
                body: message.payload().map(Bytes::copy_from_slice),
                headers,
            }));
        }
    }
}
