//! One source's run: its jobs in turn, each job's window in steps (the
//! checkpoint moved after each complete step of a scheduled run), each
//! step's list read page by page within the run's [`Budget`], and each
//! record published through the pipeline (or dead-lettered). Apart from
//! `mod.rs`, which holds which sources there are and which runs to make.

use serde_json::Value;
use time::OffsetDateTime;
use tracing::info;

use super::budget::Budget;
use super::summary::Summary;
use super::{ApiSource, ReconcileError, Reconciler, reconciled, window};
use crate::adapters::ledger::Commit;
use crate::adapters::providers::api::{Job, Paging};
use crate::domain::event::{EntityType, Source};
use crate::observe::board::{ReconcileRun, Window};
use crate::observe::progress::Progress;
use crate::observe::telemetry;
use crate::services::pipeline::{DeadLetter, Outcome, PipelineError};

/// The `outcome` of a run that read its whole window.
const RUN_OK: &str = "ok";
/// The `outcome` of a run that stopped on an error (its checkpoint kept).
const RUN_FAILED: &str = "failed";
/// What a reconciled record can come to (the guard never sees a duplicate
/// delivery or spools a record read from an API).
const RECORD_OUTCOMES: [Outcome; 4] = [
    Outcome::Published,
    Outcome::Unchanged,
    Outcome::Stale,
    Outcome::DeadLettered,
];

impl Reconciler {
    pub(super) async fn run_source(
        &self,
        source: &ApiSource,
        window: Option<(OffsetDateTime, OffsetDateTime)>,
    ) -> Result<Summary, ReconcileError> {
        let _one_at_a_time = source.running.lock().await;
        let progress = Progress::start(
            format!("reconcile {}", source.source),
            "records",
            None,
            self.live_progress,
        );
        let mut total = Summary::default();
        let mut budget = Budget::new(&self.config);
        let result: Result<(), ReconcileError> = async {
            for job in source.api.jobs() {
                total.add(
                    self.run_job(source, &job, window, &mut budget, &progress)
                        .await?,
                );
            }
            Ok(())
        }
        .await;
        let outcome = if result.is_ok() { RUN_OK } else { RUN_FAILED };
        let provider = source.source.provider;
        metrics::counter!(
            telemetry::RECONCILE_RUNS,
            telemetry::PROVIDER => provider.as_str(),
            telemetry::SOURCE => source.source.name.clone(),
            telemetry::OUTCOME => outcome
        )
        .increment(1);
        progress.finish(total.records, &total.line());
        if let Some(board) = &self.board {
            board.reconciled(
                provider,
                &source.source.name,
                ReconcileRun {
                    window: window.map(|(from, to)| Window { from, to }),
                    finished_at: OffsetDateTime::now_utc(),
                    records: total.records,
                    published: total.published,
                    dead_lettered: total.dead_lettered,
                    result: match &result {
                        Ok(()) => "ok".to_owned(),
                        Err(error) => error.to_string(),
                    },
                },
            );
        }
        info!(
            %provider,
            source = %source.source.name,
            outcome,
            pages = total.pages,
            records = total.records,
            published = total.published,
            unchanged = total.unchanged,
            stale = total.stale,
            dead_lettered = total.dead_lettered,
            "Reconcile run finished."
        );
        result.map(|()| total)
    }

    async fn run_job(
        &self,
        source: &ApiSource,
        job: &Job,
        window: Option<(OffsetDateTime, OffsetDateTime)>,
        budget: &mut Budget,
        progress: &Progress,
    ) -> Result<Summary, ReconcileError> {
        let checkpoint = window::checkpoint_name(&source.source, job);
        let (from, to, scheduled) = match window {
            Some((from, to)) => (from, to, false),
            None => {
                let now = OffsetDateTime::now_utc();
                let at = self.ledger().checkpoint(&checkpoint).await?;
                (window::scheduled_start(at, now, &self.config), now, true)
            }
        };
        let mut total = Summary::default();
        for (start, end) in window::steps(from, to, job.paging, self.config.step_secs) {
            total.add(
                self.read_list(source, job, (start, end), budget, progress)
                    .await?,
            );
            if scheduled {
                self.ledger()
                    .commit(Commit::checkpoint(checkpoint.clone(), end.unix_timestamp()))
                    .await?;
            }
        }
        Ok(total)
    }

    async fn read_list(
        &self,
        source: &ApiSource,
        job: &Job,
        (from, to): (OffsetDateTime, OffsetDateTime),
        budget: &mut Budget,
        progress: &Progress,
    ) -> Result<Summary, ReconcileError> {
        let provider = source.source.provider;
        let mut summary = Summary::default();
        let mut page_number = 1;
        loop {
            budget.take_page(&source.source)?;
            // Dropping a fetch at the deadline is harmless: it only reads.
            let page = tokio::time::timeout_at(
                budget.deadline,
                source.api.page(job, from, to, page_number),
            )
            .await
            .map_err(|_| budget.too_long(&source.source))?
            .map_err(|error| ReconcileError::Fetch {
                provider,
                source: source.source.name.clone(),
                error,
            })?;
            summary.pages += 1;
            let fetched_at = OffsetDateTime::now_utc();
            let mut past_window = false;
            for record in &page.records {
                if job.paging == Paging::NewestFirst
                    && source
                        .api
                        .record_time(job, record)
                        .is_some_and(|t| t < from)
                {
                    past_window = true;
                    break;
                }
                // Checked before a record, never during one: a publish is
                // not cut between Kafka's acknowledgement and the ledger.
                budget.check_time(&source.source)?;
                summary.records += 1;
                let outcome = self
                    .publish(&source.source, job.entity_type, record, fetched_at)
                    .await
                    .map_err(|error| ReconcileError::Publish {
                        provider,
                        source: source.source.name.clone(),
                        error,
                    })?;
                summary.count(outcome);
                metrics::counter!(
                    telemetry::RECONCILE_RECORDS,
                    telemetry::PROVIDER => provider.as_str(),
                    telemetry::SOURCE => source.source.name.clone(),
                    telemetry::OUTCOME => outcome.as_str()
                )
                .increment(1);
            }
            progress.update(summary.records, &summary.line());
            if past_window || page_number >= page.total_pages || page.records.is_empty() {
                return Ok(summary);
            }
            page_number += 1;
        }
    }

    async fn publish(
        &self,
        source: &Source,
        entity_type: EntityType,
        record: &Value,
        fetched_at: OffsetDateTime,
    ) -> Result<Outcome, PipelineError> {
        match reconciled(source, entity_type, record, fetched_at) {
            Ok(normalized) => self.pipeline.apply(normalized).await,
            Err(refused) => {
                self.pipeline
                    .dead_letter(DeadLetter {
                        provider: source.provider,
                        source: &source.name,
                        topic_prefix: source.topic_prefix.as_deref(),
                        delivery_id: &refused.event_id,
                        received_at: fetched_at,
                        body: refused.raw.into(),
                        code: refused.reason.code(),
                        reason: refused.reason.to_string(),
                    })
                    .await?;
                Ok(Outcome::DeadLettered)
            }
        }
    }
}

/// Makes a source's run and record counters exist at 0.
pub(super) fn announce_source_series(source: &Source) {
    let (provider, name) = (source.provider.as_str(), &source.name);
    for outcome in [RUN_OK, RUN_FAILED] {
        metrics::counter!(
            telemetry::RECONCILE_RUNS,
            telemetry::PROVIDER => provider,
            telemetry::SOURCE => name.clone(),
            telemetry::OUTCOME => outcome
        )
        .increment(0);
    }
    for outcome in RECORD_OUTCOMES {
        metrics::counter!(
            telemetry::RECONCILE_RECORDS,
            telemetry::PROVIDER => provider,
            telemetry::SOURCE => name.clone(),
            telemetry::OUTCOME => outcome.as_str()
        )
        .increment(0);
    }
}
