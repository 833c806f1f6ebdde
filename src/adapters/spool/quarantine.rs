//! Where damaged spool entries go: a directory beside the spool file
//! (`<spool path>.quarantine/`), two files per entry: its stored bytes as
//! they were (`<seq>-<unix µs>.entry`) and why it was set aside (`.json`:
//! reason, sequence number, when, the spool file, and its header as found
//! if it still parses: the provider, source and delivery id to ask for).
//!
//! Not the dead-letter topic: the spool holds deliveries because Kafka did
//! not answer, so that topic is as far away as the others when the entry is
//! read at start-up; and a damaged entry's provider, source and delivery id
//! cannot be trusted to build a letter from. An entry stays there until an
//! operator removes it: `posbridge_spool_quarantined_entries` counts the
//! directory's entries (from start-up on), and its alert fires while any is
//! there (docs/ALERTS.md).

use std::collections::HashSet;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use redb::Database;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tracing::error;

use super::frame::{self, Damage};
use super::{BY_DELIVERY, ENTRIES, SpoolError, storage};

/// The file name ending of a quarantined entry's bytes.
const ENTRY: &str = "entry";

/// A stored entry that does not verify.
#[derive(Debug)]
pub(super) struct Damaged {
    seq: u64,
    stored: Vec<u8>,
    damage: Damage,
}

impl Damaged {
    /// Entry `seq`, stored as `stored`, found damaged.
    pub(super) fn new(seq: u64, stored: &[u8], damage: Damage) -> Damaged {
        Damaged {
            seq,
            stored: stored.to_vec(),
            damage,
        }
    }
}

/// What [`Quarantine::take`] removed from the spool.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Taken {
    /// Entries.
    pub(super) entries: u64,
    /// Their stored bytes.
    pub(super) bytes: u64,
    /// Entries kept in the quarantine.
    pub(super) kept: u64,
}

/// The quarantine directory of one spool file.
#[derive(Debug)]
pub(super) struct Quarantine {
    /// `<spool path>.quarantine`.
    pub(super) dir: PathBuf,
    /// The spool file, named in each record.
    spool: PathBuf,
}

impl Quarantine {
    /// The quarantine of the spool file at `spool`.
    pub(super) fn beside(spool: &Path) -> Quarantine {
        let mut dir = spool.as_os_str().to_owned();
        dir.push(".quarantine");
        Quarantine {
            dir: PathBuf::from(dir),
            spool: spool.to_owned(),
        }
    }

    /// Moves damaged entries out of the spool `db`: each is kept here
    /// first, durably, then all are removed from the spool in one write,
    /// their delivery ids with them (a provider's retry of one is then
    /// taken anew, not answered as a duplicate of an entry that is never
    /// published). Each is said once, at ERROR; the caller counts them.
    ///
    /// # Errors
    /// [`SpoolError::Quarantine`] when an entry cannot be kept here (none
    /// is removed then); [`SpoolError::Storage`] when the removal fails.
    pub(super) fn take(&self, db: &Database, damaged: Vec<Damaged>) -> Result<Taken, SpoolError> {
        let mut kept = Vec::with_capacity(damaged.len());
        for entry in &damaged {
            let file = self
                .keep(
                    &entry.seq.to_string(),
                    Some(entry.seq),
                    &entry.stored,
                    entry.damage,
                )
                .map_err(|source| SpoolError::Quarantine {
                    dir: self.dir.clone(),
                    source,
                })?;
            kept.push(file);
        }
        let seqs: HashSet<u64> = damaged.iter().map(|entry| entry.seq).collect();
        let txn = db.begin_write().map_err(storage)?;
        let mut taken = Taken::default();
        {
            let mut entries = txn.open_table(ENTRIES).map_err(storage)?;
            for seq in &seqs {
                if let Some(value) = entries.remove(*seq).map_err(storage)? {
                    taken.entries += 1;
                    taken.bytes += value.value().len() as u64;
                }
            }
            // The index by delivery id: a damaged entry's own header cannot
            // be trusted to name its key, so look for its sequence number.
            let mut by_delivery = txn.open_table(BY_DELIVERY).map_err(storage)?;
            by_delivery
                .retain(|_, seq| !seqs.contains(&seq))
                .map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        for (entry, file) in damaged.iter().zip(&kept) {
            error!(
                seq = entry.seq,
                reason = entry.damage.as_str(),
                error = %entry.damage,
                quarantined = %file.display(),
                "A damaged spool entry was moved to the quarantine and is not published; its provider's retry, or a reconcile over its time, brings the delivery back."
            );
        }
        taken.kept = kept.len() as u64;
        Ok(taken)
    }

    /// Keeps a damaged entry's bytes and why, durably (the entry is removed
    /// from the spool only after this returns), named `label` and the time;
    /// `seq` is its sequence number when the spool's table held it (a frame
    /// found by a salvage has none). Returns the entry file.
    ///
    /// # Errors
    /// The directory or a file could not be written or synced.
    pub(super) fn keep(
        &self,
        label: &str,
        seq: Option<u64>,
        stored: &[u8],
        damage: Damage,
    ) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let now = OffsetDateTime::now_utc();
        let name = format!("{label}-{}", now.unix_timestamp_nanos() / 1000);
        let entry = self.dir.join(format!("{name}.{ENTRY}"));
        // What the header says, if it still parses: which delivery to ask
        // its provider for (not trusted: it may be what changed).
        let payload = frame::unverified_payload(stored);
        let header = payload
            .iter()
            .position(|b| *b == b'\n')
            .and_then(|end| serde_json::from_slice::<serde_json::Value>(&payload[..end]).ok());
        let record = serde_json::json!({
            "seq": seq,
            "reason": damage.as_str(),
            "detail": damage.to_string(),
            "header_as_found": header,
            "quarantined_at": now.format(&Rfc3339).unwrap_or_default(),
            "spool": self.spool.display().to_string(),
            "bytes": stored.len(),
        });
        write_synced(&entry, stored)?;
        write_synced(
            &self.dir.join(format!("{name}.json")),
            record.to_string().as_bytes(),
        )?;
        File::open(&self.dir)?.sync_all()?;
        Ok(entry)
    }

    /// How many entries the directory holds (none when it does not exist).
    pub(super) fn count(&self) -> u64 {
        std::fs::read_dir(&self.dir).map_or(0, |dir| {
            dir.filter_map(Result::ok)
                .filter(|file| file.path().extension().is_some_and(|ext| ext == ENTRY))
                .count() as u64
        })
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
