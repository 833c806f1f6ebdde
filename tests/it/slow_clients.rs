//! Slow, idle and too many clients over real TCP: each is bounded, and none
//! keeps shutdown waiting past `shutdown_timeout_ms`.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::wait::wait_until;
use crate::support::{TestApp, brokers, config, unique};

async fn start(edit: impl FnOnce(&mut posbridge::config::Config)) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&brokers(), &unique("slow"), dir.path());
    edit(&mut config);
    assert_eq!(posbridge::app::problems(&config), vec![]);
    (TestApp::start_with(config).await, dir)
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; what it sent, and when.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut bytes = Vec::new();
    tokio::time::timeout(limit, stream.read_to_end(&mut bytes))
        .await
        .expect("the server kept the connection open")
        .ok();
    (
        String::from_utf8_lossy(&bytes).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn unfinished_headers_and_idle_keep_alive_connections_are_closed() {
    let (app, _dir) = start(|c| c.server.header_read_timeout_ms = 400).await;

    let mut slow = connect(&app).await;
    slow.write_all(b"POST /webhooks/mekari/main HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (_, after) = read_to_close(&mut slow, Duration::from_secs(5)).await;
    assert!(
        after >= Duration::from_millis(300),
        "closed too early: {after:?}"
    );

    let mut idle = connect(&app).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_to_close(&mut idle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    app.stop().await;
}

#[tokio::test]
async fn a_connection_over_the_cap_gets_a_json_503_and_the_cap_frees_up() {
    let (app, _dir) = start(|c| {
        c.server.max_connections = 3;
        c.server.header_read_timeout_ms = 1500;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(&app).await);
    }
    // A connect returns once the kernel queued it; nothing outside the
    // server says when it took the three places, so it is given a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut over = connect(&app).await;
    over.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_to_close(&mut over, Duration::from_secs(3)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 7"), "{answer}");
    assert!(
        answer.ends_with(r#"{"error":"too many open connections, retry later"}"#),
        "{answer}"
    );

    // The held connections time out (no request head), and their places free up.
    drop(held);
    wait_until(Duration::from_secs(5), "a place to free up", async || {
        app.get("/healthz").await.status() == 200
    })
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_slow_body_does_not_hold_shutdown_past_its_timeout() {
    let (app, _dir) = start(|c| {
        c.server.body_read_timeout_ms = 8000;
        c.server.shutdown_timeout_ms = 500;
    })
    .await;
    let mut slow = connect(&app).await;
    slow.write_all(
        b"POST /webhooks/mekari/main HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{\"id\":",
    )
    .await
    .unwrap();
    // The server must be reading the body when shutdown starts; no signal
    // outside it says so, so it is given a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    app.stop().await;
    let took = started.elapsed();
    // The body would have had 8 s; shutdown gives open connections 0.5 s.
    assert!(
        took < Duration::from_secs(4),
        "shutdown waited {took:?} for a slow body"
    );
    let (_, _) = read_to_close(&mut slow, Duration::from_secs(2)).await;
}
