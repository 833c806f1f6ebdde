//! What `check-config` and a running posbridge say of a sources directory's
//! files.

use std::path::Path;

use super::*;

/// What `check-config` says of `config`'s directory: each refused file's
/// name and why.
async fn problems_by_file(config: &Config) -> Vec<(String, String)> {
    dir_problems(config)
        .await
        .into_iter()
        .map(|p| {
            let file = Path::new(&p.key).file_name().unwrap().to_str().unwrap();
            (file.to_owned(), p.message)
        })
        .collect()
}

/// A main file of `main_table` (with the `main` Mekari source of every
/// test) whose `sources_dir` is `dir`, its ledger in `dir` too (a name
/// starting with `.` is not a source).
fn with_dir(dir: &Path, main_table: &str) -> Config {
    let mut config = Config::from_toml(&format!(
        "sources_dir = \"{}\"\n{main_table}[mekari.sources.main]\nsecrets = [\"secret-of-main\"]\n",
        dir.display()
    ))
    .unwrap();
    config.ledger.path = dir.join(".ledger.redb");
    config
}

/// `check-config` on a main file and a directory: each file refused by
/// its path, as a running posbridge refuses it.
#[tokio::test]
async fn check_config_names_every_refused_file_by_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    put(
        "mekari.main.toml",
        "secrets = [\"secret-of-a\"]\naccount = \"a\"\n",
    );
    put(
        "mekari.shop-a.toml",
        "secrets = [\"secret-of-a\"]\naccount = \"a\"\n",
    );
    put(
        "mekari.shop-b.toml",
        "secrets = [\"secret-of-b\"]\naccount = \"a\"\n",
    );
    put(
        "mekari.shop-c.toml",
        "secrets = [\"short\"]\naccount = \"c\"\n",
    );
    put("receiptroller.shop-d.toml", "secrets = [\"secret-of-d\"]\n");
    put("nothing.toml", "secrets = [\"secret-of-e\"]\n");
    put(
        "receiptroller.shop-f.toml",
        "secrets = [\"secret-of-f\"]\naccount = \"f\"\ntopic_prefix = \"pos.\"\n",
    );
    put(
        "receiptroller.shop-g.toml",
        "secrets = [\"secret-of-g\"]\naccount = \"g\"\ntopic_prefix = \"shop-g.\"\n",
    );
    let config = with_dir(dir.path(), "");
    let problems = problems_by_file(&config).await;
    let files: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        files,
        [
            "mekari.main.toml",
            "mekari.shop-b.toml",
            "mekari.shop-c.toml",
            "nothing.toml",
            "receiptroller.shop-f.toml"
        ],
        "{problems:?}"
    );
    assert!(problems[0].1.contains("a source of the main file"));
    assert!(
        problems[1]
            .1
            .contains("mekari.sources.shop-a has the same provider and account:")
    );
    assert!(problems[2].1.contains("shorter than 8 characters"));
    assert!(problems[3].1.contains("{provider}.{source}.toml"));
    assert!(
        problems[4]
            .1
            .contains("topic_prefix: gives one of the shared topics"),
        "{}",
        problems[4].1
    );
}

/// Own topics that collide are refused with the collision named: inside
/// the shared topics' pattern, the same prefix twice, two prefixes giving
/// one dead-letter topic, two Kafka tells apart by nothing (`.` and `_`);
/// each against a main-file source's own topics too.
#[tokio::test]
async fn own_topics_that_collide_are_refused_naming_the_collision() {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, account: &str, prefix: &str| {
        std::fs::write(
            dir.path().join(name),
            format!("secrets = [\"secret-of-{account}\"]\naccount = \"{account}\"\ntopic_prefix = \"{prefix}\"\n"),
        )
        .unwrap();
    };
    put("mekari.a-inside.toml", "a", "pos.acme.");
    put("mekari.b-first.toml", "b", "twice.");
    put("mekari.c-again.toml", "c", "twice.");
    put("mekari.d-dot.toml", "d", "dl.");
    // `dl-dead-letter` as `dl.` gives (`dl-` is refused on its own).
    put("mekari.e-dash.toml", "e", "dl_");
    put("mekari.f-dot.toml", "f", "col.");
    put("mekari.g-under.toml", "g", "col_");
    put("mekari.h-main.toml", "h", "main_");
    put("mekari.i-fine.toml", "i", "fine.");
    let mut config = with_dir(dir.path(), "");
    config.mekari.sources.get_mut("main").unwrap().topic_prefix = Some("main.".to_owned());
    let problems = problems_by_file(&config).await;
    let files: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        files,
        [
            "mekari.a-inside.toml",
            "mekari.c-again.toml",
            "mekari.e-dash.toml",
            "mekari.g-under.toml",
            "mekari.h-main.toml"
        ],
        "{problems:?}"
    );
    assert!(
        problems[0].1.contains("inside the shared topics' pattern"),
        "{problems:?}"
    );
    for ((_, reason), owner) in problems[1..]
        .iter()
        .zip(["b-first", "d-dot", "f-dot", "main"])
    {
        assert!(
            reason.contains(&format!("mekari.sources.{owner}'s topic_prefix gives too")),
            "{reason}"
        );
    }
}

/// What `check-config`, `/status` and the log say of a refused file
/// names its key and the kind of problem, never a value of the file nor
/// a key no setting has: the checks that need the providers and the
/// other sources too.
#[tokio::test]
async fn a_refused_files_reason_quotes_no_value_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    let api = "[api]\nclient_id = \"c\"\nclient_secret = \"s3cr3t-client\"\noutlets = [\"o\"]\n";
    // (file, text, what the reason names)
    let cases = [
        (
            "mekari.url.toml",
            format!("secrets = [\"secret-of-url\"]\naccount = \"url\"\n{api}base_url = \"https://user:s3cr3t-pass@ex ample\"\n"),
            "mekari.sources.url.api.base_url",
        ),
        (
            "mekari.colour.toml",
            format!("secrets = [\"secret-of-colour\"]\naccount = \"colour\"\n{api}base_url = \"https://m.example\"\ns3cr3t-colour = 1\n"),
            "line 8, column 1",
        ),
        (
            "mekari.paths.toml",
            format!("secrets = [\"secret-of-paths\"]\naccount = \"paths\"\n{api}base_url = \"https://m.example\"\npaths = {{ s3cr3t-path = \"/x\" }}\n"),
            "line 8, column 11",
        ),
        (
            "receiptroller.files.toml",
            "secrets_files = [\"/nonexistent/s3cr3t-file\"]\n".to_owned(),
            "receiptroller.sources.files.secrets_files[0]",
        ),
        (
            "mekari.dup-b.toml",
            "secrets = [\"secret-of-dup-b\"]\naccount = \"s3cr3t-account\"\n".to_owned(),
            "mekari.sources.dup-a has the same provider and account",
        ),
        // An account that is another source's name: that name is said.
        (
            "mekari.thief.toml",
            "secrets = [\"secret-of-thief\"]\naccount = \"owner\"\n".to_owned(),
            "mekari.sources.owner has the same provider and account",
        ),
        (
            "mekari.shared.toml",
            "secrets = [\"secret-of-shared\"]\naccount = \"shared\"\ntopic_prefix = \"s3cr3t-shared.\"\n".to_owned(),
            "mekari.sources.shared.topic_prefix",
        ),
    ];
    for (file, text, _) in &cases {
        put(file, text);
    }
    put(
        "mekari.dup-a.toml",
        "secrets = [\"secret-of-dup-a\"]\naccount = \"s3cr3t-account\"\n",
    );
    put(
        "mekari.owner.toml",
        "secrets = [\"secret-of-owner\"]\naccount = \"owner\"\n",
    );
    let config = with_dir(dir.path(), "[kafka]\ntopic_prefix = \"s3cr3t-shared.\"\n");
    let problems = dir_problems(&config).await;
    let mut wrong = Vec::new();
    for (file, _, named) in &cases {
        let path = dir.path().join(file).display().to_string();
        let reasons: Vec<&str> = problems
            .iter()
            .filter(|p| p.key == path)
            .map(|p| p.message.as_str())
            .collect();
        let reason = reasons.join("; ");
        if reasons.is_empty() || reason.contains("s3cr3t") || !reason.contains(named) {
            wrong.push(format!("{file}: {reason}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "quoted a value or named no key:\n{}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn a_directory_that_cannot_be_listed_is_a_problem_of_sources_dir() {
    let config = Config::from_toml("sources_dir = \"/nonexistent/sources\"\n").unwrap();
    let problems = dir_problems(&config).await;
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].key, "sources_dir");
}

/// A broker that takes connections and never answers: opening a source's
/// own topics there hangs until Kafka's client gives up (15 s and more).
fn silent_broker() -> std::net::TcpListener {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap()
}

/// The sources of the directory `dir`, watched until the token is
/// cancelled, read again only every 60 s whatever the watch sees; their own
/// topics made on `broker`.
async fn watching(dir: &Path, broker: &std::net::TcpListener) -> (Sources, CancellationToken) {
    watching_with(dir, broker, Owners::default()).await
}

/// [`watching`], the accounts' owners recorded in `owners`.
async fn watching_with(
    dir: &Path,
    broker: &std::net::TcpListener,
    owners: Owners,
) -> (Sources, CancellationToken) {
    watching_beside(dir, broker, owners, "").await
}

/// [`watching_with`], beside the main file's sources `main_tables`.
async fn watching_beside(
    dir: &Path,
    broker: &std::net::TcpListener,
    owners: Owners,
    main_tables: &str,
) -> (Sources, CancellationToken) {
    let config = Config::from_toml(&format!(
        "sources_dir = \"{}\"\n[server]\nsecrets_recheck_secs = 60\n[kafka]\nbrokers = \"{}\"\n{main_tables}",
        dir.display(),
        broker.local_addr().unwrap()
    ))
    .unwrap();
    let main: SourceMap = config
        .sources()
        .map(|entry| {
            let key = (entry.provider, entry.name.to_owned());
            (key, webhook_source(entry).unwrap())
        })
        .collect();
    let publisher =
        crate::adapters::publish::Publisher::new(&config.kafka, config.max_record_bytes()).unwrap();
    let encoder = crate::adapters::encode::Encoder::new(&config.schema_registry, &[])
        .await
        .unwrap();
    let own_topics = OwnTopics::new(
        crate::adapters::publish::TopicSets::new(&config.kafka),
        publisher,
        encoder,
        &config,
    );
    let sources = Sources::start(&config, main, Board::new([]), own_topics, owners)
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(sources.clone().watch(shutdown.clone()));
    // The watch made before the test changes anything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (sources, shutdown)
}

/// Writes a Mekari source file `name` into `dir`, its account its name.
fn put_source(dir: &Path, name: &str, extra: &str) {
    std::fs::write(
        dir.join(format!("mekari.{name}.toml")),
        format!("secrets = [\"secret-of-{name}\"]\naccount = \"{name}\"\n{extra}"),
    )
    .unwrap();
}

fn serves(sources: &Sources, name: &str) -> bool {
    sources
        .live()
        .load()
        .contains_key(&(ProviderKind::Mekari, name.to_owned()))
}

/// Whether the source `name` answers within `limit`.
async fn serves_within(sources: &Sources, name: &str, limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < until {
        if serves(sources, name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    serves(sources, name)
}

/// A file whose own topics cannot be made yet (Kafka does not answer)
/// holds no other file back; its own source does not answer without them.
#[tokio::test(flavor = "multi_thread")]
async fn a_plain_file_is_served_while_another_files_topics_hang() {
    let broker = silent_broker();
    let dir = tempfile::tempdir().unwrap();
    let (sources, shutdown) = watching(dir.path(), &broker).await;
    put_source(dir.path(), "own", "topic_prefix = \"own.\"\n");
    tokio::time::sleep(Duration::from_millis(500)).await;
    put_source(dir.path(), "plain", "");
    assert!(
        serves_within(&sources, "plain", Duration::from_secs(2)).await,
        "the plain file waited for the other file's topics"
    );
    assert!(!serves(&sources, "own"), "answers before its topics exist");

    // Kafka's client gives up: the file is refused with its answer.
    let refusal = || {
        sources
            .report()
            .sources
            .into_iter()
            .find(|v| v.name == "own")
            .and_then(|v| v.refused)
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(40);
    while refusal().is_none() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reason = refusal().expect("the file is not refused");
    assert!(reason.contains("its topics cannot be opened"), "{reason}");
    // Tried again at the next read, refused meanwhile as it was; the
    // other files are taken at once still.
    put_source(dir.path(), "plain-2", "");
    assert!(serves_within(&sources, "plain-2", Duration::from_secs(2)).await);
    assert_eq!(refusal(), Some(reason));
    assert!(!serves(&sources, "own"));
    shutdown.cancel();
}

/// The directory renamed away and made again: the new one is watched, its
/// files read at once, not at the recheck.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_made_again_is_watched() {
    let broker = silent_broker();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sources");
    std::fs::create_dir(&dir).unwrap();
    let (sources, shutdown) = watching(&dir, &broker).await;
    put_source(&dir, "first", "");
    assert!(serves_within(&sources, "first", Duration::from_secs(2)).await);

    std::fs::rename(&dir, root.path().join("sources.old")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    put_source(&dir, "second", "");
    assert!(
        serves_within(&sources, "second", Duration::from_secs(3)).await,
        "the new directory's file waited for the recheck"
    );
    assert!(!serves(&sources, "first"), "the old directory's file stays");
    tokio::time::sleep(Duration::from_millis(300)).await;
    put_source(&dir, "third", "");
    assert!(
        serves_within(&sources, "third", Duration::from_secs(2)).await,
        "a change in the new directory is not seen"
    );
    shutdown.cancel();
}

/// A linked sources directory switched to another target: the target is
/// watched, its files read at once, not at the recheck.
#[tokio::test(flavor = "multi_thread")]
async fn a_switched_link_is_followed() {
    let broker = silent_broker();
    let root = tempfile::tempdir().unwrap();
    let (a, b, link) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("sources"),
    );
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::os::unix::fs::symlink(&a, &link).unwrap();
    let (sources, shutdown) = watching(&link, &broker).await;
    put_source(&a, "first", "");
    assert!(serves_within(&sources, "first", Duration::from_secs(2)).await);

    // As a deployment tool switches it: a new link renamed over the old.
    put_source(&b, "second", "");
    let staged = root.path().join("sources.new");
    std::os::unix::fs::symlink(&b, &staged).unwrap();
    std::fs::rename(&staged, &link).unwrap();
    assert!(
        serves_within(&sources, "second", Duration::from_secs(3)).await,
        "the new target's file waited for the recheck"
    );
    assert!(!serves(&sources, "first"), "the old target's file stays");
    tokio::time::sleep(Duration::from_millis(300)).await;
    put_source(&b, "third", "");
    assert!(
        serves_within(&sources, "third", Duration::from_secs(2)).await,
        "a change in the new target is not seen"
    );
    shutdown.cancel();
}

/// An embedded ledger at `path`, opened as start-up opens it (waiting while
/// a closing handle of this process still holds the file).
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

/// Why `/admin/sources` says the source `name`'s file is refused.
fn refusal(sources: &Sources, name: &str) -> Option<String> {
    sources
        .report()
        .sources
        .into_iter()
        .find(|v| v.name == name)
        .and_then(|v| v.refused)
}

/// Issue 49, item 6: the account's owner is the source the ledger records,
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
        .record(vec![owners::Taking {
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

/// Issue 49, item 12b: a file named like a main-file source is refused,
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

/// Issue 49, item 12e: `check-config` reports every problem of a file, not
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

/// Issue 49, item 12f: a directory source reading secret files has its
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

/// Issue 49, item 12c: a file written in place slowly, whose first part
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

/// Issue 49, item 12a: a removed file's source takes its series off
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

/// Issue 49, item 12g: every source's dead letters (raw JSON) and records
/// stay outside every other topic pattern a subscriber reads by: one
/// source's prefix inside another's, the shared topics inside a source's
/// pattern, a dead-letter topic inside its own source's pattern (`-`).
#[tokio::test]
async fn no_topics_fall_inside_another_prefixs_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, account: &str, prefix: &str| {
        std::fs::write(
            dir.path().join(name),
            format!("secrets = [\"secret-of-{account}\"]\naccount = \"{account}\"\ntopic_prefix = \"{prefix}\"\n"),
        )
        .unwrap();
    };
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

/// Issue 49, item 12d: a source file that is a link to a file outside the
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
