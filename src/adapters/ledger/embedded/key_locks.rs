//! One lock per entity key, held only by the deliveries of that key: a
//! delivery waiting for its broker's acknowledgement holds up the next
//! delivery of its own entity and no other. (Striped locks made an
//! unrelated key that shared a stripe wait a Kafka round trip; with 256
//! deliveries in flight over 1024 stripes that happens every few requests.)
//!
//! A key's entry lives while someone holds or waits for its lock: the last
//! guard to go removes it, so the map holds the keys in flight, not every
//! key ever seen.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

/// Each key in flight (shared by the map and its guards: one allocation
/// per key's turn) and its lock.
type Map = HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>;

/// The locks of the keys in flight.
#[derive(Default)]
pub(super) struct KeyLocks(Arc<Mutex<Map>>);

impl KeyLocks {
    /// Waits for `key`'s turn; the turn lasts as long as the guard.
    pub(super) async fn lock(&self, key: &str) -> KeyGuard {
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

/// A key's turn: ends when dropped (the next waiter of the key goes on).
pub(super) struct KeyGuard {
    locks: Arc<Mutex<Map>>,
    key: Arc<str>,
    held: Option<OwnedMutexGuard<()>>,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the map's lock no one can take a new handle on this key's
        // lock: if only the map and this guard hold it, no one waits.
        let held = self.held.take();
        if let Some(lock) = locks.get(&self.key)
            && Arc::strong_count(lock) == 2
        {
            locks.remove(&self.key);
        }
        drop(held);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_held_key_makes_only_its_own_deliveries_wait() {
        let locks = Arc::new(KeyLocks::default());
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
        let locks = Arc::new(KeyLocks::default());
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
}
