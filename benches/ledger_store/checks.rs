//! The crash and disk-full checks of posbridge's store and fjall's.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::engine::{Engine, Kind};
use crate::tmpfs::{Tmpfs, fill};

/// Kills per store.
const CRASH_ROUNDS: usize = 3;
/// How long the writer runs before it is killed.
const CRASH_AFTER: Duration = Duration::from_secs(2);
/// Commits tried once space is freed again.
const AFTER: u64 = 1000;
/// Concurrent writers, in the crash and the disk-full checks.
const WRITERS: usize = 64;

/// Kills a writer child mid-stream, reopens its store and looks for every
/// id it acknowledged.
pub async fn crash() {
    for kind in [Kind::Ours, Kind::Fjall] {
        for round in 1..=CRASH_ROUNDS {
            let dir = tempfile::tempdir_in(crate::work_dir()).expect("crash dir");
            let mut writer = Command::new(std::env::current_exe().expect("own path"))
                .args(["child-crash", kind.name()])
                .arg(dir.path())
                .stdout(Stdio::piped())
                .spawn()
                .expect("writer");
            let mut stdout = writer.stdout.take().expect("stdout");
            let reader = std::thread::spawn(move || {
                let mut text = String::new();
                stdout.read_to_string(&mut text).expect("writer's stdout");
                text
            });
            tokio::time::sleep(CRASH_AFTER).await;
            writer.kill().expect("SIGKILL");
            writer.wait().expect("wait");
            let text = reader.join().expect("reader");
            // A line cut by the kill was never printed whole: not acknowledged.
            let acked: Vec<&str> = text
                .split_inclusive('\n')
                .filter_map(|l| l.strip_suffix('\n'))
                .collect();
            let engine = Engine::open_when_free(kind, dir.path()).await;
            let mut found = 0;
            for id in &acked {
                if engine.is_done(id).await.expect("lookup") {
                    found += 1;
                }
            }
            engine.close(dir.path()).await;
            println!(
                "crash {} round {round}: SIGKILL after {} s, {} acknowledged, {found} found done after reopening{}",
                kind.name(),
                CRASH_AFTER.as_secs(),
                acked.len(),
                if found == acked.len() {
                    ""
                } else {
                    "  LOST IDS"
                },
            );
        }
    }
}

/// The crash check's child: commits until killed, printing each id once
/// it is acknowledged.
pub async fn crash_writer(kind: Kind, dir: &Path) {
    let engine = Arc::new(Engine::open_when_free(kind, dir).await);
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let id = engine.deliver("crash", n).await.expect("commit");
                    println!("{id}");
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

/// Commits with [`WRITERS`] tasks until each has seen a write fail (or
/// `limit` passed, or `most` commits were started): the acknowledged ids,
/// the first error, and how many tasks panicked.
async fn commit_until_full(
    engine: &Arc<Engine>,
    tag: &'static str,
    limit: Duration,
    most: u64,
) -> (Vec<String>, Option<String>, usize) {
    let next = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + limit;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (engine, next) = (engine.clone(), next.clone());
            tokio::spawn(async move {
                let mut acked = Vec::new();
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= most {
                        break;
                    }
                    match engine.deliver(tag, n).await {
                        Ok(id) => acked.push(id),
                        Err(e) => return (acked, Some(e)),
                    }
                }
                (acked, None)
            })
        })
        .collect();
    let (mut acked, mut error, mut panics) = (Vec::new(), None, 0);
    for task in tasks {
        match task.await {
            Ok((ids, e)) => {
                acked.extend(ids);
                error = error.or(e);
            }
            Err(_) => panics += 1,
        }
    }
    (acked, error, panics)
}

/// Fills a tmpfs under each store until its writes fail, frees space and
/// checks that it writes again and kept every id it acknowledged.
pub async fn disk_full() {
    for kind in [Kind::Ours, Kind::Fjall] {
        let disk = Tmpfs::mount("8m");
        let dir: PathBuf = disk.path().join("store");
        std::fs::create_dir(&dir).expect("store dir");
        let engine = Arc::new(Engine::open_when_free(kind, &dir).await);
        let filler = disk.path().join("filler");
        fill(&filler, 512 * 1024);
        let (mut acked, error, panics) =
            commit_until_full(&engine, "full", Duration::from_secs(30), u64::MAX).await;
        println!(
            "disk-full {}: {} acknowledged before the disk was full; first error: {}; {panics} writer tasks panicked",
            kind.name(),
            acked.len(),
            error.as_deref().unwrap_or("none within 30 s"),
        );
        std::fs::remove_file(&filler).expect("free space");
        // What each store needs once space is back: posbridge's fence calls
        // `reopen` (redb refuses writes after an I/O error); fjall poisons
        // its database after a failed journal write, so it is opened anew.
        let engine = match Arc::try_unwrap(engine).ok().expect("the only handle") {
            Engine::Ours(ledger) => {
                use posbridge::adapters::ledger::Store;
                let reopened = ledger.reopen().await;
                println!("  after freeing space: reopen {reopened:?}");
                Engine::Ours(ledger)
            }
            other => {
                other.close(&dir).await;
                Engine::open_when_free(kind, &dir).await
            }
        };
        let engine = Arc::new(engine);
        let (after, error, panics) =
            commit_until_full(&engine, "after", Duration::from_secs(10), AFTER).await;
        println!(
            "  after freeing space: {} of {AFTER} new commits acknowledged, error: {}, {panics} panics",
            after.len(),
            error.as_deref().unwrap_or("none"),
        );
        acked.extend(after);
        let engine = Arc::try_unwrap(engine).ok().expect("the only handle");
        engine.close(&dir).await;
        let engine = Engine::open_when_free(kind, &dir).await;
        let mut found = 0;
        for id in &acked {
            if engine.is_done(id).await.unwrap_or(false) {
                found += 1;
            }
        }
        engine.close(&dir).await;
        println!(
            "  after a restart: {found} of {} acknowledged ids found done{}",
            acked.len(),
            if found == acked.len() {
                ""
            } else {
                "  LOST IDS"
            },
        );
    }
}
