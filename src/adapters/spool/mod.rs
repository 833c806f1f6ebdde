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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

mod depth;
mod health;

use depth::DepthHistory;
pub use depth::MINUTES as DEPTH_MINUTES;
use health::{Health, PROBE_BYTES};

use crate::adapters::store_file::{self, Reopenable};
use crate::config::SpoolConfig;
use crate::domain::event::{DeliveryKey, ProviderKind, Source, from_micros, micros};
use crate::observe::telemetry;

/// Sequence number → an encoded [`SpooledDelivery`]; oldest first.
const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
/// Delivery key → its sequence number: the dedup check, and removal.
const BY_DELIVERY: TableDefinition<&str, u64> = TableDefinition::new("by_delivery");

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
    /// The spool's file is damaged or not a database.
    #[error(transparent)]
    File(#[from] crate::adapters::store_file::StoreFileError),
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
    /// An entry is not one this version wrote.
    #[error("spool entry {0} is corrupt")]
    Corrupt(u64),
    /// A write failed and none has worked since (see `health.rs`).
    #[error(
        "spool writes are failing ({reason}); the spool takes nothing until a write works again"
    )]
    Unwritable {
        /// The last failure's message.
        reason: String,
    },
}

fn storage(error: impl Into<redb::Error>) -> SpoolError {
    SpoolError::Storage(Arc::new(error.into()))
}

/// One spooled delivery: everything the pipeline needs to process it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledDelivery {
    /// Its dedup key in the ledger (the provider and its delivery id); kept
    /// as stored, so an entry is removed under the key it was added with.
    pub key: DeliveryKey,
    /// The source it came through (its account is part of record keys).
    pub source: Source,
    /// The delivery-id header's value.
    pub delivery_id: String,
    /// When it arrived.
    pub received_at: OffsetDateTime,
    /// The verified body, exactly as signed.
    pub body: Bytes,
}

/// The stored header of an entry; the body follows it after a newline.
#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    provider: ProviderKind,
    source: String,
    account: Option<String>,
    delivery_id: String,
    received_at_us: i64,
}

impl SpooledDelivery {
    fn encode(&self) -> Vec<u8> {
        let header = Header {
            key: self.key.as_str().to_owned(),
            provider: self.source.provider,
            source: self.source.name.clone(),
            account: self.source.account.clone(),
            delivery_id: self.delivery_id.clone(),
            received_at_us: micros(self.received_at),
        };
        // A struct of strings and numbers always serializes.
        let mut bytes = serde_json::to_vec(&header).expect("a spool header serializes");
        bytes.push(b'\n');
        bytes.extend_from_slice(&self.body);
        bytes
    }

    fn decode(seq: u64, bytes: &[u8]) -> Result<SpooledDelivery, SpoolError> {
        let split = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(SpoolError::Corrupt(seq))?;
        let header: Header =
            serde_json::from_slice(&bytes[..split]).map_err(|_| SpoolError::Corrupt(seq))?;
        Ok(SpooledDelivery {
            key: DeliveryKey::from_stored(header.key),
            source: Source {
                provider: header.provider,
                name: header.source,
                account: header.account,
            },
            delivery_id: header.delivery_id,
            received_at: from_micros(header.received_at_us).ok_or(SpoolError::Corrupt(seq))?,
            body: Bytes::copy_from_slice(&bytes[split + 1..]),
        })
    }
}

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
}

/// The spool handle. Cheap to clone.
#[derive(Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

struct Inner {
    /// The spool file's path, to reopen it.
    path: PathBuf,
    /// The spool file, reopened by a heal.
    db: Reopenable<Database>,
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
}

impl Spool {
    /// Opens (or creates) the spool file and counts what it holds.
    ///
    /// # Errors
    /// [`SpoolError::Open`] when the file cannot be opened, e.g. because
    /// another posbridge process holds it.
    pub fn open(config: &SpoolConfig) -> Result<Spool, SpoolError> {
        let path: &Path = &config.path;
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| SpoolError::Open {
            path: path.to_owned(),
            source: e,
        };
        let db = store_file::open(path)?;
        // A damaged entry page the check let through makes redb panic here.
        let counted = store_file::guarded(path, || -> Result<Counts, SpoolError> {
            let txn = db.begin_write().map_err(|e| open_error(e.into()))?;
            txn.open_table(ENTRIES).map_err(|e| open_error(e.into()))?;
            txn.open_table(BY_DELIVERY)
                .map_err(|e| open_error(e.into()))?;
            txn.commit().map_err(|e| open_error(e.into()))?;
            let mut counts = Counts::default();
            let read = db.begin_read().map_err(|e| open_error(e.into()))?;
            let entries = read.open_table(ENTRIES).map_err(|e| open_error(e.into()))?;
            counts.entries = entries.len().map_err(|e| open_error(e.into()))?;
            for entry in entries.iter().map_err(|e| open_error(e.into()))? {
                let (seq, value) = entry.map_err(|e| open_error(e.into()))?;
                counts.bytes += value.value().len() as u64;
                counts.next_seq = seq.value() + 1;
            }
            Ok(counts)
        });
        let counts = counted??;
        let spool = Spool {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                db: Reopenable::new(db),
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
        // or on its way, and no read transaction is needed.
        if self.counts().entries == 0 {
            return Ok(false);
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

    /// Up to `limit` of the oldest entries, oldest first, with their sequence numbers.
    ///
    /// # Errors
    /// [`SpoolError`] when the spool cannot be read or an entry is corrupt.
    pub fn oldest(&self, limit: usize) -> Result<Vec<(u64, SpooledDelivery)>, SpoolError> {
        let txn = self.db()?.begin_read().map_err(storage)?;
        let table = txn.open_table(ENTRIES).map_err(storage)?;
        table
            .iter()
            .map_err(storage)?
            .take(limit)
            .map(|entry| {
                let (seq, value) = entry.map_err(storage)?;
                let seq = seq.value();
                Ok((seq, SpooledDelivery::decode(seq, value.value())?))
            })
            .collect()
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
            let (mut entries_freed, mut bytes_freed) = (0, 0);
            {
                let mut entries = txn.open_table(ENTRIES).map_err(storage)?;
                let mut by_delivery = txn.open_table(BY_DELIVERY).map_err(storage)?;
                for (seq, key) in &done {
                    if let Some(value) = entries.remove(*seq).map_err(storage)? {
                        entries_freed += 1;
                        bytes_freed += value.value().len() as u64;
                    }
                    by_delivery.remove(key.as_str()).map_err(storage)?;
                }
            }
            txn.commit().map_err(storage)?;
            Ok((entries_freed, bytes_freed))
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
        self.inner
            .counts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
    }
}

fn unix_minute(at: OffsetDateTime) -> i64 {
    at.unix_timestamp().div_euclid(60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn config(dir: &Path, max_entries: u64) -> SpoolConfig {
        SpoolConfig {
            path: dir.join("spool.redb"),
            max_bytes: 1 << 20,
            max_entries,
        }
    }

    fn delivery(id: &str) -> SpooledDelivery {
        SpooledDelivery {
            key: DeliveryKey::new(ProviderKind::ReceiptRoller, id),
            source: Source {
                provider: ProviderKind::ReceiptRoller,
                name: "main".into(),
                account: Some("acme".into()),
            },
            delivery_id: id.into(),
            received_at: datetime!(2026-11-29 10:15:30.123456 UTC),
            body: Bytes::from_static(b"{\"id\":\"x\"}\n\xff raw"),
        }
    }

    #[tokio::test]
    async fn entries_come_back_oldest_first_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&config(dir.path(), 10)).unwrap();
        for id in ["a", "b", "c"] {
            spool.append(&delivery(id)).await.unwrap();
        }
        assert!(spool.contains(&delivery("b").key).unwrap());
        assert!(!spool.contains(&delivery("z").key).unwrap());
        drop(spool);
        let spool = Spool::open(&config(dir.path(), 10)).unwrap();
        let oldest = spool.oldest(10).unwrap();
        let ids: Vec<&str> = oldest.iter().map(|(_, d)| d.delivery_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(
            oldest[0].1,
            delivery("a"),
            "every field comes back as written"
        );
        assert_eq!(spool.stats().entries, 3);
        spool
            .remove(vec![(oldest[0].0, delivery("a").key)])
            .await
            .unwrap();
        assert!(!spool.contains(&delivery("a").key).unwrap());
        assert_eq!(spool.stats().entries, 2);
        spool.append(&delivery("d")).await.unwrap();
        assert_eq!(
            spool.delivery_ids(),
            ["b", "c", "d"],
            "a new entry goes after the old ones"
        );
    }

    #[tokio::test]
    async fn beyond_its_bound_the_spool_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(&config(dir.path(), 2)).unwrap();
        spool.append(&delivery("a")).await.unwrap();
        spool.append(&delivery("b")).await.unwrap();
        assert!(!spool.stats().has_room);
        assert!(matches!(
            spool.append(&delivery("c")).await,
            Err(SpoolError::Full { entries: 2, .. })
        ));
        assert!(!spool.contains(&delivery("c").key).unwrap());
    }
}
