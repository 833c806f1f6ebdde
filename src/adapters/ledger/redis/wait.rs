//! Waiting for a lock another process holds: woken by its release, not by
//! polling.
//!
//! A try that finds a lock held (`LOCK_AND_READ`, `TAKE`) by a holder of
//! this version marks it waited for, in the same script: the lock's waiting
//! key ([`waiting_key`]), set to lapse with the lock's lease. The holder's
//! `UNLOCK` deletes that key and,
//! only if it was there, publishes the lock's key on the ledger's channel
//! ([`channel`]): a release nobody waits for sends nothing. Each ledger
//! keeps one subscription to the channel ([`listen`]) and wakes the waiters
//! in this process of the lock released ([`Releases`]).
//!
//! A waiter waits for the release or for the end of the lock's lease,
//! whichever comes first: a holder that dies releases nothing, and its lock
//! lapses. Once its first try found the lock held, it registers its interest
//! and tries again at once, and before each try after: a release between a
//! try and the wait still wakes it, and an untaken lock costs no interest.
//! It waits so only when a release will
//! be heard: while the subscription is down (not made yet, lost, refused)
//! every waiter is woken and tries again every 5 ms, as does the waiter of a
//! lock held by an older version (whose token lacks the `w` that says its
//! holder publishes its release) or of a lock no waiting key can share a
//! hash slot with.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::cluster_routing::Slot;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio_util::sync::CancellationToken;

/// How often the subscription is asked whether it is still there: a
/// connection cut without a word (a network partition) is found within
/// this and the answer's time limit.
const PING_EVERY: Duration = Duration::from_secs(10);

/// How long a subscription may take to be made, or a ping to be answered.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The channel a released lock's key is published on when a waiter marked
/// it: under the prefix, like the keys, for an ACL that grants channels by
/// pattern (`&posbridge:*`).
pub(super) fn channel(prefix: &str) -> String {
    format!("{prefix}lock-released")
}

/// The key that marks the lock `lock` (`Plock:<name>`) waited for:
/// `Pwaiting:<name>`, or `Pwaiting:{Plock:<name>}` where that one lies in
/// another hash slot than the lock (a lock key without a hash tag), since
/// on a cluster the scripts that set and delete it touch the lock too.
/// `None` for a lock neither shares a slot with (a lock key without a hash
/// tag that holds a `}`, or under a prefix whose first `{` is not closed
/// or closed at once): its waiters poll.
pub(super) fn waiting_key(prefix: &str, lock: &str) -> Option<String> {
    let name = lock.strip_prefix(prefix)?.strip_prefix("lock:")?;
    let slot = Slot::for_key(lock);
    [
        format!("{prefix}waiting:{name}"),
        format!("{prefix}waiting:{{{lock}}}"),
    ]
    .into_iter()
    .find(|waiting| Slot::for_key(waiting) == slot)
}

/// The waiters in this process of locks other processes hold, by lock key,
/// and whether their releases are heard.
#[derive(Default)]
pub(super) struct Releases {
    /// A lock's key → what wakes its waiters, and how many wait.
    waiting: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    /// Whether the subscription is up: only then is a release published to
    /// a waiter heard.
    heard: AtomicBool,
}

impl Releases {
    /// A waiter's interest in the release of the lock at `key`, held until
    /// it took the lock (or gave up).
    pub(super) fn interest(self: &Arc<Self>, key: &str) -> Interest {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let (notify, count) = waiting.entry(key.to_owned()).or_default();
        *count += 1;
        Interest {
            releases: self.clone(),
            key: key.to_owned(),
            notify: notify.clone(),
        }
    }

    /// Whether a release published now reaches this process.
    pub(super) fn heard(&self) -> bool {
        self.heard.load(Ordering::Acquire)
    }

    /// The lock at `key` was released: its waiters try again.
    fn released(&self, key: &[u8]) {
        let Ok(key) = std::str::from_utf8(key) else {
            return;
        };
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = waiting.get(key) {
            notify.notify_waiters();
        }
    }

    /// The subscription went up or down: every waiter tries again, and
    /// then waits as it now can (a release published while it was down was
    /// not heard).
    fn heard_now(&self, heard: bool) {
        self.heard.store(heard, Ordering::Release);
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        for (notify, _) in waiting.values() {
            notify.notify_waiters();
        }
    }
}

/// A waiter's interest in one lock's release.
pub(super) struct Interest {
    releases: Arc<Releases>,
    key: String,
    notify: Arc<Notify>,
}

impl Interest {
    /// Completes at the next release of the lock (or change of the
    /// subscription) after it is enabled: enable it before the try whose
    /// failure it waits after.
    pub(super) fn released(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut waiting = self
            .releases
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, count)) = waiting.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// Keeps one subscription to `channel` and wakes the waiters of each lock
/// released, until `stop`. It is made on one of `servers` (one server, or
/// the nodes a cluster was given: a cluster's `PUBLISH` reaches every
/// node), the next one in turn after a failure, again at once when it was
/// lost and then after growing pauses (up to ten seconds) while it fails.
pub(super) async fn listen(
    releases: Arc<Releases>,
    servers: Vec<redis::Client>,
    channel: String,
    stop: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = subscribed(&releases, &servers, &channel) => {}
    }
    releases.heard_now(false);
}

/// [`listen`] until stopped.
async fn subscribed(releases: &Releases, servers: &[redis::Client], channel: &str) {
    let new_pauses = || {
        backon::BackoffBuilder::build(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(10))
                .with_jitter()
                .without_max_times(),
        )
    };
    let mut pauses = new_pauses();
    let mut failing = false;
    for server in servers.iter().cycle() {
        match subscribe(server, channel).await {
            Ok(pubsub) => {
                releases.heard_now(true);
                if failing {
                    tracing::info!(
                        "The Redis ledger hears lock releases again: a waiter for another process's lock is woken by its release."
                    );
                }
                pauses = new_pauses();
                let error = hear(releases, pubsub).await;
                releases.heard_now(false);
                tracing::warn!(
                    %error,
                    "The Redis ledger's subscription to lock releases was lost: until it is made again, a waiter for another process's lock tries it every 5 ms."
                );
                failing = true;
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(
                        %error,
                        "The Redis ledger cannot subscribe to lock releases (an ACL without the channel {channel}?): until it can, a waiter for another process's lock tries it every 5 ms."
                    );
                }
                failing = true;
                tokio::time::sleep(pauses.next().unwrap_or(Duration::from_secs(10))).await;
            }
        }
    }
}

/// A subscription to `channel` on `server`.
async fn subscribe(server: &redis::Client, channel: &str) -> Result<redis::aio::PubSub, String> {
    let subscribed = async {
        let mut pubsub = server.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    match tokio::time::timeout(TIMEOUT, subscribed).await {
        Ok(Ok(pubsub)) => Ok(pubsub),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no subscription within {TIMEOUT:?}")),
    }
}

/// Wakes the waiters of each lock whose release `pubsub` hears, until it
/// is lost: why.
async fn hear(releases: &Releases, pubsub: redis::aio::PubSub) -> String {
    let (mut sink, mut messages) = pubsub.split();
    let mut pings = tokio::time::interval(PING_EVERY);
    pings.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    pings.reset();
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => releases.released(message.get_payload_bytes()),
                None => return "the connection closed".to_owned(),
            },
            _ = pings.tick() => {
                match tokio::time::timeout(TIMEOUT, sink.ping::<redis::Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(error)) => return error.to_string(),
                    Err(_) => return format!("no answer to a PING within {TIMEOUT:?}"),
                }
            }
        }
    }
}
