//! The reconciler: reads what webhooks may have missed from the providers'
//! APIs and publishes it through the same pipeline.
//!
//! Both providers say retries do not guarantee arrival and there is no way to
//! resend a past event: the only catch-up is reading current data. Each
//! fetched record is normalized into the same schema (origin = reconciler,
//! version = fetch time), guarded and published by [`Pipeline::apply`], so a
//! record is written only when it differs from what the topic holds and a
//! reconcile never rolls an entity back.
//!
//! A source's API is read as jobs (entity type × outlet). Windowed jobs are
//! read in steps; the checkpoint (in the ledger) moves after each complete
//! step, so a crash resumes from the last one, and a page that fails after
//! its retries fails the run without moving it.

mod client;
mod mekari;
mod receiptroller;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{ApiConfig, Config, ReconcileConfig};
use crate::event::{EntityType, Origin, ProviderKind, Version};
use crate::ledger::{Commit, LedgerError};
use crate::metrics::{self, Outcome};
use crate::pipeline::{Pipeline, PipelineError};
use crate::providers::{self, Context};
use crate::shutdown::Every;

pub use client::{ApiClient, Auth, FetchError};

/// How a list is paged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paging {
    /// The API filters by a time window (ReceiptRoller transactions, Mekari orders).
    Window,
    /// The API lists newest first; stop once past the window's start.
    NewestFirst,
    /// The whole list, every run (products, collections).
    All,
}

/// One list to read for a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// What the list holds.
    pub entity_type: EntityType,
    /// The outlet it is read for, where the API is per outlet.
    pub outlet: Option<String>,
    /// How it pages.
    pub paging: Paging,
}

/// One page of records.
#[derive(Debug, Clone)]
pub struct Page {
    /// The entities' data, as in a webhook's `data`.
    pub records: Vec<Value>,
    /// How many pages the list has.
    pub total_pages: u32,
}

impl Page {
    /// Reads a page from an answer, at JSON pointers for the records and the page count.
    ///
    /// # Errors
    /// [`FetchError::Shape`] when either is missing.
    pub fn from_answer(
        url: &str,
        answer: &Value,
        records: &str,
        total_pages: &str,
    ) -> Result<Page, FetchError> {
        let shape = |reason: String| FetchError::Shape {
            url: url.to_owned(),
            reason,
        };
        Ok(Page {
            records: answer
                .pointer(records)
                .and_then(Value::as_array)
                .ok_or_else(|| shape(format!("no array at {records}")))?
                .clone(),
            total_pages: answer
                .pointer(total_pages)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| shape(format!("no page count at {total_pages}")))?,
        })
    }
}

/// A webhook's state as its provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookState {
    /// Delivering.
    Active,
    /// Switched off (ReceiptRoller) or paused (Mekari), with the provider's detail.
    Off(String),
    /// No webhook id / endpoint key configured for this source.
    NotWatched,
}

/// One provider's API, for one source.
#[async_trait]
pub trait Fetcher: Send + Sync {
    /// The lists to read.
    fn jobs(&self) -> Vec<Job>;
    /// One page of a list, for the window `[from, to)` where the list is windowed.
    async fn page(
        &self,
        job: &Job,
        from: OffsetDateTime,
        to: OffsetDateTime,
        page: u32,
    ) -> Result<Page, FetchError>;
    /// A record's time, for newest-first lists.
    fn record_time(&self, job: &Job, record: &Value) -> Option<OffsetDateTime>;
    /// The source's webhook state.
    async fn webhook_state(&self) -> Result<WebhookState, FetchError>;
    /// Switches the webhook back on, the provider's documented way, when the
    /// source is configured to (`resume_when_off`); `Ok(true)` if it did.
    async fn resume(&self) -> Result<bool, FetchError>;
}

/// Why a reconcile run failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API could not be read.
    #[error("{provider}/{source}: {error}")]
    Fetch {
        /// Provider.
        provider: ProviderKind,
        /// Source.
        source: String,
        /// What failed.
        #[source]
        error: FetchError,
    },
    /// A record could not be published or recorded.
    #[error("{provider}/{source}: {error}")]
    Publish {
        /// Provider.
        provider: ProviderKind,
        /// Source.
        source: String,
        /// What failed.
        #[source]
        error: PipelineError,
    },
    /// A checkpoint could not be read or written.
    #[error("checkpoint: {0}")]
    Ledger(#[from] LedgerError),
    /// No source with an `api` section matches the request.
    #[error("no source of {0} has an `api` section to reconcile")]
    NoSource(String),
}

/// What a run did, for logs and the terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Pages read.
    pub pages: u64,
    /// Records read.
    pub records: u64,
    /// Records published (new or changed state).
    pub published: u64,
    /// Records skipped because the topic already holds that state.
    pub unchanged: u64,
    /// Records older than what the topic holds.
    pub stale: u64,
    /// Records that could not be normalized, dead-lettered.
    pub dead_lettered: u64,
}

impl Summary {
    fn add(&mut self, other: Summary) {
        self.pages += other.pages;
        self.records += other.records;
        self.published += other.published;
        self.unchanged += other.unchanged;
        self.stale += other.stale;
        self.dead_lettered += other.dead_lettered;
    }
}

/// A source with an API to read.
struct SourceApi {
    provider: ProviderKind,
    name: String,
    account: Option<String>,
    fetcher: Box<dyn Fetcher>,
    /// One run per source at a time (scheduled, watchdog, CLI).
    running: Mutex<()>,
}

/// The reconciler handle. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    pipeline: Pipeline,
    sources: Arc<Vec<SourceApi>>,
    config: ReconcileConfig,
}

/// The configuration problems of one source's `api` section, as (field, problem).
pub fn api_problems(provider: ProviderKind, api: &ApiConfig) -> Vec<(&'static str, String)> {
    let (mut problems, paths): (_, &[(&str, &str)]) = match provider {
        ProviderKind::ReceiptRoller => {
            (receiptroller::problems(api), &receiptroller::DEFAULT_PATHS)
        }
        ProviderKind::Mekari => (mekari::problems(api), &mekari::DEFAULT_PATHS),
    };
    for name in api.paths.keys() {
        if !paths.iter().any(|(known, _)| known == name) {
            problems.push((
                "paths",
                format!(
                    "unknown path name `{name}`; use one of {}",
                    paths.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    if reqwest::Url::parse(&api.base_url).is_err() {
        problems.push(("base_url", format!("`{}` is not a URL", api.base_url)));
    }
    if api.per_page == 0 {
        problems.push(("per_page", "must be above 0".into()));
    }
    problems
}

/// A configured path, or the provider's default for `name`.
fn path(config: &ApiConfig, defaults: &[(&str, &str)], name: &str) -> String {
    config
        .paths
        .get(name)
        .cloned()
        .or_else(|| {
            defaults
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| (*p).to_owned())
        })
        .unwrap_or_else(|| format!("/{name}"))
}

/// RFC 3339 in UTC, as the list APIs take it.
fn rfc3339(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_default()
}

impl Reconciler {
    /// Builds a fetcher for every source with an `api` section.
    ///
    /// # Errors
    /// [`FetchError::Config`] when a client cannot be built.
    pub fn new(config: &Config, pipeline: Pipeline) -> Result<Reconciler, FetchError> {
        let timeout = Duration::from_millis(config.reconcile.request_timeout_ms);
        let mut sources = Vec::new();
        for provider in ProviderKind::ALL {
            for (name, source) in &config.provider(provider).sources {
                let Some(api) = &source.api else { continue };
                let auth = match provider {
                    ProviderKind::ReceiptRoller => {
                        Auth::Bearer(api.token.clone().ok_or_else(|| {
                            FetchError::Config(format!(
                                "{provider}.sources.{name}.api.token is missing"
                            ))
                        })?)
                    }
                    ProviderKind::Mekari => Auth::MekariHmac {
                        client_id: api.client_id.clone().unwrap_or_default(),
                        secret: api.client_secret.clone().ok_or_else(|| {
                            FetchError::Config(format!(
                                "{provider}.sources.{name}.api.client_secret is missing"
                            ))
                        })?,
                    },
                };
                let client =
                    ApiClient::new(&api.base_url, auth, config.reconcile.max_attempts, timeout)?;
                let fetcher: Box<dyn Fetcher> = match provider {
                    ProviderKind::ReceiptRoller => {
                        Box::new(receiptroller::ReceiptRollerApi::new(client, api.clone()))
                    }
                    ProviderKind::Mekari => Box::new(mekari::MekariApi::new(client, api.clone())),
                };
                sources.push(SourceApi {
                    provider,
                    name: name.clone(),
                    account: source.account.clone(),
                    fetcher,
                    running: Mutex::new(()),
                });
            }
        }
        Ok(Reconciler {
            pipeline,
            sources: Arc::new(sources),
            config: config.reconcile.clone(),
        })
    }

    /// Whether any source has an API to read.
    pub fn has_sources(&self) -> bool {
        !self.sources.is_empty()
    }

    /// Reads one window `[from, to)` for the matching sources, then returns.
    /// Checkpoints are left alone: an explicit window is an operator's choice.
    ///
    /// # Errors
    /// The first source's [`ReconcileError`]; the other sources still ran.
    pub async fn run_window(
        &self,
        provider: ProviderKind,
        source: Option<&str>,
        from: OffsetDateTime,
        to: OffsetDateTime,
    ) -> Result<Summary, ReconcileError> {
        let matching: Vec<&SourceApi> = self
            .sources
            .iter()
            .filter(|s| s.provider == provider && source.is_none_or(|n| n == s.name))
            .collect();
        if matching.is_empty() {
            return Err(ReconcileError::NoSource(match source {
                Some(name) => format!("{provider} named `{name}`"),
                None => provider.to_string(),
            }));
        }
        let mut total = Summary::default();
        let mut first_error = None;
        for source in matching {
            match self.run_source(source, Some((from, to))).await {
                Ok(summary) => total.add(summary),
                Err(error) => {
                    error!(%error, "Reconcile run failed.");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// Reads, for one source, everything since `since` (the watchdog's catch-up).
    ///
    /// # Errors
    /// As [`Reconciler::run_window`].
    pub async fn catch_up(
        &self,
        provider: ProviderKind,
        source: &str,
        since: OffsetDateTime,
    ) -> Result<Summary, ReconcileError> {
        self.run_window(provider, Some(source), since, OffsetDateTime::now_utc())
            .await
    }

    /// One scheduled pass: every source, from its checkpoints.
    ///
    /// # Errors
    /// The first source's failure; the others still ran.
    pub async fn run_due(&self) -> Result<Summary, ReconcileError> {
        let mut total = Summary::default();
        let mut first_error = None;
        for source in self.sources.iter() {
            match self.run_source(source, None).await {
                Ok(summary) => total.add(summary),
                Err(error) => {
                    error!(%error, "Reconcile run failed; its checkpoint did not move.");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// Runs [`Reconciler::run_due`] every `interval_secs` until `shutdown`.
    pub async fn run_scheduled(self, shutdown: CancellationToken) {
        let mut every = Every::new(Duration::from_secs(self.config.interval_secs), shutdown);
        while every.tick().await {
            if every.or_shutdown(self.run_due()).await.is_none() {
                return;
            }
        }
    }

    /// The sources with an API, for the watchdog: (provider, name, fetcher).
    pub fn watched(&self) -> impl Iterator<Item = (ProviderKind, &str, &dyn Fetcher)> {
        self.sources
            .iter()
            .map(|s| (s.provider, s.name.as_str(), s.fetcher.as_ref()))
    }

    /// When the watchdog last saw this source's webhook delivering, kept in
    /// the ledger so a catch-up after a restart still covers the whole gap.
    ///
    /// # Errors
    /// [`LedgerError`] when the ledger cannot be read.
    pub async fn last_seen_active(
        &self,
        provider: ProviderKind,
        source: &str,
    ) -> Result<Option<OffsetDateTime>, LedgerError> {
        let at = self
            .pipeline
            .ledger()
            .checkpoint(&format!("watchdog/{provider}/{source}"))
            .await?;
        Ok(at.and_then(|at| OffsetDateTime::from_unix_timestamp(at).ok()))
    }

    /// Records that the watchdog saw this source's webhook delivering at `at`.
    ///
    /// # Errors
    /// [`LedgerError`] when the ledger cannot be written.
    pub async fn mark_active(
        &self,
        provider: ProviderKind,
        source: &str,
        at: OffsetDateTime,
    ) -> Result<(), LedgerError> {
        self.pipeline
            .ledger()
            .commit(Commit {
                checkpoint: Some((format!("watchdog/{provider}/{source}"), at.unix_timestamp())),
                ..Commit::default()
            })
            .await
    }

    /// How far before a checkpoint (or a last-seen-active time) a run starts.
    pub fn lookback(&self) -> time::Duration {
        time::Duration::seconds(i64::try_from(self.config.lookback_secs).unwrap_or(i64::MAX))
    }

    async fn run_source(
        &self,
        source: &SourceApi,
        window: Option<(OffsetDateTime, OffsetDateTime)>,
    ) -> Result<Summary, ReconcileError> {
        let _one_at_a_time = source.running.lock().await;
        let progress = Progress::start(source.provider, &source.name);
        let mut total = Summary::default();
        let result = async {
            for job in source.fetcher.jobs() {
                total.add(self.run_job(source, &job, window, &progress).await?);
            }
            Ok(())
        }
        .await;
        let outcome = if result.is_ok() { "ok" } else { "failed" };
        ::metrics::counter!(metrics::RECONCILE_RUNS, metrics::PROVIDER => source.provider.as_str(), metrics::SOURCE => source.name.clone(), metrics::OUTCOME => outcome)
            .increment(1);
        progress.finish(&total);
        info!(
            provider = %source.provider,
            source = %source.name,
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
        source: &SourceApi,
        job: &Job,
        window: Option<(OffsetDateTime, OffsetDateTime)>,
        progress: &Progress,
    ) -> Result<Summary, ReconcileError> {
        let checkpoint = format!(
            "{}/{}/{}/{}",
            source.provider,
            source.name,
            job.outlet.as_deref().unwrap_or("-"),
            job.entity_type.plural()
        );
        let now = OffsetDateTime::now_utc();
        let (from, to, scheduled) = match window {
            Some((from, to)) => (from, to, false),
            None => {
                let ledger = self.pipeline.ledger();
                let from = match ledger.checkpoint(&checkpoint).await? {
                    Some(at) => {
                        OffsetDateTime::from_unix_timestamp(at).unwrap_or(now) - self.lookback()
                    }
                    None => {
                        now - time::Duration::seconds(
                            i64::try_from(self.config.initial_window_secs).unwrap_or(0),
                        )
                    }
                };
                (from, now, true)
            }
        };
        let steps: Vec<(OffsetDateTime, OffsetDateTime)> = if job.paging == Paging::Window {
            let step = time::Duration::seconds(
                i64::try_from(self.config.step_secs).unwrap_or(3600).max(1),
            );
            let mut steps = Vec::new();
            let mut start = from;
            while start < to {
                let end = (start + step).min(to);
                steps.push((start, end));
                start = end;
            }
            steps
        } else {
            vec![(from, to)]
        };
        let mut total = Summary::default();
        for (start, end) in steps {
            total.add(self.read_list(source, job, start, end, progress).await?);
            if scheduled {
                self.pipeline
                    .ledger()
                    .commit(Commit {
                        checkpoint: Some((checkpoint.clone(), end.unix_timestamp())),
                        ..Commit::default()
                    })
                    .await?;
            }
        }
        Ok(total)
    }

    async fn read_list(
        &self,
        source: &SourceApi,
        job: &Job,
        from: OffsetDateTime,
        to: OffsetDateTime,
        progress: &Progress,
    ) -> Result<Summary, ReconcileError> {
        let fetch_error = |error| ReconcileError::Fetch {
            provider: source.provider,
            source: source.name.clone(),
            error,
        };
        let mut summary = Summary::default();
        let mut page_number = 1;
        loop {
            let page = source
                .fetcher
                .page(job, from, to, page_number)
                .await
                .map_err(fetch_error)?;
            summary.pages += 1;
            let fetched_at = OffsetDateTime::now_utc();
            let mut past_window = false;
            for record in &page.records {
                if job.paging == Paging::NewestFirst
                    && source
                        .fetcher
                        .record_time(job, record)
                        .is_some_and(|t| t < from)
                {
                    past_window = true;
                    break;
                }
                summary.records += 1;
                let outcome = self
                    .publish(source, job.entity_type, record, fetched_at)
                    .await
                    .map_err(|error| ReconcileError::Publish {
                        provider: source.provider,
                        source: source.name.clone(),
                        error,
                    })?;
                match outcome {
                    Outcome::Published => summary.published += 1,
                    Outcome::Stale => summary.stale += 1,
                    Outcome::DeadLettered => summary.dead_lettered += 1,
                    _ => summary.unchanged += 1,
                }
                ::metrics::counter!(metrics::RECONCILE_RECORDS, metrics::PROVIDER => source.provider.as_str(), metrics::SOURCE => source.name.clone(), metrics::OUTCOME => outcome.as_str())
                    .increment(1);
            }
            progress.update(&summary);
            if past_window || page_number >= page.total_pages || page.records.is_empty() {
                return Ok(summary);
            }
            page_number += 1;
        }
    }

    async fn publish(
        &self,
        source: &SourceApi,
        entity_type: EntityType,
        record: &Value,
        fetched_at: OffsetDateTime,
    ) -> Result<Outcome, PipelineError> {
        let raw = record.to_string();
        let event_id = format!("reconcile:{}", Version::new(fetched_at, 0).at_micros);
        let ctx = Context {
            event_id: &event_id,
            source: &source.name,
            account: source.account.as_deref(),
            received_at: fetched_at,
            raw: &raw,
            origin: Origin::Reconciler,
        };
        match providers::for_kind(source.provider).normalize_record(entity_type, record, &ctx) {
            Ok(mut event) => {
                event.event_id = format!("{event_id}:{}", event.key());
                self.pipeline.apply(event, None).await
            }
            Err(reason) => {
                warn!(provider = %source.provider, source = %source.name, %reason, "Fetched record cannot be normalized.");
                self.pipeline
                    .dead_letter_raw(
                        source.provider,
                        &source.name,
                        &event_id,
                        fetched_at,
                        raw.into_bytes(),
                        reason.code(),
                        &reason.to_string(),
                    )
                    .await?;
                Ok(Outcome::DeadLettered)
            }
        }
    }
}

/// Progress of one run: a live line on a terminal, periodic logs otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    label: String,
    last_log: std::sync::Mutex<std::time::Instant>,
}

/// How often a run without a terminal logs its progress.
const PROGRESS_LOG_EVERY: Duration = Duration::from_secs(10);

impl Progress {
    fn start(provider: ProviderKind, source: &str) -> Progress {
        use std::io::IsTerminal;
        let label = format!("{provider}/{source}");
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {prefix} {elapsed} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_prefix(label.clone());
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            label,
            last_log: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }

    fn line(summary: &Summary) -> String {
        format!(
            "pages {} · records {} · published {} · not newer {} · stale {} · dead-lettered {}",
            summary.pages,
            summary.records,
            summary.published,
            summary.unchanged,
            summary.stale,
            summary.dead_lettered
        )
    }

    fn update(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.set_message(Self::line(summary));
            return;
        }
        let mut last = self
            .last_log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.elapsed() >= PROGRESS_LOG_EVERY {
            *last = std::time::Instant::now();
            info!(run = %self.label, progress = %Self::line(summary), "Reconciling.");
        }
    }

    fn finish(&self, summary: &Summary) {
        if let Some(bar) = &self.bar {
            bar.finish_with_message(Self::line(summary));
        }
    }
}
