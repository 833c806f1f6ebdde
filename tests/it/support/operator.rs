//! What an operator does to a topic under a running posbridge, through
//! Kafka's admin API (as `kafka-configs` and `kafka-topics` would): change a
//! setting, raise the partitions, delete it.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, NewPartitions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

use super::wait::wait_until;

fn admin(brokers: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap()
}

/// Sets `settings` on `topic` and waits until the broker describes them.
/// (AlterConfigs replaces the topic's whole set: name every setting the
/// topic should keep.)
pub async fn set_topic_config(brokers: &str, topic: &str, settings: &[(&str, &str)]) {
    let admin = admin(brokers);
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(topic));
    for (key, value) in settings {
        alter = alter.set(key, value);
    }
    let results = admin
        .alter_configs([&alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    wait_until(
        Duration::from_secs(20),
        "the broker to describe the new settings",
        || async {
            let described = admin
                .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
                .await
                .unwrap();
            let Some(Ok(resource)) = described.into_iter().next() else {
                return false;
            };
            settings.iter().all(|(key, value)| {
                resource.get(key).and_then(|entry| entry.value.as_deref()) == Some(*value)
            })
        },
    )
    .await;
}

/// Raises `topic` to `partitions` partitions.
pub async fn raise_partitions(brokers: &str, topic: &str, partitions: usize) {
    let results = admin(brokers)
        .create_partitions(
            [&NewPartitions::new(topic, partitions)],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// Deletes `topic`.
pub async fn delete_topic(brokers: &str, topic: &str) {
    let results = admin(brokers)
        .delete_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}
