//! The configured store: an enum over the backends rather than a trait
//! object, so that a delivery's calls into the store (its lease, its
//! entity's lock and state, its commit) are the backend's own futures, not
//! a box allocated for each call.

use super::{
    Begin, Cached, Commit, EmbeddedLedger, EntityLock, EntitySlot, Exclusive, FillToken,
    GenerationMark, Held, LedgerError, Offsets, RebuildLock, RedisLedger, Remembered, Sending,
    Store, TopicsSeen,
};
use crate::domain::event::DeliveryKey;
use crate::domain::guard::EntityState;

/// One of the stores a [`super::Ledger`] stands in front of.
pub enum Backend {
    /// redb, in one file.
    Embedded(EmbeddedLedger),
    /// Redis, shared by a fleet of replicas.
    Redis(RedisLedger),
    /// An embedded store whose writes the unit tests fail on command: its
    /// calls go to that store, past the double's hooks (a write refused, a
    /// lock counted).
    #[cfg(test)]
    Failing(std::sync::Arc<super::failing::FailingWrites>),
}

/// The future `$call` makes on whichever backend `$backend` is (named
/// `$store`), awaited. A Redis call's is boxed: its future is large, a
/// delivery's task would otherwise hold it inline and the spawn copies that
/// whole, and beside the call's round trip the allocation is nothing.
macro_rules! each {
    ($backend:expr, $store:ident => $call:expr) => {
        match $backend {
            Backend::Embedded($store) => $call.await,
            Backend::Redis($store) => Box::pin($call).await,
            #[cfg(test)]
            Backend::Failing(double) => {
                let $store = &double.ledger;
                $call.await
            }
        }
    };
}

/// `$call` on whichever backend `$backend` is, named `$store`.
macro_rules! each_now {
    ($backend:expr, $store:ident => $call:expr) => {
        match $backend {
            Backend::Embedded($store) => $call,
            Backend::Redis($store) => $call,
            #[cfg(test)]
            Backend::Failing(double) => {
                let $store = &double.ledger;
                $call
            }
        }
    };
}

impl Store for Backend {
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        #[cfg(test)]
        if let Backend::Failing(double) = self {
            double.write()?;
        }
        each!(self, store => store.begin(delivery))
    }

    async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        each!(self, store => store.begin_again(delivery))
    }

    async fn release(&self, delivery: &DeliveryKey) {
        each!(self, store => store.release(delivery));
    }

    async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        #[cfg(test)]
        if let Backend::Failing(double) = self {
            double.lock_asked();
        }
        each!(self, store => store.lock_and_read(slot))
    }

    async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        each!(self, store => store.remembered(delivery))
    }

    async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        each!(self, store => store.entity(slot))
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        each!(self, store => store.checkpoint(name))
    }

    async fn commit(&self, commit: &Commit) -> Result<(), LedgerError> {
        #[cfg(test)]
        if let Backend::Failing(double) = self {
            double.write()?;
        }
        each!(self, store => store.commit(commit))
    }

    fn sending(&self) -> Sending {
        each_now!(self, store => store.sending())
    }

    async fn persist(&self) -> Result<(), LedgerError> {
        each!(self, store => store.persist())
    }

    async fn reopen(&self) -> Result<(), LedgerError> {
        each!(self, store => store.reopen())
    }

    async fn cached(&self) -> Result<Option<Cached>, LedgerError> {
        each!(self, store => store.cached())
    }

    fn restore(&self, offsets: &Offsets, topics: &TopicsSeen) {
        each_now!(self, store => store.restore(offsets, topics));
    }

    async fn forget_topics(&self) -> Result<(), LedgerError> {
        each!(self, store => store.forget_topics())
    }

    async fn kept_writes(&self) -> Result<(), LedgerError> {
        each!(self, store => store.kept_writes())
    }

    async fn generation_mark(&self) -> Result<Option<GenerationMark>, LedgerError> {
        each!(self, store => store.generation_mark())
    }

    async fn mark_generation(&self, filled_at: i64) -> Result<(), LedgerError> {
        each!(self, store => store.mark_generation(filled_at))
    }

    async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        each!(self, store => store.fill_token())
    }

    async fn begin_fill(&self) -> Result<FillToken, LedgerError> {
        each!(self, store => store.begin_fill())
    }

    async fn exclusive(&self, task: Exclusive) -> Result<Option<RebuildLock>, LedgerError> {
        each!(self, store => store.exclusive(task))
    }

    fn refuses_older_states(&self) -> bool {
        each_now!(self, store => store.refuses_older_states())
    }

    async fn check(&self) -> Result<(), LedgerError> {
        each!(self, store => store.check())
    }
}
