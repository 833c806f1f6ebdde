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
//! Each face's methods forward to the [`Store`] by hand, each calling the
//! rules its face keeps (`gate.wait_open`, `fence.open`): a method added
//! to a face must call them too. Some of the line's calls skip one on
//! purpose, each saying why: `commit` is not held back by the gate (what
//! it records is in a topic already), `release` and `sending` pass neither
//! (they end or begin what a call past both started).

use std::sync::Arc;

use super::fence::Fence;
use super::{
    Begin, Cached, Commit, EntityLock, EntitySlot, EntityState, Exclusive, FillToken, Gate,
    GenerationMark, Held, LedgerError, Offsets, Progress, RebuildLock, Remembered, Sending, Store,
    TopicsSeen,
};
use crate::domain::event::DeliveryKey;

/// A store behind its gate and its fence. See the module documentation.
pub struct Ledger {
    store: Arc<dyn Store>,
    gate: Arc<Gate>,
    fence: Fence,
}

/// Whether `begin` may find a delivery done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leasing {
    /// A delivery: a done one is not leased ([`Begin::Done`]).
    New,
    /// A dead letter put through again: leased whether done or not.
    Again,
}

impl Ledger {
    /// `store` behind `gate` and a lowered fence.
    pub fn new(store: Arc<dyn Store>, gate: Arc<Gate>) -> Ledger {
        Ledger {
            store,
            gate,
            fence: Fence::new(),
        }
    }

    /// Looks up a delivery id and, when it is new, takes a lease on it.
    ///
    /// # Errors
    /// [`LedgerError::Rebuilding`] while the gate stays closed,
    /// [`LedgerError::Unwritable`] while the fence is up, or the store's
    /// error.
    pub async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        self.gate.wait_open().await?;
        let begun = self.begin_fenced(delivery, Leasing::New).await;
        if self.gate.again(&begun).await? {
            return self
                .gate
                .saw(self.begin_fenced(delivery, Leasing::New).await);
        }
        begun
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
        self.gate.wait_open().await?;
        self.gate
            .saw(self.begin_fenced(delivery, Leasing::Again).await)
    }

    /// A lease is a write: the fence sees whether it worked.
    async fn begin_fenced(
        &self,
        delivery: &DeliveryKey,
        leasing: Leasing,
    ) -> Result<Begin, LedgerError> {
        self.fence.open(self.store.as_ref()).await?;
        let begun = match leasing {
            Leasing::New => self.store.begin(delivery).await,
            Leasing::Again => self.store.begin_again(delivery).await,
        };
        self.fence.saw_write(&begun);
        begun
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
        self.gate.wait_open().await?;
        let read = self.lock_and_read_fenced(slot).await;
        if self.gate.again(&read).await? {
            return self.gate.saw(self.lock_and_read_fenced(slot).await);
        }
        read
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
        self.gate.wait_open().await?;
        self.fence.open(self.store.as_ref()).await?;
        self.gate.saw(self.store.entity(slot).await)
    }

    /// What the ledger knows of a delivery id: in flight, done with what it
    /// was answered, or nothing (a lookup).
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        self.gate.wait_open().await?;
        self.fence.open(self.store.as_ref()).await?;
        self.gate.saw(self.store.remembered(delivery).await)
    }

    /// A reconciler's or a replay's checkpoint: the unix second up to which
    /// a window was completely read, if any run finished a step yet.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.gate.wait_open().await?;
        self.fence.open(self.store.as_ref()).await?;
        self.store.checkpoint(name).await
    }

    /// Takes the lock of a `posbridge rederive` run that moves its
    /// checkpoints ([`Store::exclusive`]): `None` while another process
    /// sharing the store runs one.
    ///
    /// # Errors
    /// As [`Ledger::begin`].
    pub async fn rederive_lock(&self) -> Result<Option<RebuildLock>, LedgerError> {
        self.gate.wait_open().await?;
        self.store.exclusive(Exclusive::Rederive).await
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
    fn store(&self) -> &dyn Store {
        self.ledger.store.as_ref()
    }

    async fn open(&self) -> Result<(), LedgerError> {
        self.ledger.fence.open(self.store()).await
    }

    /// The state held for an entity, if any.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the store cannot be read.
    pub async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        self.open().await?;
        self.store().entity(slot).await
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
        self.open().await?;
        self.store().generation_mark().await
    }

    /// Marks the store filled from the topics.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the write fails.
    pub async fn mark_generation(&self, mark: GenerationMark) -> Result<(), LedgerError> {
        self.open().await?;
        self.store().mark_generation(mark).await
    }

    /// The token of the last fill into a store without the mark.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the store cannot be read.
    pub async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        self.open().await?;
        self.store().fill_token().await
    }

    /// Writes the token of a fill that begins.
    ///
    /// # Errors
    /// [`LedgerError`] when the fence is up or the write fails.
    pub async fn begin_fill(&self, token: FillToken) -> Result<(), LedgerError> {
        self.open().await?;
        self.store().begin_fill(token).await
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
