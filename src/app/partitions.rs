//! `posbridge ledger accept-partitions`: the operator's way to keep a
//! topic's new partition count.
//!
//! The ledger's checkpoint keeps each entity topic's partitions, and a
//! topic whose count differs is refused (while running and from the next
//! start), because a key's next states would go to another partition than
//! its last and compaction keeps both. An operator who grew a topic on
//! purpose, and accepts that keys written before keep a stale state in
//! their old partition until overwritten there, says so with this command;
//! the next start (or, on Redis, every replica's next start) keeps the new
//! count.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::adapters::ledger::{self, Fill, TopicSeen};
use crate::adapters::publish::{Described, Publisher};
use crate::config::Config;

use super::BuildError;

/// What the command changed: each topic with the count kept before (none
/// when none was) and the count kept now.
pub type Accepted = BTreeMap<String, (Option<usize>, usize)>;

/// Keeps the partitions the cluster has now for `only` (every entity topic,
/// the sources' own too, when empty) in the ledger's checkpoint.
///
/// # Errors
/// [`BuildError`] when the ledger cannot be opened (the embedded one is
/// held by a running posbridge) or written, or the cluster not described.
pub async fn accept_partitions(config: &Config, only: &[String]) -> Result<Accepted, BuildError> {
    let opened = ledger::open(&config.ledger, Duration::from_secs(30)).await?;
    let fill = opened.ledger.fill();
    let cached = fill.cached().await?.unwrap_or_default();
    let entity_topics: Vec<String> = super::topics::configured(config, Some(&cached))
        .iter()
        .flat_map(|set| set.entities().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    let wanted: Vec<String> = if only.is_empty() {
        entity_topics.clone()
    } else {
        only.to_vec()
    };
    let publisher = Publisher::new(&config.kafka, config.max_record_bytes())?;
    let described = publisher.describe(&entity_topics).await?;
    keep_counts(&fill, &described, &wanted).await
}

/// Keeps in the ledger's checkpoint (through `fill`) the partitions
/// `described` gives each of `wanted`, its offsets as they were: what the
/// command does once it has described the cluster (the simulation's
/// operator does it over its fake broker).
///
/// # Errors
/// [`BuildError`] when the cluster does not know a topic of `wanted`, or
/// the ledger cannot be read or written.
pub async fn keep_counts(
    fill: &Fill<'_>,
    described: &Described,
    wanted: &[String],
) -> Result<Accepted, BuildError> {
    let cached = fill.cached().await?.unwrap_or_default();
    let mut seen = cached.topics.unwrap_or_default();
    let mut accepted = Accepted::new();
    for topic in wanted {
        let Some(now) = described.topics.get(topic) else {
            return Err(BuildError::Kafka(
                crate::adapters::publish::PublishError::Describe(format!(
                    "the cluster does not know topic {topic}"
                )),
            ));
        };
        let kept: &mut TopicSeen = seen.topics.entry(topic.clone()).or_default();
        accepted.insert(topic.clone(), (kept.partitions, now.partitions));
        kept.partitions = Some(now.partitions);
        kept.id = kept.id.take().or_else(|| now.id.clone());
    }
    fill.restore(&cached.offsets, &seen);
    fill.persist().await?;
    Ok(accepted)
}
