//! The ticker of background loops (scheduled reconciler, watchdog): a tick
//! every interval, and any work in between abandoned at once when shutdown
//! is requested, so the loops stop with the service.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Ticks every interval until shutdown. The first tick is immediate.
pub struct Every {
    ticker: Interval,
    shutdown: CancellationToken,
}

impl Every {
    /// Ticks every `interval`; a slow round delays the next tick instead of bunching them.
    pub fn new(interval: Duration, shutdown: CancellationToken) -> Every {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Every { ticker, shutdown }
    }

    /// Waits for the next tick; `false` once shutdown was requested.
    pub async fn tick(&mut self) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            _ = self.ticker.tick() => true,
        }
    }

    /// Runs `work` unless shutdown comes first; `None` then.
    pub async fn or_shutdown<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            () = self.shutdown.cancelled() => None,
            output = work => Some(output),
        }
    }
}
