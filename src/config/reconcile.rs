//! The `[reconcile]` and `[watchdog]` sections: catching up from the
//! providers' APIs, and watching that the providers still send to us.

use serde::Deserialize;

/// The reconciler: reads what webhooks may have missed from the providers'
/// list APIs and publishes it through the same pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcileConfig {
    /// Run on a schedule inside `serve`.
    #[serde(default)]
    pub enabled: bool,
    /// Time between scheduled runs.
    #[serde(default = "default_reconcile_interval_secs")]
    pub interval_secs: u64,
    /// Each run starts this long before its checkpoint: ReceiptRoller's
    /// retries take ~71 min and Mekari's offline sales carry earlier times.
    #[serde(default = "default_lookback_secs")]
    pub lookback_secs: u64,
    /// How far back the first run of a source reaches, with no checkpoint yet.
    #[serde(default = "default_initial_window_secs")]
    pub initial_window_secs: u64,
    /// A run's window is read in steps of this length; the checkpoint moves
    /// after each complete step, so a crash resumes from the last one.
    #[serde(default = "default_step_secs")]
    pub step_secs: u64,
    /// Attempts per API request before the run fails (408, 429, 5xx and
    /// connection errors are retried).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// Timeout of one API request, its body included: an answer that drips
    /// past it is a connection error, retried as one.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Pages one run reads at most, over all its lists and steps: a list whose
    /// pages never end fails the run (counted) instead of holding the source,
    /// its scheduled runs and the watchdog's catch-ups, for ever.
    #[serde(default = "default_max_pages_per_run")]
    pub max_pages_per_run: u32,
    /// Longest run: one past it fails (counted) at its next page or record.
    #[serde(default = "default_max_run_secs")]
    pub max_run_secs: u64,
    /// Largest API answer read; reading stops at this many bytes, so a huge
    /// answer costs no more memory than this (inside `serve`, an out-of-memory
    /// kill would take the webhooks down with it).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: u64,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            enabled: false,
            interval_secs: default_reconcile_interval_secs(),
            lookback_secs: default_lookback_secs(),
            initial_window_secs: default_initial_window_secs(),
            step_secs: default_step_secs(),
            max_attempts: default_max_attempts(),
            request_timeout_ms: default_request_timeout_ms(),
            max_pages_per_run: default_max_pages_per_run(),
            max_run_secs: default_max_run_secs(),
            max_body_bytes: default_max_body_bytes(),
        }
    }
}

const fn default_reconcile_interval_secs() -> u64 {
    900
}
// ReceiptRoller's last retry comes ~71 min after the first attempt; 90 min covers it.
const fn default_lookback_secs() -> u64 {
    90 * 60
}
const fn default_initial_window_secs() -> u64 {
    24 * 3600
}
const fn default_step_secs() -> u64 {
    3600
}
const fn default_max_attempts() -> u32 {
    5
}
const fn default_request_timeout_ms() -> u64 {
    10_000
}
// A million records at 100 a page: the first day of a busy account, or a
// catch-up after a long outage; a longer one goes on from its checkpoint.
const fn default_max_pages_per_run() -> u32 {
    10_000
}
// An hour: four scheduled intervals, and the alert's window.
const fn default_max_run_secs() -> u64 {
    3600
}
// 8 MiB: a page of 100 records is tens of KiB; 500 large sales stay far below.
const fn default_max_body_bytes() -> u64 {
    8 * 1024 * 1024
}
/// The least `max_body_bytes` may be: below it, ordinary pages would fail.
pub const MIN_BODY_BYTES: u64 = 64 * 1024;

/// The webhook-health watchdog.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchdogConfig {
    /// Run inside `serve`.
    #[serde(default)]
    pub enabled: bool,
    /// Time between checks of every webhook's state.
    #[serde(default = "default_watchdog_interval_secs")]
    pub interval_secs: u64,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        WatchdogConfig {
            enabled: false,
            interval_secs: default_watchdog_interval_secs(),
        }
    }
}

const fn default_watchdog_interval_secs() -> u64 {
    60
}

impl ReconcileConfig {
    /// The section's mistakes, as (key, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        for (key, value) in [
            ("reconcile.interval_secs", self.interval_secs),
            ("reconcile.step_secs", self.step_secs),
            ("reconcile.request_timeout_ms", self.request_timeout_ms),
            (
                "reconcile.max_pages_per_run",
                u64::from(self.max_pages_per_run),
            ),
            ("reconcile.max_run_secs", self.max_run_secs),
        ] {
            if value == 0 {
                problems.push((key.to_owned(), "must be above 0".to_owned()));
            }
        }
        for (key, value) in [
            ("reconcile.interval_secs", self.interval_secs),
            ("reconcile.step_secs", self.step_secs),
            ("reconcile.lookback_secs", self.lookback_secs),
            ("reconcile.initial_window_secs", self.initial_window_secs),
            ("reconcile.max_run_secs", self.max_run_secs),
        ] {
            if value > super::LONGEST_WINDOW.as_secs() {
                problems.push((key.to_owned(), super::longest_window_message()));
            }
        }
        if self.max_attempts == 0 {
            problems.push((
                "reconcile.max_attempts".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        if self.max_body_bytes < MIN_BODY_BYTES {
            problems.push((
                "reconcile.max_body_bytes".to_owned(),
                format!("must be at least {MIN_BODY_BYTES}: ordinary pages are larger"),
            ));
        }
        problems
    }
}

impl WatchdogConfig {
    /// The section's mistakes, as (key, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        let key = "watchdog.interval_secs".to_owned();
        if self.interval_secs == 0 {
            vec![(key, "must be above 0".to_owned())]
        } else if self.interval_secs > super::LONGEST_WINDOW.as_secs() {
            vec![(key, super::longest_window_message())]
        } else {
            Vec::new()
        }
    }
}
