//! The Redis ledger's entity locks: taken with `SET NX PX` and a random
//! token, released only by their holder (a crashed holder's lock lapses).

use std::time::Duration;

use redis::AsyncCommands;

use super::RedisLedger;
use super::connection::Counted;
use super::scripts::{LOCK_AND_READ, RENEW, UNLOCK};
use crate::adapters::ledger::{EntityLock, EntitySlot, EntityState, GENERATION_MARK, LedgerError};

/// How often a waiter retries a taken entity lock.
const LOCK_POLL: Duration = Duration::from_millis(5);

impl RedisLedger {
    /// Polls until the entity's lock is taken: on one server with the
    /// state read in the same script (`LOCK_AND_READ`, which with
    /// `check_mark` also finds a lost generation mark), on a cluster with
    /// `SET NX PX` and then a `GET` (the lock's and the state's keys lie in
    /// different slots).
    pub(super) async fn lock_and_read_marked(
        &self,
        slot: &EntitySlot,
        check_mark: bool,
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
        let state = state.map(|b| EntityState::decode(slot, &b)).transpose()?;
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

    /// An entity lock held for as long as its holder needs, however long
    /// that is: its lease is renewed every third of it until the lock is
    /// dropped. For the fill, which may outlast a delivery's lease (1 M
    /// entities take 15-20 s): the other replicas wait for it rather than
    /// fill at the same time.
    pub(super) async fn lock_renewed(&self, slot: &EntitySlot) -> Result<EntityLock, LedgerError> {
        let (mut lock, _) = self.lock_and_read_marked(slot, false).await?;
        let (mut conn, key, token, lease_ms) = (
            lock.conn.clone(),
            lock.key.clone(),
            lock.token.clone(),
            self.lease_ms(),
        );
        let every = Duration::from_millis(lease_ms / 3).max(LOCK_POLL);
        lock.renewal = Some(
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
                            tracing::error!(lock = %key, "A renewed lock lapsed before its renewal (Redis lost it or was paused for longer than its lease): another replica may hold it now.");
                            return;
                        }
                        // Tried again at the next turn, while the lease holds.
                        Err(error) => {
                            tracing::warn!(%error, lock = %key, "A held lock's lease was not renewed.");
                        }
                    }
                }
            })
            .abort_handle(),
        );
        Ok(Box::new(lock))
    }
}

/// Held entity lock; dropping it releases the lock in the background.
pub(super) struct RedisLock {
    conn: Counted,
    key: String,
    token: String,
    /// The task renewing its lease, for a lock held longer than a delivery.
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
                UNLOCK.key(key).arg(token).invoke_async(&mut conn).await;
            if let Err(error) = released {
                tracing::warn!(%error, "Entity lock not released; it lapses with its lease.");
            }
        });
    }
}
