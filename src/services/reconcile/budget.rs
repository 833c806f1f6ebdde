//! A run's bounds (`max_pages_per_run`, `max_run_secs`): what it may still
//! spend, and the error that names the bound it reached.

use std::time::Duration;

use tokio::time::Instant;

use super::ReconcileError;
use crate::config::ReconcileConfig;
use crate::domain::event::Source;

/// A bound of one run (`[reconcile]`) that the source's API made it reach.
#[derive(Debug, thiserror::Error)]
pub enum RunLimit {
    /// It read `max_pages_per_run` pages and its lists went on.
    #[error("the run read {0} pages (reconcile.max_pages_per_run) and the API has more")]
    Pages(u32),
    /// It took longer than `max_run_secs`.
    #[error("the run took longer than {} s (reconcile.max_run_secs)", .0.as_secs())]
    Time(Duration),
}

/// What one run may still spend: pages and time.
pub(super) struct Budget {
    /// Pages still to be read.
    pages_left: u32,
    /// `max_pages_per_run`, for the error.
    max_pages: u32,
    /// When the run must end.
    pub(super) deadline: Instant,
    /// `max_run_secs`, for the error.
    max_run: Duration,
}

impl Budget {
    /// The whole budget of a run starting now.
    pub(super) fn new(config: &ReconcileConfig) -> Budget {
        let max_run = Duration::from_secs(config.max_run_secs);
        Budget {
            pages_left: config.max_pages_per_run,
            max_pages: config.max_pages_per_run,
            // A deadline too far to represent is none.
            deadline: Instant::now()
                .checked_add(max_run)
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365 * 30)),
            max_run,
        }
    }

    /// Spends one page, or says which bound the run reached.
    pub(super) fn take_page(&mut self, source: &Source) -> Result<(), ReconcileError> {
        self.check_time(source)?;
        if self.pages_left == 0 {
            return Err(limit(source, RunLimit::Pages(self.max_pages)));
        }
        self.pages_left -= 1;
        Ok(())
    }

    /// Whether the run may go on: its deadline not yet passed.
    pub(super) fn check_time(&self, source: &Source) -> Result<(), ReconcileError> {
        if Instant::now() >= self.deadline {
            return Err(self.too_long(source));
        }
        Ok(())
    }

    /// The error of a run past its deadline.
    pub(super) fn too_long(&self, source: &Source) -> ReconcileError {
        limit(source, RunLimit::Time(self.max_run))
    }
}

/// The run's error for `limit`.
fn limit(source: &Source, limit: RunLimit) -> ReconcileError {
    ReconcileError::Limit {
        provider: source.provider,
        source: source.name.clone(),
        limit,
    }
}
