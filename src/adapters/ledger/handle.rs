//! The ledger every service uses: a [`Store`] behind its [`Gate`] and its
//! [`Fence`], in one place.
//!
//! Two rules stand between a caller and the store, each with its state
//! here: the gate (closed while the ledger is filled from the topics:
//! nothing is decided on a ledger that does not hold what they say yet)
//! and the fence (up after a write failed: nothing new is taken until the
//! failed writes are made). The line's calls pass both, in that order; the
//! fill's calls ([`Ledger::fill`]) pass only the fence, since the fill is
//! what opens the gate; a reader's ([`Ledger::read`]) pass neither, since
//! a read decides and writes nothing.
//!
//! The rules are applied in one place each, not by the methods: a call of
//! the line goes through [`Ledger::decided`] (the gate waited for, the
//! fence passed, a write's outcome shown to the fence, a ledger found lost
//! asked again once it is filled), a call of the fill through
//! [`Fill::fenced`]; a method added to a face says which it goes through.
//! Some of the line's calls pass fewer rules on purpose, each saying why:
//! `commit` is not held back by the gate (what it records is in a topic
//! already), `release` and `sending` pass neither (they end or begin what
//! a call past both started), `lock_and_read` looks at the fence twice.

use std::future::Future;
use std::sync::Arc;

use super::fence::Fence;
use super::{
    Backend, Begin, Cached, Commit, EntityLock, EntitySlot, EntityState, Exclusive, FillToken,
    Gate, GenerationMark, Held, LedgerError, Offsets, Progress, RebuildLock, Remembered, Sending,
    Store, TopicsSeen,
};
use crate::domain::event::DeliveryKey;

/// A store behind its gate and its fence. See the module documentation.
pub struct Ledger {
    // Dropped first: the commits it keeps hold their sends open, which the
    // store's last checkpoint would otherwise wait for.
    fence: Fence,
    store: Arc<Backend>,
    gate: Arc<Gate>,
}

/// What a call of the line does to the store, for the fence: a write's
/// failure raises it, a read's does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Reads,
    Writes,
}

impl Ledger {
    /// `store` behind `gate` and a lowered fence.
    pub fn new(store: Arc<Backend>, gate: Arc<Gate>) -> Ledger {
        Ledger {
            fence: Fence::new(),
            store,
            gate,
        }
    }

    /// Looks up a delivery id and, when it is new, takes a lease on it.
    ///
    /// # Errors
    /// [`LedgerError::Rebuilding`] while the gate stays closed,
    /// [`LedgerError::Unwritable`] while the fence is up, or the store's
    /// error.
    pub async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        // A lease is a write.
        self.decided(Call::Writes, || self.store.begin(delivery))
            .await
    }

    /// Takes a delivery's lease whether or not it is done: `New` when taken,
    /// `InFlight` when another attempt holds it (never `Done`). For putting a
    /// dead letter through again, whose delivery was marked done when it was
    /// dead-lettered; the lease still keeps it from racing a live delivery
    /// of the same id.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.decided(Call::Writes, || self.store.begin_again(delivery))
            .await
    }

    /// The rules of a call of the line, around `call`: waits for the gate
    /// to open, passes the fence, shows a write's outcome to the fence, and
    /// asks once more when the store was found lost and filled again
    /// meanwhile (the gate's wait).
    async fn decided<T, F>(&self, call: Call, ask: impl Fn() -> F) -> Result<T, LedgerError>
    where
        F: Future<Output = Result<T, LedgerError>>,
    {
        self.gated(|| self.fenced(call, &ask)).await
    }

    /// The gate's part of [`Ledger::decided`] around `ask`, which passes
    /// the fence itself: waits for the gate to open, and asks once more
    /// when the store was found lost and filled again meanwhile.
    async fn gated<T, F>(&self, ask: impl Fn() -> F) -> Result<T, LedgerError>
    where
        F: Future<Output = Result<T, LedgerError>>,
    {
        self.gate.wait_open().await?;
        let first = ask().await;
        if self.gate.again(&first).await? {
            return self.gate.saw(ask().await);
        }
        first
    }

    /// `ask` past the fence, its outcome shown to the fence if it writes.
    async fn fenced<T, F>(&self, call: Call, ask: &impl Fn() -> F) -> Result<T, LedgerError>
    where
        F: Future<Output = Result<T, LedgerError>>,
    {
        self.fence.open(self.store.as_ref()).await?;
        let result = ask().await;
        if call == Call::Writes {
            self.fence.saw_write(&result);
        }
        result
    }

    /// Gives a lease back without marking the delivery done, so the
    /// provider's retry is processed. Past neither rule: it ends a lease
    /// `begin` took past both, and must end it even behind a raised fence.
    pub async fn release(&self, delivery: &DeliveryKey) {
        self.store.release(delivery).await;
    }

    /// Takes the entity's lock, then reads its state under it: the guard's
    /// two steps. The state is read after the fence was seen down *and*
    /// under the lock: the holder this call waited for may have published
    /// and failed to commit, its newer state kept only in the fence. Checked
    /// before the lock (one round trip for both on Redis), then again once
    /// it is held, reading the state anew if a commit failed meanwhile.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        self.gated(|| self.lock_and_read_fenced(slot)).await
    }

    /// [`Ledger::lock_and_read`] past the fence.
    async fn lock_and_read_fenced(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        let failures = self.fence.failures();
        self.fence.open(self.store.as_ref()).await?;
        let (lock, state) = self.store.lock_and_read(slot).await?;
        if self.fence.failures() == failures {
            return Ok((lock, state));
        }
        self.fence.open(self.store.as_ref()).await?;
        let state = self.store.entity(slot).await?.map(|held| held.state);
        Ok((lock, state))
    }

    /// The latest state written for an entity, if any (a dry run's guard).
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        self.decided(Call::Reads, || self.store.entity(slot)).await
    }

    /// What the ledger knows of a delivery id: in flight, done with what it
    /// was answered, or nothing (a lookup).
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        self.decided(Call::Reads, || self.store.remembered(delivery))
            .await
    }

    /// A reconciler's or a replay's checkpoint: the unix second up to which
    /// a window was completely read, if any run finished a step yet.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.decided(Call::Reads, || self.store.checkpoint(name))
            .await
    }

    /// Takes the lock of a `posbridge rederive` run that moves its
    /// checkpoints ([`Store::exclusive`]): `None` while another process
    /// sharing the store runs one.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn rederive_lock(&self) -> Result<Option<RebuildLock>, LedgerError> {
        self.decided(Call::Reads, || self.store.exclusive(Exclusive::Rederive))
            .await
    }

    /// Makes an outcome durable, then ends the delivery's lease. Not held
    /// back by a closed gate: what it records is in a topic already.
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails or the fence is up: the commit
    /// is kept and written when the fence is lowered, and the lease given
    /// back.
    pub async fn commit(&self, commit: Commit) -> Result<(), LedgerError> {
        self.fence.commit(self.store.as_ref(), commit).await
    }

    /// Starts a send whose outcome will be committed here: held until the
    /// commit is made, so a checkpoint never records an offset past a
    /// record whose state it does not hold ([`super::placements`]). Past
    /// neither rule: it reads and writes nothing, it only counts.
    pub fn sending(&self) -> Sending {
        self.store.sending()
    }

    /// Makes every commit so far durable now, with the offsets they are of
    /// (shutdown, and the end of a fill).
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails.
    pub async fn persist(&self) -> Result<(), LedgerError> {
        self.store.persist().await
    }

    /// Whether the ledger decides now, for `/readyz`: the gate open, the
    /// fence down, and the store answering. On Redis the store's check
    /// writes, as `begin` does, so a store that took writes again is seen
    /// at the next `/readyz` even while no delivery arrives; on the
    /// embedded store it only reads.
    ///
    /// # Errors
    /// [`LedgerError`] saying why not.
    pub async fn check(&self) -> Result<(), LedgerError> {
        self.gate.check_open()?;
        self.fence.open(self.store.as_ref()).await?;
        let checked = self.store.check().await;
        self.fence.saw_write(&checked);
        self.gate.saw(checked)
    }

    /// Where the ledger's fill from the topics stands.
    pub fn rebuild_progress(&self) -> Progress {
        self.gate.snapshot()
    }

    /// The calls of the fill, which opens the gate: past the fence only.
    pub fn fill(&self) -> Fill<'_> {
        Fill { ledger: self }
    }

    /// The calls of a reader (a lookup): past neither rule.
    pub fn read(&self) -> Read<'_> {
        Read { ledger: self }
    }
}

/// The ledger as a reader sees it: what the store holds now. A reader
/// decides nothing, so it waits for no gate (a lookup answers while the
/// ledger is being filled, or while Kafka is away and the fill cannot
/// end, and says so with [`Read::filled`]) and passes no fence (it writes
/// nothing; a commit the fence keeps is not in the store yet).
pub struct Read<'a> {
    ledger: &'a Ledger,
}

impl Read<'_> {
    /// Whether the ledger holds what the topics say: its gate is open. While
    /// it is not, the last records' outcomes may be missing.
    pub fn filled(&self) -> bool {
        self.ledger.gate.is_open()
    }

    /// What the store knows of a delivery id.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    pub async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        self.ledger.store.remembered(delivery).await
    }

    /// The state the store holds for an entity.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    pub async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        self.ledger.store.entity(slot).await
    }

    /// A named checkpoint as the store holds it now. For what is recorded
    /// beside the topics' cache and not read back from them (which source
    /// owns an account), read at start-up before the fill opens the gate.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    pub async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.ledger.store.checkpoint(name).await
    }

    /// What the store holds of the topics ([`Store::cached`]): the topics a
    /// reader looks in beside the configured ones.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    pub async fn cached(&self) -> Result<Option<Cached>, LedgerError> {
        self.ledger.store.cached().await
    }
}

/// The ledger as the fill uses it, before the gate opens: every call goes
/// past the fence (a store that cannot write fails the fill, which is
/// tried again), none waits for the gate.
pub struct Fill<'a> {
    ledger: &'a Ledger,
}

impl Fill<'_> {
    fn store(&self) -> &Backend {
        self.ledger.store.as_ref()
    }

    /// The fill's rule around `ask`: past the fence (a store that cannot
    /// write fails the fill, which is tried again), no gate (the fill is
    /// what opens it).
    async fn fenced<T, F>(&self, ask: impl FnOnce() -> F) -> Result<T, LedgerError>
    where
        F: Future<Output = Result<T, LedgerError>>,
    {
        self.ledger.fence.open(self.store()).await?;
        ask().await
    }

    /// The state held for an entity, if any.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the store cannot be read.
    pub async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        self.fenced(|| self.store().entity(slot)).await
    }

    /// Writes what the topics say ([`Ledger::commit`]).
    ///
    /// # Errors
    /// As [`Ledger::commit`].
    pub async fn commit(&self, commit: Commit) -> Result<(), LedgerError> {
        self.ledger.commit(commit).await
    }

    /// Makes every write so far durable, with the offsets it is of.
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails.
    pub async fn persist(&self) -> Result<(), LedgerError> {
        self.store().persist().await
    }

    /// What the store holds of the topics ([`Store::cached`]).
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    pub async fn cached(&self) -> Result<Option<Cached>, LedgerError> {
        self.store().cached().await
    }

    /// What the fill read the topics up to, and what they are.
    pub fn restore(&self, offsets: &Offsets, topics: &TopicsSeen) {
        self.store().restore(offsets, topics);
    }

    /// Forgets everything the store holds of the topics
    /// ([`Store::forget_topics`]), and the commits the fence keeps of them.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be written.
    pub async fn forget_topics(&self) -> Result<(), LedgerError> {
        self.ledger.fence.forget_pending();
        self.store().forget_topics().await
    }

    /// Whether the store still holds every write made to it
    /// ([`Store::kept_writes`]).
    ///
    /// # Errors
    /// [`LedgerError::Lost`], [`LedgerError::Changed`], or why the store
    /// cannot be asked.
    pub async fn kept_writes(&self) -> Result<(), LedgerError> {
        self.store().kept_writes().await
    }

    /// The store's generation mark ([`Store::generation_mark`]).
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the store cannot be read.
    pub async fn generation_mark(&self) -> Result<Option<GenerationMark>, LedgerError> {
        self.fenced(|| self.store().generation_mark()).await
    }

    /// Marks the store filled from the topics by a fill that began at
    /// `filled_at` (unix seconds).
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the write fails.
    pub async fn mark_generation(&self, filled_at: i64) -> Result<(), LedgerError> {
        self.fenced(|| self.store().mark_generation(filled_at))
            .await
    }

    /// The token of the last fill into a store without the mark.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the store cannot be read.
    pub async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        self.fenced(|| self.store().fill_token()).await
    }

    /// Writes a new token for a fill that begins, and hands it over.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the write fails.
    pub async fn begin_fill(&self) -> Result<FillToken, LedgerError> {
        self.fenced(|| self.store().begin_fill()).await
    }

    /// Takes the lock a whole fill holds ([`Store::exclusive`]), waiting
    /// while another process holds it.
    ///
    /// # Errors
    /// [`LedgerError`] when a shared lock cannot be reached.
    pub async fn rebuild_lock(&self) -> Result<RebuildLock, LedgerError> {
        let held = self.store().exclusive(Exclusive::Fill).await?;
        Ok(held.expect("the fill's lock is waited for, never refused"))
    }

    /// Whether the store itself refuses an entity state older than the one
    /// it holds ([`Store::refuses_older_states`]).
    pub fn refuses_older_states(&self) -> bool {
        self.store().refuses_older_states()
    }
}
