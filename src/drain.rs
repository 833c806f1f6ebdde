//! The drainer: publishes spooled deliveries through the pipeline once Kafka
//! answers again, oldest first, one at a time (so two deliveries about one
//! entity are replayed in the order they arrived), and removes each from the
//! spool only after its outcome is durable in the ledger.
//!
//! It runs inside `serve` from start-up, so a spool left by a crash is
//! drained as soon as the broker answers. A replayed delivery whose id the
//! ledger already knows as done (published just before a crash) is a
//! duplicate and is simply removed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::pipeline::{Delivery, Outcome, Pipeline, PipelineError};
use crate::spool::{Spool, SpoolError};
use crate::telemetry;
use crate::verify::VerifiedBody;

/// How many entries one pass reads from the spool.
const BATCH: usize = 64;
/// How often an idle drainer looks again (and refreshes the age gauge).
const IDLE: Duration = Duration::from_millis(250);

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
}

impl Drainer {
    /// A drainer of `spool` into `pipeline`.
    pub fn new(pipeline: Pipeline, spool: Spool) -> Drainer {
        Drainer { pipeline, spool }
    }

    /// Drains whenever the spool holds entries and Kafka answers, until
    /// `shutdown`. Says once when it starts and once when the spool is empty.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut draining: Option<(Instant, u64)> = None;
        loop {
            self.refresh_age();
            let ready =
                self.spool.stats().entries > 0 && self.pipeline.publisher().health().is_up();
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
                () = shutdown.cancelled() => return,
                result = self.pass() => match result {
                    Ok(done) => started.1 += done.entries,
                    Err(DrainError::Pipeline(error)) => {
                        warn!(%error, "Spool drain paused: a spooled delivery cannot be made durable yet.");
                        tokio::time::sleep(IDLE).await;
                    }
                    Err(error) => {
                        error!(%error, "Spool drain failed; retrying.");
                        tokio::time::sleep(IDLE).await;
                    }
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

    /// Replays up to one batch of the oldest entries, in order, removing
    /// those whose outcome is durable (in one write) before returning.
    async fn pass(&self) -> Result<Drained, DrainError> {
        let batch = self.spool.oldest(BATCH)?;
        let mut done = Vec::with_capacity(batch.len());
        let mut stopped = None;
        for (seq, spooled) in batch {
            let key = spooled.key.clone();
            let provider = spooled.source.provider;
            let delivery = Delivery {
                source: Arc::new(spooled.source),
                delivery_id: spooled.delivery_id,
                body: VerifiedBody::from_spool(spooled.body),
                received_at: spooled.received_at,
                arrived: Instant::now(),
                spools: false,
            };
            match self.pipeline.replay(delivery).await {
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
                    stopped = Some(error);
                    break;
                }
            }
        }
        let drained = Drained {
            entries: done.len() as u64,
        };
        if !done.is_empty() {
            self.spool.remove(done).await?;
        }
        self.refresh_age();
        match stopped {
            Some(error) => Err(error.into()),
            None => Ok(drained),
        }
    }

    fn refresh_age(&self) {
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

fn count(provider: &'static str, outcome: Outcome) {
    metrics::counter!(
        telemetry::SPOOL_DRAINED,
        telemetry::PROVIDER => provider,
        telemetry::OUTCOME => outcome.as_str()
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{ProviderKind, Source};
    use crate::spool::SpooledDelivery;

    /// Without a broker a pass stops at the first entry and keeps it (and
    /// everything after it) for the next pass.
    #[tokio::test]
    async fn what_kafka_cannot_take_stays_in_the_spool() {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = Pipeline::without_broker(dir.path(), Duration::from_millis(100)).await;
        let spool = pipeline.spool().unwrap().clone();
        for id in ["k-1", "k-2"] {
            let body = format!(
                r#"{{"id":"{id}","event":"order.created","occurred_at":"2026-11-29T10:00:00Z","data":{{"id":"O-1"}}}}"#
            );
            spool
                .append(&SpooledDelivery {
                    key: crate::event::DeliveryKey::new(ProviderKind::Mekari, id),
                    source: Source {
                        provider: ProviderKind::Mekari,
                        name: "main".into(),
                        account: None,
                    },
                    delivery_id: id.into(),
                    received_at: OffsetDateTime::now_utc(),
                    body: bytes::Bytes::from(body),
                })
                .await
                .unwrap();
        }
        let drainer = Drainer::new(pipeline, spool.clone());
        let error = drainer.drain_all().await.unwrap_err();
        assert!(matches!(error, DrainError::Pipeline(_)), "{error}");
        assert_eq!(spool.stats().entries, 2);
        assert_eq!(spool.delivery_ids(), ["k-1", "k-2"], "kept, in order");
    }
}
