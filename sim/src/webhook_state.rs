//! The two providers' webhook switches: ReceiptRoller's webhook and Mekari's
//! endpoint, as each provider keeps them.
//!
//! Both sides of the simulator change them: the delivery rules (`deliver`)
//! switch the webhook off and pause the endpoint, the APIs (`api`) report
//! them and switch them back on, and `/sim` restarts ReceiptRoller. So they
//! live here, below both, holding only the state and its transitions; when a
//! rule fires is decided by the callers.

use tokio_util::sync::CancellationToken;
use tracing::warn;

/// ReceiptRoller's simulated webhook.
#[derive(Debug)]
pub struct Webhook {
    /// Sends new events only while active.
    pub active: bool,
    /// Cancelled by a server restart: retries waiting on it are dropped.
    pub restart: CancellationToken,
    /// Deliveries currently between attempts, for the restart report.
    pub waiting: usize,
}

impl Default for Webhook {
    fn default() -> Webhook {
        Webhook {
            active: true,
            restart: CancellationToken::new(),
            waiting: 0,
        }
    }
}

impl Webhook {
    /// A simulated server restart: pending retries are dropped, the webhook
    /// keeps its state. Returns how many deliveries were waiting for a retry.
    pub fn restart(&mut self) -> usize {
        self.restart.cancel();
        self.restart = CancellationToken::new();
        let dropped = std::mem::take(&mut self.waiting);
        warn!(
            pending_retries = dropped,
            "ReceiptRoller server restarted; pending retries are dropped."
        );
        dropped
    }
}

/// Mekari's simulated webhook endpoint.
#[derive(Debug, Default)]
pub struct Endpoint {
    /// Paused after too many deliveries in a row failed for good.
    pub paused: bool,
    /// Deliveries in a row that failed for good; a 2xx resets it.
    pub consecutive_failures: u32,
    /// Cancelled when the endpoint pauses: waiting retries stop.
    pub cancel: CancellationToken,
}

impl Endpoint {
    /// `active` or `paused`, as `GET /webhooks/endpoints` shows it.
    pub fn status(&self) -> &'static str {
        if self.paused { "paused" } else { "active" }
    }

    /// Pauses the endpoint: nothing more is sent and waiting retries stop.
    pub fn pause(&mut self) {
        self.paused = true;
        self.cancel.cancel();
        self.cancel = CancellationToken::new();
    }

    /// The documented resume (`PUT`): active again, count back to zero.
    pub fn resume(&mut self) {
        self.paused = false;
        self.consecutive_failures = 0;
    }
}
