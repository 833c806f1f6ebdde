//! The world's time across posbridge's lives.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::time::Instant;

use crate::adapters::ledger::WallClock;

/// The world's time: each life's runtime has a clock of its own, which
/// this maps onto time from the world's start.
#[derive(Clone)]
pub(super) struct Clock {
    /// The world time a life began at, and its runtime's instant then.
    now: Arc<Mutex<(Duration, Instant)>>,
    /// The wall-clock time the world began at (records' timestamps).
    epoch: OffsetDateTime,
}

impl Clock {
    pub(super) fn new() -> Clock {
        Clock {
            now: Arc::new(Mutex::new((Duration::ZERO, Instant::now()))),
            epoch: OffsetDateTime::now_utc(),
        }
    }

    pub(super) fn begin_life(&self, at: Duration) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = (at, Instant::now());
    }

    /// The world time now (on a life's runtime).
    pub(super) fn now(&self) -> Duration {
        let (base, started) = *self.now.lock().unwrap_or_else(PoisonError::into_inner);
        base + started.elapsed()
    }

    /// The runtime's instant of world time `at` (now, when past).
    pub(super) fn instant_at(&self, at: Duration) -> Instant {
        let (base, started) = *self.now.lock().unwrap_or_else(PoisonError::into_inner);
        started + at.saturating_sub(base)
    }

    /// The wall-clock time of world time `at`.
    pub(super) fn wall(&self, at: Duration) -> OffsetDateTime {
        self.epoch + at
    }

    /// The wall clock a ledger in this world keeps time by: the world's
    /// now, so that a done id's time to live passes with the world's time.
    pub(super) fn ledgers(&self) -> WallClock {
        let clock = self.clone();
        WallClock::driven(move || {
            u64::try_from(clock.wall(clock.now()).unix_timestamp()).unwrap_or(0)
        })
    }
}
