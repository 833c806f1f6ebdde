//! The settle rule of the files read while serving: a file is taken only
//! once it has stayed the same across [`SETTLE`]. A file written in place
//! is read while it is still being written (an editor's or a `cat >` slow
//! write whose first part parses alone): taken then, a source would serve
//! with settings its finished file does not give, and a secret cut short
//! would refuse every delivery signed with the whole one.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a file stays the same before it is taken; also how long after
/// a change is seen the directory is read, so that the few events of one
/// update (Kubernetes swaps a link and deletes the old files) make one
/// read.
pub const SETTLE: Duration = Duration::from_millis(200);

/// What tells one state of a file from another without reading it: what
/// its name resolves to (a link followed: device and inode), its size and
/// its last change (content and metadata, to the nanosecond).
type Stamp = (u64, u64, u64, i64, i64, i64, i64);

/// The stamps of the entries of a directory, by path.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Stamps(BTreeMap<PathBuf, Stamp>);

impl Stamps {
    /// The stamps of `dir`'s entries now (none when it cannot be listed:
    /// the read that follows says why). Blocks on the file system.
    pub fn of(dir: &Path) -> Stamps {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Stamps::default();
        };
        Stamps::of_files(entries.filter_map(|entry| Some(entry.ok()?.path())))
    }

    /// The stamps of `files` now (a link followed; one that cannot be read
    /// has none). Blocks on the file system.
    pub fn of_files(files: impl IntoIterator<Item = PathBuf>) -> Stamps {
        Stamps(
            files
                .into_iter()
                .filter_map(|path| {
                    let m = std::fs::metadata(&path).ok()?;
                    let stamp = (
                        m.dev(),
                        m.ino(),
                        m.len(),
                        m.mtime(),
                        m.mtime_nsec(),
                        m.ctime(),
                        m.ctime_nsec(),
                    );
                    Some((path, stamp))
                })
                .collect(),
        )
    }

    /// The stamps of `self` and `other` together.
    #[must_use]
    pub fn and(mut self, other: Stamps) -> Stamps {
        self.0.extend(other.0);
        self
    }

    /// The paths whose stamp differs between `self` and `later` (made,
    /// changed or removed in between): not settled.
    pub fn unsettled(&self, later: &Stamps) -> Vec<PathBuf> {
        let changed = self
            .0
            .iter()
            .filter(|(path, stamp)| later.0.get(*path) != Some(*stamp))
            .map(|(path, _)| path.clone());
        let made = later
            .0
            .keys()
            .filter(|path| !self.0.contains_key(*path))
            .cloned();
        changed.chain(made).collect()
    }
}
