//! What `check-config` and a running posbridge say of a sources directory's
//! files.

use std::path::Path;

use super::*;

/// What `check-config` says of `config`'s directory: each refused file's
/// name and why.
fn problems_by_file(config: &Config) -> Vec<(String, String)> {
    dir_problems(config)
        .into_iter()
        .map(|p| {
            let file = Path::new(&p.key).file_name().unwrap().to_str().unwrap();
            (file.to_owned(), p.message)
        })
        .collect()
}

/// `check-config` on a main file and a directory: each file refused by
/// its path, as a running posbridge refuses it.
#[test]
fn check_config_names_every_refused_file_by_its_path() {
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
    let config = Config::from_toml(&format!(
        "sources_dir = \"{}\"\n[mekari.sources.main]\nsecrets = [\"secret-of-main\"]\n",
        dir.path().display()
    ))
    .unwrap();
    let problems = problems_by_file(&config);
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
#[test]
fn own_topics_that_collide_are_refused_naming_the_collision() {
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
    put("mekari.e-dash.toml", "e", "dl-");
    put("mekari.f-dot.toml", "f", "col.");
    put("mekari.g-under.toml", "g", "col_");
    put("mekari.h-main.toml", "h", "main_");
    put("mekari.i-fine.toml", "i", "fine.");
    let config = Config::from_toml(&format!(
        "sources_dir = \"{}\"\n[mekari.sources.main]\nsecrets = [\"secret-of-main\"]\ntopic_prefix = \"main.\"\n",
        dir.path().display()
    ))
    .unwrap();
    let problems = problems_by_file(&config);
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
#[test]
fn a_refused_files_reason_quotes_no_value_of_it() {
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
    let config = Config::from_toml(&format!(
        "sources_dir = \"{}\"\n[kafka]\ntopic_prefix = \"s3cr3t-shared.\"\n[mekari.sources.main]\nsecrets = [\"secret-of-main\"]\n",
        dir.path().display()
    ))
    .unwrap();
    let problems = dir_problems(&config);
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

#[test]
fn a_directory_that_cannot_be_listed_is_a_problem_of_sources_dir() {
    let config = Config::from_toml("sources_dir = \"/nonexistent/sources\"\n").unwrap();
    let problems = dir_problems(&config);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].key, "sources_dir");
}
