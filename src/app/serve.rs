//! Running a built [`App`]: serving until the shutdown signal, leaving the
//! balancer first (`server.drain_delay_ms`), then letting in-flight
//! deliveries finish and flushing what is queued. `serve` returns once
//! every task it relies on has ended, so the ledger's file is let go with
//! the app's last handle (a restart in the same process, `ledger check`
//! right after).

use std::future::Future;
use std::sync::{Mutex, PoisonError};

use tokio::task::JoinHandle;
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
        // Aborted, they end at once; waited for so that their handles on
        // the pipeline are gone when `serve` returns.
        let _ = tokio::join!(secret_files, sources);
        served?;
        info!("Stopped accepting; finishing deliveries and flushing the producer.");
        app.state
            .pipeline
            .finish_deliveries(app.shutdown_timeout)
            .await;
        app.flush().await;
        // A store that hangs a watch's read holds the end no longer than
        // the shutdown's budget.
        let _ = tokio::time::timeout(app.shutdown_timeout, app.rebuild.end()).await;
        Ok(())
    }
}

/// The ledger's rebuild, a task for as long as the app serves: it fills
/// the ledger again whenever the gate closes.
pub(super) struct RebuildTask {
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl RebuildTask {
    pub(super) fn new(stop: CancellationToken, task: JoinHandle<()>) -> RebuildTask {
        RebuildTask {
            stop,
            task: Mutex::new(Some(task)),
        }
    }

    /// Stops the rebuild and waits until it has ended (a fill under way
    /// stops between batches).
    async fn end(&self) {
        self.stop.cancel();
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Drop for RebuildTask {
    /// An app dropped without serving (a start-up that fails later, a
    /// command that only reads) stops its rebuild too.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
