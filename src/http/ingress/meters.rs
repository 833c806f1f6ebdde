//! A configured webhook's request counter and latency histogram, one pair
//! per outcome, registered once at start-up.
//!
//! `metrics::counter!` with labels builds and hashes a key and looks it up
//! in the recorder's registry on every call; for the two series every
//! request touches, the handles are looked up once instead.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Histogram, SharedString};

use super::RequestOutcome;
use crate::domain::event::{ProviderKind, Source};
use crate::observe::telemetry;

/// The `source` label of requests to a source that is not configured (labels
/// stay bounded whatever paths clients send).
pub(super) const UNKNOWN_SOURCE: &str = "unknown";

/// The request meters of one source. Cheap to clone.
#[derive(Clone)]
pub struct RequestMeters(Arc<[(RequestOutcome, Counter, Histogram)]>);

impl RequestMeters {
    /// Registers every outcome's series for `source`, so each exists at 0
    /// from start-up (a `rate()` or an absence alert needs it). Call after
    /// [`telemetry::install`]: handles made before it record nowhere.
    pub fn register(source: &Source) -> RequestMeters {
        RequestMeters(
            RequestOutcome::all()
                .map(|outcome| {
                    let (requests, duration) =
                        series(source.provider, source.name.clone().into(), outcome);
                    requests.increment(0);
                    (outcome, requests, duration)
                })
                .collect(),
        )
    }

    /// Counts one answered request and its latency.
    pub fn record(&self, outcome: RequestOutcome, elapsed: Duration) {
        if let Some((_, requests, duration)) = self.0.iter().find(|(o, ..)| *o == outcome) {
            record(requests, duration, elapsed);
        }
    }
}

/// Counts a request to a source that is not configured, under
/// [`UNKNOWN_SOURCE`] (its series made on the first such request).
pub(super) fn record_unknown(provider: ProviderKind, outcome: RequestOutcome, elapsed: Duration) {
    let (requests, duration) = series(provider, UNKNOWN_SOURCE.into(), outcome);
    record(&requests, &duration, elapsed);
}

/// A source's request counter and the provider's latency histogram for
/// one outcome.
fn series(
    provider: ProviderKind,
    source: SharedString,
    outcome: RequestOutcome,
) -> (Counter, Histogram) {
    (
        metrics::counter!(
            telemetry::WEBHOOK_REQUESTS,
            telemetry::PROVIDER => provider.as_str(),
            telemetry::SOURCE => source,
            telemetry::OUTCOME => outcome.as_str()
        ),
        metrics::histogram!(
            telemetry::WEBHOOK_DURATION,
            telemetry::PROVIDER => provider.as_str(),
            telemetry::OUTCOME => outcome.as_str()
        ),
    )
}

/// One answered request: counted, and its latency recorded.
fn record(requests: &Counter, duration: &Histogram, elapsed: Duration) {
    requests.increment(1);
    duration.record(elapsed.as_secs_f64());
}

impl fmt::Debug for RequestMeters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestMeters")
            .field("outcomes", &self.0.len())
            .finish()
    }
}
