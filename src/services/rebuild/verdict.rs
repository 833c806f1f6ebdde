//! Whether the ledger caches the topics the cluster holds now, judged before
//! its start-up read: a ledger filled from other topics of the same names (a
//! cluster replaced at the same address, a topic deleted and made again
//! while posbridge was stopped) would answer their retries `duplicate` and
//! their older events `stale` while the new topics stay empty.
//!
//! Three signs, each enough: another cluster id; another topic id; an
//! offset the checkpoint holds past its partition's end now (or for a
//! partition gone), which is how a broker that gives no ids shows a topic
//! made again. The partition counts are not judged here: a topic grown
//! under the same id is the same topic, refused by the topic watch.

use std::collections::BTreeMap;

use crate::adapters::ledger::{Cached, Offsets, TopicSeen, TopicsSeen};
use crate::adapters::publish::Described;
use crate::services::replay::Extent;

/// What the cluster holds now: its ids, and each topic's partitions with
/// their offsets.
#[derive(Debug, Clone, Default)]
pub(super) struct Look {
    /// The cluster's and the topics' ids; empty where the broker gives none.
    pub(super) described: Described,
    /// Each topic's partitions now; none for a topic that does not exist.
    pub(super) extents: BTreeMap<String, Vec<Extent>>,
}

/// The verdict on a ledger's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The topics it was filled from: read on from its offsets.
    Same,
    /// Other topics: forgotten, and filled whole. Why, in words.
    Other(String),
}

/// Judges `cached` against what the cluster holds `now`.
pub(super) fn judge(cached: &Cached, now: &Look) -> Verdict {
    if let Some(seen) = &cached.topics {
        if let (Some(was), Some(is)) = (&seen.cluster, &now.described.cluster)
            && was != is
        {
            return Verdict::Other(format!(
                "the cluster's id is {is} where the ledger's checkpoint was of {was} (another cluster at the same address)"
            ));
        }
        for (topic, was) in &seen.topics {
            let is = now.described.topics.get(topic).and_then(|t| t.id.as_ref());
            if let (Some(was), Some(is)) = (&was.id, is)
                && was != is
            {
                return Verdict::Other(format!(
                    "topic {topic} has the id {is} where the ledger's checkpoint was of {was} (it was deleted and made again)"
                ));
            }
        }
    }
    let mut offsets: Vec<_> = cached.offsets.iter().collect();
    offsets.sort();
    for ((topic, partition), next) in offsets {
        let end = now
            .extents
            .get(topic)
            .and_then(|extents| extents.iter().find(|e| e.partition == *partition))
            .map(|extent| extent.high);
        match end {
            Some(end) if *next > end => {
                return Verdict::Other(format!(
                    "{topic}/{partition} ends at offset {end} where the ledger's checkpoint holds its records up to {next} (the topic was emptied, made again, or is another cluster's)"
                ));
            }
            None if *next > 0 => {
                return Verdict::Other(format!(
                    "{topic}/{partition} does not exist where the ledger's checkpoint holds its records up to {next} (the topic was deleted, or is another cluster's)"
                ));
            }
            _ => {}
        }
    }
    Verdict::Same
}

impl Look {
    /// What the next checkpoint records: this cluster's ids (where the
    /// broker gave none, what was recorded before) and the partitions
    /// posbridge keeps (`kept`, the topic watch's).
    pub(super) fn seen(
        &self,
        before: Option<&TopicsSeen>,
        kept: &BTreeMap<String, usize>,
    ) -> TopicsSeen {
        let topics = self
            .extents
            .keys()
            .map(|topic| {
                let id = self
                    .described
                    .topics
                    .get(topic)
                    .and_then(|t| t.id.clone())
                    .or_else(|| before?.topics.get(topic)?.id.clone());
                let partitions = kept.get(topic).copied();
                (topic.clone(), TopicSeen { id, partitions })
            })
            .collect();
        TopicsSeen {
            cluster: self
                .described
                .cluster
                .clone()
                .or_else(|| before?.cluster.clone()),
            topics,
        }
    }

    /// Each topic's partition count now.
    pub(super) fn partitions(&self) -> BTreeMap<String, usize> {
        self.extents
            .iter()
            .filter(|(_, extents)| !extents.is_empty())
            .map(|(topic, extents)| (topic.clone(), extents.len()))
            .collect()
    }

    /// Where each partition of `from` begins: its offset, clamped into
    /// what the partition holds, or its first offset.
    pub(super) fn start(&self, from: &Offsets, topic: &str, extent: &Extent) -> i64 {
        from.get(&(topic.to_owned(), extent.partition))
            .map_or(extent.low, |next| (*next).clamp(extent.low, extent.high))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::publish::TopicIdentity;

    fn extent(partition: i32, high: i64) -> Extent {
        Extent {
            partition,
            low: 0,
            high,
        }
    }

    fn look(cluster: &str, id: &str, ends: &[i64]) -> Look {
        Look {
            described: Described {
                cluster: Some(cluster.to_owned()),
                topics: [(
                    "pos.orders".to_owned(),
                    TopicIdentity {
                        id: Some(id.to_owned()),
                        partitions: ends.len(),
                    },
                )]
                .into(),
            },
            extents: [(
                "pos.orders".to_owned(),
                ends.iter()
                    .enumerate()
                    .map(|(p, end)| extent(i32::try_from(p).unwrap(), *end))
                    .collect(),
            )]
            .into(),
        }
    }

    fn cached(cluster: &str, id: &str, offsets: &[i64]) -> Cached {
        let seen = look(cluster, id, offsets).seen(None, &BTreeMap::new());
        Cached {
            offsets: offsets
                .iter()
                .enumerate()
                .map(|(p, next)| (("pos.orders".to_owned(), i32::try_from(p).unwrap()), *next))
                .collect(),
            topics: Some(seen),
        }
    }

    #[test]
    fn the_same_topics_further_on_are_the_same() {
        assert_eq!(
            judge(&cached("c1", "t1", &[5, 3]), &look("c1", "t1", &[9, 3])),
            Verdict::Same
        );
        assert_eq!(
            judge(
                &cached("c1", "t1", &[5, 3]),
                &look("c1", "t1", &[9, 3, 0, 0])
            ),
            Verdict::Same,
            "grown partitions are the topic watch's to refuse"
        );
    }

    #[test]
    fn another_cluster_another_topic_id_or_offsets_gone_back_are_other_topics() {
        let Verdict::Other(why) = judge(&cached("c1", "t1", &[5]), &look("c2", "t1", &[9])) else {
            panic!("another cluster taken for the same")
        };
        assert!(why.contains("cluster's id is c2"), "{why}");
        let Verdict::Other(why) = judge(&cached("c1", "t1", &[5]), &look("c1", "t2", &[9])) else {
            panic!("a topic made again taken for the same")
        };
        assert!(why.contains("deleted and made again"), "{why}");
        let Verdict::Other(why) = judge(&cached("c1", "t1", &[5]), &look("c1", "t1", &[0])) else {
            panic!("an emptied partition taken for the same")
        };
        assert!(why.contains("pos.orders/0 ends at offset 0"), "{why}");
    }

    #[test]
    fn without_ids_the_offsets_alone_tell() {
        let mut without_ids = cached("c1", "t1", &[5]);
        without_ids.topics = None;
        assert_eq!(judge(&without_ids, &look("c2", "t2", &[5])), Verdict::Same);
        let Verdict::Other(why) = judge(&without_ids, &Look::default()) else {
            panic!("a deleted topic taken for the same")
        };
        assert!(why.contains("does not exist"), "{why}");
        assert_eq!(
            judge(&Cached::default(), &Look::default()),
            Verdict::Same,
            "a new ledger"
        );
    }

    #[test]
    fn what_is_recorded_keeps_earlier_ids_where_the_broker_gave_none() {
        let mut now = look("c1", "t1", &[5]);
        let before = now.seen(None, &BTreeMap::new());
        now.described = Described::default();
        let kept = BTreeMap::from([("pos.orders".to_owned(), 2)]);
        let seen = now.seen(Some(&before), &kept);
        assert_eq!(seen.cluster.as_deref(), Some("c1"));
        assert_eq!(seen.topics["pos.orders"].id.as_deref(), Some("t1"));
        assert_eq!(seen.topics["pos.orders"].partitions, Some(2));
    }
}
