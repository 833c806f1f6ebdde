//! The open ledger file and the writes made since its last checkpoint;
//! opened, and reopened after an I/O error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use redb::Database;
use tracing::info;

use super::tables::{
    CHECKPOINTS, DONE, ENTITIES, META, OFFSETS, OLD_DONE_BY_EXPIRY, OLD_REDO, Tables, Write,
    move_old_done,
};
use crate::adapters::ledger::LedgerError;
use crate::adapters::store_file::{self, Disk, Integrity, ReopenError, Reopenable};

/// The open database, replaced by [`Store::reopen`] after a failure, and
/// what was written since its last checkpoint, which outlives a reopen.
pub(super) struct Store {
    pub(super) path: PathBuf,
    /// The disk it is on: a reopen opens the file on the same one.
    disk: Disk,
    pub(super) db: Reopenable<Opened>,
    /// Reads look here first, newest first: one lock, so a read never falls
    /// between a checkpoint's layers.
    pub(super) layers: RwLock<Layers>,
}

/// An open ledger file.
pub(super) struct Opened {
    pub(super) db: Database,
    /// Read handles on the file as of its last checkpoint: with the
    /// layers, the whole ledger, so a lookup opens no transaction of its
    /// own. A checkpoint replaces them before it lets go of what it wrote.
    pub(super) tables: RwLock<Arc<Tables>>,
}

impl Opened {
    pub(super) fn tables(&self) -> Arc<Tables> {
        self.tables
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What was written since the last checkpoint: in memory only, until a
/// checkpoint makes it durable (the topics hold it meanwhile).
#[derive(Default)]
pub(super) struct Layers {
    /// Written since the last checkpoint began.
    pub(super) current: Recent,
    /// Being made durable by a checkpoint now.
    pub(super) flushing: Option<Arc<Recent>>,
}

impl Store {
    /// What `look` finds in memory, newest first; `None`: look in the file.
    pub(super) fn recent<T>(&self, look: impl Fn(&Recent) -> Option<T>) -> Option<T> {
        let layers = self.layers.read().unwrap_or_else(PoisonError::into_inner);
        look(&layers.current).or_else(|| layers.flushing.as_deref().and_then(look))
    }

    pub(super) fn layers(&self) -> std::sync::RwLockWriteGuard<'_, Layers> {
        self.layers.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The latest value of each key written since a checkpoint.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// Done ids and their stored values (`tables::done_value`).
    pub(super) done: HashMap<String, Vec<u8>>,
    pub(super) entities: HashMap<String, [u8; 36]>,
    pub(super) checkpoints: HashMap<String, i64>,
}

impl Recent {
    pub(super) fn len(&self) -> usize {
        self.done.len() + self.entities.len() + self.checkpoints.len()
    }

    /// `older`'s writes beneath these: what is here wins.
    pub(super) fn beneath(&mut self, older: &Recent) {
        for (id, value) in &older.done {
            self.done.entry(id.clone()).or_insert_with(|| value.clone());
        }
        for (slot, state) in &older.entities {
            self.entities.entry(slot.clone()).or_insert(*state);
        }
        for (name, at) in &older.checkpoints {
            self.checkpoints.entry(name.clone()).or_insert(*at);
        }
    }

    /// Every write, in key order within each table: a checkpoint walks
    /// each B-tree once from left to right.
    pub(super) fn writes(&self) -> Vec<Write<'_>> {
        let done = self.done.iter().map(|(id, value)| Write::Done(id, value));
        let entities = self
            .entities
            .iter()
            .map(|(slot, state)| Write::Entity(slot, *state));
        let checkpoints = self
            .checkpoints
            .iter()
            .map(|(name, at)| Write::Checkpoint(name, *at));
        let mut writes: Vec<Write<'_>> = done.chain(entities).chain(checkpoints).collect();
        writes.sort_unstable();
        writes
    }
}

impl Store {
    /// Opens (or creates) the ledger file at `path` on `disk`, checked.
    pub(super) fn open(path: &Path, disk: &Disk) -> Result<Store, LedgerError> {
        Ok(Store {
            path: path.to_owned(),
            disk: disk.clone(),
            db: Reopenable::new(Store::open_file(path, Integrity::Check, disk)?),
            layers: RwLock::default(),
        })
    }

    /// Opens (or creates) the checked file and its tables.
    fn open_file(path: &Path, integrity: Integrity, disk: &Disk) -> Result<Opened, LedgerError> {
        let db = store_file::open_with(path, integrity, disk)?;
        let redb_error = |e: redb::Error| LedgerError::Open {
            path: path.display().to_string(),
            source: e.into(),
        };
        let txn = db.begin_write().map_err(|e| redb_error(e.into()))?;
        txn.open_table(DONE).map_err(|e| redb_error(e.into()))?;
        txn.open_table(ENTITIES).map_err(|e| redb_error(e.into()))?;
        txn.open_table(CHECKPOINTS)
            .map_err(|e| redb_error(e.into()))?;
        txn.open_table(OFFSETS).map_err(|e| redb_error(e.into()))?;
        txn.open_table(META).map_err(|e| redb_error(e.into()))?;
        txn.delete_table(OLD_DONE_BY_EXPIRY)
            .map_err(|e| redb_error(e.into()))?;
        let moved = move_old_done(&txn).map_err(redb_error)?;
        let had_redo_log = txn
            .delete_table(OLD_REDO)
            .map_err(|e| redb_error(e.into()))?;
        txn.commit().map_err(|e| redb_error(e.into()))?;
        if had_redo_log {
            // What its frames held is in the topics; a file without
            // offsets is filled from the topics' beginning at start.
            let _ = std::fs::remove_file(old_redo_log(path));
            info!(
                "The ledger's redo log of an earlier version is removed: the topics are the record, and the ledger is filled from them."
            );
        }
        if moved > 0 {
            info!(
                done_ids = moved,
                "The done delivery ids of an earlier version are kept with their outcome unknown: a lookup says what it can of them."
            );
        }
        let tables = Tables::open(&db).map_err(redb_error)?;
        Ok(Opened {
            db,
            tables: RwLock::new(tables),
        })
    }

    pub(super) fn get(&self) -> Result<Arc<Opened>, LedgerError> {
        self.db.get().ok_or(LedgerError::Closed)
    }

    /// Closes the handle and opens the file again: redb refuses every write
    /// after one I/O error until then. Blocking. What memory holds since
    /// the last checkpoint is kept.
    pub(super) fn reopen(&self) -> Result<(), LedgerError> {
        self.db
            .reopen(
                || Store::open_file(&self.path, Integrity::Trust, &self.disk),
                LedgerError::is_held_elsewhere,
            )
            .map_err(|error| match error {
                ReopenError::Busy => LedgerError::Closed,
                ReopenError::Open(error) => error,
            })
    }
}

/// The redo log file earlier versions kept beside the ledger file.
pub(super) fn old_redo_log(ledger: &Path) -> PathBuf {
    let mut name = ledger.as_os_str().to_owned();
    name.push(".wal");
    PathBuf::from(name)
}
