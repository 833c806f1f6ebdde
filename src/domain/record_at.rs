//! Where a record lies: the one (topic, partition, offset) the producer
//! reports, a commit carries, the ledger remembers with a delivery's answer
//! and a lookup shows.

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

/// Where a record lies in Kafka.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RecordAt {
    /// Its topic, shared with the record's and its topic set's.
    pub topic: Arc<str>,
    /// Its partition.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
}

impl RecordAt {
    /// `topic`'s `partition` at `offset`.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32, offset: i64) -> RecordAt {
        RecordAt {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl fmt::Display for RecordAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}
