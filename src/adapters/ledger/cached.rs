//! What a ledger knows of the topics it caches: which cluster and which
//! topics it was filled from, the partitions posbridge keeps for each, and
//! how far it has applied each partition.
//!
//! The ledger is a cache of the topics, so it is only right about the
//! topics it was read from. A cluster replaced at the same address, or a
//! topic deleted and made again while posbridge was stopped, has the same
//! names and other records: a ledger that took them for its own would
//! answer their retries `duplicate` and their older events `stale` while
//! the new topics stay empty. The cluster's id and each topic's id tell
//! them apart; offsets past a partition's end tell them apart where a
//! broker gives no ids. The partition counts are kept here because a topic
//! grown while posbridge was stopped must be refused at the next start as
//! it is while running: the count only posbridge's memory held was lost
//! with it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::placements::Offsets;

/// The cluster and topics a ledger was filled from, as its checkpoint
/// recorded them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicsSeen {
    /// The cluster's id, when the broker gives one.
    pub cluster: Option<String>,
    /// Each topic posbridge writes, by name.
    pub topics: BTreeMap<String, TopicSeen>,
}

/// One topic as the ledger's checkpoint recorded it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSeen {
    /// The id the cluster gave it, when the broker gives ids.
    pub id: Option<String>,
    /// The partitions posbridge keeps for it (an entity topic's, whose
    /// change is refused); `None` for a topic whose count is not watched.
    pub partitions: Option<usize>,
}

impl TopicsSeen {
    /// The partitions kept for each topic that has a count.
    pub fn partitions(&self) -> BTreeMap<String, usize> {
        self.topics
            .iter()
            .filter_map(|(name, topic)| Some((name.clone(), topic.partitions?)))
            .collect()
    }
}

/// What a store that keeps offsets holds of the topics: where its start-up
/// read begins, and what it was read from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cached {
    /// Per partition, the next offset to read: everything below is applied.
    pub offsets: Offsets,
    /// The cluster and topics those offsets are of; `None` in a ledger
    /// written before it was kept (its offsets alone are compared).
    pub topics: Option<TopicsSeen>,
}
