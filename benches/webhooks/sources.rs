//! `sources` (after `--`): posbridge with a sources directory of
//! `POSBRIDGE_BENCH_SOURCES` sources (default 1,000), one file each, beside
//! one source of the main file, on the embedded ledger: the start-up time
//! and RSS, the Prometheus series, the time from a new file to its first
//! published delivery, the time one changed file among them takes to be in
//! use, and closed loops of 64 connections on the one source and spread
//! over all of them, side by side.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use posbridge::domain::verify::{SchemeName, sign};

use crate::load::{self, Dialect, Ids, Load};
use crate::rebuild::get;
use crate::server::{Server, Usage, free_addr};
use crate::{LedgerChoice, Settings, posbridge_command};

/// How long a change may take to be in use before the bench gives up.
const WITHIN: Duration = Duration::from_secs(60);

/// The file of source `name`, signed with any of `secrets`, with `more`
/// of its settings (its own `topic_prefix`, its spool), written whole at
/// once (staged, then renamed).
pub(crate) fn write_source(dir: &Path, name: &str, secrets: &[&str], more: &str) {
    let staged = dir.join(format!(".{name}.tmp"));
    std::fs::write(
        &staged,
        format!("secrets = {secrets:?}\naccount = \"acct-{name}\"\n{more}"),
    )
    .expect("source file");
    std::fs::rename(staged, dir.join(format!("receiptroller.{name}.toml"))).expect("rename");
}

/// The status of one new sale to `source`, signed with `secret`.
async fn deliver(addr: SocketAddr, source: &str, secret: &str, id: &str) -> Option<u16> {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": id, "type": "sale.created", "timestamp": "2026-12-04T10:00:00Z",
        "data": {"id": format!("T1|2026-12|{id}"), "grand_total": 100}
    }))
    .expect("json");
    let mut request = hyper::Request::post(format!("/webhooks/receiptroller/{source}"))
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("x-rr-delivery", id);
    for (name, value) in sign(SchemeName::Hex, "X-RR-Signature", secret, "", 0, &body) {
        request = request.header(name, value);
    }
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(body))).ok()?)
        .await
        .ok()?;
    let status = response.status().as_u16();
    response.into_body().collect().await.ok()?;
    Some(status)
}

/// How long until a sale to `source` signed with `secret` is answered 200.
async fn until_published(addr: SocketAddr, source: &str, secret: &str, tag: &str) -> Duration {
    let from = Instant::now();
    let mut n = 0;
    while deliver(addr, source, secret, &format!("{tag}-{n}")).await != Some(200) {
        assert!(from.elapsed() < WITHIN, "{source} never published");
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    from.elapsed()
}

/// How many sources a directory bench reads: `POSBRIDGE_BENCH_SOURCES`,
/// 1,000 by default.
pub(crate) fn source_count() -> usize {
    std::env::var("POSBRIDGE_BENCH_SOURCES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// posbridge on the embedded ledger reading `count` sources from a
/// directory in `work` (`write(dir, n)` writes the n-th file), with a spool
/// (`spool_settings`: more lines of its table): its command and address.
pub(crate) fn directory_posbridge(
    settings: &Settings,
    run: &str,
    work: &Path,
    count: usize,
    write: impl Fn(&Path, usize),
    spool_settings: &str,
) -> (Command, SocketAddr) {
    let sources = work.join("sources");
    std::fs::create_dir(&sources).expect("sources dir");
    for n in 0..count {
        write(&sources, n);
    }
    let dir = work.join("posbridge");
    let addr = free_addr();
    let binary = Path::new(env!("CARGO_BIN_EXE_posbridge"));
    let command = posbridge_command(
        settings,
        addr,
        run,
        &LedgerChoice::Embedded(None),
        &dir,
        binary,
    );
    // The directory is a top-level key: before the tables.
    let config = dir.join("posbridge.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(
        &config,
        format!(
            "sources_dir = \"{}\"\n{text}[spool]\npath = \"{}\"\n{spool_settings}",
            sources.display(),
            dir.join("spool.redb").display()
        ),
    )
    .expect("config");
    (command, addr)
}

/// The sum of the `/metrics` lines named `name` that carry every label.
pub(crate) async fn metric(addr: SocketAddr, name: &str, labels: &[&str]) -> f64 {
    let text = get(addr, "/metrics").await.expect("metrics").1;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|line| line.starts_with(name) && labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub async fn run(settings: &Settings, run: &str) {
    let count = source_count();
    let work = tempfile::tempdir().expect("work dir");
    let sources = work.path().join("sources");
    let write = |dir: &Path, n: usize| write_source(dir, &format!("s{n}"), &[load::SECRET], "");
    let (command, addr) = directory_posbridge(settings, run, work.path(), count, write, "");
    let started = Instant::now();
    let server = Server::start(command, addr, &work.path().join("sources.log"));
    let listening = started.elapsed();
    crate::rebuild::ready(addr).await;
    let ready = started.elapsed();
    let rss = Usage::of(server.pid()).peak_rss;
    let metrics = get(addr, "/metrics").await.expect("metrics").1;
    let series = String::from_utf8_lossy(&metrics)
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    println!(
        "{count} sources from files: listening after {:.2} s, ready after {:.2} s, peak RSS {} MiB, {series} series on /metrics",
        listening.as_secs_f64(),
        ready.as_secs_f64(),
        rss >> 20
    );

    write_source(&sources, "new", &[load::SECRET], "");
    let added = until_published(addr, "new", load::SECRET, &format!("{run}-new")).await;
    // Its eight topics made and checked first.
    let prefix = format!("{run}-own.");
    write_source(
        &sources,
        "own",
        &[load::SECRET],
        &format!("topic_prefix = \"{prefix}\"\n"),
    );
    let own = until_published(addr, "own", load::SECRET, &format!("{run}-own")).await;
    let middle = format!("s{}", count / 2);
    // A second secret (a rotation's first step): the load's still signs.
    write_source(&sources, &middle, &[load::SECRET, "bench-secret-2"], "");
    let changed = until_published(addr, &middle, "bench-secret-2", &format!("{run}-chg")).await;
    println!(
        "a new file to its first published delivery: {:.0} ms (with topics of its own: {:.0} ms); one changed file among {count} in use: {:.0} ms",
        added.as_secs_f64() * 1e3,
        own.as_secs_f64() * 1e3,
        changed.as_secs_f64() * 1e3
    );

    let connections = Load::Closed { connections: 64 };
    for (label, dialect) in [
        ("one source", Dialect::Bridge),
        ("spread over all", Dialect::Spread { first: 0, count }),
    ] {
        let before = Usage::of(server.pid());
        let ids = Ids::Fresh(format!("{run}-{}", label.replace(' ', "")));
        let measured = load::run(addr, dialect, connections, ids, settings.phase).await;
        let cpu = Usage::of(server.pid()).cpu_since(&before);
        println!(
            "closed 64, {label:>15}: {:>7.0} req/s, p50 {:.1} ms, p99 {:.1} ms, {} errors, {:.0} µs CPU per request, peak RSS {} MiB",
            measured.rate(),
            measured.p50.as_secs_f64() * 1e3,
            measured.p99.as_secs_f64() * 1e3,
            measured.errors,
            cpu.as_secs_f64() * 1e6 / measured.requests.max(1) as f64,
            Usage::of(server.pid()).peak_rss >> 20
        );
    }
    let metrics = get(addr, "/metrics").await.expect("metrics").1;
    let series = String::from_utf8_lossy(&metrics)
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count();
    println!("{series} series on /metrics after deliveries to every source");
}
