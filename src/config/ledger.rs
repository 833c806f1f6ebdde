//! The `[ledger]` section: where delivery ids and entity versions are kept.

use std::path::{Path, PathBuf};

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
    /// Redis backend: the server's URL; for a Redis Cluster, any node's URL
    /// (posbridge asks it for the rest) or several nodes' URLs separated by
    /// commas, so start-up does not hang on one node being down. See
    /// [`LedgerConfig::redis_nodes`].
    #[serde(default = "default_redis_url")]
    pub redis_url: String,
    /// Redis backend: prefix of every key, so deployments can share a server.
    #[serde(default = "default_redis_prefix")]
    pub redis_prefix: String,
    /// Redis backend with `rediss://`: PEM file of the CA that signed the
    /// server's certificate, when it is not in the system's trust store.
    #[serde(default)]
    pub redis_ca_file: Option<PathBuf>,
    /// Redis backend: take a server whose `maxmemory-policy` may evict
    /// posbridge's keys (anything but `noeviction`). An evicted done id lets
    /// a retry publish again, an evicted entity state lets an older event
    /// overwrite the newer one; so such a server is refused unless this is
    /// set, and then said at every start.
    #[serde(default)]
    pub redis_allow_eviction: bool,
    /// Embedded backend: how often what the ledger learnt in memory is made
    /// durable in its file, with the offsets of the records it came from.
    /// Nothing waits for it (the topics hold every outcome); a crash costs
    /// a read of the topics from the last checkpoint's offsets at the next
    /// start, about this long's worth of records.
    #[serde(default = "default_checkpoint_interval_ms")]
    pub checkpoint_interval_ms: u64,
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
            redis_allow_eviction: false,
            checkpoint_interval_ms: default_checkpoint_interval_ms(),
        }
    }
}

fn default_checkpoint_interval_ms() -> u64 {
    1000
}

/// Why `ledger.redis_url` names no usable list of nodes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisUrlError {
    /// A node of a list that is not a Redis URL (with one URL, the Redis
    /// client itself judges it, and says why in its own words).
    #[error("`{0}` must start with redis:// or rediss://")]
    Scheme(String),
    /// Some nodes with TLS and some without: one cluster's nodes are reached
    /// the same way, and the cluster client takes one TLS mode for all.
    #[error(
        "mixes redis:// and rediss:// nodes; list the cluster's nodes all with TLS or all without"
    )]
    MixedTls,
}

/// The schemes a node of a list may use.
const REDIS_SCHEMES: [&str; 2] = ["redis://", "rediss://"];

impl LedgerConfig {
    /// The nodes `redis_url` names: one URL, or several separated by commas.
    /// A comma starts a new node only where a scheme follows it (spaces
    /// allowed between), so a comma inside a password stays in its URL and
    /// a single URL reads exactly as it did before lists existed.
    ///
    /// # Errors
    /// [`RedisUrlError`] for a list whose first entry is not a Redis URL,
    /// or that mixes TLS and plain nodes.
    pub fn redis_nodes(redis_url: &str) -> Result<Vec<&str>, RedisUrlError> {
        let mut nodes = Vec::new();
        let mut start = 0;
        for (comma, _) in redis_url.match_indices(',') {
            let rest = redis_url[comma + 1..].trim_start();
            if REDIS_SCHEMES.iter().any(|s| rest.starts_with(s)) {
                nodes.push(redis_url[start..comma].trim());
                start = comma + 1;
            }
        }
        if nodes.is_empty() {
            return Ok(vec![redis_url]);
        }
        nodes.push(redis_url[start..].trim());
        if let Some(bad) = nodes
            .iter()
            .find(|n| !REDIS_SCHEMES.iter().any(|s| n.starts_with(s)))
        {
            return Err(RedisUrlError::Scheme((*bad).to_owned()));
        }
        let tls = nodes.iter().filter(|n| n.starts_with("rediss://")).count();
        if tls != 0 && tls != nodes.len() {
            return Err(RedisUrlError::MixedTls);
        }
        Ok(nodes)
    }

    /// Whether the embedded ledger's file is `path`, however either is
    /// spelled (`./x` or `x`, relative or from the root). redb admits one
    /// handle per file, so a spool on the ledger's file stops start-up with
    /// the file "in use", and an operator may well move the ledger aside.
    pub fn embedded_file_is(&self, path: &Path) -> bool {
        let absolute = |p: &Path| {
            std::path::absolute(p)
                .unwrap_or_else(|_| p.to_owned())
                .components()
                .collect::<PathBuf>()
        };
        self.backend == LedgerBackend::Embedded && absolute(&self.path) == absolute(path)
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

impl LedgerConfig {
    /// The section's mistakes, as (key, what is wrong). How long done ids
    /// must be kept follows from the providers' retry windows, checked in
    /// `app::check`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if let Some(file) = &self.redis_ca_file
            && !file.is_file()
        {
            problems.push((
                "ledger.redis_ca_file".to_owned(),
                format!("`{}` is not a readable file", file.display()),
            ));
        }
        if self.backend == LedgerBackend::Redis {
            let url = &self.redis_url;
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                problems.push((
                    "ledger.redis_url".to_owned(),
                    format!("`{url}` must start with redis:// or rediss://"),
                ));
            } else if let Err(error) = Self::redis_nodes(url) {
                problems.push(("ledger.redis_url".to_owned(), error.to_string()));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{LedgerBackend, LedgerConfig, RedisUrlError};

    #[test]
    fn the_ledgers_file_is_recognized_however_it_is_spelled() {
        let ledger = LedgerConfig {
            path: "var/ledger.redb".into(),
            ..LedgerConfig::default()
        };
        let cwd = std::env::current_dir().unwrap();
        for same in [
            "var/ledger.redb",
            "./var/ledger.redb",
            "var//ledger.redb",
            &cwd.join("var/ledger.redb").display().to_string(),
        ] {
            assert!(ledger.embedded_file_is(Path::new(same)), "{same}");
        }
        assert!(!ledger.embedded_file_is(Path::new("var/spool.redb")));
        let redis = LedgerConfig {
            backend: LedgerBackend::Redis,
            ..ledger
        };
        assert!(!redis.embedded_file_is(Path::new("var/ledger.redb")));
    }

    #[test]
    fn one_url_is_one_node_whatever_its_commas() {
        for url in [
            "redis://127.0.0.1:6379",
            "rediss://user:pa,ss@redis.example:6380/0",
            "redis+unix:///run/redis.sock",
        ] {
            assert_eq!(LedgerConfig::redis_nodes(url), Ok(vec![url]));
        }
    }

    #[test]
    fn a_comma_before_a_scheme_starts_the_next_node() {
        assert_eq!(
            LedgerConfig::redis_nodes("redis://a:7000, redis://:p,w@b:7001 ,redis://c:7002"),
            Ok(vec![
                "redis://a:7000",
                "redis://:p,w@b:7001",
                "redis://c:7002"
            ])
        );
    }

    #[test]
    fn a_list_of_anything_but_redis_urls_or_of_mixed_tls_is_refused() {
        assert_eq!(
            LedgerConfig::redis_nodes("a:7000,redis://b:7001"),
            Err(RedisUrlError::Scheme("a:7000".into()))
        );
        assert_eq!(
            LedgerConfig::redis_nodes(",redis://b:7001"),
            Err(RedisUrlError::Scheme(String::new()))
        );
        assert_eq!(
            LedgerConfig::redis_nodes("rediss://a:7000,redis://b:7001"),
            Err(RedisUrlError::MixedTls)
        );
    }
}
