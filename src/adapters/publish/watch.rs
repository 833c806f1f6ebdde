//! The topic watch: the start-up check of the entity topics, again on a
//! timer while posbridge runs, so that a topic changed under it is noticed
//! and refused instead of written on.
//!
//! Compaction keeps one state per key *per partition*: partitions raised
//! under a running posbridge send a key's next states to another partition
//! than its earlier ones, and consumers then read two latest states of one
//! entity. A topic deleted while running is re-created by the next produce
//! with the broker's defaults (`cleanup.policy=delete`, one partition),
//! which drops latest states by age. Neither makes a send fail, so only a
//! look at the topics shows it: each entity topic's partition count is
//! compared with what start-up (or the watch's first look) found, and its
//! `cleanup.policy` must still hold `compact`. A changed topic's records are
//! refused ([`super::PublishError::TopicChanged`], retryable: 503, or the
//! spool) until it is as it was; the other topics publish.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminOptions, OwnedResourceSpecifier, ResourceSpecifier};
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::util::Timeout;

use super::admin_client::Admin;
use super::change::TopicChange;
use super::health::BrokerHealth;
use super::{Current, KafkaProducer, PublishError};

/// How long one look at the topics may take.
const LOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// What a look at one topic found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Its partitions; `None` when the cluster does not know the topic (or,
    /// with `answered_with_error`, did not say).
    pub partitions: Option<usize>,
    /// The metadata named the topic with an error other than "unknown
    /// topic" (a leader election, a transient refusal): nothing is known of
    /// it this time, which is not the same as its being gone.
    pub answered_with_error: bool,
    /// Replicas of its first partition.
    pub replicas: Option<usize>,
    /// `cleanup.policy`, when the broker describes topic configs.
    pub cleanup_policy: Option<String>,
    /// `max.message.bytes`, when described.
    pub max_message_bytes: Option<usize>,
    /// `min.insync.replicas`, when described.
    pub min_insync: Option<usize>,
}

impl TopicChange {
    /// How `now` differs from `started` (the partitions found at start-up),
    /// if it does. A topic never seen is not missing: it did not change
    /// under posbridge (and a produce that creates it is looked at next).
    pub fn between(started: Option<usize>, now: &Observed) -> Option<TopicChange> {
        if now.answered_with_error {
            return None;
        }
        let Some(partitions) = now.partitions else {
            return started.map(|_| TopicChange::Missing);
        };
        if let Some(from) = started
            && from != partitions
        {
            return Some(TopicChange::Partitions {
                from,
                to: partitions,
            });
        }
        match &now.cleanup_policy {
            Some(policy) if !compacts(policy) => Some(TopicChange::NotCompacted {
                policy: policy.clone(),
            }),
            _ => None,
        }
    }
}

/// Whether a `cleanup.policy` value compacts.
pub fn compacts(policy: &str) -> bool {
    policy.split(',').any(|p| p.trim() == "compact")
}

/// Looks at `topics`: their partitions and replicas from the metadata,
/// their settings from DescribeConfigs (left empty where the broker does
/// not describe them).
///
/// # Errors
/// [`PublishError::CreateTopics`] when no metadata came.
pub(super) async fn observe(
    admin_config: &ClientConfig,
    producer: KafkaProducer,
    topics: &[String],
) -> Result<BTreeMap<String, Observed>, PublishError> {
    let metadata = tokio::task::spawn_blocking(move || {
        producer
            .client()
            .fetch_metadata(None, Timeout::After(LOOK_TIMEOUT))
            .map(|metadata| {
                metadata
                    .topics()
                    .iter()
                    .filter(|topic| {
                        topic.error()
                            != Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                    })
                    .map(|topic| {
                        let replicas = topic.partitions().first().map(|p| p.replicas().len());
                        let seen = (topic.error().is_none()).then(|| topic.partitions().len());
                        (topic.name().to_owned(), (seen, replicas))
                    })
                    .collect::<BTreeMap<_, _>>()
            })
    })
    .await
    .unwrap_or_else(|_| Ok(BTreeMap::new()))
    .map_err(PublishError::CreateTopics)?;
    let mut observed: BTreeMap<String, Observed> = topics
        .iter()
        .map(|topic| {
            let (partitions, replicas, answered_with_error) = match metadata.get(topic) {
                Some((Some(partitions), replicas)) => (Some(*partitions), *replicas, false),
                Some((None, _)) => (None, None, true),
                None => (None, None, false),
            };
            (
                topic.clone(),
                Observed {
                    partitions,
                    replicas,
                    answered_with_error,
                    ..Observed::default()
                },
            )
        })
        .collect();
    let admin = Admin::new(admin_config)?;
    let present: Vec<ResourceSpecifier<'_>> = observed
        .iter()
        .filter(|(_, o)| o.partitions.is_some())
        .map(|(topic, _)| ResourceSpecifier::Topic(topic))
        .collect();
    let options = AdminOptions::new().request_timeout(Some(Timeout::After(LOOK_TIMEOUT)));
    let described = match admin.describe_configs(present.iter(), &options).await {
        Ok(described) => described,
        Err(error) => {
            tracing::debug!(%error, "The broker does not describe topic configs.");
            Vec::new()
        }
    };
    for resource in described.into_iter().flatten() {
        let OwnedResourceSpecifier::Topic(topic) = &resource.specifier else {
            continue;
        };
        let Some(seen) = observed.get_mut(topic) else {
            continue;
        };
        let value = |name: &str| {
            resource
                .entries
                .iter()
                .find(|entry| entry.name == name)
                .and_then(|entry| entry.value.clone())
        };
        seen.cleanup_policy = value("cleanup.policy");
        seen.max_message_bytes = value("max.message.bytes").and_then(|v| v.parse().ok());
        seen.min_insync = value("min.insync.replicas").and_then(|v| v.parse().ok());
    }
    Ok(observed)
}

/// The partitions posbridge keeps for each entity topic: what the ledger's
/// checkpoint kept (so a topic grown while posbridge was stopped is seen),
/// else what posbridge first found. What the watch compares with. Shared by
/// every clone of a `Publisher`.
#[derive(Debug, Default)]
pub(super) struct Baseline(Mutex<BTreeMap<String, usize>>);

impl Baseline {
    /// Keeps `kept` (the ledger's) before anything is learnt.
    pub(super) fn keep(&self, kept: &BTreeMap<String, usize>) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for (topic, partitions) in kept {
            known.insert(topic.clone(), *partitions);
        }
    }

    /// Every topic's count.
    pub(super) fn all(&self) -> BTreeMap<String, usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Learns the counts of `observed` and tells `health` how each of its
    /// topics changed from the count kept (`None`: as kept): what start-up
    /// does with the topics the metadata names, and the watch with every
    /// topic it looks at.
    pub(super) fn learn_and_judge<'a>(
        &self,
        observed: impl IntoIterator<Item = (&'a String, &'a Observed)>,
        health: &BrokerHealth,
    ) {
        let observed: Vec<_> = observed.into_iter().collect();
        {
            let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            for (topic, seen) in &observed {
                if let Some(partitions) = seen.partitions {
                    known.entry((*topic).clone()).or_insert(partitions);
                }
            }
        }
        for (topic, seen) in observed {
            health.topic_shape(topic, TopicChange::between(self.get(topic), seen));
        }
    }

    /// Keeps `now`'s counts in place of those kept (the ledger was found
    /// caching other topics, whose counts are not changes), and ends a
    /// refusal of those topics for their partitions.
    pub(super) fn keep_anew(&self, now: &BTreeMap<String, usize>, health: &BrokerHealth) {
        self.keep(now);
        for topic in now.keys() {
            if let Some(TopicChange::Partitions { .. }) = health.changed(topic) {
                health.topic_shape(topic, None);
            }
        }
    }

    /// Keeps the partitions of a topic posbridge just created.
    pub(super) fn created(&self, topic: &str, partitions: usize) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.to_owned(), partitions);
    }

    pub(super) fn get(&self, topic: &str) -> Option<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(topic)
            .copied()
    }
}

/// What the watch's task holds: the producer weakly (the watch ends with
/// the last `Publisher` handle), the rest shared.
pub(super) struct Watch {
    /// The producer in use, for its metadata.
    pub current: Weak<RwLock<Current>>,
    /// For DescribeConfigs.
    pub admin_config: ClientConfig,
    /// Where a change is told, and what `send` asks.
    pub health: Arc<BrokerHealth>,
    /// What each topic had at start-up.
    pub baseline: Arc<Baseline>,
}

impl Watch {
    /// Looks at `topics` every `every` while a broker answers, until the
    /// last `Publisher` handle is gone.
    pub(super) async fn run(self, sets: super::TopicSets, every: Duration) {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once: start-up has just looked.
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(producer) = super::producer_of(&self.current) else {
                return;
            };
            if !self.health.is_up() {
                continue;
            }
            // The sets in use now: a source's own appear as it does.
            let topics = sets.entity_topics();
            match observe(&self.admin_config, producer, &topics).await {
                Ok(observed) => {
                    // A start during an outage found nothing: the first look counts.
                    self.baseline.learn_and_judge(&observed, &self.health);
                }
                Err(error) => tracing::debug!(%error, "The topic watch got no metadata."),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_the_metadata_names_with_an_error_is_not_judged_missing() {
        let unsure = Observed {
            answered_with_error: true,
            ..Observed::default()
        };
        assert_eq!(TopicChange::between(Some(6), &unsure), None);
        assert_eq!(
            TopicChange::between(Some(6), &Observed::default()),
            Some(TopicChange::Missing),
            "unknown to the cluster: gone"
        );
    }

    fn seen(partitions: Option<usize>, policy: Option<&str>) -> Observed {
        Observed {
            partitions,
            cleanup_policy: policy.map(str::to_owned),
            ..Observed::default()
        }
    }

    #[test]
    fn a_topic_as_start_up_found_it_is_unchanged() {
        assert_eq!(
            TopicChange::between(Some(3), &seen(Some(3), Some("compact"))),
            None
        );
        assert_eq!(
            TopicChange::between(Some(3), &seen(Some(3), Some("compact,delete"))),
            None
        );
        assert_eq!(
            TopicChange::between(Some(3), &seen(Some(3), None)),
            None,
            "a broker that does not describe configs"
        );
        assert_eq!(
            TopicChange::between(None, &seen(Some(12), Some("compact"))),
            None,
            "nothing known yet: the first look is the baseline"
        );
        assert_eq!(
            TopicChange::between(None, &seen(None, None)),
            None,
            "never seen: not gone"
        );
    }

    #[test]
    fn raised_partitions_a_deleting_policy_and_a_deleted_topic_are_changes() {
        let raised = TopicChange::between(Some(3), &seen(Some(12), Some("compact"))).unwrap();
        assert_eq!(raised, TopicChange::Partitions { from: 3, to: 12 });
        assert_eq!(raised.reason(), "partitions");
        let text = raised.to_string();
        assert!(
            text.contains("12 partitions where posbridge keeps 3"),
            "{text}"
        );
        let recreated = TopicChange::between(Some(1), &seen(Some(1), Some("delete"))).unwrap();
        assert_eq!(recreated.reason(), "cleanup_policy");
        assert!(recreated.to_string().contains("`delete`"), "{recreated}");
        let gone = TopicChange::between(Some(3), &seen(None, None)).unwrap();
        assert_eq!(gone, TopicChange::Missing);
        assert_eq!(gone.reason(), "missing");
    }
}
