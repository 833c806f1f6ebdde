//! The shared ledger: Redis, for several posbridge processes (replicas
//! behind a load balancer, or `posbridge reconciler` beside `serve`).
//!
//! Every key lives under a configurable prefix:
//! * `lease:{delivery}`: `SET NX PX`, so one replica processes a delivery;
//! * `done:{delivery}`: set with the dedup TTL when the outcome is durable;
//! * `lock:{slot}`: the per-entity lock, `SET NX PX` with a random token,
//!   released only by its holder (a crashed holder's lock lapses);
//! * `entity:{slot}`: the written state, replaced only by a version at least
//!   as new, so even a holder whose lock lapsed cannot roll it back;
//! * `checkpoint:{name}`.
//!
//! `commit` runs as one Lua script, so a delivery is marked done in the same
//! step as its entity's state.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::{Begin, Commit, EntityLock, EntitySlot, EntityState, Ledger, LedgerError};
use crate::event::DeliveryKey;

/// How often a waiter retries a taken entity lock.
const LOCK_POLL: Duration = Duration::from_millis(5);

/// `begin`: done → 2; lease taken now → 0; another holder's lease → 1.
const BEGIN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return 0 end
return 1
";

/// `commit`: entity state only if not older (its first 12 bytes are the
/// version, big-endian, compared byte by byte: Lua's `<` on strings follows
/// the server's locale), then done, checkpoint, and the end of the lease.
/// ARGV: done TTL s, state or '', checkpoint or ''.
const COMMIT: &str = r"
local function not_older(new, old)
  for i = 1, 12 do
    local a, b = string.byte(new, i), string.byte(old, i)
    if a ~= b then return a > b end
  end
  return true
end
if ARGV[2] ~= '' then
  local current = redis.call('GET', KEYS[3])
  if (not current) or not_older(ARGV[2], current) then
    redis.call('SET', KEYS[3], ARGV[2])
  end
end
if KEYS[1] ~= '' then
  redis.call('SET', KEYS[1], '1', 'EX', ARGV[1])
  redis.call('DEL', KEYS[2])
end
if ARGV[3] ~= '' then redis.call('SET', KEYS[4], ARGV[3]) end
return 1
";

/// Releases a lock only if it still holds our token.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// The Redis ledger. Cheap to clone.
#[derive(Clone)]
pub struct RedisLedger {
    /// Reconnects by itself; commands wait for it.
    conn: ConnectionManager,
    /// Namespace of every key, so several deployments can share one Redis.
    prefix: String,
    /// How long done ids are kept.
    dedup_ttl: Duration,
    /// How long a lease or lock holds if its holder never ends it.
    lease: Duration,
}

impl std::fmt::Debug for RedisLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLedger")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLedger {
    /// Connects and checks the connection with a `PING`.
    ///
    /// # Errors
    /// [`LedgerError::Open`] when the URL or CA file is unusable or Redis
    /// does not answer.
    pub async fn connect(
        url: &str,
        prefix: &str,
        dedup_ttl: Duration,
        lease: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<RedisLedger, LedgerError> {
        let open_error = |e: redis::RedisError| LedgerError::Open {
            path: url.to_owned(),
            source: Box::new(e),
        };
        // `rediss://` uses the system's trust store, or `ca_file` when given.
        let client = match ca_file {
            None => redis::Client::open(url).map_err(open_error)?,
            Some(path) => {
                let root_cert = std::fs::read(path).map_err(|e| LedgerError::Open {
                    path: path.display().to_string(),
                    source: Box::new(e),
                })?;
                redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(root_cert),
                    },
                )
                .map_err(open_error)?
            }
        };
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(3)))
            .set_number_of_retries(2);
        let conn = tokio::time::timeout(
            Duration::from_secs(10),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| LedgerError::Open {
            path: url.to_owned(),
            source: "no answer within 10 s".into(),
        })?
        .map_err(open_error)?;
        let ledger = RedisLedger {
            conn,
            prefix: prefix.to_owned(),
            dedup_ttl,
            lease,
        };
        ledger.check().await.map_err(|e| LedgerError::Open {
            path: url.to_owned(),
            source: Box::new(e),
        })?;
        Ok(ledger)
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}:{name}", self.prefix)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }
}

/// Held entity lock; dropping it releases the lock in the background.
struct RedisLock {
    conn: ConnectionManager,
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
            let released: redis::RedisResult<i32> = Script::new(UNLOCK)
                .key(key)
                .arg(token)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = released {
                tracing::warn!(%error, "Entity lock not released; it lapses with its lease.");
            }
        });
    }
}

#[async_trait]
impl Ledger for RedisLedger {
    async fn begin(&self, delivery: &DeliveryKey) -> Result<Begin, LedgerError> {
        let answer: i32 = Script::new(BEGIN)
            .key(self.key("done", delivery.as_str()))
            .key(self.key("lease", delivery.as_str()))
            .arg(self.lease_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(match answer {
            0 => Begin::New,
            2 => Begin::Done,
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
            .set_options(self.key("lease", delivery.as_str()), "1", options)
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
            .del(self.key("lease", delivery.as_str()))
            .await;
        if let Err(error) = released {
            tracing::warn!(%error, "Lease not released; it lapses by itself.");
        }
    }

    async fn lock_entity(&self, slot: &EntitySlot) -> Result<EntityLock, LedgerError> {
        let key = self.key("lock", slot.as_str());
        let token = format!("{:032x}", rand::random::<u128>());
        let mut conn = self.conn.clone();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.lease_ms()));
        loop {
            let taken: Option<String> = conn.set_options(&key, &token, options.clone()).await?;
            if taken.is_some() {
                return Ok(Box::new(RedisLock { conn, key, token }));
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
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
        let delivery = commit.delivery.as_ref().map(DeliveryKey::as_str);
        let (slot, state) = match &commit.entity {
            Some((slot, state)) => (slot.as_str(), state.to_bytes().to_vec()),
            None => ("", Vec::new()),
        };
        let (checkpoint, at) = match &commit.checkpoint {
            Some((name, at)) => (name.as_str(), at.to_string()),
            None => ("", String::new()),
        };
        let key_or_empty = |kind: &str, name: &str| {
            if name.is_empty() {
                String::new()
            } else {
                self.key(kind, name)
            }
        };
        let result: redis::RedisResult<i32> = Script::new(COMMIT)
            .key(key_or_empty("done", delivery.unwrap_or_default()))
            .key(key_or_empty("lease", delivery.unwrap_or_default()))
            .key(key_or_empty("entity", slot))
            .key(key_or_empty("checkpoint", checkpoint))
            .arg(self.dedup_ttl.as_secs().max(1))
            .arg(state)
            .arg(at)
            .invoke_async(&mut self.conn.clone())
            .await;
        if result.is_err()
            && let Some(delivery) = &commit.delivery
        {
            self.release(delivery).await;
        }
        result.map(|_| ()).map_err(LedgerError::from)
    }

    async fn check(&self) -> Result<(), LedgerError> {
        let pong: String = redis::cmd("PING")
            .query_async(&mut self.conn.clone())
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(LedgerError::UnexpectedPing(pong))
        }
    }
}
