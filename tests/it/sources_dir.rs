//! Sources added, changed, broken and removed in a sources directory while
//! posbridge serves another source under load: each change reaches its own
//! URL within seconds, a refused file keeps its source's last good settings
//! (or keeps it absent), and the source under load loses nothing; a removed
//! source's spooled deliveries still drain, to its own topics; a source with
//! topics of its own has them made as it appears, and a lost ledger is
//! filled from them.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::wait::wait_until;
use crate::support::{
    MEKARI_SECRET, OwnBroker, RR_SECRET, TestApp, brokers, config, latest_per_key, mekari_order,
    read_topic, rr_sale, unique,
};

/// Writes `text` as the sources directory's file `name`, whole at once (a
/// rename, as an editor, `kubectl` or a ConfigMap update does).
pub(crate) fn put(dir: &Path, name: &str, text: &str) {
    let staged = dir.join(format!(".{name}.tmp"));
    std::fs::write(&staged, text).unwrap();
    std::fs::rename(staged, dir.join(name)).unwrap();
}

/// The status of one new Mekari order to `source`, signed with `secret`.
pub(crate) async fn order_to(app: &TestApp, source: &str, secret: &str) -> u16 {
    let id = unique("dir-order");
    let body = serde_json::to_vec(&mekari_order(
        &id,
        "order.created",
        "2026-12-04T10:00:00Z",
        &format!("ORD-{id}"),
        "pending",
    ))
    .unwrap();
    app.send_raw("mekari", source, &id, body, Some(secret))
        .await
        .status()
        .as_u16()
}

/// Waits (10 s at most) until an order to `source` signed with `secret` is
/// answered `status`; how long it took.
async fn until_answered(app: &TestApp, source: &str, secret: &str, status: u16) -> Duration {
    let from = Instant::now();
    wait_until(
        Duration::from_secs(10),
        &format!("an order to {source} signed with {secret} to get {status}"),
        async || order_to(app, source, secret).await == status,
    )
    .await;
    from.elapsed()
}

/// `/admin/sources`' entry for `name`.
pub(crate) fn source_view(app: &TestApp, name: &str) -> Value {
    let report = serde_json::to_value(app.sources.report()).unwrap();
    report["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_come_and_go_from_a_directory_under_load_and_the_others_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let mut config = config(&brokers(), &unique("srcdir"), dir.path());
    config.sources_dir = Some(sources.clone());
    config.spool.path = dir.path().join("spool.redb");
    assert_eq!(posbridge::app::problems(&config), vec![]);
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let app = Arc::new(app);

    // Load on a source of the main file, one new sale after another.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let load = tokio::spawn({
        let (app, stop, sent) = (app.clone(), stop.clone(), sent.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let id = unique("dir-load");
                let key = format!("T1|2026-12|{id}");
                let sale = rr_sale(&id, "sale.created", "2026-12-04T09:00:00Z", &key, 700);
                let status = app.send("receiptroller", "main", &sale).await.status();
                sent.lock().unwrap().push((key, status.as_u16()));
            }
        }
    });

    // A new file: its URL answers within seconds.
    let shop = unique("shop");
    let file = format!("mekari.{shop}.toml");
    assert_eq!(order_to(&app, &shop, "shop-secret-1").await, 404);
    put(
        &sources,
        &file,
        &format!("secrets = [\"shop-secret-1\"]\naccount = \"{shop}\"\n"),
    );
    let added_in = until_answered(&app, &shop, "shop-secret-1", 200).await;
    let view = source_view(&app, &shop);
    assert_eq!(view["origin"]["kind"], "file", "{view}");
    assert_eq!(view["account"], shop.as_str(), "{view}");
    assert!(
        !view.to_string().contains("shop-secret-1"),
        "a secret is shown: {view}"
    );
    assert!(
        app.metrics().await.contains(&format!("source=\"{shop}\"")),
        "its series appear"
    );

    // A changed file: its new secret signs, the old one no longer does.
    put(
        &sources,
        &file,
        &format!("secrets = [\"shop-secret-2\"]\naccount = \"{shop}\"\n"),
    );
    until_answered(&app, &shop, "shop-secret-2", 200).await;
    assert_eq!(order_to(&app, &shop, "shop-secret-1").await, 401);

    // A broken file: refused with its reason, the last good settings stay.
    put(
        &sources,
        &file,
        "secrets = \"shop-secret-3\"\naccount = [\n",
    );
    wait_until(
        Duration::from_secs(10),
        "the file to be refused",
        async || source_view(&app, &shop)["refused"].is_string(),
    )
    .await;
    assert_eq!(order_to(&app, &shop, "shop-secret-2").await, 200);
    // This app's own count (the gauge is the process's: tests/it/monitoring.rs
    // reads it from a posbridge of its own).
    assert_eq!(app.sources.report().refused().len(), 1);
    assert!(app.status_page().await.contains(&file), "the page names it");

    // A file taking another source's account: refused, its URL stays 404.
    let thief = unique("thief");
    put(
        &sources,
        &format!("mekari.{thief}.toml"),
        "secrets = [\"thief-secret-1\"]\naccount = \"acme\"\n",
    );
    wait_until(
        Duration::from_secs(10),
        "the thief to be refused",
        async || {
            source_view(&app, &thief)["refused"]
                .as_str()
                .is_some_and(|r| {
                    r.contains("mekari.sources.acme has the same provider and account")
                })
        },
    )
    .await;
    assert_eq!(order_to(&app, &thief, "thief-secret-1").await, 404);
    assert_eq!(source_view(&app, &thief)["serving"], false);

    // The file removed: its URL answers 404 again.
    std::fs::remove_file(sources.join(&file)).unwrap();
    until_answered(&app, &shop, "shop-secret-2", 404).await;
    assert!(source_view(&app, &shop).is_null());

    // A source whose secrets are files of a directory of their own (a
    // Secret mounted beside the sources): a secret added there is in use
    // within seconds, well before the minute's recheck.
    let rotating = unique("rotating");
    let secrets = sources
        .parent()
        .unwrap()
        .join(format!("{rotating}-secrets"));
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("first"), "rotating-secret-1\n").unwrap();
    put(
        &sources,
        &format!("mekari.{rotating}.toml"),
        &format!(
            "secrets_dir = \"{}\"\naccount = \"{rotating}\"\n",
            secrets.display()
        ),
    );
    until_answered(&app, &rotating, "rotating-secret-1", 200).await;
    std::fs::write(secrets.join("second"), "rotating-secret-2\n").unwrap();
    until_answered(&app, &rotating, "rotating-secret-2", 200).await;

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let sent = Arc::into_inner(sent).unwrap().into_inner().unwrap();
    assert!(sent.len() > 20, "too little load: {}", sent.len());
    assert!(
        sent.iter().all(|(_, status)| *status == 200),
        "the main source was refused while the directory changed: {:?}",
        sent.iter().filter(|(_, s)| *s != 200).collect::<Vec<_>>()
    );
    let published = latest_per_key(&read_topic(&brokers(), &app.topic("sales")));
    for (key, _) in &sent {
        assert!(
            published.contains_key(&format!("receiptroller:{key}")),
            "{key} lost"
        );
    }
    eprintln!(
        "a new source file answered in {added_in:?}; {} deliveries to the main source beside",
        sent.len()
    );
}

/// A source file that spools, removed while its deliveries wait in the spool
/// for the broker: its URL answers 404 from then on, and what it spooled is
/// still published once the broker is back, under its account's keys.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_sources_spooled_deliveries_still_drain() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let mut config = config(&broker.address(), &unique("srcspool"), dir.path());
    config.sources_dir = Some(sources.clone());
    config.spool.path = dir.path().join("spool.redb");
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let shop = unique("spooler");
    put(
        &sources,
        &format!("receiptroller.{shop}.toml"),
        &format!(
            "secrets = [\"{RR_SECRET}\"]\naccount = \"{shop}\"\non_broker_unavailable = \"spool\"\ntopic_prefix = \"{shop}.\"\n"
        ),
    );
    let sale = |n: u32| {
        rr_sale(
            &format!("{shop}-{n}"),
            "sale.created",
            "2026-12-04T09:00:00Z",
            &format!("T1|2026-12|{n:04}"),
            100 + u64::from(n),
        )
    };
    wait_until(
        Duration::from_secs(10),
        "the source to publish",
        async || app.send("receiptroller", &shop, &sale(0)).await.status() == 200,
    )
    .await;

    broker.cut();
    for n in [1, 2] {
        let answer = app.send("receiptroller", &shop, &sale(n)).await;
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.json::<Value>().await.unwrap()["status"], "spooled");
    }
    std::fs::remove_file(sources.join(format!("receiptroller.{shop}.toml"))).unwrap();
    // Asked with a wrong signature (401 while it is there), so that
    // nothing more is spooled meanwhile.
    let probe = serde_json::to_vec(&sale(3)).unwrap();
    wait_until(Duration::from_secs(10), "the source to end", async || {
        let id = format!("{shop}-3");
        let answer = app
            .send_raw(
                "receiptroller",
                &shop,
                &id,
                probe.clone(),
                Some("a-wrong-secret"),
            )
            .await;
        answer.status() == 404
    })
    .await;

    broker.heal();
    let spool = app
        .pipeline
        .spool()
        .expect("a sources directory opens the spool");
    wait_until(Duration::from_secs(60), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;
    assert!(
        read_topic(&broker.address(), &app.topic("sales")).is_empty(),
        "nothing of a source with its own topics in the shared ones"
    );
    let published = latest_per_key(&read_topic(&broker.address(), &format!("{shop}.sales")));
    for n in 0..3 {
        let key = format!("receiptroller:{shop}:T1|2026-12|{n:04}");
        assert!(
            published.contains_key(&key),
            "{key} lost: {:?}",
            published.keys()
        );
    }
    assert!(!published.contains_key(&format!("receiptroller:{shop}:T1|2026-12|0003")));
    app.stop().await;
}

/// The outcome a Mekari order delivery `id` (order `order`, at `at`) to
/// `source` gets: its HTTP status and its JSON `status`.
async fn order_outcome(
    app: &TestApp,
    source: &str,
    id: &str,
    order: &str,
    at: &str,
) -> (u16, String) {
    let body =
        serde_json::to_vec(&mekari_order(id, "order.created", at, order, "pending")).unwrap();
    let answer = app
        .send_raw("mekari", source, id, body, Some(MEKARI_SECRET))
        .await;
    let status = answer.status().as_u16();
    let said: Value = answer.json().await.unwrap_or(Value::Null);
    (
        status,
        said["status"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_source_with_its_own_topics_has_them_made_as_it_appears_and_a_lost_ledger_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let mut config = config(&brokers(), &unique("srcown"), dir.path());
    config.sources_dir = Some(sources.clone());
    config.spool.path = dir.path().join("spool.redb");
    let app = TestApp::start_with(config.clone()).await;
    let shop = unique("own");
    put(
        &sources,
        &format!("mekari.{shop}.toml"),
        &format!(
            "secrets = [\"{MEKARI_SECRET}\"]\naccount = \"{shop}\"\ntopic_prefix = \"{shop}.\"\n"
        ),
    );
    let order = format!("ORD-{shop}");
    let first = unique("own-order");
    // Its URL answers only once its topics are made: the first answer is
    // a publish, never a 503 for a topic that is not there.
    wait_until(
        Duration::from_secs(10),
        "the source to appear",
        async || {
            order_outcome(&app, &shop, &first, &order, "2026-12-04T10:00:00Z")
                .await
                .0
                != 404
        },
    )
    .await;
    let (status, said) = order_outcome(&app, &shop, &first, &order, "2026-12-04T10:00:00Z").await;
    assert_eq!((status, said.as_str()), (200, "duplicate"));
    let own = read_topic(&brokers(), &format!("{shop}.orders"));
    assert_eq!(own.len(), 1, "one record in its own orders topic");
    assert_eq!(own[0].key, format!("mekari:{shop}:{order}"));
    assert!(
        read_topic(&brokers(), &app.topic("orders"))
            .iter()
            .all(|r| !r.key.contains(&shop)),
        "nothing of it in the shared topics"
    );
    let kept = app.stop().await;

    // The ledger lost: filled again, its own topics read with the shared.
    std::fs::remove_file(config.ledger.path.clone()).unwrap();
    let mut app = TestApp::start_with(config).await;
    if let Some(kept) = kept {
        app.keep(kept);
    }
    app.keep(dir);
    let answered = |id: String, at: &'static str| {
        let app = &app;
        let shop = &shop;
        let order = &order;
        async move {
            let mut said = (0, String::new());
            wait_until(
                Duration::from_secs(30),
                "the ledger to be filled",
                async || {
                    said = order_outcome(app, shop, &id, order, at).await;
                    said.0 != 503
                },
            )
            .await;
            said
        }
    };
    assert_eq!(
        answered(first.clone(), "2026-12-04T10:00:00Z").await,
        (200, "duplicate".to_owned()),
        "its delivery is known again"
    );
    assert_eq!(
        answered(unique("own-older"), "2026-12-04T09:00:00Z").await,
        (200, "stale".to_owned()),
        "its order's state is known again"
    );
    assert_eq!(read_topic(&brokers(), &format!("{shop}.orders")).len(), 1);
    app.stop().await;
}
