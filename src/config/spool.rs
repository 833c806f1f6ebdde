//! The `[spool]` section: where the outage spool lives and how much it holds.

use std::path::PathBuf;

use serde::Deserialize;

/// The local, fsync'd spool of deliveries Kafka could not take in time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// The spool file. Keep it on a disk of its own where possible: a full
    /// ledger disk should not also stop the spool.
    #[serde(default = "default_spool_path")]
    pub path: PathBuf,
    /// Largest total of spooled bodies; beyond it deliveries get 503 again.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u64,
    /// Most deliveries spooled at once; beyond it deliveries get 503 again.
    #[serde(default = "default_max_entries")]
    pub max_entries: u64,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig {
            path: default_spool_path(),
            max_bytes: default_max_bytes(),
            max_entries: default_max_entries(),
        }
    }
}

fn default_spool_path() -> PathBuf {
    "posbridge-spool.redb".into()
}
// 1 GiB: a day of a busy store's webhooks at a few KiB each.
const fn default_max_bytes() -> u64 {
    1 << 30
}
const fn default_max_entries() -> u64 {
    1_000_000
}

impl SpoolConfig {
    /// The section's mistakes, as (key, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        [
            ("spool.max_bytes", self.max_bytes == 0),
            ("spool.max_entries", self.max_entries == 0),
        ]
        .into_iter()
        .filter(|(_, zero)| *zero)
        .map(|(key, _)| (key.to_owned(), "must be above 0".to_owned()))
        .collect()
    }
}
