//! `scripts/dev-stack`, the README's first command, stops everything it
//! started on SIGTERM as on Ctrl-C: a supervisor or `kill` that stops the
//! script leaves no broker or posbridge running behind it.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::wait::{look_for, wait_until};
use crate::support::{BrokerKind, broker_kind, free_port, free_ports, log_tail, script};

/// Whether something listens on the loopback `port`.
fn listening(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[tokio::test]
async fn dev_stack_stops_everything_on_sigterm() {
    let var = tempfile::tempdir().unwrap();
    let broker_port = free_ports(4);
    let (listen, admin) = (free_port(), free_port());
    let log = var.path().join("dev-stack.log");
    let mut stack = Command::new(script("dev-stack"))
        .env("POSBRIDGE_DEV_BIN", env!("CARGO_BIN_EXE_posbridge"))
        .env("POSBRIDGE_DEV_VAR", var.path())
        .env("POSBRIDGE_DEV_BROKER_PORT", broker_port.to_string())
        .env("POSBRIDGE_DEV_LISTEN", format!("127.0.0.1:{listen}"))
        .env("POSBRIDGE_DEV_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
        .env(
            "POSBRIDGE_BROKER",
            match broker_kind() {
                BrokerKind::Kafka => "kafka",
                BrokerKind::Tansu => "tansu",
            },
        )
        .env("POSBRIDGE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(var.path().join("dev-stack.err")).unwrap())
        // Its own group, so what it leaves behind can be killed after a failure.
        .process_group(0)
        .spawn()
        .unwrap();
    // The group is named to pkill by its number: `kill -9 -PGID` from
    // procps-ng 4.0.2 (Debian 12) killed every process of the machine.
    let group = stack.id().to_string();
    let ready = format!("http://127.0.0.1:{listen}/readyz");
    let http = reqwest::Client::new();
    wait_until(
        Duration::from_secs(120),
        "the dev stack to be ready",
        async || {
            http.get(&ready)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        },
    )
    .await;

    Command::new("kill")
        .args(["-TERM", &stack.id().to_string()])
        .status()
        .unwrap();
    let exited = look_for(Duration::from_secs(60), async || stack.try_wait().unwrap()).await;
    let left = (listening(listen), listening(broker_port));
    // Whatever the outcome, nothing of it outlives the test.
    let _ = Command::new("pkill").args(["-KILL", "-g", &group]).status();
    let _ = stack.wait();
    let status = exited.unwrap_or_else(|| {
        panic!(
            "scripts/dev-stack still runs 60 s after SIGTERM; its output:\n{}",
            log_tail(&log)
        )
    });
    assert_eq!(status.code(), Some(143), "the status of a stop by SIGTERM");
    assert_eq!(
        left,
        (false, false),
        "posbridge and the broker stopped with it"
    );
}
