//! What each source claims that no other may (its provider and account,
//! its own topics), and the checks a directory's file passes to be a
//! source: the ones `check-config` makes and a running posbridge makes
//! as it reads the directory.

use std::collections::BTreeMap;

use super::Key;
use crate::adapters::providers;
use crate::app::check::source_problems;
use crate::config::source_files::{self, SourceFile};
use crate::config::{Config, KafkaConfig, Problem, collision_name, topics_of_prefix};
use crate::domain::event::ProviderKind;

/// What a source holds that no other may: its provider and account (a
/// record key space has one source) and its own topics, by the name Kafka
/// tells topics apart by ([`collision_name`]).
#[derive(Debug, Default)]
pub(super) struct Claims {
    accounts: BTreeMap<(ProviderKind, Option<String>), String>,
    topics: BTreeMap<String, Key>,
}

/// What a source claims: its account and its own topics' prefix.
#[derive(Debug, Clone, Default)]
pub(super) struct Claim {
    account: Option<String>,
    topic_prefix: Option<String>,
}

impl Claims {
    /// The main file's sources' claims.
    pub(super) fn of_main(main: &BTreeMap<Key, Claim>) -> Claims {
        let mut claims = Claims::default();
        for (key, claim) in main {
            claims.take(key, claim);
        }
        claims
    }

    /// `claim` taken by the source `key`.
    pub(super) fn take(&mut self, key: &Key, claim: &Claim) {
        self.accounts
            .insert((key.0, claim.account.clone()), key.1.clone());
        for topic in claim.topic_prefix.iter().flat_map(|p| topics_of_prefix(p)) {
            self.topics.insert(collision_name(&topic), key.clone());
        }
    }
}

/// What a file that parsed must pass to be a source: a name that is not
/// the main file's, an account no other source has, and its provider's
/// checks. Takes its account on success.
pub(super) fn check_file(
    file: &SourceFile,
    main: &BTreeMap<Key, Claim>,
    claims: &mut Claims,
    kafka: &KafkaConfig,
) -> Result<(), String> {
    if let Some(why) = file
        .config
        .topic_prefix
        .as_deref()
        .and_then(|prefix| kafka.shared_topic_clash(prefix))
    {
        return Err(format!("{}.topic_prefix: {why}", file.entry().key()));
    }
    if main.contains_key(&(file.provider, file.name.clone())) {
        return Err(format!(
            "{}.sources.{} is a source of the main file: one URL, one source",
            file.provider, file.name
        ));
    }
    let key = (file.provider, file.name.clone());
    let account = (file.provider, file.config.account.clone());
    if let Some(owner) = claims
        .accounts
        .get(&account)
        .filter(|owner| **owner != file.name)
    {
        return Err(format!(
            "{}.account: {}.sources.{owner} has the same provider and account: their records would share keys; give each source an account of its own",
            file.entry().key(),
            file.provider,
        ));
    }
    let taken = file
        .config
        .topic_prefix
        .iter()
        .flat_map(|prefix| topics_of_prefix(prefix))
        .find_map(|topic| {
            claims
                .topics
                .get(&collision_name(&topic))
                .filter(|owner| **owner != key)
        });
    if let Some((provider, owner)) = taken {
        return Err(format!(
            "{}.topic_prefix: gives a topic {provider}.sources.{owner}'s topic_prefix gives too (or a name Kafka takes for it, `.` and `_` alike): each source's own topics are its own",
            file.entry().key(),
        ));
    }
    let problems = source_problems(file.entry());
    if !problems.is_empty() {
        return Err(problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "));
    }
    claims.take(&key, &Claim::of(&file.config));
    Ok(())
}

impl Claim {
    pub(super) fn of(config: &crate::config::SourceConfig) -> Claim {
        Claim {
            account: config.account.clone(),
            topic_prefix: config.topic_prefix.clone(),
        }
    }

    pub(super) fn of_source(source: &crate::domain::event::Source) -> Claim {
        Claim {
            account: source.account.clone(),
            topic_prefix: source.topic_prefix.as_deref().map(str::to_owned),
        }
    }
}

/// The sources directory's problems, for `check-config`: each refused
/// file, by its path, as a running posbridge would refuse it. Not part of
/// [`crate::app::problems`]: `serve` starts with a bad file in the directory,
/// which it refuses alone.
pub fn dir_problems(config: &Config) -> Vec<Problem> {
    let Some(dir) = &config.sources_dir else {
        return Vec::new();
    };
    let listing = match source_files::read_dir(dir, providers::api_keys) {
        Ok(listing) => listing,
        Err(error) => return vec![Problem::new("sources_dir", error.to_string())],
    };
    let main = config
        .sources()
        .map(|e| ((e.provider, e.name.to_owned()), Claim::of(e.config)))
        .collect();
    let mut claims = Claims::of_main(&main);
    let checked = listing.files.iter().filter_map(|file| {
        check_file(file, &main, &mut claims, &config.kafka)
            .err()
            .map(|reason| (file.path.clone(), file.refused(&reason).reason))
    });
    let refused = listing
        .refused
        .iter()
        .map(|r| (r.path.clone(), r.reason.clone()));
    let mut problems: Vec<Problem> = refused
        .chain(checked)
        .map(|(path, reason)| Problem::new(path.display().to_string(), reason))
        .collect();
    problems.sort_by(|a, b| a.key.cmp(&b.key));
    problems
}
