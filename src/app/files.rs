//! `posbridge ledger check`: what the embedded ledger and the spool hold,
//! or why one cannot be read. Both files are checked whatever the first
//! shows, and each gets a status an operator can act on: a damaged file is
//! moved aside (posbridge then starts empty), a file in use is left alone
//! (its holder keeps its dedup state in it).

use serde_json::{Value, json};

use crate::adapters::ledger::{EmbeddedLedger, LedgerError};
use crate::adapters::spool::{Spool, SpoolError};
use crate::adapters::store_file::StoreFileError;
use crate::config::{Config, LedgerBackend};

/// What the check found.
#[derive(Debug)]
pub struct FilesReport {
    /// One object per file (`ledger`, and `spool` when a source spools),
    /// each with its `path`, `status` (`ok`, `in_use`, `damaged`,
    /// `unreadable`) and its counts or `error`.
    pub report: Value,
    /// One sentence per file that is not `ok`.
    pub problems: Vec<String>,
}

/// Opens the embedded ledger (and the spool, when a source spools) as
/// start-up does, page check included, and counts what each holds.
pub fn check(config: &Config) -> FilesReport {
    let mut report = json!({});
    let mut problems = Vec::new();
    let mut note = |name: &str, path: &std::path::Path, found: Result<Value, Refusal<'_>>| {
        let path = path.display().to_string();
        report[name] = match found {
            Ok(mut counts) => {
                counts["path"] = json!(path);
                counts["status"] = json!("ok");
                counts
            }
            Err(refusal) => {
                let error = refusal.to_string();
                problems.push(format!("{name}: {error}"));
                json!({ "path": path, "status": refusal.status(), "error": error })
            }
        };
    };
    if config.ledger.backend == LedgerBackend::Embedded {
        let lease = std::time::Duration::from_secs(1);
        let ledger = EmbeddedLedger::open(&config.ledger.path, lease, lease);
        let counts = ledger.and_then(|ledger| ledger.counts());
        match counts {
            Ok(counts) => note("ledger", &config.ledger.path, Ok(json!(counts))),
            Err(error) => note("ledger", &config.ledger.path, Err(Refusal::Ledger(&error))),
        }
    }
    if config.spools() {
        match Spool::open(&config.spool) {
            Ok(spool) => {
                let stats = spool.stats();
                let counts = json!({ "entries": stats.entries, "bytes": stats.bytes });
                note("spool", &config.spool.path, Ok(counts));
            }
            Err(error) => note("spool", &config.spool.path, Err(Refusal::Spool(&error))),
        }
    }
    FilesReport { report, problems }
}

/// Why one file could not be counted.
enum Refusal<'a> {
    Ledger(&'a LedgerError),
    Spool(&'a SpoolError),
}

impl Refusal<'_> {
    fn file_error(&self) -> Option<&StoreFileError> {
        match self {
            Refusal::Ledger(LedgerError::File(error)) | Refusal::Spool(SpoolError::File(error)) => {
                Some(error)
            }
            _ => None,
        }
    }

    /// The word for the report: what the operator does differs for each.
    fn status(&self) -> &'static str {
        match self.file_error() {
            Some(StoreFileError::Held { .. }) => "in_use",
            Some(
                StoreFileError::Empty { .. }
                | StoreFileError::Damaged { .. }
                | StoreFileError::Database { .. },
            ) => "damaged",
            Some(StoreFileError::Directory { .. }) | None => "unreadable",
        }
    }
}

impl std::fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Ledger(error) => write!(f, "{error}"),
            Refusal::Spool(error) => write!(f, "{error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::adapters::spool::SpooledDelivery;
    use crate::domain::event::{DeliveryKey, ProviderKind, Source};

    fn config(dir: &Path) -> Config {
        Config::from_toml(&format!(
            "[ledger]\npath = \"{}\"\n[spool]\npath = \"{}\"\n[receiptroller.sources.main]\nsecrets = [\"a-long-enough-secret\"]\non_broker_unavailable = \"spool\"\n",
            dir.join("ledger.redb").display(),
            dir.join("spool.redb").display()
        ))
        .unwrap()
    }

    /// A spool as an outage leaves it: 14 sales of 50 KB spooled and, when
    /// `drained`, all removed again.
    async fn spool_after_an_outage(config: &Config, drained: bool) {
        let spool = Spool::open(&config.spool).unwrap();
        for i in 0..14 {
            let id = format!("sale-{i}");
            spool
                .append(&SpooledDelivery {
                    key: DeliveryKey::new(ProviderKind::ReceiptRoller, &id),
                    source: Source {
                        provider: ProviderKind::ReceiptRoller,
                        name: "main".into(),
                        account: None,
                    },
                    delivery_id: id,
                    received_at: time::OffsetDateTime::now_utc(),
                    body: bytes::Bytes::from(vec![b'x'; 50_000]),
                })
                .await
                .unwrap();
        }
        if drained {
            let all = spool.oldest(usize::MAX).unwrap();
            spool
                .remove(all.into_iter().map(|(seq, d)| (seq, d.key)).collect())
                .await
                .unwrap();
        }
    }

    fn damage(path: &Path, at: impl FnOnce(usize) -> std::ops::Range<usize>, byte: u8) {
        let mut bytes = std::fs::read(path).unwrap();
        let range = at(bytes.len());
        bytes[range].fill(byte);
        std::fs::write(path, bytes).unwrap();
    }

    #[tokio::test]
    async fn a_damaged_spool_is_reported_damaged_beside_the_ledgers_counts() {
        type Damage = fn(usize) -> std::ops::Range<usize>;
        let cases: [(&str, bool, Damage, u8); 2] = [
            ("16 KB overwritten", false, |_| 4096..4096 + 16384, 0xa5),
            ("last 8 KB zeroed", true, |len| len - 8192..len, 0),
        ];
        for (what, drained, at, byte) in cases {
            let dir = tempfile::tempdir().unwrap();
            let config = config(dir.path());
            spool_after_an_outage(&config, drained).await;
            damage(&config.spool.path, at, byte);

            let found = check(&config);
            assert_eq!(found.report["ledger"]["status"], "ok", "{what}: {found:?}");
            assert_eq!(found.report["ledger"]["done_deliveries"], 0, "{what}");
            assert_eq!(
                found.report["spool"]["status"], "damaged",
                "{what}: {found:?}"
            );
            let error = found.report["spool"]["error"].as_str().unwrap();
            assert!(error.contains("is damaged"), "{what}: {error}");
            assert_eq!(found.problems.len(), 1, "{what}: {:?}", found.problems);
        }
    }

    #[tokio::test]
    async fn a_spool_in_use_is_reported_in_use_not_damaged() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let _held = Spool::open(&config.spool).unwrap();
        let found = check(&config);
        assert_eq!(found.report["spool"]["status"], "in_use", "{found:?}");
        let error = found.report["spool"]["error"].as_str().unwrap();
        assert!(error.contains("is not damaged"), "{error}");
        assert!(error.contains("this process itself"), "{error}");
    }
}
