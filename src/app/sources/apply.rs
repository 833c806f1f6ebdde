//! Putting what a read of the sources directory found in use: the new set
//! built aside from the main file's sources, the running ones and the
//! read's files (each admitted against what the others claim, or refused),
//! swapped in whole, and what changed said once. Apart from `sources.rs`,
//! which decides when to read and what a read is given.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError};

use time::OffsetDateTime;
use tracing::{info, warn};

use super::claims::{Claim, Claims, check_file};
use super::owners::{Recorded, Taking};
use super::series::{announce, gauges, secret_files_readable};
use super::{DirState, Key, Loaded, Sources};
use crate::adapters::secrets::{self, LoadError};
use crate::app::check::{signature, webhook_source};
use crate::config::source_files::{Listing, Refusal, SourceFile};
use crate::http::ingress::{SourceMap, WebhookSource};
use crate::observe::gone;

impl Sources {
    /// Puts what a read of the directory found in use, in one swap; the
    /// files `waiting` for their own topics keep what they had. Each
    /// account goes to the owner `recorded` names; what to record of the
    /// accounts given anew is returned.
    pub(super) fn apply(
        &self,
        listing: Listing,
        waiting: &[SourceFile],
        recorded: &Recorded,
    ) -> Vec<Taking> {
        // The sources in use, taken and let go: the files are read and
        // checked without the lock `/admin/sources` takes (only this watch
        // writes the state, so nothing changes it meanwhile). A waiting
        // file's refusal stays as it is: said once, not again at each
        // attempt.
        let (before, held) = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let held: Vec<Refusal> = waiting
                .iter()
                .filter_map(|f| state.refused.get(&f.path).cloned())
                .collect();
            (state.loaded.clone(), held)
        };
        let current = self.live.load_full();
        let running = running(&listing, waiting, &before, &current);
        let waiting = waiting.iter().map(|f| (f.provider, f.name.clone()));
        let mut next: SourceMap = current
            .iter()
            .filter(|(key, _)| self.main.contains_key(*key))
            .map(|(key, webhook)| (key.clone(), webhook.clone()))
            .collect();
        // The main file's, then the owners the ledger records, then the
        // running sources' claims.
        let running_accounts = running
            .iter()
            .map(|(key, claim)| (claim.account(key.0), key.1.clone()))
            .collect();
        let mut claims = Claims::new(&self.main, recorded.owners(&running_accounts));
        for (key, claim) in &running {
            claims.take(key, claim);
        }
        let mut loaded = BTreeMap::new();
        let mut refused = BTreeMap::new();
        // Sources in use first: a new file never takes an account or a
        // name from one that runs.
        let (running, new): (Vec<SourceFile>, Vec<SourceFile>) = listing
            .files
            .into_iter()
            .partition(|file| before.contains_key(&(file.provider, file.name.clone())));
        for file in running.into_iter().chain(new) {
            let key = (file.provider, file.name.clone());
            let running_now = before.get(&key).zip(current.get(&key));
            match self.admit(&file, running_now, &mut claims) {
                Ok((webhook, at)) => {
                    loaded.insert(key.clone(), Loaded { file, at });
                    next.insert(key, webhook);
                }
                Err(reason) => {
                    refused.insert(file.path.clone(), file.refused(&reason));
                }
            }
        }
        for refusal in listing.refused.into_iter().chain(held) {
            refused.insert(refusal.path.clone(), refusal);
        }
        // A refused or waiting file's source keeps its last good settings,
        // unless another source owns their account.
        let kept: Vec<Key> = refused
            .values()
            .filter_map(|r| r.source.clone())
            .chain(waiting)
            .collect();
        for key in kept {
            if !loaded.contains_key(&key)
                && let (Some(kept), Some(webhook)) = (before.get(&key), current.get(&key))
                && claims.lets(&key, &Claim::of_source(&webhook.source))
            {
                loaded.insert(key.clone(), kept.clone());
                next.insert(key, webhook.clone());
            }
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.unreadable.take().is_some() {
            info!("The sources directory reads again.");
        }
        self.say(&state, &loaded, &refused);
        let changed = state.loaded.len() != loaded.len()
            || loaded.iter().any(|(k, l)| {
                state
                    .loaded
                    .get(k)
                    .is_none_or(|b| b.file.digest != l.file.digest)
            });
        let serving = loaded
            .keys()
            .filter_map(|key| {
                let account = next.get(key)?.source.account.clone();
                Some(((key.0, account), key.1.clone()))
            })
            .collect();
        state.loaded = loaded;
        state.refused = refused;
        gauges(&state);
        self.live.store(Arc::new(next));
        if changed {
            let files: Vec<&SourceFile> = state.loaded.values().map(|l| &l.file).collect();
            for listener in self
                .listeners
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
            {
                listener(&files);
            }
        }
        let now = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        recorded.to_record(&serving, i64::try_from(now).unwrap_or(i64::MAX))
    }

    /// The source `file` makes, and when its settings were read: the one
    /// running when the file is unchanged (its secret files read again),
    /// else a new one. Why not, when it is refused.
    fn admit(
        &self,
        file: &SourceFile,
        before: Option<(&Loaded, &WebhookSource)>,
        claims: &mut Claims,
    ) -> Result<(WebhookSource, OffsetDateTime), String> {
        if let Err(problems) = check_file(file, &self.main, claims, &self.kafka, None) {
            // The checks read the secret files too: whether they read is
            // asked apart from the other problems.
            if file.config.reads_secret_files() {
                secret_files_readable(file, secrets::read(&file.config).is_ok());
            }
            return Err(problems.join("; "));
        }
        let entry = file.entry();
        let made = match before {
            Some((loaded, webhook)) if loaded.file.digest == file.digest => {
                let reread = if file.config.reads_secret_files() {
                    let (scheme, _) = signature(entry);
                    secrets::load(&file.config, scheme).and_then(|found| {
                        webhook
                            .verifier
                            .replace(&secrets::secrets_of(&found))
                            .map(|_| ())
                            .map_err(|refused| secrets::unfit(&found, refused))
                    })
                } else {
                    Ok(())
                };
                reread.map(|()| (webhook.clone(), loaded.at))
            }
            _ => webhook_source(entry)
                .inspect(announce)
                .map(|webhook| (webhook, OffsetDateTime::now_utc())),
        };
        if file.config.reads_secret_files() {
            let readable = !matches!(made, Err(LoadError::Read(_)));
            secret_files_readable(file, readable);
        }
        // At its key, as `check-config` says it.
        made.map_err(|error| format!("{}.{}: {error}", entry.key(), error.key()))
    }

    /// Says once what a read changed: sources added, changed, removed,
    /// files refused (again only when the reason changes); the board's rows
    /// follow.
    fn say(
        &self,
        state: &DirState,
        loaded: &BTreeMap<Key, Loaded>,
        refused: &BTreeMap<PathBuf, Refusal>,
    ) {
        for (key, now) in loaded {
            let file = now.file.path.display();
            match state.loaded.get(key) {
                None => {
                    self.board.add_source(key.0, &key.1);
                    gone::source_back(key.0.as_str(), &key.1);
                    info!(provider = %key.0, source = %key.1, %file, "Source added: its webhook URL answers.");
                }
                Some(before) if before.file.digest != now.file.digest => {
                    info!(provider = %key.0, source = %key.1, %file, "Source changed: new deliveries use its new settings.");
                }
                Some(_) => {}
            }
        }
        for key in state.loaded.keys().filter(|k| !loaded.contains_key(*k)) {
            self.board.remove_source(key.0, &key.1);
            gone::source_gone(key.0.as_str(), &key.1);
            info!(provider = %key.0, source = %key.1, "Source removed: its webhook URL answers 404; what it spooled still drains.");
        }
        for (path, refusal) in refused {
            if state.refused.get(path) != Some(refusal) {
                let kept = refusal
                    .source
                    .as_ref()
                    .is_some_and(|k| loaded.contains_key(k));
                warn!(file = %path.display(), reason = %refusal.reason, kept_last_good_settings = kept, "Source file refused.");
            }
        }
    }
}

/// The directory's sources running now whose file is still there (read
/// well, refused, or waiting for its topics), with what they claim as they
/// run: each keeps its account and its topics against new files, even
/// while its file is refused, unless the ledger records another owner.
pub(super) fn running(
    listing: &Listing,
    waiting: &[SourceFile],
    before: &BTreeMap<Key, Loaded>,
    current: &SourceMap,
) -> BTreeMap<Key, Claim> {
    listing
        .files
        .iter()
        .chain(waiting)
        .map(|f| (f.provider, f.name.clone()))
        .chain(listing.refused.iter().filter_map(|r| r.source.clone()))
        .filter(|key| before.contains_key(key))
        .filter_map(|key| {
            let claim = Claim::of_source(&current.get(&key)?.source);
            Some((key, claim))
        })
        .collect()
}
