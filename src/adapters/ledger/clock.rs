//! The wall clock the ledger keeps time by: how long a done delivery id is
//! remembered (`dedup_ttl`) is counted on it. The system's in a running
//! posbridge; in the simulation, the world's, so that hours of provider
//! time (retries and duplicates that come after the dedup window) pass in
//! a world as they would outside it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the time in seconds since the Unix epoch. Cheap to clone.
#[derive(Clone, Default)]
pub struct WallClock {
    /// The world's clock; none for the system's.
    driven: Option<Arc<dyn Fn() -> u64 + Send + Sync>>,
}

impl WallClock {
    /// The system's clock.
    pub fn system() -> WallClock {
        WallClock::default()
    }

    /// A clock `now` reads (the simulation's world).
    #[cfg(test)]
    pub(crate) fn driven(now: impl Fn() -> u64 + Send + Sync + 'static) -> WallClock {
        WallClock {
            driven: Some(Arc::new(now)),
        }
    }

    /// Seconds since the Unix epoch, now.
    pub fn unix_now(&self) -> u64 {
        match &self.driven {
            Some(now) => now(),
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.driven {
            Some(_) => "WallClock(driven)",
            None => "WallClock(system)",
        })
    }
}
