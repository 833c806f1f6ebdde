//! A test double of the store: a real embedded ledger whose writes the
//! unit tests fail on command ([`super::Backend::Failing`]: every call goes
//! to the real store, past the two hooks here).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::adapters::ledger::{EmbeddedLedger, LedgerError};

/// A real embedded ledger whose writes (leases, commits) fail while
/// `failing` is set: the full disk of `tests/it/ledger_full.rs`, or a
/// Redis refusing writes, at the one moment a test needs. Every call a
/// test does not fail goes to the real store.
pub struct FailingWrites {
    pub(crate) ledger: EmbeddedLedger,
    pub(crate) failing: AtomicBool,
    /// Calls that asked for an entity's lock so far (the holder's and
    /// those waiting behind it): what a test waits for, instead of a
    /// sleep that passes whether or not a waiter got there.
    pub(crate) locks_asked: tokio::sync::watch::Sender<usize>,
}

impl FailingWrites {
    /// Before a write (a lease, a commit): refused while `failing` is set.
    pub(crate) fn write(&self) -> Result<(), LedgerError> {
        if self.failing.load(Ordering::Acquire) {
            return Err(LedgerError::Closed);
        }
        Ok(())
    }

    /// Before an entity's lock is asked for: counted.
    pub(crate) fn lock_asked(&self) {
        self.locks_asked.send_modify(|asked| *asked += 1);
    }
}
