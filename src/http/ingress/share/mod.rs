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
//! A bound in flight does not bound a rate, though: 16 deliveries in
//! flight that each take 2 ms are 8,000 a second, most of a core's worth,
//! and the others' deliveries queue behind them for the CPU and the
//! broker. So a source is also held to a pace (`pace.rs`): while other
//! sources are active, one sending more than its rate
//! (`server.share_per_second`, or the source's `max_per_second`) and at
//! least [`OVER_THE_OTHERS`] times as many a second as the busiest other
//! is paced to the larger of the two; its deliveries wait for their
//! slots ([`Paced::Until`]), and one whose slot lies past its wait is
//! over its pace ([`Paced::Over`]). Arrivals, not what is in flight, say
//! who sends more: a source whose sends are stuck behind a partition with
//! no leader holds more in flight but sends no more than before.
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
//! deliveries share one look. The busiest others by rate are looked up
//! only for a delivery of a source over its rate, at most once every
//! [`RATE_LOOK`].

mod pace;

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

/// How long one look at the sources' rates serves: rates are counted over
/// a second, so a look this old is as good as a new one.
pub const RATE_LOOK: Duration = Duration::from_millis(10);

/// The share settings, from `[server]` (see `ServerConfig`).
#[derive(Debug, Clone, Copy)]
pub struct ShareSettings {
    /// Deliveries in flight, all sources together, from which the process
    /// is busy and shares apply.
    pub busy: usize,
    /// A source's share when it sets none (`max_in_flight`).
    pub default_share: usize,
    /// A source's rate when it sets none (`max_per_second`); 0: no source
    /// is paced.
    pub default_rate: u32,
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
    /// A source's rate when it sets none; 0: none is paced.
    default_rate: u32,
    /// `Retry-After` of a share's 429.
    retry_after_secs: u64,
}

/// The sources that have had a delivery, and the last looks at them.
#[derive(Default)]
struct Registry {
    sources: Vec<Weak<SourceSlots>>,
    /// The last look at what the sources hold in flight: the millisecond
    /// it was taken, the sources turned active by then
    /// ([`Shares::arrivals`]), and what it found.
    look: Option<(u64, u64, Look)>,
    /// The last look at the sources' rates, and the microsecond it was
    /// taken.
    rates: Option<(u64, Look)>,
}

/// The active sources at one look, by a measure (deliveries in flight, or
/// a second): how many, and the two busiest then, whose measure is read
/// afresh at each use (a look serves a while, and two sources starting
/// together double their counts within it).
#[derive(Clone, Default)]
struct Look {
    active: usize,
    busiest: [Option<Arc<SourceSlots>>; 2],
}

impl Look {
    /// The sources `measure` finds active, and the two it finds busiest.
    fn over<T: PartialOrd + Copy>(
        sources: impl Iterator<Item = Arc<SourceSlots>>,
        measure: impl Fn(&SourceSlots) -> Option<T>,
    ) -> Look {
        let mut look = Look::default();
        let mut most: [Option<T>; 2] = [None, None];
        for source in sources {
            let Some(this) = measure(&source) else {
                continue;
            };
            look.active += 1;
            if most[0].is_none_or(|first| this > first) {
                look.busiest[1] = look.busiest[0].replace(source);
                most = [Some(this), most[0]];
            } else if most[1].is_none_or(|second| this > second) {
                look.busiest[1] = Some(source);
                most[1] = Some(this);
            }
        }
        look
    }

    /// Whether `me` was one of the two busiest, and what the busiest other
    /// of them has now by `measure`.
    fn busiest_other<T: PartialOrd + Default>(
        &self,
        me: &Arc<SourceSlots>,
        measure: impl Fn(&SourceSlots) -> T,
    ) -> (bool, T) {
        let mut me_counted = false;
        let mut busiest = T::default();
        for source in self.busiest.iter().flatten() {
            if Arc::ptr_eq(source, me) {
                me_counted = true;
            } else {
                let this = measure(source);
                if this > busiest {
                    busiest = this;
                }
            }
        }
        (me_counted, busiest)
    }
}

impl Registry {
    /// The sources still configured (the others forgotten).
    fn live(&mut self) -> impl Iterator<Item = Arc<SourceSlots>> + '_ {
        self.sources.retain(|other| other.strong_count() > 0);
        self.sources.iter().filter_map(Weak::upgrade)
    }

    /// The active sources now (`now`: ms since the shares' epoch), by what
    /// they hold in flight.
    fn look_now(&mut self, now: u64) -> Look {
        Look::over(self.live(), |source| {
            source
                .is_active(now)
                .then(|| source.held.load(Ordering::Acquire))
        })
    }

    /// The sources that sent within the last [`pace::WINDOW`] at `now`
    /// (microseconds since the epoch), by their rates.
    fn rates_now(&mut self, now: u64) -> Look {
        Look::over(self.live(), |source| {
            let rate = source.pace().rate(now);
            (rate > 0.0).then_some(rate)
        })
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
    /// The source's `max_per_second`, when it sets one.
    own_rate: Option<u32>,
    /// Its arrivals and its schedule.
    pace: Mutex<pace::Pace>,
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
    fn pace(&self) -> std::sync::MutexGuard<'_, pace::Pace> {
        self.pace.lock().unwrap_or_else(PoisonError::into_inner)
    }

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

/// The bound of a source's share a delivery is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareBound {
    /// Its deliveries in flight while the process is busy.
    InFlight,
    /// Its pace: its slot lies past the delivery's wait.
    Pace,
}

impl fmt::Display for ShareBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShareBound::InFlight => "has its share of deliveries in flight",
            ShareBound::Pace => "sends more deliveries a second than its share",
        })
    }
}

/// When a delivery may go on, by its source's pace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paced {
    /// At once: its source is not paced, or within its pace.
    Now,
    /// At its slot, within its wait.
    Until(Instant),
    /// Its slot lies past its wait: over its pace.
    Over,
}

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
    /// busy and a pace of `own_rate` a second, or the server's defaults
    /// where `None`.
    pub fn new(own: Option<usize>, own_rate: Option<u32>) -> SourceShare {
        SourceShare(Arc::new(SourceSlots {
            own,
            own_rate,
            pace: Mutex::default(),
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
            default_rate: settings.default_rate,
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
        if let Ok(slot) = self.slots(source).clone().try_acquire_owned() {
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
            let mut registry = self.registry();
            match &registry.look {
                Some((at, seen, look)) if *at == now && *seen == arrivals => look.clone(),
                _ => {
                    let look = registry.look_now(now);
                    registry.look = Some((now, arrivals, look.clone()));
                    look
                }
            }
        };
        let (_, busiest) =
            look.busiest_other(&source.0, |other| other.held.load(Ordering::Acquire));
        let me_active = source.0.is_active(now);
        let others_active = look.active - usize::from(me_active && look.active > 0);
        let mine = source.0.held.load(Ordering::Acquire);
        others_active > 0 && mine >= OVER_THE_OTHERS * busiest
    }

    /// When a delivery of `source` that arrived at `arrived` may go on by
    /// its source's pace, its wait ending at `until`; counts its arrival.
    ///
    /// Every delivery books its slot at the source's own rate while one is
    /// free (within a burst of [`pace::BURST`] at that rate): a source
    /// within its rate never looks at the others. Past it, the others'
    /// rates say whether it is paced.
    pub fn pace(&self, source: &SourceShare, arrived: Instant, until: Instant) -> Paced {
        let rate = source.0.own_rate.unwrap_or(self.0.default_rate);
        if rate == 0 {
            return Paced::Now;
        }
        self.slots(source);
        let now = self.micros(arrived);
        let (sending, within) = {
            let mut pace = source.0.pace();
            (
                pace.arrive(now),
                pace.book(now, f64::from(rate), now).is_some(),
            )
        };
        if within {
            return Paced::Now;
        }
        let look = {
            let mut registry = self.registry();
            match &registry.rates {
                Some((at, look)) if now.saturating_sub(*at) < RATE_LOOK.as_micros() as u64 => {
                    look.clone()
                }
                _ => {
                    let look = registry.rates_now(now);
                    registry.rates = Some((now, look.clone()));
                    look
                }
            }
        };
        let (me_counted, busiest) = look.busiest_other(&source.0, |other| other.pace().rate(now));
        let others = look.active > usize::from(me_counted);
        let over_the_others = OVER_THE_OTHERS as f64 * busiest;
        if !others || sending < over_the_others {
            // Not paced: its next burst goes on at once, and it is looked
            // at again only past it.
            source.0.pace().restart(now);
            return Paced::Now;
        }
        let per_second = f64::from(rate).max(over_the_others);
        match source.0.pace().book(now, per_second, self.micros(until)) {
            Some(slot) if slot <= now => Paced::Now,
            Some(slot) => Paced::Until(self.0.epoch + Duration::from_micros(slot)),
            None => Paced::Over,
        }
    }

    /// `at` in microseconds since the epoch.
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.0.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// A place for a delivery of `source` over its share, waiting until
    /// `until` for a slot of its share to come free (first come, first
    /// served); `None` when none did.
    pub async fn wait_for(&self, source: &SourceShare, until: Instant) -> Option<Place> {
        let slots = self.slots(source).clone();
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

    /// The sources and the last looks at them, locked.
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `source`'s slots, made (and the source registered) at its first
    /// delivery.
    fn slots<'s>(&self, source: &'s SourceShare) -> &'s Arc<Semaphore> {
        source.0.slots.get_or_init(|| {
            let mut registry = self.registry();
            registry.sources.retain(|other| other.strong_count() > 0);
            registry.sources.push(Arc::downgrade(&source.0));
            let share = source.0.own.unwrap_or(self.0.default_share).max(1);
            Arc::new(Semaphore::new(share))
        })
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
mod tests;
