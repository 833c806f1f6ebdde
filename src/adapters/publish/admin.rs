//! What start-up asks of the cluster before the first webhook: that the
//! connection is accepted (credentials, certificate), that the topics
//! exist, and that existing entity topics keep the compaction promise.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::Producer as _;
use rdkafka::util::Timeout;

use super::admin_client::Admin;
use super::describe::Described;
use super::{PublishError, Publisher, TopicChange, TopicSets, Topics, watch};

/// Room for a record batch's header beside its one record.
const BATCH_OVERHEAD_BYTES: usize = 1024;

/// How long an admin request may take at start-up.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(15);

/// How often start-up asks for metadata while waiting for the first answer.
const CONNECT_POLL: Duration = Duration::from_millis(250);

impl Publisher {
    /// Waits up to `limit` for a broker to answer a metadata request, and
    /// fails at once when the broker refuses the connection itself (SASL
    /// credentials, the TLS certificate): a setting to fix, said in those
    /// words, instead of a time-out. A broker that does not answer at all is
    /// an outage, not an error here: `Ok(false)`, and start-up goes on where
    /// it can (a spooling source accepts webhooks meanwhile).
    ///
    /// # Errors
    /// [`PublishError::Connection`] naming the refusal.
    pub async fn check_access(&self, limit: Duration) -> Result<bool, PublishError> {
        let deadline = Instant::now() + limit;
        loop {
            let answered = super::metadata_answers(self.producer().0, CONNECT_POLL).await;
            if let Some(refusal) = self.health.refusal() {
                return Err(PublishError::Connection(refusal));
            }
            // Said either way, so `posbridge_broker_up` exists from start-up
            // (an alert on it sees a posbridge that never reached Kafka).
            if answered {
                self.health.mark_up();
                return Ok(true);
            }
            if Instant::now() >= deadline {
                self.health.mark_down("no broker answered at start-up");
                return Ok(false);
            }
            tokio::time::sleep(CONNECT_POLL).await;
        }
    }

    fn admin(&self) -> Result<Admin, PublishError> {
        Admin::new(&self.admin_config)
    }

    /// The `max.message.bytes` a topic needs: the largest record plus a
    /// batch header (a batch of one record).
    fn topic_max_bytes(&self) -> usize {
        self.max_record_bytes + BATCH_OVERHEAD_BYTES
    }

    /// Creates the missing topics: `compact` for entity topics (each maps to
    /// `true`), `delete` for the dead-letter topic, with `replication`
    /// replicas (by default as many as the cluster has brokers, at most 3)
    /// and `min.insync.replicas` one less (at least 1): so `acks=all` waits
    /// for two brokers of three, and one broker may be lost without
    /// refusing writes. Existing topics are left alone.
    ///
    /// # Errors
    /// [`PublishError::CreateTopic`] naming the topic and the broker's answer,
    /// or [`PublishError::CreateTopics`] when the broker cannot be reached.
    pub async fn ensure_topics(
        &self,
        topics: &BTreeMap<String, bool>,
        partitions: i32,
        replication: Option<i32>,
    ) -> Result<(), PublishError> {
        let admin = self.admin()?;
        let replication = match replication {
            Some(replication) => replication,
            None => self.cluster().await?.brokers.clamp(1, 3),
        };
        let min_insync = (replication - 1).max(1).to_string();
        let topic_max_bytes = self.topic_max_bytes().to_string();
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(name, compact)| {
                NewTopic::new(name, partitions, TopicReplication::Fixed(replication))
                    .set(
                        "cleanup.policy",
                        if *compact { "compact" } else { "delete" },
                    )
                    .set("max.message.bytes", &topic_max_bytes)
                    .set("min.insync.replicas", &min_insync)
            })
            .collect();
        let options = AdminOptions::new()
            .request_timeout(Some(Timeout::After(ADMIN_TIMEOUT)))
            .operation_timeout(Some(Timeout::After(ADMIN_TIMEOUT)));
        let results = admin
            .create_topics(new_topics.iter(), &options)
            .await
            .map_err(PublishError::CreateTopics)?;
        for result in results {
            match result {
                // Created now: its partitions are known before the
                // metadata shows it (the topic watch compares with them).
                Ok(topic) => self
                    .baseline
                    .created(&topic, usize::try_from(partitions).unwrap_or_default()),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(PublishError::CreateTopic { topic, code }),
            }
        }
        Ok(())
    }

    /// The cluster as its metadata shows it: how many brokers.
    async fn cluster(&self) -> Result<Cluster, PublishError> {
        let producer = self.producer().0;
        tokio::task::spawn_blocking(move || {
            let metadata = producer
                .client()
                .fetch_metadata(None, Timeout::After(ADMIN_TIMEOUT))
                .map_err(PublishError::CreateTopics)?;
            Ok(Cluster {
                brokers: i32::try_from(metadata.brokers().len()).unwrap_or(i32::MAX),
            })
        })
        .await
        .unwrap_or_else(|_| Ok(Cluster::default()))
    }

    /// Checks the entity topics that exist against what consumers are
    /// promised, and refuses to start on a `cleanup.policy` without
    /// `compact`: the broker would delete entities' latest states by age
    /// instead of keeping one per key. A `max.message.bytes` below the
    /// largest record posbridge writes is said loudly (once, at start-up)
    /// but does not stop it: such a record is refused by the broker and
    /// dead-lettered, cut if need be, as for any broker limit. The
    /// dead-letter topic is checked the same way for its size: a letter
    /// above its limit is cut to fit. posbridge never alters a topic it did
    /// not create. What each entity topic was (its partitions) is kept for
    /// the topic watch ([`Publisher::watch_topics`]).
    ///
    /// A broker that does not describe topic configs or a topic that does
    /// not exist yet passes: nothing to check.
    ///
    /// # Errors
    /// [`PublishError::TopicSettings`] for the first topic that is not compacted.
    pub async fn check_topic_settings(&self, topics: &Topics) -> Result<(), PublishError> {
        let dead_letter = topics.dead_letter().to_string();
        let mut names: Vec<String> = topics.entities().map(str::to_owned).collect();
        names.push(dead_letter.clone());
        let mut observed = match watch::observe(&self.admin_config, self.producer().0, &names).await
        {
            Ok(observed) => observed,
            Err(error) => {
                tracing::warn!(%error, "Could not read the topics' settings; not checked.");
                return Ok(());
            }
        };
        let needed = self.topic_max_bytes();
        let brokers = self.cluster().await.map(|c| c.brokers).unwrap_or_default();
        if let Some(seen) = observed.remove(&dead_letter)
            && let Some(problem) = dead_letter_size_problem(seen.max_message_bytes, needed)
        {
            tracing::warn!(topic = dead_letter, "{problem}");
        }
        for (topic, seen) in &observed {
            if let Some(problem) = policy_problem(seen.cleanup_policy.as_deref()) {
                return Err(PublishError::TopicSettings {
                    topic: topic.clone(),
                    problem,
                });
            }
            if let Some(problem) = size_problem(seen.max_message_bytes, needed) {
                tracing::warn!(topic, "{problem}");
            }
            if let Some(problem) = durability_problem(brokers, seen.replicas, seen.min_insync) {
                tracing::warn!(topic, "{problem}");
            }
        }
        // A topic changed while posbridge was stopped (the ledger kept its
        // partitions) is refused from the start, as the watch refuses one
        // changed while running. One the metadata does not name is not
        // judged: start-up has just made the missing ones, and a broker may
        // answer for a moment as if a topic it just created did not exist
        // (seen under load: a fresh start then refused its first deliveries
        // as if the topic had been deleted, until the watch looked again).
        self.baseline.learn_and_judge(
            observed
                .iter()
                .filter(|(_, seen)| seen.partitions.is_some()),
            &self.health,
        );
        Ok(())
    }

    /// Keeps the partitions the ledger's checkpoint kept for each topic,
    /// before start-up looks at the topics: a topic whose count differs is
    /// then refused as if it had changed while running.
    pub fn keep_partitions(&self, kept: &BTreeMap<String, usize>) {
        self.baseline.keep(kept);
    }

    /// The partitions posbridge keeps for each entity topic: what the
    /// ledger's checkpoint records.
    pub fn kept_partitions(&self) -> BTreeMap<String, usize> {
        self.baseline.all()
    }

    /// Forgets the partitions kept for `topics` and keeps what `now` says:
    /// the ledger was found caching other topics (a new cluster, a topic
    /// made again), whose counts are not changes. A refusal of those topics
    /// for their partitions ends.
    pub fn keep_partitions_anew(&self, now: &BTreeMap<String, usize>) {
        self.baseline.keep_anew(now, &self.health);
    }

    /// The cluster's id and each of `topics`' id and partitions.
    ///
    /// # Errors
    /// [`PublishError::Describe`] when the cluster does not answer.
    pub async fn describe(&self, topics: &[String]) -> Result<Described, PublishError> {
        super::describe::describe(&self.admin_config, topics).await
    }

    /// Runs the start-up check of the entity topics again every `every`
    /// while posbridge runs (`kafka.topic_check_secs`): a topic whose
    /// partitions changed, whose cleanup policy no longer compacts, or that
    /// is gone has its records refused until it is as it was (see
    /// `watch.rs`). Ends with the last handle of this publisher.
    pub fn watch_topics(&self, sets: &TopicSets, every: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for topics in sets.all() {
            zero_change_gauges(&topics);
        }
        let watch = watch::Watch {
            current: std::sync::Arc::downgrade(&self.current),
            admin_config: self.admin_config.clone(),
            health: self.health.clone(),
            baseline: self.baseline.clone(),
        };
        runtime.spawn(watch.run(sets.clone(), every));
    }

    /// A topic's `max.message.bytes` as the broker says it now, for a dead
    /// letter refused as too large: what its cut copy must fit.
    pub async fn topic_limit(&self, topic: &str) -> Option<usize> {
        let topics = [topic.to_owned()];
        watch::observe(&self.admin_config, self.producer().0, &topics)
            .await
            .ok()?
            .remove(topic)?
            .max_message_bytes
    }
}

/// The topic watch's gauges of `topics`' entity topics, at 0 from the
/// moment they are in use: the alert reads them.
pub fn zero_change_gauges(topics: &Topics) {
    for topic in topics.entities() {
        for reason in TopicChange::REASONS {
            metrics::gauge!(
                crate::observe::telemetry::TOPIC_CHANGED,
                crate::observe::telemetry::TOPIC => topic.to_owned(),
                crate::observe::telemetry::REASON => reason
            )
            .set(0.0);
        }
    }
}

/// What the metadata says of the cluster.
#[derive(Debug, Default)]
struct Cluster {
    /// Brokers in the cluster.
    brokers: i32,
}

/// Why an entity topic's records may be acknowledged by fewer brokers than
/// the cluster could give, on a cluster of several: one replica (a lost
/// broker loses the topic), or `min.insync.replicas` 1 (`acks=all` may then
/// mean one broker that has not synced).
fn durability_problem(
    brokers: i32,
    replicas: Option<usize>,
    min_insync: Option<usize>,
) -> Option<String> {
    if brokers <= 1 {
        return None;
    }
    match (replicas, min_insync) {
        (Some(1), _) => Some(format!(
            "The topic has one replica on a cluster of {brokers} brokers: the broker that holds it is a single point of loss; recreate it with replication factor 3 (kafka.replication_factor)"
        )),
        (Some(replicas), Some(1)) => Some(format!(
            "The topic has {replicas} replicas but min.insync.replicas 1: an acknowledged record may be on one broker only; set it to {} with `kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config min.insync.replicas={}`",
            (replicas - 1).max(1),
            (replicas - 1).max(1)
        )),
        _ => None,
    }
}

/// What is wrong with an entity topic's `cleanup.policy`, with the fix.
fn policy_problem(cleanup_policy: Option<&str>) -> Option<String> {
    let policy = cleanup_policy?;
    (!watch::compacts(policy)).then(|| {
        format!(
            "cleanup.policy is `{policy}`: an entity topic must be compacted (`compact`, or `compact,delete`), or the broker drops entities' latest states by age; fix it with `kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config cleanup.policy=compact`"
        )
    })
}

/// What is wrong with an entity topic's `max.message.bytes`, with the fix.
fn size_problem(max_message_bytes: Option<usize>, needed: usize) -> Option<String> {
    let max = max_message_bytes?;
    (max < needed).then(|| {
        format!(
            "The topic's max.message.bytes is {max}, below the {needed} bytes posbridge's largest record may need (server.body_limit_bytes sets it): the broker refuses such records and posbridge dead-letters them, cut; raise it with `kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config max.message.bytes={needed}`"
        )
    })
}

/// What the dead-letter topic's `max.message.bytes` means for dead
/// letters, when it is below the largest body posbridge takes.
fn dead_letter_size_problem(max_message_bytes: Option<usize>, needed: usize) -> Option<String> {
    let max = max_message_bytes?;
    (max < needed).then(|| {
        format!(
            "The dead-letter topic's max.message.bytes is {max}, below the {needed} bytes a dead letter may need (server.body_limit_bytes sets it): a larger letter is written cut to fit (the body's head, with its whole length, SHA-256 and why it was cut in headers), so its whole body is kept only by the provider; raise it with `kafka-configs --alter --entity-type topics --entity-name TOPIC --add-config max.message.bytes={needed}`"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{dead_letter_size_problem, durability_problem, policy_problem, size_problem};

    #[test]
    fn a_compacted_topic_with_room_for_every_record_passes() {
        assert_eq!(policy_problem(Some("compact")), None);
        assert_eq!(policy_problem(Some("compact, delete")), None);
        assert_eq!(size_problem(Some(2_000_000), 1_000_000), None);
        assert_eq!(dead_letter_size_problem(Some(2_000_000), 1_000_000), None);
        assert_eq!(policy_problem(None), None, "nothing described");
        assert_eq!(size_problem(None, 1_000_000), None, "nothing described");
    }

    #[test]
    fn one_replica_or_one_in_sync_replica_is_named_only_on_a_cluster() {
        assert_eq!(durability_problem(1, Some(1), Some(1)), None, "one broker");
        assert_eq!(durability_problem(3, Some(3), Some(2)), None);
        let single = durability_problem(3, Some(1), Some(1)).unwrap();
        assert!(single.contains("one replica on a cluster of 3"), "{single}");
        let isr = durability_problem(3, Some(3), Some(1)).unwrap();
        assert!(isr.contains("min.insync.replicas=2"), "{isr}");
    }

    #[test]
    fn a_deleting_topic_or_one_too_small_is_named_with_its_fix() {
        let delete = policy_problem(Some("delete")).unwrap();
        assert!(delete.contains("cleanup.policy is `delete`"), "{delete}");
        assert!(delete.contains("cleanup.policy=compact"), "{delete}");
        let small = size_problem(Some(1_048_588), 2_000_000).unwrap();
        assert!(small.contains("max.message.bytes is 1048588"), "{small}");
        assert!(small.contains("max.message.bytes=2000000"), "{small}");
        let letters = dead_letter_size_problem(Some(4096), 2_000_000).unwrap();
        assert!(
            letters.contains("dead-letter topic's max.message.bytes is 4096"),
            "{letters}"
        );
        assert!(letters.contains("cut to fit"), "{letters}");
    }
}
