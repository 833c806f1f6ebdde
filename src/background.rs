//! Threads for work no delivery waits for (the ledger's checkpoint, the
//! metrics' upkeep), at a lower CPU priority than the threads that serve.
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
//! Lowered only, never raised back: an unprivileged process may not, so a
//! lowered thread stays one of its own (never a pool's thread that serves
//! later).

use std::thread::{Builder, JoinHandle};

use tracing::debug;

/// How much nicer a background thread is than the thread that spawned it:
/// a weight about a tenth of the runtime's threads' (nice 10 against 0).
pub const NICER: i32 = 10;

/// The highest nice value, the least CPU.
const NICEST: i32 = 19;

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
}
