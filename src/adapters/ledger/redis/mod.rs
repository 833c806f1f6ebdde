//! The shared ledger: Redis, for several posbridge processes (replicas
//! behind a load balancer, or `posbridge reconciler` beside `serve`), on one
//! server or on a Redis Cluster.
//!
//! Every key starts with a configurable prefix (`P`):
//! * `P{d:<delivery>}:lease`: `SET NX PX`, so one replica processes a delivery;
//! * `P{d:<delivery>}:done`: set with the dedup TTL when the outcome is durable;
//! * `Plock:<entity slot>`: the per-entity lock, `SET NX PX` with a random
//!   token, released only by its holder (a crashed holder's lock lapses);
//! * `Pentity:<entity slot>`: the written state, replaced only by a version at
//!   least as new, so even a holder whose lock lapsed cannot roll it back;
//! * `Pcheckpoint:<name>`;
//! * `Pprobe:writable`: the readiness check's write, lapsing after a minute.
//!
//! **One hash slot per script.** A Redis Cluster refuses (`CROSSSLOT`) a
//! script whose keys hash to different slots, and a key's slot is that of
//! its hash tag, the text between its first `{` and the next `}`. The two
//! keys of one delivery, which `begin` and the done mark touch together,
//! share the tag `{d:<delivery>}`, placed after the prefix (prefix ACLs and
//! `SCAN` patterns keep working) and before the key's kind, so the two keys
//! are equal up to and including the tag's `}` and share a slot whatever the
//! delivery id or the prefix holds (only a prefix whose first `{` is
//! followed at once by `}` defeats the tag). Entity, lock and checkpoint
//! keys are only ever touched one at a time, so they need no tag (and a
//! ledger on one server keeps its key names when it moves to a cluster).
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

mod connection;
mod scripts;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redis::{AsyncCommands, ScriptInvocation, Value};

use connection::{
    Connection, collect_text, connect_cluster, connect_single, is_cluster_node, without_password,
};
use scripts::{BEGIN, COMMIT, LOCK_AND_READ, MARK_DONE, SET_STATE, UNLOCK};

use super::{
    Begin, Commit, EntityLock, EntitySlot, EntityState, GENERATION_MARK, Ledger, LedgerError,
};
use crate::config::LedgerConfig;
use crate::domain::event::DeliveryKey;

/// How often the readiness check reads `maxmemory-policy` again: a policy
/// changed under a running posbridge is seen within this, and readiness
/// probes and status pages in quick succession do not each ask every
/// master for `INFO`.
const POLICY_RECHECK: Duration = Duration::from_secs(5);

/// How long the readiness check's write probe (`Pprobe:writable`) lives:
/// it holds nothing, and lapses soon after the last check.
const PROBE_KEY_MS: u64 = 60_000;

/// How often a waiter retries a taken entity lock.
const LOCK_POLL: Duration = Duration::from_millis(5);

/// The Redis ledger. Cheap to clone.
#[derive(Clone)]
pub struct RedisLedger {
    /// One server or a cluster; reconnects by itself.
    conn: Connection,
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
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("prefix", &self.prefix)
            .field("cluster", &matches!(self.conn, Connection::Cluster(_)))
            .finish_non_exhaustive()
    }
}

impl RedisLedger {
    /// Connects and checks the connection with a `PING`. `url` is one URL
    /// or a comma-separated list of a cluster's nodes
    /// ([`LedgerConfig::redis_nodes`]). A list is a cluster; so is one URL
    /// whose server says `cluster_enabled:1` (`INFO cluster`), so pointing
    /// at any node of a cluster, or at a managed cluster's one configuration
    /// endpoint, works too. Anything else is used as one server.
    ///
    /// A server whose `maxmemory-policy` may evict posbridge's keys is
    /// refused unless `allow_eviction`, and then said.
    ///
    /// # Errors
    /// [`LedgerError::Open`] when the URL or CA file is unusable, Redis
    /// does not answer or does not take writes, or may evict our keys.
    pub async fn connect(
        url: &str,
        prefix: &str,
        dedup_ttl: Duration,
        lease: Duration,
        ca_file: Option<&std::path::Path>,
        allow_eviction: bool,
    ) -> Result<RedisLedger, LedgerError> {
        let open_error = |e: Box<dyn std::error::Error + Send + Sync>| LedgerError::Open {
            path: without_password(url),
            source: e,
        };
        let nodes = LedgerConfig::redis_nodes(url).map_err(|e| open_error(Box::new(e)))?;
        let conn = if nodes.len() > 1 {
            Connection::Cluster(connect_cluster(&nodes, ca_file).await?)
        } else {
            let single = connect_single(url, ca_file).await?;
            if is_cluster_node(single.clone()).await {
                Connection::Cluster(connect_cluster(&nodes, ca_file).await?)
            } else {
                Connection::Single(single)
            }
        };
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
        let ledger = RedisLedger {
            conn,
            prefix: prefix.to_owned(),
            dedup_ttl,
            lease,
            allow_eviction,
            policy: Arc::new(Mutex::new((Instant::now(), found))),
        };
        ledger.check().await.map_err(|e| open_error(Box::new(e)))?;
        Ok(ledger)
    }

    /// The evicting policy as last seen, looked at again when
    /// [`POLICY_RECHECK`] has passed; a refused `INFO` keeps what was seen.
    async fn evicting_now(&self) -> Option<String> {
        let due = {
            let policy = self.policy.lock().unwrap_or_else(PoisonError::into_inner);
            policy.0.elapsed() >= POLICY_RECHECK
        };
        if due {
            let found = Self::evicting_policy(&self.conn).await;
            let mut policy = self.policy.lock().unwrap_or_else(PoisonError::into_inner);
            policy.0 = Instant::now();
            if let Ok(found) = found {
                policy.1 = found;
            }
        }
        self.policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    /// The `maxmemory-policy` of a server that may evict our keys, if any
    /// does: every policy but `noeviction` may (the `volatile-*` ones too,
    /// as done ids and leases carry a TTL). Read from `INFO memory`, which
    /// managed services that rename `CONFIG` still answer; on a cluster,
    /// every master's.
    async fn evicting_policy(conn: &Connection) -> Result<Option<String>, LedgerError> {
        let info: Value = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn.clone())
            .await?;
        let mut text = String::new();
        collect_text(&info, &mut text);
        Ok(text
            .lines()
            .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
            .find(|policy| *policy != "noeviction")
            .map(str::to_owned))
    }

    /// An entity's, a lock's or a checkpoint's key: each is touched alone.
    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}:{name}", self.prefix)
    }

    /// One of a delivery's two keys (`lease`, `done`), in its own slot.
    fn delivery_key(&self, delivery: &DeliveryKey, kind: &str) -> String {
        delivery_key(&self.prefix, delivery.as_str(), kind)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// [`COMMIT`] for `commit`. An absent part's key is still a key under
    /// the prefix (never written: its argument is empty), so a user whose
    /// ACL allows the prefix's keys alone may run the script.
    fn commit_script(&self, commit: &Commit) -> ScriptInvocation<'static> {
        let mut script = COMMIT.prepare_invoke();
        match &commit.entity {
            Some((slot, state)) => script
                .key(self.key("entity", slot.as_str()))
                .arg(state.to_bytes().as_slice()),
            None => script.key(self.key("entity", "")).arg(""),
        };
        match &commit.checkpoint {
            Some((name, at)) => script.key(self.key("checkpoint", name)).arg(at),
            None => script.key(self.key("checkpoint", "")).arg(""),
        };
        match &commit.delivery {
            Some(delivery) => script
                .key(self.delivery_key(delivery, "done"))
                .key(self.delivery_key(delivery, "lease"))
                .arg(self.dedup_ttl.as_secs().max(1)),
            None => script
                .key(delivery_key(&self.prefix, "", "done"))
                .key(delivery_key(&self.prefix, "", "lease"))
                .arg(""),
        };
        script
    }

    /// Polls until the entity's lock is taken: on one server with the
    /// state read in the same script (`LOCK_AND_READ`, which with
    /// `check_mark` also finds a lost generation mark), on a cluster with
    /// `SET NX PX` and then a `GET` (the lock's and the state's keys lie in
    /// different slots).
    async fn lock_and_read_marked(
        &self,
        slot: &EntitySlot,
        check_mark: bool,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        let key = self.key("lock", slot.as_str());
        let state_key = self.key("entity", slot.as_str());
        let token = format!("{:032x}", rand::random::<u128>());
        let mut conn = self.conn.clone();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.lease_ms()));
        let state: Option<Vec<u8>> = loop {
            if let Connection::Single(_) = conn {
                let mut invocation = LOCK_AND_READ.key(&key);
                invocation.key(&state_key);
                if check_mark {
                    invocation.key(self.key("checkpoint", GENERATION_MARK));
                }
                let (taken, state): (i32, Option<Vec<u8>>) = invocation
                    .arg(&token)
                    .arg(self.lease_ms())
                    .invoke_async(&mut conn)
                    .await?;
                match taken {
                    1 => break state,
                    2 => return Err(LedgerError::Lost),
                    _ => {}
                }
            } else {
                let taken: Option<String> = conn.set_options(&key, &token, options.clone()).await?;
                if taken.is_some() {
                    break conn.get(&state_key).await?;
                }
            }
            tokio::time::sleep(LOCK_POLL).await;
        };
        let lock: EntityLock = Box::new(RedisLock { conn, key, token });
        let state = state.map(|b| EntityState::decode(slot, &b)).transpose()?;
        Ok((lock, state))
    }

    /// A commit's three writes, in the order the module documentation
    /// explains: in one script on one server, one by one on a cluster.
    async fn write(&self, commit: &Commit) -> Result<(), LedgerError> {
        let mut conn = self.conn.clone();
        if let Connection::Single(_) = conn {
            let _: i32 = self.commit_script(commit).invoke_async(&mut conn).await?;
            return Ok(());
        }
        if let Some((slot, state)) = &commit.entity {
            let _: i32 = SET_STATE
                .key(self.key("entity", slot.as_str()))
                .arg(state.to_bytes().as_slice())
                .invoke_async(&mut conn)
                .await?;
        }
        if let Some((name, at)) = &commit.checkpoint {
            let () = conn.set(self.key("checkpoint", name), at).await?;
        }
        if let Some(delivery) = &commit.delivery {
            let _: i32 = MARK_DONE
                .key(self.delivery_key(delivery, "done"))
                .key(self.delivery_key(delivery, "lease"))
                .arg(self.dedup_ttl.as_secs().max(1))
                .invoke_async(&mut conn)
                .await?;
        }
        Ok(())
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

/// Held entity lock; dropping it releases the lock in the background.
struct RedisLock {
    conn: Connection,
    key: String,
    token: String,
}

impl Drop for RedisLock {
    fn drop(&mut self) {
        let (mut conn, key, token) = (
            self.conn.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        // Drop cannot await; a lock that fails to release lapses with its lease.
        tokio::spawn(async move {
            let released: redis::RedisResult<i32> =
                UNLOCK.key(key).arg(token).invoke_async(&mut conn).await;
            if let Err(error) = released {
                tracing::warn!(%error, "Entity lock not released; it lapses with its lease.");
            }
        });
    }
}

#[async_trait]
impl Ledger for RedisLedger {
    /// On one server, the generation mark is looked at in the same script:
    /// a ledger that lost its keys decides nothing until it is filled again.
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        let mut conn = self.conn.clone();
        let mut invocation = BEGIN.key(self.delivery_key(delivery, "done"));
        invocation.key(self.delivery_key(delivery, "lease"));
        if let Connection::Single(_) = conn {
            invocation.key(self.key("checkpoint", GENERATION_MARK));
        }
        let answer: i32 = invocation
            .arg(self.lease_ms())
            .invoke_async(&mut conn)
            .await?;
        Ok(match answer {
            0 => Begin::New,
            2 => Begin::Done,
            3 => return Err(LedgerError::Lost),
            _ => Begin::InFlight,
        })
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

    async fn lock_and_read(
        &self,
        slot: &EntitySlot,
    ) -> Result<(EntityLock, Option<EntityState>), LedgerError> {
        self.lock_and_read_marked(slot, true).await
    }

    /// [`Ledger::lock_and_read`] with the state left unread by the caller:
    /// one polling loop for both (the delivery path takes the lock only with
    /// its state). The mark is not looked at: the rebuild takes a lock
    /// while it is missing.
    async fn lock_entity(&self, slot: &EntitySlot) -> Result<EntityLock, LedgerError> {
        Ok(self.lock_and_read_marked(slot, false).await?.0)
    }

    async fn entity(&self, slot: &EntitySlot) -> Result<Option<EntityState>, LedgerError> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .clone()
            .get(self.key("entity", slot.as_str()))
            .await?;
        bytes.map(|b| EntityState::decode(slot, &b)).transpose()
    }

    async fn checkpoint(&self, name: &str) -> Result<Option<i64>, LedgerError> {
        self.conn
            .clone()
            .get(self.key("checkpoint", name))
            .await
            .map_err(LedgerError::from)
    }

    async fn commit(&self, commit: Commit) -> Result<(), LedgerError> {
        let result = self.write(&commit).await;
        if result.is_err()
            && let Some(delivery) = &commit.delivery
        {
            self.release(delivery).await;
        }
        result
    }

    /// Every key under the prefix is deleted: `SCAN` on one server (it
    /// blocks nothing), `KEYS` on a cluster, where redis-rs asks every
    /// master and joins the answers (a `SCAN` cursor is one node's). Rare
    /// (the ledger cached another cluster's topics), and the gate is closed.
    async fn forget_topics(&self) -> Result<(), LedgerError> {
        let pattern = format!("{}*", glob_escaped(&self.prefix));
        let mut conn = self.conn.clone();
        let keys: Vec<String> = match &self.conn {
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
mod tests {
    use redis::cluster_routing::Slot;

    use super::delivery_key;

    #[test]
    fn an_error_names_the_server_without_its_password() {
        assert_eq!(
            super::without_password("redis://posbridge:secret@10.0.0.1:6379,rediss://:pw@b:7000"),
            "redis://posbridge:***@10.0.0.1:6379,rediss://:***@b:7000"
        );
        assert_eq!(super::without_password("redis://a:6379"), "redis://a:6379");
    }

    #[test]
    fn a_deliverys_keys_share_one_slot_whatever_its_id_or_prefix() {
        for prefix in ["posbridge:", "", "a{b:", "x}", "{posbridge}:", "p{q}r{"] {
            for id in ["mekari:e1", "receiptroller:}", "x:{y}", "z:{", "", "x:}}{{"] {
                let (done, lease) = (
                    delivery_key(prefix, id, "done"),
                    delivery_key(prefix, id, "lease"),
                );
                assert_ne!(done, lease);
                assert_eq!(
                    Slot::for_key(&done),
                    Slot::for_key(&lease),
                    "{done} and {lease}"
                );
            }
        }
    }

    #[test]
    fn deliveries_spread_over_slots() {
        let slots: std::collections::HashSet<_> = (0..100)
            .map(|i| Slot::for_key(delivery_key("posbridge:", &format!("mekari:e{i}"), "done")))
            .collect();
        assert!(slots.len() > 90, "{} slots", slots.len());
    }
}
