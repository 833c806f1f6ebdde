//! The cast of `tests/it/redis_schedules.rs`: a Redis master with a replica
//! behind proxies a test can cut and move, and `posbridge serve` processes a
//! test can kill -9 and start again.
//!
//! posbridge reaches Redis through one stable address (a [`CutProxy`]), as
//! in production it reaches a managed endpoint or a Sentinel-aware proxy:
//! a failover moves that address to the promoted replica and drops the
//! connections, and posbridge reconnects to the same URL. The replica
//! reaches its master through a proxy of its own too, so that cutting it
//! leaves the replica behind while the master takes writes: the replica
//! then misses the last writes, as one does after a partition.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tokio::process::Child;

use super::proxy::CutProxy;
use super::redis::RedisServer;
use super::wait::wait_until;
use super::{free_port, log_tail, replica_config_text, spawn_serve_logging};

/// A `redis-server` on a port and a data directory of its own, which it
/// keeps across restarts: started again, it loads its last snapshot.
pub struct Node {
    pub port: u16,
    dir: tempfile::TempDir,
    /// `--replicaof` while it is a replica.
    replica_of: Option<u16>,
    server: Option<RedisServer>,
}

impl Node {
    async fn start(replica_of: Option<u16>) -> Node {
        let mut node = Node {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            replica_of,
            server: None,
        };
        node.boot().await;
        node
    }

    async fn boot(&mut self) {
        let dir = self.dir.path().display().to_string();
        let master = self.replica_of.map(|port| port.to_string());
        let mut args = vec!["--dir", &dir, "--dbfilename", "dump.rdb"];
        if let Some(master) = &master {
            args.extend(["--replicaof", "127.0.0.1", master]);
        }
        self.server = Some(RedisServer::start(self.port, &args).await);
    }

    /// `redis-cli` against it.
    pub async fn cli(&self, args: &[&str]) -> String {
        super::redis::cli(self.port, args).await
    }

    /// Killed (SIGKILL: nothing saved) and started again on its port and
    /// directory, from its last snapshot (`SAVE`), or empty without one.
    pub async fn kill_and_restart(&mut self) {
        drop(self.server.take());
        self.boot().await;
    }

    /// Its replication offset (`master_repl_offset`).
    pub async fn repl_offset(&self) -> i64 {
        let info = self.cli(&["INFO", "replication"]).await;
        info.lines()
            .find_map(|line| line.trim().strip_prefix("master_repl_offset:"))
            .and_then(|offset| offset.parse().ok())
            .unwrap_or(-1)
    }
}

/// A master, its replica (until a failover promotes it), and the addresses
/// between them and posbridge.
pub struct Redis {
    pub master: Node,
    pub replica: Option<Node>,
    /// posbridge's one address of the ledger, moved at a failover.
    front: CutProxy,
    /// The replica's link to the master, cut to leave it behind.
    link: CutProxy,
}

impl Redis {
    /// A master and a replica in sync with it.
    pub async fn start() -> Redis {
        let master = Node::start(None).await;
        let link = CutProxy::start(master.port, None).await;
        let link_port: u16 = link.address().rsplit(':').next().unwrap().parse().unwrap();
        let replica = Node::start(Some(link_port)).await;
        let front = CutProxy::start(master.port, None).await;
        let redis = Redis {
            master,
            replica: Some(replica),
            front,
            link,
        };
        wait_until(
            Duration::from_secs(60),
            "the replica to sync with its master",
            async || {
                let replica = redis.replica.as_ref().unwrap();
                replica
                    .cli(&["INFO", "replication"])
                    .await
                    .contains("master_link_status:up")
            },
        )
        .await;
        redis
    }

    /// The URL posbridge is given.
    pub fn url(&self) -> String {
        format!("redis://{}", self.front.address())
    }

    /// Cuts the replica off its master: what the master takes from now on,
    /// the replica misses.
    pub fn leave_replica_behind(&self) {
        self.link.cut();
    }

    /// Promotes the replica (`REPLICAOF NO ONE`), moves posbridge's address
    /// to it and kills the old master: a failover. How many bytes of the
    /// replication stream the promoted replica missed; `None` without a
    /// replica (one failover a schedule).
    pub async fn fail_over(&mut self) -> Option<i64> {
        let mut replica = self.replica.take()?;
        let missed = self.master.repl_offset().await - replica.repl_offset().await;
        assert_eq!(replica.cli(&["REPLICAOF", "NO", "ONE"]).await.trim(), "OK");
        replica.replica_of = None;
        self.front.redirect(replica.port);
        let old = std::mem::replace(&mut self.master, replica);
        drop(old);
        Some(missed)
    }
}

/// One `posbridge serve` process on a port it keeps across restarts, on
/// the shared Redis ledger, its log appended to across lives.
pub struct Serve {
    pub name: String,
    pub port: u16,
    config: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    http: reqwest::Client,
}

impl Serve {
    /// Its config, written under `work`: both providers' `main` sources,
    /// topics under `prefix`, the ledger at `redis` under `prefix`.
    pub fn new(name: &str, work: &Path, brokers: &str, redis: &str, prefix: &str) -> Serve {
        let port = free_port();
        let config = work.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            replica_config_text(
                (port, brokers, redis, prefix),
                "inflight_wait_ms = 1000\nretry_after_secs = 1",
                ("", ""),
            ),
        )
        .unwrap();
        Serve {
            name: name.to_owned(),
            port,
            config,
            log: work.join(format!("{name}.log")),
            child: None,
            http: reqwest::Client::new(),
        }
    }

    /// Its base URL.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Starts it, without waiting.
    pub fn spawn(&mut self) {
        self.child = Some(spawn_serve_logging(&self.config, &self.log));
    }

    /// Its `/readyz` body, or `None` while it does not answer.
    pub async fn readyz(&self) -> Option<Value> {
        let response = self
            .http
            .get(format!("{}/readyz", self.base()))
            .send()
            .await
            .ok()?;
        response.json().await.ok()
    }

    /// Waits until its `/readyz` answers 200; fails with its log if it
    /// exits.
    pub async fn wait_ready(&mut self) {
        let url = format!("{}/readyz", self.base());
        let (http, name, log) = (self.http.clone(), self.name.clone(), self.log.clone());
        let child = self.child.as_mut().expect("it was started");
        wait_until(
            Duration::from_secs(60),
            &format!("{name} to be ready"),
            async || {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("{name} exited ({status}):\n{}", log_tail(&log));
                }
                http.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
    }

    /// kill -9, and its end waited for.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
        }
    }
}
