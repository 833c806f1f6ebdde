//! How an entity topic can change under posbridge, and what an operator
//! is told of each change: the topic watch finds them (`watch.rs`), the
//! broker health holds them (`health.rs`), a refused send names them.

use std::fmt;

/// How an entity topic differs from what posbridge found at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicChange {
    /// The cluster no longer knows the topic (deleted).
    Missing,
    /// Its partition count is not the one found at start-up.
    Partitions {
        /// Found at start-up.
        from: usize,
        /// Found now.
        to: usize,
    },
    /// Its `cleanup.policy` no longer compacts.
    NotCompacted {
        /// The policy found.
        policy: String,
    },
}

impl TopicChange {
    /// Every `reason` label value, for series that exist from start-up.
    pub const REASONS: [&'static str; 3] = ["missing", "partitions", "cleanup_policy"];

    /// The `reason` metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            TopicChange::Missing => Self::REASONS[0],
            TopicChange::Partitions { .. } => Self::REASONS[1],
            TopicChange::NotCompacted { .. } => Self::REASONS[2],
        }
    }
}

impl fmt::Display for TopicChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopicChange::Missing => write!(
                f,
                "changed under posbridge: the topic is gone (deleted); re-create it compacted with its partitions (a produce would re-create it with the broker's defaults)"
            ),
            TopicChange::Partitions { from, to } => write!(
                f,
                "changed under posbridge: {to} partitions where posbridge keeps {from}; a key's next state would go to another partition than its last (compaction keeps both); go back to {from} partitions (re-create the topic and replay), or accept {to} with `posbridge ledger accept-partitions` and restart posbridge"
            ),
            TopicChange::NotCompacted { policy } => write!(
                f,
                "changed under posbridge: cleanup.policy is `{policy}`, so the broker drops entities' latest states by age; set it back with `kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config cleanup.policy=compact`"
            ),
        }
    }
}
