//! A posbridge restarted while Kafka and the schema registry are away (a
//! deploy or a node drain during an outage) starts on what an earlier start
//! found (the topics, the schema ids), kept beside its spool: spooling
//! sources accept, the others answer 503, `/readyz` says `degraded`, and
//! once both are back it is fully ready and the spool drains. It answers
//! at once, not after waiting for Kafka. Without that knowledge it refuses
//! to start, saying why.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::proxy::CutProxy;
use crate::support::registry::registry_url;
use crate::support::wait::look_for;
use crate::support::{
    OwnBroker, free_port, listening_on, mekari_order, read_topic, rr_sale, signed_request,
    spool_config_text, timed, wait_healthy,
};

/// The shared registry behind a proxy the test can cut, and the URL
/// posbridge uses through it.
async fn registry_proxy() -> (CutProxy, String) {
    let url = registry_url();
    let rest = url.trim_start_matches("http://");
    let (host_port, path) = rest.split_once('/').unwrap();
    let port: u16 = host_port.rsplit_once(':').unwrap().1.parse().unwrap();
    let proxy = CutProxy::start(port, None).await;
    let through = format!("http://{}/{path}", proxy.address());
    (proxy, through)
}

/// The produce deadline of these tests: long, so that a start-up that
/// waits for it stands out from one that does not.
const DELIVERY_TIMEOUT: Duration = Duration::from_millis(6000);

/// A spooling configuration with the registry, listening on `port`.
fn outage_config(brokers: &str, registry: &str, dir: &std::path::Path, port: u16) -> String {
    let prefix = crate::support::unique("outage-start");
    listening_on(&spool_config_text(brokers, &prefix, dir), port).replace(
        "delivery_timeout_ms = 3000",
        &format!("delivery_timeout_ms = {}", DELIVERY_TIMEOUT.as_millis()),
    ) + &format!("[schema_registry]\nurl = \"{registry}\"\n")
}

/// `posbridge serve` on `config`, its stderr kept for a failed start.
fn serve(config: &std::path::Path) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(["serve", "--config"])
        .arg(config)
        .env("POSBRIDGE_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

async fn send(http: &reqwest::Client, base: &str, provider: &str, body: &Value) -> (u16, Value) {
    let request = signed_request(
        http,
        base,
        provider,
        "main",
        body["id"].as_str().unwrap(),
        serde_json::to_vec(body).unwrap(),
        None,
    );
    let answer = timed(request).await;
    (answer.status, answer.json)
}

async fn readiness(http: &reqwest::Client, base: &str) -> (u16, Value) {
    let response = http.get(format!("{base}/readyz")).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_during_an_outage_starts_degraded_on_what_an_earlier_start_found() {
    let broker = OwnBroker::start().await;
    let (registry, registry_url) = registry_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let text = outage_config(&broker.address(), &registry_url, dir.path(), port);
    let prefix = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("topic_prefix = \""))
        .unwrap()
        .trim_end_matches("\"")
        .to_owned();
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, &text).unwrap();
    let http = reqwest::Client::new();

    // A first start with both servers up: it learns the topics and ids.
    let mut first = serve(&path);
    wait_healthy(&http, &base).await;
    let sale = |n: u32| {
        rr_sale(
            &format!("os-{n}"),
            "sale.created",
            "2026-11-29T10:15:30Z",
            &format!("T1|2026-11|{n:04}"),
            100,
        )
    };
    assert_eq!(send(&http, &base, "receiptroller", &sale(1)).await.0, 200);
    first.kill().unwrap();
    first.wait().unwrap();

    // Both away; posbridge restarted.
    broker.cut();
    registry.cut();
    let restarted = Instant::now();
    let mut second = serve(&path);
    wait_healthy(&http, &base).await;
    // Not a speed target: a start-up that waits for the produce deadline
    // before it listens leaves every delivery of that time refused.
    let answering_after = restarted.elapsed();
    assert!(
        answering_after < DELIVERY_TIMEOUT / 2,
        "posbridge answered {answering_after:?} after its restart, as if it waited for the produce deadline ({DELIVERY_TIMEOUT:?})"
    );
    let (status, ready) = readiness(&http, &base).await;
    assert_eq!(status, 200, "a spool with room takes deliveries: {ready}");
    assert_eq!(ready["status"], "degraded", "{ready}");
    assert_eq!(ready["broker"], "unavailable", "{ready}");
    // The ledger is not filled from the topics yet (Kafka is away): nothing
    // is decided, and /readyz says how far the fill got and why it waits.
    assert!(
        ready["ledger"]
            .as_str()
            .is_some_and(|l| l.contains("rebuilt from the topics")),
        "{ready}"
    );
    assert_eq!(ready["ledger_rebuild"]["running"], false, "{ready}");
    let (status, answer) = send(&http, &base, "receiptroller", &sale(2)).await;
    assert_eq!((status, answer["status"].as_str()), (200, Some("spooled")));
    let order = mekari_order(
        "os-mk-1",
        "order.created",
        "2026-11-29T17:15:30+07:00",
        "ORD-OS",
        "new",
    );
    assert_eq!(send(&http, &base, "mekari", &order).await.0, 503);

    // Both back: fully ready, the spool drains into the topic.
    broker.heal();
    registry.heal();
    let ready = look_for(Duration::from_secs(60), async || {
        let (status, ready) = readiness(&http, &base).await;
        (status == 200 && ready["status"] == "ok" && ready["spool"]["entries"] == 0).then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "never fully ready: {}",
        readiness(&http, &base).await.1
    );
    let keys: Vec<String> = read_topic(&broker.address(), &format!("{prefix}sales"))
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        keys.contains(&"receiptroller:T1|2026-11|0002".to_owned()),
        "the spooled sale: {keys:?}"
    );
    assert_eq!(send(&http, &base, "mekari", &order).await.0, 200);
    second.kill().unwrap();
    second.wait().unwrap();

    // A posbridge that never met this cluster refuses to start, saying why.
    broker.cut();
    let fresh = tempfile::tempdir().unwrap();
    let fresh_path = fresh.path().join("posbridge.toml");
    std::fs::write(
        &fresh_path,
        outage_config(&broker.address(), &registry_url, fresh.path(), free_port()),
    )
    .unwrap();
    let output = tokio::task::spawn_blocking(move || serve(&fresh_path).wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("posbridge could not start"), "{stderr}");
    assert!(stderr.contains("Kafka"), "{stderr}");
}
