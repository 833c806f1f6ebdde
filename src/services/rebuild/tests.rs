//! The fill's batches on the embedded ledger: a partition longer than
//! [`FOLD_AT_MOST`] records is written in several, and a state older than
//! one an earlier batch wrote does not roll it back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::{FOLD_AT_MOST, Rebuild, TopicRead, TopicSource};
use crate::adapters::ledger::{EntitySlot, LedgerError, Opened, WallClock, open_driven};
use crate::adapters::publish::{Described, TopicSets, Topics};
use crate::adapters::store_file::Disk;
use crate::config::KafkaConfig;
use crate::domain::event::{EntityType, Version};
use crate::services::pipeline::{HEADER_STATE_HASH, HEADER_VERSION};
use crate::services::replay::{Extent, Letter, ReadError};

/// Topics held in memory, one partition each; counts the readers made
/// (a fill makes one per topic).
#[derive(Default)]
struct InMemory {
    topics: BTreeMap<String, Vec<Letter>>,
    readers: Arc<AtomicUsize>,
}

#[async_trait]
impl TopicSource for InMemory {
    async fn describe(&self, _topics: &[String]) -> Described {
        Described::default()
    }

    fn reader(&self, topic: &str) -> Result<Box<dyn TopicRead>, ReadError> {
        self.readers.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Partition {
            records: self.topics.get(topic).cloned().unwrap_or_default(),
            next: 0,
            to: 0,
        }))
    }

    fn kept_partitions(&self) -> BTreeMap<String, usize> {
        BTreeMap::new()
    }

    fn keep_partitions_anew(&self, _now: &BTreeMap<String, usize>) {}
}

/// One topic's only partition, read from `next` up to `to`.
struct Partition {
    records: Vec<Letter>,
    next: usize,
    to: usize,
}

#[async_trait]
impl TopicRead for Partition {
    async fn extents(&self) -> Result<Vec<Extent>, ReadError> {
        Ok(vec![Extent {
            partition: 0,
            low: 0,
            high: i64::try_from(self.records.len()).unwrap(),
        }])
    }

    fn assign(&mut self, _partition: i32, from: i64, to: i64) -> Result<(), ReadError> {
        (self.next, self.to) = (usize::try_from(from).unwrap(), usize::try_from(to).unwrap());
        Ok(())
    }

    async fn next(&mut self) -> Result<Option<Letter>, ReadError> {
        if self.next >= self.to {
            return Ok(None);
        }
        self.next += 1;
        Ok(self.records.get(self.next - 1).cloned())
    }
}

/// An order's record at `offset` with its state at `at_micros`.
fn order(offset: i64, key: &str, at_micros: i64) -> Letter {
    Letter {
        partition: 0,
        offset,
        timestamp_ms: None,
        key: Some(key.to_owned()),
        body: None,
        headers: [
            (HEADER_VERSION.to_owned(), format!("{at_micros}:0")),
            (HEADER_STATE_HASH.to_owned(), hex::encode([1u8; 16])),
        ]
        .into_iter()
        .collect(),
    }
}

/// An embedded ledger in `dir`, checkpointed when asked.
fn ledger(dir: &std::path::Path) -> Opened {
    open_driven(
        (&dir.join("ledger.redb"), &Disk::default()),
        (Duration::from_secs(3600), WallClock::system()),
        Duration::from_secs(10),
    )
    .unwrap()
}

/// A rebuild of `opened` from `source`.
fn rebuild(source: InMemory, opened: &Opened) -> Rebuild {
    Rebuild::new(
        Arc::new(source),
        &TopicSets::new(&KafkaConfig::default()),
        opened.ledger.clone(),
        opened.gate.clone(),
        Duration::from_secs(3600),
    )
}

#[tokio::test]
async fn a_partition_is_written_in_batches_and_an_older_state_in_a_later_one_does_not_roll_back() {
    let dir = tempfile::tempdir().unwrap();
    let opened = ledger(dir.path());
    let topics = Topics::new(&KafkaConfig::default());
    let fillers = usize::try_from(FOLD_AT_MOST).unwrap() * 2;
    let mut records = vec![order(0, "mekari:O-1", 20)];
    records.extend((1..=fillers).map(|n| {
        let offset = i64::try_from(n).unwrap();
        order(offset, &format!("mekari:F-{n}"), offset)
    }));
    // Never written by posbridge (a newer state of a key only ever comes at
    // a later offset), and in a later batch than the newer state.
    records.push(order(i64::try_from(fillers).unwrap() + 1, "mekari:O-1", 10));
    let source = InMemory {
        topics: [(topics.entity(EntityType::Order).to_string(), records)]
            .into_iter()
            .collect(),
        ..InMemory::default()
    };
    rebuild(source, &opened).once().await.unwrap();

    let state = |key: &str| {
        let ledger = opened.ledger.clone();
        let slot = EntitySlot::of_record_key(EntityType::Order, key);
        async move {
            ledger
                .fill()
                .entity(&slot)
                .await
                .unwrap()
                .map(|s| s.state.version)
        }
    };
    assert_eq!(
        state("mekari:O-1").await,
        Some(Version {
            at_micros: 20,
            rank: 0
        })
    );
    for n in 1..=fillers {
        assert!(state(&format!("mekari:F-{n}")).await.is_some(), "F-{n}");
    }
}

/// Several deliveries find one lost ledger before its fill begins (the
/// drainer's and a check's): one fill reads it, not one per finder.
#[tokio::test(start_paused = true)]
async fn a_loss_found_by_several_before_the_fill_is_filled_once() {
    let dir = tempfile::tempdir().unwrap();
    let opened = ledger(dir.path());
    let readers = Arc::new(AtomicUsize::new(0));
    let counting = || InMemory {
        readers: readers.clone(),
        ..InMemory::default()
    };
    rebuild(counting(), &opened).once().await.unwrap();
    let topics_read = readers.swap(0, Ordering::Relaxed);
    assert!(topics_read > 0);

    opened.gate.found_lost(&LedgerError::Lost);
    opened.gate.found_lost(&LedgerError::Lost);
    let stop = CancellationToken::new();
    let running = tokio::spawn(rebuild(counting(), &opened).run(stop.clone()));
    while !opened.gate.is_open() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(opened.gate.is_open(), "the gate closed again");
    assert_eq!(
        readers.load(Ordering::Relaxed),
        topics_read,
        "the topics were read by more than one fill"
    );
    stop.cancel();
    running.await.unwrap();
}
