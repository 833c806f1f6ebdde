//! The shared ledger: Redis, for several posbridge processes (replicas
//! behind a load balancer, or `posbridge reconciler` beside `serve`), on one
//! server or on a Redis Cluster.
//!
//! Every key starts with a configurable prefix (`P`):
//! * `P{d:<delivery>}:lease`: `SET NX PX`, so one replica processes a delivery;
//! * `P{d:<delivery>}:done`: set with the dedup TTL when the outcome is
//!   durable, to what it was answered (`Answered::to_bytes`: outcome, time,
//!   record place; `1` from earlier versions);
//! * `Plock:<entity slot>`: the per-entity lock, `SET NX PX` with a random
//!   token, released only by its holder (a crashed holder's lock lapses),
//!   handed from one delivery of the entity to the next inside a process
//!   (`lock.rs`);
//! * `Pwaiting:<entity slot>` (or `Pwaiting:{Plock:<entity slot>}`, to
//!   share the lock's hash slot): a lock another process waits for, lapsing
//!   with the lock's lease; its holder's release is then published on the
//!   channel `Plock-released` (`wait.rs`);
//! * `Pentity:<entity slot>`: the written state, replaced only by a version at
//!   least as new, so even a holder whose lock lapsed cannot roll it back;
//! * `Pcheckpoint:<name>`;
//! * `Pcheckpoint:posbridge:rebuilt-from-topics`, the generation mark,
//!   `Pcheckpoint:posbridge:fill-token`, a fill's token, and
//!   `Plock:sales/posbridge:rebuilt-from-topics`, the rebuild's lock: the
//!   names they had when the rebuild borrowed a checkpoint and an entity
//!   lock for them, kept so replicas of an older version and of this one
//!   agree on them while a deployment upgrades;
//! * `Pprobe:writable`: the readiness check's write, lapsing after a minute;
//! * `P{offsets}:replicas` and `P{offsets}:topics`: how far each replica
//!   applied the topics, and which topics they are (`checkpoint.rs`).
//!
//! **A Redis that lost its last writes** (restarted from its last snapshot,
//! a replica promoted before it received them) keeps its generation mark,
//! and every write it lost is in the topics after the offsets it kept: the
//! ledger notices that the server changed (`generation.rs`), and the
//! rebuild reads the topics from those offsets before anything is decided
//! again.
//!
//! **One hash slot per script.** A Redis Cluster refuses (`CROSSSLOT`) a
//! script whose keys hash to different slots, and a key's slot is that of
//! its hash tag, the text between its first `{` and the next `}`. The two
//! keys of one delivery, which `begin` and the done mark touch together,
//! share the tag `{d:<delivery>}`, placed after the prefix (prefix ACLs and
//! `SCAN` patterns keep working) and before the key's kind, so the two keys
//! are equal up to and including the tag's `}` and share a slot whatever the
//! delivery id or the prefix holds (only a prefix whose first `{` is
//! followed at once by `}` defeats the tag). Entity and checkpoint keys are
//! only ever touched one at a time, and a lock only with its waiting key,
//! which is named to lie in the lock's slot (`wait.rs`), so they need no tag
//! (and a ledger on one server keeps its key names when it moves to a
//! cluster).
//!
//! **A commit is three writes, in order**: the entity's state, the
//! checkpoint, then the done mark with the end of the lease. On a cluster
//! they are three scripts or commands, because an entity's key and a
//! delivery's keys lie in different slots, and moving the done mark into the
//! entity's slot would make `begin` (which knows no entity yet) unable to
//! find it; on one server, which takes a script over any keys, they are one
//! script (`COMMIT`), as the guard's lock and read are (`LOCK_AND_READ`): a
//! new delivery costs four round trips there (begin, lock and read, commit,
//! unlock after the answer) instead of a cluster's six. The order makes a
//! crash between the writes harmless: the record is already in Kafka, and
//! if its state is recorded but the done mark is not, the provider's retry
//! finds that state and is `Unchanged` (or `Stale`), so it publishes
//! nothing; a done mark without its state (the other order) would let an
//! older event roll the entity back. Each write is idempotent, so the fence
//! writing a failed commit again is safe.

mod checkpoint;
mod commit;
mod connection;
mod generation;
mod lock;
mod policy;
mod scripts;
mod wait;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use super::key_locks::KeyLocks;
use checkpoint::Checkpoints;
use connection::{
    Connection, Counted, connect_cluster, connect_single, is_cluster_node, single_client,
    without_password,
};
use generation::Watch;
use scripts::BEGIN;

use super::{
    Answered, Begin, Cached, Commit, DEFAULT_CHECKPOINT_EVERY, EntityLock, EntitySlot, EntityState,
    Exclusive, FILL_TOKEN_NAME, FillToken, GENERATION_MARK_NAME, GenerationMark, Held, LedgerError,
    Offsets, RebuildLock, Remembered, Sending, Store, TopicsSeen,
};
use crate::config::LedgerConfig;
use crate::domain::event::DeliveryKey;

/// How long the readiness check's write probe (`Pprobe:writable`) lives:
/// it holds nothing, and lapses soon after the last check.
const PROBE_KEY_MS: u64 = 60_000;

/// The Redis ledger. Cheap to clone.
#[derive(Clone)]
pub struct RedisLedger {
    /// One server or a cluster; reconnects by itself, and counts the
    /// failures after which it did.
    conn: Counted,
    /// Namespace of every key, so several deployments can share one Redis.
    prefix: String,
    /// How long done ids are kept.
    dedup_ttl: Duration,
    /// How long a lease or lock holds if its holder never ends it.
    lease: Duration,
    /// Whether a `maxmemory-policy` that may evict our keys is taken.
    allow_eviction: bool,
    /// The last look at the policy: when, and the evicting policy found
    /// (`None` for `noeviction`, or when `INFO` is refused).
    policy: Arc<Mutex<(Instant, Option<String>)>>,
    /// This replica's offsets and the task that writes them.
    checkpoints: Arc<Checkpoints>,
    /// The generation of the Redis the last fill was against.
    watch: Arc<Watch>,
    /// This process's turns at each entity's lock, in arrival order, and
    /// the token of the shared lock the turn holds: handed from one local
    /// holder to the next without a release and a retake.
    turns: Arc<KeyLocks<Option<lock::Handed>>>,
    /// Where a dropped lock goes to be released ([`lock::release_dropped`]).
    unlocks: lock::Unlocks,
    /// This process's waiters for locks other processes hold, woken by
    /// their releases ([`wait::listen`]).
    releases: Arc<wait::Releases>,
    /// Ends the checkpoint task and the subscription to lock releases when
    /// the last handle goes.
    _stop: Arc<tokio_util::sync::DropGuard>,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("prefix", &self.prefix)
            .field("cluster", &!self.conn.is_single())
            .finish_non_exhaustive()
    }
}

impl RedisLedger {
    /// [`RedisLedger::connect_with`], checkpointing every
    /// [`DEFAULT_CHECKPOINT_EVERY`]: for tests and tools that open a Redis
    /// ledger directly.
    ///
    /// # Errors
    /// As [`RedisLedger::connect_with`].
    pub async fn connect(
        url: &str,
        prefix: &str,
        dedup_ttl: Duration,
        lease: Duration,
        ca_file: Option<&std::path::Path>,
        allow_eviction: bool,
    ) -> Result<RedisLedger, LedgerError> {
        Self::connect_with(
            url,
            prefix,
            dedup_ttl,
            lease,
            ca_file,
            allow_eviction,
            DEFAULT_CHECKPOINT_EVERY,
        )
        .await
    }

    /// Connects and checks the connection with a `PING`. `url` is one URL
    /// or a comma-separated list of a cluster's nodes
    /// ([`LedgerConfig::redis_nodes`]). A list is a cluster; so is one URL
    /// whose server says `cluster_enabled:1` (`INFO cluster`), so pointing
    /// at any node of a cluster, or at a managed cluster's one configuration
    /// endpoint, works too. Anything else is used as one server.
    ///
    /// A server whose `maxmemory-policy` may evict posbridge's keys is
    /// refused unless `allow_eviction`, and then said. A task writes this
    /// replica's offsets every `checkpoint_every` (`checkpoint.rs`), and
    /// another hears the releases of locks this process waits for
    /// (`wait.rs`), until the last handle goes.
    ///
    /// # Errors
    /// [`LedgerError::Open`] when the URL or CA file is unusable, Redis
    /// does not answer or does not take writes, or may evict our keys.
    pub async fn connect_with(
        url: &str,
        prefix: &str,
        dedup_ttl: Duration,
        lease: Duration,
        ca_file: Option<&std::path::Path>,
        allow_eviction: bool,
        checkpoint_every: Duration,
    ) -> Result<RedisLedger, LedgerError> {
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| LedgerError::Open {
            path: without_password(url),
            source: e,
        };
        let nodes = LedgerConfig::redis_nodes(url).map_err(|e| open_error(Box::new(e)))?;
        // The servers a subscription to lock releases is made on: the one
        // server, or the nodes a cluster was given.
        let nodes_subscribed = || {
            nodes
                .iter()
                .map(|node| redis::Client::open(*node))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| open_error(Box::new(e)))
        };
        let (link, subscribed) = if nodes.len() > 1 {
            (
                Connection::Cluster(connect_cluster(&nodes, ca_file).await?),
                nodes_subscribed()?,
            )
        } else {
            let client = single_client(url, ca_file)?;
            let single = connect_single(client.clone(), url).await?;
            if is_cluster_node(single.clone()).await {
                (
                    Connection::Cluster(connect_cluster(&nodes, ca_file).await?),
                    nodes_subscribed()?,
                )
            } else {
                (Connection::Single(single), vec![client])
            }
        };
        let conn = Counted::new(link);
        let found = match Self::evicting_policy(&conn).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(
                    %error,
                    "Redis refuses INFO (an ACL without @dangerous?): its maxmemory-policy is not checked; make sure it is noeviction."
                );
                None
            }
        };
        match &found {
            Some(policy) if !allow_eviction => {
                return Err(open_error(Box::new(LedgerError::Evicting {
                    policy: policy.clone(),
                })));
            }
            Some(policy) => tracing::warn!(
                policy,
                "Redis may evict posbridge's keys (ledger.redis_allow_eviction is set): under memory pressure a forgotten done id publishes a retry again and a forgotten entity state lets an older event overwrite a newer one. Set maxmemory-policy noeviction."
            ),
            None => {}
        }
        let checkpoints = Arc::new(Checkpoints::new(prefix));
        let watch = Arc::new(Watch::default());
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(checkpoints.clone().run(
            conn.clone(),
            watch.clone(),
            checkpoint_every,
            stop.clone(),
        ));
        let (unlocks, dropped) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(lock::release_dropped(
            conn.clone(),
            prefix.to_owned(),
            dropped,
        ));
        let releases = Arc::new(wait::Releases::default());
        tokio::spawn(wait::listen(
            releases.clone(),
            subscribed,
            wait::channel(prefix),
            stop.clone(),
        ));
        let ledger = RedisLedger {
            conn,
            prefix: prefix.to_owned(),
            dedup_ttl,
            lease,
            allow_eviction,
            policy: Arc::new(Mutex::new((Instant::now(), found))),
            checkpoints,
            watch,
            turns: Arc::default(),
            unlocks,
            releases,
            _stop: Arc::new(stop.drop_guard()),
        };
        ledger.check().await.map_err(|e| open_error(Box::new(e)))?;
        // The server found at connect is the one decisions are made on
        // until a fill reads against another: the rebuild's first fill
        // comes before any (the gate is closed), and a ledger used without
        // one (a test, a tool) is still told when the server changes.
        ledger
            .watch
            .fill_begins(&ledger.conn)
            .await
            .map_err(|e| open_error(Box::new(e)))?;
        ledger.watch.fill_ended();
        Ok(ledger)
    }

    /// An entity's, a lock's or a checkpoint's key: each is touched alone.
    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}:{name}", self.prefix)
    }

    /// `key` after the prefix.
    fn named(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The generation mark's key. The lease and guard scripts look at it
    /// too, so an old replica, a new one and every script must agree on it:
    /// it is where older versions kept the mark, a checkpoint's key.
    fn mark_key(&self) -> String {
        self.key("checkpoint", GENERATION_MARK_NAME)
    }

    /// One of a delivery's two keys (`lease`, `done`), in its own slot.
    fn delivery_key(&self, delivery: &DeliveryKey, kind: &str) -> String {
        delivery_key(&self.prefix, delivery.as_str(), kind)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }
}

/// `P{d:<delivery>}:<kind>`: see the module documentation for why the tag
/// comes first.
fn delivery_key(prefix: &str, delivery: &str, kind: &str) -> String {
    format!("{prefix}{{d:{delivery}}}:{kind}")
}

/// `text` with the characters a `SCAN`/`KEYS` pattern gives a meaning to
/// escaped, so a prefix matches only itself.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

impl Store for RedisLedger {
    /// On one server, the generation mark is looked at in the same script:
    /// a ledger that lost its keys decides nothing until it is filled again.
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        let drops = self.same_server().await?;
        let mut conn = self.conn.clone();
        let mut invocation = BEGIN.key(self.delivery_key(delivery, "done"));
        invocation.key(self.delivery_key(delivery, "lease"));
        if conn.is_single() {
            invocation.key(self.mark_key());
        }
        let answer: i32 = invocation
            .arg(self.lease_ms())
            .invoke_async(&mut conn)
            .await?;
        let begun = match answer {
            0 => Begin::New,
            2 => Begin::Done,
            3 => return Err(LedgerError::Lost),
            _ => Begin::InFlight,
        };
        // A done mark is true in any Redis that holds it; a lease taken on
        // a server that changed meanwhile is given back.
        if begun == Begin::New
            && let Err(error) = self.still_same_server(drops).await
        {
            self.release(delivery).await;
            return Err(error);
        }
        Ok(begun)
    }

    async fn begin_again(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.lease_ms()));
        let taken: Option<String> = self
            .conn
            .clone()
            .set_options(self.delivery_key(delivery, "lease"), "1", options)
            .await?;
        Ok(if taken.is_some() {
            Begin::New
        } else {
            Begin::InFlight
        })
    }

    async fn release(&self, delivery: &DeliveryKey) {
        let released: redis::RedisResult<i32> = self
            .conn
            .clone()
            .del(self.delivery_key(delivery, "lease"))
            .await;
        if let Err(error) = released {
            tracing::warn!(%error, "Lease not released; it lapses by itself.");
        }
    }

    /// The guard's read decides what is published, so it is made only on
    /// the server the last fill was against (see [`RedisLedger::begin`]).
    async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        let drops = self.same_server().await?;
        let (lock, state) = self.lock_and_read_marked(slot).await?;
        let read: (EntityLock, Option<EntityState>) = (Box::new(lock), state);
        // Dropping the lock releases it.
        self.still_same_server(drops).await?;
        Ok(read)
    }

    /// The lease, the done mark and its time to live, read in one round
    /// trip (one slot: the delivery's keys share its tag).
    async fn remembered(&self, delivery: &DeliveryKey) -> Result<Remembered, LedgerError> {
        let (leased, done, ttl): (bool, Option<Vec<u8>>, i64) = redis::pipe()
            .exists(self.delivery_key(delivery, "lease"))
            .get(self.delivery_key(delivery, "done"))
            .ttl(self.delivery_key(delivery, "done"))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match done {
            _ if leased => Remembered::InFlight,
            Some(value) => Remembered::Done {
                answered: Answered::from_bytes(&value),
                until: (ttl >= 0).then(|| time::OffsetDateTime::now_utc().unix_timestamp() + ttl),
            },
            None => Remembered::Nothing,
        })
    }

    async fn entity(&self, slot: &EntitySlot) -> Result<Option<Held>, LedgerError> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .clone()
            .get(self.key("entity", slot.as_str()))
            .await?;
        bytes.map(|b| Held::decode(slot, &b)).transpose()
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.conn
            .clone()
            .get(self.key("checkpoint", name))
            .await
            .map_err(LedgerError::from)
    }

    /// A record's place counts towards this replica's offsets only once
    /// its state is written.
    async fn commit(&self, commit: &Commit) -> Result<(), LedgerError> {
        let result = self.write(commit).await;
        match (&result, &commit.placed) {
            (Ok(()), Some(placed)) => self.checkpoints.committed(placed),
            (Err(_), Some(placed)) => self.checkpoints.failed(placed),
            _ => {}
        }
        if result.is_err()
            && let Some(done) = &commit.delivery
        {
            self.release(&done.key).await;
        }
        result
    }

    fn sending(&self) -> Sending {
        self.checkpoints.placements.sending()
    }

    /// This replica's offsets, written now (shutdown, and the end of a
    /// fill).
    async fn persist(&self) -> Result<(), LedgerError> {
        self.checkpoints.take(&self.conn, &self.watch).await
    }

    /// `None` without the generation mark: the keys are lost (or were never
    /// filled), and the offsets with them; the rebuild fills the ledger
    /// whole, one replica at a time. Also notes the generation the fill
    /// that asks reads the topics against.
    async fn cached(&self) -> Result<Option<Cached>, LedgerError> {
        self.watch.fill_begins(&self.conn).await?;
        let (offsets, topics) = self.checkpoints.cached(&self.conn).await?;
        // Looked at after the offsets: a FLUSHALL between the two is not
        // taken for offsets of a marked ledger.
        if !self.marked().await? {
            return Ok(None);
        }
        Ok(Some(Cached { offsets, topics }))
    }

    /// The end of a fill: the next checkpoint records the offsets it read
    /// up to, and the generation it read against is the one decisions are
    /// made on from now.
    fn restore(&self, offsets: &Offsets, topics: &TopicsSeen) {
        self.checkpoints.restore(offsets, topics);
        self.watch.fill_ended();
    }

    async fn generation_mark(&self) -> Result<Option<GenerationMark>, LedgerError> {
        let filled_at: Option<i64> = self.conn.clone().get(self.mark_key()).await?;
        Ok(filled_at.map(|filled_at| GenerationMark { filled_at }))
    }

    async fn mark_generation(&self, filled_at: i64) -> Result<(), LedgerError> {
        let () = self.conn.clone().set(self.mark_key(), filled_at).await?;
        Ok(())
    }

    async fn fill_token(&self) -> Result<Option<FillToken>, LedgerError> {
        let token: Option<i64> = self
            .conn
            .clone()
            .get(self.key("checkpoint", FILL_TOKEN_NAME))
            .await?;
        Ok(token.map(FillToken))
    }

    async fn begin_fill(&self) -> Result<FillToken, LedgerError> {
        let token = FillToken::random();
        let () = self
            .conn
            .clone()
            .set(self.key("checkpoint", FILL_TOKEN_NAME), token.0)
            .await?;
        Ok(token)
    }

    /// Renewed while held (`lock.rs`): a fill of any length keeps it.
    async fn exclusive(&self, task: Exclusive) -> Result<Option<RebuildLock>, LedgerError> {
        self.exclusive_renewed(task).await
    }

    /// A commit's state is written only if not older ([`SET_STATE`],
    /// [`COMMIT`]).
    fn refuses_older_states(&self) -> bool {
        true
    }

    /// The mark, then the generation (every master's on a cluster).
    async fn kept_writes(&self) -> Result<(), LedgerError> {
        if !self.marked().await? {
            return Err(LedgerError::Lost);
        }
        self.watch.look(&self.conn).await
    }

    /// Every key under the prefix is deleted: `SCAN` on one server (it
    /// blocks nothing), `KEYS` on a cluster, where redis-rs asks every
    /// master and joins the answers (a `SCAN` cursor is one node's). Rare
    /// (the ledger cached another cluster's topics), and the gate is closed.
    async fn forget_topics(&self) -> Result<(), LedgerError> {
        let pattern = format!("{}*", glob_escaped(&self.prefix));
        let mut conn = self.conn.clone();
        let keys: Vec<String> = match &self.conn.link {
            Connection::Single(single) => {
                let mut single = single.clone();
                let mut found = Vec::new();
                let mut iter = single.scan_match::<_, String>(&pattern).await?;
                while let Some(key) = futures::StreamExt::next(&mut iter).await {
                    found.push(key?);
                }
                found
            }
            Connection::Cluster(_) => {
                redis::cmd("KEYS")
                    .arg(&pattern)
                    .query_async(&mut conn)
                    .await?
            }
        };
        for key in keys {
            let _: i64 = conn.unlink(key).await?;
        }
        self.checkpoints.forget().await;
        Ok(())
    }

    /// A PING, then a write: a Redis at `maxmemory` under `noeviction`
    /// (`OOM command not allowed`), a read-only replica after a failover
    /// (`READONLY`) or an ACL without write rights answers PING and refuses
    /// every delivery's lease.
    async fn check(&self) -> Result<(), LedgerError> {
        let mut conn = self.conn.clone();
        let pong: String = redis::cmd("PING").query_async(&mut conn).await?;
        if pong != "PONG" {
            return Err(LedgerError::UnexpectedPing(pong));
        }
        let () = redis::cmd("SET")
            .arg(self.key("probe", "writable"))
            .arg(1)
            .arg("PX")
            .arg(PROBE_KEY_MS)
            .query_async(&mut conn)
            .await?;
        match self.evicting_now().await {
            Some(policy) if !self.allow_eviction => Err(LedgerError::Evicting { policy }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
