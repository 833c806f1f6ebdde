//! The watch on the sources directory: its files, the directories of its
//! sources' own secret files, and the directory's entry in its parent, so
//! that a directory replaced whole (renamed away and made again, or a link
//! switched to another target, as some deployment tools do) is noticed and
//! watched anew instead of leaving every change to the recheck.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;
use tracing::{debug, info, warn};

use crate::adapters::file_watch::{Watched, may_change};

/// A directory as the file system knows it: device and inode of what its
/// path resolves to (a link followed). Another one behind the same path is
/// another directory, with a watch of its own to make.
type Identity = (u64, u64);

/// The watches that wake a read of the sources directory.
pub(super) struct DirWatch {
    dir: PathBuf,
    /// The directory the watch is on, when it could be told.
    watched: Option<Identity>,
    /// On the directory's files and the secret directories.
    files: Watched,
    /// On the directory's parent, waking only for the directory's own
    /// entry: a watch on a directory follows it when it is renamed away,
    /// and a link's target does not change when the link is switched.
    entry: Option<RecommendedWatcher>,
}

impl DirWatch {
    /// Watches `dir`, waking `changed`. Without watches (the system gives
    /// none: said once) the directory is read every `recheck` alone.
    pub(super) fn new(dir: &Path, changed: &Arc<Notify>, recheck: Duration) -> DirWatch {
        let mut files = Watched::new(changed, "the sources directory", recheck);
        if let Err(error) = files.watch(dir) {
            warn!(%error, dir = %dir.display(), recheck_secs = recheck.as_secs(), "Cannot watch the sources directory; it is read again every secrets_recheck_secs and on SIGHUP.");
        }
        let entry = files
            .is_watching()
            .then(|| entry_watcher(dir, changed))
            .flatten();
        DirWatch {
            dir: dir.to_owned(),
            watched: identity(dir),
            files,
            entry,
        }
    }

    /// Moves the watches to the directory `dir` names now when it is
    /// another than the one watched (said once at INFO).
    pub(super) fn follow(&mut self) {
        let now = identity(&self.dir);
        if now.is_none() || now == self.watched || !self.files.is_watching() {
            return;
        }
        self.watched = now;
        if let Err(error) = self.files.rewatch(&self.dir) {
            warn!(%error, dir = %self.dir.display(), "The sources directory was replaced and cannot be watched; it is read again every secrets_recheck_secs and on SIGHUP.");
            return;
        }
        if let (Some(entry), Some(parent)) = (&mut self.entry, parent(&self.dir)) {
            // Its parent may have been replaced too (a link higher up).
            let _ = entry.unwatch(&parent);
            let _ = entry.watch(&parent, RecursiveMode::NonRecursive);
        }
        info!(dir = %self.dir.display(), "The sources directory was replaced (renamed and made again, or its link switched); the new one is watched and read.");
    }

    /// Watches the directories of the sources' own secret files too (a
    /// Kubernetes Secret mounted beside the sources directory), so that a
    /// rotated secret there is read as soon as one of the main file's
    /// sources is, and those of the targets of source files that are links.
    pub(super) fn secret_dirs(&mut self, dirs: BTreeSet<PathBuf>) {
        self.files.watch_new(dirs);
    }
}

/// A watcher of `dir`'s parent that wakes `changed` when `dir`'s own entry
/// there changes (made, removed, renamed, a link put over it); none when
/// it cannot be watched (the recheck then notices a replacement).
fn entry_watcher(dir: &Path, changed: &Arc<Notify>) -> Option<RecommendedWatcher> {
    let parent = parent(dir)?;
    let name = dir.file_name()?.to_owned();
    let changed = changed.clone();
    let made = notify::recommended_watcher(move |event: notify::Result<Event>| {
        let ours = event.is_ok_and(|e| {
            may_change(&e.kind) && e.paths.iter().any(|p| p.file_name() == Some(&name))
        });
        if ours {
            changed.notify_one();
        }
    })
    .and_then(|mut watcher| {
        watcher.watch(&parent, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    });
    match made {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            debug!(%error, dir = %parent.display(), "Cannot watch the sources directory's parent; a replaced directory is noticed at the recheck.");
            None
        }
    }
}

/// The directory holding `dir`'s entry (`.` for a bare name).
fn parent(dir: &Path) -> Option<PathBuf> {
    let parent = dir.parent()?;
    Some(if parent.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        parent.to_owned()
    })
}

fn identity(dir: &Path) -> Option<Identity> {
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}
