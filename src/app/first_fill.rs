//! How long start-up waits for the ledger's first fill from the topics
//! before it serves: briefly for `serve`, whole for a catch-up command.

use std::time::Duration;

use tracing::info;

use crate::adapters::ledger::Gate;

/// How long start-up waits for the ledger's first fill from the topics
/// (from its last checkpoint: usually a second's records) before serving
/// with the gate closed.
const FIRST_FILL_WAIT: Duration = Duration::from_secs(5);

/// How long start-up waits for the ledger's first fill from the topics.
#[derive(Debug, Clone, Copy)]
pub(super) enum FirstFill {
    /// At most [`FIRST_FILL_WAIT`]: `serve` then answers while it goes on.
    Briefly,
    /// To its end: a catch-up command (reconcile, replay) has nothing to
    /// do meanwhile.
    Whole,
}

impl FirstFill {
    /// Waits for the fill behind `gate` as `self` says; `reachable`: a
    /// broker answered at start (else nothing is filled meanwhile).
    pub(super) async fn wait(self, gate: &Gate, reachable: bool) {
        match self {
            FirstFill::Briefly => {
                if reachable && !gate.opens_within(FIRST_FILL_WAIT).await {
                    info!(
                        "The ledger is being filled from the topics: sources that spool take deliveries meanwhile, the others answer 503 with Retry-After; /readyz and /status show its progress."
                    );
                }
            }
            // Until it is filled, or the first attempt failed (then the
            // command's own calls say why).
            FirstFill::Whole => {
                while !gate.opens_within(FIRST_FILL_WAIT).await {
                    if gate.snapshot().failed.is_some() {
                        break;
                    }
                }
            }
        }
    }
}
