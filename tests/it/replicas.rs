//! Three `serve` replicas behind HAProxy, sharing a Redis ledger and a
//! three-node Kafka cluster, one of them killed under load and restarted on
//! its spool: `scripts/replicas` runs it all and checks what it read back
//! (nothing answered 2xx lost, nothing written twice beyond the in-doubt
//! deliveries of the killed replica, the compacted view equals the
//! simulator's truth). The test runs the operator's script on the debug
//! build and holds it to its verdict and figures. Kafka only (`kafka_only`
//! in its name): tansu is a single node.

use crate::support::kafka_only;
use std::path::Path;

use crate::support::free_ports;

#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_three_replicas_behind_haproxy_lose_nothing_when_one_is_killed() {
    kafka_only("the script runs a three-node cluster");
    let work = tempfile::tempdir().unwrap();
    let python = crate::support::python_path();
    let output = tokio::process::Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/replicas"),
    )
    .args([
        "--debug",
        "--no-build",
        "--events",
        "240",
        "--python",
        &python,
    ])
    .arg("--base-port")
    .arg(free_ports(23).to_string())
    .arg("--work")
    .arg(work.path())
    .output()
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = || {
        let logs: String = (1..=3)
            .map(|n| {
                let log = std::fs::read_to_string(work.path().join(format!("replica-{n}.log")))
                    .unwrap_or_default();
                format!("\nreplica {n}'s log:\n{log}")
            })
            .collect();
        format!(
            "{stdout}\n{}{logs}",
            String::from_utf8_lossy(&output.stderr)
        )
    };
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "scripts/replicas failed:\n{}",
        report()
    );
    let line = |start: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line `{start}…` in:\n{}", report()))
            .to_owned()
    };
    // The verdict rests on these lines; they must say what it claims.
    assert_eq!(
        line("lost ("),
        "lost (answered 2xx, not written, not superseded): 0"
    );
    assert!(line("replica 2 killed").contains("deliveries in flight"));
    assert!(
        line("events: ").starts_with("events: 240; answered 2xx (delivered): 240"),
        "{}",
        report()
    );
    assert!(line("duplicated deliveries: ").contains("on two replicas"));
    assert!(stdout.contains("replicas: PASS"));
}
