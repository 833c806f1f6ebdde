//! The ledger's rebuild from the topics, timed on the release posbridge.
//!
//! 1. posbridge (embedded ledger, default checkpoint interval) takes
//!    `POSBRIDGE_BENCH_ENTITIES` new deliveries of new entities (default
//!    1 million) on a closed loop of 64 connections: the topics then hold
//!    that many entity records, each with its state headers, all within the
//!    dedup window (so a full rebuild restores as many done ids too);
//! 2. it is killed with SIGKILL under that load and started again on the
//!    same file: the **tail rebuild** reads what its last checkpoint did not
//!    cover;
//! 3. it is stopped, its file deleted (a lost volume), started again: the
//!    **full rebuild** reads everything;
//! 4. with `POSBRIDGE_BENCH_REDIS`, a posbridge on a new Redis prefix beside
//!    the same topics: the full rebuild into Redis.
//!
//! With `POSBRIDGE_BENCH_BASELINE` (another posbridge binary, e.g. a build
//! of the commit a change starts from), the full rebuilds (3, 4) are run by
//! it too, right after this one's, on the same topics: a change to the fill
//! is measured against what it changes in one run, and the topics are
//! written once. The size is `POSBRIDGE_BENCH_ENTITIES`, the partitions
//! `POSBRIDGE_BENCH_PARTITIONS` (1: every entity in one partition, the
//! fill's largest fold).
//!
//! Each row: records the rebuild read, its own seconds (`ledger_rebuild` in
//! `/readyz`), the seconds from the process's start until `/readyz` says
//! ready, its rate, and the process's CPU and peak RSS.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::load::{self, Dialect, Ids, Load};
use crate::server::{Server, free_addr};
use crate::{LedgerChoice, Settings, posbridge_command};

/// How long a rebuild may take before the bench gives up on it.
const READY_WITHIN: Duration = Duration::from_secs(1800);

/// Each fill chunk's closed loop.
const CHUNK: Duration = Duration::from_secs(10);

/// The `ledger_rebuild` figures `/readyz` shows once ready.
#[derive(Debug, Default)]
struct Rebuilt {
    records: u64,
    secs: f64,
}

/// Runs the four steps and prints a row each.
pub async fn run(settings: &Settings, run: &str) {
    let entities = crate::entities_from_env();
    let work = tempfile::tempdir().expect("work dir");
    let dir = work.path().join("posbridge");
    let embedded = LedgerChoice::Embedded(None);
    let binary = Path::new(env!("CARGO_BIN_EXE_posbridge"));
    let start_binary = |ledger: &LedgerChoice, dir: &Path, name: &str, binary: &Path| {
        let addr = free_addr();
        let command = posbridge_command(settings, addr, run, ledger, dir, binary);
        let started = Instant::now();
        let server = Server::start(command, addr, &work.path().join(format!("{name}.log")));
        (server, addr, started)
    };
    let start =
        |ledger: &LedgerChoice, dir: &Path, name: &str| start_binary(ledger, dir, name, binary);

    let (server, addr, _) = start(&embedded, &dir, "fill");
    wait_ready(addr).await;
    let began = Instant::now();
    let mut answered = 0;
    let mut chunk = 0;
    while answered < entities {
        let ids = Ids::Fresh(format!("{run}-fill{chunk}"));
        let measured = load::run(addr, Dialect::Bridge, closed(), ids, CHUNK).await;
        answered += measured.requests - measured.errors;
        chunk += 1;
    }
    println!(
        "filled: {answered} new entities through posbridge in {:.0} s ({:.0} req/s), then SIGKILL under load",
        began.elapsed().as_secs_f64(),
        answered as f64 / began.elapsed().as_secs_f64()
    );

    let under_load = tokio::spawn(load::run(
        addr,
        Dialect::Bridge,
        closed(),
        Ids::Fresh(format!("{run}-killed")),
        Duration::from_secs(6),
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(server);
    let killed = under_load.await.expect("load under the kill");
    println!(
        "killed after {} answers of the last load ({} refused or cut)",
        killed.requests - killed.errors,
        killed.errors
    );
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>10} {:>8} {:>9}",
        "rebuild", "records", "rebuild s", "to ready s", "records/s", "CPU s", "peak RSS"
    );

    let (server, addr, started) = start(&embedded, &dir, "tail");
    row(
        "embedded, tail after SIGKILL under load",
        &server,
        addr,
        started,
    )
    .await;
    drop(server);

    let binaries = std::iter::once(("", binary)).chain(
        settings
            .baseline
            .as_deref()
            .map(|baseline| (", baseline", baseline)),
    );
    for (which, binary) in binaries {
        std::fs::remove_file(dir.join("ledger.redb")).expect("delete the ledger file");
        let name = format!("full{}", which.replace(", ", "-"));
        let (server, addr, started) = start_binary(&embedded, &dir, &name, binary);
        row(
            &format!("embedded, full (file deleted){which}"),
            &server,
            addr,
            started,
        )
        .await;
        drop(server);

        if let Some(url) = &settings.redis {
            // The same topics (named after the directory), a Redis prefix
            // never used.
            let redis = LedgerChoice::Redis {
                url: url.clone(),
                prefix: Some(format!("{run}.{name}:")),
            };
            let (server, addr, started) =
                start_binary(&redis, &dir, &format!("redis-{name}"), binary);
            row(
                &format!("redis, full (new prefix){which}"),
                &server,
                addr,
                started,
            )
            .await;
        }
    }
}

fn closed() -> Load {
    Load::Closed { connections: 64 }
}

/// Waits for `server` to be ready and prints its rebuild's row.
async fn row(name: &str, server: &Server, addr: SocketAddr, started: Instant) {
    let rebuilt = wait_ready(addr).await;
    let to_ready = started.elapsed().as_secs_f64();
    let usage = server.usage();
    println!(
        "{name:<44} {:>10} {:>10.1} {:>10.1} {:>10.0} {:>8.1} {:>5} MiB",
        rebuilt.records,
        rebuilt.secs,
        to_ready,
        rebuilt.records as f64 / rebuilt.secs.max(0.001),
        usage.cpu.as_secs_f64(),
        usage.peak_rss / (1024 * 1024)
    );
}

/// Polls `/readyz` until it answers 200 with no rebuild running.
async fn wait_ready(addr: SocketAddr) -> Rebuilt {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Some((200, body)) = get(addr, "/readyz").await {
            let json: serde_json::Value = serde_json::from_slice(&body).expect("readyz json");
            let progress = &json["ledger_rebuild"];
            if progress["running"] == false {
                return Rebuilt {
                    records: progress["records_read"].as_u64().unwrap_or(0),
                    secs: progress["secs"].as_f64().unwrap_or(0.0),
                };
            }
        }
        assert!(Instant::now() < deadline, "posbridge not ready on {addr}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `/readyz` on `addr` answers 200 (a minute at most): the
/// port is bound before the topics are checked.
pub(crate) async fn ready(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(get(addr, "/readyz").await, Some((200, _))) {
        assert!(
            Instant::now() < deadline,
            "{addr} was not ready within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One GET on a new connection: its status and body, `None` when refused.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> Option<(u16, Bytes)> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, body))
}
