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
//!
//! A run is bounded ([`Budget`]): at most `max_pages_per_run` pages and
//! `max_run_secs`, so a list whose pages never end, or an API that answers
//! ever more slowly, fails the run (counted, for the alert) instead of
//! holding the source's runs and the watchdog's catch-ups for ever.
//!
//! Nothing here names a provider: each provider's API sits behind
//! [`ProviderApi`] in its own folder under `providers/`. `window.rs` holds
//! the time arithmetic.

mod budget;
mod record;
mod run;
mod summary;
mod window;

use std::sync::Arc;

use arc_swap::ArcSwap;
use time::OffsetDateTime;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::adapters::ledger::{Ledger, LedgerError};
use crate::adapters::providers;
use crate::adapters::providers::api::{ApiOptions, FetchError, ProviderApi};
use crate::config::{Config, OnBrokerUnavailable, ReconcileConfig, SourceEntry};
use crate::domain::event::{ProviderKind, Source};
use crate::observe::Board;
use crate::services::pipeline::{Pipeline, PipelineError};
use crate::services::ticker::Every;

pub use budget::RunLimit;
pub(crate) use record::reconciled;
use run::announce_source_series;
pub use summary::Summary;

/// How a reconciled record's derived id begins (`reconcile:{µs}`): its body
/// is an API record, not a webhook (the dead-letter replay leaves it to the
/// next reconcile of its window).
pub(crate) const RECONCILED_ID_PREFIX: &str = "reconcile:";

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
    /// The run reached one of its bounds.
    #[error("{provider}/{source}: {limit}")]
    Limit {
        /// Provider.
        provider: ProviderKind,
        /// Source.
        source: String,
        /// Which bound.
        #[source]
        limit: RunLimit,
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
    /// A source's API cannot be set up from its `api` table.
    #[error("{key}.api: {error}")]
    Setup {
        /// The source's key path, e.g. `mekari.sources.main`.
        key: String,
        /// What is unusable.
        #[source]
        error: FetchError,
    },
}

/// A source with an API to read.
pub struct ApiSource {
    /// Which source (provider, name, account).
    source: Arc<Source>,
    /// Its provider's API for its account.
    api: Box<dyn ProviderApi>,
    /// One run per source at a time (scheduled, watchdog, CLI).
    running: Mutex<()>,
    /// The digest of its file, for a source of the sources directory: an
    /// unchanged file keeps its API client (and its run in progress).
    file: Option<[u8; 32]>,
    /// Whether its webhooks are spooled while Kafka is away.
    spools: bool,
}

impl ApiSource {
    /// Which source.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Its provider's API.
    pub fn api(&self) -> &dyn ProviderApi {
        self.api.as_ref()
    }

    /// Whether its webhooks are spooled while Kafka is away
    /// (`on_broker_unavailable = "spool"`).
    pub fn spools(&self) -> bool {
        self.spools
    }
}

/// A sources directory's source with an `api` table, for
/// [`Reconciler::replace_file_sources`].
pub struct FileApi<'a> {
    /// The source (provider, name, account).
    pub entry: SourceEntry<'a>,
    /// Its file's digest.
    pub digest: [u8; 32],
}

/// The reconciler handle. Cheap to clone.
#[derive(Clone)]
pub struct Reconciler {
    /// Where fetched records go, as webhooks do.
    pipeline: Pipeline,
    /// Every source with an `api` section: the main file's, fixed, and a
    /// sources directory's, replaced whole as its files change.
    sources: Arc<ArcSwap<Vec<Arc<ApiSource>>>>,
    /// How the APIs are reached, for sources that appear while running.
    options: ApiOptions,
    /// Windows, steps, schedule.
    config: ReconcileConfig,
    /// Draw a live progress line on a terminal (the one-shot command only).
    live_progress: bool,
    /// Where finished runs and webhook checks are shown to the operator.
    board: Option<Board>,
}

impl Reconciler {
    /// Connects the API of every source with an `api` section.
    ///
    /// # Errors
    /// [`ReconcileError::Setup`] naming the source whose API settings or
    /// client are unusable.
    pub fn new(config: &Config, pipeline: Pipeline) -> Result<Reconciler, ReconcileError> {
        let options = ApiOptions::new(&config.reconcile);
        let mut sources = Vec::new();
        for entry in config.sources() {
            if let Some(source) = api_source(entry, None, &options)? {
                sources.push(Arc::new(source));
            }
        }
        Ok(Reconciler {
            pipeline,
            sources: Arc::new(ArcSwap::from_pointee(sources)),
            options,
            config: config.reconcile.clone(),
            live_progress: false,
            board: None,
        })
    }

    /// Shows each run's progress as a live line when stderr is a terminal,
    /// for the one-shot `reconcile` command (inside `serve` the terminal
    /// belongs to the log).
    pub fn with_live_progress(mut self) -> Reconciler {
        self.live_progress = true;
        self
    }

    /// Shows finished runs (and the watchdog's checks) on the status board.
    pub fn with_board(mut self, board: Board) -> Reconciler {
        self.board = Some(board);
        self
    }

    /// The status board, when there is one.
    pub fn board(&self) -> Option<&Board> {
        self.board.as_ref()
    }

    /// Whether any source has an API to read.
    pub fn has_sources(&self) -> bool {
        !self.sources.load().is_empty()
    }

    /// Puts a sources directory's sources with an `api` table in use, in
    /// place of those of the read before; the main file's stay. An unchanged
    /// file keeps its source as it runs; a removed one's run in progress
    /// ends at its window's end (checkpointed as any run), and none starts.
    /// A source whose client cannot be made is said and left out.
    pub fn replace_file_sources<'a>(&self, files: impl IntoIterator<Item = FileApi<'a>>) {
        let current = self.sources.load_full();
        let mut next: Vec<Arc<ApiSource>> = current
            .iter()
            .filter(|s| s.file.is_none())
            .cloned()
            .collect();
        for FileApi { entry, digest } in files {
            let kept = current.iter().find(|s| {
                s.file == Some(digest)
                    && s.source.provider == entry.provider
                    && s.source.name == entry.name
            });
            if let Some(kept) = kept {
                next.push(kept.clone());
                continue;
            }
            match api_source(entry, Some(digest), &self.options) {
                Ok(Some(source)) => {
                    announce_source_series(&source.source);
                    next.push(Arc::new(source));
                }
                Ok(None) => {}
                Err(error) => error!(%error, "A source's API is left out: it is not reconciled."),
            }
        }
        self.sources.store(Arc::new(next));
    }

    /// The ledger the pipeline writes, for the watchdog's own marks.
    pub fn ledger(&self) -> &Ledger {
        self.pipeline.ledger()
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
        let matching: Vec<Arc<ApiSource>> = self
            .sources
            .load()
            .iter()
            .filter(|s| s.source.provider == provider && source.is_none_or(|n| n == s.source.name))
            .cloned()
            .collect();
        if matching.is_empty() {
            return Err(ReconcileError::NoSource(match source {
                Some(name) => format!("{provider} named `{name}`"),
                None => provider.to_string(),
            }));
        }
        self.run_sources(matching, Some((from, to))).await
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
        self.run_sources(self.sources.load().to_vec(), None).await
    }

    /// Runs each source in turn and returns the total or the first failure;
    /// later failures, which the caller never sees, are logged here, so each
    /// failure is said once. `window` `None` reads from the checkpoints.
    async fn run_sources(
        &self,
        sources: Vec<Arc<ApiSource>>,
        window: Option<(OffsetDateTime, OffsetDateTime)>,
    ) -> Result<Summary, ReconcileError> {
        let mut total = Summary::default();
        let mut first_error = None;
        for source in sources {
            match self.run_source(&source, window).await {
                Ok(summary) => total.add(summary),
                Err(error) if first_error.is_none() => first_error = Some(error),
                Err(error) => error!(%error, "Reconcile run failed."),
            }
        }
        first_error.map_or(Ok(total), Err)
    }

    /// Runs [`Reconciler::run_due`] every `interval_secs` until `shutdown`.
    /// A failed source keeps its checkpoint and is read again next time.
    pub async fn run_scheduled(self, shutdown: CancellationToken) {
        self.announce_series();
        let interval = std::time::Duration::from_secs(self.config.interval_secs);
        let mut every = Every::new(interval, shutdown);
        while every.tick().await {
            match every.or_shutdown(self.run_due()).await {
                None => return,
                Some(Err(error)) => {
                    error!(%error, "Reconcile run failed; its checkpoint did not move.");
                }
                Some(Ok(_)) => {}
            }
        }
    }

    /// Makes each source's run and record counters exist at 0 before the
    /// first run, so that a first failed run shows in a `rate()`.
    fn announce_series(&self) {
        for source in self.sources.load().iter() {
            announce_source_series(&source.source);
        }
    }

    /// The sources with an API now, for the watchdog.
    pub fn watched(&self) -> Arc<Vec<Arc<ApiSource>>> {
        self.sources.load_full()
    }

    /// How far before a checkpoint (or a last-seen-active time) a run starts.
    pub fn lookback(&self) -> time::Duration {
        window::lookback(&self.config)
    }

    /// Whether Kafka answers now: this process's producer has not seen it
    /// away and a metadata request is answered within `timeout`. Asked, not
    /// only the last send's word, since a `posbridge reconciler` process
    /// sends nothing while the outage lasts.
    pub async fn broker_reachable(&self, timeout: std::time::Duration) -> bool {
        self.pipeline.producer().broker_reachable(timeout).await
    }

    /// Whether the spool would take one more delivery now.
    pub fn spool_has_room(&self) -> bool {
        self.pipeline
            .spool()
            .is_some_and(|spool| spool.stats().has_room)
    }
}

/// `entry`'s API source, when it has an `api` table: its provider's client
/// connected with `options`, and `file`, the digest of its file in the
/// sources directory (none for a source of the configuration file).
fn api_source(
    entry: SourceEntry<'_>,
    file: Option<[u8; 32]>,
    options: &ApiOptions,
) -> Result<Option<ApiSource>, ReconcileError> {
    let Some(api) = &entry.config.api else {
        return Ok(None);
    };
    let api = providers::for_kind(entry.provider)
        .connect_api(api, options)
        .map_err(|error| ReconcileError::Setup {
            key: entry.key(),
            error,
        })?;
    Ok(Some(ApiSource {
        source: Arc::new(entry.source()),
        api,
        running: Mutex::new(()),
        file,
        spools: entry.config.on_broker_unavailable == OnBrokerUnavailable::Spool,
    }))
}
