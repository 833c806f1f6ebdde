//! The Redis ledger's locks: an entity's, and the rebuild's. Both are taken
//! with `SET NX PX` and a random token and released only by their holder
//! (a crashed holder's lock lapses with its lease); the rebuild's lease is
//! renewed while it is held.

use std::time::Duration;

use redis::AsyncCommands;

use super::RedisLedger;
use super::connection::Counted;
use super::scripts::{LOCK_AND_READ, RENEW, UNLOCK};
use crate::adapters::ledger::{EntitySlot, EntityState, Exclusive, Held, LedgerError, RebuildLock};

/// How often a waiter retries a taken entity lock.
const LOCK_POLL: Duration = Duration::from_millis(5);

impl RedisLedger {
    /// Polls until the entity's lock is taken: on one server with the
    /// state read in the same script (`LOCK_AND_READ`, which also finds a
    /// lost generation mark), on a cluster with
    /// `SET NX PX` and then a `GET` (the lock's and the state's keys lie in
    /// different slots).
    pub(super) async fn lock_and_read_marked(
        &self,
        slot: &EntitySlot,
    ) -> Result<(RedisLock, Option<EntityState>), LedgerError> {
        let key = self.key("lock", slot.as_str());
        let state_key = self.key("entity", slot.as_str());
        let token = format!("{:032x}", rand::random::<u128>());
        let mut conn = self.conn.clone();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(self.lease_ms()));
        let state: Option<Vec<u8>> = loop {
            if conn.is_single() {
                let mut invocation = LOCK_AND_READ.key(&key);
                invocation.key(&state_key).key(self.mark_key());
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
        let state = state
            .map(|b| Held::decode(slot, &b).map(|held| held.state))
            .transpose()?;
        Ok((
            RedisLock {
                conn,
                key,
                token,
                renewal: None,
            },
            state,
        ))
    }

    /// The rebuild's lock, held for as long as the fill needs, however long
    /// that is: its lease is renewed every third of it until the lock is
    /// dropped. A fill may outlast a delivery's lease many times (1 M
    /// entities take 15-20 s): the other replicas wait for it rather than
    /// fill at the same time.
    ///
    /// Its key ([`REBUILD_LOCK_KEY`]) and its value (a random token) are
    /// those of the entity lock older versions took for the fill, so an old
    /// replica and a new one exclude each other during a rolling upgrade.
    ///
    /// A rederive run's lock is the same, under a key of its own, tried
    /// once: `None` while another process runs one.
    pub(super) async fn exclusive_renewed(
        &self,
        task: Exclusive,
    ) -> Result<Option<RebuildLock>, LedgerError> {
        let key = self.named(match task {
            Exclusive::Fill => REBUILD_LOCK_KEY,
            Exclusive::Rederive => REDERIVE_LOCK_KEY,
        });
        let token = format!("{:032x}", rand::random::<u128>());
        let lease_ms = self.lease_ms();
        let mut conn = self.conn.clone();
        let options = redis::SetOptions::default()
            .conditional_set(redis::ExistenceCheck::NX)
            .with_expiration(redis::SetExpiry::PX(lease_ms));
        while conn
            .set_options::<_, _, Option<String>>(&key, &token, options.clone())
            .await?
            .is_none()
        {
            if task == Exclusive::Rederive {
                return Ok(None);
            }
            tokio::time::sleep(LOCK_POLL).await;
        }
        let renewal = {
            let (mut conn, key, token) = (conn.clone(), key.clone(), token.clone());
            let every = Duration::from_millis(lease_ms / 3).max(LOCK_POLL);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let renewed: redis::RedisResult<i32> = RENEW
                        .key(&key)
                        .arg(&token)
                        .arg(lease_ms)
                        .invoke_async(&mut conn)
                        .await;
                    match renewed {
                        Ok(1) => {}
                        Ok(_) => {
                            tracing::error!(lock = %key, ?task, "A whole task's lock lapsed before its renewal (Redis lost it or was paused for longer than its lease): another process may run the same task at the same time.");
                            return;
                        }
                        // Tried again at the next turn, while the lease holds.
                        Err(error) => {
                            tracing::warn!(%error, lock = %key, ?task, "A whole task's lock's lease was not renewed.");
                        }
                    }
                }
            })
            .abort_handle()
        };
        Ok(Some(RebuildLock::new(RedisLock {
            conn,
            key,
            token,
            renewal: Some(renewal),
        })))
    }
}

/// The rebuild's lock (after the prefix): the entity lock of a sale whose
/// key is the generation mark's name, as older versions took it.
const REBUILD_LOCK_KEY: &str = "lock:sales/posbridge:rebuilt-from-topics";

/// The lock of a rederive run (after the prefix).
const REDERIVE_LOCK_KEY: &str = "lock:posbridge:rederive";

/// A held lock; dropping it releases the lock in the background.
pub(super) struct RedisLock {
    conn: Counted,
    key: String,
    token: String,
    /// The task renewing its lease: the rebuild's lock, held longer than a
    /// delivery.
    renewal: Option<tokio::task::AbortHandle>,
}

impl Drop for RedisLock {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        let (mut conn, key, token) = (
            self.conn.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
        // Drop cannot await; a lock that fails to release lapses with its lease.
        tokio::spawn(async move {
            let released: redis::RedisResult<i32> =
                UNLOCK.key(&key).arg(token).invoke_async(&mut conn).await;
            if let Err(error) = released {
                tracing::warn!(%error, lock = %key, "A lock was not released; it lapses with its lease.");
            }
        });
    }
}
