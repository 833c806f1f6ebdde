//! A source's pace: how many deliveries it sends a second, and the
//! schedule that holds a source sending far faster than the others to a
//! rate.
//!
//! Why arrivals and not deliveries in flight: what a source holds in
//! flight grows as much when its sends are stuck (its partition's leader
//! gone) as when it sends more, and a stuck source must not be refused for
//! it; what it sends a second grows only with what it sends. And a bound
//! in flight does not bound a rate: 16 deliveries in flight that each take
//! 2 ms are 8,000 a second, most of a core's worth.
//!
//! Arrivals are counted in windows of [`WINDOW`]; the rate at an instant is
//! the current window's count plus the previous window's, weighted by the
//! part of it still within the last [`WINDOW`] (a sliding window in two
//! counters). The schedule is the generic cell rate algorithm: each paced
//! delivery books the slot one interval after the last one booked, at most
//! [`BURST`] ahead of its pace without a wait; a delivery waits for its
//! slot, so the deliveries a flood sends at once leave spaced out, in the
//! order they came. A slot past the delivery's wait is not booked: that
//! delivery is over its pace, and the next one finds the same slot free.
//!
//! Every delivery books its slot at its source's own rate while one is
//! free, not only once the source is found sending too much: a flood's
//! first second otherwise went in at once (its rate's worth before the
//! count reached it, 200–500 deliveries in a millisecond), and the others
//! waited behind them (`scripts/bench fairshare`: the others' p99 5–9 ms
//! above the quiet run's). So a source goes past its rate by a burst of
//! [`BURST`] at most before the others' rates are looked at.

use std::time::Duration;

/// The span over which a source's arrivals make its rate.
pub const WINDOW: Duration = Duration::from_secs(1);

/// How far ahead of its pace a paced source may run without a wait: a
/// burst this long at its rate passes at once.
pub const BURST: Duration = Duration::from_millis(100);

const WINDOW_MICROS: u64 = WINDOW.as_micros() as u64;
const BURST_MICROS: u64 = BURST.as_micros() as u64;

/// One source's arrivals and its schedule; times are microseconds since
/// the shares' epoch.
#[derive(Debug, Default)]
pub(super) struct Pace {
    /// The window counted now: its index since the epoch.
    window: u64,
    /// Arrivals in the window counted now.
    count: u32,
    /// Arrivals in the window before it.
    previous: u32,
    /// When the next paced delivery's slot is due, [`BURST`] early.
    due: u64,
}

impl Pace {
    /// Counts an arrival at `now`; the source's rate with it.
    pub(super) fn arrive(&mut self, now: u64) -> f64 {
        let window = now / WINDOW_MICROS;
        match window.saturating_sub(self.window) {
            0 => {}
            1 => (self.previous, self.count) = (self.count, 0),
            _ => (self.previous, self.count) = (0, 0),
        }
        self.window = self.window.max(window);
        self.count = self.count.saturating_add(1);
        self.rate(now)
    }

    /// Arrivals within the last [`WINDOW`] at `now`, estimated.
    pub(super) fn rate(&self, now: u64) -> f64 {
        let window = now / WINDOW_MICROS;
        let (count, previous) = match window.saturating_sub(self.window) {
            0 => (self.count, self.previous),
            1 => (0, self.count),
            _ => return 0.0,
        };
        let into = (now % WINDOW_MICROS) as f64 / WINDOW_MICROS as f64;
        f64::from(count) + f64::from(previous) * (1.0 - into)
    }

    /// Forgets the slots booked: the next [`BURST`] at the source's rate
    /// goes on at once.
    pub(super) fn restart(&mut self, now: u64) {
        self.due = now;
    }

    /// Books the next slot at `per_second` for a delivery at `now`: the
    /// slot, `now` when it is due already; `None`, booking nothing, when
    /// it lies past `until`.
    pub(super) fn book(&mut self, now: u64, per_second: f64, until: u64) -> Option<u64> {
        let interval = (1e6 / per_second.max(1e-3)).max(1.0) as u64;
        let slot = self.due.saturating_sub(BURST_MICROS).max(now);
        if slot > until {
            return None;
        }
        self.due = self.due.max(now).saturating_add(interval);
        Some(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = WINDOW_MICROS;

    #[test]
    fn the_rate_counts_the_last_second_and_forgets_an_idle_source() {
        let mut pace = Pace::default();
        for n in 0..100 {
            pace.arrive(n * SECOND / 100);
        }
        assert_eq!(pace.rate(SECOND - 1), 100.0);
        // Half a second into the next window, half the last one counts.
        assert!((pace.rate(SECOND + SECOND / 2) - 50.0).abs() < 0.01);
        assert_eq!(pace.rate(2 * SECOND), 0.0);
        assert_eq!(pace.arrive(5 * SECOND), 1.0, "a source idle since forgets");
    }

    #[test]
    fn slots_are_spaced_at_the_rate_after_a_burst_and_none_past_the_wait() {
        let mut pace = Pace::default();
        let now = 10 * SECOND;
        let slots: Vec<Option<u64>> = (0..16)
            .map(|_| pace.book(now, 100.0, now + 50_000))
            .collect();
        // 100 ms ahead of its pace at 100 a second: 11 pass at once (the
        // one due now and ten ahead).
        assert!(
            slots[..11].iter().all(|slot| *slot == Some(now)),
            "{slots:?}"
        );
        // Then one each 10 ms, up to the wait's end.
        assert_eq!(slots[11], Some(now + 10_000));
        assert_eq!(slots[15], Some(now + 50_000));
        // Past the wait: nothing booked, so the slot stays for the next.
        assert_eq!(pace.book(now, 100.0, now + 50_000), None);
        assert_eq!(pace.book(now, 100.0, now + 60_000), Some(now + 60_000));
    }
}
