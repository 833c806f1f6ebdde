//! Which source owns a merchant account: a file that
//! claims the account of a serving source is refused, and stays refused
//! after a restart and on a replica started later, whatever the order of
//! the files' names; the account passes on only when its owner's file is
//! removed, and the old file coming back does not take it back.

use std::path::Path;
use std::time::Duration;

use posbridge::config::{Config, LedgerBackend};

use crate::shared_ledger::redis_url;
use crate::sources_dir::{order_to, put, source_view};
use crate::support::wait::wait_until;
use crate::support::{TestApp, brokers, config, unique};

/// Two Mekari source files claiming one account: the owner serving first,
/// the newcomer named to sort before it (`n` before `o`), as the first
/// file in name order took the account at every start before owners were
/// recorded.
struct Claimants {
    owner: String,
    newcomer: String,
    account: String,
}

impl Claimants {
    fn new(tag: &str) -> Claimants {
        let account = unique(tag);
        Claimants {
            owner: format!("{account}-owner"),
            newcomer: format!("{account}-newcomer"),
            account,
        }
    }

    /// Writes `name`'s file into `dir`, signed with its own secret.
    fn put(&self, dir: &Path, name: &str) {
        put(
            dir,
            &format!("mekari.{name}.toml"),
            &format!(
                "secrets = [\"{}\"]\naccount = \"{}\"\n",
                secret(name),
                self.account
            ),
        );
    }

    fn remove(&self, dir: &Path, name: &str) {
        std::fs::remove_file(dir.join(format!("mekari.{name}.toml"))).unwrap();
    }
}

/// The secret a source file `name` takes.
fn secret(name: &str) -> String {
    format!("secret-of-{name}")
}

/// What an order to `name` is answered once the app decides at all: a
/// 503 while its ledger is filled at start is waited out.
async fn answer(app: &TestApp, name: &str) -> u16 {
    let mut status = 0;
    wait_until(
        Duration::from_secs(30),
        &format!("an answer other than 503 from {name}"),
        async || {
            status = order_to(app, name, &secret(name)).await;
            status != 503
        },
    )
    .await;
    status
}

/// Waits (10 s at most) until `name`'s file is refused with a reason
/// holding `said`, and returns the reason.
async fn refused_saying(app: &TestApp, name: &str, said: &str) -> String {
    let mut reason = String::new();
    wait_until(
        Duration::from_secs(10),
        &format!("{name}'s file to be refused saying `{said}`"),
        async || {
            reason = source_view(app, name)["refused"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            reason.contains(said)
        },
    )
    .await;
    reason
}

/// Waits (10 s at most) until orders to `name` are answered `status`.
async fn until(app: &TestApp, name: &str, status: u16) {
    wait_until(
        Duration::from_secs(10),
        &format!("an order to {name} to be answered {status}"),
        async || order_to(app, name, &secret(name)).await == status,
    )
    .await;
}

/// A config with fresh topics and `sources` as its sources directory.
fn with_sources(dir: &Path, sources: &Path, tag: &str) -> Config {
    let mut config = config(&brokers(), &unique(tag), dir);
    config.sources_dir = Some(sources.to_owned());
    config.spool.path = dir.join("spool.redb");
    config
}

/// What a refusal says of an account its owner holds.
fn owned_by(name: &str) -> String {
    format!("mekari.sources.{name} has the same provider and account, and owns them since")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_newcomer_never_takes_a_serving_sources_account_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let config = with_sources(dir.path(), &sources, "owners");
    let who = Claimants::new("acct");
    who.put(&sources, &who.owner);
    let app = TestApp::start_with(config.clone()).await;
    assert_eq!(answer(&app, &who.owner).await, 200);

    // While it serves, a newcomer claiming its account is refused.
    who.put(&sources, &who.newcomer);
    refused_saying(
        &app,
        &who.newcomer,
        &format!(
            "mekari.sources.{} has the same provider and account",
            who.owner
        ),
    )
    .await;
    assert_eq!(
        order_to(&app, &who.newcomer, &secret(&who.newcomer)).await,
        404
    );
    assert_eq!(answer(&app, &who.owner).await, 200);
    let kept = app.stop().await;

    // Restarted on the same ledger and files: the same owner.
    let mut app = TestApp::start_with(config.clone()).await;
    app.keep(kept.unwrap_or(dir));
    assert_eq!(
        answer(&app, &who.owner).await,
        200,
        "the serving source lost its account at a restart"
    );
    assert_eq!(answer(&app, &who.newcomer).await, 404);
    refused_saying(&app, &who.newcomer, &owned_by(&who.owner)).await;

    // Its file removed, the account passes to the newcomer; the old file
    // back does not take it back.
    who.remove(&sources, &who.owner);
    until(&app, &who.newcomer, 200).await;
    assert_eq!(order_to(&app, &who.owner, &secret(&who.owner)).await, 404);
    who.put(&sources, &who.owner);
    refused_saying(&app, &who.owner, &owned_by(&who.newcomer)).await;
    assert_eq!(order_to(&app, &who.owner, &secret(&who.owner)).await, 404);
    assert_eq!(answer(&app, &who.newcomer).await, 200);
    let kept = app.stop().await;

    let mut app = TestApp::start_with(config).await;
    if let Some(kept) = kept {
        app.keep(kept);
    }
    assert_eq!(
        answer(&app, &who.newcomer).await,
        200,
        "the account went back to the old file at a restart"
    );
    assert_eq!(answer(&app, &who.owner).await, 404);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_sharing_a_redis_ledger_agree_on_an_accounts_owner() {
    let dir = tempfile::tempdir().unwrap();
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    let mut config = with_sources(dir.path(), &sources, "owners-redis");
    config.ledger.backend = LedgerBackend::Redis;
    config.ledger.redis_url = redis_url();
    config.ledger.redis_prefix = format!("{}:", unique("owners"));
    let who = Claimants::new("acct");
    who.put(&sources, &who.owner);
    let first = TestApp::start_with(config.clone()).await;
    assert_eq!(answer(&first, &who.owner).await, 200);
    who.put(&sources, &who.newcomer);
    refused_saying(
        &first,
        &who.newcomer,
        &format!(
            "mekari.sources.{} has the same provider and account",
            who.owner
        ),
    )
    .await;

    // A replica started later (as a deployment scales up or a pod is
    // replaced), with a spool of its own: the owner the first one serves.
    config.spool.path = dir.path().join("second").join("spool.redb");
    std::fs::create_dir(dir.path().join("second")).unwrap();
    let second = TestApp::start_with(config).await;
    for replica in [&first, &second] {
        assert_eq!(
            answer(replica, &who.owner).await,
            200,
            "a replica started later gave the serving source's account away"
        );
        assert_eq!(answer(replica, &who.newcomer).await, 404);
    }
    for replica in [&first, &second] {
        refused_saying(replica, &who.newcomer, &owned_by(&who.owner)).await;
    }

    who.remove(&sources, &who.owner);
    for replica in [&first, &second] {
        until(replica, &who.newcomer, 200).await;
        assert_eq!(
            order_to(replica, &who.owner, &secret(&who.owner)).await,
            404
        );
    }
    who.put(&sources, &who.owner);
    for replica in [&first, &second] {
        refused_saying(replica, &who.owner, &owned_by(&who.newcomer)).await;
        assert_eq!(answer(replica, &who.newcomer).await, 200);
        assert_eq!(
            order_to(replica, &who.owner, &secret(&who.owner)).await,
            404
        );
    }
    first.stop().await;
    second.stop().await;
    drop(dir);
}
