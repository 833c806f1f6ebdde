//! Opening the ledger file: a damaged one set aside for a new one at
//! start-up, and the file checked and counted without a change for
//! `posbridge ledger check`.

use std::path::Path;

use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
use tracing::error;

use super::store::Store;
use super::tables::{CHECKPOINTS, DONE, ENTITIES};
use super::{EmbeddedLedger, LedgerCounts, storage};
use crate::adapters::ledger::LedgerError;
use crate::adapters::store_file::{self, Disk, StoreFileError};

/// The ledger's `store` label on `posbridge_store_files_set_aside`.
const STORE: &str = "ledger";

/// A damaged ledger file that could not be set aside (the source of
/// [`LedgerError::Open`]): start-up stops, as nothing else can be opened at
/// its path.
#[derive(Debug, thiserror::Error)]
#[error("the file is damaged ({damage}) and cannot be set aside: {source}")]
struct SetAsideFailed {
    /// What is wrong with the file.
    damage: StoreFileError,
    /// The rename's error.
    #[source]
    source: std::io::Error,
}

/// Opens the ledger file at `path` on `disk`; a damaged one is set aside,
/// said once at ERROR, and a new file opened in its place. The files set
/// aside beside it are counted in `posbridge_store_files_set_aside{store="ledger"}`.
pub(super) fn open_or_set_aside(path: &Path, disk: &Disk) -> Result<Store, LedgerError> {
    let store = match Store::open(path, disk) {
        Err(LedgerError::File(damage)) if damage.is_damage() => {
            let aside = match store_file::set_aside(path) {
                Ok(aside) => aside,
                Err(source) => {
                    return Err(LedgerError::Open {
                        path: path.display().to_string(),
                        source: Box::new(SetAsideFailed { damage, source }),
                    });
                }
            };
            error!(
                path = %path.display(),
                set_aside = %aside.display(),
                error = %damage,
                "The ledger file is damaged: it was set aside and a new one opened, filled from the topics' beginning before deliveries are decided (the ledger is the topics' cache: nothing is lost, but the fill takes as long as reading every topic)."
            );
            Store::open(path, disk)?
        }
        opened => opened?,
    };
    store_file::count_set_aside(STORE, path);
    Ok(store)
}

impl EmbeddedLedger {
    /// Opens the ledger file as start-up does (its pages checked) and
    /// counts what it holds, changing nothing: for `posbridge ledger check`,
    /// which reports a damaged file instead of setting it aside.
    ///
    /// # Errors
    /// [`LedgerError::File`] when the file cannot be opened (for a damaged
    /// one, an error that says [`StoreFileError::is_damage`]);
    /// [`LedgerError::Embedded`] when a table cannot be read.
    pub fn check(path: &Path) -> Result<LedgerCounts, LedgerError> {
        let store = Store::open(path, &Disk::default())?;
        let txn = store.get()?.db.begin_read().map_err(storage)?;
        Ok(LedgerCounts {
            done_deliveries: txn
                .open_table(DONE)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
            entities: txn
                .open_table(ENTITIES)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
            checkpoints: txn
                .open_table(CHECKPOINTS)
                .map_err(storage)?
                .len()
                .map_err(storage)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::adapters::ledger::{Begin, Commit, Done, Store as _};
    use crate::domain::event::{DeliveryKey, ProviderKind};
    use crate::observe::telemetry;

    fn open(path: &Path) -> Result<EmbeddedLedger, LedgerError> {
        EmbeddedLedger::open(path, Duration::from_secs(3600), Duration::from_secs(10))
    }

    /// The case: five sales published, posbridge stopped, one bit
    /// changed in a delivery id inside the file. Start-up sets the file
    /// aside (kept as found) and opens a new one, with no offsets, so the
    /// rebuild reads every partition from its beginning; the set aside is
    /// counted.
    #[tokio::test]
    async fn a_damaged_ledger_file_is_set_aside_and_a_new_one_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        {
            let ledger = open(&path).unwrap();
            for n in 1..=5 {
                let delivery = DeliveryKey::new(ProviderKind::ReceiptRoller, &format!("sale-{n}"));
                ledger
                    .commit(&Commit {
                        delivery: Some(Done::published_now(delivery)),
                        ..Commit::NOTHING
                    })
                    .await
                    .unwrap();
            }
            ledger.persist().await.unwrap();
        }
        // The last handle's drop let go of the file.
        EmbeddedLedger::check(&path).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let at = memchr::memmem::rfind(&bytes, b"sale-3").unwrap();
        bytes[at + 5] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        let refused = EmbeddedLedger::check(&path).unwrap_err();
        assert!(
            matches!(&refused, LedgerError::File(error) if error.is_damage()),
            "{refused}"
        );

        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let ledger = metrics::with_local_recorder(&recorder, || open(&path)).unwrap();
        let sale_1 = DeliveryKey::new(ProviderKind::ReceiptRoller, "sale-1");
        assert_eq!(
            ledger.begin(&sale_1).await.unwrap(),
            Begin::New,
            "a new file, filled from the topics"
        );
        let opened = ledger.store.get().unwrap();
        assert!(
            super::super::tables::offsets(&opened.db)
                .unwrap()
                .is_empty(),
            "no offsets: the rebuild reads every partition from its beginning"
        );
        let aside: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|file| file.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("ledger.redb.damaged-"))
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        let kept = std::fs::read(dir.path().join(&aside[0])).unwrap();
        assert_eq!(kept.len(), bytes.len(), "kept for a look");
        assert_eq!(
            telemetry::rendered(&recorder, telemetry::STORE_FILES_SET_ASIDE),
            "posbridge_store_files_set_aside{store=\"ledger\"} 1"
        );
    }

    /// A 0-byte ledger file is a cache lost too: set aside, not refused.
    /// A file another process holds is not damaged: still refused, and
    /// left where it is.
    #[test]
    fn an_empty_ledger_file_is_set_aside_but_a_held_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.redb");
        std::fs::write(&path, b"").unwrap();
        let ledger = open(&path).unwrap();
        let held = open(&path).unwrap_err();
        assert!(held.is_held_elsewhere(), "{held}");
        drop(ledger);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|file| file.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "the empty file set aside once: {names:?}");
    }
}
