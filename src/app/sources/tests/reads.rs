//! What the reads of a running posbridge take and show: secret files'
//! series, settled files, a removed source's series, topic patterns, the
//! targets of links.

use super::*;

/// The value `/metrics` shows for `name` of the Mekari source `source`
/// (the process's recorder, which the watch records through).
fn series(name: &str, source: &str) -> Option<String> {
    let labels = format!("{name}{{provider=\"mekari\",source=\"{source}\"}} ");
    crate::observe::telemetry::install()
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(&labels).map(str::to_owned))
}

/// Whether `series` comes to `value` within two seconds.
async fn series_within(name: &str, source: &str, value: Option<&str>) -> bool {
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < until {
        if series(name, source).as_deref() == value {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// A directory source reading secret files has its
/// `posbridge_secret_files_readable`, as a main-file source has: 1 while
/// they read, 0 when they cannot (it keeps its last good secrets).
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_source_says_whether_its_secret_files_read() {
    use crate::observe::telemetry::SECRET_FILES_READABLE;
    crate::observe::telemetry::install();
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let secrets = tempfile::tempdir().unwrap();
    let secret = secrets.path().join("signing");
    std::fs::write(&secret, "a-long-enough-secret").unwrap();
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    std::fs::write(
        dir.path().join("mekari.readable-files.toml"),
        format!("secrets_files = [\"{}\"]\n", secret.display()),
    )
    .unwrap();
    assert!(serves_within(&sources, "readable-files", Duration::from_secs(2)).await);
    assert!(
        series_within(SECRET_FILES_READABLE, "readable-files", Some("1")).await,
        "{:?}",
        series(SECRET_FILES_READABLE, "readable-files")
    );
    std::fs::remove_file(&secret).unwrap();
    assert!(
        series_within(SECRET_FILES_READABLE, "readable-files", Some("0")).await,
        "{:?} {:?}",
        series(SECRET_FILES_READABLE, "readable-files"),
        refusal(&sources, "readable-files")
    );
    assert!(serves(&sources, "readable-files"), "keeps its last secrets");
    shutdown.cancel();
}

/// The account the source `name` serves with now, if it serves.
fn serving_account(sources: &Sources, name: &str) -> Option<Option<String>> {
    let live = sources.live().load();
    let webhook = live.get(&(ProviderKind::Mekari, name.to_owned()))?;
    Some(webhook.source.account.clone())
}

/// A file written in place slowly, whose first part
/// parses alone, is taken once it has settled, not half-written: its
/// source never serves without the account the finished file gives.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_written_slowly_is_taken_once_settled() {
    use std::io::Write as _;
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    let path = dir.path().join("mekari.slow.toml");
    let writer = std::thread::spawn(move || {
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(b"secrets = [\"secret-of-slow\"]\n").unwrap();
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(50));
            file.write_all(b"# the rest of the file is on its way\n")
                .unwrap();
        }
        file.write_all(b"account = \"acc-slow\"\n").unwrap();
    });
    let mut seen = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < until {
        let now = serving_account(&sources, "slow");
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    writer.join().unwrap();
    assert_eq!(
        seen,
        [None, Some(Some("acc-slow".to_owned()))],
        "what the source served with, in turn"
    );
    shutdown.cancel();
}

/// What `/metrics` serves now.
fn scrape() -> String {
    crate::observe::gone::render(&crate::observe::telemetry::install())
}

/// A removed file's source takes its series off
/// `/metrics` (1,000 sources added and removed left 11,000 series); a
/// source of that name coming back has them again.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_sources_series_leave_metrics() {
    crate::observe::telemetry::install();
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    let label = "source=\"series-go\"";
    let lines = || scrape().lines().filter(|l| l.contains(label)).count();
    put_source(dir.path(), "series-go", "");
    assert!(serves_within(&sources, "series-go", Duration::from_secs(2)).await);
    assert!(lines() > 0, "no series while it serves");
    std::fs::remove_file(dir.path().join("mekari.series-go.toml")).unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while serves(&sources, "series-go") && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!serves(&sources, "series-go"));
    let left: Vec<String> = scrape()
        .lines()
        .filter(|l| l.contains(label))
        .map(str::to_owned)
        .collect();
    assert!(
        left.is_empty(),
        "series of a removed source:\n{}",
        left.join("\n")
    );
    put_source(dir.path(), "series-go", "");
    assert!(serves_within(&sources, "series-go", Duration::from_secs(2)).await);
    assert!(lines() > 0, "no series once it is back");
    shutdown.cancel();
}

/// Every source's dead letters (raw JSON) and records
/// stay outside every other topic pattern a subscriber reads by: one
/// source's prefix inside another's, the shared topics inside a source's
/// pattern, a dead-letter topic inside its own source's pattern (`-`).
#[tokio::test]
async fn no_topics_fall_inside_another_prefixs_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let put =
        |name: &str, account: &str, prefix: &str| put_prefixed(dir.path(), name, account, prefix);
    put("mekari.a-outer.toml", "a", "acme.");
    put("mekari.b-inner.toml", "b", "acme.eu.");
    put("mekari.c-dash.toml", "c", "dash-");
    put("mekari.d-short.toml", "d", "p");
    put("mekari.e-fine.toml", "e", "fine_");
    let config = with_dir(dir.path(), "");
    let problems = problems_by_file(&config).await;
    let files: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        files,
        [
            "mekari.b-inner.toml",
            "mekari.c-dash.toml",
            "mekari.d-short.toml",
        ],
        "{problems:?}"
    );
}

/// A source file that is a link to a file outside the
/// directory is read again when its target changes, not at the recheck.
#[tokio::test(flavor = "multi_thread")]
async fn a_linked_files_target_changed_outside_is_seen() {
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("linked.toml");
    let write = |account: &str| {
        let staged = outside.path().join("linked.toml.new");
        std::fs::write(
            &staged,
            format!("secrets = [\"secret-of-linked\"]\naccount = \"{account}\"\n"),
        )
        .unwrap();
        std::fs::rename(&staged, &target).unwrap();
    };
    write("first");
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    std::os::unix::fs::symlink(&target, dir.path().join("mekari.linked.toml")).unwrap();
    assert!(serves_within(&sources, "linked", Duration::from_secs(2)).await);
    // The watch of the target's directory is made after the read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    write("second");
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let second = Some(Some("second".to_owned()));
    while serving_account(&sources, "linked") != second && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        serving_account(&sources, "linked"),
        second,
        "the target's change waited for the recheck"
    );
    shutdown.cancel();
}

/// A read of the directory (a thousand files parsed every recheck, ~35 ms
/// of CPU) runs on a thread nicer than the ones that serve: the listeners
/// it tells are told from there. (Linux gives each thread its own nice
/// value.)
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn a_read_runs_on_a_nicer_thread_than_the_serving_ones() {
    use rustix::process::getpriority_process;
    let nice = || getpriority_process(Some(rustix::thread::gettid())).expect("a nice value");
    let serving = nice();
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    let told = Arc::new(std::sync::Mutex::new(None));
    sources.on_change({
        let told = told.clone();
        move |files| {
            if !files.is_empty() {
                let name = std::thread::current().name().map(str::to_owned);
                *told.lock().unwrap() = Some((name, nice()));
            }
        }
    });
    put_source(dir.path(), "read", "");
    // The listeners are told after the swap: waited for, not the swap.
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    while told.lock().unwrap().is_none() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (name, read) = told.lock().unwrap().clone().expect("the listener was told");
    assert_eq!(name.as_deref(), Some("sources-read"));
    assert_eq!(read, (serving + background::NICER).min(background::NICEST));
    shutdown.cancel();
}
