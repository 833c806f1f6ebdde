//! Start-up: turns a validated [`Config`] into a running service.
//!
//! Every connection is opened and checked here, once, so a mistake (a wrong
//! broker address, an incompatible schema, a locked ledger file) stops the
//! service with a message before it accepts a single webhook.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use crate::config::{Config, LedgerBackend};
use crate::encode::{EncodeError, Encoder};
use crate::event::{EntityType, ProviderKind};
use crate::ingress::{self, AppState, Source};
use crate::ledger::{EmbeddedLedger, Ledger, LedgerError, RedisLedger};
use crate::pipeline::{Pipeline, SourceInfo, Topics};
use crate::providers;
use crate::publish::{PublishError, Publisher};
use crate::verify::Verifier;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The ledger could not be opened.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The producer could not be created or the topics could not be ensured.
    #[error("kafka: {0}")]
    Kafka(#[from] PublishError),
    /// The schema registry refused the schema or could not be reached.
    #[error("schema registry: {0}")]
    Registry(#[from] EncodeError),
    /// A source's signature settings are unusable.
    #[error("{key}: {message}")]
    Source {
        /// Config key of the source.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// A built service: the pieces `serve` runs.
#[derive(Clone)]
pub struct App {
    /// The HTTP state (holds the pipeline).
    state: AppState,
    /// Shutdown budget for the producer flush.
    shutdown_timeout: Duration,
}

impl App {
    /// Opens the ledger, creates the producer and topics, registers the
    /// schema, and builds every source's verifier.
    ///
    /// # Errors
    /// A [`BuildError`] naming what failed.
    pub async fn build(config: &Config) -> Result<App, BuildError> {
        let kafka = &config.kafka;
        // A lease outlives the longest a delivery can legitimately take.
        let lease =
            kafka.delivery_timeout() * 2 + Duration::from_millis(config.server.inflight_wait_ms);
        let dedup_ttl = Duration::from_secs(config.ledger.dedup_ttl_secs);
        let ledger: Arc<dyn Ledger> = match config.ledger.backend {
            LedgerBackend::Embedded => {
                Arc::new(EmbeddedLedger::open(&config.ledger.path, dedup_ttl, lease)?)
            }
            LedgerBackend::Redis => Arc::new(
                RedisLedger::connect(
                    &config.ledger.redis_url,
                    &config.ledger.redis_prefix,
                    dedup_ttl,
                    lease,
                )
                .await?,
            ),
        };

        let topics = Topics {
            entities: EntityType::ALL
                .into_iter()
                .map(|t| (t, kafka.topic(t)))
                .collect(),
            dead_letter: kafka.dead_letter_topic(),
        };
        let publisher = Publisher::new(kafka)?;
        if kafka.create_topics {
            let mut wanted: BTreeMap<String, bool> = topics
                .entities
                .values()
                .map(|t| (t.clone(), true))
                .collect();
            wanted.insert(topics.dead_letter.clone(), false);
            publisher
                .ensure_topics(&wanted, kafka.partitions, kafka.replication_factor)
                .await?;
            info!(topics = ?wanted.keys().collect::<Vec<_>>(), "Topics ready.");
        }
        let entity_topics: Vec<String> = topics.entities.values().cloned().collect();
        let encoder = Encoder::new(&config.schema_registry, &entity_topics).await?;
        info!(encoding = ?encoder, "Encoder ready.");

        let mut sources = HashMap::new();
        for provider in ProviderKind::ALL {
            let defaults = providers::for_kind(provider);
            for (name, source) in &config.provider(provider).sources {
                let scheme = source.scheme.unwrap_or_else(|| defaults.default_scheme());
                let header = source
                    .header
                    .as_deref()
                    .or(scheme.fixed_header())
                    .unwrap_or(defaults.default_signature_header());
                let verifier =
                    Verifier::new(scheme, header, &source.secrets.0, source.tolerance_secs)
                        .map_err(|message| BuildError::Source {
                            key: format!("{provider}.sources.{name}"),
                            message,
                        })?;
                sources.insert(
                    (provider, name.clone()),
                    Source {
                        info: Arc::new(SourceInfo {
                            name: name.clone(),
                            account: source.account.clone(),
                        }),
                        verifier,
                    },
                );
            }
        }

        let pipeline = Pipeline::new(
            ledger,
            encoder,
            publisher,
            topics,
            Duration::from_millis(config.server.inflight_wait_ms),
        );
        Ok(App {
            state: AppState {
                sources: Arc::new(sources),
                pipeline,
                body_limit: config.server.body_limit_bytes,
                retry_after_secs: config.server.retry_after_secs,
                metrics: crate::metrics::install(),
            },
            shutdown_timeout: Duration::from_millis(config.server.shutdown_timeout_ms),
        })
    }

    /// The pipeline, for callers other than the HTTP handler (the reconciler).
    pub fn pipeline(&self) -> &Pipeline {
        &self.state.pipeline
    }

    /// The router, for handler tests without a socket.
    pub fn router(&self) -> axum::Router {
        ingress::router(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves, then lets in-flight
    /// deliveries finish and flushes the producer.
    ///
    /// # Errors
    /// When the listener fails.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let publisher = self.state.pipeline.publisher().clone();
        ingress::serve(listener, self.state, shutdown).await?;
        info!("Stopped accepting; flushing the producer.");
        publisher.flush(self.shutdown_timeout).await;
        Ok(())
    }
}
