//! What start-up makes sure of in Kafka and the schema registry before a
//! delivery is taken: the brokers answer (or an earlier start's topics let
//! it start without them), the topics exist with the settings they need,
//! and the encoder has its schema ids. What it learns is kept (`known`)
//! for a start while Kafka or the registry does not answer.

use std::time::Duration;

use tracing::{info, warn};

use super::{BuildError, known};
use crate::adapters::encode::{EncodeError, Encoder};
use crate::adapters::publish::{Publisher, TopicSets};
use crate::config::Config;

/// How long start-up waits for a broker when an earlier start's topics let
/// it start without one: deliveries wait
/// for the app meanwhile (spooling
/// sources could already be taking them), and a broker that answers at all
/// answers a metadata request in milliseconds. Without that knowledge
/// start-up waits the whole produce deadline, as it cannot start otherwise.
const KAFKA_WAIT_WHEN_KNOWN: Duration = Duration::from_secs(1);

/// Brings the topics and the encoder up, as far as Kafka answers: whether
/// a broker answered, and the encoder.
///
/// # Errors
/// [`BuildError::Kafka`] when the topics cannot be made or checked (or no
/// broker answers and nothing known lets start-up go on),
/// [`BuildError::Registry`] when the encoder cannot get its ids.
pub(super) async fn ready(
    config: &Config,
    publisher: &Publisher,
    topics: &TopicSets,
) -> Result<(bool, Encoder), BuildError> {
    let kafka = &config.kafka;
    let known_path = known::path(config);
    let mut known = known_path.as_deref().map(known::load).unwrap_or_default();
    let wanted: std::collections::BTreeMap<String, bool> =
        topics.all().iter().flat_map(|set| set.all()).collect();
    // Wrong credentials or an untrusted certificate end start-up here,
    // named; a broker that does not answer is an outage to ride out.
    let can_start_on_known = known.has_topics(&kafka.brokers, wanted.keys());
    let wait_for_kafka = if can_start_on_known {
        kafka.delivery_timeout().min(KAFKA_WAIT_WHEN_KNOWN)
    } else {
        kafka.delivery_timeout()
    };
    let reachable = publisher.check_access(wait_for_kafka).await?;
    if reachable {
        if kafka.create_topics {
            publisher
                .ensure_topics(&wanted, kafka.partitions, kafka.replication_factor)
                .await?;
            info!(topics = ?wanted.keys().collect::<Vec<_>>(), "Topics ready.");
        }
        for set in topics.all() {
            publisher.check_topic_settings(&set).await?;
        }
        known.brokers.clone_from(&kafka.brokers);
        known.topics = wanted.keys().cloned().collect();
    } else if can_start_on_known {
        warn!(
            "No Kafka broker answers: starting on the topics an earlier start found; sources that spool accept webhooks, the others answer 503 until Kafka answers."
        );
    } else if kafka.create_topics {
        // Nothing known to start on: unless Kafka came back meanwhile,
        // this fails, naming it.
        publisher
            .ensure_topics(&wanted, kafka.partitions, kafka.replication_factor)
            .await?;
    } else {
        warn!("No Kafka broker answered at start-up; the entity topics' settings are not checked.");
    }
    if kafka.topic_check_secs > 0 {
        publisher.watch_topics(topics, Duration::from_secs(kafka.topic_check_secs));
    }
    let encoder = encoder(config, &topics.entity_topics(), &mut known).await?;
    info!(
        encoding = encoder.name(),
        "Encoder ready: records are Avro in the {} framing.",
        encoder.name()
    );
    if let Some(path) = &known_path {
        known::save(path, &known);
    }
    Ok((reachable, encoder))
}

/// The encoder: the registry's ids, or (the registry not answering) the
/// ids an earlier start took for this schema; `known` is updated with
/// fresh ones.
async fn encoder(
    config: &Config,
    topics: &[String],
    known: &mut known::Known,
) -> Result<Encoder, EncodeError> {
    let schema = format!("{:016x}", crate::adapters::encode::fingerprint());
    match Encoder::new(&config.schema_registry, topics).await {
        Ok(encoder) => {
            if let (Some(url), Some(ids)) = (&config.schema_registry.url, encoder.ids()) {
                known.registry = Some(url.clone());
                known.schema = Some(schema);
                known.ids = ids.iter().map(|(t, id)| (t.clone(), *id)).collect();
            }
            Ok(encoder)
        }
        Err(error) if error.is_unreachable() => {
            let url = config.schema_registry.url.as_deref().unwrap_or_default();
            let Some(ids) = known.ids_for(url, &schema, topics) else {
                return Err(error);
            };
            warn!(%error, "The schema registry does not answer: starting with the schema ids an earlier start took.");
            Encoder::with_known_ids(&config.schema_registry, url, ids)
        }
        Err(error) => Err(error),
    }
}
