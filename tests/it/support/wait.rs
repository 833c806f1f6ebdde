//! Waiting on a condition: the one polling loop of the suite, so a test
//! waits as long as the condition takes and no longer, and a condition
//! that never holds fails naming what it waited for.

use std::time::{Duration, Instant};

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(100);

/// Polls `check` every 100 ms until it holds; fails the test naming `what`
/// after `limit`.
pub async fn wait_until(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    wait_for(limit, what, async || check().await.then_some(())).await;
}

/// Polls `look` every 100 ms until it finds something, and returns it;
/// fails the test naming `what` after `limit`.
pub async fn wait_for<T>(limit: Duration, what: &str, look: impl AsyncFnMut() -> Option<T>) -> T {
    match look_for(limit, look).await {
        Some(found) => found,
        None => panic!("waited {limit:?} for {what}"),
    }
}

/// Polls `look` every 100 ms until it finds something, at most `limit`:
/// `None` when it never did, for a caller that explains the failure itself.
pub async fn look_for<T>(limit: Duration, mut look: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = look().await {
            return Some(found);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}
