//! Where the simulation reaches into the core: moments the core passes in
//! no time on one thread, which a thread beside it may see in production.
//! Unset (every other test), a hook does nothing.

use std::cell::RefCell;
use std::time::Duration;

/// Decides how long each commit waits after its acknowledgement.
type Pause = Box<dyn FnMut() -> Duration>;

thread_local! {
    /// The pause plan of the world running on this thread (each life's
    /// runtime is a current-thread one, on the test's thread).
    static PAUSE: RefCell<Option<Pause>> = RefCell::new(None);
}

/// Sets the pause between each acknowledgement and its commit for the
/// worlds run on this thread from now on; `None` takes it away.
pub(super) fn pause_commits(plan: Option<Pause>) {
    PAUSE.with(|pause| *pause.borrow_mut() = plan);
}

/// Waits as the world's plan says between an acknowledgement and its
/// commit: a checkpoint, a crash or another delivery may come in between,
/// as they may on the threads of a running posbridge.
pub(in crate::services::pipeline) async fn between_ack_and_commit() {
    let wait = PAUSE.with(|pause| pause.borrow_mut().as_mut().map(|plan| plan()));
    if let Some(wait) = wait.filter(|wait| !wait.is_zero()) {
        tokio::time::sleep(wait).await;
    }
}
