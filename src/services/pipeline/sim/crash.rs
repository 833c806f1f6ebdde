//! posbridge's crashes in a world: when, for how long, and what each
//! leaves of the ledger, the spool and the broker.

use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use super::process::{LedgerFate, SpoolFate};

/// One crash of posbridge and what it leaves.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(super) struct Crash {
    /// When, from the world's start.
    pub(super) at: Duration,
    /// How long posbridge stays down.
    pub(super) down: Duration,
    pub(super) ledger: LedgerFate,
    pub(super) spool: SpoolFate,
    /// Whether the broker is replaced by an empty one while posbridge is down.
    pub(super) broker_replaced: bool,
    /// A stop, not a crash: requests refused from ten seconds before, the
    /// ledger made durable and its files closed, as shutdown does. Bytes
    /// damaged after a clean stop are read without the repair an unclean
    /// one makes redb run (which checks every page).
    pub(super) clean: bool,
}

/// Up to two crashes, each with how long posbridge stays down and what
/// it leaves of the ledger, the spool and the broker; the first attempts
/// come within `spread` ms.
pub(super) fn crashes(rng: &mut StdRng, spread: u64, outage: Option<Duration>) -> Vec<Crash> {
    let count = match rng.random_range(0..10) {
        0..4 => 0,
        4..7 => 1,
        _ => 2,
    };
    let mut at = Duration::ZERO;
    let mut crashes = Vec::new();
    for _ in 0..count {
        // Mostly while deliveries arrive, sometimes among the retries, and
        // in an outage world sometimes while the outage lasts.
        match (rng.random_range(0..10), outage) {
            (0..4, Some(start)) => {
                at = at.max(start) + Duration::from_millis(rng.random_range(1_000..60_000));
            }
            (0..7, _) => at += Duration::from_millis(rng.random_range(100..spread + 5_000)),
            _ => at += Duration::from_millis(rng.random_range(90_000..900_000)),
        }
        let down = Duration::from_millis(rng.random_range(0..120_000));
        crashes.push(Crash {
            at,
            down,
            ledger: match rng.random_range(0..10) {
                0..6 => LedgerFate::Kept,
                6..8 => LedgerFate::Lost,
                _ => LedgerFate::Damaged,
            },
            spool: if rng.random_bool(0.2) {
                SpoolFate::Damaged
            } else {
                SpoolFate::Kept
            },
            broker_replaced: rng.random_bool(0.1),
            clean: rng.random_bool(0.3),
        });
        at += down;
    }
    crashes
}
