//! Start-up: turns a checked [`Config`] into a running service.
//!
//! Every connection is opened and checked here, once, so a mistake (a wrong
//! broker address, an incompatible schema, a locked ledger file) stops the
//! service with a message before it accepts a single webhook. `check.rs`
//! holds the checks that need provider knowledge, shared with `check-config`.

mod check;
pub mod files;
mod first_fill;
mod kafka_ready;
mod known;
pub mod lookup;
pub mod partitions;
pub mod schema;
mod serve;
pub mod sources;
mod topics;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::adapters::encode::EncodeError;
use crate::adapters::ledger::{self, LedgerError};
use crate::adapters::providers::NormalizeError;
use crate::adapters::publish::{Producer, PublishError, Publisher, TopicSets};
use crate::adapters::secrets::{LoadError, ReloadRequest, SecretFiles};
use crate::adapters::spool::{Spool, SpoolError};
use crate::adapters::store_file::StoreFileError;
use crate::config::Config;
use crate::domain::event::ProviderKind;
use crate::http::ingress::{self, AppState, ConnectionLimits, SourceMap};
use crate::observe::Board;
use crate::observe::delivery;
use crate::observe::telemetry;
use crate::observe::traces::{TraceError, Traces};
use crate::services::pipeline::{Pipeline, Stages, Timing};
use crate::services::reconcile::{FileApi, ReconcileError, Reconciler};
use first_fill::FirstFill;
use sources::Sources;

pub use check::{load, problems, webhook_source};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The ledger could not be opened.
    #[error("cannot open the ledger")]
    Ledger(#[from] LedgerError),
    /// The producer could not be created or the topics could not be
    /// ensured; the headline names Kafka's answer (a denied ACL, a refused
    /// replication factor), "cannot reach" only when none came.
    #[error("{}", .0.headline())]
    Kafka(#[from] PublishError),
    /// The schema registry refused the schema or could not be reached.
    #[error("the schema registry did not take the schema")]
    Registry(#[from] EncodeError),
    /// Records cannot be read back with the registry's schemas (its
    /// client's settings).
    #[error("cannot read records back through the schema registry")]
    Reader(#[from] crate::adapters::encode::WriterError),
    /// The outage spool could not be opened.
    #[error("cannot open the spool")]
    Spool(#[from] SpoolError),
    /// The trace exporter refused its settings.
    #[error("cannot export traces")]
    Traces(#[from] TraceError),
    /// The sources directory cannot be listed.
    #[error(transparent)]
    SourcesDir(#[from] sources::DirError),
    /// A source's secret file cannot be read, or a secret does not fit its
    /// signature scheme.
    #[error("{key}.{}: {source}", .source.key())]
    Secret {
        /// Config key of the source.
        key: String,
        /// What is wrong.
        #[source]
        source: LoadError,
    },
}

impl BuildError {
    /// What to check, in the operator's terms, for the start-up message.
    pub fn hint(&self) -> &'static str {
        match self {
            BuildError::Ledger(LedgerError::File(StoreFileError::Held { .. }))
            | BuildError::Spool(SpoolError::File(StoreFileError::Held { .. })) => {
                "another process has the file open: it is not damaged, do not move it aside; stop that process first (one posbridge process per ledger or spool file), or give this one files of its own"
            }
            // A damaged file is set aside at start-up: what stops it is the
            // file's directory, permissions or disk, or a redb format this
            // build does not read.
            BuildError::Ledger(LedgerError::File(_)) | BuildError::Spool(SpoolError::File(_)) => {
                "the file cannot be read (its directory, permissions or disk; a damaged file would have been set aside and a new one started): `posbridge ledger check` reads both files"
            }
            BuildError::Ledger(_) => {
                "check ledger.path or ledger.redis_url; the embedded ledger allows one posbridge process per ledger file (run the reconciler inside `serve` with reconcile.enabled, or share a Redis ledger with ledger.backend = \"redis\")"
            }
            BuildError::Kafka(error) => error.hint(),
            BuildError::Reader(_) => {
                "check schema_registry's TLS and credential settings (its CA file, user, token)"
            }
            BuildError::Registry(_) => {
                "check schema_registry.url and its credentials; a refused schema must be made compatible with the subject's latest version (posbridge schema check)"
            }
            BuildError::Spool(_) => "check spool.path; one posbridge process per spool file",
            BuildError::Traces(_) => "check telemetry.otlp (endpoint, headers)",
            BuildError::SourcesDir(_) => {
                "check sources_dir: it names a directory posbridge may list (its files are checked one by one, and a bad one is refused alone)"
            }
            BuildError::Secret {
                source: LoadError::Read(_),
                ..
            } => "check that the secret files exist and posbridge may read them",
            BuildError::Secret { .. } => "fix the secret in the configuration or its file",
        }
    }
}

/// Makes the series an alert watches exist from start-up at 0 (a `rate()`
/// or an absence alert needs the series before the first event), and sets
/// `posbridge_build_info{version, encoding}` to 1.
fn announce_series(sources: &SourceMap, encoding: &'static str) {
    for webhook in sources.values() {
        sources::announce(webhook);
    }
    let dead_letter_codes: Vec<&'static str> = NormalizeError::CODES
        .into_iter()
        .chain(crate::adapters::publish::REFUSAL_CODES)
        .chain([crate::services::drain::SPOOL_UNPUBLISHABLE])
        .collect();
    for provider in ProviderKind::ALL {
        delivery::announce_provider(provider, &dead_letter_codes);
        metrics::counter!(telemetry::PUBLISH_FAILURES, telemetry::PROVIDER => provider.as_str(), telemetry::KIND => "retryable")
            .increment(0);
    }
    metrics::counter!(telemetry::LEDGER_TOPICS_REPLACED).increment(0);
    metrics::gauge!(
        telemetry::BUILD_INFO,
        telemetry::VERSION => env!("CARGO_PKG_VERSION"),
        telemetry::ENCODING => encoding
    )
    .set(1.0);
}

/// The reconciler of `config`'s sources with an `api` table and of
/// `sources`' directory's, as [`App::reconciler`] makes it, from the pieces
/// of a running app.
///
/// # Errors
/// As [`App::reconciler`].
pub fn reconciler(
    config: &Config,
    pipeline: &Pipeline,
    board: &Board,
    sources: &Sources,
) -> Result<Reconciler, ReconcileError> {
    let reconciler = Reconciler::new(config, pipeline.clone())?.with_board(board.clone());
    let taking = reconciler.clone();
    sources.on_change(move |files| {
        taking.replace_file_sources(files.iter().map(|file| FileApi {
            entry: file.entry(),
            digest: file.digest,
        }));
    });
    Ok(reconciler)
}

/// A built service: the pieces `serve` runs.
#[derive(Clone)]
pub struct App {
    /// The HTTP state (holds the pipeline).
    state: AppState,
    /// The producer the pipeline hands its records to.
    publisher: Publisher,
    /// Shutdown budget for the producer flush.
    shutdown_timeout: Duration,
    /// `server.drain_delay_ms`: how long the webhooks are still answered
    /// after the shutdown signal (see [`App::leave_after`]).
    drain_delay: Duration,
    /// The sources whose secrets come from files, read again while serving.
    secret_files: SecretFiles,
    /// The sources in use, a sources directory's read again while serving.
    sources: Sources,
    /// The topics in use: the shared ones and the sources' own.
    topics: TopicSets,
    /// Finds an entity's records (`posbridge lookup`, `/admin/entities`).
    lookup: crate::services::lookup::Lookup,
    /// The ledger's rebuild task, ended by `serve` or when the last clone
    /// goes.
    rebuild: Arc<serve::RebuildTask>,
}

impl App {
    /// Opens the ledger (and the spool, when a source spools), creates the
    /// producer and topics, registers the schema, and builds every source's
    /// verifier: everything `serve` needs.
    ///
    /// # Errors
    /// A [`BuildError`] naming what failed.
    pub async fn build(config: &Config) -> Result<App, BuildError> {
        // Before the spool opens: the gauges it sets then are kept.
        crate::observe::telemetry::install();
        let spool = config
            .spools()
            .then(|| Spool::open(&config.spool))
            .transpose()?;
        Self::build_with(config, spool, FirstFill::Briefly).await
    }

    /// As [`App::build`], without the spool: for the catch-up commands
    /// (`reconcile`, `reconciler`), which accept no webhooks and so may run
    /// beside `serve` (with the Redis ledger) while `serve` holds the spool.
    ///
    /// # Errors
    /// A [`BuildError`] naming what failed.
    pub async fn build_for_catch_up(config: &Config) -> Result<App, BuildError> {
        Self::build_with(config, None, FirstFill::Whole).await
    }

    async fn build_with(
        config: &Config,
        spool: Option<Spool>,
        first_fill: FirstFill,
    ) -> Result<App, BuildError> {
        // First, so every series recorded from here on is kept.
        let metrics = crate::observe::telemetry::install();
        let kafka = &config.kafka;
        let inflight_wait = Duration::from_millis(config.server.inflight_wait_ms);
        // A lease outlives the longest a delivery can legitimately take.
        let opened =
            ledger::open(&config.ledger, kafka.delivery_timeout() * 2 + inflight_wait).await?;
        let ledger = opened.ledger.clone();

        let topics = TopicSets::new(kafka);
        let publisher = Publisher::new(kafka, config.max_record_bytes())?;
        let cached = opened.ledger.fill().cached().await?;
        // The partitions the ledger's checkpoint kept: a topic grown while
        // posbridge was stopped is refused from the start, as while running
        // (the rebuild lets go of them if the ledger cached other topics).
        if let Some(seen) = cached.as_ref().and_then(|c| c.topics.as_ref()) {
            publisher.keep_partitions(&seen.partitions());
        }
        for prefix in topics::at_start(config, cached.as_ref()) {
            topics.open(&prefix);
        }
        let (reachable, encoder) = kafka_ready::ready(config, &publisher, &topics).await?;

        let mut sources = HashMap::new();
        let mut secret_files = SecretFiles::new(config.server.secrets_recheck());
        for entry in config.sources() {
            let webhook = webhook_source(entry).map_err(|source| BuildError::Secret {
                key: entry.key(),
                source,
            })?;
            secret_files.add(entry, check::signature(entry).0, &webhook.verifier);
            sources.insert((entry.provider, entry.name.to_owned()), webhook);
        }

        let traces = Traces::start(&config.telemetry.otlp)?;
        if let Some(url) = config.telemetry.otlp.traces_url() {
            info!(%url, "Exporting a trace of every delivery over OTLP.");
        }
        announce_series(&sources, encoder.name());
        let board = Board::new(sources.keys().cloned());
        // Start-up reads its files on this thread, as it read the main
        // file; their own topics are opened before the ledger's fill looks
        // at the topics in use.
        let own_topics =
            topics::OwnTopics::new(topics.clone(), publisher.clone(), encoder.clone(), config);
        let owners = sources::Owners::in_ledger(ledger.clone());
        let sources = Sources::start(config, sources, board.clone(), own_topics, owners).await?;
        let pipeline = Pipeline::new(
            Stages {
                ledger,
                encoder,
                producer: Producer::Kafka(publisher.clone()),
                topics: topics.clone(),
                spool,
                traces,
            },
            Timing {
                inflight_wait,
                answer_budget: kafka.delivery_timeout() + inflight_wait,
                max_event_ahead: config.server.max_event_ahead(),
            },
        );
        let lookup =
            crate::services::lookup::Lookup::new(config, opened.ledger.clone(), topics.clone())?;
        // Filled from the topics in the background, the gate closed until
        // then: a start-up read of the last seconds is waited for here, a
        // long one (a lost ledger) is served through (spool or 503).
        // Started last: a start-up that fails before lets go of the ledger.
        let background = CancellationToken::new();
        let rebuild = tokio::spawn(
            crate::services::rebuild::Rebuild::new(
                Arc::new(crate::services::rebuild::Kafka::new(
                    kafka,
                    publisher.clone(),
                )),
                &topics,
                opened.ledger.clone(),
                opened.gate.clone(),
                Duration::from_secs(config.ledger.dedup_ttl_secs),
            )
            .run(background.clone()),
        );
        first_fill.wait(&opened.gate, reachable).await;
        Ok(App {
            state: AppState {
                sources: sources.live(),
                pipeline,
                body_limit: config.server.body_limit_bytes,
                body_read_timeout: Duration::from_millis(config.server.body_read_timeout_ms),
                body_budget: Arc::new(tokio::sync::Semaphore::new(
                    config.server.max_body_bytes_in_flight,
                )),
                connections: ConnectionLimits {
                    header_read_timeout: Duration::from_millis(
                        config.server.header_read_timeout_ms,
                    ),
                    max_connections: config.server.max_connections,
                    shutdown_timeout: Duration::from_millis(config.server.shutdown_timeout_ms),
                    retry_after_secs: config.server.retry_after_secs,
                },
                retry_after_secs: config.server.retry_after_secs,
                shares: ingress::FairShares::new(ingress::ShareSettings {
                    busy: config.server.busy_in_flight,
                    default_share: config.server.share_in_flight,
                    default_rate: config.server.share_per_second,
                    retry_after_secs: config.server.share_retry_after_secs,
                }),
                // What the answer budget keeps beyond Kafka's deadline:
                // taken in then, a delivery still has Kafka's whole deadline.
                share_wait: inflight_wait,
                metrics,
                board,
                leaving: ingress::Leaving::default(),
            },
            publisher,
            shutdown_timeout: Duration::from_millis(config.server.shutdown_timeout_ms),
            drain_delay: config.server.drain_delay(),
            secret_files,
            sources,
            topics,
            lookup,
            rebuild: Arc::new(serve::RebuildTask::new(background, rebuild)),
        })
    }

    /// Asks the running `serve` to read every source's secret files again
    /// (`main` asks on SIGHUP).
    pub fn secrets_reload(&self) -> ReloadRequest {
        self.secret_files.reload_request()
    }

    /// Whether any source reads secret files.
    pub fn reads_secret_files(&self) -> bool {
        !self.secret_files.is_empty()
    }

    /// Asks the running `serve` to read the sources directory again (`main`
    /// asks on SIGHUP); none without one.
    pub fn sources_reload(&self) -> Option<ReloadRequest> {
        self.sources.reload_request()
    }

    /// The pipeline, for callers other than the HTTP handler (the reconciler).
    pub fn pipeline(&self) -> &Pipeline {
        &self.state.pipeline
    }

    /// The producer, for what only the real one knows (its replacements).
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The reconciler of every source with an `api` table: the main file's,
    /// and a sources directory's, taken in and let go as its files come
    /// and go.
    ///
    /// # Errors
    /// [`ReconcileError::Setup`] naming a main-file source whose API client
    /// cannot be made (a directory's is said and left out).
    pub fn reconciler(&self, config: &Config) -> Result<Reconciler, ReconcileError> {
        reconciler(config, self.pipeline(), self.board(), &self.sources)
    }

    /// The topics in use: the shared ones and the sources' own.
    pub fn topic_sets(&self) -> &TopicSets {
        &self.topics
    }

    /// Finds an entity's records and the ledger's state of it.
    pub fn lookup(&self) -> &crate::services::lookup::Lookup {
        &self.lookup
    }

    /// Every dead-letter topic in use: the shared one first, then each
    /// source's own.
    pub fn dead_letter_topics(&self) -> Vec<String> {
        self.topics
            .all()
            .iter()
            .map(|set| set.dead_letter().to_string())
            .collect()
    }

    /// The sources in use (`/admin/sources`).
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// The status board the handler, the reconciler and the watchdog write.
    pub fn board(&self) -> &Board {
        &self.state.board
    }

    /// Serves the status page (`/status`, `/status.json`) on `listener`
    /// until `shutdown` resolves, under the webhook listener's connection
    /// rules (see [`ingress::serve_admin`]).
    ///
    /// # Errors
    /// When the listener fails.
    pub fn serve_admin(
        &self,
        listener: tokio::net::TcpListener,
        config: &Config,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        let sources = self.sources.clone();
        let state = ingress::AdminState {
            pipeline: self.state.pipeline.clone(),
            board: self.state.board.clone(),
            sources: Arc::new(move || sources.report()),
            rederive: crate::services::rederive::Runs::new(
                config,
                self.state.pipeline.clone(),
                self.topics.clone(),
            ),
            lookup: self.lookup.clone(),
        };
        ingress::serve_admin(
            listener,
            ingress::admin_router(state, &config.admin),
            self.state.connections,
            shutdown,
        )
    }

    /// Serves the operations endpoints alone (`/healthz`, `/readyz`,
    /// `/metrics`) on `listener` until `shutdown` resolves: what
    /// `posbridge reconciler`, which takes no webhooks, is probed and
    /// scraped on (see [`ingress::serve_ops`]).
    ///
    /// # Errors
    /// When the listener fails.
    pub fn serve_ops(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
        ingress::serve_ops(listener, self.state.clone(), shutdown)
    }

    /// The router, for handler tests without a socket.
    pub fn router(&self) -> impl ingress::Routes {
        ingress::router(self.state.clone())
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::domain::verify::SchemeName;
    use crate::domain::verify::sign;

    /// The assembled app, without a broker: each source gets its provider's
    /// default signature (Mekari: base64 in `X-Mekari-Signature`) and its
    /// delivery-id header, so a correctly signed delivery gets as far as
    /// Kafka (503) and a wrongly signed one does not (401).
    #[tokio::test]
    async fn sources_are_assembled_with_their_providers_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::from_toml(&format!(
            r#"
            [kafka]
            brokers = "127.0.0.1:1"
            create_topics = false
            delivery_timeout_ms = 300
            [ledger]
            path = "{}"
            [mekari.sources.assembled]
            secrets = ["mekari-secret-1"]
            "#,
            dir.path().join("ledger.redb").display()
        ))
        .unwrap();
        assert_eq!(problems(&config), vec![]);
        let app = App::build(&config).await.unwrap();
        // Read before any request: the series alerts watch exist from
        // start-up (the source's name is this test's alone, so no other test
        // of the process made them), and the build says its version and
        // wire format.
        let started = crate::observe::telemetry::install().render();
        let line = |text: &str, name: &str, labels: &[&str]| {
            text.lines()
                .any(|l| l.starts_with(name) && labels.iter().all(|label| l.contains(label)))
        };
        for outcome in ["published", "spooled", "unauthorized"] {
            assert!(
                line(
                    &started,
                    "posbridge_webhook_requests_total",
                    &[
                        "provider=\"mekari\"",
                        "source=\"assembled\"",
                        &format!("outcome=\"{outcome}\"")
                    ]
                ),
                "{outcome}"
            );
        }
        let failures = |text: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("posbridge_signature_failures_total")
                        && l.contains("source=\"assembled\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        assert_eq!(failures(&started), Some(0.0));
        let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        assert!(line(
            &started,
            "posbridge_build_info",
            &["encoding=\"avro-single-object\"", &version]
        ));
        let body = br#"{"id":"d-1","event":"order.created","occurred_at":"2026-11-29T10:00:00Z","data":{"id":"O-1"}}"#;
        let request = |secret: &str| {
            let mut request =
                Request::post("/webhooks/mekari/assembled").header("X-Mekari-Event-ID", "d-1");
            for (name, value) in sign(
                SchemeName::Base64,
                "X-Mekari-Signature",
                secret,
                "",
                0,
                body,
            ) {
                request = request.header(name, value);
            }
            request.body(Body::from(body.to_vec())).unwrap()
        };
        let wrong = app
            .router()
            .oneshot(request("another-secret"))
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        let right = app
            .router()
            .oneshot(request("mekari-secret-1"))
            .await
            .unwrap();
        assert_eq!(right.status(), StatusCode::SERVICE_UNAVAILABLE);
        // The wrongly signed one, counted once.
        let failures_after = failures(&crate::observe::telemetry::install().render());
        assert_eq!(failures_after, Some(1.0));
    }
}
