//! The `[ledger]` section: where delivery ids and entity versions are kept.

use std::path::PathBuf;

use serde::Deserialize;

/// Which ledger backend keeps delivery ids and entity versions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LedgerBackend {
    /// A redb file on local disk: one process, survives restarts.
    #[default]
    Embedded,
    /// A Redis server shared by several processes (replicas, `posbridge
    /// reconciler` beside `serve`). Give it persistence (AOF) in production.
    Redis,
}

/// Ledger settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    /// Backend kind.
    #[serde(default)]
    pub backend: LedgerBackend,
    /// File of the embedded backend.
    #[serde(default = "default_ledger_path")]
    pub path: PathBuf,
    /// How long a finished delivery id is remembered. It must outlast the
    /// slowest provider's whole retry window (Mekari: ~11 h), or a late retry
    /// is processed twice.
    #[serde(default = "default_dedup_ttl_secs")]
    pub dedup_ttl_secs: u64,
    /// Redis backend: server URL.
    #[serde(default = "default_redis_url")]
    pub redis_url: String,
    /// Redis backend: prefix of every key, so deployments can share a server.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// Redis backend with `rediss://`: PEM file of the CA that signed the
    /// server's certificate, when it is not in the system's trust store.
    #[serde(default)]
    pub redis_ca_file: Option<PathBuf>,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            backend: LedgerBackend::Embedded,
            path: default_ledger_path(),
            dedup_ttl_secs: default_dedup_ttl_secs(),
            redis_url: default_redis_url(),
            redis_prefix: default_redis_prefix(),
            redis_ca_file: None,
        }
    }
}

fn default_redis_url() -> String {
    "redis://127.0.0.1:6379".into()
}
fn default_redis_prefix() -> String {
    "posbridge:".into()
}
fn default_ledger_path() -> PathBuf {
    "posbridge-ledger.redb".into()
}
// A day: twice Mekari's ~11 h retry window, "a few hours at least" for ReceiptRoller.
const fn default_dedup_ttl_secs() -> u64 {
    24 * 3600
}
