//! A configured webhook's request counter and latency histogram, one pair
//! per outcome, registered once at start-up.
//!
//! `metrics::counter!` with labels builds and hashes a key and looks it up
//! in the recorder's registry on every call; for the two series every
//! request touches, the handles are looked up once instead.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Histogram};

use super::RequestOutcome;
use crate::event::Source;
use crate::telemetry;

/// The request meters of one source. Cheap to clone.
#[derive(Clone)]
pub struct RequestMeters(Arc<[(RequestOutcome, Counter, Histogram)]>);

impl RequestMeters {
    /// Registers every outcome's series for `source`, so each exists at 0
    /// from start-up (a `rate()` or an absence alert needs it). Call after
    /// [`telemetry::install`]: handles made before it record nowhere.
    pub fn register(source: &Source) -> RequestMeters {
        let provider = source.provider.as_str();
        RequestMeters(
            RequestOutcome::all()
                .map(|outcome| {
                    let requests = metrics::counter!(
                        telemetry::WEBHOOK_REQUESTS,
                        telemetry::PROVIDER => provider,
                        telemetry::SOURCE => source.name.clone(),
                        telemetry::OUTCOME => outcome.as_str()
                    );
                    requests.increment(0);
                    let duration = metrics::histogram!(
                        telemetry::WEBHOOK_DURATION,
                        telemetry::PROVIDER => provider,
                        telemetry::OUTCOME => outcome.as_str()
                    );
                    (outcome, requests, duration)
                })
                .collect(),
        )
    }

    /// Counts one answered request and its latency.
    pub fn record(&self, outcome: RequestOutcome, elapsed: Duration) {
        if let Some((_, requests, duration)) = self.0.iter().find(|(o, ..)| *o == outcome) {
            requests.increment(1);
            duration.record(elapsed.as_secs_f64());
        }
    }
}

impl fmt::Debug for RequestMeters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestMeters")
            .field("outcomes", &self.0.len())
            .finish()
    }
}
