//! Mekari POS's delivery rules, as the simulator plays them.
//!
//! Eight attempts, 30 s, 2 min, 10 min, 30 min, 1 h, 3 h and 6 h after the
//! previous failure (see `docs/PROVIDERS.md`). No answer (connection error,
//! 10 s timeout), 408, 429 and 5xx are retried, and a `Retry-After` in
//! seconds can lengthen the next wait up to one hour; any 3xx or other 4xx
//! fails for good at once. Ten deliveries in a row that fail for good pause
//! the endpoint: nothing is sent while paused and waiting retries are
//! cancelled; a 2xx resets the count. (`PUT` on the endpoint, an API call,
//! resumes it.)

use std::time::Duration;

use tokio::time::sleep;
use tracing::{error, info};

use crate::deliver::outgoing::{self, Answer, Outgoing};
use crate::state::{Fate, Sim, lock};
use crate::webhook_state::Endpoint;

/// Attempts per delivery.
pub const ATTEMPTS: usize = 8;
/// Wait after each failed attempt, before the next (documented time).
pub const RETRY_DELAYS: [Duration; ATTEMPTS - 1] = [
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(60 * 60),
    Duration::from_secs(3 * 60 * 60),
    Duration::from_secs(6 * 60 * 60),
];
/// `Retry-After` lengthens a wait to at most this.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60 * 60);
/// Deliveries failing for good in a row that pause the endpoint.
pub const PAUSE_AFTER: u32 = 10;

/// What Mekari makes of one attempt's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx.
    Delivered,
    /// No answer, 408, 429 or 5xx: try again, waiting at least `retry_after` s.
    Retry {
        /// The answer's `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// Any 3xx or other 4xx (or 1xx): no more attempts.
    FailForGood,
}

/// Sorts an answer by Mekari's table.
pub fn verdict(answer: Answer) -> Verdict {
    match answer {
        Answer::NoAnswer => Verdict::Retry { retry_after: None },
        Answer::Status { code, .. } if (200..300).contains(&code) => Verdict::Delivered,
        Answer::Status {
            code: 408 | 429 | 500..=599,
            retry_after,
        } => Verdict::Retry { retry_after },
        Answer::Status { .. } => Verdict::FailForGood,
    }
}

/// The documented wait before retry number `retry` (0 = the second
/// attempt): the table's, lengthened by `Retry-After` up to one hour.
pub fn wait_before(retry: usize, retry_after: Option<u64>) -> Duration {
    let table = RETRY_DELAYS[retry.min(RETRY_DELAYS.len() - 1)];
    match retry_after {
        Some(secs) => table.max(Duration::from_secs(secs).min(RETRY_AFTER_CAP)),
        None => table,
    }
}

/// Delivers one event by Mekari's rules.
pub async fn deliver(sim: &Sim, out: &Outgoing) {
    let cancel = lock(&sim.mekari).cancel.clone();
    let mut retry_after = None;
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            let wait = sim
                .settings
                .scale
                .real(wait_before(attempt - 2, retry_after));
            tokio::select! {
                () = sleep(wait) => {}
                () = cancel.cancelled() => {}
            }
        }
        if cancel.is_cancelled() {
            info!(delivery_id = %out.delivery_id, "Retry cancelled: the endpoint is paused.");
            sim.record(out.index, |r| r.fate = Fate::Abandoned);
            return;
        }
        let answer = outgoing::attempt(sim, out).await;
        match verdict(answer) {
            Verdict::Delivered => {
                delivered(&mut lock(&sim.mekari));
                sim.record(out.index, |r| r.fate = Fate::Delivered);
                return;
            }
            Verdict::Retry { retry_after: next } => {
                info!(provider = "mekari", delivery_id = %out.delivery_id, attempt,
                      status = answer.code(), retry_after = next, "Attempt failed; will retry.");
                retry_after = next;
            }
            Verdict::FailForGood => {
                info!(provider = "mekari", delivery_id = %out.delivery_id, attempt,
                      status = answer.code(), "Attempt failed for good.");
                break;
            }
        }
    }
    sim.record(out.index, |r| r.fate = Fate::Failed);
    let mut endpoint = lock(&sim.mekari);
    if failed_for_good(&mut endpoint) {
        error!(
            consecutive_failures = endpoint.consecutive_failures,
            "Ten deliveries in a row failed for good: the Mekari endpoint is paused."
        );
    }
}

/// A 2xx: the count of failures in a row goes back to zero.
fn delivered(endpoint: &mut Endpoint) {
    endpoint.consecutive_failures = 0;
}

/// Counts a delivery that failed for good; pauses the endpoint at the tenth
/// in a row. Returns whether this one paused it.
fn failed_for_good(endpoint: &mut Endpoint) -> bool {
    endpoint.consecutive_failures += 1;
    if endpoint.paused || endpoint.consecutive_failures < PAUSE_AFTER {
        return false;
    }
    endpoint.pause();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u64>) -> Answer {
        Answer::Status { code, retry_after }
    }

    #[test]
    fn answers_are_sorted_as_the_table_says() {
        assert_eq!(verdict(status(204, None)), Verdict::Delivered);
        assert_eq!(
            verdict(Answer::NoAnswer),
            Verdict::Retry { retry_after: None }
        );
        for code in [408, 429, 500, 503] {
            assert_eq!(
                verdict(status(code, Some(7))),
                Verdict::Retry {
                    retry_after: Some(7)
                }
            );
        }
        for code in [301, 302, 400, 401, 404, 413] {
            assert_eq!(
                verdict(status(code, Some(7))),
                Verdict::FailForGood,
                "{code}"
            );
        }
    }

    #[test]
    fn retry_after_only_lengthens_and_at_most_to_an_hour() {
        assert_eq!(wait_before(0, None), Duration::from_secs(30));
        assert_eq!(wait_before(0, Some(10)), Duration::from_secs(30));
        assert_eq!(wait_before(0, Some(120)), Duration::from_secs(120));
        assert_eq!(wait_before(0, Some(99_999)), Duration::from_secs(3600));
        assert_eq!(wait_before(6, Some(99_999)), Duration::from_secs(6 * 3600));
    }

    #[test]
    fn the_whole_schedule_is_about_eleven_hours() {
        // 10 h 42 min 30 s of waiting; "about 11 hours" with the answer timeouts
        // and the up-to-a-minute lateness Mekari allows itself (see
        // `docs/PROVIDERS.md`).
        let total: Duration = RETRY_DELAYS.iter().sum();
        assert_eq!(total, Duration::from_secs(38_550));
    }

    #[test]
    fn ten_permanent_failures_in_a_row_pause_and_a_success_resets() {
        let mut endpoint = Endpoint::default();
        for _ in 0..9 {
            assert!(!failed_for_good(&mut endpoint));
        }
        delivered(&mut endpoint);
        for _ in 0..9 {
            assert!(!failed_for_good(&mut endpoint));
        }
        let token = endpoint.cancel.clone();
        assert!(failed_for_good(&mut endpoint));
        assert_eq!(endpoint.status(), "paused");
        assert!(token.is_cancelled());
        endpoint.resume();
        assert_eq!(
            (endpoint.status(), endpoint.consecutive_failures),
            ("active", 0)
        );
    }
}
