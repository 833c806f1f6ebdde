//! The outage spool: verified deliveries Kafka could not take in time, for
//! sources with `on_broker_unavailable = "spool"`.
//!
//! A spooled delivery is answered 2xx only after its append is durable
//! (redb commits with an fsync). The drainer (`drain.rs`) replays entries
//! through the pipeline, oldest first, and removes each only after its
//! outcome is durable in the ledger, so a crash anywhere replays at most an
//! entry whose delivery id the ledger already knows as done. The spool is a
//! file of its own (not the ledger's), so a full ledger disk need not stop it.
//!
//! A spooled delivery id is a duplicate for the dedup check: the pipeline
//! asks [`Spool::contains`] before processing a delivery, so a provider's
//! retry of a spooled delivery is answered 2xx and nothing is spooled twice.
//!
//! A failed write (its disk full) makes the spool unwritable until a heal
//! reopens the file and a probe write works (`health.rs`).
//!
//! Each entry is stored in a frame with a checksum (`frame.rs`), verified
//! whenever it is read: a damaged entry is never replayed as something it
//! was not, but moved to the quarantine beside the file (`quarantine.rs`),
//! and the drain goes on with the next. A spool file redb refuses (damaged
//! pages, empty, not a database) is set aside and every intact entry found
//! in its bytes salvaged into a new file (`salvage.rs`): posbridge serves
//! either way.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    WriteTransaction,
};
use time::OffsetDateTime;

mod depth;
mod doubt;
mod entry;
mod error;
mod frame;
mod health;
mod quarantine;
mod salvage;

use depth::DepthHistory;
pub use depth::MINUTES as DEPTH_MINUTES;
use doubt::InDoubt;
pub use entry::SpooledDelivery;
pub use error::SpoolError;
use error::{opening_error, storage};
use health::{Health, PROBE_BYTES};
use quarantine::{Damaged, Quarantine};

use crate::adapters::store_file::{self, Disk, Reopenable};
use crate::config::SpoolConfig;
use crate::domain::event::DeliveryKey;
use crate::observe::telemetry;

/// The spool's `store` label on `posbridge_store_files_set_aside`.
const STORE: &str = "spool";

/// Sequence number → an encoded [`SpooledDelivery`]; oldest first.
const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
/// Delivery key → its sequence number: the dedup check, and removal.
const BY_DELIVERY: TableDefinition<&str, u64> = TableDefinition::new("by_delivery");

/// What the spool holds now, for `/readyz`, the gauges and the status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SpoolStats {
    /// Deliveries spooled.
    pub entries: u64,
    /// Bytes spooled (headers and bodies).
    pub bytes: u64,
    /// Whether one more delivery of average size would still fit (never
    /// while the spool cannot write).
    pub has_room: bool,
    /// Whether writes work (see `health.rs`).
    pub writable: bool,
    /// Damaged entries in the quarantine beside the spool file, waiting
    /// for an operator to look at them (`quarantine.rs`).
    pub quarantined: u64,
}

/// The spool handle. Cheap to clone.
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    /// The spool file's path, to reopen it.
    path: PathBuf,
    /// The disk it is on, to reopen it there.
    disk: Disk,
    /// The spool file, reopened by a heal.
    db: Reopenable<Database>,
    /// Where damaged entries go.
    quarantine: Quarantine,
    /// Whether writes work.
    health: Health,
    /// Counts kept beside the file, so the bound is checked without a scan.
    counts: Mutex<Counts>,
    /// `spool.max_bytes`.
    max_bytes: u64,
    /// `spool.max_entries`.
    max_entries: u64,
}

#[derive(Debug, Default)]
struct Counts {
    entries: u64,
    bytes: u64,
    next_seq: u64,
    depth: DepthHistory,
    /// Entries in the quarantine directory.
    quarantined: u64,
    /// Appends whose commit failed, uncounted (`doubt.rs`).
    in_doubt: InDoubt,
}

impl Inner {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool").finish_non_exhaustive()
    }
}

#[cfg(test)]
impl Spool {
    /// The delivery ids it holds, oldest first: what the spool's and the
    /// drainer's tests compare.
    pub(crate) fn delivery_ids(&self) -> Vec<String> {
        self.oldest(usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(_, d)| d.delivery_id)
            .collect()
    }

    /// Makes its counts say `entries` whatever the file holds, as counts
    /// that went wrong would (a test of what reads them).
    pub(crate) fn miscount(&self, entries: u64) {
        self.counts().entries = entries;
    }
}

impl Spool {
    /// Opens (or creates) the spool file and counts what it holds, moving
    /// damaged entries to the quarantine. A file redb refuses as damaged is
    /// set aside and what it holds salvaged into a new one (`salvage.rs`).
    ///
    /// # Errors
    /// [`SpoolError::File`] when the file cannot be opened for a reason
    /// other than damage, e.g. because another posbridge process holds it;
    /// [`SpoolError::SetAside`] when a damaged file cannot be renamed.
    pub fn open(config: &SpoolConfig) -> Result<Spool, SpoolError> {
        Spool::open_on(config, Disk::default())
    }

    /// [`Spool::open`] on `disk`: in service the file itself
    /// ([`Spool::open`]), under a simulation a simulated disk.
    ///
    /// # Errors
    /// As [`Spool::open`].
    pub(crate) fn open_on(config: &SpoolConfig, disk: Disk) -> Result<Spool, SpoolError> {
        let path: &Path = &config.path;
        let quarantine = Quarantine::beside(path);
        let (db, mut counts) = match open_file(path, &disk) {
            Ok(OpenedFile {
                db,
                mut counts,
                damaged,
                rolled_back,
            }) => {
                if !damaged.is_empty() {
                    let taken = quarantine.take(&db, damaged)?;
                    counts.entries -= taken.entries;
                    counts.bytes -= taken.bytes;
                }
                if rolled_back {
                    salvage::after_rollback(path, &db, &mut counts, &quarantine)?;
                }
                (db, counts)
            }
            Err(SpoolError::File(damage)) if damage.is_damage() => {
                salvage::recover((path, &disk), damage, &quarantine)?
            }
            Err(error) => return Err(error),
        };
        store_file::count_set_aside(STORE, path);
        counts.quarantined = quarantine.count();
        let spool = Spool {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                disk,
                db: Reopenable::new(db),
                quarantine,
                health: Health::new(),
                counts: Mutex::new(counts),
                max_bytes: config.max_bytes,
                max_entries: config.max_entries,
            }),
        };
        metrics::gauge!(telemetry::SPOOL_MAX_BYTES).set(config.max_bytes as f64);
        metrics::gauge!(telemetry::SPOOL_MAX_ENTRIES).set(config.max_entries as f64);
        spool.publish_gauges();
        Ok(spool)
    }

    /// Appends a delivery durably. Returns once it is on disk.
    ///
    /// # Errors
    /// [`SpoolError::Full`] beyond the configured bound; [`SpoolError::Storage`]
    /// when the write fails; [`SpoolError::Unwritable`] at once while an
    /// earlier write failed and no heal has worked since.
    pub async fn append(&self, delivery: &SpooledDelivery) -> Result<(), SpoolError> {
        let db = self.writable_db().await?;
        let bytes = delivery.encode();
        let size = bytes.len() as u64;
        let seq = {
            let mut counts = self.counts();
            if counts.entries + 1 > self.inner.max_entries
                || counts.bytes + size > self.inner.max_bytes
            {
                return Err(SpoolError::Full {
                    entries: counts.entries,
                    bytes: counts.bytes,
                });
            }
            // Reserved now, so concurrent appends cannot overshoot the bound.
            counts.entries += 1;
            counts.bytes += size;
            counts.next_seq += 1;
            counts.next_seq - 1
        };
        let key = delivery.key.clone();
        let written = tokio::task::spawn_blocking(move || -> Result<(), SpoolError> {
            let txn = db.begin_write().map_err(storage)?;
            {
                let mut entries = txn.open_table(ENTRIES).map_err(storage)?;
                entries.insert(seq, bytes.as_slice()).map_err(storage)?;
                let mut by_delivery = txn.open_table(BY_DELIVERY).map_err(storage)?;
                by_delivery.insert(key.as_str(), seq).map_err(storage)?;
            }
            txn.commit().map_err(storage)
        })
        .await
        .unwrap_or_else(|join| Err(storage(redb::StorageError::Io(std::io::Error::other(join)))));
        if let Err(error) = &written {
            {
                let mut counts = self.counts();
                counts.entries -= 1;
                counts.bytes -= size;
                counts.in_doubt.failed(seq, delivery.key.clone());
            }
            self.inner.health.failed(error);
        }
        self.publish_gauges();
        written
    }

    /// Whether a delivery is spooled (so a retry of it is a duplicate).
    ///
    /// # Errors
    /// [`SpoolError::Storage`] when the spool cannot be read.
    pub fn contains(&self, delivery: &DeliveryKey) -> Result<bool, SpoolError> {
        // Every delivery asks, and the spool is nearly always empty: counts
        // are reserved before an append writes, so zero means none is there
        // or on its way, and no read transaction is needed. An append that
        // failed spooled nothing the retry may be answered on (`doubt.rs`).
        {
            let counts = self.counts();
            if counts.entries == 0 || counts.in_doubt.holds(delivery) {
                return Ok(false);
            }
        }
        // While a heal reopens the file (or could not), nothing tells: not
        // spooled, then. A delivery processed anew is published once, and its
        // spooled copy is found done in the ledger when the drainer replays it.
        let Some(db) = self.inner.db.get() else {
            return Ok(false);
        };
        let txn = db.begin_read().map_err(storage)?;
        let table = txn.open_table(BY_DELIVERY).map_err(storage)?;
        Ok(table.get(delivery.as_str()).map_err(storage)?.is_some())
    }

    /// Up to `limit` of the oldest entries, oldest first, with their
    /// sequence numbers, each verified against its checksum. A damaged one
    /// (changed on disk while posbridge runs) is moved to the quarantine
    /// instead of returned, so fewer than `limit` may come back while more
    /// are spooled.
    ///
    /// # Errors
    /// [`SpoolError`] when the spool cannot be read, or a damaged entry
    /// cannot be moved out of it (it is still not returned).
    pub fn oldest(&self, limit: usize) -> Result<Vec<(u64, SpooledDelivery)>, SpoolError> {
        let db = self.db()?;
        let mut intact = Vec::new();
        let mut damaged = Vec::new();
        {
            let txn = db.begin_read().map_err(storage)?;
            let table = txn.open_table(ENTRIES).map_err(storage)?;
            for entry in table.iter().map_err(storage)?.take(limit) {
                let (seq, value) = entry.map_err(storage)?;
                let (seq, stored) = (seq.value(), value.value());
                match SpooledDelivery::decode(stored) {
                    Ok(delivery) => intact.push((seq, delivery)),
                    Err(damage) => damaged.push(Damaged::new(seq, stored, damage)),
                }
            }
        }
        if !damaged.is_empty() {
            // A write and fsyncs on this thread, but only for damage found.
            let taken = self
                .inner
                .quarantine
                .take(&db, damaged)
                .inspect_err(|error| {
                    if matches!(error, SpoolError::Storage(_)) {
                        self.inner.health.failed(error);
                    }
                })?;
            {
                let mut counts = self.counts();
                counts.entries = counts.entries.saturating_sub(taken.entries);
                counts.bytes = counts.bytes.saturating_sub(taken.bytes);
                counts.quarantined += taken.kept;
            }
            self.publish_gauges();
        }
        Ok(intact)
    }

    /// Removes entries whose outcome is durable, in one write.
    ///
    /// # Errors
    /// [`SpoolError::Storage`] when the write fails, [`SpoolError::Unwritable`]
    /// while an earlier one did (they are then replayed, and found done in
    /// the ledger).
    pub async fn remove(&self, done: Vec<(u64, DeliveryKey)>) -> Result<(), SpoolError> {
        let db = self.writable_db().await?;
        let freed = tokio::task::spawn_blocking(move || -> Result<(u64, u64), SpoolError> {
            let txn = db.begin_write().map_err(storage)?;
            let freed = take_out(&txn, &done).map_err(storage)?;
            txn.commit().map_err(storage)?;
            Ok(freed)
        })
        .await
        .unwrap_or_else(|join| Err(storage(redb::StorageError::Io(std::io::Error::other(join)))))
        .inspect_err(|error| self.inner.health.failed(error))?;
        {
            let mut counts = self.counts();
            counts.entries = counts.entries.saturating_sub(freed.0);
            counts.bytes = counts.bytes.saturating_sub(freed.1);
        }
        self.publish_gauges();
        Ok(())
    }

    /// What the spool holds now.
    pub fn stats(&self) -> SpoolStats {
        let counts = self.counts();
        let average = counts.bytes.checked_div(counts.entries).unwrap_or(0);
        let writable = self.inner.health.is_writable();
        SpoolStats {
            entries: counts.entries,
            bytes: counts.bytes,
            has_room: writable
                && counts.entries < self.inner.max_entries
                && counts.bytes + average <= self.inner.max_bytes,
            writable,
            quarantined: counts.quarantined,
        }
    }

    /// Why writes fail, while they do: `/readyz` says it.
    pub fn unwritable_reason(&self) -> Option<String> {
        self.inner.health.reason()
    }

    /// Heals an unwritable spool when a heal is due ([`health::RETRY_EVERY`]):
    /// reopens the file and writes a probe of an entry's size. Whether the
    /// spool is writable now. Cheap while it is.
    pub async fn heal(&self) -> bool {
        if self.inner.health.is_writable() {
            return true;
        }
        if !self.inner.health.start_heal() {
            return false;
        }
        let probe_bytes = {
            let counts = self.counts();
            counts
                .bytes
                .checked_div(counts.entries)
                .unwrap_or(0)
                .max(PROBE_BYTES)
        };
        let inner = self.inner.clone();
        // The heal ends itself on its thread: a caller that gives up
        // waiting (a delivery's deadline) leaves it to finish.
        let healed = tokio::task::spawn_blocking(move || inner.heal(probe_bytes))
            .await
            .unwrap_or(false);
        self.publish_gauges();
        healed
    }

    /// The file's handle, for a write: healed first when a heal is due.
    async fn writable_db(&self) -> Result<Arc<Database>, SpoolError> {
        if !self.heal().await {
            return Err(SpoolError::Unwritable {
                reason: self.inner.health.reason().unwrap_or_default(),
            });
        }
        self.db()
    }

    /// The file's handle, unless a heal is reopening it (or could not).
    fn db(&self) -> Result<Arc<Database>, SpoolError> {
        self.inner.db.get().ok_or_else(|| SpoolError::Unwritable {
            reason: self.inner.health.reason().unwrap_or_default(),
        })
    }

    /// When the oldest spooled delivery arrived, if any is spooled.
    ///
    /// # Errors
    /// [`SpoolError`] when the spool cannot be read.
    pub fn oldest_received_at(&self) -> Result<Option<OffsetDateTime>, SpoolError> {
        Ok(self
            .oldest(1)?
            .into_iter()
            .next()
            .map(|(_, delivery)| delivery.received_at))
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.inner.counts()
    }

    /// The deepest the spool was in each of the last [`DEPTH_MINUTES`]
    /// minutes up to `now`, oldest first: the status page's chart.
    pub fn depth_per_minute(&self, now: OffsetDateTime) -> Vec<u64> {
        self.counts().depth.per_minute(unix_minute(now))
    }

    /// The gauges and the depth history, after every change.
    fn publish_gauges(&self) {
        let stats = self.stats();
        self.counts()
            .depth
            .note(unix_minute(OffsetDateTime::now_utc()), stats.entries);
        metrics::gauge!(telemetry::SPOOL_ENTRIES).set(stats.entries as f64);
        metrics::gauge!(telemetry::SPOOL_BYTES).set(stats.bytes as f64);
        metrics::gauge!(telemetry::SPOOL_QUARANTINED).set(stats.quarantined as f64);
    }
}

/// What `posbridge ledger check` finds in a spool file.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Checked {
    /// Entries stored, damaged ones included.
    pub entries: u64,
    /// Their stored bytes.
    pub bytes: u64,
    /// Entries that do not verify: `serve` moves them to the quarantine.
    pub damaged_entries: u64,
}

impl Spool {
    /// Opens the spool file as start-up does and counts what it holds,
    /// changing nothing: a damaged file or entry is reported, not set aside.
    ///
    /// # Errors
    /// [`SpoolError`] when the file cannot be opened or read; for a damaged
    /// file, [`SpoolError::File`] whose error says
    /// [`StoreFileError::is_damage`](store_file::StoreFileError::is_damage).
    pub fn check(config: &SpoolConfig) -> Result<Checked, SpoolError> {
        let opened = open_file(&config.path, &Disk::default())?;
        Ok(Checked {
            entries: opened.counts.entries,
            bytes: opened.counts.bytes,
            damaged_entries: opened.damaged.len() as u64,
        })
    }
}

/// A spool file opened, counted and verified.
struct OpenedFile {
    db: Database,
    /// What it holds, damaged entries included.
    counts: Counts,
    /// The entries that do not verify.
    damaged: Vec<Damaged>,
    /// Whether redb rolled it back to an earlier commit (damaged pages).
    rolled_back: bool,
}

/// Opens the spool file at `path` on `disk`, counts what it holds and
/// verifies every entry (here, once, whatever its place in the spool).
fn open_file(path: &Path, disk: &Disk) -> Result<OpenedFile, SpoolError> {
    let store_file::Opened { db, rolled_back } = store_file::open_noting_rollback(path, disk)?;
    let fail = opening_error(path);
    // A damaged entry page the check let through makes redb panic here.
    let read = store_file::guarded(path, || -> Result<(Counts, Vec<Damaged>), SpoolError> {
        let txn = db.begin_write().map_err(|e| fail(e.into()))?;
        txn.open_table(ENTRIES).map_err(|e| fail(e.into()))?;
        txn.open_table(BY_DELIVERY).map_err(|e| fail(e.into()))?;
        txn.commit().map_err(|e| fail(e.into()))?;
        let mut counts = Counts::default();
        let mut damaged = Vec::new();
        let read = db.begin_read().map_err(|e| fail(e.into()))?;
        let entries = read.open_table(ENTRIES).map_err(|e| fail(e.into()))?;
        counts.entries = entries.len().map_err(|e| fail(e.into()))?;
        for entry in entries.iter().map_err(|e| fail(e.into()))? {
            let (seq, value) = entry.map_err(|e| fail(e.into()))?;
            let (seq, stored) = (seq.value(), value.value());
            counts.bytes += stored.len() as u64;
            counts.next_seq = seq + 1;
            if let Err(damage) = SpooledDelivery::decode(stored) {
                damaged.push(Damaged::new(seq, stored, damage));
            }
        }
        Ok((counts, damaged))
    });
    let (counts, damaged) = read??;
    Ok(OpenedFile {
        db,
        counts,
        damaged,
        rolled_back,
    })
}

/// Removes `entries` (sequence number, delivery) in `txn`, and each
/// delivery's index entry while it names that one (not a later entry of
/// the same delivery); the entries and bytes freed.
fn take_out(
    txn: &WriteTransaction,
    entries: &[(u64, DeliveryKey)],
) -> Result<(u64, u64), redb::Error> {
    let (mut entries_freed, mut bytes_freed) = (0, 0);
    let mut table = txn.open_table(ENTRIES)?;
    let mut by_delivery = txn.open_table(BY_DELIVERY)?;
    for (seq, key) in entries {
        if let Some(value) = table.remove(*seq)? {
            entries_freed += 1;
            bytes_freed += value.value().len() as u64;
        }
        if by_delivery.get(key.as_str())?.map(|named| named.value()) == Some(*seq) {
            by_delivery.remove(key.as_str())?;
        }
    }
    Ok((entries_freed, bytes_freed))
}

fn unix_minute(at: OffsetDateTime) -> i64 {
    at.unix_timestamp().div_euclid(60)
}

#[cfg(test)]
mod tests;
