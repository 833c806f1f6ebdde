//! The Redis ledger's locks: an entity's, the rebuild's and a rederive
//! run's. Each is taken with `SET NX PX` and a random token and released
//! only by its holder (a crashed holder's lock lapses with its lease); the
//! rebuild's and a run's leases are renewed while they are held.
//!
//! An entity's lock is held by a process for a queue of its deliveries of
//! that entity: they wait for their turn in memory, in arrival order, and
//! each hands the shared lock to the next (which renews its lease) instead
//! of releasing it for the next to take again; the last one in the queue
//! (or the sixteenth in a row, so that another process is not held off for
//! good) releases it. A lock another process holds is waited for until its
//! holder releases it, woken by the release (`wait.rs`), or until its lease
//! lapses.
//!
//! A dropped lock is released by one task per ledger ([`release_dropped`]),
//! fed through a channel, its `UNLOCK`s pipelined on the shared connection:
//! a drop cannot await, and a task spawned for each release cost a task
//! each.

use std::time::Duration;

use redis::{AsyncCommands, ScriptInvocation};

use super::RedisLedger;
use super::connection::Counted;
use super::scripts::{LOCK_AND_READ, RENEW, RENEW_AND_READ, TAKE, UNLOCK};
use super::wait::{Interest, channel, waiting_key};
use crate::adapters::ledger::key_locks::KeyGuard;
use crate::adapters::ledger::{EntitySlot, EntityState, Exclusive, Held, LedgerError, RebuildLock};

/// How often a waiter tries a held lock again when its release would not
/// wake it (`wait.rs`: the subscription is down, or the holder is of an
/// older version).
const LOCK_POLL: Duration = Duration::from_millis(5);

/// A new lock's token: random, after a `w` that tells a waiter its holder
/// publishes its release to the waiters (`UNLOCK`); older versions' tokens
/// are hex digits alone, and their holders publish nothing.
fn new_token() -> String {
    format!("w{:032x}", rand::random::<u128>())
}

/// `UNLOCK` of the lock at `key` held with `token`, which publishes its
/// release on `prefix`'s channel when a waiter marked it.
fn unlock<'a>(prefix: &str, key: &str, token: &str) -> ScriptInvocation<'a> {
    let mut invocation = UNLOCK.key(key);
    if let Some(waiting) = waiting_key(prefix, key) {
        invocation.key(waiting);
    }
    invocation.arg(token).arg(channel(prefix));
    invocation
}

/// How many dropped locks [`release_dropped`] releases at once.
const UNLOCKS_AT_ONCE: usize = 64;

/// Where a dropped lock's key and token go to be released.
pub(super) type Unlocks = tokio::sync::mpsc::UnboundedSender<(String, String)>;

/// Releases each lock dropped into `dropped` (`UNLOCK`: only its holder's
/// token deletes it), up to [`UNLOCKS_AT_ONCE`] at a time, until the
/// ledger and every lock it handed out are gone. A lock whose release
/// fails lapses with its lease.
pub(super) async fn release_dropped(
    conn: Counted,
    prefix: String,
    dropped: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    use futures::StreamExt;
    futures::stream::unfold(dropped, |mut dropped| async move {
        Some((dropped.recv().await?, dropped))
    })
    .for_each_concurrent(UNLOCKS_AT_ONCE, |(key, token)| {
        let (mut conn, prefix) = (conn.clone(), &prefix);
        async move {
            let released: redis::RedisResult<i32> = unlock(prefix, &key, &token)
                .invoke_async(&mut conn)
                .await;
            if let Err(error) = released {
                tracing::warn!(%error, lock = %key, "A lock was not released; it lapses with its lease.");
            }
        }
    })
    .await;
}

impl RedisLedger {
    /// Takes the entity's lock and reads its state. The deliveries of one
    /// entity in this process queue for their turn in arrival order,
    /// without polling (`KeyLocks`); a turn finds the shared lock handed
    /// over by the turn before (its lease renewed and the state read in one
    /// round trip on one server, `RENEW_AND_READ`) or takes it: on one
    /// server with the state read in the same script (`LOCK_AND_READ`,
    /// which also finds a lost generation mark), on a cluster with `TAKE`
    /// (`SET NX PX`) and then a `GET` (the lock's and the state's keys lie
    /// in different slots). A lock another process holds is waited for
    /// until its release wakes this turn, or its lease lapses (`wait.rs`).
    pub(super) async fn lock_and_read_marked(
        &self,
        slot: &EntitySlot,
    ) -> Result<(RedisLock, Option<EntityState>), LedgerError> {
        let key = self.key("lock", slot.as_str());
        let state_key = self.key("entity", slot.as_str());
        let mut turn = self.turns.lock(slot.as_str()).await;
        let handed = match turn.take() {
            Some(handed) if handed.turns < HANDED_AT_MOST => self
                .renew_and_read(&key, &state_key, &handed.token)
                .await?
                .map(|state| (handed.renewed(), state)),
            // Held through many turns: let it go, so that another process
            // waiting for it is not held off for good.
            Some(handed) => {
                let _: i32 = unlock(&self.prefix, &key, &handed.token)
                    .invoke_async(&mut self.conn.clone())
                    .await?;
                None
            }
            None => None,
        };
        let (held, state) = match handed {
            Some(taken) => taken,
            None => self.take_and_read(&key, &state_key).await?,
        };
        *turn = Some(held);
        let state = state
            .map(|b| Held::decode(slot, &b).map(|held| held.state))
            .transpose()?;
        Ok((
            RedisLock {
                unlocks: self.unlocks.clone(),
                key,
                token: String::new(),
                renewal: None,
                turn: Some(turn),
            },
            state,
        ))
    }

    /// The lock handed over with `token` renewed, and the state read: `None`
    /// when its lease lapsed meanwhile.
    async fn renew_and_read(
        &self,
        key: &str,
        state_key: &str,
        token: &str,
    ) -> Result<Option<Option<Vec<u8>>>, LedgerError> {
        let mut conn = self.conn.clone();
        if conn.is_single() {
            let mut invocation = RENEW_AND_READ.key(key);
            invocation.key(state_key).key(self.mark_key());
            let (renewed, state): (i32, Option<Vec<u8>>) = invocation
                .arg(token)
                .arg(self.lease_ms())
                .invoke_async(&mut conn)
                .await?;
            return match renewed {
                1 => Ok(Some(state)),
                2 => Err(LedgerError::Lost),
                _ => Ok(None),
            };
        }
        let renewed: i32 = RENEW
            .key(key)
            .arg(token)
            .arg(self.lease_ms())
            .invoke_async(&mut conn)
            .await?;
        Ok(match renewed {
            1 => Some(conn.get(state_key).await?),
            _ => None,
        })
    }

    /// Takes the lock anew, waiting while another process holds it, and
    /// reads the state.
    async fn take_and_read(
        &self,
        key: &str,
        state_key: &str,
    ) -> Result<(Handed, Option<Vec<u8>>), LedgerError> {
        let (token, state) = self.take_waiting(key, Some(state_key)).await?;
        Ok((Handed { token, turns: 0 }, state))
    }

    /// Takes the lock at `key` with a new token, trying again whenever the
    /// holder releases it (woken by the release) or its lease lapses, or
    /// every 5 ms when a release would not wake this waiter (`wait.rs`);
    /// with the state at `state_key` read once it is taken.
    async fn take_waiting(
        &self,
        key: &str,
        state_key: Option<&str>,
    ) -> Result<(String, Option<Vec<u8>>), LedgerError> {
        let token = new_token();
        // Made at the first try that finds the lock held, not before: an
        // untaken lock (most) costs one script and nothing in this process.
        let mut waiting: Option<(Interest, Option<String>)> = None;
        let mut conn = self.conn.clone();
        loop {
            let held_unheard = {
                // Before the try: a release between the try and the wait
                // wakes it.
                let released = waiting.as_ref().map(|(interest, _)| interest.released());
                let mut released = std::pin::pin!(released);
                if let Some(released) = released.as_mut().as_pin_mut() {
                    released.enable();
                }
                let one_script = state_key.filter(|_| conn.is_single());
                let mut invocation = match one_script {
                    Some(state_key) => {
                        let mut invocation = LOCK_AND_READ.key(key);
                        invocation.key(state_key).key(self.mark_key());
                        invocation
                    }
                    None => TAKE.key(key),
                };
                if let Some((_, Some(waiting_key))) = &waiting {
                    invocation.key(waiting_key);
                }
                let (taken, state, left_ms, wakes): (i32, Option<Vec<u8>>, i64, i32) = invocation
                    .arg(&token)
                    .arg(self.lease_ms())
                    .invoke_async(&mut conn)
                    .await?;
                match taken {
                    1 if one_script.is_some() => return Ok((token, state)),
                    1 => {
                        let state = match state_key {
                            Some(state_key) => conn.get(state_key).await?,
                            None => None,
                        };
                        return Ok((token, state));
                    }
                    2 => return Err(LedgerError::Lost),
                    _ => {}
                }
                let wait = if wakes == 1 && self.releases.heard() {
                    // A lock without a lease (not one of ours) is tried again
                    // after one.
                    u64::try_from(left_ms)
                        .map_or(self.lease, Duration::from_millis)
                        .max(Duration::from_millis(1))
                } else {
                    LOCK_POLL
                };
                match released.as_mut().as_pin_mut() {
                    Some(released) => {
                        tokio::select! {
                            () = released => {}
                            () = tokio::time::sleep(wait) => {}
                        }
                        false
                    }
                    None => true,
                }
            };
            // The first try found it held: the interest, then at once a try
            // that marks the lock waited for.
            if held_unheard {
                waiting = Some((self.releases.interest(key), waiting_key(&self.prefix, key)));
            }
        }
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
        let lease_ms = self.lease_ms();
        let mut conn = self.conn.clone();
        let token = match task {
            Exclusive::Fill => self.take_waiting(&key, None).await?.0,
            Exclusive::Rederive => {
                let token = new_token();
                let options = redis::SetOptions::default()
                    .conditional_set(redis::ExistenceCheck::NX)
                    .with_expiration(redis::SetExpiry::PX(lease_ms));
                let taken: Option<String> = conn.set_options(&key, &token, options).await?;
                if taken.is_none() {
                    return Ok(None);
                }
                token
            }
        };
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
            unlocks: self.unlocks.clone(),
            key,
            token,
            renewal: Some(renewal),
            turn: None,
        })))
    }
}

/// The rebuild's lock (after the prefix): the entity lock of a sale whose
/// key is the generation mark's name, as older versions took it.
const REBUILD_LOCK_KEY: &str = "lock:sales/posbridge:rebuilt-from-topics";

/// The lock of a rederive run (after the prefix).
const REDERIVE_LOCK_KEY: &str = "lock:posbridge:rederive";

/// How many turns in a row of this process's deliveries one shared
/// entity lock is handed through before it is let go and taken again.
const HANDED_AT_MOST: u32 = 16;

/// The shared lock a process's turn at an entity holds: its token, and
/// through how many turns it was handed.
#[derive(Debug)]
pub(super) struct Handed {
    token: String,
    turns: u32,
}

impl Handed {
    fn renewed(self) -> Handed {
        Handed {
            turns: self.turns + 1,
            ..self
        }
    }
}

/// A held lock; dropping it releases the lock in the background, or hands
/// an entity's over to the next delivery of that entity in this process.
pub(super) struct RedisLock {
    /// Where its release goes when it is dropped.
    unlocks: Unlocks,
    key: String,
    /// The token of a lock held apart from the entities' turns (the
    /// rebuild's, a rederive run's); an entity's is in its `turn`.
    token: String,
    /// The task renewing its lease: the rebuild's lock, held longer than a
    /// delivery.
    renewal: Option<tokio::task::AbortHandle>,
    /// An entity's turn in this process, holding the lock's token.
    turn: Option<KeyGuard<Option<Handed>>>,
}

impl Drop for RedisLock {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        let token = match self.turn.take() {
            // Another delivery of the entity waits here: it takes the lock
            // over as it is, no release and no retake.
            Some(turn) => match turn.release() {
                Some(Some(handed)) => handed.token,
                _ => return,
            },
            None => std::mem::take(&mut self.token),
        };
        // Drop cannot await: the ledger's releasing task unlocks it. With
        // that task gone (the ledger dropped), the lock lapses with its lease.
        let _ = self.unlocks.send((std::mem::take(&mut self.key), token));
    }
}
