//! `posbridge ledger check`: what the embedded ledger and the spool hold,
//! or why one cannot be read. Both files are checked whatever the first
//! shows, and neither is changed. Each gets a status an operator can act
//! on: a `damaged` file is set aside by `serve` (kept for a look) and a new
//! one started, the ledger filled again from the topics (its cache: nothing
//! is lost), the spool with every intact entry salvaged from the old file;
//! a file `in_use` is left alone (its holder is running); a spool's
//! `damaged_entries` go to its quarantine when `serve` starts.

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
    /// `unreadable`) and its counts, or its `error` and what `serve` does
    /// about it (`serve`).
    pub report: Value,
    /// One sentence per file that is not `ok` or holds damaged entries.
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
                let serve = refusal.what_serve_does();
                problems.push(format!("{name}: {error}; {serve}"));
                json!({ "path": path, "status": refusal.status(), "error": error, "serve": serve })
            }
        };
    };
    if config.ledger.backend == LedgerBackend::Embedded {
        match EmbeddedLedger::check(&config.ledger.path) {
            Ok(counts) => note("ledger", &config.ledger.path, Ok(json!(counts))),
            Err(error) => note("ledger", &config.ledger.path, Err(Refusal::Ledger(&error))),
        }
    }
    let mut damaged_entries = None;
    if config.spools() {
        match Spool::check(&config.spool) {
            Ok(checked) => {
                damaged_entries = (checked.damaged_entries > 0).then(|| {
                    format!(
                        "spool: {} of its {} entries are damaged (they do not match their checksum); serve moves them to {}.quarantine/ and publishes the others",
                        checked.damaged_entries,
                        checked.entries,
                        config.spool.path.display()
                    )
                });
                note("spool", &config.spool.path, Ok(json!(checked)));
            }
            Err(error) => note("spool", &config.spool.path, Err(Refusal::Spool(&error))),
        }
    }
    problems.extend(damaged_entries);
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
            Some(error) if error.is_damage() => "damaged",
            _ => "unreadable",
        }
    }

    /// What `serve` does with the file, in the operator's words.
    fn what_serve_does(&self) -> &'static str {
        match (self, self.status()) {
            (Refusal::Ledger(_), "damaged") => {
                "serve sets it aside (renamed <path>.damaged-<unix seconds>, kept for a look) and fills a new ledger from the topics before deciding deliveries: the ledger is their cache, nothing is lost"
            }
            (Refusal::Spool(_), "damaged") => {
                "serve sets it aside (renamed <path>.damaged-<unix seconds>, kept for a look) and moves every intact entry it finds in it to a new spool, published as it drains; damaged entries are lost unless their provider sends them again or a reconcile over their time reads them"
            }
            (_, "in_use") => "serve refuses to start on it while that process runs",
            _ => "serve refuses to start until it can be read",
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
                        topic_prefix: None,
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
            let serve = found.report["spool"]["serve"].as_str().unwrap();
            assert!(
                serve.contains("moves every intact entry"),
                "{what}: {serve}"
            );
            assert_eq!(found.problems.len(), 1, "{what}: {:?}", found.problems);
            assert!(
                config.spool.path.exists(),
                "{what}: the check sets nothing aside"
            );
        }
    }

    /// A damaged ledger is reported with what `serve` does about it (sets
    /// it aside, fills a new one from the topics), not the old advice that
    /// an empty ledger publishes retries again; the check changes nothing.
    #[tokio::test]
    async fn a_damaged_ledger_is_reported_with_what_serve_does_and_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        std::fs::write(&config.ledger.path, vec![0x5a; 8192]).unwrap();
        let found = check(&config);
        assert_eq!(found.report["ledger"]["status"], "damaged", "{found:?}");
        let serve = found.report["ledger"]["serve"].as_str().unwrap_or_default();
        assert!(
            serve.contains("fills a new ledger from the topics"),
            "{found:?}"
        );
        assert_eq!(found.problems.len(), 1, "{:?}", found.problems);
        for problem in &found.problems {
            assert!(
                !problem.contains("publish again") && !problem.contains("Move it aside"),
                "{problem}"
            );
        }
        assert!(
            std::fs::read(&config.ledger.path).unwrap() == vec![0x5a; 8192],
            "left in place"
        );
    }

    /// Spool entries that do not match their checksum are counted and
    /// reported, and left where they are: `serve` quarantines them.
    #[tokio::test]
    async fn damaged_spool_entries_are_reported_not_moved() {
        use redb::{ReadableTable as _, TableDefinition};
        // The spool's own table of entries, written here past the spool
        // as damage redb's page checksums do not see.
        const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        spool_after_an_outage(&config, false).await;
        {
            let db = crate::adapters::store_file::open(&config.spool.path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut entries = txn.open_table(ENTRIES).unwrap();
                let mut stored = entries.get(3).unwrap().unwrap().value().to_vec();
                *stored.last_mut().unwrap() = b'y';
                entries.insert(3, stored.as_slice()).unwrap();
            }
            txn.commit().unwrap();
        }
        let found = check(&config);
        assert_eq!(found.report["spool"]["status"], "ok", "{found:?}");
        assert_eq!(found.report["spool"]["entries"], 14, "{found:?}");
        assert_eq!(found.report["spool"]["damaged_entries"], 1, "{found:?}");
        assert_eq!(found.problems.len(), 1, "{:?}", found.problems);
        assert!(
            found.problems[0].contains("quarantine"),
            "{:?}",
            found.problems
        );
        let again = check(&config);
        assert_eq!(again.report["spool"]["damaged_entries"], 1, "nothing moved");
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
