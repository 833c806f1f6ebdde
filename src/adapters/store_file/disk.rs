//! The disk beneath a store file. In service it is always the file itself,
//! through redb's own file backend. A test may put a simulated disk there
//! instead (redb's `StorageBackend`): one that keeps what was synced apart
//! from what was only written, so that a simulated crash can lose the rest.
//! The ledger and the spool keep the `Disk` they were opened on, so that a
//! reopen after an I/O error opens the file on the same disk.

use std::path::Path;
#[cfg(test)]
use std::sync::Arc;

use redb::{Builder, Database, DatabaseError};

/// Opens a redb database at a path through a backend of its own: what a
/// simulated disk gives.
#[cfg(test)]
pub type Create = Arc<dyn Fn(&Builder, &Path) -> Result<Database, DatabaseError> + Send + Sync>;

/// Where a store file's bytes go: the file itself (the default, and the
/// only disk outside tests), or a simulated one.
#[derive(Clone, Default)]
pub struct Disk {
    /// Set by a simulation; `None`: the file itself.
    #[cfg(test)]
    simulated: Option<Create>,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(test)]
        if self.simulated.is_some() {
            return f.write_str("Disk(simulated)");
        }
        f.write_str("Disk(file)")
    }
}

impl Disk {
    /// A simulated disk: every store file opened on it is opened by `create`.
    #[cfg(test)]
    pub fn simulated(create: Create) -> Disk {
        Disk {
            simulated: Some(create),
        }
    }

    /// Opens (or creates) the database at `path` as `builder` says.
    pub(super) fn create(&self, builder: &Builder, path: &Path) -> Result<Database, DatabaseError> {
        #[cfg(test)]
        if let Some(create) = &self.simulated {
            return create(builder, path);
        }
        builder.create(path)
    }
}
