//! Why the spool could not take or give back a delivery, and how redb's
//! errors become its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::adapters::store_file::StoreFileError;

/// Why the spool could not take or give back a delivery.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// The spool file could not be opened (path, permissions, another process).
    #[error("cannot open the spool at {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The spool's file cannot be opened. From
    /// [`Spool::open`](super::Spool::open) never for damage (a damaged file
    /// is set aside and salvaged), but because another process holds it or
    /// its directory cannot be made; from
    /// [`Spool::check`](super::Spool::check), damage too.
    #[error(transparent)]
    File(#[from] StoreFileError),
    /// The spool's file is damaged and could not be set aside to start on
    /// a new one.
    #[error("the spool file {path} is damaged ({damage}) and cannot be set aside: {source}")]
    SetAside {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (boxed: it is large, and rare).
        damage: Box<StoreFileError>,
        /// The rename's error.
        #[source]
        source: std::io::Error,
    },
    /// A damaged entry could not be written to the quarantine, so it stays
    /// in the spool (it is never replayed).
    #[error("cannot quarantine a damaged spool entry in {dir}: {source}")]
    Quarantine {
        /// The quarantine directory.
        dir: PathBuf,
        /// The filesystem's error.
        #[source]
        source: std::io::Error,
    },
    /// A read or write failed.
    #[error("spool storage: {0}")]
    Storage(#[source] Arc<redb::Error>),
    /// The configured bound (`spool.max_bytes` / `spool.max_entries`) is reached.
    #[error("the spool is full ({entries} deliveries, {bytes} bytes)")]
    Full {
        /// Deliveries spooled.
        entries: u64,
        /// Bytes spooled.
        bytes: u64,
    },
    /// A write failed and none has worked since (see `health.rs`).
    #[error(
        "spool writes are failing ({reason}); the spool takes nothing until a write works again"
    )]
    Unwritable {
        /// The last failure's message.
        reason: String,
    },
}

pub(super) fn storage(error: impl Into<redb::Error>) -> SpoolError {
    SpoolError::Storage(Arc::new(error.into()))
}

/// A redb error while the file is opened and first read (or, salvaged,
/// first written): damage redb reports instead of panicking is damage (set
/// aside and salvaged), any other error stops start-up.
pub(super) fn opening_error(path: &Path) -> impl Fn(redb::Error) -> SpoolError + '_ {
    move |error| match error {
        redb::Error::Corrupted(detail) => SpoolError::File(StoreFileError::Damaged {
            path: path.display().to_string(),
            detail,
        }),
        error => SpoolError::Open {
            path: path.to_owned(),
            source: error.into(),
        },
    }
}
