//! What start-up learned from Kafka and the schema registry, kept on disk
//! so that a posbridge restarted while either is away (a deploy or a node
//! drain during an outage) can still start: the entity and dead-letter
//! topics it found or created, and each topic's schema id for this
//! version's schema. With them it starts degraded (spooling sources
//! accept, the others answer 503) instead of not at all, which would make
//! ReceiptRoller switch the webhook off.
//!
//! The file lives beside the spool when a source spools, else beside the
//! embedded ledger; with neither there is nothing to keep it in, and
//! start-up needs both servers to answer. It is written whole to a
//! temporary file and renamed over the old one, so a crash leaves the old
//! or the new, never half of one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Config, LedgerBackend};

/// The file's name, beside the spool or the ledger.
const FILE_NAME: &str = "posbridge-known.json";

/// What an earlier start found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Known {
    /// `kafka.brokers` when these were found: another cluster knows nothing.
    pub brokers: String,
    /// Topics that existed (or were created) then.
    pub topics: BTreeSet<String>,
    /// The registry's URL when the ids were taken.
    pub registry: Option<String>,
    /// The schema's fingerprint (hex) the ids are for: ids of another
    /// version's schema would frame records wrongly.
    pub schema: Option<String>,
    /// Schema id by topic.
    pub ids: BTreeMap<String, u32>,
}

impl Known {
    /// Whether every topic of `wanted` was known on the same cluster.
    pub fn has_topics<'a>(
        &self,
        brokers: &str,
        mut wanted: impl Iterator<Item = &'a String>,
    ) -> bool {
        self.brokers == brokers && wanted.all(|topic| self.topics.contains(topic))
    }

    /// The ids of every topic in `topics`, if all were taken from the same
    /// registry for this schema.
    pub fn ids_for(
        &self,
        registry: &str,
        schema: &str,
        topics: &[String],
    ) -> Option<std::collections::HashMap<String, u32>> {
        if self.registry.as_deref() != Some(registry) || self.schema.as_deref() != Some(schema) {
            return None;
        }
        topics
            .iter()
            .map(|topic| Some((topic.clone(), *self.ids.get(topic)?)))
            .collect()
    }
}

/// Where the file lives for `config`, if anywhere.
pub fn path(config: &Config) -> Option<PathBuf> {
    let beside = if config.spools() {
        &config.spool.path
    } else if config.ledger.backend == LedgerBackend::Embedded {
        &config.ledger.path
    } else {
        return None;
    };
    Some(beside.with_file_name(FILE_NAME))
}

/// The file's contents; nothing known when it is missing or unreadable
/// (said once: start-up then needs both servers).
pub fn load(path: &Path) -> Known {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|error| {
            tracing::warn!(path = %path.display(), %error, "Cannot read what an earlier start found; starting needs Kafka and the registry.");
            Known::default()
        }),
        Err(_) => Known::default(),
    }
}

/// Writes `known` to `path` (a temporary file, fsync'd, renamed over the
/// old one). A failure is said and otherwise ignored: it only costs the
/// next start during an outage.
pub fn save(path: &Path, known: &Known) {
    let write = || -> std::io::Result<()> {
        let temporary = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(known).map_err(std::io::Error::other)?;
        let mut file = std::fs::File::create(&temporary)?;
        std::io::Write::write_all(&mut file, &bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    };
    if let Err(error) = write() {
        tracing::warn!(path = %path.display(), %error, "Cannot keep what start-up found; a start during an outage will not be possible.");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Known {
        Known {
            brokers: "k:9092".into(),
            topics: ["pos.sales".to_owned(), "pos.orders".to_owned()].into(),
            registry: Some("http://r".into()),
            schema: Some("abc".into()),
            ids: [("pos.sales".to_owned(), 7), ("pos.orders".to_owned(), 8)].into(),
        }
    }

    #[test]
    fn topics_and_ids_count_only_for_the_same_cluster_registry_and_schema() {
        let known = known();
        let wanted = ["pos.sales".to_owned(), "pos.orders".to_owned()];
        assert!(known.has_topics("k:9092", wanted.iter()));
        assert!(!known.has_topics("other:9092", wanted.iter()));
        assert!(!known.has_topics("k:9092", ["pos.returns".to_owned()].iter()));
        assert_eq!(
            known.ids_for("http://r", "abc", &wanted).unwrap()["pos.orders"],
            8
        );
        assert_eq!(known.ids_for("http://r", "other-schema", &wanted), None);
        assert_eq!(known.ids_for("http://elsewhere", "abc", &wanted), None);
        assert_eq!(
            known.ids_for("http://r", "abc", &["pos.returns".to_owned()]),
            None
        );
    }

    #[test]
    fn what_is_saved_is_loaded_and_a_damaged_file_knows_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert_eq!(load(&path), Known::default(), "missing");
        save(&path, &known());
        assert_eq!(load(&path), known());
        std::fs::write(&path, b"{half").unwrap();
        assert_eq!(load(&path), Known::default(), "damaged");
    }
}
