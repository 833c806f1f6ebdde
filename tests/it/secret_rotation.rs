//! Secrets that rotate without a restart: a source whose secrets come from
//! a directory laid out as the kubelet mounts a Kubernetes Secret, updated as
//! the kubelet updates it while deliveries signed with the old and the new
//! secret keep arriving; and `posbridge serve` reading its secret files
//! again on SIGHUP.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use posbridge::config::Secrets;
use tokio::task::JoinHandle;

use crate::support::secret_mount::SecretMount;
use crate::support::wait::wait_until;
use crate::support::{
    RR_SECRET, TestApp, brokers, config, config_text, free_port, listening_on, metric, own_source,
    rr_sale, signed_request, spawn_serve, unique, wait_healthy,
};

const OLD: &str = "rr-old-secret-1";
const NEW: &str = "rr-new-secret-2";

/// A new sale of its own (a fresh delivery id): the id and the body.
fn fresh_sale(tag: &str) -> (String, Vec<u8>) {
    let id = unique(tag);
    let body = serde_json::to_vec(&rr_sale(
        &id,
        "sale.created",
        "2026-11-30T08:00:00Z",
        &format!("T1|2026-11|{id}"),
        1100,
    ))
    .unwrap();
    (id, body)
}

/// A sale delivery to `source`, signed with `secret`, with an id of its own.
async fn deliver(app: &TestApp, source: &str, secret: &str) -> u16 {
    let (id, body) = fresh_sale("rotate");
    app.send_raw("receiptroller", source, &id, body, Some(secret))
        .await
        .status()
        .as_u16()
}

/// Deliveries signed with one secret, one after another, until finished.
struct Stream {
    statuses: Arc<Mutex<Vec<u16>>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Stream {
    fn start(app: &Arc<TestApp>, source: &str, secret: &'static str) -> Stream {
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (app, source) = (app.clone(), source.to_owned());
        let task = tokio::spawn({
            let (statuses, stop) = (statuses.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let status = deliver(&app, &source, secret).await;
                    statuses.lock().unwrap().push(status);
                }
            }
        });
        Stream {
            statuses,
            stop,
            task,
        }
    }

    /// Answers so far.
    fn answered(&self) -> usize {
        self.statuses.lock().unwrap().len()
    }

    /// Stops it; every status it got.
    async fn finish(self) -> Vec<u16> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        Arc::into_inner(self.statuses)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

/// Sends deliveries signed with `secret` until one gets `status` (30 s at most).
async fn until_answered(app: &TestApp, source: &str, secret: &str, status: u16) {
    wait_until(
        Duration::from_secs(30),
        &format!("a delivery signed with {secret} to get {status}"),
        async || deliver(app, source, secret).await == status,
    )
    .await;
}

/// Waits until `name{source}` is on `/metrics` and reads `value` (30 s at
/// most): a series that is missing reads as no value, not as 0.
async fn until_metric(app: &TestApp, name: &str, source: &str, value: f64) {
    wait_until(
        Duration::from_secs(30),
        &format!("{name} to read {value}"),
        async || {
            let text = app.metrics().await;
            let present = text.lines().any(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("source=\"{source}\""))
            });
            present && metric(&text, name, &[("source", source)]) == value
        },
    )
    .await;
}

fn refused(statuses: &[u16]) -> usize {
    statuses.iter().filter(|s| **s == 401).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_rotates_under_traffic_without_one_refused_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let mut mount = SecretMount::new(&dir.path().join("secret"), &[("previous", OLD)]);
    let mut config = config(&brokers(), &unique("rotate"), dir.path());
    let main = config.receiptroller.sources.get_mut("main").unwrap();
    main.secrets = Secrets::default();
    main.secrets_dir = Some(mount.path().to_owned());
    let source = unique("rotating");
    own_source(&mut config, "receiptroller", "main", &source);
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let app = Arc::new(app);
    assert_eq!(deliver(&app, &source, OLD).await, 200);
    assert_eq!(deliver(&app, &source, NEW).await, 401, "not yet a secret");
    assert_eq!(
        metric(
            &app.metrics().await,
            "posbridge_secrets",
            &[("source", &source)]
        ),
        1.0
    );

    // The provider still signs with the old secret while the new one is added.
    let old = Stream::start(&app, &source, OLD);
    mount.update(&[("previous", OLD.as_bytes()), ("current", NEW.as_bytes())]);
    until_answered(&app, &source, NEW, 200).await;
    until_metric(&app, "posbridge_secrets", &source, 2.0).await;

    // The overlap: both secrets sign, the provider switching over.
    let new = Stream::start(&app, &source, NEW);
    let old_before = old.answered();
    wait_until(
        Duration::from_secs(60),
        "20 deliveries of each secret in the overlap",
        async || old.answered() >= old_before + 20 && new.answered() >= 20,
    )
    .await;
    let old = old.finish().await;
    assert_eq!(refused(&old), 0, "signed with the old secret: {old:?}");

    // The old secret taken out: it stops matching, the new one goes on.
    mount.update(&[("current", NEW.as_bytes())]);
    until_answered(&app, &source, OLD, 401).await;
    until_metric(&app, "posbridge_secrets", &source, 1.0).await;

    // A file that cannot be read (a value that is not text: `data:` given
    // for `stringData:`): the secret in use stays, and so does the refusal.
    mount.update(&[("current", &[0xff, 0xfe, 0x00, 0x81])]);
    until_metric(&app, "posbridge_secret_files_readable", &source, 0.0).await;
    assert_eq!(deliver(&app, &source, OLD).await, 401);
    mount.update(&[("current", NEW.as_bytes())]);
    until_metric(&app, "posbridge_secret_files_readable", &source, 1.0).await;

    let new = new.finish().await;
    assert_eq!(refused(&new), 0, "signed with the new secret: {new:?}");
    assert!(
        new.iter().chain(&old).all(|s| *s == 200),
        "every delivery published: old {old:?}, new {new:?}"
    );
    let app = Arc::into_inner(app).expect("the streams are done");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reads_the_secret_files_again() {
    let dir = tempfile::tempdir().unwrap();
    // The secret file is a link into a directory nobody watches: only a
    // SIGHUP (or the recheck, an hour away here) reads its change.
    let (watched, elsewhere) = (dir.path().join("watched"), dir.path().join("elsewhere"));
    std::fs::create_dir(&watched).unwrap();
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("secret"), format!("{OLD}\n")).unwrap();
    std::os::unix::fs::symlink(elsewhere.join("secret"), watched.join("secret")).unwrap();
    let port = free_port();
    let text = listening_on(
        &config_text(&brokers(), &unique("sighup"), dir.path()),
        port,
    )
    .replacen(
        &format!("secrets = [\"old-secret-0\", \"{RR_SECRET}\"]"),
        &format!("secrets_files = [{:?}]", watched.join("secret")),
        1,
    )
    .replacen("[server]\n", "[server]\nsecrets_recheck_secs = 3600\n", 1);
    assert!(text.contains("secrets_files"), "{text}");
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, text).unwrap();
    let mut child = spawn_serve(&path);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    wait_healthy(&http, &base).await;
    let send = |secret: &'static str| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let (id, body) = fresh_sale("sighup");
            // None when posbridge does not answer at all.
            signed_request(
                &http,
                &base,
                "receiptroller",
                "main",
                &id,
                body,
                Some(secret),
            )
            .send()
            .await
            .ok()
            .map(|response| response.status().as_u16())
        }
    };
    assert_eq!(send(OLD).await, Some(200));
    std::fs::write(elsewhere.join("secret"), format!("{NEW}\n")).unwrap();
    assert_eq!(send(NEW).await, Some(401), "no watcher sees the change");

    let hangup = std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(hangup.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = send(NEW).await;
        if answer == Some(200) {
            break;
        }
        if answer.is_none() {
            // Given a moment to end, a process that cut the connection has.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(
                child.try_wait().unwrap().is_none(),
                "posbridge ended on SIGHUP"
            );
        }
        // A poll of its own: each look may find the process ended, which
        // fails the test with its own message.
        assert!(Instant::now() < deadline, "SIGHUP did not read the file");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(send(OLD).await, Some(401), "the old secret is out");
    child.kill().unwrap();
    child.wait().unwrap();
}
