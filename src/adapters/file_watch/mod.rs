//! Watching the files posbridge reads again while serving (the secret
//! files, the sources directory), with one rule for both: which events may
//! change what a read finds, when a read is woken (a change seen, a
//! request, the recheck), and when a file is settled enough to be read
//! ([`settle`]).
//!
//! Directories are watched, not files: a Kubernetes update swaps the
//! `..data` link and deletes the old files, which would end a watch on a
//! file, and an editor or `mv` replaces a file by another. The recheck is
//! the safety net for what a watch cannot see (a watched directory itself
//! replaced, a file system without inotify, the inotify limits reached).

pub mod settle;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tokio::time::{Interval, MissedTickBehavior};
use tracing::{debug, warn};

pub use settle::{SETTLE, Stamps};

/// Whether an event may change what a read finds: our own reads open the
/// files and touch their access times, which does not; a file closed after
/// a write does.
pub fn may_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(access) => *access == AccessKind::Close(AccessMode::Write),
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        _ => true,
    }
}

/// One watcher over a set of directories, waking a [`Notify`] on each event
/// that [`may_change`] a read. Without one (the system gives none: said
/// once) the files are read at the recheck and on request alone.
pub struct Watched {
    watcher: Option<RecommendedWatcher>,
    /// The directories watched so far.
    dirs: BTreeSet<PathBuf>,
}

impl Watched {
    /// A watcher waking `changed`, of nothing yet; `what` names the files
    /// in the warning said when the system gives no watcher.
    pub fn new(changed: &Arc<Notify>, what: &str, recheck: Duration) -> Watched {
        let changed = changed.clone();
        let made = notify::recommended_watcher(move |event: notify::Result<Event>| {
            if event.is_ok_and(|e| may_change(&e.kind)) {
                changed.notify_one();
            }
        });
        let watcher = match made {
            Ok(watcher) => Some(watcher),
            Err(error) => {
                warn!(%error, recheck_secs = recheck.as_secs(), "Cannot watch {what}; they are read again every secrets_recheck_secs and on SIGHUP.");
                None
            }
        };
        Watched {
            watcher,
            dirs: BTreeSet::new(),
        }
    }

    /// Whether the system gave a watcher.
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some()
    }

    /// Watches `dir`.
    ///
    /// # Errors
    /// [`notify::Error`] when it cannot be watched (gone, not a directory,
    /// the inotify limits reached); it is read at the recheck meanwhile.
    pub fn watch(&mut self, dir: &Path) -> notify::Result<()> {
        let Some(watcher) = &mut self.watcher else {
            return Ok(());
        };
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
        self.dirs.insert(dir.to_owned());
        Ok(())
    }

    /// Watches those of `dirs` not watched yet (said at DEBUG when one
    /// cannot be: it is read at the recheck).
    pub fn watch_new(&mut self, dirs: BTreeSet<PathBuf>) {
        for dir in dirs.difference(&self.dirs).cloned().collect::<Vec<_>>() {
            if let Err(error) = self.watch(&dir) {
                debug!(%error, dir = %dir.display(), "Cannot watch a directory of files read while serving; it is read at each recheck.");
            }
        }
    }

    /// Watches `dir` anew: a directory replaced since it was first watched
    /// (a new inode behind its path) is watched from now on.
    ///
    /// # Errors
    /// As [`Watched::watch`].
    pub fn rewatch(&mut self, dir: &Path) -> notify::Result<()> {
        if let Some(watcher) = &mut self.watcher {
            // A watch stays on the directory it was made on, renamed or
            // not: let go of it (gone already when it was deleted).
            let _ = watcher.unwatch(dir);
        }
        self.watch(dir)
    }

    /// [`Watched::rewatch`] for every one of `dirs`.
    pub fn watch_again(&mut self, dirs: BTreeSet<PathBuf>) {
        for dir in dirs {
            if let Err(error) = self.rewatch(&dir) {
                debug!(%error, dir = %dir.display(), "Cannot watch a directory of files read while serving; it is read at each recheck.");
            }
        }
    }
}

/// Why a read is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A watcher saw a change.
    Changed,
    /// Asked for (SIGHUP, or a read that found files still changing).
    Requested,
    /// The recheck's period came round.
    Recheck,
}

/// What wakes a read: a change seen, a request, the recheck.
pub struct Wakes {
    changed: Arc<Notify>,
    requested: Arc<Notify>,
    recheck: Interval,
}

impl Wakes {
    /// Wakes from `changed` (what [`Watched`] wakes), `requested` and a
    /// recheck every `recheck`, whose first tick is at once: a change
    /// between start-up's read and the watch's start is read then.
    pub fn new(changed: Arc<Notify>, requested: Arc<Notify>, recheck: Duration) -> Wakes {
        let mut recheck = tokio::time::interval(recheck);
        recheck.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Wakes {
            changed,
            requested,
            recheck,
        }
    }

    /// The next wake. Cancel-safe: a wake that came while the caller
    /// waited on something else is kept for the next call.
    pub async fn next(&mut self) -> Wake {
        tokio::select! {
            () = self.changed.notified() => Wake::Changed,
            () = self.requested.notified() => Wake::Requested,
            _ = self.recheck.tick() => Wake::Recheck,
        }
    }

    /// Waits [`SETTLE`] after a change was seen: the few events of one
    /// update (Kubernetes swaps a link and deletes the old files) make one
    /// read, which also reads what came meanwhile.
    pub async fn settle(&self) {
        tokio::time::sleep(SETTLE).await;
        let _ = futures::FutureExt::now_or_never(self.changed.notified());
    }

    /// Asks for another read: files a read found still changing are read
    /// again once they settle.
    pub fn again(&self) {
        self.requested.notify_one();
    }
}
