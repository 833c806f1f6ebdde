//! What `check-config` and a running posbridge say of a sources directory's
//! files.

use std::path::Path;

use super::*;
use crate::app::check::webhook_source;

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

/// Writes source file `name` in `dir`, for `account`, with topics of its
/// own under `prefix`.
fn put_prefixed(dir: &Path, name: &str, account: &str, prefix: &str) {
    std::fs::write(
        dir.join(name),
        format!("secrets = [\"secret-of-{account}\"]\naccount = \"{account}\"\ntopic_prefix = \"{prefix}\"\n"),
    )
    .unwrap();
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
    let put =
        |name: &str, account: &str, prefix: &str| put_prefixed(dir.path(), name, account, prefix);
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
    assert!(
        a_new_file_is_served(&sources, &dir).await,
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
    assert!(
        a_new_file_is_served(&sources, &b).await,
        "a change in the new target is not seen"
    );
    shutdown.cancel();
}

/// Whether a file put in `dir` a moment after its watch was set up anew
/// is served within two seconds (the moment: the directory's own events
/// of the switch have passed, so the file's are the ones seen).
async fn a_new_file_is_served(sources: &Sources, dir: &Path) -> bool {
    tokio::time::sleep(Duration::from_millis(300)).await;
    put_source(dir, "third", "");
    serves_within(sources, "third", Duration::from_secs(2)).await
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

mod owners;
mod reads;
