//! Which file owns an account, across restarts, and what the refused say.

use super::*;
use crate::app::sources::owners::Taking;

/// An embedded ledger at `path`, opened as start-up opens it (waiting while
/// the watch task of the sources before, cancelled, still holds it).
async fn ledger_at(path: &Path) -> Arc<crate::adapters::ledger::Ledger> {
    let config = crate::config::LedgerConfig {
        path: path.to_owned(),
        ..crate::config::LedgerConfig::default()
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match crate::adapters::ledger::open(&config, Duration::from_secs(10)).await {
            Ok(opened) => return opened.ledger,
            Err(error) if error.is_held_elsewhere() && tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => panic!("the ledger does not open: {error}"),
        }
    }
}

/// Writes a Mekari source file `name` into `dir` claiming `account`.
fn put_claim(dir: &Path, name: &str, account: &str) {
    std::fs::write(
        dir.join(format!("mekari.{name}.toml")),
        format!("secrets = [\"secret-of-{name}\"]\naccount = \"{account}\"\n"),
    )
    .unwrap();
}

/// The account's owner is the source the ledger records,
/// not the first file in name order. A newcomer (named to sort first)
/// claiming a serving source's account is refused, and still after a
/// restart on the same ledger; with the owner's file gone it takes the
/// account, and the old file coming back does not take it back, neither
/// at once nor after another restart.
#[tokio::test(flavor = "multi_thread")]
async fn an_accounts_owner_is_the_one_the_ledger_records_across_restarts() {
    let broker = silent_broker();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sources");
    std::fs::create_dir(&dir).unwrap();
    let ledger_path = root.path().join("ledger.redb");
    let restart = async |ledger: Arc<crate::adapters::ledger::Ledger>| {
        ledger.persist().await.unwrap();
        drop(ledger);
        let ledger = ledger_at(&ledger_path).await;
        let (sources, shutdown) =
            watching_with(&dir, &broker, Owners::in_ledger(ledger.clone())).await;
        (ledger, sources, shutdown)
    };

    put_claim(&dir, "owner", "shared");
    let ledger = ledger_at(&ledger_path).await;
    let (sources, shutdown) = watching_with(&dir, &broker, Owners::in_ledger(ledger.clone())).await;
    assert!(serves(&sources, "owner"));
    put_claim(&dir, "newcomer", "shared");
    sources.reload_request().unwrap().request();
    let refused = async |sources: &Sources, name: &str| {
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        while refusal(sources, name).is_none() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        refusal(sources, name)
    };
    let reason = refused(&sources, "newcomer").await.expect("not refused");
    assert!(
        reason.contains("mekari.sources.owner has the same provider and account"),
        "{reason}"
    );
    assert!(serves(&sources, "owner") && !serves(&sources, "newcomer"));
    shutdown.cancel();
    drop(sources);

    let (ledger, sources, shutdown) = restart(ledger).await;
    assert!(
        serves(&sources, "owner"),
        "the owner lost its account at a restart"
    );
    assert!(!serves(&sources, "newcomer"));
    let reason = refused(&sources, "newcomer").await.expect("not refused");
    assert!(
        reason.contains(
            "mekari.sources.owner has the same provider and account, and owns them since"
        ),
        "{reason}"
    );

    // The owner's file gone: the account passes to the newcomer.
    std::fs::remove_file(dir.join("mekari.owner.toml")).unwrap();
    sources.reload_request().unwrap().request();
    assert!(serves_within(&sources, "newcomer", Duration::from_secs(5)).await);
    assert!(!serves(&sources, "owner"));
    // Back, the old file is refused: the account stays where it went.
    put_claim(&dir, "owner", "shared");
    sources.reload_request().unwrap().request();
    let reason = refused(&sources, "owner")
        .await
        .expect("the old owner is not refused");
    assert!(reason.contains("mekari.sources.newcomer has"), "{reason}");
    assert!(serves(&sources, "newcomer") && !serves(&sources, "owner"));
    shutdown.cancel();
    drop(sources);

    let (_ledger, sources, shutdown) = restart(ledger).await;
    assert!(
        serves(&sources, "newcomer"),
        "the account went back at a restart"
    );
    assert!(!serves(&sources, "owner"));
    shutdown.cancel();
}

/// `check-config` names the owner the ledger records, whatever the order
/// of the names; without a ledger it says the first in name order takes
/// the account at a start.
#[tokio::test]
async fn check_config_names_the_owner_the_ledger_records() {
    let dir = tempfile::tempdir().unwrap();
    put_claim(dir.path(), "a-newcomer", "shared");
    put_claim(dir.path(), "b-owner", "shared");
    let config = with_dir(dir.path(), "");
    let problems = problems_by_file(&config).await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].0, "mekari.b-owner.toml");
    assert!(
        problems[0].1.contains("no ledger at")
            && problems[0].1.contains("first file in name order"),
        "{problems:?}"
    );

    let ledger = ledger_at(&config.ledger.path).await;
    let owners = Owners::in_ledger(ledger.clone());
    owners
        .record(vec![Taking {
            account: (ProviderKind::Mekari, Some("shared".to_owned())),
            name: "b-owner".to_owned(),
            since: 1_796_378_400_000,
            from: None,
        }])
        .await
        .unwrap();
    ledger.persist().await.unwrap();
    // Held by a running posbridge: it cannot be read, and says so.
    let problems = problems_by_file(&config).await;
    assert_eq!(problems[0].0, "mekari.b-owner.toml");
    assert!(problems[0].1.contains("could not read"), "{problems:?}");
    drop((owners, ledger));

    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let problems = loop {
        let problems = problems_by_file(&config).await;
        if !problems[0].1.contains("could not read") || tokio::time::Instant::now() > until {
            break problems;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].0, "mekari.a-newcomer.toml");
    assert!(
        problems[0].1.contains(
            "mekari.sources.b-owner has the same provider and account, and owns them since 2026-12-04T10:00:00Z"
        ),
        "{problems:?}"
    );
}

/// A file named like a main-file source is refused,
/// and shows on `/status` with its reason like every other refused file.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_named_like_a_main_file_source_shows_as_refused() {
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    put_source(dir.path(), "main", "");
    let (sources, shutdown) = watching_beside(
        dir.path(),
        &broker,
        Owners::default(),
        "[mekari.sources.main]\nsecrets = [\"secret-of-the-main-file\"]\n",
    )
    .await;
    let report = sources.report();
    let main = report.sources.iter().find(|v| v.name == "main").unwrap();
    assert_eq!(main.origin, crate::http::status::Origin::MainFile);
    assert!(main.serving);
    let refused = report.refused();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].path, dir.path().join("mekari.main.toml"));
    assert!(
        refused[0].reason.contains("a source of the main file"),
        "{}",
        refused[0].reason
    );
    shutdown.cancel();
}

/// `check-config` reports every problem of a file, not
/// the first it meets: a name the main file's, its own topics among the
/// shared ones, an account another source holds and a secret too short.
#[tokio::test]
async fn check_config_reports_every_problem_of_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    put(
        "mekari.a-first.toml",
        "secrets = [\"secret-of-a\"]\naccount = \"a\"\n",
    );
    put(
        "mekari.main.toml",
        "secrets = [\"short\"]\naccount = \"a\"\ntopic_prefix = \"pos.\"\n",
    );
    let config = with_dir(dir.path(), "");
    let problems = problems_by_file(&config).await;
    let of_main: Vec<&str> = problems
        .iter()
        .filter(|(f, _)| f == "mekari.main.toml")
        .map(|(_, m)| m.as_str())
        .collect();
    let said = of_main.join("\n");
    for expected in [
        "gives one of the shared topics",
        "a source of the main file",
        "mekari.sources.a-first has the same provider and account",
        "shorter than 8 characters",
    ] {
        assert!(said.contains(expected), "{expected} not said:\n{said}");
    }
    assert_eq!(of_main.len(), 4, "one problem each:\n{said}");
}
