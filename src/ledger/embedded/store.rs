//! The open ledger file with its redo log and the writes the log holds
//! that the file does not yet; opened, the log applied, and reopened after
//! an I/O error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use redb::{Database, ReadableTable};
use tracing::info;

use super::tables::{
    CHECKPOINTS, COVERED, DONE, ENTITIES, OLD_DONE_BY_EXPIRY, REDO, Sweep, Tables, not_older,
    unix_now, write_batch,
};
use super::wal::{self, Wal, Write};
use crate::ledger::LedgerError;
use crate::store_file::{self, Integrity, ReopenError, Reopenable};

/// The open database and its redo log, replaced together by
/// [`Store::reopen`] after a failure.
pub(super) struct Store {
    pub(super) path: PathBuf,
    pub(super) db: Reopenable<Opened>,
}

/// An open ledger file, the redo log beside it, and what the log holds
/// that the file does not yet.
pub(super) struct Opened {
    pub(super) db: Database,
    /// The redo log and the generation its frames are written in.
    pub(super) log: Mutex<Log>,
    /// Writes durable in the redo log and not yet in `db`: reads look here
    /// first. Only the writer thread changes it.
    pub(super) recent: RwLock<Recent>,
    /// Read handles on `db` as of its last durable commit. With `recent`
    /// they hold the whole ledger, so a lookup opens no transaction of its
    /// own. The writer replaces them after each durable commit, before it
    /// empties `recent`.
    pub(super) tables: RwLock<Arc<Tables>>,
}

impl Opened {
    pub(super) fn recent(&self) -> std::sync::RwLockReadGuard<'_, Recent> {
        self.recent.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn tables(&self) -> Arc<Tables> {
        self.tables
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The redo log, or none once a write to it (or a durable commit) failed:
/// every commit is then durable in redb, until the file is reopened.
pub(super) struct Log {
    /// The generation every durable commit records as covered: the log's
    /// current one, kept when the log is dropped, so commits made without
    /// it still cover the frames written before.
    pub(super) generation: u64,
    pub(super) wal: Option<Wal>,
}

/// The latest value of each key written since the last durable commit, in
/// key order (a few thousand keys at most: a lookup is a dozen compares, and
/// the durable commit walks each B-tree once from left to right).
#[derive(Debug, Default)]
pub(super) struct Recent {
    pub(super) done: BTreeMap<String, u64>,
    pub(super) entities: BTreeMap<String, [u8; 28]>,
    pub(super) checkpoints: BTreeMap<String, i64>,
}

impl Recent {
    pub(super) fn len(&self) -> usize {
        self.done.len() + self.entities.len() + self.checkpoints.len()
    }

    pub(super) fn insert(&mut self, writes: &[Write<'_>]) {
        for write in writes {
            match *write {
                Write::Done(id, expires) => {
                    self.done.insert(id.to_owned(), expires);
                }
                Write::Entity(slot, state) => {
                    self.entities.insert(slot.to_owned(), state);
                }
                Write::Checkpoint(name, at) => {
                    self.checkpoints.insert(name.to_owned(), at);
                }
            }
        }
    }

    /// Every write, in key order within each table.
    pub(super) fn writes(&self) -> Vec<Write<'_>> {
        let done = self.done.iter().map(|(id, at)| Write::Done(id, *at));
        let entities = self
            .entities
            .iter()
            .map(|(slot, state)| Write::Entity(slot, *state));
        let checkpoints = self
            .checkpoints
            .iter()
            .map(|(name, at)| Write::Checkpoint(name, *at));
        done.chain(entities).chain(checkpoints).collect()
    }
}

impl Store {
    /// Opens (or creates) the ledger file at `path`, checked.
    pub(super) fn open(path: &Path) -> Result<Store, LedgerError> {
        Ok(Store {
            path: path.to_owned(),
            db: Reopenable::new(Store::open_file(path, Integrity::Check)?),
        })
    }

    /// Opens (or creates) the checked file and its tables, then applies
    /// what its redo log holds that the file does not.
    pub(super) fn open_file(path: &Path, integrity: Integrity) -> Result<Opened, LedgerError> {
        let db = store_file::open_with(path, integrity)?;
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| LedgerError::Open {
            path: path.display().to_string(),
            source: e,
        };
        let redb_error = |e: redb::Error| open_error(e.into());
        let txn = db.begin_write().map_err(|e| redb_error(e.into()))?;
        txn.open_table(DONE).map_err(|e| redb_error(e.into()))?;
        txn.delete_table(OLD_DONE_BY_EXPIRY)
            .map_err(|e| redb_error(e.into()))?;
        txn.open_table(ENTITIES).map_err(|e| redb_error(e.into()))?;
        txn.open_table(CHECKPOINTS)
            .map_err(|e| redb_error(e.into()))?;
        let covered = txn
            .open_table(REDO)
            .and_then(|table| Ok(table.get(COVERED)?.map(|v| v.value())))
            .map_err(|e| redb_error(e.into()))?
            .unwrap_or(0);
        txn.commit().map_err(|e| redb_error(e.into()))?;

        let wal_path = wal::path_of(path);
        let wal_error = |e: std::io::Error| LedgerError::Open {
            path: wal_path.display().to_string(),
            source: e.into(),
        };
        let mut wal = Wal::open(&wal_path).map_err(wal_error)?;
        if wal.generation() > covered {
            let frames = wal.frames().map_err(wal_error)?;
            let mut writes = Vec::new();
            for frame in &frames {
                writes.extend(wal::decode(frame).ok_or_else(|| {
                    wal_error(std::io::Error::other("a frame this version cannot read"))
                })?);
            }
            // A state older than the file's (a frame left by a version that
            // did not record `covered`, then a downgrade) never goes back in.
            let writes = not_older(&db, writes).map_err(redb_error)?;
            if !writes.is_empty() {
                let covers = Some(wal.generation());
                write_batch(&db, &writes, covers, &mut Sweep::default(), unix_now())
                    .map_err(redb_error)?;
                info!(
                    writes = writes.len(),
                    "Applied the ledger's redo log: what was answered before the last stop is kept."
                );
            }
        }
        wal.advance_past(covered).map_err(wal_error)?;
        let tables = Tables::open(&db).map_err(redb_error)?;
        Ok(Opened {
            db,
            log: Mutex::new(Log {
                generation: wal.generation(),
                wal: Some(wal),
            }),
            recent: RwLock::default(),
            tables: RwLock::new(tables),
        })
    }

    pub(super) fn get(&self) -> Result<Arc<Opened>, LedgerError> {
        self.db.get().ok_or(LedgerError::Closed)
    }

    /// Closes the handle and opens the file again: redb refuses every write
    /// after one I/O error until then. Blocking.
    pub(super) fn reopen(&self) -> Result<(), LedgerError> {
        self.db
            .reopen(
                || Store::open_file(&self.path, Integrity::Trust),
                LedgerError::is_held_elsewhere,
            )
            .map_err(|error| match error {
                ReopenError::Busy => LedgerError::Closed,
                ReopenError::Open(error) => error,
            })
    }
}
