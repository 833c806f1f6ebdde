//! Time in the simulator: the compressed retry clock, the event clock and the
//! providers' timestamp formats.
//!
//! Two clocks run side by side. Retry schedules are documented in minutes and
//! hours; [`TimeScale`] turns them into real waits (`--time-scale 600`: one
//! documented hour is six real seconds). Event times are the real wall clock,
//! taken from [`EventClock`], which never hands out the same millisecond twice
//! so every entity's events are strictly ordered.

use std::sync::Mutex;
use std::time::Duration;

use time::format_description::BorrowedFormatItem;
use time::macros::{format_description, offset};
use time::{OffsetDateTime, UtcOffset};

/// Mekari POS reports times in Western Indonesia Time.
pub const MEKARI_OFFSET: UtcOffset = offset!(+7);

/// `2026-11-29T10:15:30.123Z`: ReceiptRoller's `timestamp`.
const UTC_MILLIS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
/// `2026-11-29T10:15:29Z`: ReceiptRoller's `transaction_at`.
const UTC_SECONDS: &[BorrowedFormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
/// `2026-11-29T17:15:30.120+07:00`: Mekari's `occurred_at` and `updated_at`.
const OFFSET_MILLIS: &[BorrowedFormatItem<'static>] = format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3][offset_hour sign:mandatory]:[offset_minute]"
);
/// `2026-11-29T17:14:02+07:00`: Mekari's `sold_at`.
const OFFSET_SECONDS: &[BorrowedFormatItem<'static>] = format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second][offset_hour sign:mandatory]:[offset_minute]"
);
/// `2026-11`: the month part of a ReceiptRoller sale id.
const YEAR_MONTH: &[BorrowedFormatItem<'static>] = format_description!("[year]-[month]");

/// Compresses documented provider delays into real waits.
#[derive(Debug, Clone, Copy)]
pub struct TimeScale {
    /// Documented seconds per real second; 600 turns an hour into six seconds.
    factor: f64,
}

impl TimeScale {
    /// A scale; `factor` must be positive and finite (checked by the CLI).
    pub fn new(factor: f64) -> TimeScale {
        TimeScale { factor }
    }

    /// The real wait for a documented delay.
    pub fn real(self, documented: Duration) -> Duration {
        Duration::try_from_secs_f64(documented.as_secs_f64() / self.factor).unwrap_or(Duration::MAX)
    }
}

/// Hands out event times: the wall clock at millisecond precision, never the
/// same or an earlier millisecond twice.
#[derive(Debug, Default)]
pub struct EventClock {
    /// The last millisecond handed out, since the Unix epoch.
    last_ms: Mutex<i128>,
}

impl EventClock {
    /// The current time, strictly later than every earlier answer.
    pub fn now(&self) -> OffsetDateTime {
        let wall_ms = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        // A poisoned lock only means another thread panicked mid-update of an
        // integer; the value is still usable.
        let mut last = self
            .last_ms
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let ms = wall_ms.max(*last + 1);
        *last = ms;
        OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }
}

fn format(at: OffsetDateTime, items: &[BorrowedFormatItem<'_>]) -> String {
    // Formatting a valid date with a fixed description cannot fail; an empty
    // string would show up in any test that compares times.
    at.format(items).unwrap_or_default()
}

/// ReceiptRoller's send time: UTC, milliseconds, `Z`.
pub fn receiptroller_timestamp(at: OffsetDateTime) -> String {
    format(at.to_offset(UtcOffset::UTC), UTC_MILLIS)
}

/// ReceiptRoller's business time (`transaction_at`): UTC, whole seconds.
pub fn receiptroller_seconds(at: OffsetDateTime) -> String {
    format(at.to_offset(UtcOffset::UTC), UTC_SECONDS)
}

/// The `yyyy-MM` in a ReceiptRoller sale id, from its `transaction_at` (UTC).
pub fn receiptroller_month(at: OffsetDateTime) -> String {
    format(at.to_offset(UtcOffset::UTC), YEAR_MONTH)
}

/// Mekari's event time (`occurred_at`, `updated_at`): +07:00, milliseconds.
pub fn mekari_timestamp(at: OffsetDateTime) -> String {
    format(at.to_offset(MEKARI_OFFSET), OFFSET_MILLIS)
}

/// Mekari's business time (`sold_at`): +07:00, whole seconds.
pub fn mekari_seconds(at: OffsetDateTime) -> String {
    format(at.to_offset(MEKARI_OFFSET), OFFSET_SECONDS)
}

/// Drops the sub-second part, for business times the providers keep in seconds.
pub fn whole_seconds(at: OffsetDateTime) -> OffsetDateTime {
    at.replace_nanosecond(0).unwrap_or(at)
}

/// Crockford's base-32 alphabet, as ULIDs use it.
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A ULID-shaped id (26 characters): 48 bits of milliseconds, then 80 random
/// bits. Ids made later sort later, like Mekari's event ids.
pub fn ulid(at: OffsetDateTime, random: u128) -> String {
    let ms = u128::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0) & ((1 << 48) - 1);
    let value = (ms << 80) | (random & ((1 << 80) - 1));
    (0..26)
        .map(|i| {
            let shift = 125 - 5 * i;
            char::from(CROCKFORD[usize::try_from((value >> shift) & 31).unwrap_or(0)])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn provider_formats_match_the_documented_examples() {
        let at = datetime!(2026-11-29 10:15:30.123456 UTC);
        assert_eq!(receiptroller_timestamp(at), "2026-11-29T10:15:30.123Z");
        assert_eq!(receiptroller_seconds(at), "2026-11-29T10:15:30Z");
        assert_eq!(receiptroller_month(at), "2026-11");
        assert_eq!(mekari_timestamp(at), "2026-11-29T17:15:30.123+07:00");
        assert_eq!(mekari_seconds(at), "2026-11-29T17:15:30+07:00");
    }

    #[test]
    fn scale_divides_documented_time() {
        let scale = TimeScale::new(600.0);
        assert_eq!(
            scale.real(Duration::from_secs(3600)),
            Duration::from_secs(6)
        );
        assert_eq!(
            scale.real(Duration::from_secs(60)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn event_clock_never_repeats_a_millisecond() {
        let clock = EventClock::default();
        let mut last = clock.now();
        for _ in 0..1000 {
            let next = clock.now();
            assert!(next > last);
            assert_eq!(next.nanosecond() % 1_000_000, 0);
            last = next;
        }
    }

    #[test]
    fn ulids_are_26_crockford_characters_in_time_order() {
        let early = ulid(datetime!(2026-11-29 10:15:30 UTC), u128::MAX);
        let late = ulid(datetime!(2026-11-29 10:15:30.001 UTC), 0);
        assert_eq!(early.len(), 26);
        assert!(early.bytes().all(|b| CROCKFORD.contains(&b)));
        assert!(late > early);
        assert_eq!(ulid(OffsetDateTime::UNIX_EPOCH, 0), "0".repeat(26));
    }
}
