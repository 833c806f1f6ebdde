//! The drainer: publishes spooled deliveries through the pipeline once Kafka
//! answers again, oldest first, and removes each from the spool only after
//! its outcome is durable in the ledger.
//!
//! A pass replays up to a batch of the oldest entries in parallel lanes,
//! one lane per entity (by a hash of its key), each lane in spool order: two
//! deliveries about one entity are replayed in the order they arrived, and
//! a slow or refused entity holds up only its own lane.
//!
//! An entry that keeps failing while Kafka answers (its topic refuses it;
//! a slow, unreachable or short-of-replicas broker does not count, it stops
//! every entry alike)
//! is tried in [`MAX_ATTEMPTS`] passes over [`SET_ASIDE_AFTER`] at least, then goes aside to the dead-letter
//! topic with its raw body (reason code `spool_unpublishable`), where the
//! status page counts it and `posbridge replay` publishes it once the cause
//! is cleared; the entries behind it drain meanwhile. While no broker
//! answers, nothing counts as an attempt.
//!
//! An entry whose bytes do not match their checksum never reaches a lane:
//! the spool's read moves it to its quarantine (`adapters/spool/quarantine.rs`)
//! and gives back the entries after it, so the drain goes on.
//!
//! It runs inside `serve` from start-up, so a spool left by a crash is
//! drained as soon as the broker answers. A replayed delivery whose id the
//! ledger already knows as done (published just before a crash) is a
//! duplicate and is simply removed.
//!
//! A pass the spool stopped (its file cannot be written, so replayed entries
//! cannot be removed and would come back as duplicates every pass) is
//! retried after a capped exponential back-off ([`SPOOL_BACKOFF_MAX`]),
//! while the drainer asks the spool to heal on every tick; once it has, the
//! next pass runs at once.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use backon::BackoffBuilder as _;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::adapters::publish::PublishError;
use crate::adapters::spool::{Spool, SpoolError, SpooledDelivery};
use crate::domain::event::DeliveryKey;
use crate::domain::verify::VerifiedBody;
use crate::observe::telemetry;
use crate::observe::traces::DeliveryTrace;
use crate::services::pipeline::{DeadLetter, Delivery, Outcome, Pipeline, PipelineError};

/// How many entries one pass reads from the spool.
const BATCH: usize = 256;
/// How many lanes a pass replays in parallel.
const LANES: usize = 8;
/// Passes an entry may fail while Kafka answers before it goes to the
/// dead-letter topic...
pub const MAX_ATTEMPTS: u32 = 5;
/// ...and how long after its first such failure at least: a cluster that
/// answers metadata but is still electing leaders must not send an entry
/// aside that a minute later would publish.
pub const SET_ASIDE_AFTER: Duration = Duration::from_secs(30);
/// How often an idle drainer looks again (and refreshes the age gauge).
const IDLE: Duration = Duration::from_millis(250);
/// The longest wait between passes a refusing broker paused: each paused
/// pass doubles the wait from [`IDLE`] up to this, so an outage in which
/// the broker answers but refuses is not sent a record per lane four times
/// a second; a pass that removes entries ends the pause. Plain doubling,
/// no jitter (one drainer per process; and the simulation replays a seed
/// exactly), unlike [`SpoolStops`]'s.
const PAUSED_BACKOFF_MAX: Duration = Duration::from_secs(8);
/// The longest wait between passes the spool stopped (jitter included).
pub const SPOOL_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Reason code of a spooled delivery set aside after [`MAX_ATTEMPTS`].
pub const SPOOL_UNPUBLISHABLE: &str = "spool_unpublishable";

/// What a drain pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Entries whose outcome became durable (and were removed).
    pub entries: u64,
}

/// Why a pass stopped before the spool was empty.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    /// The pipeline could not make an entry's outcome durable (Kafka went
    /// away again); the entry stays and is tried again.
    #[error("replaying a spooled delivery: {0}")]
    Pipeline(#[from] PipelineError),
    /// The spool could not be read or written.
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

/// The drainer of one spool.
#[derive(Clone)]
pub struct Drainer {
    /// Where spooled deliveries are replayed.
    pipeline: Pipeline,
    /// What is replayed.
    spool: Spool,
    /// Failed passes per spool entry (by sequence number) while Kafka
    /// answered, and when the first was.
    attempts: Arc<Mutex<HashMap<u64, (u32, Instant)>>>,
}

/// What one lane of a pass did: the entries to remove, and the error that
/// stopped it, if one did.
type LaneResult = (Vec<(u64, DeliveryKey)>, Option<PipelineError>);

impl Drainer {
    /// A drainer of `spool` into `pipeline`.
    pub fn new(pipeline: Pipeline, spool: Spool) -> Drainer {
        Drainer {
            pipeline,
            spool,
            attempts: Arc::default(),
        }
    }

    /// Drains whenever the spool holds entries and Kafka answers, until
    /// `shutdown`. Says once when it starts and once when the spool is empty.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut draining: Option<(Instant, u64)> = None;
        let mut stopped = SpoolStops::default();
        let mut writable = true;
        // Passes paused in a row since the last that removed entries: the
        // pause is said once, and the wait between its passes grows.
        let mut paused: u32 = 0;
        loop {
            self.refresh_age();
            // Cheap while the spool writes; else a heal when one is due.
            let was_writable = std::mem::replace(&mut writable, self.spool.heal().await);
            if writable && !was_writable {
                stopped.healed();
            }
            if !stopped.may_pass() {
                tokio::select! {
                    // Shutdown first: a pass or a wait that ends at the same moment
                    // loses nothing, and the order is the same on every run (the
                    // simulation replays a seed exactly).
                    biased;
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(IDLE) => continue,
                }
            }
            let ready = self.spool.stats().entries > 0 && self.pipeline.producer().health().is_up();
            if !ready {
                if let Some((since, entries)) = draining.take()
                    && self.spool.stats().entries == 0
                {
                    let secs = since.elapsed().as_secs_f64();
                    info!(
                        entries,
                        secs,
                        per_sec = entries as f64 / secs.max(1e-3),
                        "Spool drained."
                    );
                }
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(IDLE) => continue,
                }
            }
            let started = draining.get_or_insert_with(|| {
                info!(
                    entries = self.spool.stats().entries,
                    "Kafka answers: draining the spool."
                );
                (Instant::now(), 0)
            });
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                result = self.pass() => match result {
                    Ok(done) => {
                        started.1 += done.entries;
                        stopped.passed();
                        if done.entries > 0 {
                            paused = 0;
                        } else {
                            // The counts say entries the pass did not find
                            // (an append still being written; counts gone
                            // wrong): a pass again at once would find none
                            // again without ever yielding, a core at 100 %.
                            tokio::select! {
                                biased;
                                () = shutdown.cancelled() => return,
                                () = tokio::time::sleep(IDLE) => {}
                            }
                        }
                    }
                    Err(DrainError::Pipeline(error)) => {
                        stopped.passed();
                        if paused == 0 {
                            warn!(%error, "Spool drain paused: a spooled delivery cannot be made durable yet.");
                        } else {
                            debug!(%error, "Spool drain still paused.");
                        }
                        let wait = IDLE.saturating_mul(1 << paused.min(6)).min(PAUSED_BACKOFF_MAX);
                        paused = paused.saturating_add(1);
                        tokio::select! {
                            biased;
                            () = shutdown.cancelled() => return,
                            () = tokio::time::sleep(wait) => {}
                        }
                    }
                    Err(DrainError::Spool(error)) => stopped.stopped(&error),
                },
            }
        }
    }

    /// Drains until the spool is empty or an entry cannot be replayed.
    ///
    /// # Errors
    /// [`DrainError`] from the entry that stopped it; what came before it
    /// is removed.
    pub async fn drain_all(&self) -> Result<Drained, DrainError> {
        let mut total = Drained::default();
        loop {
            let done = self.pass().await?;
            if done.entries == 0 {
                return Ok(total);
            }
            total.entries += done.entries;
        }
    }

    /// Replays up to one batch of the oldest entries in lanes by entity,
    /// removing those whose outcome is durable (in one write) before
    /// returning.
    async fn pass(&self) -> Result<Drained, DrainError> {
        let mut lanes: Vec<Vec<(u64, DeliveryKey, Delivery)>> =
            (0..LANES).map(|_| Vec::new()).collect();
        for (seq, spooled) in self.spool.oldest(BATCH)? {
            let key = spooled.key.clone();
            let delivery = delivery_of(spooled);
            lanes[lane_of(&self.pipeline, &delivery)].push((seq, key, delivery));
        }
        let results: Vec<LaneResult> =
            futures::future::join_all(lanes.into_iter().map(|lane| self.replay_lane(lane))).await;
        let mut done = Vec::new();
        let mut stopped = None;
        for (lane_done, lane_stopped) in results {
            done.extend(lane_done);
            stopped = stopped.or(lane_stopped);
        }
        let drained = Drained {
            entries: done.len() as u64,
        };
        if !done.is_empty() {
            {
                let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
                for (seq, _) in &done {
                    attempts.remove(seq);
                }
            }
            self.spool.remove(done).await?;
        }
        self.refresh_age();
        match stopped {
            Some(error) => Err(error.into()),
            None => Ok(drained),
        }
    }

    /// Replays one lane's entries in order, up to the first that cannot
    /// be made durable (which, after [`MAX_ATTEMPTS`] failed passes while
    /// Kafka answers, goes to the dead-letter topic instead).
    async fn replay_lane(&self, lane: Vec<(u64, DeliveryKey, Delivery)>) -> LaneResult {
        let mut done = Vec::with_capacity(lane.len());
        for (seq, key, delivery) in lane {
            let provider = delivery.source.provider;
            // A cheap clone (shared source and body): set_aside needs it after.
            match self.pipeline.replay(delivery.clone()).await {
                Ok(outcome) => {
                    count(provider.as_str(), outcome);
                    done.push((seq, key));
                }
                // A wrong delivery id was refused before spooling; should one
                // be here, keeping it would block the spool for good.
                Err(PipelineError::DeliveryIdMismatch) => {
                    error!(delivery = %key, "Spooled delivery refused on replay; removed.");
                    done.push((seq, key));
                }
                Err(error) => {
                    if self.pipeline.producer().health().is_up()
                        && about_the_entry(&error)
                        && self.failed_too_often(seq)
                        && self.set_aside(&delivery, &error).await
                    {
                        count(provider.as_str(), Outcome::DeadLettered);
                        done.push((seq, key));
                        continue;
                    }
                    return (done, Some(error));
                }
            }
        }
        (done, None)
    }

    /// Counts a failed pass of entry `seq` while Kafka answers; whether it
    /// has now failed [`MAX_ATTEMPTS`] times over [`SET_ASIDE_AFTER`] at least.
    fn failed_too_often(&self, seq: u64) -> bool {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let (tries, first) = attempts.entry(seq).or_insert((0, Instant::now()));
        *tries += 1;
        *tries >= MAX_ATTEMPTS && first.elapsed() >= SET_ASIDE_AFTER
    }

    /// Writes a spooled delivery that keeps failing to the dead-letter
    /// topic; whether that was durable (else it stays in the spool).
    async fn set_aside(&self, delivery: &Delivery, error: &PipelineError) -> bool {
        let letter = DeadLetter {
            provider: delivery.source.provider,
            source: &delivery.source.name,
            topic_prefix: delivery.source.topic_prefix.as_deref(),
            delivery_id: &delivery.delivery_id,
            received_at: delivery.received_at,
            body: delivery.body.bytes().to_vec(),
            code: SPOOL_UNPUBLISHABLE,
            reason: format!(
                "spooled delivery failed {MAX_ATTEMPTS} drain passes while Kafka answered: {error}"
            ),
        };
        self.pipeline.dead_letter(letter).await.is_ok()
    }

    fn refresh_age(&self) {
        // An empty spool (its counts are reserved before an append
        // writes) has no oldest entry: no read transaction every tick.
        if self.spool.stats().entries == 0 {
            metrics::gauge!(telemetry::SPOOL_OLDEST_AGE).set(0.0);
            return;
        }
        let age = self
            .spool
            .oldest_received_at()
            .ok()
            .flatten()
            .map_or(0.0, |at| {
                (OffsetDateTime::now_utc() - at).as_seconds_f64().max(0.0)
            });
        metrics::gauge!(telemetry::SPOOL_OLDEST_AGE).set(age);
    }
}

/// The back-off of passes the spool stopped: the first waits [`IDLE`],
/// each next one twice as long, up to half [`SPOOL_BACKOFF_MAX`]; jitter
/// adds up to as much again, so drainers of several pods do not keep step.
#[derive(Default)]
struct SpoolStops {
    /// The waits still to come, while passes keep being stopped.
    backoff: Option<backon::ExponentialBackoff>,
    /// No pass before this.
    next_pass: Option<Instant>,
}

impl SpoolStops {
    fn may_pass(&self) -> bool {
        self.next_pass.is_none_or(|at| Instant::now() >= at)
    }

    /// A pass the spool stopped: said once, then waited out longer each time.
    fn stopped(&mut self, error: &SpoolError) {
        let backoff = self.backoff.get_or_insert_with(|| {
            error!(%error, "Spool drain stopped: the spool cannot be read or written; retrying with back-off.");
            backon::ExponentialBuilder::default()
                .with_min_delay(IDLE)
                .with_max_delay(SPOOL_BACKOFF_MAX / 2)
                .with_jitter()
                .without_max_times()
                .build()
        });
        let wait = backoff.next().unwrap_or(SPOOL_BACKOFF_MAX);
        self.next_pass = Some(Instant::now() + wait);
    }

    /// A pass the spool did not stop.
    fn passed(&mut self) {
        if self.backoff.take().is_some() {
            info!("Spool drain resumed.");
        }
        self.next_pass = None;
    }

    /// The spool heals (or never failed): the next pass need not wait.
    fn healed(&mut self) {
        self.next_pass = None;
    }
}

/// A spooled delivery as the pipeline replays it.
fn delivery_of(spooled: SpooledDelivery) -> Delivery {
    Delivery {
        source: Arc::new(spooled.source),
        delivery_id: spooled.delivery_id.into(),
        body: VerifiedBody::from_spool(spooled.body),
        received_at: spooled.received_at,
        arrived: Instant::now(),
        spools: false,
        // The pipeline starts the span of its replay.
        trace: DeliveryTrace::default(),
    }
}

/// The lane of a delivery: by its entity, so one entity's deliveries keep
/// their order; one that does not normalize goes to the first lane. (It is
/// normalized again when replayed: the pipeline takes the raw delivery.)
fn lane_of(pipeline: &Pipeline, delivery: &Delivery) -> usize {
    pipeline.entity_of(delivery).map_or(0, |entity| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        entity.hash(&mut hasher);
        (hasher.finish() % LANES as u64) as usize
    })
}

fn count(provider: &'static str, outcome: Outcome) {
    metrics::counter!(
        telemetry::SPOOL_DRAINED,
        telemetry::PROVIDER => provider,
        telemetry::OUTCOME => outcome.as_str()
    )
    .increment(1);
}

/// Whether a replay's failure may be the entry's own (a topic refusing its
/// records, an encoding it cannot take), so that it counts toward setting
/// the entry aside. A ledger that cannot answer, and a broker that is slow,
/// unreachable or short of in-sync replicas, stop every entry alike:
/// setting good ones aside then would only move them out of the way of
/// nothing, and out of their topic. (The simulation found a valid spooled
/// delivery dead-lettered after half a minute of retryable faults.) A topic
/// changed under posbridge does count: refused until the operator acts, its
/// entries would stay the oldest, and once a batch of them led the spool
/// no pass would reach the entries behind them (the sales an outage
/// spooled); set aside, they wait in the dead-letter topic for `posbridge
/// replay`, named, as the alert on the changed topic says.
fn about_the_entry(error: &PipelineError) -> bool {
    !matches!(
        error,
        PipelineError::Ledger(_)
            | PipelineError::InFlight
            | PipelineError::DeadlinePassed
            | PipelineError::Publish(
                PublishError::Unavailable(_)
                    | PublishError::DeadlinePassed
                    | PublishError::BrokerDown
            )
    )
}

#[cfg(test)]
mod tests;
