//! A deploy refuses nothing: two `posbridge serve` processes on one Redis
//! ledger behind a real HAProxy that checks `/readyz`, a load of signed
//! deliveries running through it while one replica and then the other is
//! sent SIGTERM and started again (a rolling restart). Every attempt must
//! be answered 2xx within the providers' 10 s, and every delivery's record
//! must be on its topic exactly once. Once with Kafka up, once with Kafka
//! cut for the whole restart (both sources spool; the spools drain after).
//!
//! HAProxy here re-sends nothing (`retries 0`, no redispatch), as a
//! Kubernetes Service does not: a connection refused by a replica that
//! stopped listening reaches the provider as a failed attempt, which
//! ReceiptRoller counts toward switching the webhook off.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::support::redis::RedisServer;
use crate::support::wait::{wait_for, wait_until};
use crate::support::{
    OwnBroker, brokers, free_port, log_tail, mekari_order, read_topic, replica_config_text,
    rr_sale, signed_request, spawn_serve_logging, unique,
};

/// HAProxy's health checks: every 200 ms, out after 2 failures, back after
/// 2 successes. A check of a replica whose broker is cut still answers at
/// once (the broker's state is known), so 3 s is only a bound.
const CHECKS: &str = "inter 200ms fall 2 rise 2";

/// What each replica is given for `server.drain_delay_ms`: HAProxy's
/// 2 × 200 ms to see `/readyz` fail, a check under way, and room for a
/// loaded machine.
const DRAIN_DELAY_MS: u64 = 1500;

/// The providers' limit on an answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// Deliveries sent at once, and how often each sender sends.
const SENDERS: usize = 4;
const SEND_EVERY: Duration = Duration::from_millis(40);

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_behind_haproxy_refuses_no_attempt_and_loses_nothing() {
    rolling_restart(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_during_a_broker_outage_refuses_no_attempt_and_loses_nothing() {
    let broker = OwnBroker::start().await;
    rolling_restart(Some(&broker)).await;
}

/// The scenario, on the suite's broker, or on `outage`'s cut for the whole
/// restart and healed before the records are read.
async fn rolling_restart(outage: Option<&OwnBroker>) {
    let brokers = outage.map_or_else(brokers, OwnBroker::address);
    let redis = RedisServer::start(free_port(), &[]).await;
    let prefix = unique("rolling");
    let work = tempfile::tempdir().unwrap();
    let mut replicas: Vec<Replica> = (1..=2)
        .map(|n| Replica::new(n, work.path(), &brokers, &redis.url(), &prefix))
        .collect();
    // The first creates the topics; the second finds them.
    for replica in &mut replicas {
        replica.start().await;
    }
    let haproxy = Haproxy::start(work.path(), &replicas).await;
    haproxy.wait_up(&["r1", "r2"]).await;

    if let Some(broker) = outage {
        broker.cut();
    }
    let load = Load::start(haproxy.base());
    load.wait_answered(50).await;
    let mut reached = Vec::new();
    for replica in &mut replicas {
        let served_before = haproxy.sessions(&replica.name).await;
        let sent = replica.signal_term();
        haproxy.wait_down(&replica.name).await;
        let sent_meanwhile = haproxy.sessions(&replica.name).await - served_before;
        let took = replica.wait_exit(sent).await;
        eprintln!(
            "{} stopped {took:?} after SIGTERM; HAProxy sent it {sent_meanwhile} requests before it took it out",
            replica.name
        );
        reached.push(sent_meanwhile);
        replica.start().await;
        haproxy.wait_up(&["r1", "r2"]).await;
        load.wait_answered(50).await;
    }
    let attempts = load.stop().await;
    // Otherwise the window this test is about was never exercised. Not
    // asked of each replica: with the broker cut, a replica restarted
    // before the other's turn holds each delivery up to the ledger's wait,
    // and the senders may have nothing on the way in the other's window.
    assert!(
        reached.iter().any(|sent| *sent > 0),
        "HAProxy sent no replica anything between its SIGTERM and taking it out ({reached:?}): the test did not reach the window it is about"
    );

    let refused: Vec<&Attempt> = attempts.iter().filter(|a| !a.answered_2xx()).collect();
    let slowest = attempts.iter().map(|a| a.took).max().unwrap_or_default();
    let slow = attempts
        .iter()
        .filter(|a| a.took > Duration::from_millis(500))
        .count();
    eprintln!(
        "{} attempts, {} refused, slowest answer {slowest:?}, {slow} over 0.5 s",
        attempts.len(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {} attempts refused during the rolling restart; the first: {:#?}\nreplica logs:\n{}",
        refused.len(),
        attempts.len(),
        &refused[..refused.len().min(5)],
        replicas
            .iter()
            .map(|r| format!("{}:\n{}", r.name, log_tail(&r.log)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(slowest < ANSWER_LIMIT, "an answer took {slowest:?}");
    if outage.is_some() {
        let spooled = attempts.iter().filter(|a| a.what == "spooled").count();
        assert!(spooled > 0, "the broker was cut, yet nothing was spooled");
    }

    if let Some(broker) = outage {
        broker.heal();
    }
    // Every delivery's record on its topic, once.
    let written = wait_for(
        Duration::from_secs(60),
        "every delivery's record on its topic",
        async || {
            let mut written: HashMap<String, Vec<&str>> = HashMap::new();
            for plural in ["sales", "orders"] {
                for record in read_topic(&brokers, &format!("{prefix}.{plural}")) {
                    let id = record.headers["posbridge-delivery-id"].clone();
                    written.entry(id).or_default().push(plural);
                }
            }
            attempts
                .iter()
                .all(|a| written.contains_key(&a.id))
                .then_some(written)
        },
    )
    .await;
    for attempt in &attempts {
        assert_eq!(written[&attempt.id], [attempt.topic], "{}", attempt.id);
    }
    assert_eq!(
        written.len(),
        attempts.len(),
        "records of deliveries never sent"
    );
    for replica in &mut replicas {
        replica.terminate().await;
    }
}

/// One `posbridge serve` process, on a port of its own that it keeps
/// across restarts, with its own spool and the shared Redis ledger.
struct Replica {
    /// `r1`, `r2`: its name in HAProxy.
    name: String,
    port: u16,
    config: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    fn new(n: usize, work: &Path, brokers: &str, redis: &str, prefix: &str) -> Replica {
        let name = format!("r{n}");
        let port = free_port();
        let dir = work.join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("posbridge.toml");
        let spool = dir.join("spool.redb");
        std::fs::write(
            &config,
            replica_config_text(
                (port, brokers, redis, prefix),
                &format!(
                    "inflight_wait_ms = 2000\nretry_after_secs = 7\ndrain_delay_ms = {DRAIN_DELAY_MS}"
                ),
                (
                    &format!("[spool]\npath = \"{}\"", spool.display()),
                    r#"on_broker_unavailable = "spool""#,
                ),
            ),
        )
        .unwrap();
        Replica {
            log: dir.join("posbridge.log"),
            name,
            port,
            config,
            child: None,
        }
    }

    /// Starts it and waits until its own `/readyz` answers 200.
    async fn start(&mut self) {
        self.child = Some(spawn_serve_logging(&self.config, &self.log));
        let http = reqwest::Client::new();
        let url = format!("http://127.0.0.1:{}/readyz", self.port);
        wait_until(
            Duration::from_secs(60),
            &format!("{} to be ready", self.name),
            async || {
                if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!("{} exited ({status}):\n{}", self.name, log_tail(&self.log));
                }
                http.get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
    }

    /// Sends it SIGTERM: when.
    fn signal_term(&self) -> Instant {
        let child = self.child.as_ref().expect("the replica runs");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &child.id().unwrap().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        Instant::now()
    }

    /// Waits until it has exited, successfully: how long after `sent`.
    async fn wait_exit(&mut self, sent: Instant) -> Duration {
        let mut child = self.child.take().expect("the replica runs");
        let exited = tokio::time::timeout(Duration::from_secs(60), child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} still runs 60 s after SIGTERM", self.name))
            .unwrap();
        assert!(
            exited.success(),
            "{} exited with {exited}:\n{}",
            self.name,
            log_tail(&self.log)
        );
        sent.elapsed()
    }

    /// SIGTERM, and its exit waited for.
    async fn terminate(&mut self) {
        let sent = self.signal_term();
        self.wait_exit(sent).await;
    }
}

/// HAProxy in front of the replicas, with its statistics on a port of
/// their own. Killed on drop.
struct Haproxy {
    port: u16,
    stats: u16,
    _child: Child,
    http: reqwest::Client,
}

impl Haproxy {
    async fn start(work: &Path, replicas: &[Replica]) -> Haproxy {
        let (port, stats) = (free_port(), free_port());
        let servers: String = replicas
            .iter()
            .map(|r| format!("  server {} 127.0.0.1:{} check\n", r.name, r.port))
            .collect();
        let config = work.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n  maxconn 1000\n\
                 defaults\n  mode http\n  timeout connect 2s\n  timeout client 30s\n  \
                 timeout server 15s\n  timeout check 3s\n  retries 0\n\
                 frontend webhooks\n  bind 127.0.0.1:{port}\n  default_backend replicas\n\
                 backend replicas\n  balance roundrobin\n  option httpchk GET /readyz\n  \
                 default-server {CHECKS}\n{servers}\
                 listen stats\n  bind 127.0.0.1:{stats}\n  stats enable\n  stats uri /stats\n"
            ),
        )
        .unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("haproxy (scripts/test-deps installs it)");
        let haproxy = Haproxy {
            port,
            stats,
            _child: child,
            http: reqwest::Client::new(),
        };
        wait_until(Duration::from_secs(20), "HAProxy to start", async || {
            haproxy.table().await.is_some()
        })
        .await;
        haproxy
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The backend's servers' rows of HAProxy's CSV statistics, by name:
    /// each a map of column to value.
    async fn table(&self) -> Option<HashMap<String, HashMap<String, String>>> {
        let csv = self
            .http
            .get(format!("http://127.0.0.1:{}/stats;csv", self.stats))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let mut lines = csv.lines();
        let columns: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
        Some(
            lines
                .map(|line| columns.iter().copied().zip(line.split(',')).collect())
                .filter(|row: &HashMap<&str, &str>| row.get("pxname") == Some(&"replicas"))
                .map(|row| {
                    (
                        row["svname"].to_owned(),
                        row.iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                    )
                })
                .collect(),
        )
    }

    /// Waits until HAProxy sends to every one of `servers` (each `UP`).
    async fn wait_up(&self, servers: &[&str]) {
        wait_until(
            Duration::from_secs(30),
            &format!("HAProxy to have {servers:?} up"),
            async || {
                self.table().await.is_some_and(|table| {
                    servers
                        .iter()
                        .all(|s| table.get(*s).is_some_and(|row| row["status"] == "UP"))
                })
            },
        )
        .await;
    }

    /// Waits until HAProxy has taken `server` out (`DOWN`).
    async fn wait_down(&self, server: &str) {
        wait_until(
            Duration::from_secs(30),
            &format!("HAProxy to take {server} out"),
            async || {
                self.table().await.is_some_and(|table| {
                    table
                        .get(server)
                        .is_some_and(|row| row["status"].starts_with("DOWN"))
                })
            },
        )
        .await;
    }

    /// Requests HAProxy has sent to `server` so far.
    async fn sessions(&self, server: &str) -> u64 {
        let table = self.table().await.expect("HAProxy's statistics");
        table[server]["stot"].parse().unwrap()
    }
}

/// One webhook request as a provider saw it.
#[derive(Debug)]
struct Attempt {
    id: String,
    /// The topic its record goes to (`sales`, `orders`).
    topic: &'static str,
    /// The status, or the connection error.
    answer: Result<u16, String>,
    /// The answer's `status` field (`published`, `spooled`, …).
    what: String,
    took: Duration,
}

impl Attempt {
    fn answered_2xx(&self) -> bool {
        self.answer
            .as_ref()
            .is_ok_and(|status| (200..300).contains(status))
    }
}

/// Senders of signed deliveries through HAProxy, each delivery a new
/// entity, alternately a ReceiptRoller sale and a Mekari order, until
/// stopped.
struct Load {
    attempts: Arc<Mutex<Vec<Attempt>>>,
    stop: watch::Sender<bool>,
    senders: tokio::task::JoinSet<()>,
}

impl Load {
    fn start(base: String) -> Load {
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let mut senders = tokio::task::JoinSet::new();
        let run = unique("d");
        for sender in 0..SENDERS {
            let (attempts, stopped, base, run) =
                (attempts.clone(), stopped.clone(), base.clone(), run.clone());
            senders.spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(ANSWER_LIMIT)
                    // Dropped before HAProxy's 30 s client timeout closes it.
                    .pool_idle_timeout(Duration::from_secs(5))
                    .build()
                    .unwrap();
                let mut every = tokio::time::interval(SEND_EVERY);
                for n in 0.. {
                    every.tick().await;
                    if *stopped.borrow() {
                        break;
                    }
                    let id = format!("{run}-{sender}-{n}");
                    let (provider, topic, body) = if n % 2 == 0 {
                        let sale = format!("T{sender}|2026-12|{run}-{n}");
                        let at = "2026-12-06T10:15:30Z";
                        let body = rr_sale(&id, "sale.created", at, &sale, 1100);
                        ("receiptroller", "sales", body)
                    } else {
                        let order = format!("ORD-{run}-{sender}-{n}");
                        let at = "2026-12-06T17:15:30+07:00";
                        let body = mekari_order(&id, "order.created", at, &order, "new");
                        ("mekari", "orders", body)
                    };
                    let request = signed_request(
                        &http,
                        &base,
                        provider,
                        "main",
                        &id,
                        serde_json::to_vec(&body).unwrap(),
                        None,
                    );
                    let sent = Instant::now();
                    let (answer, what) = match request.send().await {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let json: Value = response.json().await.unwrap_or(Value::Null);
                            let what = json["status"].as_str().unwrap_or("error").to_owned();
                            (Ok(status), what)
                        }
                        Err(error) => (Err(format!("{error:?}")), "no answer".to_owned()),
                    };
                    attempts.lock().unwrap().push(Attempt {
                        id,
                        topic,
                        answer,
                        what,
                        took: sent.elapsed(),
                    });
                }
            });
        }
        Load {
            attempts,
            stop,
            senders,
        }
    }

    /// Waits until `more` attempts beyond those so far were answered 2xx.
    async fn wait_answered(&self, more: usize) {
        let answered = || {
            let attempts = self.attempts.lock().unwrap();
            attempts.iter().filter(|a| a.answered_2xx()).count()
        };
        let target = answered() + more;
        wait_until(
            Duration::from_secs(60),
            &format!("{more} more deliveries answered 2xx"),
            async || answered() >= target,
        )
        .await;
    }

    /// Stops sending, waits for the answers under way: every attempt.
    async fn stop(mut self) -> Vec<Attempt> {
        self.stop.send_replace(true);
        while let Some(sender) = self.senders.join_next().await {
            sender.unwrap();
        }
        std::mem::take(&mut *self.attempts.lock().unwrap())
    }
}
