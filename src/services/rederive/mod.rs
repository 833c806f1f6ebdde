//! `posbridge rederive`: each key's state on the entity topics derived again
//! from its record's `raw` with today's code, and published in its place
//! where it now differs, so a normalizer fix or a new schema field reaches
//! the entities written before it.
//!
//! The topics are read partition by partition to their ends as of the
//! start. A record is its key's state now when the ledger holds the state
//! its headers say it wrote (the ledger is filled from the topics before a
//! run starts): older records of a key, tombstones and records without
//! those headers are passed over, so a run reads each record once and keeps
//! nothing per key (bounded memory whatever the topics hold). A current
//! record's value is read with the schema that wrote it (`Writers`), its
//! `raw` normalized again (`derive.rs`), and the two compared field by field
//! (`diff.rs`): the same value publishes nothing. One that differs is
//! published at the record's own version through the pipeline's lock and
//! ledger, only while the ledger still holds that record's state: a webhook
//! that brought a newer state meanwhile keeps it (`stale`).
//!
//! Each partition's progress is a ledger checkpoint,
//! `rederive/{topic}/{partition}`: a run stopped by an error (a broker
//! outage) or a signal resumes where it stopped; a run that reads every
//! topic to its end sets them back, so the next run (after the next fix)
//! reads everything again. Publishing is paced (`--rate`) so live traffic
//! keeps its latency; reading is not.

mod current;
mod derive;
mod diff;
mod judge;
mod report;
mod runs;

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesOrdered;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::adapters::encode::Writers;
use crate::adapters::ledger::{Commit, LedgerError};
use crate::adapters::publish::Topics;
use crate::config::Config;
use crate::domain::event::{EntityType, ProviderKind};
use crate::observe::progress::Progress;
use crate::services::pipeline::{Pipeline, PipelineError};
use crate::services::replay::{Extent, Letter, ReadError, Reader};

pub use diff::Change;
use judge::{Judged, Target, Verdict, count, judge};
pub use report::Summary;
pub use runs::{Busy, RunView, Runs};

/// A checkpoint of a run that read its partition to the end: the next run
/// starts at the beginning.
const DONE: i64 = -1;

/// How often a moving checkpoint is written.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// What one run does.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Options {
    /// Only this entity type's topics.
    #[serde(serialize_with = "plural")]
    pub entity: Option<EntityType>,
    /// Only records of this provider.
    pub provider: Option<ProviderKind>,
    /// Only records that came through this source.
    pub source: Option<String>,
    /// Derive and compare, publishing nothing and moving no checkpoint.
    pub dry_run: bool,
    /// Derived records published per second at most; 0 for no limit.
    pub rate: u32,
    /// How many changed (or failed) keys are printed, field by field.
    pub sample: usize,
    /// Start over, forgetting where a stopped run was.
    pub from_start: bool,
}

/// An entity type as the command line and the topics name it (`sales`).
fn plural<S: serde::Serializer>(
    entity: &Option<EntityType>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_some(&entity.map(EntityType::plural))
}

impl Options {
    /// Whether the run may move checkpoints: not dry, and reading every
    /// record of its topics (a filtered run passes over records a later
    /// run must still read).
    fn moves(&self) -> bool {
        !self.dry_run && self.provider.is_none() && self.source.is_none()
    }
}

/// Why a run stopped before its end; run it again to resume.
#[derive(Debug, thiserror::Error)]
pub enum RederiveError {
    /// A topic could not be read.
    #[error("reading the topics: {0}")]
    Read(#[from] ReadError),
    /// A record's outcome could not be made durable (a broker outage).
    #[error("{topic} partition {partition} offset {offset}: {source}")]
    Publish {
        /// Its topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// What failed.
        #[source]
        source: PipelineError,
    },
    /// The ledger could not be read or a checkpoint written.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The report could not be written.
    #[error("writing the report: {0}")]
    Report(#[from] std::io::Error),
    /// Asked to stop (Ctrl-C, SIGTERM): the sends under way ended and were
    /// counted, the checkpoints kept.
    #[error("stopped on request")]
    Interrupted,
    /// Another process sharing the ledger (a replica's admin run, another
    /// command) runs one that moves the same checkpoints.
    #[error(
        "another rederive runs on this ledger (a replica's /admin/rederive or another command): wait for it to end, or run this one with --dry-run"
    )]
    AnotherRun,
}

/// A record and what became of it, once its send (if any) ended.
type Pending<'a> =
    Pin<Box<dyn Future<Output = (Letter, Result<Verdict, PipelineError>)> + Send + 'a>>;

/// Derived states sent at once: each waits for the broker's
/// acknowledgement, so one at a time would publish at one record per
/// round trip.
const IN_FLIGHT: usize = 64;

/// A run over the entity topics in use.
pub struct Rederive {
    pipeline: Pipeline,
    writers: Writers,
    config: Config,
    targets: Vec<Target>,
    /// The counts so far, for a run others watch (`/admin/rederive`).
    live: Arc<std::sync::Mutex<Summary>>,
    /// Cancelled to stop the run at the next record read.
    stop: CancellationToken,
}

impl Rederive {
    /// A run over `sets`' entity topics (the shared ones and the sources'
    /// own) through `pipeline`.
    ///
    /// # Errors
    /// [`crate::adapters::encode::WriterError`] when the registry's client
    /// cannot be made.
    pub fn new(
        config: &Config,
        pipeline: Pipeline,
        sets: &[Arc<Topics>],
    ) -> Result<Rederive, crate::adapters::encode::WriterError> {
        let targets = sets
            .iter()
            .flat_map(|set| {
                EntityType::ALL.map(|entity_type| Target {
                    topic: set.entity(entity_type).to_string(),
                    entity_type,
                    prefix: set.prefix().map(str::to_owned),
                })
            })
            .collect();
        Ok(Rederive {
            pipeline,
            writers: Writers::new(&config.schema_registry)?,
            config: config.clone(),
            targets,
            live: Arc::default(),
            stop: CancellationToken::new(),
        })
    }

    /// The same run, stopped when `stop` is cancelled: it reads no further
    /// record, waits for the sends under way, counts them, keeps the
    /// checkpoints and writes its summary, then ends with
    /// [`RederiveError::Interrupted`].
    #[must_use]
    pub fn stopped_by(mut self, stop: CancellationToken) -> Rederive {
        self.stop = stop;
        self
    }

    /// The counts so far, updated as the run goes.
    pub fn live(&self) -> Arc<std::sync::Mutex<Summary>> {
        self.live.clone()
    }

    /// Reads the selected topics to their ends as of now, writes a line for
    /// each changed key while `options.sample` lasts and a summary line to
    /// `out`; the summary is written on a stop too.
    ///
    /// # Errors
    /// [`RederiveError`] when a record's outcome could not be made durable
    /// or a topic read; the run resumes there.
    pub async fn run(
        &self,
        options: &Options,
        out: &mut impl Write,
    ) -> Result<Summary, RederiveError> {
        let mut summary = Summary {
            dry_run: options.dry_run,
            ..Summary::default()
        };
        let started = Instant::now();
        let result = self.run_targets(options, &mut summary, out).await;
        summary.complete = result.is_ok();
        summary.secs = started.elapsed().as_secs_f64();
        self.show(&summary);
        writeln!(out, "{}", serde_json::json!({ "summary": summary }))?;
        info!(
            read = summary.read,
            differed = summary.differed,
            published = summary.published,
            stale = summary.stale,
            unchanged = summary.unchanged,
            failed = summary.failed.values().sum::<u64>(),
            complete = summary.complete,
            "Rederive finished."
        );
        result.map(|()| summary)
    }

    async fn run_targets(
        &self,
        options: &Options,
        summary: &mut Summary,
        out: &mut impl Write,
    ) -> Result<(), RederiveError> {
        // Held to the run's end: two runs would move the same checkpoints.
        let _only_run = match options.moves() {
            true => Some(
                self.pipeline
                    .ledger()
                    .rederive_lock()
                    .await?
                    .ok_or(RederiveError::AnotherRun)?,
            ),
            false => None,
        };
        let targets: Vec<&Target> = self
            .targets
            .iter()
            .filter(|t| options.entity.is_none_or(|e| e == t.entity_type))
            .collect();
        let mut parts = Vec::new();
        for target in &targets {
            let reader = Reader::new(&self.config.kafka, &target.topic)?;
            for extent in reader.extents().await? {
                let checkpoint = checkpoint_name(&target.topic, extent.partition);
                // A run that moves no checkpoint (a dry run, a filtered
                // one) reads everything: a preview of the whole.
                let saved = match options.from_start || !options.moves() {
                    true => None,
                    false => self.pipeline.ledger().checkpoint(&checkpoint).await?,
                };
                let start = match saved {
                    Some(next) if next != DONE && next <= extent.high => next.max(extent.low),
                    _ => extent.low,
                };
                parts.push((*target, extent, checkpoint, start));
            }
        }
        let total: i64 = parts.iter().map(|(_, e, _, start)| e.high - start).sum();
        info!(
            topics = targets.len(),
            records = total,
            dry_run = options.dry_run,
            "Deriving the topics' states again."
        );
        let progress = Progress::start(
            "rederive".to_owned(),
            "records",
            Some(u64::try_from(total).unwrap_or(0)),
            true,
        );
        let mut pace = Pace::new(options.rate);
        let mut tally = Tally {
            summary,
            out,
            shown: 0,
            progress: &progress,
            options,
        };
        for (target, extent, checkpoint, start) in &parts {
            if self.stop.is_cancelled() {
                return Err(RederiveError::Interrupted);
            }
            if start < &extent.high {
                let part = (*target, *extent, checkpoint.as_str(), *start);
                self.read_partition(part, &mut tally, &mut pace).await?;
            }
        }
        let summary = tally.summary;
        progress.finish(summary.read, &summary.line());
        // Read to the end: the next run reads everything again.
        if options.moves() {
            for (_, _, checkpoint, _) in &parts {
                self.save(checkpoint, DONE).await?;
            }
        }
        Ok(())
    }

    /// Reads one partition from `start` to its end as the run began,
    /// counting each record in the partition's order whatever order their
    /// sends end in, and keeps its checkpoint: on a stop (a send or a read
    /// that failed), at the first record not counted.
    async fn read_partition<W: Write>(
        &self,
        (target, extent, checkpoint, start): (&Target, Extent, &str, i64),
        tally: &mut Tally<'_, W>,
        pace: &mut Pace,
    ) -> Result<(), RederiveError> {
        let moves = tally.options.moves();
        let mut reader = Reader::new(&self.config.kafka, &target.topic)?;
        reader.assign(extent.partition, start, extent.high)?;
        let mut saved_at = Instant::now();
        let mut next = start;
        let mut pending: FuturesOrdered<Pending<'_>> = FuturesOrdered::new();
        let mut reading = true;
        let mut stopped = None;
        loop {
            // A send done is counted at once; the others keep going.
            let ended = match pending.next().now_or_never() {
                Some(Some(ended)) => ended,
                _ if reading && pending.len() < IN_FLIGHT => {
                    let read = tokio::select! {
                        biased;
                        () = self.stop.cancelled() => Err(RederiveError::Interrupted),
                        read = reader.next() => read.map_err(RederiveError::Read),
                    };
                    match read {
                        // The reader passes over a record a broker hands
                        // again (tansu after a compaction): each offset once.
                        Ok(Some(record)) => {
                            let sent = self.start(target, record, tally.options, pace).await;
                            pending.push_back(sent);
                        }
                        Ok(None) => reading = false,
                        Err(error) => {
                            stopped = Some(error);
                            reading = false;
                        }
                    }
                    continue;
                }
                _ => match pending.next().await {
                    Some(ended) => ended,
                    None => break,
                },
            };
            let (record, verdict) = ended;
            match verdict {
                Ok(verdict) => {
                    tally.count(target, &record, &verdict)?;
                    next = record.offset + 1;
                }
                Err(source) => {
                    stopped = Some(RederiveError::Publish {
                        topic: target.topic.clone(),
                        partition: record.partition,
                        offset: record.offset,
                        source,
                    });
                    break;
                }
            }
            if tally.summary.read.is_multiple_of(256) {
                self.show(tally.summary);
            }
            if moves && saved_at.elapsed() >= SAVE_EVERY {
                self.save(checkpoint, next).await?;
                saved_at = Instant::now();
            }
        }
        if moves {
            let at = if stopped.is_some() { next } else { extent.high };
            self.save(checkpoint, at).await?;
        }
        stopped.map_or(Ok(()), Err)
    }

    /// What becomes of `record`: judged here, and a state that differs
    /// sent on a task of its own (paced), so that [`IN_FLIGHT`] sends wait
    /// for the broker at once.
    async fn start(
        &self,
        target: &Target,
        record: Letter,
        options: &Options,
        pace: &mut Pace,
    ) -> Pending<'static> {
        match judge(
            self.pipeline.ledger(),
            &self.writers,
            target,
            &record,
            options,
        )
        .await
        {
            Ok(Judged::Done(verdict)) => Box::pin(async move { (record, Ok(verdict)) }),
            Ok(Judged::Differs(_, changes)) if options.dry_run => {
                Box::pin(async move { (record, Ok(Verdict::WouldPublish(changes))) })
            }
            Ok(Judged::Differs(send, changes)) => {
                let (derived, state) = *send;
                pace.wait().await;
                let pipeline = self.pipeline.clone();
                let sent = tokio::spawn(async move { pipeline.rederive(derived, state).await });
                Box::pin(async move {
                    let outcome = sent
                        .await
                        .unwrap_or_else(|failed| std::panic::resume_unwind(failed.into_panic()));
                    (record, outcome.map(|o| Verdict::Differed(changes, o)))
                })
            }
            Err(error) => Box::pin(async move { (record, Err(error)) }),
        }
    }

    fn show(&self, summary: &Summary) {
        *self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = summary.clone();
    }

    async fn save(&self, checkpoint: &str, next: i64) -> Result<(), LedgerError> {
        self.pipeline
            .ledger()
            .commit(Commit::checkpoint(checkpoint, next))
            .await
    }
}

/// What a run has counted and shown so far.
struct Tally<'a, W: Write> {
    summary: &'a mut Summary,
    out: &'a mut W,
    /// Lines shown of the sample.
    shown: usize,
    progress: &'a Progress,
    options: &'a Options,
}

impl<W: Write> Tally<'_, W> {
    /// Counts one record, shows its line while the sample lasts.
    fn count(
        &mut self,
        target: &Target,
        record: &Letter,
        verdict: &Verdict,
    ) -> Result<(), std::io::Error> {
        self.summary.read += 1;
        if let Some(line) = count(verdict, self.summary, target, record)
            && self.shown < self.options.sample
        {
            self.shown += 1;
            serde_json::to_writer(&mut *self.out, &line)?;
            writeln!(self.out)?;
        }
        self.progress
            .update(self.summary.read, &self.summary.line());
        Ok(())
    }
}

/// The checkpoint name of one partition of a run.
fn checkpoint_name(topic: &str, partition: i32) -> String {
    format!("rederive/{topic}/{partition}")
}

/// At most `rate` publishes a second (none: no limit).
struct Pace(Option<tokio::time::Interval>);

impl Pace {
    fn new(rate: u32) -> Pace {
        Pace((rate > 0).then(|| {
            let mut every = tokio::time::interval(Duration::from_secs(1) / rate);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            every
        }))
    }

    async fn wait(&mut self) {
        if let Some(every) = &mut self.0 {
            every.tick().await;
        }
    }
}
