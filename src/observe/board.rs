//! The status board: what the last hour of deliveries, the watchdog's last
//! checks and the reconciler's last runs looked like, kept in memory for the
//! operator's page. Plain data in, a snapshot out; nothing here does I/O.
//!
//! Per source it keeps the last [`RECENT`] deliveries and one bucket per
//! minute for the last hour (counts by what was answered, and a latency
//! histogram for the p99), so its size does not grow with traffic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;

use crate::domain::event::ProviderKind;

/// Deliveries kept per source for the "last deliveries" table.
pub const RECENT: usize = 20;
/// Minutes of history per source: the charts' width and the 1 h counts.
pub const MINUTES: usize = 60;
/// Latency histogram buckets: bucket `i` holds latencies up to
/// `FIRST_BUCKET × GROWTH^i`, 0.1 ms to ~42 s (the last also holds longer).
const BUCKETS: usize = 72;
const FIRST_BUCKET_SECS: f64 = 0.000_1;
const GROWTH: f64 = 1.2;

/// What one request was answered: the `outcome` label and the status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Answer {
    /// `published`, `duplicate`, `stale`, `unchanged`, `dead_lettered`,
    /// `spooled`, `unauthorized`, `rejected` or `unavailable`.
    pub outcome: &'static str,
    /// The HTTP status.
    pub status: u16,
}

impl Answer {
    /// The key the page shows counts under: a 2xx by its outcome, a refusal
    /// by its status (`401`, `400`, `408`, `413`, …, `503`).
    pub fn count_key(self) -> String {
        if (200..300).contains(&self.status) {
            self.outcome.to_owned()
        } else {
            self.status.to_string()
        }
    }
}

/// One delivery as the operator sees it: never the body, never a secret.
#[derive(Debug, Clone, Serialize)]
pub struct Delivery {
    /// When it was answered.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The provider's delivery id, when the request carried one.
    pub delivery_id: Option<compact_str::CompactString>,
    /// The event type, when the body was an event.
    pub event_type: Option<compact_str::CompactString>,
    /// The entity's record key, when it was normalized.
    pub entity_key: Option<String>,
    /// A dead letter's reason code (`time_in_future`, `invalid_field`, …).
    pub dead_letter_reason: Option<&'static str>,
    /// What was answered.
    pub answer: Answer,
    /// From arrival to answer, milliseconds.
    pub latency_ms: f64,
}

/// The webhook's state as the watchdog last saw it.
#[derive(Debug, Clone, Serialize)]
pub struct WebhookSeen {
    /// `active`, `off` (ReceiptRoller's switched-off webhook, Mekari's paused
    /// endpoint), or `unknown` (the provider's API did not say).
    pub state: &'static str,
    /// The provider's words, when off.
    pub detail: Option<String>,
    /// Whether the watchdog switched it back on.
    pub resumed: bool,
    /// When it was checked.
    #[serde(with = "time::serde::rfc3339")]
    pub checked_at: OffsetDateTime,
    /// When the watchdog last saw it active.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_seen_active: Option<OffsetDateTime>,
}

/// A finished reconcile run of one source.
#[derive(Debug, Clone, Serialize)]
pub struct ReconcileRun {
    /// The window asked for (a catch-up or the one-shot command); `None`
    /// for a scheduled run, which reads each list from its checkpoint.
    pub window: Option<Window>,
    /// When it ended.
    #[serde(with = "time::serde::rfc3339")]
    pub finished_at: OffsetDateTime,
    /// Records read from the API.
    pub records: u64,
    /// Records published.
    pub published: u64,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// `ok`, or the error in words.
    pub result: String,
}

/// A time window `[from, to)`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Window {
    /// Start.
    #[serde(with = "time::serde::rfc3339")]
    pub from: OffsetDateTime,
    /// End.
    #[serde(with = "time::serde::rfc3339")]
    pub to: OffsetDateTime,
}

/// One minute of one source.
#[derive(Debug, Clone)]
struct Minute {
    /// Unix minute.
    minute: i64,
    /// Answers by outcome and status: a handful of distinct ones.
    counts: Vec<(Answer, u64)>,
    latencies: [u32; BUCKETS],
}

impl Minute {
    fn new(minute: i64) -> Minute {
        Minute {
            minute,
            counts: Vec::new(),
            latencies: [0; BUCKETS],
        }
    }

    fn requests(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    fn count(&mut self, answer: Answer) {
        match self.counts.iter_mut().find(|(a, _)| *a == answer) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((answer, 1)),
        }
    }
}

/// What the board holds for one source.
#[derive(Debug, Clone, Default)]
struct SourceState {
    recent: VecDeque<Delivery>,
    /// Oldest first, at most one per minute, none older than [`MINUTES`].
    minutes: VecDeque<Minute>,
    signature_failures: u64,
    last_signature_failure: Option<OffsetDateTime>,
    webhook: Option<WebhookSeen>,
    reconcile: Option<ReconcileRun>,
}

impl SourceState {
    /// The bucket of `minute`, made where it belongs when missing (answers
    /// racing across a minute's end may arrive out of order), and the
    /// buckets older than the hour before it dropped.
    fn minute(&mut self, minute: i64) -> &mut Minute {
        let newest = self.minutes.back().map_or(minute, |m| m.minute.max(minute));
        while self
            .minutes
            .front()
            .is_some_and(|m| m.minute <= newest - MINUTES as i64)
        {
            self.minutes.pop_front();
        }
        let at = self.minutes.iter().rposition(|m| m.minute <= minute);
        match at {
            Some(i) if self.minutes[i].minute == minute => &mut self.minutes[i],
            Some(i) => {
                self.minutes.insert(i + 1, Minute::new(minute));
                &mut self.minutes[i + 1]
            }
            None => {
                self.minutes.push_front(Minute::new(minute));
                &mut self.minutes[0]
            }
        }
    }
}

/// The board. Cheap to clone; every method takes one short lock.
#[derive(Debug, Clone, Default)]
pub struct Board {
    /// By provider, then source name (looked up by `&str`, no allocation).
    sources: Arc<Mutex<BTreeMap<ProviderKind, BTreeMap<String, SourceState>>>>,
}

impl Board {
    /// A board listing `sources` from the start, before any delivery.
    pub fn new(sources: impl IntoIterator<Item = (ProviderKind, String)>) -> Board {
        let board = Board::default();
        {
            let mut map = board.lock();
            for (provider, source) in sources {
                map.entry(provider).or_default().entry(source).or_default();
            }
        }
        board
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<ProviderKind, BTreeMap<String, SourceState>>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on a source's state, adding the source when it is new.
    fn with_source<T>(
        &self,
        provider: ProviderKind,
        source: &str,
        f: impl FnOnce(&mut SourceState) -> T,
    ) -> T {
        let mut sources = self.lock();
        let by_name = sources.entry(provider).or_default();
        match by_name.get_mut(source) {
            Some(state) => f(state),
            None => f(by_name.entry(source.to_owned()).or_default()),
        }
    }

    /// Lists a source added while running, before its first delivery.
    pub fn add_source(&self, provider: ProviderKind, source: &str) {
        self.with_source(provider, source, |_| ());
    }

    /// Takes a removed source's row away.
    pub fn remove_source(&self, provider: ProviderKind, source: &str) {
        if let Some(by_name) = self.lock().get_mut(&provider) {
            by_name.remove(source);
        }
    }

    /// Records one answered request of a configured source.
    pub fn delivered(&self, provider: ProviderKind, source: &str, delivery: Delivery) {
        self.with_source(provider, source, |state| {
            if delivery.answer.status == 401 {
                state.signature_failures += 1;
                state.last_signature_failure = Some(delivery.at);
            }
            let bucket = state.minute(unix_minute(delivery.at));
            bucket.count(delivery.answer);
            bucket.latencies[latency_bucket(delivery.latency_ms / 1e3)] += 1;
            state.recent.push_back(delivery);
            while state.recent.len() > RECENT {
                state.recent.pop_front();
            }
        });
    }

    /// Records what the watchdog found.
    pub fn webhook_checked(&self, provider: ProviderKind, source: &str, seen: WebhookSeen) {
        self.with_source(provider, source, |state| state.webhook = Some(seen));
    }

    /// Records a finished reconcile run.
    pub fn reconciled(&self, provider: ProviderKind, source: &str, run: ReconcileRun) {
        self.with_source(provider, source, |state| state.reconcile = Some(run));
    }

    /// Everything the board holds, as of `now`.
    pub fn snapshot(&self, now: OffsetDateTime) -> Vec<SourceSnapshot> {
        self.page(now, "", 0, usize::MAX).sources
    }

    /// The sources whose provider or name holds `query` (any case; every
    /// source when empty), `per_page` of them from the `page`th (0-based),
    /// as of `now`: only those are drawn, so a page stays cheap among a
    /// thousand sources.
    pub fn page(&self, now: OffsetDateTime, query: &str, page: usize, per_page: usize) -> Page {
        let query = query.to_lowercase();
        let now_minute = unix_minute(now);
        let sources = self.lock();
        let all = sources.iter().flat_map(|(provider, by_name)| {
            by_name
                .iter()
                .map(move |(source, state)| (*provider, source, state))
        });
        let total = all.clone().count();
        let matching = all.filter(|(provider, source, _)| {
            query.is_empty()
                || source.to_lowercase().contains(&query)
                || provider.as_str().contains(&query)
        });
        let matched = matching.clone().count();
        let drawn = matching
            .skip(page.saturating_mul(per_page))
            .take(per_page)
            .map(|(provider, source, state)| {
                let window = |minutes: i64| {
                    tally(
                        state
                            .minutes
                            .iter()
                            .filter(|m| m.minute > now_minute - minutes),
                    )
                };
                let per_minute: Vec<MinuteSnapshot> = (0..MINUTES as i64)
                    .rev()
                    .map(|ago| {
                        let minute = now_minute - ago;
                        let found = state.minutes.iter().find(|m| m.minute == minute);
                        MinuteSnapshot {
                            minutes_ago: ago,
                            requests: found.map_or(0, Minute::requests),
                            answers: tally(found),
                            p99_ms: found.and_then(|m| p99_secs(&m.latencies)).map(|s| s * 1e3),
                        }
                    })
                    .collect();
                SourceSnapshot {
                    provider: provider.as_str(),
                    source: source.clone(),
                    webhook: state.webhook.clone(),
                    last_5_min: window(5),
                    last_hour: window(60),
                    signature_failures: state.signature_failures,
                    last_signature_failure: state.last_signature_failure,
                    recent: state.recent.iter().rev().cloned().collect(),
                    reconcile: state.reconcile.clone(),
                    per_minute,
                }
            })
            .collect();
        Page {
            sources: drawn,
            matched,
            total,
        }
    }
}

/// One page of the board's sources.
#[derive(Debug, Clone, Serialize)]
pub struct Page {
    /// The sources on it.
    pub sources: Vec<SourceSnapshot>,
    /// Sources that match the query, on every page.
    pub matched: usize,
    /// Sources in all.
    pub total: usize,
}

/// One source on the page.
#[derive(Debug, Clone, Serialize)]
pub struct SourceSnapshot {
    /// Provider name.
    pub provider: &'static str,
    /// Source name.
    pub source: String,
    /// As the watchdog last saw it; `None` when it does not watch it.
    pub webhook: Option<WebhookSeen>,
    /// Answers of the last 5 minutes by outcome (2xx) or status (refusals).
    pub last_5_min: BTreeMap<String, u64>,
    /// The same for the last hour.
    pub last_hour: BTreeMap<String, u64>,
    /// 401s since start.
    pub signature_failures: u64,
    /// When the last 401 was answered.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_signature_failure: Option<OffsetDateTime>,
    /// The last deliveries, newest first.
    pub recent: Vec<Delivery>,
    /// The last reconcile run.
    pub reconcile: Option<ReconcileRun>,
    /// Requests and p99 latency per minute, oldest first, the last hour.
    pub per_minute: Vec<MinuteSnapshot>,
}

/// One minute of the charts.
#[derive(Debug, Clone, Serialize)]
pub struct MinuteSnapshot {
    /// 0 is the current minute.
    pub minutes_ago: i64,
    /// Requests answered.
    pub requests: u64,
    /// The same by [`Answer::count_key`].
    pub answers: BTreeMap<String, u64>,
    /// Their p99 latency (a histogram bucket's upper bound), when there were any.
    pub p99_ms: Option<f64>,
}

/// Answers of `minutes` by [`Answer::count_key`].
fn tally<'a>(minutes: impl IntoIterator<Item = &'a Minute>) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for minute in minutes {
        for (answer, n) in &minute.counts {
            *counts.entry(answer.count_key()).or_insert(0) += n;
        }
    }
    counts
}

fn unix_minute(at: OffsetDateTime) -> i64 {
    at.unix_timestamp().div_euclid(60)
}

/// The histogram bucket of a latency in seconds.
fn latency_bucket(secs: f64) -> usize {
    let mut bound = FIRST_BUCKET_SECS;
    for bucket in 0..BUCKETS {
        if secs <= bound {
            return bucket;
        }
        bound *= GROWTH;
    }
    BUCKETS - 1
}

/// The upper bound of the bucket holding the 99th percentile.
fn p99_secs(latencies: &[u32; BUCKETS]) -> Option<f64> {
    let total: u64 = latencies.iter().map(|&n| u64::from(n)).sum();
    if total == 0 {
        return None;
    }
    let rank = (total as f64 * 0.99).ceil() as u64;
    let mut seen = 0;
    let mut bound = FIRST_BUCKET_SECS;
    for &n in latencies {
        seen += u64::from(n);
        if seen >= rank {
            return Some(bound);
        }
        bound *= GROWTH;
    }
    Some(bound)
}

/// How long a latency was, as the board keeps it.
pub fn millis(latency: Duration) -> f64 {
    latency.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn delivery(at: OffsetDateTime, outcome: &'static str, status: u16, ms: f64) -> Delivery {
        Delivery {
            at,
            delivery_id: Some("d".into()),
            event_type: None,
            entity_key: None,
            dead_letter_reason: None,
            answer: Answer { outcome, status },
            latency_ms: ms,
        }
    }

    #[test]
    fn counts_split_into_the_last_five_minutes_and_the_hour() {
        let board = Board::new([(ProviderKind::Mekari, "main".to_owned())]);
        let now = datetime!(2026-11-30 10:30:30 UTC);
        let ten_min_ago = now - time::Duration::minutes(10);
        board.delivered(
            ProviderKind::Mekari,
            "main",
            delivery(ten_min_ago, "published", 200, 5.0),
        );
        board.delivered(
            ProviderKind::Mekari,
            "main",
            delivery(now, "published", 200, 5.0),
        );
        board.delivered(
            ProviderKind::Mekari,
            "main",
            delivery(now, "unauthorized", 401, 1.0),
        );
        let source = &board.snapshot(now)[0];
        assert_eq!(source.last_5_min.get("published"), Some(&1));
        assert_eq!(source.last_hour.get("published"), Some(&2));
        assert_eq!(source.last_5_min.get("401"), Some(&1));
        assert_eq!(source.signature_failures, 1);
        assert_eq!(source.last_signature_failure, Some(now));
        assert_eq!(source.per_minute.len(), MINUTES);
        assert_eq!(source.per_minute[MINUTES - 1].requests, 2);
        assert_eq!(source.per_minute[MINUTES - 11].requests, 1);
        assert_eq!(source.recent[0].answer.status, 401, "newest first");
    }

    #[test]
    fn only_the_last_deliveries_and_the_last_hour_are_kept() {
        let board = Board::default();
        let start = datetime!(2026-11-30 08:00:00 UTC);
        for minute in 0..130 {
            let at = start + time::Duration::minutes(minute);
            board.delivered(
                ProviderKind::ReceiptRoller,
                "main",
                delivery(at, "published", 200, 1.0),
            );
        }
        let now = start + time::Duration::minutes(129);
        let source = &board.snapshot(now)[0];
        assert_eq!(source.recent.len(), RECENT);
        assert_eq!(source.last_hour.get("published"), Some(&60));
        assert_eq!(
            source.per_minute.iter().map(|m| m.requests).sum::<u64>(),
            60
        );
    }

    #[test]
    fn answers_across_a_minute_end_out_of_order_share_their_minute() {
        let board = Board::default();
        let late = datetime!(2026-11-30 10:31:00 UTC);
        let early = datetime!(2026-11-30 10:30:59 UTC);
        for at in [late, early, late, early] {
            board.delivered(
                ProviderKind::Mekari,
                "main",
                delivery(at, "published", 200, 1.0),
            );
        }
        let source = &board.snapshot(late)[0];
        assert_eq!(source.per_minute[MINUTES - 1].requests, 2);
        assert_eq!(source.per_minute[MINUTES - 2].requests, 2);
        assert_eq!(source.last_hour.get("published"), Some(&4));
    }

    #[test]
    fn the_p99_is_the_bucket_of_the_slowest_percent() {
        let mut latencies = [0u32; BUCKETS];
        latencies[latency_bucket(0.010)] += 99;
        latencies[latency_bucket(2.0)] += 1;
        let p99 = p99_secs(&latencies).unwrap();
        assert!((0.010..0.010 * GROWTH).contains(&p99), "{p99}");
        latencies[latency_bucket(2.0)] += 1;
        let p99 = p99_secs(&latencies).unwrap();
        assert!((2.0..2.0 * GROWTH).contains(&p99), "{p99}");
        assert_eq!(p99_secs(&[0; BUCKETS]), None);
    }
}
