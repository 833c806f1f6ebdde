//! Appends in doubt. An append whose commit failed was answered 503, yet
//! its entry may be in the file: redb says the changes of a failed commit
//! land fully or not at all and "may already have become durable". Once
//! the file is reopened (a heal), reads find the entry if its writes
//! reached the page cache, whether or not they reached the disk: a failed
//! fsync does not say which did. Such an entry is no ground for answering
//! the provider's retry `duplicate`, a 2xx a crash could then take back
//! (the simulation's seed 13924).
//!
//! So the spool remembers each failed append's entry until the heal that
//! makes it writable again takes the entry out, durably, in the probe's
//! commit (`health.rs`); no append is taken before that heal, and
//! [`Spool::contains`](super::Spool::contains) does not count the delivery
//! meanwhile. After a heal the file holds what appends that worked wrote,
//! and the retry is taken anew: published, or spooled by an append of its
//! own. (A drainer's pass may publish the entry first, read through the
//! reopened handle: the retry is then a duplicate the ledger knows.)

use crate::domain::event::DeliveryKey;

/// The entries of appends that failed since the last heal: sequence
/// number and delivery.
#[derive(Debug, Default)]
pub(super) struct InDoubt(Vec<(u64, DeliveryKey)>);

impl InDoubt {
    /// The append of `key` as entry `seq` failed.
    pub(super) fn failed(&mut self, seq: u64, key: DeliveryKey) {
        self.0.push((seq, key));
    }

    /// Whether an append of `key` is in doubt.
    pub(super) fn holds(&self, key: &DeliveryKey) -> bool {
        self.0.iter().any(|(_, doubted)| doubted == key)
    }

    /// The entries in doubt, for a heal to take out.
    pub(super) fn entries(&self) -> Vec<(u64, DeliveryKey)> {
        self.0.clone()
    }

    /// `taken` are out of the file, durably: no longer in doubt.
    pub(super) fn taken_out(&mut self, taken: &[(u64, DeliveryKey)]) {
        self.0.retain(|entry| !taken.contains(entry));
    }
}
