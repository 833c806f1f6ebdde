//! The `[server]` section: the HTTP listener and the answer policy.

use serde::Deserialize;

/// HTTP listener and answer policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Largest webhook body accepted; larger gets 413 before any work.
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
    /// How long shutdown (and the one-shot commands) wait for the producer to
    /// flush; in-flight deliveries end within their own delivery deadline.
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            body_limit_bytes: default_body_limit_bytes(),
            retry_after_secs: default_retry_after_secs(),
            inflight_wait_ms: default_inflight_wait_ms(),
            shutdown_timeout_ms: default_shutdown_timeout_ms(),
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
