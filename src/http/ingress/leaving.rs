//! Leaving the balancer before the port closes.
//!
//! From the shutdown signal on, `/readyz` answers 503 while the webhook
//! listener keeps accepting and answering for `server.drain_delay_ms`, so a
//! balancer that follows readiness (HAProxy's checks, a cloud balancer) or
//! the pod's endpoints (a Kubernetes Service) stops sending before nothing
//! listens: a refused connection is a failed attempt to the provider. Every
//! answer meanwhile closes its connection (`Connection: close`), so a
//! kept-alive client opens a new one for its next request, which the
//! balancer sends to another replica.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::info;

/// Whether the process is leaving; cheap to clone, shared by the handlers.
#[derive(Debug, Clone, Default)]
pub struct Leaving(Arc<AtomicBool>);

impl Leaving {
    /// From now on `/readyz` answers 503 and every answer closes its connection.
    pub fn begin(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether [`Leaving::begin`] was called.
    pub fn is_leaving(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Resolves `delay` after `signal`, having begun leaving when `signal`
    /// resolved; at once if `hurry` resolves first (a second Ctrl-C). What
    /// `serve` is given as its shutdown: it stops accepting when this resolves.
    pub async fn after(
        self,
        delay: Duration,
        signal: impl Future<Output = ()> + Send + 'static,
        hurry: impl Future<Output = ()> + Send + 'static,
    ) {
        signal.await;
        self.begin();
        if delay.is_zero() {
            return;
        }
        info!(
            drain_delay_ms = delay.as_millis(),
            "Leaving: /readyz answers 503 while webhooks are still answered for server.drain_delay_ms, so the balancer moves away before the port closes; a second signal stops at once."
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = hurry => info!("Asked again: not waiting out server.drain_delay_ms."),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Leaving begins with the signal; the stop comes `delay` later, or
    /// with the hurry.
    #[tokio::test(start_paused = true)]
    async fn the_stop_comes_a_drain_delay_after_the_signal_or_with_a_second_one() {
        let delay = Duration::from_secs(10);
        for hurried in [false, true] {
            let leaving = Leaving::default();
            let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
            let (hurry, hurried_rx) = tokio::sync::oneshot::channel::<()>();
            let stop = tokio::spawn(leaving.clone().after(
                delay,
                async {
                    let _ = signalled.await;
                },
                async {
                    let _ = hurried_rx.await;
                },
            ));
            tokio::time::sleep(Duration::from_secs(60)).await;
            assert!(!leaving.is_leaving() && !stop.is_finished());
            signal.send(()).unwrap();
            let started = tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            assert!(leaving.is_leaving());
            if hurried {
                tokio::time::sleep(Duration::from_secs(3)).await;
                hurry.send(()).unwrap();
            }
            stop.await.unwrap();
            let waited = started.elapsed();
            let expected = if hurried {
                Duration::from_secs(3)
            } else {
                delay
            };
            assert!(
                waited >= expected && waited < expected + Duration::from_millis(10),
                "hurried {hurried}: {waited:?}"
            );
        }
    }

    /// A drain delay of 0 stops at the signal.
    #[tokio::test(start_paused = true)]
    async fn no_drain_delay_stops_at_the_signal() {
        let leaving = Leaving::default();
        let started = tokio::time::Instant::now();
        leaving
            .clone()
            .after(Duration::ZERO, async {}, std::future::pending())
            .await;
        assert!(leaving.is_leaving());
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
