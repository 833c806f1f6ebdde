//! The `[server]` section: the HTTP listener and the answer policy.

use std::time::Duration;

use serde::Deserialize;

/// HTTP listener and answer policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Largest webhook body accepted; larger gets 413 before any work. Records
    /// are sized for it (see `Config::max_record_bytes`), so every accepted
    /// event fits one.
    #[serde(default = "default_body_limit_bytes")]
    pub body_limit_bytes: usize,
    /// `Retry-After` sent with 503. Mekari waits at least this long (capped at
    /// one hour by Mekari); ReceiptRoller ignores it.
    #[serde(default = "default_retry_after_secs")]
    pub retry_after_secs: u64,
    /// How long a duplicate waits for the same delivery already in flight
    /// before answering 503.
    #[serde(default = "default_inflight_wait_ms")]
    pub inflight_wait_ms: u64,
    /// How long shutdown waits for open connections to finish their
    /// requests, and then (separately) for the producer to flush; the
    /// one-shot commands wait this long for the flush.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// How long `serve` keeps accepting and answering webhooks after SIGTERM
    /// (or Ctrl-C), with `/readyz` answering 503, before it stops accepting:
    /// the time a balancer takes to move away. A port closed before then
    /// refuses the connections still sent to it, and each is a failed
    /// attempt to its provider (four of one event switch a ReceiptRoller
    /// webhook off). It must cover the balancer's checks (HAProxy: `inter` ×
    /// `fall` plus a check under way) or, behind a Kubernetes Service, the
    /// endpoint's removal reaching every node. A second signal ends it at
    /// once; 0 stops accepting at the first.
    #[serde(default = "default_drain_delay_ms")]
    pub drain_delay_ms: u64,
    /// How long a connection may take to send a request's head (line and
    /// headers). It also bounds how long a kept-alive connection may sit idle
    /// before its next request: hyper starts this clock when it waits for a head.
    #[serde(default = "default_header_read_timeout_ms")]
    pub header_read_timeout_ms: u64,
    /// How long a request may take to send its body once its head arrived;
    /// slower is answered 408 (both providers retry it).
    #[serde(default = "default_body_read_timeout_ms")]
    pub body_read_timeout_ms: u64,
    /// Open connections at most; one more is answered 503 + `Retry-After`
    /// and closed. Keep it below the process's open-file limit, which the
    /// producer, the ledger and the spool also draw on.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Bytes of request bodies being read and handled at once, counted by
    /// each request's declared length (or `body_limit_bytes` when it declares
    /// none). A request that would pass it is answered 503 + `Retry-After`
    /// before its body is read, so slow senders cannot hold memory.
    #[serde(default = "default_max_body_bytes_in_flight")]
    pub max_body_bytes_in_flight: usize,
    /// How far ahead of posbridge's clock (the event's arrival) a webhook's
    /// event time may lie; later ones are dead-lettered. A terminal whose
    /// clock runs ahead would otherwise version its entity in the future and
    /// every genuine later update would be held back as stale; and Kafka
    /// refuses record timestamps more than an hour ahead by default
    /// (`message.timestamp.after.max.ms`), so this stays below that.
    #[serde(default = "default_max_event_ahead_ms")]
    pub max_event_ahead_ms: u64,
    /// How often the sources' `secrets_files` and `secrets_dir` are read
    /// again whatever the file watcher said: the safety net for a change it
    /// cannot see (a watch lost with its directory, a file system without
    /// inotify, the inotify limit reached). Changes seen are read at once.
    #[serde(default = "default_secrets_recheck_secs")]
    pub secrets_recheck_secs: u64,
    /// Deliveries in flight (being handled at once, every source together)
    /// from which the process is busy and a source holding at least twice
    /// what the busiest other active source holds is held to its share
    /// (`share_in_flight`, or the source's `max_in_flight`). Below it any
    /// source may take more than its share, so a lone merchant on a quiet
    /// server is never slowed; at it, one merchant replaying a day of sales
    /// cannot crowd the others out. 0: shares always apply.
    #[serde(default = "default_busy_in_flight")]
    pub busy_in_flight: usize,
    /// A source's share of the deliveries in flight while the process is
    /// busy, when the source sets no `max_in_flight`. A delivery of a source
    /// over it is slowed the way its provider understands: 429 +
    /// `Retry-After` for one that honours the header (Mekari); for one that
    /// counts every refusal against the webhook (ReceiptRoller), a wait for
    /// its share, then the spool or taken in.
    #[serde(default = "default_share_in_flight")]
    pub share_in_flight: usize,
    /// A source's rate (deliveries a second) when it sets no
    /// `max_per_second`: while other sources are active, a source sending
    /// more than this and at least twice as many a second as the busiest
    /// of them is paced to the larger of the two; a delivery waits for its
    /// slot within `inflight_wait_ms`, past it it is slowed as its provider
    /// understands (as over its share in flight). A source alone, or beside
    /// sources as busy as itself, is never paced. 0: no source is paced.
    #[serde(default = "default_share_per_second")]
    pub share_per_second: u32,
    /// `Retry-After` (seconds) of the 429 answered to a source over its
    /// share whose provider honours the header (capped at the most it
    /// honours). Longer than the provider's own next retry, so a burst
    /// refused comes back spread out, not at once; short against its
    /// retry window, so a refused delivery keeps most of its attempts.
    #[serde(default = "default_share_retry_after_secs")]
    pub share_retry_after_secs: u64,
}

impl ServerConfig {
    /// The most Kafka accepts by default ahead of its clock
    /// (`message.timestamp.after.max.ms`), and so the most
    /// `max_event_ahead_ms` may be.
    pub const MAX_EVENT_AHEAD_LIMIT_MS: u64 = 3_600_000;

    /// The least `max_event_ahead_ms` may be: a provider's clock runs a few
    /// seconds ahead of ours now and then, and below this its good events
    /// would be dead-lettered as lying in the future.
    pub const MIN_EVENT_AHEAD_MS: u64 = 10_000;

    /// [`ServerConfig::max_event_ahead_ms`] as a duration.
    pub fn max_event_ahead(&self) -> Duration {
        Duration::from_millis(self.max_event_ahead_ms)
    }

    /// [`ServerConfig::drain_delay_ms`] as a duration.
    pub fn drain_delay(&self) -> Duration {
        Duration::from_millis(self.drain_delay_ms)
    }

    /// [`ServerConfig::secrets_recheck_secs`] as a duration.
    pub fn secrets_recheck(&self) -> Duration {
        Duration::from_secs(self.secrets_recheck_secs)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            body_limit_bytes: default_body_limit_bytes(),
            retry_after_secs: default_retry_after_secs(),
            inflight_wait_ms: default_inflight_wait_ms(),
            shutdown_timeout_ms: default_shutdown_timeout_ms(),
            drain_delay_ms: default_drain_delay_ms(),
            header_read_timeout_ms: default_header_read_timeout_ms(),
            body_read_timeout_ms: default_body_read_timeout_ms(),
            max_connections: default_max_connections(),
            max_body_bytes_in_flight: default_max_body_bytes_in_flight(),
            max_event_ahead_ms: default_max_event_ahead_ms(),
            secrets_recheck_secs: default_secrets_recheck_secs(),
            busy_in_flight: default_busy_in_flight(),
            share_in_flight: default_share_in_flight(),
            share_per_second: default_share_per_second(),
            share_retry_after_secs: default_share_retry_after_secs(),
        }
    }
}

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
const fn default_body_limit_bytes() -> usize {
    1024 * 1024
}
// Mekari's second attempt comes 30 s after the first anyway.
const fn default_retry_after_secs() -> u64 {
    30
}
const fn default_inflight_wait_ms() -> u64 {
    3000
}
const fn default_shutdown_timeout_ms() -> u64 {
    10_000
}
// HAProxy's default checks take a failing server out within inter × fall
// = 2 s × 3 (plus the check under way); Kubernetes' endpoint removal reaches
// kube-proxy within a second or two. Both, with room.
const fn default_drain_delay_ms() -> u64 {
    10_000
}
// Providers wait 10 s for the whole answer; a head takes milliseconds.
const fn default_header_read_timeout_ms() -> u64 {
    2000
}
const fn default_body_read_timeout_ms() -> u64 {
    3000
}
// Well under the usual open-file limit of 1024.
const fn default_max_connections() -> usize {
    512
}
const fn default_max_body_bytes_in_flight() -> usize {
    64 * 1024 * 1024
}
// Room for a provider clock a few minutes fast, far from Kafka's hour.
const fn default_max_event_ahead_ms() -> u64 {
    5 * 60 * 1000
}
// Kubernetes itself takes up to about a minute to update a mounted Secret.
const fn default_secrets_recheck_secs() -> u64 {
    60
}
// The benchmark's closed-loop runs keep 64 deliveries in flight and saturate
// two cores (docs/BENCHMARKS.md): a process with 64 in flight has nothing to
// spare, one at half its capacity has a handful.
const fn default_busy_in_flight() -> usize {
    64
}
// A quarter of the busy mark: a flooding source holds at most that once the
// process is busy, and four sources at their share make it busy alone.
const fn default_share_in_flight() -> usize {
    16
}
// Mekari's own second attempt comes 30 s after the first: twice that spreads
// a refused burst's retries, and leaves most of its 8 attempts over ~11 h.
// A merchant's till sends a few sales a minute; a day's replay at this
// rate takes a minute or less. Beside the others at half of what one core
// gets through, a flood paced to it left their p99 1.6 ms above the quiet
// run's (median of ten), paced to 500 3.1 ms, unpaced 17.4 ms
// (docs/BENCHMARKS.md, `scripts/bench fairshare`).
const fn default_share_per_second() -> u32 {
    200
}
const fn default_share_retry_after_secs() -> u64 {
    60
}

impl ServerConfig {
    /// The section's mistakes, as (key, what is wrong). What the providers'
    /// rules ask of it (timeouts under their answer limit, `Retry-After`
    /// within what they honour) is checked where the providers are
    /// assembled, `app::check`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |key: &str, message: String| problems.push((key.to_owned(), message));
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            problem(
                "server.listen",
                format!("`{}` is not an address like 127.0.0.1:8080", self.listen),
            );
        }
        for (key, value) in [
            ("server.body_limit_bytes", self.body_limit_bytes as u64),
            ("server.max_connections", self.max_connections as u64),
            ("server.header_read_timeout_ms", self.header_read_timeout_ms),
            ("server.body_read_timeout_ms", self.body_read_timeout_ms),
            ("server.retry_after_secs", self.retry_after_secs),
            ("server.secrets_recheck_secs", self.secrets_recheck_secs),
            ("server.share_in_flight", self.share_in_flight as u64),
            ("server.share_retry_after_secs", self.share_retry_after_secs),
        ] {
            if value == 0 {
                problem(key, "must be above 0".into());
            }
        }
        if self.secrets_recheck_secs > super::LONGEST_WINDOW.as_secs() {
            problem(
                "server.secrets_recheck_secs",
                super::longest_window_message(),
            );
        }
        if self.max_body_bytes_in_flight < self.body_limit_bytes {
            problem(
                "server.max_body_bytes_in_flight",
                format!(
                    "{} is below server.body_limit_bytes ({}): a body of the largest accepted size could never be read",
                    self.max_body_bytes_in_flight, self.body_limit_bytes
                ),
            );
        }
        if self.max_event_ahead_ms < Self::MIN_EVENT_AHEAD_MS {
            problem(
                "server.max_event_ahead_ms",
                format!(
                    "{} ms dead-letters good events as time_in_future whenever the provider's clock runs a little ahead of ours; use at least {} (the default is 300000)",
                    self.max_event_ahead_ms,
                    Self::MIN_EVENT_AHEAD_MS
                ),
            );
        }
        if self.max_event_ahead_ms >= Self::MAX_EVENT_AHEAD_LIMIT_MS {
            problem(
                "server.max_event_ahead_ms",
                format!(
                    "must be below {} (Kafka refuses record timestamps more than an hour ahead by default, message.timestamp.after.max.ms)",
                    Self::MAX_EVENT_AHEAD_LIMIT_MS
                ),
            );
        }
        problems
    }
}
