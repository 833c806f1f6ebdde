//! A test double of the store: a real embedded ledger whose writes the
//! unit tests fail on command ([`super::Backend::Failing`]).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::adapters::ledger::{
    Begin, Commit, EmbeddedLedger, EntityLock, EntitySlot, Exclusive, FillToken, GenerationMark,
    Held, LedgerError, RebuildLock, Remembered, Store,
};
use crate::domain::event::DeliveryKey;
use crate::domain::guard::EntityState;

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

impl Store for FailingWrites {
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        if self.failing.load(Ordering::Acquire) {
            return Err(LedgerError::Closed);
        }
        self.ledger.begin(delivery).await
    }
    async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.ledger.begin_again(delivery).await
    }
    async fn release(&self, delivery: &DeliveryKey) {
        self.ledger.release(delivery).await;
    }
    async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        self.locks_asked.send_modify(|asked| *asked += 1);
        self.ledger.lock_and_read(slot).await
    }
    async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        self.ledger.remembered(delivery).await
    }
    async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        self.ledger.entity(slot).await
    }
    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.ledger.checkpoint(name).await
    }
    async fn generation_mark(&self) -> Result<Option<GenerationMark>, LedgerError> {
        self.ledger.generation_mark().await
    }
    async fn mark_generation(&self, filled_at: i64) -> Result<(), LedgerError> {
        self.ledger.mark_generation(filled_at).await
    }
    async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        self.ledger.fill_token().await
    }
    async fn begin_fill(&self) -> Result<FillToken, LedgerError> {
        self.ledger.begin_fill().await
    }
    async fn exclusive(&self, task: Exclusive) -> Result<Option<RebuildLock>, LedgerError> {
        self.ledger.exclusive(task).await
    }
    async fn commit(&self, commit: &Commit) -> Result<(), LedgerError> {
        if self.failing.load(Ordering::Acquire) {
            return Err(LedgerError::Closed);
        }
        self.ledger.commit(commit).await
    }
    async fn reopen(&self) -> Result<(), LedgerError> {
        self.ledger.reopen().await
    }
    async fn forget_topics(&self) -> Result<(), LedgerError> {
        self.ledger.forget_topics().await
    }
    async fn kept_writes(&self) -> Result<(), LedgerError> {
        self.ledger.kept_writes().await
    }
    fn sending(&self) -> crate::adapters::ledger::Sending {
        self.ledger.sending()
    }
    async fn persist(&self) -> Result<(), LedgerError> {
        self.ledger.persist().await
    }
    async fn cached(&self) -> Result<Option<crate::adapters::ledger::Cached>, LedgerError> {
        self.ledger.cached().await
    }
    fn restore(
        &self,
        offsets: &crate::adapters::ledger::Offsets,
        topics: &crate::adapters::ledger::TopicsSeen,
    ) {
        self.ledger.restore(offsets, topics);
    }
    async fn check(&self) -> Result<(), LedgerError> {
        self.ledger.check().await
    }
}
