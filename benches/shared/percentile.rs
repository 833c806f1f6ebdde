//! A quantile of sorted latencies, the one rule every bench's rows read.

use std::time::Duration;

/// The `p` quantile of `sorted` latencies (zero when there are none).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len().max(1) - 1) as f64 * p) as usize;
    sorted.get(at).copied().unwrap_or_default()
}
