//! Reading secret files and reading them again: real files in a temporary
//! directory, one of them laid out as the kubelet mounts a Secret.

use std::collections::BTreeSet;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::watch::Reloaded;
use super::*;
use crate::adapters::file_watch::SETTLE;
use crate::config::Config;
use crate::domain::verify::{KeyChange, Verifier, sign};

#[path = "../../../tests/it/support/secret_mount.rs"]
mod secret_mount;
use secret_mount::SecretMount;

/// A Secret mount in a temporary directory that lives as long as it.
fn new_mount(keys: &[(&str, &str)]) -> (tempfile::TempDir, SecretMount) {
    let dir = tempfile::tempdir().unwrap();
    let mount = SecretMount::new(&dir.path().join("secret"), keys);
    (dir, mount)
}

/// A ReceiptRoller source `main` with these secret settings (TOML lines).
fn config(lines: &str) -> Config {
    Config::from_toml(&format!("[receiptroller.sources.main]\n{lines}\n")).unwrap()
}

fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// The source's verifier (hex scheme) and its files to read again.
fn assembled(config: &Config) -> (Verifier, SecretFiles) {
    let entry = config.sources().next().unwrap();
    let found = load(entry.config, SchemeName::Hex).unwrap();
    let secrets: Vec<_> = found.into_iter().map(|f| f.secret).collect();
    let verifier = Verifier::new(SchemeName::Hex, "x-sig", &secrets, 300).unwrap();
    let mut files = SecretFiles::new(Duration::from_secs(3600));
    files.add(entry, SchemeName::Hex, &verifier);
    (verifier, files)
}

/// Whether `verifier` accepts a body signed with `secret`.
fn accepts(verifier: &Verifier, secret: &str) -> bool {
    let mut headers = HeaderMap::new();
    for (name, value) in sign(SchemeName::Hex, "x-sig", secret, "", 0, b"body") {
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    verifier
        .verify(&headers, Bytes::from_static(b"body"), 0)
        .is_ok()
}

fn secrets(found: &[Found]) -> Vec<&str> {
    found.iter().map(|f| f.secret.expose()).collect()
}

#[test]
fn a_kubernetes_mount_reads_as_its_keys_through_the_data_link() {
    let (_dir, mount) = new_mount(&[("current", "new-secret-2\n"), ("previous", "old-secret-1")]);
    std::fs::write(mount.path().join(".hidden"), "not-a-key-3").unwrap();
    let config = config(&format!(
        "secrets = [\"inline-secret\"]\nsecrets_dir = {}",
        toml_path(mount.path())
    ));
    let found = read(&config.receiptroller.sources["main"]).unwrap();
    assert_eq!(
        secrets(&found),
        ["inline-secret", "new-secret-2", "old-secret-1"],
        "the configuration's first, then the keys by name; ..data, ..v1 and .hidden are no keys"
    );
    assert_eq!(found[0].origin, Origin::Inline(0));
    assert_eq!(found[1].origin, Origin::Dir(mount.path().join("current")));
    assert_eq!(found[1].origin.key(), "secrets_dir");
}

#[test]
fn a_file_holds_a_secret_a_line_and_each_secret_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets");
    std::fs::write(&file, "  old-secret-1 \r\n\nnew-secret-2\nold-secret-1\n").unwrap();
    let config = config(&format!(
        "secrets = [\"new-secret-2\"]\nsecrets_files = [{}]",
        toml_path(&file)
    ));
    let found = read(&config.receiptroller.sources["main"]).unwrap();
    assert_eq!(secrets(&found), ["new-secret-2", "old-secret-1"]);
    assert_eq!(found[1].origin, Origin::File(0, file));
}

#[test]
fn what_cannot_be_read_is_an_error_at_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let source = |lines: &str| config(lines).receiptroller.sources["main"].clone();

    let error = read(&source(&format!(
        "secrets_files = [{}]",
        toml_path(&missing)
    )))
    .unwrap_err();
    assert_eq!(error.key(), "secrets_files[0]");
    // Said by its key: the path is a value of the source's table.
    assert!(error.to_string().contains("secrets_files[0]"), "{error}");
    assert!(!error.to_string().contains("missing"), "{error}");

    let error = read(&source(&format!("secrets_dir = {}", toml_path(&missing)))).unwrap_err();
    assert_eq!(error.key(), "secrets_dir");

    // A Secret's value given base64-decoded twice (`data:` for `stringData:`).
    let binary = dir.path().join("binary");
    std::fs::write(&binary, [0xff, 0xfe, 0x00, 0x81]).unwrap();
    let error = read(&source(&format!(
        "secrets_files = [{}]",
        toml_path(&binary)
    )))
    .unwrap_err();
    assert!(matches!(error, ReadError::File { .. }), "{error}");

    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let error = read(&source(&format!("secrets_files = [{}]", toml_path(&empty)))).unwrap_err();
    assert!(matches!(error, ReadError::Empty), "{error}");
    assert_eq!(error.key(), "secrets");

    let short = dir.path().join("short");
    std::fs::write(&short, "short\n").unwrap();
    let error = load(
        &source(&format!("secrets_files = [{}]", toml_path(&short))),
        SchemeName::Hex,
    )
    .unwrap_err();
    assert_eq!(error.key(), "secrets_files[0]");
    assert!(error.to_string().contains("short"), "{error}");
}

#[test]
fn a_reload_puts_new_secrets_in_use_and_takes_removed_ones_out() {
    let (_dir, mut mount) = new_mount(&[("previous", "old-secret-1")]);
    let config = config(&format!("secrets_dir = {}", toml_path(mount.path())));
    let (verifier, files) = assembled(&config);
    let mut state = vec![None];
    assert!(accepts(&verifier, "old-secret-1"));
    assert!(!accepts(&verifier, "new-secret-2"));

    mount.update(&[("previous", "old-secret-1"), ("current", "new-secret-2")]);
    let change = KeyChange {
        added: 1,
        removed: 0,
        in_use: 2,
    };
    assert_eq!(files.reload(&mut state), [Reloaded::Changed(change)]);
    assert!(accepts(&verifier, "old-secret-1") && accepts(&verifier, "new-secret-2"));
    assert_eq!(files.reload(&mut state), [Reloaded::Unchanged]);

    mount.update(&[("current", "new-secret-2")]);
    let change = KeyChange {
        added: 0,
        removed: 1,
        in_use: 1,
    };
    assert_eq!(files.reload(&mut state), [Reloaded::Changed(change)]);
    assert!(!accepts(&verifier, "old-secret-1"));
    assert!(accepts(&verifier, "new-secret-2"));
    assert_eq!(state, [None]);
}

#[test]
fn a_failed_read_keeps_the_secrets_in_use_and_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, "old-secret-1\n").unwrap();
    let config = config(&format!("secrets_files = [{}]", toml_path(&file)));
    let (verifier, files) = assembled(&config);
    let mut state = vec![None];

    std::fs::remove_file(&file).unwrap();
    let [Reloaded::Failed(said)] = &files.reload(&mut state)[..] else {
        panic!("a missing file is a failed read");
    };
    assert!(said.contains("secrets_files[0]"), "{said}");
    assert_eq!(files.reload(&mut state), [Reloaded::StillFailing]);
    assert_eq!(files.reload(&mut state), [Reloaded::StillFailing]);
    assert!(accepts(&verifier, "old-secret-1"), "kept");

    // Failing differently is news: a secret too short for the scheme.
    std::fs::write(&file, "short\n").unwrap();
    assert!(matches!(
        &files.reload(&mut state)[..],
        [Reloaded::Failed(_)]
    ));
    assert!(accepts(&verifier, "old-secret-1"), "kept");
    assert!(!accepts(&verifier, "short"));

    std::fs::write(&file, "new-secret-2\n").unwrap();
    let change = KeyChange {
        added: 1,
        removed: 1,
        in_use: 1,
    };
    assert_eq!(files.reload(&mut state), [Reloaded::Changed(change)]);
    assert_eq!(state, [None], "readable again");
    assert!(accepts(&verifier, "new-secret-2"));
}

#[test]
fn a_key_whose_link_points_nowhere_is_being_taken_out() {
    let (_dir, mount) = new_mount(&[("current", "new-secret-2")]);
    // The kubelet swapped `..data` to a version without `previous` and has
    // not yet removed its link.
    symlink("..data/previous", mount.path().join("previous")).unwrap();
    let config = config(&format!("secrets_dir = {}", toml_path(mount.path())));
    let found = read(&config.receiptroller.sources["main"]).unwrap();
    assert_eq!(secrets(&found), ["new-secret-2"]);
}

/// Polls `check` every 20 ms until it holds, failing after 20 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    eventually_within(Duration::from_secs(20), what, check).await;
}

async fn eventually_within(within: Duration, what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_watch_reads_a_kubernetes_update_it_sees() {
    let (_dir, mut mount) = new_mount(&[("previous", "old-secret-1")]);
    let config = config(&format!("secrets_dir = {}", toml_path(mount.path())));
    let (verifier, files) = assembled(&config);
    let stop = CancellationToken::new();
    let watch = tokio::spawn(files.watch(stop.clone()));
    mount.update(&[("previous", "old-secret-1"), ("current", "new-secret-2")]);
    eventually("the new secret in use", || {
        accepts(&verifier, "new-secret-2")
    })
    .await;
    assert!(accepts(&verifier, "old-secret-1"));
    mount.update(&[("current", "new-secret-2")]);
    eventually("the old secret out of use", || {
        !accepts(&verifier, "old-secret-1")
    })
    .await;
    stop.cancel();
    watch.await.unwrap();
}

/// A file that is a link into a directory nobody watches: its change is
/// seen by no watcher, only read on request (SIGHUP) or at the recheck.
fn unwatched(dir: &Path) -> (PathBuf, PathBuf) {
    let (watched, elsewhere) = (dir.join("watched"), dir.join("elsewhere"));
    std::fs::create_dir(&watched).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("secret"), "old-secret-1\n").unwrap();
    symlink(elsewhere.join("secret"), watched.join("secret")).unwrap();
    (watched.join("secret"), elsewhere.join("secret"))
}

#[tokio::test]
async fn a_request_reads_what_no_watcher_sees() {
    let dir = tempfile::tempdir().unwrap();
    let (link, target) = unwatched(dir.path());
    let config = config(&format!("secrets_files = [{}]", toml_path(&link)));
    let (verifier, files) = assembled(&config);
    let request = files.reload_request();
    // Changed before the watch starts: its first read takes it.
    std::fs::write(&target, "new-secret-2\n").unwrap();
    let stop = CancellationToken::new();
    let watch = tokio::spawn(files.watch(stop.clone()));
    eventually("the first read", || accepts(&verifier, "new-secret-2")).await;

    std::fs::write(&target, "newer-secret-3\n").unwrap();
    request.request();
    eventually("the requested read", || {
        accepts(&verifier, "newer-secret-3")
    })
    .await;
    assert!(!accepts(&verifier, "new-secret-2"));
    stop.cancel();
    watch.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_recheck_reads_what_no_watcher_sees() {
    let dir = tempfile::tempdir().unwrap();
    let (link, target) = unwatched(dir.path());
    let config = config(&format!(
        "secrets_files = [{}]\n[server]\nsecrets_recheck_secs = 60",
        toml_path(&link)
    ));
    let entry = config.sources().next().unwrap();
    let (verifier, _) = assembled(&config);
    let mut files = SecretFiles::new(config.server.secrets_recheck());
    files.add(entry, SchemeName::Hex, &verifier);
    let stop = CancellationToken::new();
    let watch = tokio::spawn(files.watch(stop.clone()));
    // The first read is at once; after it, only the recheck reads.
    tokio::time::sleep(Duration::from_secs(1)).await;
    std::fs::write(&target, "new-secret-2\n").unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        !accepts(&verifier, "new-secret-2"),
        "not before the recheck"
    );
    eventually_within(Duration::from_secs(120), "the recheck's read", || {
        accepts(&verifier, "new-secret-2")
    })
    .await;
    stop.cancel();
    watch.await.unwrap();
}

/// A secret file (`old-secret-1`) in a directory of its own, watched, its
/// first read done: the directory, the file, the verifier, and the watch
/// with what stops it (also when the handle drops: a test that fails ends
/// the writers it started).
struct OneFileWatched {
    dir: tempfile::TempDir,
    file: PathBuf,
    verifier: Verifier,
    stop: CancellationToken,
    _stop_on_drop: tokio_util::sync::DropGuard,
    watch: tokio::task::JoinHandle<()>,
}

impl OneFileWatched {
    async fn start() -> OneFileWatched {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "old-secret-1\n").unwrap();
        let config = config(&format!("secrets_files = [{}]", toml_path(&file)));
        let (verifier, files) = assembled(&config);
        let stop = CancellationToken::new();
        let watch = tokio::spawn(files.watch(stop.clone()));
        eventually("the first read", || accepts(&verifier, "old-secret-1")).await;
        OneFileWatched {
            dir,
            file,
            verifier,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            watch,
        }
    }

    /// Stops the watch and waits for it.
    async fn stop(self) {
        self.stop.cancel();
        self.watch.await.unwrap();
    }
}

/// A secret file written in place a few bytes at a time (an editor's or a
/// `cat >` slow write): the watch waits until it stays the same across the
/// settle time, and never puts a secret cut short in use (it would refuse
/// every delivery signed with the whole one). A round whose writer was
/// held up for most of the settle time (a loaded machine) proves nothing
/// and is written again.
#[tokio::test(flavor = "multi_thread")]
async fn a_secret_written_in_place_is_taken_once_it_is_whole() {
    let watched = OneFileWatched::start().await;
    let (file, verifier) = (&watched.file, &watched.verifier);

    let mut judged = false;
    for round in 0..3 {
        let whole = format!("new-secret-written-slowly-{round}");
        let writer = tokio::task::spawn_blocking({
            let (file, whole) = (file.clone(), whole.clone());
            move || {
                use std::io::Write;
                let mut out = std::fs::File::create(&file).unwrap();
                let mut last = std::time::Instant::now();
                let mut longest = Duration::ZERO;
                for chunk in whole.as_bytes().chunks(3) {
                    out.write_all(chunk).unwrap();
                    longest = longest.max(last.elapsed());
                    std::thread::sleep(Duration::from_millis(60));
                    last = std::time::Instant::now();
                }
                out.write_all(b"\n").unwrap();
                longest.max(last.elapsed())
            }
        });
        let mut cut_short = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !writer.is_finished() || !accepts(verifier, &whole) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never: the whole secret in use"
            );
            cut_short.extend((1..whole.len()).filter(|end| accepts(verifier, &whole[..*end])));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let longest = writer.await.unwrap();
        if longest < SETTLE - Duration::from_millis(50) {
            assert_eq!(
                cut_short,
                BTreeSet::new(),
                "secrets cut short at these lengths were in use"
            );
            judged = true;
            break;
        }
        println!("round {round}: the writer paused {longest:?} between two writes; again");
    }
    assert!(judged, "the writer never wrote steadily enough to judge");
    watched.stop().await;
}

/// A file that keeps changing beside a secret file (a log in the same
/// directory) does not hold the secret's read back: only the files read
/// are waited for.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_changing_beside_a_secret_does_not_hold_its_read() {
    let watched = OneFileWatched::start().await;
    let (file, verifier) = (&watched.file, &watched.verifier);
    let logging = tokio::task::spawn_blocking({
        let (log, stop) = (
            watched.dir.path().join("posbridge.log"),
            watched.stop.clone(),
        );
        move || {
            use std::io::Write;
            let mut out = std::fs::File::create(log).unwrap();
            while !stop.is_cancelled() {
                writeln!(out, "a line").unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    std::fs::write(file, "new-secret-2\n").unwrap();
    eventually_within(Duration::from_secs(3), "the new secret in use", || {
        accepts(verifier, "new-secret-2")
    })
    .await;
    watched.stop().await;
    logging.await.unwrap();
}
