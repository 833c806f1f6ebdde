//! The ledger: what posbridge must remember between deliveries.
//!
//! Five things, kept by a [`Store`] (the storage: an embedded one for one
//! process, a shared one for several replicas, interchangeable by config)
//! and used through one [`Ledger`], the store behind its gate and its fence:
//!
//! * delivery ids: *in flight* (a lease, so a concurrent duplicate never
//!   produces twice) and *done* (kept for `dedup_ttl`, so a late retry is
//!   answered 2xx without producing), a done id with what it was answered
//!   and where its record lies ([`Answered`]), for a lookup;
//! * each entity's latest written version and state hash, for the stale-event guard;
//! * a per-entity lock, so two events for one key are never guarded and
//!   published concurrently;
//! * the reconciler's checkpoints, so a restarted run resumes where the last stopped;
//! * what the rebuild needs of a shared store: its [`GenerationMark`], a
//!   fill's [`FillToken`] and the [`RebuildLock`].
//!
//! A delivery becomes done in the same write as its entity version
//! ([`Commit`]), so a crash cannot leave one recorded without the other.
//!
//! The [`Ledger`] keeps two rules a store alone cannot: nothing is decided
//! while it is being filled from the topics (its [`Gate`]), and nothing new
//! is taken once a write failed until the failed writes are made (its
//! fence). Every use goes through it: the line's calls pass both, the
//! fill's ([`Ledger::fill`]) only the fence, and no store is reached any
//! other way.
//!
//! The ledger is a cache of the topics: every record posbridge writes
//! carries its delivery id, entity version and state hash, so what a ledger
//! lost is read back from them (by the rebuild, a service above), from the offsets its last
//! checkpoint recorded ([`placements`]).

mod answered;
mod backend;
mod cached;
mod clock;
mod commit;
mod embedded;
#[cfg(test)]
mod failing;
mod fence;
mod gate;
mod handle;
mod held;
mod key_locks;
pub mod placements;
mod redis;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{LedgerBackend, LedgerConfig};
use crate::domain::event::{DeliveryKey, EntityKey, EntityType};
use crate::domain::guard::EntityState;

pub use answered::{Answered, Done, Recorded, Remembered};
pub use backend::Backend;
pub use cached::{Cached, TopicSeen, TopicsSeen};
pub use clock::WallClock;
pub use commit::Commit;
pub use embedded::{DEFAULT_CHECKPOINT_EVERY, EmbeddedLedger, LedgerCounts};
pub use gate::{Gate, Progress};
pub use handle::{Fill, Ledger};
pub use held::Held;
pub use placements::{Offsets, Placed, Sending};
pub use redis::RedisLedger;

impl LedgerError {
    /// Whether a handle holds the embedded ledger's file (redb admits one):
    /// another process (a running `serve`), or during a reopen this one's
    /// closing handle.
    pub fn is_held_elsewhere(&self) -> bool {
        matches!(
            self,
            LedgerError::File(crate::adapters::store_file::StoreFileError::Held { .. })
        )
    }
}

/// Why the ledger could not answer. Always retryable from the provider's
/// point of view: the delivery is answered 503 and stays retryable.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The store could not be opened (path, permissions, another process).
    #[error("cannot open ledger at {path}: {source}")]
    Open {
        /// The file or URL.
        path: String,
        /// The store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The embedded store's file is damaged or not a database.
    #[error(transparent)]
    File(#[from] crate::adapters::store_file::StoreFileError),
    /// A read or write of the embedded store failed. Shared: one failed
    /// group commit answers every delivery in it.
    #[error("embedded ledger: {0}")]
    Embedded(#[source] Arc<redb::Error>),
    /// A Redis command failed.
    #[error("redis ledger: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// Redis answered, but not as Redis does (a proxy or another service on the port).
    #[error("redis answered PING with `{0}`")]
    UnexpectedPing(String),
    /// A stored entity state is not one this version wrote.
    #[error("corrupt entity state for {slot}")]
    Corrupt {
        /// The entity's slot.
        slot: String,
    },
    /// A write failed and none has worked since: nothing new is taken
    /// until one does (see the fence).
    #[error("ledger writes are failing ({reason}); deliveries wait until a write works again")]
    Unwritable {
        /// The first failure's message.
        reason: String,
    },
    /// Redis may evict posbridge's keys and `ledger.redis_allow_eviction`
    /// is not set.
    #[error(
        "Redis has maxmemory-policy {policy}, which may evict posbridge's keys (a forgotten done id publishes a retry again, a forgotten entity state lets an older event overwrite a newer one): set maxmemory-policy noeviction, or ledger.redis_allow_eviction = true to take the risk"
    )]
    Evicting {
        /// The server's policy.
        policy: String,
    },
    /// The ledger is being filled from the topics: nothing is decided
    /// until it holds what they say.
    #[error("the ledger is being rebuilt from the topics ({read} of {of} records read)")]
    Rebuilding {
        /// Records read so far.
        read: u64,
        /// Records to read in all.
        of: u64,
    },
    /// The store lost its keys (its generation mark is gone).
    #[error("the ledger lost its keys; it is being rebuilt from the topics")]
    Lost,
    /// The store may have lost its last writes though it kept its keys: the
    /// Redis it talks to is another (restarted from a snapshot, a replica
    /// promoted), or cannot be told from another (a reconnect). What it
    /// lost is in the topics after its offsets: they are read again.
    #[error(
        "the ledger may have lost its last writes ({why}); the topics are read from its offsets"
    )]
    Changed {
        /// What changed, in words.
        why: String,
    },
    /// The ledger is shut down.
    #[error("ledger is closed")]
    Closed,
}

/// The generation mark: that a store was filled from the topics, and the
/// unix second that fill began. A store whose commits are durable when made
/// (Redis) holds it once it was filled whole; gone, the store lost its keys
/// (`FLUSHALL`, a failover to an empty replica) and decides nothing until
/// it is filled again. Only a store makes one (its field is the ledger
/// module's): it is read from the store or written by
/// [`Store::mark_generation`], never made up by a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenerationMark {
    /// When the fill that wrote it began, in unix seconds: for an operator
    /// looking at the store, nothing decides on it.
    filled_at: i64,
}

impl GenerationMark {
    /// When the fill that wrote it began, in unix seconds.
    pub fn filled_at(&self) -> i64 {
        self.filled_at
    }
}

/// A fill's token: written when a fill into a store without the
/// [`GenerationMark`] begins, looked at while it runs and at its end. A store
/// flushed in the middle of a fill holds only what came after, so the fill
/// marks the store only if its token is still there. Minted by the store
/// when a fill begins ([`Store::begin_fill`]), or read back from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillToken(i64);

impl FillToken {
    /// A token no other fill holds.
    fn random() -> FillToken {
        FillToken(rand::random())
    }
}

/// A task one process at a time runs over a store others share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusive {
    /// Filling a store without its [`GenerationMark`] whole: the others
    /// wait for it, then find the mark and read on from the offsets it
    /// recorded.
    Fill,
    /// A `posbridge rederive` run that moves its checkpoints: two at once
    /// would move the same ones. The second is refused, not made to wait.
    Rederive,
}

/// Held while one process runs an [`Exclusive`] task. It holds until
/// dropped, however long the task runs: a shared store renews its lease
/// while it is held.
#[must_use = "the lock is let go when dropped"]
pub struct RebuildLock {
    /// The backend's guard; dropping it lets the lock go.
    _held: Box<dyn Send + Sync>,
}

impl RebuildLock {
    /// The lock a backend took, held while `held` lives.
    fn new(held: impl Send + Sync + 'static) -> RebuildLock {
        RebuildLock {
            _held: Box::new(held),
        }
    }
}

/// Where both backends keep the generation mark and the fill token: under
/// the names of the reconciler checkpoints they were before they had an
/// API of their own (on Redis `<prefix>checkpoint:<name>`). A deployment
/// upgrades one replica at a time, and an old replica and a new one must
/// find the same mark and the same token.
const GENERATION_MARK_NAME: &str = "posbridge:rebuilt-from-topics";
const FILL_TOKEN_NAME: &str = "posbridge:fill-token";

/// An opened ledger, behind a closed gate: its [`Gate`] is opened by the
/// rebuild once the ledger holds what the topics say.
#[derive(Clone)]
pub struct Opened {
    /// The store behind its gate and its fence.
    pub ledger: Arc<Ledger>,
    /// Closed until a rebuild opens it.
    pub gate: Arc<Gate>,
}

/// Opens the configured backend behind a closed [`Gate`] and the fence.
/// `lease` is how long a delivery's lease holds if its holder never ends it
/// (a crashed request).
///
/// # Errors
/// [`LedgerError::Open`] naming the file or server that could not be opened.
pub async fn open(config: &LedgerConfig, lease: Duration) -> Result<Opened, LedgerError> {
    Ok(Opened::behind_a_closed_gate(
        open_store(config, lease).await?,
    ))
}

/// An embedded ledger at `file` (a path and its disk) whose checkpoints are taken only when
/// [`Fill::persist`] asks, behind a closed [`Gate`] and the fence: what a
/// simulation opens, so its seeded schedule decides what is durable when it
/// crashes.
///
/// # Errors
/// As [`open`].
#[cfg(test)]
pub(crate) fn open_driven(
    file: (&std::path::Path, &crate::adapters::store_file::Disk),
    (dedup_ttl, clock): (Duration, WallClock),
    lease: Duration,
) -> Result<Opened, LedgerError> {
    let store = Backend::Embedded(EmbeddedLedger::open_driven(
        file,
        (dedup_ttl, clock),
        lease,
    )?);
    Ok(Opened::behind_a_closed_gate(store))
}

impl Opened {
    fn behind_a_closed_gate(store: Backend) -> Opened {
        let gate = Gate::closed();
        Opened {
            ledger: Arc::new(Ledger::new(Arc::new(store), gate.clone())),
            gate,
        }
    }
}

/// The configured backend.
async fn open_store(config: &LedgerConfig, lease: Duration) -> Result<Backend, LedgerError> {
    let dedup_ttl = Duration::from_secs(config.dedup_ttl_secs);
    Ok(match config.backend {
        LedgerBackend::Embedded => Backend::Embedded(EmbeddedLedger::open_with(
            &config.path,
            dedup_ttl,
            lease,
            Duration::from_millis(config.checkpoint_interval_ms),
        )?),
        LedgerBackend::Redis => Backend::Redis(
            RedisLedger::connect_with(
                &config.redis_url,
                &config.redis_prefix,
                dedup_ttl,
                lease,
                config.redis_ca_file.as_deref(),
                config.redis_allow_eviction,
                Duration::from_millis(config.checkpoint_interval_ms),
            )
            .await?,
        ),
    })
}

/// What `begin` found for a delivery id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// Never seen (or forgotten after the TTL): the caller now holds a lease
    /// and must end it with [`Ledger::commit`] or [`Ledger::release`].
    New,
    /// Another attempt holds the lease right now.
    InFlight,
    /// Already handled: answer 2xx and do nothing.
    Done,
}

/// Where an entity's version is kept: its topic's entity type and its record key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntitySlot(String);

impl EntitySlot {
    /// Entity types have separate id spaces (an order and a product may share
    /// an id), so the slot names both.
    pub fn new(entity_type: EntityType, key: &EntityKey) -> EntitySlot {
        EntitySlot::of_record_key(entity_type, key.as_str())
    }

    /// The slot of a record read back from `entity_type`'s topic, by its key.
    pub fn of_record_key(entity_type: EntityType, key: &str) -> EntitySlot {
        EntitySlot([entity_type.plural(), "/", key].concat())
    }

    /// Storage form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Held while an entity is guarded and published; dropping it unlocks.
pub type EntityLock = Box<dyn Send + Sync>;

/// What storage does, the backends' common face. Reached only through the
/// [`Ledger`], which adds the gate's and the fence's rules, over the
/// [`Backend`] enum: each call's future is the backend's own (no box), and
/// `Send`, so a delivery's task can hold it across an await.
pub trait Store: Send + Sync + 'static {
    /// Looks up a delivery id and, when it is new, takes a lease on it.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn begin(
        &self,
        delivery: &DeliveryKey,
    ) -> impl Future<Output = Result<Begin, LedgerError>> + Send;

    /// Takes a delivery's lease whether or not it is done: `New` when taken,
    /// `InFlight` when another attempt holds it (never `Done`). For putting a
    /// dead letter through again, whose delivery was marked done when it was
    /// dead-lettered; the lease still keeps it from racing a live delivery
    /// of the same id.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be reached.
    fn begin_again(
        &self,
        delivery: &DeliveryKey,
    ) -> impl Future<Output = Result<Begin, LedgerError>> + Send;

    /// Gives a lease back without marking the delivery done, so the
    /// provider's retry is processed.
    fn release(&self, delivery: &DeliveryKey) -> impl Future<Output = ()> + Send;

    /// Takes the entity's lock, waiting for another holder, then reads its
    /// state under it: the guard's two steps, which a backend may take in
    /// one round trip. The lock holds until dropped (a shared backend's
    /// lapses with its lease should its holder die).
    ///
    /// # Errors
    /// [`LedgerError`] when a shared lock cannot be reached or the state
    /// cannot be read.
    fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> impl Future<Output = Result<(EntityLock, Option<EntityState>), LedgerError>> + Send;

    /// What the store knows of a delivery id now: in flight, done (with
    /// what it was answered), or nothing.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn remembered(
        &self,
        delivery: &DeliveryKey,
    ) -> impl Future<Output = Result<Remembered, LedgerError>> + Send;

    /// The latest state written for an entity, if any, with its record's
    /// offset where known.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn entity(
        &self,
        slot: &EntitySlot,
    ) -> impl Future<Output = Result<Option<Held>, LedgerError>> + Send;

    /// A reconciler checkpoint: the unix second up to which a window was
    /// completely read, if any run finished a step yet.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn checkpoint(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<i64>, LedgerError>> + Send;

    /// Makes an outcome durable, then ends the delivery's lease.
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails; the lease is then released.
    fn commit(&self, commit: &Commit) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Starts a send whose outcome will be committed here: held until the
    /// commit is made, so a checkpoint never records an offset past a
    /// record whose state it does not hold ([`placements`]).
    fn sending(&self) -> Sending;

    /// Makes every commit so far durable now, with the offsets they are
    /// of (shutdown, and the end of a fill).
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails.
    fn persist(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Opens the store afresh, for a failure only a new handle clears (redb
    /// refuses every write after one I/O error). Stores that reconnect by
    /// themselves have nothing to do.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be opened yet.
    fn reopen(&self) -> impl Future<Output = Result<(), LedgerError>> + Send {
        std::future::ready(Ok(()))
    }

    /// What the store holds of the topics: the offsets up to which it has
    /// applied their records (where the start-up read begins) and the
    /// cluster and topics they are of. `None` for a store that holds
    /// nothing it can vouch for (a Redis without its generation mark: new,
    /// or its keys lost with the offsets), which is filled whole, one
    /// replica at a time.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn cached(&self) -> impl Future<Output = Result<Option<Cached>, LedgerError>> + Send;

    /// What a rebuild read the topics up to, and what they are: the next
    /// checkpoint records both.
    fn restore(&self, offsets: &Offsets, topics: &TopicsSeen);

    /// Forgets everything the store holds of the topics (done ids, entity
    /// states, offsets, checkpoints, what the topics were): it was found
    /// caching other topics than the cluster's, and is filled again from
    /// what they hold. Durable when it returns.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be written.
    fn forget_topics(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// Whether the store still holds every write made to it since it was
    /// last filled, asked every second by the rebuild and before a decision
    /// after a reconnect: [`LedgerError::Lost`] when it lost its keys,
    /// [`LedgerError::Changed`] when it may have lost only its last writes.
    ///
    /// # Errors
    /// As said, or [`LedgerError`] when the store cannot be asked.
    fn kept_writes(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The store's generation mark, if it was filled whole and has not lost
    /// its keys since.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn generation_mark(
        &self,
    ) -> impl Future<Output = Result<Option<GenerationMark>, LedgerError>> + Send;

    /// Marks the store filled from the topics by a fill that began at
    /// `filled_at` (unix seconds): the end of a fill whose token was still
    /// there.
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails.
    fn mark_generation(
        &self,
        filled_at: i64,
    ) -> impl Future<Output = Result<(), LedgerError>> + Send;

    /// The token of the last fill into a store without the mark, if the
    /// store still holds it.
    ///
    /// # Errors
    /// [`LedgerError`] when the store cannot be read.
    fn fill_token(&self) -> impl Future<Output = Result<Option<FillToken>, LedgerError>> + Send;

    /// Writes a new token for a fill that begins (replacing another's),
    /// and hands it over.
    ///
    /// # Errors
    /// [`LedgerError`] when the write fails.
    fn begin_fill(&self) -> impl Future<Output = Result<FillToken, LedgerError>> + Send;

    /// Takes a lock held by one process of those sharing the store for
    /// as long as a whole task runs: the fill's waits while another replica
    /// holds it; a rederive run's does not (`None` while another holds it).
    ///
    /// # Errors
    /// [`LedgerError`] when a shared lock cannot be reached.
    fn exclusive(
        &self,
        task: Exclusive,
    ) -> impl Future<Output = Result<Option<RebuildLock>, LedgerError>> + Send;

    /// Whether the store itself refuses an entity state older than the one
    /// it holds (Redis compares versions in its scripts), so a fill that
    /// may meet one (a state written before it, a key whose records it
    /// writes in several batches) need not read the held state first.
    fn refuses_older_states(&self) -> bool {
        false
    }

    /// Whether the store is open and answering, for `/readyz`.
    ///
    /// # Errors
    /// [`LedgerError`] saying why not.
    fn check(&self) -> impl Future<Output = Result<(), LedgerError>> + Send;
}
