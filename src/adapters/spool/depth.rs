//! How deep the spool was, minute by minute, over the last hour: the status
//! page's spool chart. The spool notes its depth whenever it changes (an
//! append, a removal), so a minute without a change has the depth the last
//! change left, and a minute with several has the deepest of them: an
//! outage that filled and drained within one minute still shows.

use std::collections::VecDeque;

/// Minutes kept: the status page's hour.
pub const MINUTES: usize = 60;

/// The depth per minute of the last [`MINUTES`].
#[derive(Debug, Default)]
pub struct DepthHistory {
    /// `(unix minute, deepest, last)`, oldest first, at most one per minute.
    minutes: VecDeque<(i64, u64, u64)>,
    /// The last depth noted in a minute dropped from the window.
    before: u64,
}

impl DepthHistory {
    /// Notes the depth `depth` in unix minute `minute`. A note for a minute
    /// older than the newest (a race between two changes across a minute's
    /// end) counts for the newest.
    pub fn note(&mut self, minute: i64, depth: u64) {
        match self.minutes.back_mut() {
            Some((newest, deepest, last)) if *newest >= minute => {
                *deepest = (*deepest).max(depth);
                *last = depth;
            }
            _ => self.minutes.push_back((minute, depth, depth)),
        }
        let newest = self.minutes.back().map_or(minute, |m| m.0);
        while self
            .minutes
            .front()
            .is_some_and(|m| m.0 <= newest - MINUTES as i64)
        {
            if let Some((_, _, last)) = self.minutes.pop_front() {
                self.before = last;
            }
        }
    }

    /// The deepest depth of each of the [`MINUTES`] minutes up to
    /// `now_minute`, oldest first.
    pub fn per_minute(&self, now_minute: i64) -> Vec<u64> {
        let mut carried = self.before;
        let mut noted = self.minutes.iter().peekable();
        (now_minute - MINUTES as i64 + 1..=now_minute)
            .map(|minute| {
                while noted.peek().is_some_and(|m| m.0 < minute) {
                    carried = noted.next().map_or(carried, |m| m.2);
                }
                match noted.peek() {
                    Some(&&(at, deepest, last)) if at == minute => {
                        noted.next();
                        carried = last;
                        deepest
                    }
                    _ => carried,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_shows_its_deepest_and_quiet_minutes_carry_the_last_depth() {
        let mut history = DepthHistory::default();
        history.note(1000, 3);
        history.note(1000, 7);
        history.note(1000, 2);
        history.note(1003, 0);
        let depths = history.per_minute(1004);
        assert_eq!(depths.len(), MINUTES);
        assert_eq!(&depths[MINUTES - 5..], &[7, 2, 2, 0, 0]);
        assert!(depths[..MINUTES - 5].iter().all(|&d| d == 0));
    }

    #[test]
    fn minutes_older_than_the_hour_are_dropped_but_their_last_depth_carries() {
        let mut history = DepthHistory::default();
        history.note(0, 5);
        history.note(10, 4);
        history.note(100, 9);
        assert_eq!(history.minutes.len(), 1);
        let depths = history.per_minute(100);
        assert_eq!(depths[MINUTES - 1], 9);
        assert!(depths[..MINUTES - 1].iter().all(|&d| d == 4), "{depths:?}");
    }

    #[test]
    fn a_late_note_counts_for_the_newest_minute() {
        let mut history = DepthHistory::default();
        history.note(50, 1);
        history.note(49, 6);
        assert_eq!(history.per_minute(50)[MINUTES - 1], 6);
    }
}
