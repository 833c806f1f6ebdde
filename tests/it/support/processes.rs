//! Other programs a test runs: posbridge as its own process (a fresh
//! build of it or of an example), the venv's Python with Confluent's
//! client, the repository's scripts, and their logs when they fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{brokers, wait};

/// The first record of `topic` as decoded by Confluent's Python client and
/// fastavro (`tests/python/decode.py`), which also checks the framing.
pub async fn decode_with_python(topic: &str, registry: Option<&str>) -> Value {
    let decode = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/decode.py");
    let brokers = brokers();
    let mut args = vec![decode, brokers.as_str(), topic];
    args.extend(registry);
    let output = python(&args).await;
    let first = output.stdout.split(|b| *b == b'\n').next().unwrap();
    serde_json::from_slice(first).unwrap()
}

/// The venv's Python, with Confluent's client (scripts/test makes it).
pub fn python_path() -> String {
    std::env::var("POSBRIDGE_TEST_PYTHON")
        .expect("POSBRIDGE_TEST_PYTHON (Confluent's client) is set by scripts/test")
}

/// A script of this repository.
pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// The last 40 lines of a log file, or why there are none: for the message
/// of a test that failed on a server it started.
pub fn log_tail(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        }
        Err(error) => format!("({}: {error})", path.display()),
    }
}

/// Runs a command that blocks (psql, a script) off the runtime's threads,
/// so the posbridge a test runs in its process keeps them.
pub async fn off_the_runtime(mut command: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().expect("the command starts"))
        .await
        .unwrap()
}

/// Runs the venv's Python (Confluent's client) with `args`; fails the test
/// with its stderr unless it succeeds.
pub async fn python(args: &[&str]) -> std::process::Output {
    let output = tokio::process::Command::new(python_path())
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "python: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Fails when a file a binary was built from (as cargo's dep-info file
/// beside it lists them) changed after it was built: a plain `cargo test`
/// does not rebuild another package's binary or an example.
pub fn assert_fresh(binary: &Path) {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let (Some(built), Ok(dep_info)) = (
        modified(binary),
        std::fs::read_to_string(binary.with_extension("d")),
    ) else {
        return;
    };
    let sources = dep_info.split_once(": ").map_or("", |(_, list)| list);
    for source in sources.split_whitespace().map(Path::new) {
        assert!(
            modified(source).is_none_or(|changed| changed <= built),
            "{} changed after {} was built: run `cargo build --workspace --bins --examples` (scripts/test does)",
            source.display(),
            binary.display()
        );
    }
}

/// An example of this package, as `cargo build --examples` (which
/// scripts/test runs) leaves it beside the test binary.
pub fn example_binary(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("the test binary's own path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("examples").join(name);
    assert!(
        path.is_file(),
        "the example is not at {}: run `cargo build --examples` (scripts/test does)",
        path.display()
    );
    assert_fresh(&path);
    path
}

/// `posbridge serve` as its own process, quiet; kill it to crash it.
pub fn spawn_serve(config: &Path) -> std::process::Child {
    spawn_posbridge("serve", config)
}

/// `posbridge <command> --config <config>` as its own process, quiet.
pub fn spawn_posbridge(command: &str, config: &Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args([command, "--config"])
        .arg(config)
        .env("POSBRIDGE_LOG", "off")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// `posbridge serve` as its own process, its output appended to `log`
/// (what [`log_tail`] shows when it fails), killed when the handle drops.
pub fn spawn_serve_logging(config: &Path, log: &Path) -> tokio::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(["serve", "--config"])
        .arg(config)
        .env("POSBRIDGE_LOG", "info,rdkafka=warn")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Waits until a posbridge at `base` answers `/healthz` (30 s at most).
pub async fn wait_healthy(http: &reqwest::Client, base: &str) {
    wait::wait_until(Duration::from_secs(30), "posbridge to start", async || {
        http.get(format!("{base}/healthz")).send().await.is_ok()
    })
    .await;
}
