//! Dead-letter replay (`posbridge replay-dead-letters`): puts dead letters
//! through the pipeline again once their cause is cleared (a record limit
//! raised, a normalizer fixed), each as the delivery it was.
//!
//! The topic is read partition by partition up to its end as of the start
//! (`read.rs`); each record is selected or skipped from its headers and the
//! run's filters (`select.rs`) and redelivered through
//! [`Pipeline::redeliver`], so the guard keeps an old dead letter from
//! rolling an entity back and what still fails is reported, never
//! dead-lettered again. Each record's verdict is a JSON line on stdout
//! (`report.rs`). How far a run got is a ledger checkpoint per partition
//! (`checkpoint.rs`), moved only past final outcomes and only by unfiltered
//! runs that are not dry; a failure worth retrying (Kafka, registry or
//! ledger unavailable) stops the run with the checkpoint before it.

mod checkpoint;
mod read;
mod report;
mod select;

use std::io::Write;
use std::time::Instant;

use tracing::{info, warn};

use crate::adapters::ledger::{Commit, LedgerError};
use crate::config::Config;
use crate::services::pipeline::{Pipeline, PipelineError};

use crate::observe::progress::Progress;
use checkpoint::Cursor;

use report::{Line, Verdict};
use select::Selection;
pub use select::Sources;

pub use read::{Extent, ReadError, Reader};
pub use report::Summary;
pub use select::{Filter, Letter};

/// Why a run stopped before the topic's end. Each is worth retrying: the
/// checkpoints stay before the record that could not be finished.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The dead-letter topic could not be read.
    #[error("reading dead letters: {0}")]
    Read(#[from] ReadError),
    /// A dead letter's outcome could not be made durable.
    #[error("dead letter at partition {partition} offset {offset}: {source}")]
    Redeliver {
        /// Its partition.
        partition: i32,
        /// Its offset.
        offset: i64,
        /// What failed.
        #[source]
        source: PipelineError,
    },
    /// A checkpoint could not be read or written.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] LedgerError),
    /// The report could not be written to stdout.
    #[error("writing the report: {0}")]
    Report(#[from] std::io::Error),
}

/// What one run does.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Which dead letters it takes.
    pub filter: Filter,
    /// Normalize, guard and encode without publishing or moving checkpoints.
    pub dry_run: bool,
}

/// A replayer of the configured dead-letter topic into a pipeline.
pub struct Replay {
    /// Where dead letters are put through again; its ledger holds the checkpoints.
    pipeline: Pipeline,
    /// The configured sources: a dead letter names its own.
    sources: Sources,
    /// Where dead letters are read from.
    reader: Reader,
    /// The dead-letter topic.
    topic: String,
}

/// One partition's part of a run.
struct Part {
    /// Its extent at the start of the run.
    extent: Extent,
    /// Its checkpoint's name.
    checkpoint: String,
    /// Where reading starts.
    start: i64,
}

impl Replay {
    /// A replayer of the dead-letter `topic` (the shared one, or a source's
    /// own) through the `sources` in use (a dead letter names its own).
    ///
    /// # Errors
    /// [`ReplayError::Read`] when librdkafka refuses the consumer settings.
    pub fn new(
        config: &Config,
        pipeline: Pipeline,
        sources: Sources,
        topic: String,
    ) -> Result<Replay, ReplayError> {
        Ok(Replay {
            pipeline,
            sources,
            reader: Reader::new(&config.kafka, &topic)?,
            topic,
        })
    }

    /// Reads the topic to its end as of now, writes one line per dead letter
    /// and a summary line to `out`, and moves the checkpoints (unless
    /// filtered or dry). The summary is written on a stop too.
    ///
    /// # Errors
    /// [`ReplayError`] when a record's outcome could not be made final; the
    /// records before it keep theirs.
    pub async fn run(
        &mut self,
        options: &Options,
        out: &mut impl Write,
    ) -> Result<Summary, ReplayError> {
        let moves = options.filter.is_empty() && !options.dry_run;
        let mut summary = Summary {
            dry_run: options.dry_run,
            checkpoints: match (options.dry_run, moves) {
                (true, _) => "kept: dry run",
                (false, false) => "kept: filters",
                (false, true) => "moved",
            },
            ..Summary::default()
        };
        let result = self.run_parts(options, moves, &mut summary, out).await;
        summary.complete = result.is_ok();
        writeln!(out, "{}", serde_json::json!({ "summary": summary }))?;
        info!(
            records = summary.records,
            published = summary.published,
            stale = summary.stale,
            unchanged = summary.unchanged,
            still_failing = summary.still_failing,
            skipped = summary.skipped,
            complete = summary.complete,
            "Dead-letter replay finished."
        );
        result.map(|()| summary)
    }

    async fn run_parts(
        &mut self,
        options: &Options,
        moves: bool,
        summary: &mut Summary,
        out: &mut impl Write,
    ) -> Result<(), ReplayError> {
        let parts = self.parts().await?;
        let total: i64 = parts.iter().map(|p| p.extent.high - p.start).sum();
        info!(
            topic = %self.topic,
            partitions = parts.len(),
            records = total,
            dry_run = options.dry_run,
            checkpoints = summary.checkpoints,
            "Replaying dead letters."
        );
        let progress = Progress::start(
            "dead-letter replay".to_owned(),
            "dead letters",
            Some(u64::try_from(total).unwrap_or(0)),
            true,
        );
        let mut result = Ok(());
        for part in parts.iter().filter(|p| p.start < p.extent.high) {
            result = self
                .run_part(part, options, moves, summary, &progress, out)
                .await;
            if result.is_err() {
                break;
            }
        }
        progress.finish(summary.records, &summary.line());
        result
    }

    /// Every partition with where this run starts reading it.
    async fn parts(&self) -> Result<Vec<Part>, ReplayError> {
        let mut parts = Vec::new();
        for extent in self.reader.extents().await? {
            let checkpoint = checkpoint::name(&self.topic, extent.partition);
            let saved = self.pipeline.ledger().checkpoint(&checkpoint).await?;
            let (start, renewed) = checkpoint::start(saved, extent.low, extent.high);
            if renewed {
                warn!(
                    partition = extent.partition,
                    checkpoint = saved,
                    high = extent.high,
                    "The checkpoint is past the partition's end (the topic was created again?): reading it whole."
                );
            }
            parts.push(Part {
                extent,
                checkpoint,
                start,
            });
        }
        Ok(parts)
    }

    /// Reads one partition to its end, or to the first record that cannot
    /// be finished; writes its checkpoint either way.
    async fn run_part(
        &mut self,
        part: &Part,
        options: &Options,
        moves: bool,
        summary: &mut Summary,
        progress: &Progress,
        out: &mut impl Write,
    ) -> Result<(), ReplayError> {
        let partition = part.extent.partition;
        self.reader
            .assign(partition, part.start, part.extent.high)?;
        let mut cursor = Cursor::new(part.start, moves, Instant::now());
        let mut result: Result<(), ReplayError> = loop {
            let letter = match self.reader.next().await {
                Ok(Some(letter)) => letter,
                Ok(None) => {
                    // The end: every offset below it was read.
                    cursor.passed(part.extent.high - 1);
                    break Ok(());
                }
                Err(error) => break Err(error.into()),
            };
            let verdict = match self.judge(&letter, options).await {
                Ok(verdict) => verdict,
                Err(source) => {
                    break Err(ReplayError::Redeliver {
                        partition,
                        offset: letter.offset,
                        source,
                    });
                }
            };
            serde_json::to_writer(&mut *out, &Line::new(&letter, &verdict))
                .map_err(std::io::Error::from)?;
            writeln!(out)?;
            summary.count(&verdict);
            progress.update(summary.records, &summary.line());
            if verdict.is_final() {
                cursor.passed(letter.offset);
            } else {
                cursor.hold(letter.offset);
            }
            if let Some(next) = cursor.due(Instant::now(), false) {
                self.save(&part.checkpoint, next).await?;
                cursor.saved(next, Instant::now());
            }
        };
        if let Some(next) = cursor.due(Instant::now(), true) {
            let saved = self.save(&part.checkpoint, next).await;
            result = result.and(saved.map_err(ReplayError::from));
        }
        result
    }

    /// What becomes of one dead letter.
    async fn judge(
        &self,
        letter: &select::Letter,
        options: &Options,
    ) -> Result<Verdict, PipelineError> {
        Ok(
            match select::select(letter, &options.filter, &self.sources) {
                Selection::Skip(skip) => Verdict::Skipped(skip),
                Selection::Redeliver(delivery) if options.dry_run => {
                    Verdict::Planned(self.pipeline.plan_redelivery(&delivery).await?)
                }
                Selection::Redeliver(delivery) => {
                    Verdict::Redelivered(self.pipeline.redeliver(delivery).await?)
                }
            },
        )
    }

    async fn save(&self, checkpoint: &str, next: i64) -> Result<(), LedgerError> {
        self.pipeline
            .ledger()
            .commit(Commit::checkpoint(checkpoint, next))
            .await
    }
}
