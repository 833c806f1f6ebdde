//! Running a built [`App`]: serving until the shutdown signal, leaving the
//! balancer first (`server.drain_delay_ms`), then letting in-flight
//! deliveries finish and flushing what is queued.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::App;
use crate::http::ingress;
use crate::services::drain::Drainer;

impl App {
    /// `signal`, then `server.drain_delay_ms` more with `/readyz`
    /// answering 503 and every answer closing its connection (cut short
    /// when `hurry` resolves): what `main` gives [`App::serve`] as its
    /// shutdown, so the port closes only once the balancer has moved
    /// away. Tests that stop an app in-process give `serve` their own.
    pub fn leave_after(
        &self,
        signal: impl Future<Output = ()> + Send + 'static,
        hurry: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.state
            .leaving
            .clone()
            .after(self.drain_delay, signal, hurry)
    }

    /// The end of a run: waits for queued records to be delivered, then
    /// exports the spans still batched and stops the exporter, each at most
    /// `server.shutdown_timeout_ms`.
    pub async fn flush(&self) {
        let pipeline = &self.state.pipeline;
        self.publisher.flush(self.shutdown_timeout).await;
        if let Err(error) = pipeline.ledger().persist().await {
            warn!(%error, "The ledger's last checkpoint failed: the next start reads the topics from the one before.");
        }
        pipeline.traces().shutdown(self.shutdown_timeout).await;
    }

    /// The drainer of the spool, when a source spools.
    pub fn drainer(&self) -> Option<Drainer> {
        let pipeline = self.state.pipeline.clone();
        let spool = pipeline.spool()?.clone();
        Some(Drainer::new(pipeline, spool))
    }

    /// Serves on `listener` until `shutdown` resolves, draining the spool
    /// and watching the secret files meanwhile, then lets in-flight
    /// deliveries finish and flushes the producer.
    ///
    /// # Errors
    /// When the listener fails.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let app = self.clone();
        let stop_background = CancellationToken::new();
        let drainer = self
            .drainer()
            .map(|drainer| tokio::spawn(drainer.run(stop_background.clone())));
        let secret_files = tokio::spawn(self.secret_files.watch(stop_background.clone()));
        let sources = tokio::spawn(self.sources.watch(stop_background.clone()));
        let served = ingress::serve(listener, self.state, shutdown).await;
        stop_background.cancel();
        // A read of the secret files may hang on a stuck mount; it only
        // replaces the verifier's secrets, so it is abandoned rather than
        // waited for ahead of the in-flight deliveries and the flush.
        secret_files.abort();
        sources.abort();
        if let Some(drainer) = drainer {
            // The drainer stops between entries or mid-entry; either is safe.
            let _ = drainer.await;
        }
        served?;
        info!("Stopped accepting; finishing deliveries and flushing the producer.");
        app.state
            .pipeline
            .finish_deliveries(app.shutdown_timeout)
            .await;
        app.flush().await;
        Ok(())
    }
}
