use super::*;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use time::macros::datetime;

use crate::domain::event::{ProviderKind, Source};

fn config(dir: &Path, max_entries: u64) -> SpoolConfig {
    SpoolConfig {
        path: dir.join("spool.redb"),
        max_bytes: 1 << 20,
        max_entries,
    }
}

fn delivery(id: &str) -> SpooledDelivery {
    SpooledDelivery {
        key: DeliveryKey::new(ProviderKind::ReceiptRoller, id),
        source: Source {
            provider: ProviderKind::ReceiptRoller,
            name: "main".into(),
            account: Some("acme".into()),
            topic_prefix: None,
        },
        delivery_id: id.into(),
        received_at: datetime!(2026-11-29 10:15:30.123456 UTC),
        body: Bytes::from_static(b"{\"id\":\"x\"}\n\xff raw"),
    }
}

#[tokio::test]
async fn entries_come_back_oldest_first_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(&config(dir.path(), 10)).unwrap();
    for id in ["a", "b", "c"] {
        spool.append(&delivery(id)).await.unwrap();
    }
    assert!(spool.contains(&delivery("b").key).unwrap());
    assert!(!spool.contains(&delivery("z").key).unwrap());
    drop(spool);
    let spool = Spool::open(&config(dir.path(), 10)).unwrap();
    let oldest = spool.oldest(10).unwrap();
    let ids: Vec<&str> = oldest.iter().map(|(_, d)| d.delivery_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        oldest[0].1,
        delivery("a"),
        "every field comes back as written"
    );
    assert_eq!(spool.stats().entries, 3);
    spool
        .remove(vec![(oldest[0].0, delivery("a").key)])
        .await
        .unwrap();
    assert!(!spool.contains(&delivery("a").key).unwrap());
    assert_eq!(spool.stats().entries, 2);
    spool.append(&delivery("d")).await.unwrap();
    assert_eq!(
        spool.delivery_ids(),
        ["b", "c", "d"],
        "a new entry goes after the old ones"
    );
}

#[tokio::test]
async fn beyond_its_bound_the_spool_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(&config(dir.path(), 2)).unwrap();
    spool.append(&delivery("a")).await.unwrap();
    spool.append(&delivery("b")).await.unwrap();
    assert!(!spool.stats().has_room);
    assert!(matches!(
        spool.append(&delivery("c")).await,
        Err(SpoolError::Full { entries: 2, .. })
    ));
    assert!(!spool.contains(&delivery("c").key).unwrap());
}

/// A ReceiptRoller sale as the issue spooled it, with `total` in its body;
/// the `n`th arrived `n` seconds after the first.
fn sale(n: i64, total: u32) -> SpooledDelivery {
    let id = format!("sale-{n}");
    SpooledDelivery {
        key: DeliveryKey::new(ProviderKind::ReceiptRoller, &id),
        source: Source {
            provider: ProviderKind::ReceiptRoller,
            name: "main".into(),
            account: None,
            topic_prefix: None,
        },
        body: Bytes::from(format!(
            r#"{{"id":"{id}","event":"sale.created","data":{{"receipt":"T1|2026-11|{n}","total":{total}}}}}"#
        )),
        delivery_id: id,
        received_at: datetime!(2026-11-29 10:15:00 UTC) + time::Duration::seconds(n),
    }
}

/// Three sales spooled during an outage, the second with a total of 4321,
/// and the spool that holds them, open.
async fn spooled_sales(config: &SpoolConfig) -> (Spool, [SpooledDelivery; 3]) {
    let sales = [sale(1, 1200), sale(2, 4321), sale(3, 5000)];
    let spool = Spool::open(config).unwrap();
    for sale in &sales {
        spool.append(sale).await.unwrap();
    }
    (spool, sales)
}

/// The same, the spool closed (posbridge stopped).
async fn three_sales(config: &SpoolConfig) -> [SpooledDelivery; 3] {
    spooled_sales(config).await.1
}

/// `bytes` with every `from` replaced by `to` (of one length), and how
/// many it replaced.
fn replaced(bytes: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    let at: Vec<usize> = memchr::memmem::find_iter(bytes, from).collect();
    for &i in &at {
        bytes[i..i + to.len()].copy_from_slice(to);
    }
    at.len()
}

/// Changes the stored bytes of entry `seq` through redb, as damage redb's
/// own page checksums cannot see would (bytes changed before redb wrote
/// them, or in a file redb trusts: it verifies its pages only at start-up).
fn change_entry(db: &Database, seq: u64, from: &[u8], to: &[u8]) {
    let txn = db.begin_write().unwrap();
    {
        let mut entries = txn.open_table(ENTRIES).unwrap();
        let mut stored = entries.get(seq).unwrap().unwrap().value().to_vec();
        assert_eq!(replaced(&mut stored, from, to), 1);
        entries.insert(seq, stored.as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

/// The quarantine's records (`.json`), parsed.
fn quarantined(config: &SpoolConfig) -> Vec<serde_json::Value> {
    let dir = Quarantine::beside(&config.path).dir;
    let Ok(files) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    files
        .map(|file| file.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap())
        .collect()
}

/// The issue's case: one byte of one spooled body changed on disk while
/// posbridge was stopped (a total 4321 → 9321, in every copy the file
/// holds). The spool opens, the two intact sales come back, and the
/// changed one never does, whether redb finds the change (the file is set
/// aside and salvaged) or not (the entry's checksum finds it).
#[tokio::test]
async fn a_byte_changed_in_a_spooled_body_on_disk_costs_that_entry_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let [first, second, third] = three_sales(&config).await;
    let mut bytes = std::fs::read(&config.path).unwrap();
    assert!(replaced(&mut bytes, b"4321", b"9321") > 0);
    std::fs::write(&config.path, bytes).unwrap();

    let spool = Spool::open(&config).unwrap();
    let back = spool.oldest(10).unwrap();
    let back: Vec<&SpooledDelivery> = back.iter().map(|(_, d)| d).collect();
    assert_eq!(back, [&first, &third], "the intact sales, as spooled");
    assert_eq!(spool.stats().entries, 2);
    assert!(
        !spool.contains(&second.key).unwrap(),
        "the changed sale's retry is taken anew"
    );
}

/// An entry whose bytes no longer match its checksum, in a file redb
/// opens: moved to the quarantine (its bytes and why), counted, never
/// returned; the others come back, and a reopen finds the same.
#[tokio::test]
async fn an_entry_that_fails_its_checksum_is_quarantined_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let [_, second, _] = three_sales(&config).await;
    change_entry(
        &store_file::open(&config.path).unwrap(),
        1,
        b"4321",
        b"9321",
    );

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let spool = metrics::with_local_recorder(&recorder, || Spool::open(&config)).unwrap();
    assert_eq!(spool.delivery_ids(), ["sale-1", "sale-3"]);
    assert_eq!(spool.stats().entries, 2);
    assert!(!spool.contains(&second.key).unwrap());
    assert_eq!(
        telemetry::rendered(&recorder, telemetry::SPOOL_QUARANTINED),
        "posbridge_spool_quarantined_entries 1"
    );
    let records = quarantined(&config);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["seq"], 1);
    assert_eq!(records[0]["reason"], "checksum");
    assert_eq!(
        records[0]["header_as_found"]["delivery_id"], "sale-2",
        "which delivery to ask its provider for"
    );
    let dir = Quarantine::beside(&config.path).dir;
    let kept = std::fs::read_dir(&dir)
        .unwrap()
        .map(|file| file.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "entry"))
        .unwrap();
    let kept = std::fs::read(kept).unwrap();
    assert!(
        memchr::memmem::find(&kept, b"9321").is_some(),
        "the bytes as found"
    );

    drop(spool);
    let spool = metrics::with_local_recorder(&recorder, || Spool::open(&config)).unwrap();
    assert_eq!(spool.delivery_ids(), ["sale-1", "sale-3"]);
    assert_eq!(
        telemetry::rendered(&recorder, telemetry::SPOOL_QUARANTINED),
        "posbridge_spool_quarantined_entries 1",
        "counted from the directory at start-up"
    );
}

/// An entry changed while posbridge runs is found when it is read for the
/// drain: quarantined, and the entries after it still come back.
#[tokio::test]
async fn an_entry_damaged_while_spooled_is_quarantined_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let (spool, _) = spooled_sales(&config).await;
    change_entry(&spool.db().unwrap(), 1, b"4321", b"9321");

    let ids: Vec<String> = spool
        .oldest(10)
        .unwrap()
        .into_iter()
        .map(|(_, d)| d.delivery_id)
        .collect();
    assert_eq!(ids, ["sale-1", "sale-3"]);
    assert_eq!(spool.stats().entries, 2);
    assert_eq!(quarantined(&config).len(), 1);
}

/// A spool file redb refuses (its header overwritten), which also holds an
/// entry whose body changed and one of 50 KB (larger than a page): set
/// aside whole, and every intact entry salvaged into a new spool in the
/// order spooled; the changed one is not, and goes to the quarantine.
#[tokio::test]
async fn a_spool_file_redb_refuses_is_set_aside_and_its_intact_entries_salvaged() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let [first, _, third] = three_sales(&config).await;
    let mut large = sale(4, 7000);
    large.body = Bytes::from(format!(
        r#"{{"id":"sale-4","pad":"{}"}}"#,
        "x".repeat(50_000)
    ));
    Spool::open(&config).unwrap().append(&large).await.unwrap();
    let mut bytes = std::fs::read(&config.path).unwrap();
    bytes[..512].fill(0);
    assert!(replaced(&mut bytes, b"4321", b"9321") > 0);
    std::fs::write(&config.path, &bytes).unwrap();

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let spool = metrics::with_local_recorder(&recorder, || Spool::open(&config)).unwrap();
    let back: Vec<SpooledDelivery> = spool
        .oldest(10)
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(back, [first, third, large]);
    assert_eq!(spool.stats().entries, 3);
    // The changed one is not lost silently: counted, alerted on, kept.
    let kept = quarantined(&config);
    assert!(
        !kept.is_empty() && kept.iter().all(|record| record["reason"] == "checksum"),
        "{kept:?}"
    );
    assert_eq!(spool.stats().quarantined, kept.len() as u64);
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|file| file.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("spool.redb.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        std::fs::read(dir.path().join(&aside[0])).unwrap() == bytes,
        "kept as found"
    );
    assert_eq!(
        telemetry::rendered(&recorder, telemetry::STORE_FILES_SET_ASIDE),
        "posbridge_store_files_set_aside{store=\"spool\"} 1"
    );
    spool.append(&sale(5, 100)).await.unwrap();
    assert_eq!(spool.stats().entries, 4, "the new spool takes deliveries");
}

/// An entry an earlier version wrote (no frame, no checksum) is still read.
#[tokio::test]
async fn an_entry_written_before_frames_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let old = sale(1, 1200);
    {
        let framed = old.encode();
        let payload = frame::open(&framed).unwrap();
        let db = store_file::open(&config.path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(ENTRIES).unwrap().insert(0, payload).unwrap();
        txn.open_table(BY_DELIVERY)
            .unwrap()
            .insert(old.key.as_str(), 0)
            .unwrap();
        txn.commit().unwrap();
    }
    let spool = Spool::open(&config).unwrap();
    assert_eq!(spool.oldest(10).unwrap(), [(0, old)]);
}

/// A spool as an unclean stop leaves it (the file copied while open), its
/// last commit's page damaged outside the entry that commit added: redb
/// rolls the file back to the commit before, which lacks the last sale,
/// answered 2xx when it was spooled. The spool finds that sale's intact
/// entry in the file's bytes and has it back.
#[tokio::test]
async fn entries_of_commits_redb_rolls_back_are_found_in_the_file_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let (spool, sales) = spooled_sales(&config).await;
    let mut image = std::fs::read(&config.path).unwrap();
    drop(spool);
    let last = memchr::memmem::rfind(&image, br#""delivery_id":"sale-3""#).unwrap();
    // The page's header (its entry count and offsets), not the entry.
    let page = last / 4096 * 4096;
    image[page + 2] ^= 0xff;
    std::fs::write(&config.path, &image).unwrap();

    let spool = Spool::open(&config).unwrap();
    assert_eq!(spool.delivery_ids(), ["sale-1", "sale-2", "sale-3"]);
    let back: Vec<SpooledDelivery> = spool
        .oldest(10)
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert!(back == sales, "every field as spooled");
    assert!(spool.contains(&sales[2].key).unwrap());
}

/// The same unclean stop without damage: redb's repair keeps every commit,
/// and nothing is looked for in the file (a sale drained before, whose
/// intact entry is still in a freed page, stays drained).
#[tokio::test]
async fn an_unclean_stop_without_damage_brings_back_nothing_drained() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), 10);
    let spool = Spool::open(&config).unwrap();
    for sale in [sale(1, 1200), sale(2, 4321), sale(3, 5000)] {
        spool.append(&sale).await.unwrap();
    }
    let oldest = spool.oldest(1).unwrap();
    spool
        .remove(vec![(oldest[0].0, oldest[0].1.key.clone())])
        .await
        .unwrap();
    let image = std::fs::read(&config.path).unwrap();
    drop(spool);
    std::fs::write(&config.path, &image).unwrap();

    let spool = Spool::open(&config).unwrap();
    assert_eq!(spool.delivery_ids(), ["sale-2", "sale-3"]);
}

/// Damage that runs from the end of one entry over the next one's frame
/// header leaves one damaged run holding both: the salvage keeps (and
/// counts) one piece per entry, not one for the run.
#[test]
fn a_damaged_run_over_two_entries_is_kept_as_two() {
    let first = delivery("a").encode();
    assert!(
        first[frame::HEADER_LEN..].starts_with(entry::HEADER_START),
        "an entry's header begins as the salvage looks for it"
    );
    let mut bytes = [first.clone(), delivery("b").encode()].concat();
    for byte in &mut bytes[first.len() - 1..first.len() + 20] {
        *byte ^= 0x5a;
    }
    let found: Vec<_> = frame::scan(&bytes).collect();
    let [frame::Found::Damaged(_, run)] = found[..] else {
        panic!("one damaged run: {found:?}");
    };
    let pieces = salvage::entries_in(run);
    assert_eq!(pieces.len(), 2, "one piece per entry");
    assert_eq!(pieces[0].len(), first.len());
}

/// Damage that takes an entry's whole frame header leaves its entry header
/// where no frame begins: the salvage finds it there and quarantines it,
/// so the lost delivery is counted.
#[test]
fn an_entry_whose_frame_header_is_gone_is_quarantined() {
    let first = delivery("a").encode();
    let mut bytes = [first.clone(), delivery("b").encode()].concat();
    // The second frame's header, all of it, changed.
    for byte in &mut bytes[first.len()..first.len() + frame::HEADER_LEN] {
        *byte ^= 0x5a;
    }
    let salvaged = salvage::Salvaged::from_bytes(&bytes);
    assert_eq!(salvaged.deliveries.len(), 1, "the first is intact");
    assert_eq!(
        salvaged
            .damaged
            .iter()
            .map(|(damage, _)| *damage)
            .collect::<Vec<_>>(),
        [frame::Damage::Unframed]
    );
}

/// A spooled delivery keeps its source's own topics: it drains there, even
/// once the source is gone; an entry without them (an earlier version's, or
/// a source on the shared topics) reads as the shared topics.
#[test]
fn an_entry_keeps_its_sources_own_topics() {
    let mut own = delivery("a");
    own.source.topic_prefix = Some("acme.".into());
    let stored = own.encode();
    assert_eq!(SpooledDelivery::decode(&stored).unwrap(), own);
    let shared = delivery("b");
    let stored = shared.encode();
    assert!(
        !String::from_utf8_lossy(&stored).contains("topic_prefix"),
        "an entry on the shared topics is stored as before"
    );
    assert_eq!(
        SpooledDelivery::decode(&stored)
            .unwrap()
            .source
            .topic_prefix,
        None
    );
}

/// A disk whose next sync fails once armed, and the file itself otherwise:
/// an I/O error in the last step of a commit, after redb wrote its pages
/// and its header, which a reopen then reads (as one reads them from the
/// page cache, durable or not).
#[derive(Clone, Default)]
struct NextSyncFails(Arc<AtomicBool>);

impl NextSyncFails {
    fn disk(&self) -> Disk {
        let fails = self.0.clone();
        Disk::simulated(Arc::new(move |builder: &redb::Builder, path: &Path| {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|e| redb::DatabaseError::Storage(e.into()))?;
            builder.create_with_backend(SyncFailing {
                file,
                fails: fails.clone(),
            })
        }))
    }

    fn arm(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct SyncFailing {
    file: std::fs::File,
    fails: Arc<AtomicBool>,
}

impl redb::StorageBackend for SyncFailing {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        if self.fails.swap(false, Ordering::SeqCst) {
            return Err(std::io::Error::other("an injected I/O error"));
        }
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.file.write_all_at(data, offset)
    }
}

/// Found by the simulation (seed 13924): an append whose commit failed at
/// its last sync (answered 503) left an entry the heal's reopen read, and
/// the provider's retry was answered `duplicate` on it, though nothing
/// says it is durable (redb: a failed commit may have landed or not). The
/// retry is taken anew: the heal takes that entry out, and the retry's own
/// append spools the delivery, once.
#[tokio::test(start_paused = true)]
async fn a_retry_of_a_delivery_whose_append_failed_is_spooled_again_not_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let syncs = NextSyncFails::default();
    let spool = Spool::open_on(&config(dir.path(), 10), syncs.disk()).unwrap();
    spool.append(&delivery("a")).await.unwrap();
    syncs.arm();
    assert!(matches!(
        spool.append(&delivery("b")).await,
        Err(SpoolError::Storage(_))
    ));
    tokio::time::advance(health::RETRY_EVERY).await;
    assert!(spool.heal().await, "the disk works again");

    assert!(
        !spool.contains(&delivery("b").key).unwrap(),
        "the retry of a delivery whose append failed is not a duplicate"
    );
    assert_eq!(
        spool.delivery_ids(),
        ["a"],
        "the heal took the failed append's entry out"
    );
    spool.append(&delivery("b")).await.unwrap();
    assert!(spool.contains(&delivery("b").key).unwrap());
    assert_eq!(spool.delivery_ids(), ["a", "b"]);
    assert_eq!(spool.stats().entries, 2);
}
