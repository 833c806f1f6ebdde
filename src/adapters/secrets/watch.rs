//! Reading the secret files again while serving: at once when the file
//! watcher (inotify, through `notify`) sees a change in a directory that
//! holds them, every `server.secrets_recheck_secs` whatever it saw, and
//! when asked ([`ReloadRequest`]: `main` asks on SIGHUP).
//!
//! The directories are watched, not the files, with the sources
//! directory's rules ([`crate::adapters::file_watch`]): a read waits until
//! the files stayed the same across its settle time.
//!
//! Each read puts the whole new set in use in one swap ([`Verifier::replace`]).
//! A read that fails keeps the set in use and is said once at WARN, and
//! again only when it fails differently; the first read that works again
//! says so. `posbridge_secret_files_readable` shows the same.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::adapters::file_watch::{SETTLE, Stamps, Wake, Wakes, Watched};

use crate::config::SourceEntry;
use crate::domain::verify::SchemeName;
use crate::domain::verify::{KeyChange, Verifier};
use crate::observe::telemetry;

/// Reads in a row that may find the secret files still changing (a
/// [`SETTLE`] each) before they are read as they are: a file rewritten
/// without pause must not keep every source's secrets unread.
const SETTLE_TRIES: u32 = 25;

/// Every source whose secrets come (partly) from files, with the verifier
/// its requests go through. Cheap to clone; `App::serve` runs [`SecretFiles::watch`].
#[derive(Clone)]
pub struct SecretFiles {
    /// The sources, in configuration order.
    sources: Arc<Vec<FileSource>>,
    /// How often every source is read whatever the watcher saw.
    recheck: Duration,
    /// Set by [`ReloadRequest::request`].
    requested: Arc<Notify>,
}

/// One source's secret settings and its verifier.
#[derive(Clone)]
struct FileSource {
    /// Its key path in the configuration, for logs: `mekari.sources.main`.
    key: String,
    /// Metric label values.
    provider: &'static str,
    /// Metric label values.
    name: String,
    /// Its settings, for [`super::read`].
    config: crate::config::SourceConfig,
    /// Its signature scheme, each secret read is checked against.
    scheme: SchemeName,
    /// A clone of the verifier the handler uses: replacing its secrets
    /// replaces them for the handler.
    verifier: Verifier,
}

/// Asks the running [`SecretFiles::watch`] to read every source's files now.
#[derive(Clone)]
pub struct ReloadRequest(Arc<Notify>);

impl ReloadRequest {
    /// A request that wakes whoever waits on `notify`.
    pub fn of(notify: Arc<Notify>) -> ReloadRequest {
        ReloadRequest(notify)
    }

    /// Asks for a read; requests made before it starts make one read.
    pub fn request(&self) {
        self.0.notify_one();
    }
}

/// What one read of a source's files came to; what is said follows from it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reloaded {
    /// The same secrets as before.
    Unchanged,
    /// Secrets came or went.
    Changed(KeyChange),
    /// The read failed, newly or differently: the secrets in use stay.
    Failed(String),
    /// The read failed as the one before did: said already.
    StillFailing,
}

impl SecretFiles {
    /// No sources yet; files are read again every `recheck`.
    pub fn new(recheck: Duration) -> SecretFiles {
        SecretFiles {
            sources: Arc::new(Vec::new()),
            recheck,
            requested: Arc::new(Notify::new()),
        }
    }

    /// Adds `entry`, whose requests `verifier` checks, when it reads secret
    /// files (else nothing changes). Its gauges start at what start-up read.
    pub fn add(&mut self, entry: SourceEntry<'_>, scheme: SchemeName, verifier: &Verifier) {
        if !entry.config.reads_secret_files() {
            return;
        }
        let source = FileSource {
            key: entry.key(),
            provider: entry.provider.as_str(),
            name: entry.name.to_owned(),
            config: entry.config.clone(),
            scheme,
            verifier: verifier.clone(),
        };
        source.gauges(true);
        Arc::make_mut(&mut self.sources).push(source);
    }

    /// A handle that asks the running watch for a read (SIGHUP).
    pub fn reload_request(&self) -> ReloadRequest {
        ReloadRequest(self.requested.clone())
    }

    /// Whether any source reads secret files.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Reads every source's files again on each change seen, every
    /// `recheck` and on each request, until `shutdown`, once the files of
    /// their directories stayed the same across [`SETTLE`] (a secret read
    /// while it is being written in place would be cut short). Returns at
    /// once when no source reads secret files.
    pub async fn watch(self, shutdown: CancellationToken) {
        if self.sources.is_empty() {
            return;
        }
        let changed = Arc::new(Notify::new());
        let mut watched = Watched::new(&changed, "the secret files", self.recheck);
        for dir in self.directories() {
            if let Err(error) = watched.watch(&dir) {
                warn!(%error, dir = %dir.display(), recheck_secs = self.recheck.as_secs(), "Cannot watch a directory of secret files; it is read again every recheck_secs and on SIGHUP.");
            }
        }
        let mut wakes = Wakes::new(changed, self.requested.clone(), self.recheck);
        let mut state = vec![None; self.sources.len()];
        // Reads in a row the files were found still changing.
        let mut unsettled = 0;
        loop {
            let wake = tokio::select! {
                () = shutdown.cancelled() => return,
                wake = wakes.next() => wake,
            };
            if wake == Wake::Recheck {
                watched.watch_again(self.directories());
            }
            if wake == Wake::Changed {
                wakes.settle().await;
            }
            if self.settled().await {
                unsettled = 0;
            } else if unsettled < SETTLE_TRIES {
                unsettled += 1;
                debug!("Secret files still changing; read once they settle.");
                wakes.again();
                continue;
            } else {
                if unsettled == SETTLE_TRIES {
                    warn!(
                        tries = SETTLE_TRIES,
                        "The secret files keep changing; they are read as they are, and again at each change."
                    );
                }
                unsettled = SETTLE_TRIES + 1;
            }
            debug!(cause = ?wake, "Reading the secret files.");
            let files = self.clone();
            // File reads block; a slow file system must not hold a runtime thread.
            state = match tokio::task::spawn_blocking(move || {
                files.reload(&mut state);
                state
            })
            .await
            {
                Ok(state) => state,
                // Only a panic in the read ends it: start again from "all read".
                Err(error) => {
                    warn!(%error, "Reading the secret files failed.");
                    vec![None; self.sources.len()]
                }
            };
        }
    }

    /// Whether the secret files stayed the same across [`SETTLE`]: each of
    /// the `secrets_files` and the entries of each `secrets_dir` (not the
    /// rest of a file's directory, a log beside it, say). File reads block:
    /// on the blocking pool.
    async fn settled(&self) -> bool {
        let stamps = || {
            let files = self.clone();
            tokio::task::spawn_blocking(move || files.stamps())
        };
        let Ok(before) = stamps().await else {
            return true;
        };
        tokio::time::sleep(SETTLE).await;
        stamps()
            .await
            .is_ok_and(|after| before.unsettled(&after).is_empty())
    }

    /// The stamps of the files [`SecretFiles::settled`] watches.
    fn stamps(&self) -> Stamps {
        self.sources
            .iter()
            .fold(Stamps::default(), |stamps, source| {
                let files = Stamps::of_files(source.config.secrets_files.iter().cloned());
                let dir = source
                    .config
                    .secrets_dir
                    .as_deref()
                    .map(Stamps::of)
                    .unwrap_or_default();
                stamps.and(files).and(dir)
            })
    }

    /// Reads every source once. `state[i]` is what source `i`'s last failed
    /// read said, `None` after a read that worked.
    pub(super) fn reload(&self, state: &mut [Option<String>]) -> Vec<Reloaded> {
        self.sources
            .iter()
            .zip(state.iter_mut())
            .map(|(source, failing)| {
                let reloaded = source.reload(failing);
                source.say(&reloaded);
                reloaded
            })
            .collect()
    }

    /// The directories that hold the secret files: each `secrets_dir`, and
    /// the directory of each of the `secrets_files`.
    fn directories(&self) -> BTreeSet<PathBuf> {
        let mut dirs = BTreeSet::new();
        for source in self.sources.iter() {
            dirs.extend(source.config.secrets_dir.clone());
            for file in &source.config.secrets_files {
                let parent = file.parent().filter(|p| !p.as_os_str().is_empty());
                dirs.insert(parent.unwrap_or(Path::new(".")).to_owned());
            }
        }
        dirs
    }
}

impl FileSource {
    /// Reads the source's secrets and puts them in use, or keeps those in
    /// use when the read fails; `failing` as in [`SecretFiles::reload`].
    fn reload(&self, failing: &mut Option<String>) -> Reloaded {
        let loaded = super::load(&self.config, self.scheme).and_then(|found| {
            self.verifier
                .replace(&super::secrets_of(&found))
                .map_err(|refused| super::unfit(&found, refused))
        });
        match loaded {
            Ok(change) => {
                if failing.take().is_some() {
                    info!(source = %self.key, secrets = change.in_use, "Secret files readable again.");
                }
                self.gauges(true);
                if change.changed() {
                    Reloaded::Changed(change)
                } else {
                    Reloaded::Unchanged
                }
            }
            Err(error) => {
                self.gauges(false);
                let message = error.to_string();
                if failing.as_deref() == Some(message.as_str()) {
                    Reloaded::StillFailing
                } else {
                    *failing = Some(message.clone());
                    Reloaded::Failed(message)
                }
            }
        }
    }

    /// Says what a read came to, once: nothing for a read like the last.
    fn say(&self, reloaded: &Reloaded) {
        match reloaded {
            Reloaded::Unchanged | Reloaded::StillFailing => {}
            Reloaded::Changed(change) => info!(
                source = %self.key,
                added = change.added,
                removed = change.removed,
                in_use = change.in_use,
                "Secrets reloaded from files."
            ),
            Reloaded::Failed(error) => warn!(
                source = %self.key,
                %error,
                in_use = self.verifier.secrets_in_use(),
                "Cannot read the secret files; the secrets in use stay until they read again."
            ),
        }
    }

    /// `posbridge_secrets` and `posbridge_secret_files_readable` for this source.
    fn gauges(&self, readable: bool) {
        let labels = [
            (telemetry::PROVIDER, self.provider.to_owned()),
            (telemetry::SOURCE, self.name.clone()),
        ];
        metrics::gauge!(telemetry::SECRETS, &labels).set(self.verifier.secrets_in_use() as f64);
        metrics::gauge!(telemetry::SECRET_FILES_READABLE, &labels)
            .set(f64::from(u8::from(readable)));
    }
}
