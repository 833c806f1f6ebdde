//! Records on a topic as a test sees them: written as an older build (or
//! another producer) wrote them, and read back with a plain consumer, to
//! compare with what posbridge should have published.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::unique;

/// Writes `record` (a key, a value and headers, as [`super::v1::product_record`]
/// makes them) to `topic` on `brokers`, partitioned as posbridge's
/// producer does: what an older build wrote.
pub async fn produce(
    brokers: &str,
    topic: &str,
    record: (String, Vec<u8>, rdkafka::message::OwnedHeaders),
) {
    produce_all(brokers, topic, [record]).await;
}

/// [`produce`] for many records, in order, through one producer.
pub async fn produce_all(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (String, Vec<u8>, rdkafka::message::OwnedHeaders)>,
) {
    let producer: rdkafka::producer::FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("partitioner", "murmur2_random")
        .create()
        .unwrap();
    for (key, value, headers) in records {
        producer
            .send(
                rdkafka::producer::FutureRecord::to(topic)
                    .key(&key)
                    .payload(&value)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
}

/// One record read back from a topic.
#[derive(Debug, Clone)]
pub struct Record {
    pub key: String,
    pub payload: Option<Vec<u8>>,
    pub headers: HashMap<String, String>,
    pub timestamp_ms: Option<i64>,
}

/// Every record of a single-partition topic up to its high watermark,
/// de-duplicated by offset (tansu may repeat records after compaction).
pub fn read_topic(brokers: &str, topic: &str) -> Vec<Record> {
    read_topic_with(brokers, topic, &[])
}

/// The same with more client properties (TLS settings).
pub fn read_topic_with(brokers: &str, topic: &str, properties: &[(&str, &str)]) -> Vec<Record> {
    let mut config = ClientConfig::new();
    for (key, value) in properties {
        config.set(*key, *value);
    }
    let consumer: BaseConsumer = config
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let high = high_watermark(&consumer, topic);
    let mut records: std::collections::BTreeMap<i64, Record> = Default::default();
    if high == 0 {
        return Vec::new();
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last_offset = -1;
    while last_offset < high - 1 && Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message.unwrap();
        last_offset = last_offset.max(message.offset());
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        records.insert(
            message.offset(),
            Record {
                key: String::from_utf8(message.key().unwrap().to_vec()).unwrap(),
                payload: message.payload().map(<[u8]>::to_vec),
                headers,
                timestamp_ms: message.timestamp().to_millis(),
            },
        );
    }
    assert!(
        last_offset >= high - 1,
        "read {topic} up to {last_offset}, high watermark {high}"
    );
    records.into_values().collect()
}

/// The partition's high watermark. A partition may be without a leader for
/// a moment (a broker just thawed from SIGSTOP is fenced until its next
/// heartbeat, a topic just created has not elected one yet): that is waited
/// out for up to 20 s; any other error fails the test.
fn high_watermark(consumer: &BaseConsumer, topic: &str) -> i64 {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)) {
            Ok((_, high)) => return high,
            Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::NotLeaderForPartition | RDKafkaErrorCode::LeaderNotAvailable,
                // A blocking caller (no runtime here): the leader is polled in place.
            )) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(250)),
            Err(error) => panic!("the high watermark of {topic}: {error}"),
        }
    }
}

/// The compacted view: the last record per key.
pub fn latest_per_key(records: &[Record]) -> HashMap<String, Record> {
    records.iter().map(|r| (r.key.clone(), r.clone())).collect()
}
