//! Threads for work no delivery waits for (the ledger's checkpoint, the
//! metrics' upkeep, the sources directory's reads), at a lower CPU priority
//! than the threads that serve.
//!
//! Such work comes in bursts: a checkpoint of a second's writes at a few
//! thousand deliveries a second is ~25 ms of CPU at once. On a core shared
//! with the runtime (one worker when the process has one core), the
//! scheduler split the core between the two, every delivery in flight
//! waited for its half: a stall of ~25 ms in the fair-share bench's trace
//! (docs/BENCHMARKS.md, "The stalls traced"). A thread [`NICER`] than the
//! one that spawned it gets about a tenth of a core the runtime wants too:
//! its burst is spread over the runtime's idle time, and it still has the
//! whole of an idle core.
//!
//! The sources directory's recheck was the other burst found there (~35 ms
//! reading and parsing a thousand files every minute): [`run`] gives such a
//! read a thread of its own, waited for without holding a runtime thread.
//!
//! Lowered only, never raised back: an unprivileged process may not, so a
//! lowered thread stays one of its own (never a pool's thread that serves
//! later, as `spawn_blocking`'s would be).

use std::thread::{Builder, JoinHandle};

use thiserror::Error;
use tokio::sync::oneshot;
use tracing::debug;

/// How much nicer a background thread is than the thread that spawned it:
/// a weight about a tenth of the runtime's threads' (nice 10 against 0).
pub const NICER: i32 = 10;

/// The highest nice value, the least CPU.
pub(crate) const NICEST: i32 = 19;

/// Spawns the thread `name`, [`NICER`] than the calling thread, running
/// `work`.
///
/// # Errors
/// The [`std::io::Error`] of a thread the system cannot make.
pub fn spawn<T, F>(name: &str, work: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().name(name.to_owned()).spawn(move || {
        lower_this_thread();
        work()
    })
}

/// Why [`run`] has no answer.
#[derive(Debug, Error)]
pub enum RunError {
    /// The system would not make the thread.
    #[error("cannot make a background thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The work panicked.
    #[error("the background thread ended without an answer (it panicked)")]
    Ended,
}

/// Runs `work` on the thread `name`, [`NICER`] than the caller, and waits
/// for its answer without holding a runtime thread: blocking work that
/// comes in bursts (reading a directory of files) and that no delivery
/// waits for.
///
/// # Errors
/// [`RunError`] when the thread cannot be made or panics.
pub async fn run<T, F>(name: &str, work: F) -> Result<T, RunError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    // Inside the caller's runtime, as `spawn_blocking`'s work is: what the
    // work tells (a listener that spawns a task) may need it.
    let runtime = tokio::runtime::Handle::try_current().ok();
    spawn(name, move || {
        let _inside = runtime.as_ref().map(tokio::runtime::Handle::enter);
        // The waiter may be gone (a shutdown): the work is done anyway.
        let _ = answer.send(work());
    })
    .map_err(RunError::Spawn)?;
    answered.await.map_err(|_| RunError::Ended)
}

/// Makes the calling thread [`NICER`] than it was (a new thread starts with
/// its spawner's nice value). A system that refuses leaves it as it was
/// (said at DEBUG: the work is the same, only its share of a busy core
/// differs).
fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        // On Linux a nice value is a thread's own: the thread id names it.
        let this = Some(rustix::thread::gettid());
        let lowered = getpriority_process(this)
            .and_then(|nice| setpriority_process(this, (nice + NICER).min(NICEST)));
        if let Err(error) = lowered {
            debug!(%error, "A background thread keeps the CPU priority of the thread that made it.");
        }
    }
    #[cfg(not(target_os = "linux"))]
    debug!("A background thread keeps the CPU priority of the thread that made it on this system.");
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use rustix::process::getpriority_process;

    #[test]
    fn a_background_thread_is_nicer_than_its_spawner() {
        let this = || getpriority_process(Some(rustix::thread::gettid())).expect("a nice value");
        let spawner = this();
        let own = spawn("background-test", this)
            .expect("thread")
            .join()
            .expect("joined");
        assert_eq!(own, (spawner + NICER).min(NICEST));
    }

    #[tokio::test]
    async fn run_answers_from_a_nicer_thread() {
        let this = || getpriority_process(Some(rustix::thread::gettid())).expect("a nice value");
        let caller = this();
        let (nice, name) = run("background-run", move || {
            (this(), std::thread::current().name().map(str::to_owned))
        })
        .await
        .expect("answered");
        assert_eq!(nice, (caller + NICER).min(NICEST));
        assert_eq!(name.as_deref(), Some("background-run"));
        let spawned = run("background-runtime", || tokio::spawn(async { 7 })).await;
        assert_eq!(spawned.expect("answered").await.expect("joined"), 7);
    }

    #[tokio::test]
    async fn run_says_when_the_work_panics() {
        let answer = run("background-panic", || -> u8 { panic!("on purpose") }).await;
        assert!(matches!(answer, Err(RunError::Ended)), "{answer:?}");
    }
}
