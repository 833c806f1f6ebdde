//! The sources in use: the main file's, fixed for the run, and those of a
//! sources directory ([`crate::config::source_files`]), read at start and
//! again while serving: on every change the directory watch sees, every
//! `server.secrets_recheck_secs`, and on SIGHUP.
//!
//! Each read builds the whole new set aside and puts it in use in one swap,
//! so a request sees one set or the other, and a delivery in flight keeps
//! the source (its identity, verifier, meters) it started with.
//!
//! - A new file that checks is a new source: its URL answers from the swap.
//! - A changed file that checks replaces its source; an unchanged one
//!   keeps it (its secret files read again).
//! - A removed file ends its source: its URL answers 404; what it spooled
//!   still drains (a spooled delivery carries its source).
//! - A file that does not check (the checks `check-config` makes) is
//!   refused with its path and reason: the source keeps its last good
//!   settings, or stays absent if it never had any. A file never takes
//!   another source down.
//! - A file whose source name is the main file's, or whose provider and
//!   account are another source's (the same record keys), is refused; the
//!   source already in use keeps them. Which source owns an account is
//!   recorded in the ledger (`owners.rs`), so that every replica and every
//!   restart give it to the same one.
//! - A file with its own topics (`topic_prefix`) not in use yet waits for
//!   them, opened in the background (`opening.rs`): the other files of the
//!   read are taken at once.
//!
//! The watch (`watch.rs`) follows the directory when it is replaced whole
//! (renamed and made again, a link switched).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use time::OffsetDateTime;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::BuildError;
use super::topics::OwnTopics;
use crate::adapters::ledger::LedgerError;
use crate::adapters::providers;
use crate::adapters::secrets::ReloadRequest;
use crate::background;
use crate::config::source_files::{self, Listing, Refusal, SourceFile};
use crate::config::{Config, KafkaConfig};
use crate::domain::event::ProviderKind;
use crate::http::ingress::SourceMap;
use crate::observe::Board;

/// A source's provider and name: its URL.
type Key = (ProviderKind, String);

/// A directory file's source as it runs: its file as last read well.
#[derive(Debug, Clone)]
struct Loaded {
    file: SourceFile,
    at: OffsetDateTime,
}

/// Told the directory's sources in use after each read that changed them
/// (the reconciler takes their `api` tables).
type Listener = Box<dyn Fn(&[&SourceFile]) + Send + Sync>;

/// What the reads of the directory keep between them.
#[derive(Debug, Default)]
struct DirState {
    /// The directory's sources in use.
    loaded: BTreeMap<Key, Loaded>,
    /// Refused files by path, with their source when their name says it.
    refused: BTreeMap<PathBuf, Refusal>,
    /// Why the directory itself could not be read last time.
    unreadable: Option<String>,
    /// Why the ledger could not say who owns each account last time.
    owners_unreadable: Option<String>,
    /// Which blocking step of a read had no answer last time, and why.
    apart_failing: Option<String>,
}

/// The sources in use, shared with the webhook handler. Cheap to clone.
#[derive(Clone)]
pub struct Sources {
    /// What the handler reads: swapped whole.
    live: Arc<ArcSwap<SourceMap>>,
    /// The main file's sources and what they claim.
    main: Arc<BTreeMap<Key, Claim>>,
    /// The directory, when one is configured.
    dir: Option<PathBuf>,
    state: Arc<Mutex<DirState>>,
    /// The status page's rows, added and taken away with the sources.
    board: Board,
    recheck: Duration,
    requested: Arc<Notify>,
    /// When the main file's sources were read.
    started: OffsetDateTime,
    listeners: Arc<Mutex<Vec<Listener>>>,
    /// Opens a file's own topics before its source takes a delivery.
    own_topics: OwnTopics,
    /// The shared topics a file's own must not name.
    kafka: Arc<KafkaConfig>,
    /// Which source owns each account, as the ledger records it.
    owners: Owners,
}

/// The name of the threads that read the directory and put it in use.
const READER: &str = "sources-read";

/// Why the directory's first read stopped start-up.
pub use source_files::DirError;

impl Sources {
    /// The main file's `sources` (built), and the directory's, read now
    /// (their own topics opened, or their files refused: the ledger's fill
    /// that follows start-up reads the topics in use), each account given
    /// to the source `owners` records. Blocks on the file system.
    ///
    /// # Errors
    /// [`BuildError::SourcesDir`] when the directory cannot be listed at
    /// start: a wrong path is a mistake to say at once, not a source set to
    /// serve without. [`BuildError::Ledger`] when the ledger cannot say who
    /// owns the accounts: a start without it could hand a live merchant's
    /// account to another file.
    pub async fn start(
        config: &Config,
        main: SourceMap,
        board: Board,
        own_topics: OwnTopics,
        owners: Owners,
    ) -> Result<Sources, BuildError> {
        let claims = main
            .iter()
            .map(|(key, webhook)| (key.clone(), Claim::of_source(&webhook.source)))
            .collect();
        let sources = Sources {
            live: Arc::new(ArcSwap::from_pointee(main)),
            main: Arc::new(claims),
            dir: config.sources_dir.clone(),
            state: Arc::default(),
            board,
            recheck: config.server.secrets_recheck(),
            requested: Arc::new(Notify::new()),
            started: OffsetDateTime::now_utc(),
            listeners: Arc::default(),
            own_topics,
            kafka: Arc::new(config.kafka.clone()),
            owners,
        };
        // From start-up, directory or not: the alert reads it.
        gauges(&DirState::default());
        if let Some(dir) = &sources.dir {
            let listing = source_files::read_dir(dir, providers::api_keys)?;
            let mut openings = Openings::new(sources.own_topics.clone(), sources.kafka.clone());
            let (mut ready, mut waiting) = openings.sort(listing.clone(), true);
            while !waiting.is_empty() {
                openings.next().await;
                (ready, waiting) = openings.sort(listing.clone(), false);
            }
            sources.take(ready, Vec::new()).await?;
        }
        Ok(sources)
    }

    /// Calls `listener` with the directory's sources in use now, and again
    /// after every read that changes them.
    pub fn on_change(&self, listener: impl Fn(&[&SourceFile]) + Send + Sync + 'static) {
        // Under the state's lock, which a read holds while it tells the
        // listeners: no read falls between the first call and the others.
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        listener(&state.loaded.values().map(|l| &l.file).collect::<Vec<_>>());
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(listener));
    }

    /// What the handler reads.
    pub fn live(&self) -> Arc<ArcSwap<SourceMap>> {
        self.live.clone()
    }

    /// A handle that asks the running watch for a read (SIGHUP); none
    /// without a directory.
    pub fn reload_request(&self) -> Option<ReloadRequest> {
        self.dir
            .as_ref()
            .map(|_| ReloadRequest::of(self.requested.clone()))
    }

    /// Reads the directory on each change seen, every recheck, each
    /// request and each end of an opening of a file's own topics, until
    /// `shutdown`. Returns at once without a directory.
    pub async fn watch(self, shutdown: CancellationToken) {
        let Some(dir) = self.dir.clone() else { return };
        let changed = Arc::new(Notify::new());
        let mut watch = DirWatch::new(&dir, &changed, self.recheck);
        let mut wakes = Wakes::new(changed, self.requested.clone(), self.recheck);
        let mut openings = Openings::new(self.own_topics.clone(), self.kafka.clone());
        loop {
            if let Some(dirs) = self.apart("the look for links", Sources::secret_dirs).await {
                watch.secret_dirs(dirs);
            }
            // Whether the topics that could not be opened are tried again:
            // not on an opening's end, or a broker that refuses at once
            // would be asked in a loop.
            let retry = tokio::select! {
                () = shutdown.cancelled() => return,
                wake = wakes.next() => {
                    if wake == Wake::Changed {
                        wakes.settle().await;
                    }
                    true
                }
                () = openings.next() => false,
            };
            watch.follow();
            self.read(&dir, &mut openings, retry).await;
        }
    }

    /// Reads the directory and puts the files that are ready in use: the
    /// files that stayed the same across [`SETTLE`] ([`settle`]); one still
    /// changing keeps what it had, and is read again.
    async fn read(&self, dir: &Path, openings: &mut Openings, retry: bool) {
        let before = {
            let dir = dir.to_owned();
            self.apart("the files' stamps", move |_| Stamps::of(&dir))
                .await
        };
        tokio::time::sleep(SETTLE).await;
        let listed = {
            let dir = dir.to_owned();
            self.apart("the read", move |_| {
                let listing = source_files::read_dir(&dir, providers::api_keys);
                (listing, Stamps::of(&dir))
            })
            .await
        };
        let Some((listed, after)) = listed else {
            return;
        };
        let listing = match listed {
            Ok(listing) => listing,
            Err(error) => {
                self.unreadable(&error);
                return;
            }
        };
        let unsettled = before.map(|b| b.unsettled(&after)).unwrap_or_default();
        let (listing, held) = self.hold(listing, &unsettled);
        if !unsettled.is_empty() {
            debug!(files = ?unsettled, "Source files still changing; read again once they settle.");
            self.requested.notify_one();
        }
        let (ready, mut waiting) = openings.sort(listing, retry);
        waiting.extend(held);
        if let Err(error) = self.take(ready, waiting).await {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let why = error.to_string();
            if state.owners_unreadable.as_ref() != Some(&why) {
                warn!(%error, "The ledger cannot say which source owns each account; every source keeps its settings until it can.");
                state.owners_unreadable = Some(why);
            }
        }
    }

    /// Puts a read's files in use ([`Sources::apply`]), each account given
    /// to the owner the ledger records, and records the owners it gave
    /// accounts to anew. Nothing changes when the ledger cannot be read.
    ///
    /// # Errors
    /// [`LedgerError`] when the owners cannot be read.
    async fn take(&self, ready: Listing, waiting: Vec<SourceFile>) -> Result<(), LedgerError> {
        let asks = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let running = running(&ready, &waiting, &state.loaded, &self.live.load());
            let claimants = ready
                .files
                .iter()
                .chain(&waiting)
                .map(|f| ((f.provider, f.config.account.clone()), f.name.clone()))
                .chain(running.iter().map(|(k, c)| (c.account(k.0), k.1.clone())));
            // Whose account is known: a file's that parsed, a running
            // source's as it runs.
            let known: BTreeSet<Key> = ready
                .files
                .iter()
                .chain(&waiting)
                .map(|f| (f.provider, f.name.clone()))
                .chain(running.keys().cloned())
                .collect();
            let unknown = ready
                .refused
                .iter()
                .filter_map(|r| r.source.clone())
                .filter(|key| !known.contains(key));
            owners::asks(claimants, unknown)
        };
        let recorded = self.owners.read(asks).await?;
        if self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .owners_unreadable
            .take()
            .is_some()
        {
            info!("The ledger says which source owns each account again.");
        }
        let taken = self
            .apart("putting the read in use", move |sources| {
                sources.apply(ready, &waiting, &recorded)
            })
            .await;
        if let Some(taken) = taken
            && let Err(error) = self.owners.record(taken).await
        {
            warn!(%error, "Which source owns an account could not be recorded in the ledger; it is recorded again at the next read of the sources directory.");
        }
        Ok(())
    }

    /// `work`, a read's blocking step, on a background thread
    /// ([`background::run`]): reading and parsing a thousand files is ~35 ms
    /// of CPU every recheck, and on a core the runtime serves on a thread
    /// as eager as the runtime's (`spawn_blocking`'s) took half of it while
    /// every delivery waited. None when the step has no answer (the thread
    /// could not be made, or `work` panicked): said once with `step`, and
    /// the sources stay as they are until a later read.
    async fn apart<T, F>(&self, step: &'static str, work: F) -> Option<T>
    where
        F: FnOnce(&Sources) -> T + Send + 'static,
        T: Send + 'static,
    {
        let sources = self.clone();
        let answer = background::run(READER, move || work(&sources)).await;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match answer {
            Ok(answer) => {
                if state.apart_failing.take().is_some() {
                    info!("The sources directory's reads have their background threads again.");
                }
                Some(answer)
            }
            Err(error) => {
                let why = format!("{step}: {error}");
                if state.apart_failing.as_ref() != Some(&why) {
                    warn!(%error, step, "A read of the sources directory stopped; every source keeps its settings until a later read.");
                    state.apart_failing = Some(why);
                }
                None
            }
        }
    }

    /// `listing` without the `unsettled` files, and the files of those
    /// that run now, to keep as they are (as a file waiting for its topics
    /// is kept): a refused one keeps its refusal, a new one is not seen yet.
    fn hold(&self, mut listing: Listing, unsettled: &[PathBuf]) -> (Listing, Vec<SourceFile>) {
        if unsettled.is_empty() {
            return (listing, Vec::new());
        }
        listing.files.retain(|f| !unsettled.contains(&f.path));
        listing.refused.retain(|r| !unsettled.contains(&r.path));
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let held = state
            .loaded
            .values()
            .filter(|l| unsettled.contains(&l.file.path))
            .map(|l| l.file.clone())
            .collect();
        listing.refused.extend(
            unsettled
                .iter()
                .filter_map(|path| state.refused.get(path).cloned()),
        );
        (listing, held)
    }

    /// The directories outside the sources directory whose changes change
    /// what a read finds: of the sources' own secret files, and of the
    /// targets of the files that are links (a link's target changed
    /// elsewhere tells the sources directory nothing).
    fn secret_dirs(&self) -> BTreeSet<PathBuf> {
        // The paths copied out: the look at each file is made without the
        // lock that `/admin/sources` takes on a thread that serves.
        let (files, secrets): (Vec<PathBuf>, Vec<PathBuf>) = {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let files = state
                .loaded
                .values()
                .map(|l| l.file.path.clone())
                .chain(state.refused.keys().cloned())
                .collect();
            let secrets = state
                .loaded
                .values()
                .flat_map(|l| {
                    let config = &l.file.config;
                    config.secrets_dir.iter().cloned().chain(
                        config
                            .secrets_files
                            .iter()
                            .filter_map(|f| f.parent().map(Path::to_owned)),
                    )
                })
                .collect();
            (files, secrets)
        };
        let targets = files
            .iter()
            .filter(|path| path.is_symlink())
            .filter_map(|path| std::fs::canonicalize(path).ok())
            .filter_map(|target| target.parent().map(Path::to_owned));
        secrets
            .into_iter()
            .chain(targets)
            .filter(|d| !d.as_os_str().is_empty())
            .collect()
    }

    /// The directory could not be listed: every source stays as it is.
    fn unreadable(&self, error: &DirError) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let why = error.to_string();
        if state.unreadable.as_ref() != Some(&why) {
            warn!(%error, "The sources directory cannot be read; every source keeps its settings.");
            state.unreadable = Some(why);
        }
        gauges(&state);
    }
}

mod apply;
mod claims;
mod opening;
mod owners;
mod report;
mod series;
#[cfg(test)]
mod tests;
mod watch;

use crate::adapters::file_watch::{SETTLE, Stamps, Wake, Wakes};
use apply::running;
use claims::Claim;
pub use claims::dir_problems;
use opening::Openings;
pub use owners::Owners;
pub(super) use series::announce;
use series::gauges;
use watch::DirWatch;
