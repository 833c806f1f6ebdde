//! The embedded ledger's storage engine measured against fjall and against
//! a floor (docs/BENCHMARKS.md, "The embedded ledger's storage").
//!
//! Each store takes the same workload: 64, then 256 concurrent tasks, each
//! committing new deliveries (begin, then commit of the delivery done with
//! one entity state, durable before it returns) as fast as it can for
//! `POSBRIDGE_LEDGER_BENCH_SECS` (8) seconds, on fresh files on the real
//! disk (under `target/`), then again on stores pre-filled with
//! `POSBRIDGE_LEDGER_BENCH_IDS` (1 M) done ids and
//! `POSBRIDGE_LEDGER_BENCH_ENTITIES` (100 k) entities; the stores take turns,
//! `POSBRIDGE_LEDGER_BENCH_REPEAT` (1) times. Every measurement
//! runs in a child process of its own, so one store's background work and
//! memory never count against another.
//!
//! `cargo bench --bench ledger_store -- crash` kills a writer and checks
//! that every id it acknowledged is found; `-- disk-full` fills a small
//! tmpfs under each store (root only).

mod checks;
mod engine;
mod fjall_store;
mod floor;
#[path = "../../tests/it/support/tmpfs.rs"]
mod tmpfs;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use engine::{Engine, Kind};

/// Commits in flight while pre-filling.
const FILL_IN_FLIGHT: usize = 4096;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo test` runs every bench target once, without `--bench`: the
    // figures take minutes and mean nothing in a debug build.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let child = args.first().is_some_and(|a| a.starts_with("child-"));
    if !child && !std::env::args().any(|a| a == "--bench") {
        println!("ledger_store bench: run it with `cargo bench --bench ledger_store`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_default();
    match arg(0) {
        "" => runtime.block_on(bench()),
        "crash" => runtime.block_on(checks::crash()),
        "disk-full" => runtime.block_on(checks::disk_full()),
        "child-run" => runtime.block_on(child_run(
            Kind::parse(arg(1)),
            arg(2).parse().expect("concurrency"),
            Path::new(arg(3)),
        )),
        "child-fill" => runtime.block_on(child_fill(Kind::parse(arg(1)), Path::new(arg(2)))),
        "child-crash" => {
            runtime.block_on(checks::crash_writer(Kind::parse(arg(1)), Path::new(arg(2))));
        }
        other => panic!("ledger_store [crash|disk-full], not {other}"),
    }
}

/// Where the stores' files go: on the real disk, not a tmpfs.
pub fn work_dir() -> PathBuf {
    let dir = PathBuf::from("target/ledger-store-bench");
    std::fs::create_dir_all(&dir).expect("bench dir");
    dir
}

/// Runs this binary again with `args`; its stdout.
fn child(args: &[&str]) -> String {
    let exe = std::env::current_exe().expect("own path");
    let output = Command::new(exe).args(args).output().expect("child");
    assert!(
        output.status.success(),
        "child {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

/// One child's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    commits: f64,
    secs: f64,
    cpu_secs: f64,
    p50_us: f64,
    p99_us: f64,
    bytes: f64,
    peak_rss_kib: f64,
}

impl Figures {
    fn parse(out: &str) -> Figures {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .expect("a RESULT line");
        let v: Vec<f64> = line
            .split(' ')
            .map(|x| x.parse().expect("a number"))
            .collect();
        Figures {
            commits: v[0],
            secs: v[1],
            cpu_secs: v[2],
            p50_us: v[3],
            p99_us: v[4],
            bytes: v[5],
            peak_rss_kib: v[6],
        }
    }

    fn rate(&self) -> f64 {
        self.commits / self.secs
    }

    fn cpu_us(&self) -> f64 {
        self.cpu_secs * 1e6 / self.commits
    }
}

async fn bench() {
    let secs = env("POSBRIDGE_LEDGER_BENCH_SECS", 8);
    let ids = env("POSBRIDGE_LEDGER_BENCH_IDS", 1_000_000);
    let repeat = env("POSBRIDGE_LEDGER_BENCH_REPEAT", 1);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split(' ').take(3).collect();
    println!(
        "ledger_store: {secs} s per run, {repeat} repetition(s), {} cores, load average {} at start; fjall 3.1.13",
        std::thread::available_parallelism().map_or(0, usize::from),
        load.join(" "),
    );
    let base = work_dir();
    for filled in [false, true] {
        let templates: Vec<(Kind, tempfile::TempDir)> = if filled {
            Kind::ALL
                .into_iter()
                .map(|kind| {
                    let dir = tempfile::tempdir_in(&base).expect("template dir");
                    let dir_arg = dir.path().to_str().expect("utf-8 path");
                    print!("{}", child(&["child-fill", kind.name(), dir_arg]));
                    (kind, dir)
                })
                .collect()
        } else {
            Vec::new()
        };
        let state = if filled {
            format!(
                "pre-filled with {ids} done ids, {} entities",
                engine::entity_space()
            )
        } else {
            "empty".to_owned()
        };
        for concurrency in [64, 256] {
            println!("\n{concurrency} tasks, {state}:");
            println!(
                "  {:<10} {:>10} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
                "store",
                "commits/s",
                "× floor",
                "CPU µs",
                "× floor",
                "p50 ms",
                "p99 ms",
                "MiB disk",
                "peak RSS"
            );
            for _ in 0..repeat {
                measure(&base, &templates, concurrency);
            }
        }
    }
}

/// Each store once, in turn, on fresh files (or a copy of its pre-filled
/// template); prints a row per store with its ratios to the floor's.
fn measure(base: &Path, templates: &[(Kind, tempfile::TempDir)], concurrency: usize) {
    let mut floor: Option<Figures> = None;
    for kind in Kind::ALL {
        let dir = tempfile::tempdir_in(base).expect("run dir");
        if let Some((_, template)) = templates.iter().find(|(k, _)| *k == kind) {
            let status = Command::new("cp")
                .arg("-a")
                .arg(template.path().join("."))
                .arg(dir.path())
                .status()
                .expect("cp");
            assert!(status.success(), "copying the pre-filled store");
        }
        let figures = Figures::parse(&child(&[
            "child-run",
            kind.name(),
            &concurrency.to_string(),
            dir.path().to_str().expect("utf-8 path"),
        ]));
        let reference = *floor.get_or_insert(figures);
        println!(
            "  {:<10} {:>10.0} {:>8.2}× {:>8.1} {:>7.2}× {:>9.2} {:>9.2} {:>9.1} {:>6.0} MiB",
            kind.name(),
            figures.rate(),
            figures.rate() / reference.rate(),
            figures.cpu_us(),
            figures.cpu_us() / reference.cpu_us(),
            figures.p50_us / 1e3,
            figures.p99_us / 1e3,
            figures.bytes / 1048576.0,
            figures.peak_rss_kib / 1024.0,
        );
    }
}

/// Process CPU time (user + system, all threads) so far, in seconds.
fn cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): utime is the
    // 12th, stime the 13th; in clock ticks of 1/100 s on Linux.
    let after = stat.rsplit_once(')').expect("stat").1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    ticks as f64 / 100.0
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes allocated on disk under `dir`.
pub fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&entry.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// One measurement: `concurrency` tasks committing new deliveries for the
/// configured seconds; prints a RESULT line.
async fn child_run(kind: Kind, concurrency: usize, dir: &Path) {
    let secs = env("POSBRIDGE_LEDGER_BENCH_SECS", 8);
    let engine = Arc::new(Engine::open_when_free(kind, dir).await);
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_secs();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let at = Instant::now();
                    engine.deliver("run", n).await.expect("commit");
                    latencies.push(at.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu_before;
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let engine = Arc::try_unwrap(engine).ok().expect("the only handle");
    engine.close(dir).await;
    println!(
        "RESULT {} {elapsed} {cpu} {} {} {} {}",
        latencies.len(),
        at(0.5).as_micros(),
        at(0.99).as_micros(),
        disk_bytes(dir),
        peak_rss_kib(),
    );
}

/// Pre-fills a store through its own commit, many in flight.
async fn child_fill(kind: Kind, dir: &Path) {
    let ids = env("POSBRIDGE_LEDGER_BENCH_IDS", 1_000_000);
    let started = Instant::now();
    let engine = Engine::open_when_free(kind, dir).await;
    stream::iter(0..ids)
        .map(|n| {
            let engine = &engine;
            async move { engine.deliver("fill", n).await.expect("fill commit") }
        })
        .buffer_unordered(FILL_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    engine.close(dir).await;
    println!(
        "filled {} with {ids} ids in {:.0} s: {:.0} MiB on disk",
        kind.name(),
        started.elapsed().as_secs_f64(),
        disk_bytes(dir) as f64 / 1048576.0
    );
}
