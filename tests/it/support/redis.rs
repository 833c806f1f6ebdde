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
