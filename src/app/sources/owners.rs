//! Which source owns a merchant account, recorded in the ledger so that it
//! is the same on every replica and after every restart.
//!
//! One provider and account is one record key space, and only one source
//! may serve it. A running process keeps an account with the source that
//! serves it against a new file claiming it; but what a process knows ends
//! with it, and at start it gave the account to the first file in name
//! order. A restart then handed a live merchant's account to a newcomer
//! refused until then (the merchant answered 404, and ReceiptRoller switches
//! a webhook off after four), and replicas started at different times
//! disagreed.
//!
//! So the source that takes an account records it in the ledger, which
//! replicas share and a restart keeps: the checkpoint
//! `owner/{provider}/{account}/{source}` (the account empty for a source
//! without one) holding the unix millisecond it took the account. Every
//! read of the directory asks about the sources whose files are there, and
//! gives each account to the one that took it last:
//!
//! - a file claiming an account another source owns is refused, the owner
//!   named, whatever their names' order; the owner keeps serving;
//! - an owner whose file is refused (broken) still holds its account: its
//!   file is there, and fixed it serves again;
//! - an owner whose file is gone passes the account to the next claimant,
//!   which records that it took it, later than every entry it read, so an
//!   old file coming back does not take the account back;
//! - a source running here whose entry is gone (a lost ledger) records it
//!   again at the next read: the ledger forgot, the process did not;
//! - an account no entry names (its first claim, the first start of a
//!   version that records owners, a start on a lost ledger) goes as it
//!   did before: to a source running here, else to the first file in name
//!   order; recorded from then on.
//!
//! The entries are not read back from the topics: a lost ledger is filled
//! again while the directory is read, and the processes still running
//! record their owners again (docs/CONFIGURATION.md says what a start on a
//! lost ledger does). The ledger has no compare-and-set: two replicas that
//! each give an account no entry names to a different file at the same
//! moment (each seeing the directory at another moment) both record, and
//! the later entry wins on both at their next read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tracing::{debug, info};

use super::Key;
use crate::adapters::ledger::{Commit, Ledger, LedgerError};
use crate::domain::event::ProviderKind;

/// A record key space: a provider and an account (none: the provider's
/// keys without an account, which two sources without one would share).
pub(super) type Account = (ProviderKind, Option<String>);

/// At most this many entries are read at once: one round trip each on
/// Redis, and a directory may hold hundreds of files.
const READS_AT_ONCE: usize = 16;

/// The checkpoint that records `source` as the owner of `account`. An
/// account holds no `:` and is never empty, but may hold `/`; a source
/// name holds neither, so the name after the last `/` is the source's.
pub(super) fn entry_name((provider, account): &Account, source: &str) -> String {
    format!(
        "owner/{provider}/{}/{source}",
        account.as_deref().unwrap_or_default()
    )
}

/// Who holds an account in one read of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    /// The source's name (of the account's provider).
    pub(super) name: String,
    /// When it took the account (unix milliseconds), as the ledger records
    /// it; none when no entry says so (a source of the main file, one
    /// running here, the first file in name order).
    pub(super) since: Option<i64>,
}

impl Holder {
    /// What a refusal says of how the holder holds the account, beyond its
    /// name: empty when no entry says it owns the account.
    pub(super) fn owning(&self) -> String {
        let Some(since) = self.since else {
            return String::new();
        };
        let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(since) * 1_000_000)
            .ok()
            .and_then(|at| at.replace_nanosecond(0).ok())
            .and_then(|at| at.format(&Rfc3339).ok())
            .unwrap_or_else(|| since.to_string());
        format!(
            ", and owns them since {at} (the ledger records it: every replica and every restart keep it with its source until that source's file is removed)"
        )
    }
}

/// What the ledger holds of the owners of the accounts one read of the
/// directory asked about.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Each account's entries by source name: when it took the account.
    entries: BTreeMap<Account, BTreeMap<String, i64>>,
    /// What `check-config` adds to a refusal whose account no entry gives
    /// its holder: why the ledger was not read, or that it names no owner.
    pub(super) note: Option<String>,
}

/// An entry to write: `name` took `account` at `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Taking {
    pub(super) account: Account,
    pub(super) name: String,
    pub(super) since: i64,
    /// The source the ledger named the owner until then, when another.
    pub(super) from: Option<String>,
}

impl Recorded {
    /// Each account's owner: a source running here whose entry is gone
    /// (it records it again), else the one that took it last (the first
    /// in name order of those that took it in the same millisecond).
    /// `running` maps each account a source runs with here to its name.
    /// Only the sources whose files are there were asked about, so every
    /// owner named is one of them.
    pub(super) fn owners(&self, running: &BTreeMap<Account, String>) -> BTreeMap<Account, Holder> {
        let mut owners: BTreeMap<Account, Holder> = self
            .entries
            .keys()
            .filter_map(|account| Some((account.clone(), self.latest(account)?)))
            .collect();
        for (account, name) in running {
            let recorded = self
                .entries
                .get(account)
                .is_some_and(|e| e.contains_key(name));
            if !recorded {
                owners.insert(
                    account.clone(),
                    Holder {
                        name: name.clone(),
                        since: None,
                    },
                );
            }
        }
        owners
    }

    /// The owner the entries name: the source that took the account last.
    fn latest(&self, account: &Account) -> Option<Holder> {
        self.entries
            .get(account)?
            .iter()
            .rev()
            .max_by_key(|(_, since)| **since)
            .map(|(name, since)| Holder {
                name: name.clone(),
                since: Some(*since),
            })
    }

    /// The entries a read writes: each account served by a source the
    /// entries do not name its owner (a first claim, an account passed on,
    /// an entry lost) records that it took it `now`, and never earlier than
    /// one millisecond after the last entry read of it, whatever the clocks
    /// say: the last to take an account is the one that owns it.
    pub(super) fn to_record(&self, serving: &BTreeMap<Account, String>, now: i64) -> Vec<Taking> {
        serving
            .iter()
            .filter_map(|(account, name)| {
                let latest = self.latest(account);
                if latest.as_ref().is_some_and(|l| l.name == *name) {
                    return None;
                }
                let since = latest
                    .as_ref()
                    .and_then(|l| l.since)
                    .map_or(now, |last| now.max(last.saturating_add(1)));
                Some(Taking {
                    account: account.clone(),
                    name: name.clone(),
                    since,
                    from: latest.map(|l| l.name),
                })
            })
            .collect()
    }
}

/// The entries a read of the directory asks about: each source whose file
/// is there with the account it claims (`claimants`: its file's, and the
/// one it runs with here); and each file whose account cannot be told
/// (`unknown`: it does not parse, its topics could not be opened) with
/// every account of its provider claimed, as it may be one's owner.
pub(super) fn asks(
    claimants: impl IntoIterator<Item = (Account, String)>,
    unknown: impl IntoIterator<Item = Key>,
) -> BTreeSet<(Account, String)> {
    let mut asks: BTreeSet<(Account, String)> = claimants.into_iter().collect();
    let accounts: BTreeSet<Account> = asks.iter().map(|(account, _)| account.clone()).collect();
    for (provider, name) in unknown {
        for account in accounts.iter().filter(|a| a.0 == provider) {
            asks.insert((account.clone(), name.clone()));
        }
    }
    asks
}

/// Where owners are recorded: the ledger. Cheap to clone.
#[derive(Clone, Default)]
pub struct Owners {
    /// None: nothing is recorded or read, and each start decides as the
    /// running process does (for tests of the directory alone).
    ledger: Option<Arc<Ledger>>,
}

impl Owners {
    /// Owners recorded in `ledger`.
    pub fn in_ledger(ledger: Arc<Ledger>) -> Owners {
        Owners {
            ledger: Some(ledger),
        }
    }

    /// The entries `asks` names, as the store holds them now: not held
    /// back by the ledger's fill (which does not write them) so that the
    /// first read, before the fill, decides on them too.
    ///
    /// # Errors
    /// [`LedgerError`] when the ledger cannot be read.
    pub(super) async fn read(
        &self,
        asks: BTreeSet<(Account, String)>,
    ) -> Result<Recorded, LedgerError> {
        let Some(ledger) = &self.ledger else {
            return Ok(Recorded::default());
        };
        read_entries(ledger, asks).await
    }

    /// Writes `taken`: each source owns its account from then on. Durable
    /// with the ledger's next checkpoint (a second on the embedded ledger,
    /// at once on Redis); a write that fails is made again when the ledger
    /// writes again, and the next read records what is still missing.
    ///
    /// # Errors
    /// [`LedgerError`] when a write fails.
    pub(super) async fn record(&self, taken: Vec<Taking>) -> Result<(), LedgerError> {
        let Some(ledger) = &self.ledger else {
            return Ok(());
        };
        for taking in taken {
            let Taking {
                account: (provider, account),
                name,
                since,
                from,
            } = taking;
            ledger
                .commit(Commit::checkpoint(
                    entry_name(&(provider, account.clone()), &name),
                    since,
                ))
                .await?;
            let account = account.unwrap_or_default();
            match from {
                Some(from) => {
                    info!(%provider, account, source = %name, before = %from, "The account passes to this source: the source that owned it has no file any more. Recorded in the ledger.");
                }
                None => {
                    debug!(%provider, account, source = %name, "Source recorded as its account's owner.");
                }
            }
        }
        Ok(())
    }
}

/// [`Owners::read`] on `ledger`.
async fn read_entries(
    ledger: &Ledger,
    asks: BTreeSet<(Account, String)>,
) -> Result<Recorded, LedgerError> {
    let found: Vec<Option<(Account, String, i64)>> = futures::stream::iter(asks)
        .map(|(account, name)| async move {
            let since = ledger
                .read()
                .checkpoint(&entry_name(&account, &name))
                .await?;
            Ok::<_, LedgerError>(since.map(|since| (account, name, since)))
        })
        .buffer_unordered(READS_AT_ONCE)
        .try_collect()
        .await?;
    let mut recorded = Recorded::default();
    for (account, name, since) in found.into_iter().flatten() {
        recorded
            .entries
            .entry(account)
            .or_default()
            .insert(name, since);
    }
    Ok(recorded)
}

/// For `check-config`: the entries `asks` names, read from the configured
/// ledger when it can be read without disturbing one in use (an embedded
/// file that exists, intact, and that no `serve` holds; a Redis that
/// answers within a few seconds), with a note saying what the reader
/// should know of an account no entry gives a holder.
pub(super) async fn read_for_check(
    config: &crate::config::Config,
    asks: BTreeSet<(Account, String)>,
) -> Recorded {
    use crate::adapters::ledger::{self, EmbeddedLedger};
    use crate::config::LedgerBackend;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(5);
    let unread = |why: String| Recorded {
        entries: BTreeMap::new(),
        note: Some(format!(
            "; which of them owns the account is recorded in the ledger, which check-config could not read ({why}): a running posbridge keeps the owner it records, ask it (GET /admin/sources)"
        )),
    };
    if config.ledger.backend == LedgerBackend::Embedded {
        let path = &config.ledger.path;
        if !path.exists() {
            return Recorded {
                entries: BTreeMap::new(),
                note: Some(format!(
                    "; no ledger at {} records an owner: a posbridge starting on it gives the account to the first file in name order",
                    path.display()
                )),
            };
        }
        // Opened only when intact and free: an open would set a damaged
        // file aside, and `serve` holds the file while it runs.
        let checked = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || EmbeddedLedger::check(&path).map(drop)).await
        };
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return unread(error.to_string()),
            Err(error) => return unread(error.to_string()),
        }
    }
    let read = async {
        let opened = ledger::open(&config.ledger, config.kafka.delivery_timeout()).await?;
        read_entries(&opened.ledger, asks).await
    };
    match tokio::time::timeout(WAIT, read).await {
        Ok(Ok(mut recorded)) => {
            recorded.note = Some(
                "; no owner is recorded in the ledger: a posbridge starting now gives the account to the first file in name order, one running keeps it with the source it serves".to_owned(),
            );
            recorded
        }
        Ok(Err(error)) => unread(error.to_string()),
        Err(_) => unread(format!("no answer within {} s", WAIT.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(name: &str) -> Account {
        (ProviderKind::Mekari, Some(name.to_owned()))
    }

    fn recorded(entries: &[(&str, &str, i64)]) -> Recorded {
        let mut recorded = Recorded::default();
        for (acc, name, since) in entries {
            recorded
                .entries
                .entry(account(acc))
                .or_default()
                .insert((*name).to_owned(), *since);
        }
        recorded
    }

    fn owner(owners: &BTreeMap<Account, Holder>, acc: &str) -> Option<(String, Option<i64>)> {
        owners.get(&account(acc)).map(|h| (h.name.clone(), h.since))
    }

    #[test]
    fn an_entry_names_provider_account_and_source() {
        assert_eq!(
            entry_name(&account("shop/12"), "shop-12"),
            "owner/mekari/shop/12/shop-12"
        );
        assert_eq!(
            entry_name(&(ProviderKind::ReceiptRoller, None), "main"),
            "owner/receiptroller//main"
        );
    }

    /// The last to take an account owns it, whatever the names' order; a
    /// source running here whose entry is gone holds it before any entry.
    #[test]
    fn the_last_to_take_an_account_owns_it() {
        let read = recorded(&[("a", "b-newer", 20), ("a", "a-older", 10), ("b", "x", 5)]);
        let owners = read.owners(&BTreeMap::new());
        assert_eq!(owner(&owners, "a"), Some(("b-newer".to_owned(), Some(20))));
        assert_eq!(owner(&owners, "b"), Some(("x".to_owned(), Some(5))));
        // The same millisecond: the first in name order.
        let tie = recorded(&[("a", "b", 10), ("a", "a", 10)]);
        assert_eq!(
            owner(&tie.owners(&BTreeMap::new()), "a"),
            Some(("a".to_owned(), Some(10)))
        );

        // Running here with its entry: the entries decide (another
        // replica's later entry wins). Without it: it holds the account.
        let running = BTreeMap::from([(account("a"), "a-older".to_owned())]);
        assert_eq!(
            owner(&read.owners(&running), "a"),
            Some(("b-newer".to_owned(), Some(20)))
        );
        let running = BTreeMap::from([(account("a"), "c-lost".to_owned())]);
        assert_eq!(
            owner(&read.owners(&running), "a"),
            Some(("c-lost".to_owned(), None))
        );
    }

    /// A source serving an account the entries do not give it records
    /// that it took it, after every entry read: a returning old owner's
    /// entry, however recent its clock, stays behind.
    #[test]
    fn a_source_taking_an_account_records_it_after_every_entry() {
        let read = recorded(&[("a", "gone", 1_000), ("b", "kept", 7)]);
        let serving = BTreeMap::from([
            (account("a"), "next".to_owned()),
            (account("b"), "kept".to_owned()),
            (account("c"), "first".to_owned()),
        ]);
        assert_eq!(
            read.to_record(&serving, 500),
            vec![
                Taking {
                    account: account("a"),
                    name: "next".to_owned(),
                    since: 1_001,
                    from: Some("gone".to_owned()),
                },
                Taking {
                    account: account("c"),
                    name: "first".to_owned(),
                    since: 500,
                    from: None,
                },
            ]
        );
    }

    /// A file whose account cannot be told is asked about for every
    /// account of its provider.
    #[test]
    fn a_file_without_a_known_account_is_asked_about_for_each_of_its_providers() {
        let asks = asks(
            [
                (account("a"), "x".to_owned()),
                ((ProviderKind::ReceiptRoller, None), "y".to_owned()),
            ],
            [(ProviderKind::Mekari, "broken".to_owned())],
        );
        let mut names: Vec<String> = asks.iter().map(|(a, s)| entry_name(a, s)).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "owner/mekari/a/broken",
                "owner/mekari/a/x",
                "owner/receiptroller//y"
            ]
        );
    }
}
