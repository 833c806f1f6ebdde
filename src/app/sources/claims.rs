//! What each source claims that no other may (its provider and account,
//! its own topics), and the checks a directory's file passes to be a
//! source: the ones `check-config` makes and a running posbridge makes
//! as it reads the directory.

use std::collections::BTreeMap;

use super::Key;
use super::owners::{self, Account, Holder, Recorded};
use crate::adapters::providers;
use crate::app::check::source_problems;
use crate::config::source_files::{self, Listing, SourceFile};
use crate::config::{
    Config, KafkaConfig, Problem, collision_name, prefixes_nest as nested, topics_of_prefix,
};
use crate::domain::event::ProviderKind;

/// What a source holds that no other may: its provider and account (a
/// record key space has one source) and its own topics, by the name Kafka
/// tells topics apart by ([`collision_name`]).
#[derive(Debug, Default)]
pub(super) struct Claims {
    accounts: BTreeMap<Account, Holder>,
    topics: BTreeMap<String, Key>,
    /// The own topics' prefixes: no source's topics inside another's pattern.
    prefixes: BTreeMap<String, Key>,
}

/// What a source claims: its account and its own topics' prefix.
#[derive(Debug, Clone, Default)]
pub(super) struct Claim {
    account: Option<String>,
    topic_prefix: Option<String>,
}

impl Claims {
    /// The main file's sources' claims, then the accounts' `owners` (see
    /// [`owners`]): a source of the main file keeps its account against
    /// every file, as the main file is read only at start.
    pub(super) fn new(main: &BTreeMap<Key, Claim>, owners: BTreeMap<Account, Holder>) -> Claims {
        let mut claims = Claims::default();
        for (key, claim) in main {
            claims.take(key, claim);
        }
        for (account, holder) in owners {
            claims.accounts.entry(account).or_insert(holder);
        }
        claims
    }

    /// `claim` taken by the source `key`: its topics, and its account
    /// unless another source holds it already.
    pub(super) fn take(&mut self, key: &Key, claim: &Claim) {
        self.accounts
            .entry(claim.account(key.0))
            .or_insert_with(|| Holder {
                name: key.1.clone(),
                since: None,
            });
        for topic in claim.topic_prefix.iter().flat_map(|p| topics_of_prefix(p)) {
            self.topics.insert(collision_name(&topic), key.clone());
        }
        if let Some(prefix) = &claim.topic_prefix {
            self.prefixes.insert(prefix.clone(), key.clone());
        }
    }

    /// Whether the source `key` may serve with `claim`'s account: no other
    /// source holds it.
    pub(super) fn lets(&self, key: &Key, claim: &Claim) -> bool {
        self.accounts
            .get(&claim.account(key.0))
            .is_none_or(|holder| holder.name == key.1)
    }
}

/// What a file that parsed must pass to be a source: a name that is not
/// the main file's, an account no other source holds, its own topics no
/// other source's or shared, and its provider's checks. Takes its account
/// on success; every problem found, each on its own, on failure (an
/// operator fixes them all in one go). `note` ends a refusal for an
/// account no entry of the ledger gives its holder (`check-config`'s).
pub(super) fn check_file(
    file: &SourceFile,
    main: &BTreeMap<Key, Claim>,
    claims: &mut Claims,
    kafka: &KafkaConfig,
    note: Option<&str>,
) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if let Some(why) = file
        .config
        .topic_prefix
        .as_deref()
        .and_then(|prefix| kafka.shared_topic_clash(prefix))
    {
        problems.push(format!("{}.topic_prefix: {why}", file.entry().key()));
    }
    if main.contains_key(&(file.provider, file.name.clone())) {
        problems.push(format!(
            "{}.sources.{} is a source of the main file: one URL, one source",
            file.provider, file.name
        ));
    }
    let key = (file.provider, file.name.clone());
    let account = (file.provider, file.config.account.clone());
    if let Some(owner) = claims
        .accounts
        .get(&account)
        .filter(|owner| owner.name != file.name)
    {
        // What the ledger could say of the holder, when no entry names it
        // (a source of the main file holds its account whatever it says).
        let note = note
            .filter(|_| owner.since.is_none())
            .filter(|_| !main.contains_key(&(file.provider, owner.name.clone())))
            .unwrap_or_default();
        problems.push(format!(
            "{}.account: {}.sources.{} has the same provider and account{}: their records would share keys; give each source an account of its own{note}",
            file.entry().key(),
            file.provider,
            owner.name,
            owner.owning(),
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
        problems.push(format!(
            "{}.topic_prefix: gives a topic {provider}.sources.{owner}'s topic_prefix gives too (or a name Kafka takes for it, `.` and `_` alike): each source's own topics are its own",
            file.entry().key(),
        ));
    }
    // Said when no topic is taken outright (the one reason is enough).
    let nested = file
        .config
        .topic_prefix
        .as_deref()
        .filter(|_| taken.is_none())
        .and_then(|prefix| {
            claims.prefixes.iter().find_map(|(other, owner)| {
                (*owner != key && nested(prefix, other)).then_some(owner)
            })
        });
    if let Some((provider, owner)) = nested {
        problems.push(format!(
            "{}.topic_prefix: its topics and {provider}.sources.{owner}'s would be inside one another's pattern: a subscriber to one source's topics would read the other's records and raw dead letters; give each a prefix neither begins the other's topics with",
            file.entry().key(),
        ));
    }
    problems.extend(
        source_problems(file.entry())
            .iter()
            .map(ToString::to_string),
    );
    if !problems.is_empty() {
        return Err(problems);
    }
    claims.take(&key, &Claim::of(&file.config));
    Ok(())
}

impl Claim {
    /// The account claimed, of `provider`'s sources.
    pub(super) fn account(&self, provider: ProviderKind) -> Account {
        (provider, self.account.clone())
    }

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
/// which it refuses alone. Where two files claim one account, the one the
/// ledger records as its owner keeps it (read when it can be without
/// disturbing a running posbridge: [`owners::read_for_check`]); else the
/// first in name order, as a start on a ledger without it would.
pub async fn dir_problems(config: &Config) -> Vec<Problem> {
    let Some(dir) = &config.sources_dir else {
        return Vec::new();
    };
    let listing = match source_files::read_dir(dir, providers::api_keys) {
        Ok(listing) => listing,
        Err(error) => return vec![Problem::new("sources_dir", error.to_string())],
    };
    let claimants: Vec<(Account, String)> = listing
        .files
        .iter()
        .map(|f| ((f.provider, f.config.account.clone()), f.name.clone()))
        .collect();
    let mut claimed: BTreeMap<&Account, usize> = BTreeMap::new();
    for (account, _) in &claimants {
        *claimed.entry(account).or_default() += 1;
    }
    // The ledger is asked only when its answer changes what is said.
    let recorded = if claimed.values().any(|n| *n > 1) {
        let unknown = listing.refused.iter().filter_map(|r| r.source.clone());
        owners::read_for_check(config, owners::asks(claimants.clone(), unknown)).await
    } else {
        Recorded::default()
    };
    listing_problems(config, listing, &recorded)
}

/// [`dir_problems`] of a directory read, with what the ledger records.
fn listing_problems(config: &Config, listing: Listing, recorded: &Recorded) -> Vec<Problem> {
    let main = config
        .sources()
        .map(|e| ((e.provider, e.name.to_owned()), Claim::of(e.config)))
        .collect();
    let mut claims = Claims::new(&main, recorded.owners(&BTreeMap::new()));
    let note = recorded.note.as_deref();
    let checked = listing.files.iter().flat_map(|file| {
        let problems = check_file(file, &main, &mut claims, &config.kafka, note).err();
        problems
            .into_iter()
            .flatten()
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
    // By file, each file's problems in the order they were found.
    problems.sort_by(|a, b| a.key.cmp(&b.key));
    problems
}
