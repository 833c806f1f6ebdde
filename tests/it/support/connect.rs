//! A Kafka Connect worker of a test's own (`scripts/connect`, with the
//! Debezium JDBC sink and Apicurio's AvroConverter that
//! `scripts/ensure-connect` assembles), and its connectors
//! (`scripts/sink-connector`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::ports::free_ports;
use super::processes::{log_tail, off_the_runtime, python_path, script};
use super::wait::look_for;

/// Why this machine cannot run a Connect worker, if it cannot.
pub fn missing() -> Option<String> {
    let java = Command::new(script("find-java"))
        .args(["17", "--maven"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    (!java.is_ok_and(|s| s.success()))
        .then(|| "no Java 17+ with Maven for the Kafka Connect worker".to_owned())
}

/// A Kafka Connect worker of its own (`scripts/connect`: distributed mode,
/// one worker, its group and internal topics named from a unique group id on
/// the shared broker). Its REST API is given 120 s: a JVM starting beside
/// a loaded suite. Killed (SIGTERM, then waited for) on drop.
pub struct Worker {
    /// Its REST API, `http://127.0.0.1:PORT`.
    pub rest: String,
    child: Child,
    /// What scripts/connect printed (the JVM's own words at start).
    log: PathBuf,
    /// The worker's log (deploy/connect/log4j2.xml writes it to a file).
    worker_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Worker {
    pub async fn start(brokers: &str, group: &str) -> Worker {
        let dir = tempfile::tempdir().unwrap();
        let port = free_ports(1);
        let log = dir.path().join("connect.out");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(script("connect"))
            .arg(brokers)
            .arg(port.to_string())
            .arg(dir.path().join("state"))
            .env("POSBRIDGE_CONNECT_GROUP", group)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("scripts/connect");
        let mut worker = Worker {
            rest: format!("http://127.0.0.1:{port}"),
            child,
            log,
            worker_log: dir.path().join("state/logs/connect.log"),
            _dir: dir,
        };
        let http = reqwest::Client::new();
        let started = Instant::now();
        let up = look_for(Duration::from_secs(120), async || {
            if let Some(status) = worker.child.try_wait().unwrap() {
                panic!("the Connect worker exited ({status}):\n{}", worker.logs());
            }
            let answer = http.get(format!("{}/connectors", worker.rest)).send().await;
            answer.is_ok_and(|a| a.status().is_success()).then_some(())
        })
        .await;
        assert!(
            up.is_some(),
            "the Connect worker's REST API did not answer within 120 s:\n{}",
            worker.logs()
        );
        println!(
            "Connect worker answers after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        worker
    }

    /// `scripts/sink-connector` with deploy/connect/pos-postgres-sink.json
    /// and `overrides`: PUT, then RUNNING for 15 s (or its exit status 1
    /// with the failing task's trace).
    pub async fn connector(&self, name: &str, overrides: &[String]) {
        let mut command = Command::new(python_path());
        command
            .arg(script("sink-connector"))
            .args(["--connect", &self.rest, "--name", name, "--timeout", "120"])
            .args(overrides);
        let out = off_the_runtime(command).await;
        assert!(
            out.status.success(),
            "sink-connector {name}: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
    }

    /// The end of both logs, for a failure's message.
    pub fn logs(&self) -> String {
        format!(
            "scripts/connect:\n{}\nconnect.log:\n{}",
            log_tail(&self.log),
            log_tail(&self.worker_log)
        )
    }
}

/// How long a worker may take to stop on SIGTERM before it is killed: its
/// graceful stop can wait on the broker without end (seen hanging a CI run).
const STOP_WITHIN: Duration = Duration::from_secs(15);

impl Drop for Worker {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").arg(&pid).status();
        // Waits for the exit; a watcher kills the worker if the exit has not
        // come within STOP_WITHIN (a condition with a deadline, no polling).
        let (exited, watched) = std::sync::mpsc::channel::<()>();
        let watcher = std::thread::spawn(move || {
            if watched.recv_timeout(STOP_WITHIN).is_err() {
                let _ = Command::new("kill").args(["-9", &pid]).status();
            }
        });
        let _ = self.child.wait();
        let _ = exited.send(());
        let _ = watcher.join();
    }
}
