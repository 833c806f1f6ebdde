//! Fair shares: a bound per source on the deliveries it has in flight,
//! which bites only while the process is busy, and only on a source that
//! holds far more than the others.
//!
//! Every verified delivery takes a [`Place`] before the pipeline sees it,
//! and keeps it until its outcome (on the delivery's own task, so a
//! provider that hangs up does not free its place early). A source's first
//! `share` places are its own (a slot of its semaphore); past them it may
//! borrow while fewer than `busy` deliveries are in flight in the whole
//! process, so a lone merchant on a quiet server is never slowed. Once the
//! process is busy, a source past its share is over it ([`OverShare`])
//! when it holds at least [`OVER_THE_OTHERS`] times what the busiest other
//! active source holds: one merchant replaying a day of sales
//! holds at most its share of what is in flight (plus what it borrowed
//! before the process turned busy), and the others' deliveries are taken
//! in at once. A source is active while it has a delivery in flight or had
//! one end within [`RECENT`]: a merchant sending one sale every 40 ms is
//! rarely in flight at the instant a flood's delivery arrives, yet it is
//! the one the share protects. Equal sources behind a slow broker, none
//! holding twice another, are never held to their shares (nor beside many
//! small merchants that hold little: the busiest other, not the average,
//! is the measure), nor is a
//! source alone: holding it back would protect nobody, and a slow broker
//! is no merchant's doing, while each refusal would spend one of its
//! provider's attempts (ten Mekari deliveries in a row failing for good
//! pause its endpoint). A newcomer's first deliveries are within its share
//! and taken in at once; from then on, while the newcomer stays active,
//! the lone source is held to twice what the newcomer holds.
//!
//! What an over-share delivery gets is the handler's to decide, by what its
//! provider understands (`webhook.rs`): 429 + `Retry-After` for one that
//! honours the header, a wait for its share (then the spool, or taken in
//! anyway) for one that counts every non-2xx against the webhook.
//!
//! A source's slots are tokio's [`Semaphore`]: its waiters are served
//! first come, first served, and a slot is a value
//! ([`OwnedSemaphorePermit`]) given back when the delivery's place drops,
//! whatever way the delivery ends (answered, cut by the client, panicked).
//! The counts are atomics read on every delivery; an approximate "busy" or
//! busiest (two deliveries racing past the mark) is harmless. Which other
//! sources are active, and the two busiest, are looked up only for a
//! delivery past its share in a busy process, over the sources that have
//! had a delivery (held weakly: a source removed from the configuration
//! leaves with its last delivery), at most once a millisecond: a flood's
//! deliveries share one look.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How many times what the busiest other active source holds a source past
/// its share holds before it is over its share in a busy process: equal
/// sources hold about as much each, a flood many times it.
pub const OVER_THE_OTHERS: usize = 2;

/// How long after its last delivery ended a source still counts as active:
/// long past a steady merchant's gap between two sales, short enough that
/// a merchant gone quiet stops holding a flood back within a second.
pub const RECENT: Duration = Duration::from_secs(1);

/// The share settings, from `[server]` (see `ServerConfig`).
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    /// Deliveries in flight, all sources together, from which the process
    /// is busy and shares apply.
    pub busy: usize,
    /// A source's share when it sets none (`max_in_flight`).
    pub default_share: usize,
    /// `Retry-After` of the 429 answered to a source over its share whose
    /// provider honours it.
    pub retry_after_secs: u64,
}

/// The shares of every source and the process's count. Cheap to clone.
#[derive(Clone)]
pub struct FairShares(Arc<Shares>);

struct Shares {
    /// Deliveries holding a place now, every source together.
    in_flight: AtomicUsize,
    /// Every source that has had a delivery, to find the active ones, and
    /// the last look at them.
    sources: Mutex<Registry>,
    /// What a source's [`SourceSlots::last_ended`] counts from.
    epoch: Instant,
    /// How many times a source with nothing in flight took a place: a
    /// look at the sources older than the last is looked at again.
    arrivals: AtomicU64,
    /// From how many in flight shares apply.
    busy: usize,
    /// A source's share when it sets none.
    default_share: usize,
    /// `Retry-After` of a share's 429.
    retry_after_secs: u64,
}

/// The sources that have had a delivery, and the last look at them.
#[derive(Default)]
struct Registry {
    sources: Vec<Weak<SourceSlots>>,
    /// The millisecond it was taken, the sources turned active by then
    /// ([`Shares::arrivals`]), and what it found.
    look: Option<(u64, u64, Look)>,
}

/// The active sources at one look: how many, and the two that held the
/// most then (a source's busiest other is the first, unless it is the
/// first), whose counts are read afresh at each use.
#[derive(Clone, Default)]
struct Look {
    active: usize,
    busiest: [Option<Arc<SourceSlots>>; 2],
}

impl Look {
    /// Active sources other than `me`, and what the busiest of them holds
    /// now.
    fn others_of(&self, me: &Arc<SourceSlots>, me_active: bool) -> (usize, usize) {
        let busiest = self
            .busiest
            .iter()
            .flatten()
            .find(|other| !Arc::ptr_eq(other, me))
            .map_or(0, |other| other.held.load(Ordering::Acquire));
        (
            self.active - usize::from(me_active && self.active > 0),
            busiest,
        )
    }
}

impl Registry {
    /// The active sources now (`now`: ms since the shares' epoch), the
    /// sources that are gone forgotten.
    fn look_now(&mut self, now: u64) -> Look {
        self.sources.retain(|other| other.strong_count() > 0);
        let mut look = Look::default();
        let mut held = [0; 2];
        for source in self.sources.iter().filter_map(Weak::upgrade) {
            if !source.is_active(now) {
                continue;
            }
            look.active += 1;
            let holds = source.held.load(Ordering::Acquire);
            if look.busiest[0].is_none() || holds > held[0] {
                look.busiest[1] = look.busiest[0].replace(source);
                held = [holds, held[0]];
            } else if look.busiest[1].is_none() || holds > held[1] {
                look.busiest[1] = Some(source);
                held[1] = holds;
            }
        }
        look
    }
}

/// One source's share: its own setting and its slots. Cheap to clone; the
/// slots are made at its first delivery, with the server's default share
/// when the source sets none.
#[derive(Clone, Default)]
pub struct SourceShare(Arc<SourceSlots>);

#[derive(Default)]
struct SourceSlots {
    /// The source's `max_in_flight`, when it sets one.
    own: Option<usize>,
    /// One permit per delivery of its share.
    slots: OnceLock<Arc<Semaphore>>,
    /// Its deliveries holding a place now (its slots', borrowed and taken
    /// over its share alike).
    held: AtomicUsize,
    /// When its last delivery let go of its place: milliseconds since the
    /// shares' epoch, plus one; 0 while none has.
    last_ended: AtomicU64,
}

impl SourceSlots {
    /// Whether it has a delivery in flight or had one end within
    /// [`RECENT`], `now` being milliseconds since the shares' epoch.
    fn is_active(&self, now: u64) -> bool {
        // `held` first: a place's drop stores `last_ended` before it lets
        // go of `held`, so a 0 read here sees the end it follows.
        let held = self.held.load(Ordering::Acquire);
        let ended = self.last_ended.load(Ordering::Acquire);
        held > 0 || (ended > 0 && (now + 1).saturating_sub(ended) <= RECENT.as_millis() as u64)
    }
}

/// A source's delivery is over its share while the process is busy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverShare;

/// A delivery's place in flight: counted in the process's total while it
/// lives, holding a slot of its source's share unless it borrowed.
#[must_use = "the delivery holds its place only while this lives"]
pub struct Place {
    /// The count this place is part of.
    shares: Arc<Shares>,
    /// Its source's count.
    source: Arc<SourceSlots>,
    /// Its source's slot; `None` when it borrowed or was taken anyway.
    _slot: Option<OwnedSemaphorePermit>,
}

impl Drop for Place {
    fn drop(&mut self) {
        // Only the end of a source's last place in flight says when it was
        // last active (while it holds others it is active anyway): a busy
        // source's deliveries read no clock. Stored before `held` lets go,
        // so a reader that sees 0 sees the end (two last places dropping
        // at once may both skip it: the source then reads as idle a second
        // early, which is harmless).
        if self.source.held.load(Ordering::Acquire) == 1 {
            self.source
                .last_ended
                .store(self.shares.now() + 1, Ordering::Release);
        }
        self.source.held.fetch_sub(1, Ordering::AcqRel);
        self.shares.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shares {
    /// Milliseconds since the epoch.
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }
}

impl SourceShare {
    /// A source's share: `own` deliveries in flight while the process is
    /// busy, or the server's default when `None`.
    pub fn new(own: Option<usize>) -> SourceShare {
        SourceShare(Arc::new(SourceSlots {
            own,
            slots: OnceLock::new(),
            held: AtomicUsize::new(0),
            last_ended: AtomicU64::new(0),
        }))
    }
}

impl FairShares {
    /// The shares, with no delivery in flight.
    pub fn new(settings: ShareSettings) -> FairShares {
        FairShares(Arc::new(Shares {
            in_flight: AtomicUsize::new(0),
            sources: Mutex::default(),
            epoch: Instant::now(),
            arrivals: AtomicU64::new(0),
            busy: settings.busy,
            // A share of 0 would refuse every delivery of a busy process.
            default_share: settings.default_share.max(1),
            retry_after_secs: settings.retry_after_secs,
        }))
    }

    /// A place for a delivery of `source` at once: a slot of its share, or
    /// borrowed while the process is not busy or the source holds less than
    /// [`OVER_THE_OTHERS`] times what the busiest other active source holds.
    ///
    /// # Errors
    /// [`OverShare`] when its share is taken, the process is busy and the
    /// source holds that much more than the others.
    pub fn try_admit(&self, source: &SourceShare) -> Result<Place, OverShare> {
        if let Ok(slot) = self.slots(source).try_acquire_owned() {
            return Ok(self.place(source, Some(slot)));
        }
        let before = self.0.in_flight.load(Ordering::Acquire);
        if before >= self.0.busy && self.far_above_the_others(source) {
            return Err(OverShare);
        }
        Ok(self.place(source, None))
    }

    /// Whether `source` holds at least [`OVER_THE_OTHERS`] times what the
    /// busiest other active source holds; a source alone does not.
    fn far_above_the_others(&self, source: &SourceShare) -> bool {
        let now = self.0.now();
        let arrivals = self.0.arrivals.load(Ordering::Acquire);
        let look = {
            let mut registry = self
                .0
                .sources
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match &registry.look {
                Some((at, seen, look)) if *at == now && *seen == arrivals => look.clone(),
                _ => {
                    let look = registry.look_now(now);
                    registry.look = Some((now, arrivals, look.clone()));
                    look
                }
            }
        };
        let (others_active, busiest) = look.others_of(&source.0, source.0.is_active(now));
        let mine = source.0.held.load(Ordering::Acquire);
        others_active > 0 && mine >= OVER_THE_OTHERS * busiest
    }

    /// A place for a delivery of `source` over its share, waiting until
    /// `until` for a slot of its share to come free (first come, first
    /// served); `None` when none did.
    pub async fn wait_for(&self, source: &SourceShare, until: Instant) -> Option<Place> {
        let slots = self.slots(source);
        match tokio::time::timeout_at(until, slots.acquire_owned()).await {
            Ok(Ok(slot)) => Some(self.place(source, Some(slot))),
            // The slots are never closed; a closed one is treated as a
            // wait that ran out.
            Ok(Err(_)) | Err(_) => None,
        }
    }

    /// A place over its share all the same, for a delivery that must not
    /// be refused and cannot be spooled.
    pub fn take_anyway(&self, source: &SourceShare) -> Place {
        self.place(source, None)
    }

    /// `Retry-After` (seconds) of a share's 429.
    pub fn retry_after_secs(&self) -> u64 {
        self.0.retry_after_secs
    }

    /// Deliveries holding a place now.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::Acquire)
    }

    /// `source`'s slots, made at its first delivery.
    fn slots(&self, source: &SourceShare) -> Arc<Semaphore> {
        source
            .0
            .slots
            .get_or_init(|| {
                let mut registry = self
                    .0
                    .sources
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                registry.sources.retain(|other| other.strong_count() > 0);
                registry.sources.push(Arc::downgrade(&source.0));
                let share = source.0.own.unwrap_or(self.0.default_share).max(1);
                Arc::new(Semaphore::new(share))
            })
            .clone()
    }

    /// A place of `source` counted in the totals, with `slot` if it has one.
    fn place(&self, source: &SourceShare, slot: Option<OwnedSemaphorePermit>) -> Place {
        self.0.in_flight.fetch_add(1, Ordering::AcqRel);
        if source.0.held.fetch_add(1, Ordering::AcqRel) == 0 {
            self.0.arrivals.fetch_add(1, Ordering::AcqRel);
        }
        Place {
            shares: self.0.clone(),
            source: source.0.clone(),
            _slot: slot,
        }
    }
}

impl fmt::Debug for FairShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairShares")
            .field("in_flight", &self.in_flight())
            .field("busy", &self.0.busy)
            .field("default_share", &self.0.default_share)
            .finish()
    }
}

impl fmt::Debug for SourceShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceShare")
            .field("own", &self.0.own)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn shares(busy: usize, default_share: usize) -> FairShares {
        FairShares::new(ShareSettings {
            busy,
            default_share,
            retry_after_secs: 60,
        })
    }

    #[test]
    fn a_lone_source_is_not_held_to_its_share_however_busy_the_process_is() {
        let shares = shares(8, 2);
        let source = SourceShare::new(None);
        // Busy from the eighth on, and past its share: alone, it is taken in.
        let places: Vec<Place> = (0..20)
            .map(|_| shares.try_admit(&source).unwrap())
            .collect();
        assert_eq!(shares.in_flight(), 20);
        // A newcomer is taken in within its share, and from then on the
        // lone source is held to twice what the newcomer holds.
        let newcomer = SourceShare::new(None);
        let first = shares.try_admit(&newcomer).unwrap();
        assert_eq!(shares.try_admit(&source).err(), Some(OverShare));
        drop((places, first));
        assert_eq!(shares.in_flight(), 0);
        assert!(shares.try_admit(&source).is_ok());
    }

    /// A merchant sending one sale at a time is rarely in flight when a
    /// flood's delivery arrives: it protects it for [`RECENT`] after its
    /// last delivery ended, and then no longer.
    #[tokio::test(start_paused = true)]
    async fn a_source_between_two_deliveries_still_holds_a_flood_to_its_share() {
        let shares = shares(4, 2);
        let (flood, quiet) = (SourceShare::new(None), SourceShare::new(None));
        drop(shares.try_admit(&quiet).unwrap());
        tokio::time::advance(RECENT / 2).await;
        let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&flood).ok())
            .take(100)
            .collect();
        assert_eq!(flooding.len(), 4, "its share and two borrowed until busy");
        // Gone quiet for longer than RECENT: the flood is alone again.
        tokio::time::advance(RECENT).await;
        assert!(shares.try_admit(&flood).is_ok());
    }

    /// Small merchants sending now and then are active, holding nothing
    /// in flight; two equal big sources behind a slow broker are not held
    /// for being far above their average: the busiest other is the measure.
    #[tokio::test(start_paused = true)]
    async fn equal_sources_beside_small_merchants_are_not_held_to_their_shares() {
        let shares = shares(8, 2);
        let small: Vec<SourceShare> = (0..10).map(|_| SourceShare::new(None)).collect();
        for merchant in &small {
            drop(shares.try_admit(merchant).unwrap());
        }
        let (a, b) = (SourceShare::new(None), SourceShare::new(None));
        let mut places = Vec::new();
        for _round in 0..20 {
            for source in [&a, &b] {
                places.push(shares.try_admit(source).expect("an equal source refused"));
            }
        }
        assert_eq!(shares.in_flight(), 40);
    }

    #[test]
    fn a_source_within_its_share_is_taken_in_however_busy_the_process_is() {
        let shares = shares(4, 2);
        let (flood, quiet) = (SourceShare::new(None), SourceShare::new(None));
        let first = shares.try_admit(&quiet).unwrap();
        let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&flood).ok())
            .take(100)
            .collect();
        // Its share and one borrowed before the process turned busy; then
        // it holds 3, past twice the quiet source's 1: over its share.
        assert_eq!(flooding.len(), 3);
        assert_eq!(shares.in_flight(), 4);
        // The quiet source's own share is taken in however busy it is...
        let second = shares.try_admit(&quiet).unwrap();
        // ...and past it, holding less than the flood, it borrows until it
        // holds twice as much.
        let more: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&quiet).ok())
            .take(100)
            .collect();
        assert_eq!(
            more.len(),
            4,
            "2 of its share + 4 borrowed = 2 × the flood's 3"
        );
        drop((first, second, more));
        // A slot of the flood's own share comes free: it may take one more.
        drop(flooding);
        assert!(shares.try_admit(&flood).is_ok());
    }

    /// A slow broker keeps every source's deliveries in flight longer: the
    /// process turns busy with no merchant flooding, and equal sources are
    /// not refused (a Mekari source would have been answered 429 and spent
    /// one of its attempts on every delivery past its share).
    #[test]
    fn equal_sources_behind_a_slow_broker_are_not_held_to_their_shares() {
        let shares = shares(8, 2);
        let sources: Vec<SourceShare> = (0..4).map(|_| SourceShare::new(None)).collect();
        let mut places = Vec::new();
        for _round in 0..10 {
            for source in &sources {
                places.push(shares.try_admit(source).expect("an equal source refused"));
            }
        }
        assert_eq!(shares.in_flight(), 40);
        // One of them sending far more than the others is held, though.
        let flood = &sources[0];
        let flooding: Vec<Place> = std::iter::from_fn(|| shares.try_admit(flood).ok())
            .take(100)
            .collect();
        assert_eq!(flooding.len(), 10, "up to twice the others' 10 each");
        assert_eq!(shares.try_admit(flood).err(), Some(OverShare));
    }

    #[test]
    fn a_source_s_own_setting_replaces_the_default_share() {
        let shares = shares(0, 2);
        // Another source in flight: a source alone is not held at all.
        let other = shares.try_admit(&SourceShare::new(None)).unwrap();
        let big = SourceShare::new(Some(5));
        let places: Vec<Place> = std::iter::from_fn(|| shares.try_admit(&big).ok())
            .take(100)
            .collect();
        assert_eq!(places.len(), 5);
        // A share of 0 would refuse every delivery: it is at least 1.
        let zero = SourceShare::new(Some(0));
        assert!(shares.try_admit(&zero).is_ok());
        drop(other);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_delivery_gets_the_first_slot_that_comes_free_or_none() {
        let shares = shares(0, 1);
        let source = SourceShare::new(None);
        let first = shares.try_admit(&source).unwrap();
        let waiting = {
            let shares = shares.clone();
            let source = source.clone();
            tokio::spawn(async move {
                shares
                    .wait_for(&source, Instant::now() + Duration::from_secs(3))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(first);
        let place = waiting.await.unwrap().expect("the slot that came free");
        // Nothing comes free now: the wait runs out.
        let started = Instant::now();
        let none = shares
            .wait_for(&source, Instant::now() + Duration::from_secs(3))
            .await;
        assert!(none.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        assert_eq!(shares.in_flight(), 1);
        let over = shares.take_anyway(&source);
        assert_eq!(shares.in_flight(), 2);
        drop((place, over));
        assert_eq!(shares.in_flight(), 0);
    }
}
