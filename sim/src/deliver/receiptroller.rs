//! ReceiptRoller's delivery rules, as the simulator plays them.
//!
//! Four attempts, 1 min, 10 min and 60 min after the previous failure (see
//! `docs/PROVIDERS.md`); every non-2xx and every connection error or 10 s
//! timeout is a failure; four failures of one event switch the whole webhook
//! off, after which new events are not sent. Switching off does not stop
//! retries already waiting, but a server restart drops them without
//! switching anything off.

use std::time::Duration;

use tokio::time::sleep;
use tracing::{error, info};

use crate::deliver::outgoing::{self, Outgoing};
use crate::state::{Fate, Sim, lock};

/// Attempts per event.
pub const ATTEMPTS: usize = 4;
/// Wait after each failed attempt, before the next (documented time).
pub const RETRY_DELAYS: [Duration; ATTEMPTS - 1] = [
    Duration::from_secs(60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(60 * 60),
];

/// Delivers one event by ReceiptRoller's rules.
pub async fn deliver(sim: &Sim, out: &Outgoing) {
    let restart = lock(&sim.receiptroller).restart.clone();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            let wait = sim.settings.scale.real(RETRY_DELAYS[attempt - 2]);
            {
                // Under the lock a restart holds (`Webhook::restart`), so a
                // delivery is either counted as waiting before the restart or
                // sees it.
                let mut webhook = lock(&sim.receiptroller);
                if restart.is_cancelled() {
                    drop(webhook);
                    sim.record(out.index, |r| r.fate = Fate::Abandoned);
                    return;
                }
                webhook.waiting += 1;
            }
            let restarted = tokio::select! {
                () = sleep(wait) => false,
                () = restart.cancelled() => true,
            };
            if !restarted {
                let mut webhook = lock(&sim.receiptroller);
                webhook.waiting = webhook.waiting.saturating_sub(1);
            }
            if restarted {
                info!(delivery_id = %out.delivery_id, attempt, "Retry dropped by the restart.");
                sim.record(out.index, |r| r.fate = Fate::Abandoned);
                return;
            }
        }
        let answer = outgoing::attempt(sim, out).await;
        if answer.is_success() {
            sim.record(out.index, |r| r.fate = Fate::Delivered);
            return;
        }
        info!(provider = "receiptroller", delivery_id = %out.delivery_id, attempt,
              status = answer.code(), "Attempt failed.");
        if restart.is_cancelled() {
            sim.record(out.index, |r| r.fate = Fate::Abandoned);
            return;
        }
    }
    sim.record(out.index, |r| r.fate = Fate::Failed);
    let mut webhook = lock(&sim.receiptroller);
    if webhook.active {
        webhook.active = false;
        error!(delivery_id = %out.delivery_id,
               "Four attempts failed: the ReceiptRoller webhook is switched off.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_retry_is_about_71_minutes_after_the_first_attempt() {
        let total: Duration = RETRY_DELAYS.iter().sum();
        assert_eq!(total, Duration::from_secs(71 * 60));
    }
}
