//! A spool file redb refuses (damaged pages, empty, not a database): set
//! aside (`store_file::set_aside`), and every intact entry found in its
//! bytes written to a new spool file at the same path, so that posbridge
//! serves and the deliveries the old file still holds are published. And a
//! spool file redb repaired by rolling it back to an earlier commit (its
//! last commits' pages damaged, after an unclean stop): the deliveries the
//! commits after it appended, each answered 2xx, are gone from its tables
//! but their pages are still in the file (what the repair did not write
//! over), so every intact entry found there that the spool does not hold
//! is added to it.
//!
//! redb keeps each value whole in one page, so each entry's frame
//! (`frame.rs`) lies in the file as it was written: the salvage finds each
//! frame by its magic and keeps those whose checksum verifies, one per
//! delivery key, in the order they arrived. Entries written before frames
//! existed have no magic and are not found.
//!
//! The bytes also hold pages redb freed: older copies of entries drained
//! since (removed once their outcome was durable). Salvaging those too is
//! harmless: drained again, each is found done in the ledger (a duplicate,
//! removed), or, past `ledger.dedup_ttl_secs`, the guard finds its state in
//! the ledger already (unchanged) or a newer one (stale), so nothing is
//! published twice or over a newer state. A damaged frame cannot be told
//! apart from a damaged old copy: each goes to the quarantine, counted and
//! alerted on like a damaged entry of the spool's table.
//!
//! The file is read whole: once, at a start that found it damaged; it is
//! about `spool.max_bytes` at most, plus the pages redb freed.

use std::collections::HashSet;
use std::path::Path;

use redb::{Database, ReadableTable as _};
use tracing::error;

use super::entry::HEADER_START;
use super::frame::{self, Damage, Found};
use super::quarantine::Quarantine;
use super::{BY_DELIVERY, Counts, ENTRIES, SpoolError, SpooledDelivery};
use crate::adapters::store_file::{self, Disk, Integrity, StoreFileError};

/// What a salvage found in a damaged file's bytes.
#[derive(Debug, Default)]
pub(super) struct Salvaged {
    /// The intact deliveries, one per key, oldest first.
    pub(super) deliveries: Vec<SpooledDelivery>,
    /// Frames that did not verify (or whose header did not decode), with
    /// their bytes as found.
    pub(super) damaged: Vec<(Damage, Vec<u8>)>,
}

impl Salvaged {
    pub(super) fn from_bytes(bytes: &[u8]) -> Salvaged {
        let mut salvaged = Salvaged::default();
        let mut keys = HashSet::new();
        // Where each frame found lies, so that an entry header outside all
        // of them (its frame's header damaged away) is found too.
        let mut spans = Vec::new();
        let at = |part: &[u8]| part.as_ptr() as usize - bytes.as_ptr() as usize;
        for found in frame::scan(bytes) {
            match found {
                Found::Intact(payload) => {
                    spans.push(
                        at(payload).saturating_sub(frame::HEADER_LEN)..at(payload) + payload.len(),
                    );
                    match SpooledDelivery::from_payload(payload) {
                        Ok(delivery) => {
                            if keys.insert(delivery.key.as_str().to_owned()) {
                                salvaged.deliveries.push(delivery);
                            }
                        }
                        Err(_) => salvaged.damaged.push((Damage::Header, payload.to_vec())),
                    }
                }
                Found::Damaged(damage, stored) => {
                    spans.push(at(stored)..at(stored) + stored.len());
                    salvaged.damaged.push((damage, stored.to_vec()));
                }
            }
        }
        for orphan in unframed(bytes, &spans) {
            salvaged.damaged.push((Damage::Unframed, orphan.to_vec()));
        }
        // Stable: copies found in file order keep it within one instant.
        salvaged
            .deliveries
            .sort_by_key(|delivery| delivery.received_at);
        salvaged
    }
}

/// Sets the damaged spool file at `path` aside, opens a new one there (on
/// its disk) and writes into it every intact entry found in the old one's
/// bytes. Said once, at ERROR, with what was salvaged and what was not.
///
/// # Errors
/// [`SpoolError::SetAside`] when the file cannot be renamed; the new
/// file's [`SpoolError::File`] or [`SpoolError::Open`] when it cannot be
/// made.
pub(super) fn recover(
    (path, disk): (&Path, &Disk),
    damage: StoreFileError,
    quarantine: &Quarantine,
) -> Result<(Database, Counts), SpoolError> {
    let aside = match store_file::set_aside(path) {
        Ok(aside) => aside,
        Err(source) => {
            return Err(SpoolError::SetAside {
                path: path.to_owned(),
                damage: Box::new(damage),
                source,
            });
        }
    };
    let (salvaged, unread) = match std::fs::read(&aside) {
        Ok(bytes) => (Salvaged::from_bytes(&bytes), None),
        Err(error) => (Salvaged::default(), Some(error)),
    };
    let db = store_file::open_with(path, Integrity::Check, disk)?;
    let mut counts = Counts::default();
    write(path, &db, &salvaged.deliveries, &mut counts)?;
    let damaged = keep_damaged(quarantine, &salvaged.damaged);
    error!(
        path = %path.display(),
        set_aside = %aside.display(),
        error = %damage,
        salvaged = salvaged.deliveries.len(),
        damaged,
        unread = unread.map(|error| error.to_string()),
        "The spool file is damaged: it was set aside, and the intact deliveries found in it are in a new spool file, published as it drains. Damaged entries (some may be old copies of deliveries published already) are in the quarantine, lost unless their provider sends them again or a reconcile over their time reads them."
    );
    Ok((db, counts))
}

/// Looks in the bytes of the spool file at `path`, which redb rolled back
/// to an earlier commit, for intact entries the spool `db` does not hold,
/// and adds them after its entries (they came after them). Said once, at
/// ERROR, with what was found.
///
/// # Errors
/// [`SpoolError::Open`] when they cannot be written.
pub(super) fn after_rollback(
    path: &Path,
    db: &Database,
    counts: &mut Counts,
    quarantine: &Quarantine,
) -> Result<(), SpoolError> {
    let (salvaged, unread) = match std::fs::read(path) {
        Ok(bytes) => (Salvaged::from_bytes(&bytes), None),
        Err(error) => (Salvaged::default(), Some(error)),
    };
    let added = write(path, db, &salvaged.deliveries, counts)?;
    let damaged = keep_damaged(quarantine, &salvaged.damaged);
    error!(
        path = %path.display(),
        added,
        damaged,
        unread = unread.map(|error| error.to_string()),
        "redb found damaged pages in the spool file and rolled it back to an earlier commit: the intact deliveries of the later commits found in the file are back in the spool (with older copies of deliveries drained before, which replay as duplicates); damaged ones are in the quarantine, lost unless their provider sends them again or a reconcile over their time reads them."
    );
    Ok(())
}

/// Keeps each damaged frame a salvage found in the quarantine, so that it
/// is counted (`posbridge_spool_quarantined_entries`) and alerted on, and
/// its bytes are there for a look: a damaged frame cannot be told from a
/// damaged old copy of a drained entry, and either means the disk changed
/// bytes. A damaged run that holds the header of another entry (the damage
/// took that entry's frame header, so the scan ran on into it) is kept as
/// one piece per entry, so that each lost entry is counted. How many; one
/// that cannot be kept is said and counted out.
fn keep_damaged(quarantine: &Quarantine, damaged: &[(Damage, Vec<u8>)]) -> usize {
    damaged
        .iter()
        .enumerate()
        .flat_map(|(index, (damage, stored))| {
            entries_in(stored)
                .into_iter()
                .enumerate()
                .map(move |(piece, bytes)| (format!("found-{index}-{piece}"), *damage, bytes))
        })
        .filter(|(label, damage, stored)| match quarantine.keep(label, None, stored, *damage) {
            Ok(_) => true,
            Err(error) => {
                error!(%error, "A damaged spool frame found by the salvage cannot be kept in the quarantine.");
                false
            }
        })
        .count()
}

/// The entry headers in `bytes` that lie in none of the frames found
/// (`spans`, in file order, apart), each with its bytes up to the next
/// frame or header (at most [`frame::DAMAGED_KEPT`]).
fn unframed<'a>(bytes: &'a [u8], spans: &[std::ops::Range<usize>]) -> Vec<&'a [u8]> {
    let starts: Vec<usize> = memchr::memmem::find_iter(bytes, HEADER_START).collect();
    let after = |from: usize| {
        let span = spans.partition_point(|span| span.start <= from);
        let header = starts.partition_point(|start| *start <= from);
        (span, header)
    };
    starts
        .iter()
        .filter(|start| {
            let (span, _) = after(**start);
            span == 0 || !spans[span - 1].contains(start)
        })
        .map(|start| {
            let (span, header) = after(*start);
            let end = [
                spans.get(span).map(|s| s.start),
                starts.get(header).copied(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(bytes.len())
            .min(start + frame::DAMAGED_KEPT);
            &bytes[*start..end]
        })
        .collect()
}

/// A damaged run of bytes cut before each entry header it holds past its
/// own frame's header: one piece per entry the damage reached.
pub(super) fn entries_in(stored: &[u8]) -> Vec<&[u8]> {
    let mut starts = vec![0];
    starts.extend(
        memchr::memmem::find_iter(stored, HEADER_START)
            .filter(|at| *at > frame::HEADER_LEN)
            .map(|at| at - frame::HEADER_LEN)
            .filter(|start| *start > 0),
    );
    starts.dedup();
    starts
        .iter()
        .zip(starts.iter().skip(1).chain([&stored.len()]))
        .map(|(from, to)| &stored[*from..(*to).max(*from)])
        .collect()
}

/// Writes the `deliveries` whose key the spool `db` does not hold after
/// what it holds (`counts`, updated), durably, in one commit; how many.
fn write(
    path: &Path,
    db: &Database,
    deliveries: &[SpooledDelivery],
    counts: &mut Counts,
) -> Result<u64, SpoolError> {
    let fail = super::opening_error(path);
    let mut written = 0;
    let txn = db.begin_write().map_err(|e| fail(e.into()))?;
    {
        let mut entries = txn.open_table(ENTRIES).map_err(|e| fail(e.into()))?;
        let mut by_delivery = txn.open_table(BY_DELIVERY).map_err(|e| fail(e.into()))?;
        for delivery in deliveries {
            let key = delivery.key.as_str();
            if by_delivery.get(key).map_err(|e| fail(e.into()))?.is_some() {
                continue;
            }
            let stored = delivery.encode();
            let seq = counts.next_seq;
            entries
                .insert(seq, stored.as_slice())
                .map_err(|e| fail(e.into()))?;
            by_delivery.insert(key, seq).map_err(|e| fail(e.into()))?;
            counts.entries += 1;
            counts.bytes += stored.len() as u64;
            counts.next_seq += 1;
            written += 1;
        }
    }
    txn.commit().map_err(|e| fail(e.into()))?;
    Ok(written)
}
