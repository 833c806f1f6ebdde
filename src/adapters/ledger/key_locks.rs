//! One lock per entity key, held only by the deliveries of that key: a
//! delivery waiting for its broker's acknowledgement holds up the next
//! delivery of its own entity and no other. (Striped locks made an
//! unrelated key that shared a stripe wait a Kafka round trip; with 256
//! deliveries in flight over 1024 stripes that happens every few requests.)
//!
//! A key's entry lives while someone holds or waits for its lock: the last
//! guard to go removes it, so the map holds the keys in flight, not every
//! key ever seen. Each key's lock guards a value its holders hand on to
//! the next (the Redis ledger's: the token of the shared lock this process
//! holds for the key), which the last one takes out when it goes.
//! Waiters queue in arrival order (tokio's mutex is fair), without polling.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

/// Each key in flight (shared by the map and its guards: one allocation
/// per key's turn) and its lock.
type Map<T> = HashMap<Arc<str>, Arc<tokio::sync::Mutex<T>>>;

/// The locks of the keys in flight.
pub(super) struct KeyLocks<T = ()>(Arc<Mutex<Map<T>>>);

impl<T> Default for KeyLocks<T> {
    fn default() -> KeyLocks<T> {
        KeyLocks(Arc::default())
    }
}

impl<T: Default> KeyLocks<T> {
    /// Waits for `key`'s turn; the turn lasts as long as the guard.
    pub(super) async fn lock(&self, key: &str) -> KeyGuard<T> {
        let (key, lock) = {
            let mut locks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match locks.get_key_value(key) {
                Some((key, lock)) => (key.clone(), lock.clone()),
                None => {
                    let (key, lock): (Arc<str>, _) = (Arc::from(key), Arc::default());
                    locks.insert(key.clone(), Arc::clone(&lock));
                    (key, lock)
                }
            }
        };
        let held = lock.lock_owned().await;
        KeyGuard {
            locks: self.0.clone(),
            key,
            held: Some(held),
        }
    }

    /// How many keys have a delivery holding or waiting for their turn.
    #[cfg(test)]
    pub(super) fn in_flight(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A key's turn, and the value its holders hand on: ends when dropped or
/// [`KeyGuard::release`]d (the next waiter of the key goes on).
pub(super) struct KeyGuard<T: Default = ()> {
    locks: Arc<Mutex<Map<T>>>,
    key: Arc<str>,
    held: Option<OwnedMutexGuard<T>>,
}

impl<T: Default> KeyGuard<T> {
    /// Ends the turn: the value stays for the next waiter when one waits
    /// (`None`), else the key's entry goes and the value is handed back
    /// for the caller to end what it stands for.
    pub(super) fn release(mut self) -> Option<T> {
        self.end()
    }

    /// [`KeyGuard::release`], for it and for a guard dropped without it.
    fn end(&mut self) -> Option<T> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the map's lock no one can take a new handle on this key's
        // lock: if only the map and this guard hold it, no one waits.
        let mut held = self.held.take()?;
        let alone = locks
            .get(&self.key)
            .is_some_and(|lock| Arc::strong_count(lock) == 2);
        if alone {
            locks.remove(&self.key);
            return Some(std::mem::take(&mut *held));
        }
        None
    }
}

impl<T: Default> Deref for KeyGuard<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.held.as_ref().expect("held until released")
    }
}

impl<T: Default> DerefMut for KeyGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.held.as_mut().expect("held until released")
    }
}

/// A guard dropped without [`KeyGuard::release`] ends its turn the same
/// way, the value left for the next waiter or dropped.
impl<T: Default> Drop for KeyGuard<T> {
    fn drop(&mut self) {
        drop(self.end());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_held_key_makes_only_its_own_deliveries_wait() {
        let locks: Arc<KeyLocks> = Arc::new(KeyLocks::default());
        let held = locks.lock("sale:held").await;
        // A thousand other keys each take and give back their turn.
        for n in 0..1000 {
            let turn =
                tokio::time::timeout(Duration::from_millis(1), locks.lock(&format!("sale:{n}")))
                    .await;
            assert!(turn.is_ok(), "key {n} waited for an unrelated key");
        }
        // The held key's next delivery waits until its turn ends.
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move { drop(locks.lock("sale:held").await) }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the same key did not wait");
        drop(held);
        waiter.await.expect("the waiter ends");
        assert_eq!(locks.in_flight(), 0, "entries of ended turns are removed");
    }

    #[tokio::test]
    async fn a_key_waited_for_keeps_its_lock_when_the_holder_leaves() {
        let locks: Arc<KeyLocks> = Arc::new(KeyLocks::default());
        let first = locks.lock("k").await;
        let second = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _turn = locks.lock("k").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(first);
        // The waiter holds the turn now: a third must wait for it.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let third = tokio::time::timeout(Duration::from_millis(1), locks.lock("k")).await;
        assert!(third.is_err(), "two deliveries of one key held it at once");
        second.await.expect("the second ends");
        drop(locks.lock("k").await);
        assert_eq!(locks.in_flight(), 0);
    }

    /// The value a holder leaves is the next holder's; the last one to go
    /// gets it back.
    #[tokio::test]
    async fn a_turns_value_passes_to_the_next_waiter_and_back_to_the_last() {
        let locks: Arc<KeyLocks<Option<&str>>> = Arc::new(KeyLocks::default());
        let mut first = locks.lock("k").await;
        *first = Some("token");
        let second = tokio::spawn({
            let locks = locks.clone();
            async move {
                let turn = locks.lock("k").await;
                assert_eq!(*turn, Some("token"), "handed on");
                turn.release()
            }
        });
        tokio::task::yield_now().await;
        while locks.0.lock().unwrap().get("k").map(Arc::strong_count) != Some(3) {
            tokio::task::yield_now().await;
        }
        assert_eq!(first.release(), None, "one waits: the value stays for it");
        assert_eq!(
            second.await.unwrap(),
            Some(Some("token")),
            "the last gets it"
        );
        assert_eq!(locks.in_flight(), 0);
    }
}
