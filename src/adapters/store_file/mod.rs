//! Opening the redb files posbridge keeps (the embedded ledger, the spool).
//!
//! A missing file is new and is created. Anything else must already be a
//! valid database: redb alone would take a 0-byte file for a new one (and
//! say nothing of what was lost) and would open a file with damaged pages
//! and panic later, in the middle of a request. So an existing file is
//! checked page by page before use, and one that is empty, damaged or not a
//! database is refused with an error naming it; the ledger and the spool
//! then set it aside (`aside.rs`) and start on a new file, the spool with
//! what it salvages from the old one. A file another process holds is not
//! damaged, and the refusal says so and names the process (`holder.rs`).

mod aside;
mod disk;
mod holder;
mod reopen;

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

pub use aside::{count_set_aside, set_aside};
#[cfg(test)]
pub use disk::Create;
pub use disk::Disk;
pub use holder::Holder;
pub use reopen::{ReopenError, Reopenable, is_held};

use redb::Database;
use tracing::warn;

/// redb's read cache per file. Its default is 1 GiB, which a ledger holding
/// millions of ids would fill, growing posbridge's memory with the ledger;
/// lookups touch a small hot part (recent ids, active entities) and the
/// kernel's page cache keeps the rest of the file close, so a small cache
/// costs little (docs/BENCHMARKS.md has the figures).
const CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Why a store file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreFileError {
    /// Its directory could not be created.
    #[error("cannot create the directory for {path}: {source}")]
    Directory {
        /// The file.
        path: String,
        /// The filesystem's error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but holds nothing: a truncated or foreign file, not a new one.
    #[error("{path} exists but is empty (0 bytes); it is not a posbridge database")]
    Empty {
        /// The file.
        path: String,
    },
    /// Another process (or this one) has it open: redb admits one handle.
    /// The file is not damaged, and moving it aside under its holder would
    /// lose what that process keeps in it.
    #[error(
        "{path} is in use by {}; the file is not damaged: do not move it aside while that process runs (stop it first, or give this one a file of its own)",
        .holder.as_ref().map_or_else(|| "another process this one cannot see (one in another container, or of another user: look for a running posbridge with this file)".to_owned(), ToString::to_string)
    )]
    Held {
        /// The file.
        path: String,
        /// The process found holding it, if one is visible.
        holder: Option<Holder>,
        /// redb's refusal.
        #[source]
        source: redb::DatabaseError,
    },
    /// redb could not open it, or found it damaged beyond repair.
    #[error("{path} is not a usable database: {source}")]
    Database {
        /// The file.
        path: String,
        /// redb's error.
        #[source]
        source: redb::DatabaseError,
    },
    /// redb failed on damaged pages while opening or checking it.
    #[error("{path} is damaged (redb stopped on a damaged page: {detail})")]
    Damaged {
        /// The file.
        path: String,
        /// What redb stumbled on.
        detail: String,
    },
}

impl StoreFileError {
    /// Whether the file itself cannot be used (empty, damaged, not a redb
    /// database): what the ledger and the spool set aside to start on a new
    /// file. Not a file another process holds, a directory or file that
    /// cannot be read (permissions, an I/O error) or one of a redb format
    /// this build does not open: nothing is wrong with those files, and a
    /// new one beside them would only hide them.
    pub fn is_damage(&self) -> bool {
        use redb::{DatabaseError, StorageError};
        match self {
            StoreFileError::Empty { .. } | StoreFileError::Damaged { .. } => true,
            StoreFileError::Database { source, .. } => match source {
                DatabaseError::Storage(StorageError::Corrupted(_)) => true,
                // How redb says a file is not a database, or is cut short.
                DatabaseError::Storage(StorageError::Io(error)) => matches!(
                    error.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                ),
                _ => false,
            },
            StoreFileError::Directory { .. } | StoreFileError::Held { .. } => false,
        }
    }
}

/// Opens `path`, creating it (and its directory) when it does not exist,
/// and checking its integrity when it does: for tests that read a store
/// file as posbridge left it.
///
/// # Errors
/// [`StoreFileError`] naming the file and what is wrong with it.
#[cfg(test)]
pub fn open(path: &Path) -> Result<Database, StoreFileError> {
    open_with(path, Integrity::Check, &Disk::default())
}

/// Whether [`open_with`] reads every page of an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// At start-up: the file may have been damaged while posbridge was away.
    Check,
    /// Reopening a file this process opened and checked already (after an
    /// I/O error): a full check every retry would cost a scan per second.
    Trust,
}

/// [`open`] on `disk`, choosing whether to check an existing file's pages.
///
/// # Errors
/// [`StoreFileError`] naming the file and what is wrong with it.
pub fn open_with(
    path: &Path,
    integrity: Integrity,
    disk: &Disk,
) -> Result<Database, StoreFileError> {
    opened(path, integrity, disk).map(|opened| opened.db)
}

/// A store file opened and checked.
pub struct Opened {
    /// The database.
    pub db: Database,
    /// Whether its check found damaged pages and rolled the file back to
    /// an earlier commit: what the commits after it wrote is gone from its
    /// tables, though their pages may still hold it (the spool looks there
    /// for the deliveries it held).
    pub rolled_back: bool,
}

/// [`open`] on `disk`, saying whether the check rolled the file back.
///
/// # Errors
/// [`StoreFileError`] naming the file and what is wrong with it.
pub fn open_noting_rollback(path: &Path, disk: &Disk) -> Result<Opened, StoreFileError> {
    opened(path, Integrity::Check, disk)
}

fn opened(path: &Path, integrity: Integrity, disk: &Disk) -> Result<Opened, StoreFileError> {
    let name = || path.display().to_string();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreFileError::Directory {
            path: name(),
            source,
        })?;
    }
    let existed = match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => return Err(StoreFileError::Empty { path: name() }),
        Ok(_) => true,
        Err(_) => false,
    };
    let database = |source| match source {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreFileError::Held {
            path: name(),
            holder: holder::find(path),
            source,
        },
        source => StoreFileError::Database {
            path: name(),
            source,
        },
    };
    // The repair redb runs at open after an unclean stop reports its
    // progress: 0.3 only where the last commit's pages did not verify and
    // it falls back to the commit before (a repair whose last commit
    // verifies goes from 0.0 to 0.6).
    let fell_back = Arc::new(AtomicBool::new(false));
    let noted = fell_back.clone();
    // redb panics on some damaged pages instead of returning an error.
    let opened = quietly(|| {
        let mut builder = redb::Builder::new();
        builder
            .set_cache_size(CACHE_BYTES)
            .set_repair_callback(move |session| {
                if session.progress() > 0.0 && session.progress() < 0.5 {
                    noted.store(true, Ordering::Relaxed);
                }
            });
        let mut db = disk.create(&builder, path)?;
        let intact = !existed || integrity == Integrity::Trust || db.check_integrity()?;
        Ok((db, intact))
    });
    let (db, intact) = match opened {
        Ok(result) => result.map_err(database)?,
        Err(panic) => return Err(damaged(path, panic.as_ref())),
    };
    let rolled_back = !intact || fell_back.load(Ordering::Relaxed);
    if rolled_back {
        warn!(
            path = %path.display(),
            "Damaged pages were found and the file was rolled back to its last intact commit."
        );
    }
    Ok(Opened { db, rolled_back })
}

/// Runs `read`, a first read of the file at `path` just opened (counting
/// what it holds), turning a panic of redb's on a damaged page into
/// [`StoreFileError::Damaged`].
///
/// # Errors
/// [`StoreFileError::Damaged`] when redb panicked.
pub fn guarded<R>(path: &Path, read: impl FnOnce() -> R) -> Result<R, StoreFileError> {
    quietly(read).map_err(|panic| damaged(path, panic.as_ref()))
}

fn damaged(path: &Path, panic: &(dyn std::any::Any + Send)) -> StoreFileError {
    StoreFileError::Damaged {
        path: path.display().to_string(),
        detail: crate::observe::panics::message(panic).to_owned(),
    }
}

thread_local! {
    /// Set while this thread runs redb under [`quietly`].
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, catching a panic without the panic hook's report: a damaged
/// page makes redb panic, and that is reported as [`StoreFileError::Damaged`],
/// not as a crash on stderr. Panics elsewhere, and on other threads, are
/// reported as before.
fn quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.get() {
                report(info);
            }
        }));
    });
    QUIET.set(true);
    // Nothing of `f`'s outlives a panic: the half-opened database is dropped.
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.set(false);
    result
}

/// Writes a file of `bytes` beside `store`, durably, then removes it: whether
/// its disk has room again before a store that failed is reopened (a reopen
/// on a full disk can fail and leave no handle to read through).
///
/// # Errors
/// The write, the sync or the removal failed.
pub fn probe_disk(store: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut name = store.as_os_str().to_owned();
    name.push(".probe");
    let path = std::path::PathBuf::from(name);
    let written = std::fs::File::create(&path).and_then(|mut file| {
        file.write_all(&vec![0u8; usize::try_from(bytes).unwrap_or(usize::MAX)])?;
        file.sync_all()
    });
    let removed = std::fs::remove_file(&path);
    written.and(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<&str, u64> = TableDefinition::new("t");

    #[test]
    fn a_missing_file_is_created_and_reopened_with_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/db.redb");
        {
            let db = open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(T).unwrap().insert("k", 7).unwrap();
            txn.commit().unwrap();
        }
        let db = open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        assert_eq!(
            txn.open_table(T)
                .unwrap()
                .get("k")
                .unwrap()
                .unwrap()
                .value(),
            7
        );
    }

    #[test]
    fn an_empty_file_is_refused_not_taken_for_new() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        std::fs::write(&path, b"").unwrap();
        let error = open(&path).unwrap_err();
        assert!(matches!(error, StoreFileError::Empty { .. }), "{error}");
        assert!(error.is_damage(), "{error}");
    }

    #[test]
    fn a_foreign_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let error = open(&path).unwrap_err();
        assert!(matches!(error, StoreFileError::Database { .. }), "{error}");
        assert!(error.is_damage(), "{error}");
    }
}

#[cfg(test)]
mod damage {
    use super::*;
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};

    const T: TableDefinition<&str, u64> = TableDefinition::new("t");

    /// Flips `count` bytes of the file at positions from a fixed-seed generator.
    fn flip(path: &Path, count: usize, seed: u64) {
        let mut bytes = std::fs::read(path).unwrap();
        let mut state = seed;
        for _ in 0..count {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let at = usize::try_from(state >> 33).unwrap() % bytes.len();
            bytes[at] ^= 0xa5;
        }
        std::fs::write(path, bytes).unwrap();
    }

    /// Seeds 0..20 each take milliseconds. Some damage sends redb's repair
    /// into a long scan (seed 20: refused after about a minute), too slow for the suite.
    const SEEDS: u64 = 20;

    #[test]
    fn flipped_bytes_are_refused_or_every_read_still_works() {
        let mut refused = 0;
        for seed in 0..SEEDS {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("db.redb");
            {
                let db = open(&path).unwrap();
                for batch in 0..20 {
                    let txn = db.begin_write().unwrap();
                    {
                        let mut t = txn.open_table(T).unwrap();
                        for i in 0..100 {
                            t.insert(format!("key-{batch}-{i}").as_str(), i).unwrap();
                        }
                    }
                    txn.commit().unwrap();
                }
            }
            flip(&path, 1 + 5 * usize::try_from(seed).unwrap(), seed);
            let db = match open(&path) {
                Ok(db) => db,
                Err(error) if error.is_damage() => {
                    refused += 1;
                    continue;
                }
                Err(other) => panic!("{other}"),
            };
            let txn = db.begin_read().unwrap();
            if let Ok(t) = txn.open_table(T) {
                for entry in t.iter().unwrap() {
                    let _ = entry;
                }
            }
        }
        println!("refused {refused} of {SEEDS} damaged files; the others read without failing");
        assert!(
            refused > 0,
            "no damage was detected: the test damaged nothing"
        );
    }
}
