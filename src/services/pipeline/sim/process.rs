//! One life of a posbridge process, from its start to its crash: the real
//! core's start-up over the files a crash left (the embedded ledger, its
//! checkpoints taken on the simulation's clock, and the spool, each set
//! aside when damaged), the rebuild from the broker's log behind the closed
//! gate, the pipeline, and the spool's drainer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;
use tokio_util::sync::CancellationToken;

use super::source::FakeSource;
use crate::adapters::ledger::{self, Cached, EntitySlot, Ledger, Offsets, WallClock};
use crate::adapters::publish::{FakeBroker, TopicSets};
use crate::adapters::spool::Spool;
use crate::adapters::store_file::Disk;
use crate::app::partitions::keep_counts;
use crate::config::{KafkaConfig, SpoolConfig};
use crate::domain::event::EntityType;
use crate::services::drain::Drainer;
use crate::services::pipeline::{
    HEADER_STATE_HASH, HEADER_VERSION, Pipeline, Timing, state_from_headers,
};
use crate::services::rebuild::Rebuild;
use crate::services::rebuild::TopicSource;

/// How long a done delivery id is remembered (the default).
const DEDUP_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a delivery's lease holds if its holder never ends it.
const LEASE: Duration = Duration::from_secs(30);

/// How long a delivery may wait for another attempt of its own.
const INFLIGHT_WAIT: Duration = Duration::from_millis(200);

/// How long a webhook may take to its answer: short, so the broker's slow
/// answers (up to 3 s while it is faulty) cut many, and long enough for its
/// usual ones (up to 400 ms) and a pause before the commit (up to 300 ms).
const ANSWER_BUDGET: Duration = Duration::from_millis(1_000);

use super::disk_plan::{LEDGER_FILE, SPOOL_FILE};

/// A running posbridge process.
pub(super) struct Process {
    pub(super) pipeline: Pipeline,
    pub(super) spool: Spool,
    /// The ledger without its gate: a clean stop makes it durable.
    pub(super) ledger: Arc<Ledger>,
    /// Its background tasks (rebuild, checkpoints, drainer) stop with it.
    stop: CancellationToken,
}

impl Process {
    /// Starts posbridge over the files in `dir` on `disk`: the ledger
    /// closed until the rebuild filled it from `broker`'s log; the spool
    /// holding `spool_room` deliveries at most, if that is said.
    /// Its ledger's memory is made durable every `checkpoints.0` (until
    /// `checkpoints.1`, if said); with none (a life no crash ends, where
    /// what is durable decides nothing), only when the rebuild asks.
    /// After each checkpoint, what the ledger holds is checked against
    /// the broker's log; `violated` hears what does not hold.
    pub(super) async fn start(
        (dir, disk, spool_room): (&Path, Disk, Option<u64>),
        (broker, accept): (Arc<FakeBroker>, Option<&str>),
        drains: bool,
        checkpoints_every: Option<(Duration, Option<tokio::time::Instant>)>,
        violated: Violated,
        clock: WallClock,
    ) -> Process {
        let opened =
            ledger::open_driven((&dir.join(LEDGER_FILE), &disk), (DEDUP_TTL, clock), LEASE)
                .expect("a ledger file opens, a damaged one set aside");
        let spool = Spool::open_on(
            &SpoolConfig {
                path: dir.join(SPOOL_FILE),
                max_bytes: 1 << 20,
                max_entries: spool_room.unwrap_or(1_000),
            },
            disk,
        )
        .expect("a spool file opens, a damaged one set aside and salvaged");
        if let Some(topic) = accept {
            accept_partitions(&opened.ledger, &broker, topic).await;
        }
        let topics = TopicSets::new(&KafkaConfig::default());
        topics.open(super::providers::OWN_PREFIX);
        // As the service's start-up: the partitions the ledger's checkpoint
        // kept, and a topic whose count differs refused.
        let kept = match opened.ledger.fill().cached().await {
            Ok(Some(Cached {
                topics: Some(seen), ..
            })) => seen.partitions(),
            _ => BTreeMap::new(),
        };
        broker.start_up(&kept, &topics.entity_topics());
        let timing = Timing {
            inflight_wait: INFLIGHT_WAIT,
            answer_budget: ANSWER_BUDGET,
            max_event_ahead: crate::config::ServerConfig::default().max_event_ahead(),
        };
        let pipeline =
            Pipeline::on_fake(opened.ledger.clone(), broker.clone(), spool.clone(), timing).await;
        let stop = CancellationToken::new();
        tokio::spawn(
            Rebuild::new(
                Arc::new(FakeSource {
                    broker: broker.clone(),
                }),
                &topics,
                opened.ledger.clone(),
                opened.gate,
                DEDUP_TTL,
            )
            .run(stop.clone()),
        );
        if let Some(every) = checkpoints_every {
            tokio::spawn(checkpoints(
                opened.ledger.clone(),
                broker,
                (topics.clone(), violated),
                every,
                stop.clone(),
            ));
        }
        // Only a world whose source spools needs its drainer (it looks
        // four times a second of virtual time, hours of it).
        if drains {
            tokio::spawn(Drainer::new(pipeline.clone(), spool.clone()).run(stop.clone()));
        }
        Process {
            pipeline,
            spool,
            ledger: opened.ledger,
            stop,
        }
    }

    /// Stops its background tasks (the end of the world, not a crash: a
    /// crash ends the runtime they run on).
    pub(super) fn stop(&self) {
        self.stop.cancel();
    }
}

/// The operator's `posbridge ledger accept-partitions --topic TOPIC`, run
/// while posbridge is stopped, through the command's own code: the
/// ledger's checkpoint keeps `topic`'s count as the broker has it now. Run
/// again until it works (a window of failing disk writes ends).
async fn accept_partitions(ledger: &Ledger, broker: &Arc<FakeBroker>, topic: &str) {
    let source = FakeSource {
        broker: broker.clone(),
    };
    let wanted = [topic.to_owned()];
    let described = source.describe(&wanted).await;
    while keep_counts(&ledger.fill(), &described, &wanted)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Longer than any acknowledgement (a late one: 3 s) and its commit (a
/// pause: 300 ms) take.
const SETTLES_WITHIN: Duration = Duration::from_secs(5);

/// Hears what the ledger's checkpoints broke.
pub(super) type Violated = Arc<dyn Fn(String) + Send + Sync>;

/// The ledger's checkpoints, every `every` of virtual time (until `until`,
/// if said), each followed by the check of what it recorded
/// ([`below_the_offsets`]).
async fn checkpoints(
    store: Arc<Ledger>,
    broker: Arc<FakeBroker>,
    (topics, violated): (TopicSets, Violated),
    (every, until): (Duration, Option<tokio::time::Instant>),
    stop: CancellationToken,
) {
    let mut checked = Offsets::new();
    // The log's length, and when it last grew: once it has not for longer
    // than an acknowledgement and its commit may take, no commit is left
    // to move the offsets, and the check has nothing new to see.
    let mut grown = (usize::MAX, tokio::time::Instant::now());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {
                if until.is_some_and(|until| tokio::time::Instant::now() > until) {
                    return;
                }
                let len = broker.taken_count();
                if len != grown.0 {
                    grown = (len, tokio::time::Instant::now());
                }
                let settling = grown.1.elapsed() <= SETTLES_WITHIN;
                // A failed one shows in the ledger's health; the next tries again.
                if store.fill().persist().await.is_ok() && settling {
                    for broken in below_the_offsets(store.as_ref(), &broker, &topics, &mut checked).await {
                        violated(broken);
                    }
                }
            }
        }
    }
}

/// What a checkpoint may record, checked: every entity record below the
/// offsets it holds has its state (or a newer one) in the ledger, since the
/// next start reads the topics only from those offsets. States only grow
/// newer, so the records `checked` below before are not read again (all
/// of them are once the offsets fall: the ledger forgot its topics). What
/// does not hold.
async fn below_the_offsets(
    store: &Ledger,
    broker: &FakeBroker,
    topics: &TopicSets,
    checked: &mut Offsets,
) -> Vec<String> {
    let Ok(Some(cached)) = store.fill().cached().await else {
        return Vec::new();
    };
    let mut broken = Vec::new();
    let sets = topics.all();
    let typed = sets
        .iter()
        .flat_map(|set| EntityType::ALL.map(|t| (t, set.entity(t).clone())));
    let partitions = typed.flat_map(|(entity_type, topic)| {
        let count = i32::try_from(broker.partitions_of(&topic)).unwrap_or(1);
        (0..count).map(move |partition| (entity_type, topic.clone(), partition))
    });
    for (entity_type, topic, partition) in partitions {
        let topic: &str = &topic;
        let partition = (topic.to_owned(), partition);
        let next = cached.offsets.get(&partition).copied().unwrap_or(0);
        let from = checked
            .get(&partition)
            .copied()
            .filter(|from| *from <= next)
            .unwrap_or(0);
        checked.insert(partition.clone(), next);
        for (offset, record) in broker.log_of(topic, partition.1, from..next) {
            let Some(state) = record
                .header(HEADER_VERSION)
                .zip(record.header(HEADER_STATE_HASH))
                .and_then(|(version, hash)| {
                    state_from_headers(version.as_bytes(), hash.as_bytes())
                })
            else {
                continue;
            };
            let slot = EntitySlot::of_record_key(entity_type, &record.key);
            let held = store.fill().entity(&slot).await.ok().flatten();
            if held.is_none_or(|held| held.state.version < state.version) {
                broken.push(format!(
                    "a checkpoint recorded {topic}/{} read up to {next}, and the ledger does not hold the state of the record at {offset} ({})",
                    partition.1, record.key
                ));
            }
        }
    }
    broken
}

/// What a crash does to the ledger's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum LedgerFate {
    /// Kept as the crash left it.
    Kept,
    /// Lost whole (a disk replaced, a volume not mounted).
    Lost,
    /// Bytes changed on disk.
    Damaged,
}

/// What a crash does to the spool's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum SpoolFate {
    /// Kept as the crash left it.
    Kept,
    /// Bytes changed on disk.
    Damaged,
}

/// The files a crash in `from` left, as the next life finds them in `to`:
/// copied as they were on disk when the process died, then `ledger` and
/// `spool` happen to them (damage to the spool aimed, one time in two, at
/// the entry of one of the deliveries `spooled` then). What happened, in
/// words.
pub(super) fn after_crash(
    from: &Path,
    to: &Path,
    (ledger, spool): (LedgerFate, SpoolFate),
    spooled: &[String],
    rng: &mut StdRng,
) -> Vec<String> {
    std::fs::create_dir_all(to).expect("the next life's directory");
    let mut said = Vec::new();
    if ledger != LedgerFate::Lost {
        copy(from, to, LEDGER_FILE);
    } else {
        said.push("the ledger file is lost".to_owned());
    }
    copy(from, to, SPOOL_FILE);
    if ledger == LedgerFate::Damaged {
        said.push(damage(&to.join(LEDGER_FILE), &[], rng));
    }
    // A spool that holds entries is damaged more often: there damage
    // meets what posbridge reads back.
    if spool == SpoolFate::Damaged || (!spooled.is_empty() && rng.random_bool(0.6)) {
        let markers: Vec<String> = spooled
            .iter()
            .map(|id| format!("\"id\":\"{id}\""))
            .collect();
        said.push(damage(&to.join(SPOOL_FILE), &markers, rng));
    }
    said
}

fn copy(from: &Path, to: &Path, file: &str) {
    let source = from.join(file);
    if source.exists() {
        std::fs::copy(&source, to.join(file)).expect("a file copies");
    }
}

/// Changes 1 to 64 bytes of `path`, as a disk may: at a random place, or
/// (three times in four) just after one of the `markers` found in it, where
/// the damage reaches what posbridge reads back rather than pages redb may
/// never read again.
fn damage(path: &PathBuf, markers: &[String], rng: &mut StdRng) -> String {
    let mut bytes = std::fs::read(path).expect("a file to damage");
    if bytes.is_empty() {
        return format!("{} is empty: nothing to damage", path.display());
    }
    let aimed: Vec<usize> = markers
        .iter()
        .flat_map(|marker| memchr::memmem::find_iter(&bytes, marker.as_bytes()).collect::<Vec<_>>())
        .collect();
    let at = if !aimed.is_empty() && rng.random_bool(0.75) {
        (aimed[rng.random_range(0..aimed.len())] + rng.random_range(0..32)).min(bytes.len() - 1)
    } else {
        rng.random_range(0..bytes.len())
    };
    let len = rng.random_range(1..=64).min(bytes.len() - at);
    for byte in &mut bytes[at..at + len] {
        *byte ^= rng.random_range(1..=255u8);
    }
    std::fs::write(path, &bytes).expect("a damaged file writes");
    format!(
        "{len} byte(s) of {} changed at {at}",
        path.file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
    )
}
