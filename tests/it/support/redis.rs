//! A private `redis-server` a test starts on a port of its own, for what
//! the suite's shared Redis must not be put through: a memory limit, an
//! eviction policy, a stop, a cluster.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::wait::wait_until;

/// A `redis-server` on loopback, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    /// Its working directory (a cluster node's `nodes.conf`).
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one on `port` without persistence, with `args` besides, and
    /// waits until it answers PING.
    pub async fn start(port: u16, args: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            // The real clock under a moved one (scripts/test's
            // POSBRIDGE_TEST_CLOCK): Redis's allocator and libfaketime clash.
            .env_remove("LD_PRELOAD")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test needs it anyway)");
        let server = RedisServer {
            port,
            child,
            _dir: dir,
        };
        wait_until(
            Duration::from_secs(60),
            "redis-server to answer",
            async || cli(port, &["PING"]).await.trim() == "PONG",
        )
        .await;
        server
    }

    /// Its URL for `ledger.redis_url`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli` against it.
    pub async fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args).await
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli -p PORT ARGS…`, its output (empty when it could not run).
pub async fn cli(port: u16, args: &[&str]) -> String {
    let output = tokio::process::Command::new("redis-cli")
        .env_remove("LD_PRELOAD")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .await
        .expect("redis-cli");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Marks a Redis ledger opened directly (not by `App::build`, which fills
/// it from the topics) as filled: without its generation mark it decides
/// nothing.
pub async fn mark_filled(ledger: &posbridge::adapters::ledger::RedisLedger) {
    use posbridge::adapters::ledger::Store;
    ledger
        .mark_generation(1)
        .await
        .expect("the generation mark written");
}

/// The calls `INFO commandstats` counts in `stats` (a script's own commands
/// included) on the lines `counted` takes.
pub fn calls(stats: &str, counted: impl Fn(&str) -> bool) -> u64 {
    stats
        .lines()
        .filter(|l| counted(l))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `holder` takes `slot`'s lock, `waiter` (another process's ledger) asks
/// for it, and 300 ms later the holder lets it go: the commands the server
/// ran meanwhile (`commands_run`, before and after) and how long after the
/// release the waiter had the lock. Panics when the waiter took it while it
/// was held or not within 5 s of its release.
pub async fn waited_for_a_held_lock<C, F>(
    holder: &posbridge::adapters::ledger::RedisLedger,
    waiter: &std::sync::Arc<posbridge::adapters::ledger::RedisLedger>,
    slot: &posbridge::adapters::ledger::EntitySlot,
    commands_run: C,
) -> (u64, Duration)
where
    C: Fn() -> F,
    F: std::future::Future<Output = u64>,
{
    use posbridge::adapters::ledger::Store;
    let (held, _) = holder.lock_and_read(slot).await.unwrap();
    let before = commands_run().await;
    let waiting = tokio::spawn({
        let (waiter, slot) = (waiter.clone(), slot.clone());
        async move {
            let (lock, _) = waiter.lock_and_read(&slot).await.unwrap();
            (std::time::Instant::now(), lock)
        }
    });
    // A stretch of time, not a wait for an event: what is counted is what
    // the waiter does while the lock is held, and nothing marks its end
    // but the clock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let commands = commands_run().await - before;
    assert!(!waiting.is_finished(), "the lock was held");
    let released = std::time::Instant::now();
    drop(held);
    let (taken, _lock) = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter takes the lock before the end of its lease")
        .unwrap();
    (commands, taken - released)
}
