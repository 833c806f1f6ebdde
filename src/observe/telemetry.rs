//! Every metric name and label key posbridge emits, in one place, and the
//! Prometheus recorder that renders them on `/metrics`. (Named `telemetry`,
//! not `metrics`, so the `metrics` crate's macros read unambiguously.)
//!
//! Names follow Prometheus conventions: `posbridge_` prefix, base units,
//! counters ending in `_total`. Label values are bounded: provider, configured
//! source names, outcomes and reason codes; never a delivery or entity id.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Webhook requests by provider, source and outcome.
pub const WEBHOOK_REQUESTS: &str = "posbridge_webhook_requests_total";
/// Webhook answer time by provider and outcome.
pub const WEBHOOK_DURATION: &str = "posbridge_webhook_request_duration_seconds";
/// Signatures refused, by provider and source: a wrong secret shows here first.
pub const SIGNATURE_FAILURES: &str = "posbridge_signature_failures_total";
/// Time from produce to broker acknowledgement, by provider and topic.
pub const PUBLISH_DURATION: &str = "posbridge_publish_duration_seconds";
/// Produce attempts that failed, by provider and kind (retryable/permanent).
pub const PUBLISH_FAILURES: &str = "posbridge_publish_failures_total";
/// Deliveries being processed now, by provider.
pub const IN_FLIGHT: &str = "posbridge_deliveries_in_flight";
/// Duplicate deliveries answered without producing, by provider.
pub const DUPLICATES: &str = "posbridge_duplicates_total";
/// Events older than the entity's written state, held back, by provider and entity type.
pub const STALE_EVENTS: &str = "posbridge_stale_events_total";
/// Events written to the dead-letter topic, by provider and reason code.
pub const DEAD_LETTERS: &str = "posbridge_dead_letters_total";

/// Reconcile runs by provider and outcome (ok/failed).
pub const RECONCILE_RUNS: &str = "posbridge_reconcile_runs_total";
/// Records read by the reconciler, by provider and outcome.
pub const RECONCILE_RECORDS: &str = "posbridge_reconcile_records_total";
/// 1 while a watched webhook is on (found on, or switched back on by the
/// watchdog), 0 while it stays off, by provider and source; set at each check.
pub const WEBHOOK_ACTIVE: &str = "posbridge_webhook_active";
/// Webhooks the watchdog switched back on, by provider and source.
pub const WEBHOOK_RESUMES: &str = "posbridge_webhook_resumes_total";

/// Secrets in use, by provider and source: 2 during a rotation's overlap.
pub const SECRETS: &str = "posbridge_secrets";
/// 1 while a source's secret files read, 0 while the last read failed and
/// the secrets read before stay in use, by provider and source.
pub const SECRET_FILES_READABLE: &str = "posbridge_secret_files_readable";
/// Files of the sources directory refused now (a file that does not check,
/// a name or account taken twice; the directory itself unreadable counts
/// one): their sources keep their last good settings or stay absent.
pub const SOURCE_FILES_REFUSED: &str = "posbridge_source_files_refused";
/// Sources in use from files of the sources directory.
pub const SOURCES_FROM_FILES: &str = "posbridge_sources_from_files";

/// Always 1, labelled with the version and the wire format (`encoding`).
pub const BUILD_INFO: &str = "posbridge_build_info";
/// 1 while ledger writes work, 0 while the fence refuses deliveries.
pub const LEDGER_WRITABLE: &str = "posbridge_ledger_writable";
/// Gauge: 1 while the ledger is being filled from the topics (deliveries
/// wait or spool), else 0.
pub const REBUILD_RUNNING: &str = "posbridge_ledger_rebuild_running";
/// Counter: records read from the topics to fill the ledger.
pub const REBUILD_RECORDS: &str = "posbridge_ledger_rebuild_records_total";
/// Counter: times the ledger was found caching other topics than the
/// cluster holds (another cluster id or topic id, offsets past a
/// partition's end) and was forgotten and filled again from the topics.
pub const LEDGER_TOPICS_REPLACED: &str = "posbridge_ledger_other_topics_total";
/// Gauge: records the running rebuild still has to read.
pub const REBUILD_REMAINING: &str = "posbridge_ledger_rebuild_records_remaining";
/// 1 while a broker answers, 0 while none does.
pub const BROKER_UP: &str = "posbridge_broker_up";
/// 1 while an entity topic's records are refused because it changed under
/// posbridge (its partitions since the ledger kept them), by topic and reason (`partitions`,
/// `cleanup_policy`, `missing`); 0 otherwise, from start-up.
pub const TOPIC_CHANGED: &str = "posbridge_topic_changed";
/// Producers replaced (a fatal error, or a timeout on a broker that needs
/// it): one per cause at a time, not one per delivery.
pub const PRODUCER_REPLACEMENTS: &str = "posbridge_producer_replacements_total";
/// Deliveries in the outage spool now.
pub const SPOOL_ENTRIES: &str = "posbridge_spool_entries";
/// Bytes of the bodies in the outage spool now.
pub const SPOOL_BYTES: &str = "posbridge_spool_bytes";
/// `spool.max_bytes`, set at start: what `posbridge_spool_bytes` is compared
/// with to tell the time until the spool is full.
pub const SPOOL_MAX_BYTES: &str = "posbridge_spool_max_bytes";
/// `spool.max_entries`, set at start, beside `posbridge_spool_entries`.
pub const SPOOL_MAX_ENTRIES: &str = "posbridge_spool_max_entries";
/// Age of the oldest spooled delivery (0 when the spool is empty).
pub const SPOOL_OLDEST_AGE: &str = "posbridge_spool_oldest_age_seconds";
/// Deliveries answered 2xx from the spool, by provider and source.
pub const SPOOLED: &str = "posbridge_spooled_total";
/// Spooled deliveries whose outcome became durable, by provider and outcome.
pub const SPOOL_DRAINED: &str = "posbridge_spool_drained_total";
/// 1 while spool writes work, 0 from a failed write (a full disk) until a
/// heal's probe write works again.
pub const SPOOL_WRITABLE: &str = "posbridge_spool_writable";
/// Damaged spool entries in the quarantine directory beside the spool file
/// (counted at start-up, then one more per entry set aside): a gauge, so
/// it is there from the first scrape and stays until an operator has
/// looked at them and removed them.
pub const SPOOL_QUARANTINED: &str = "posbridge_spool_quarantined_entries";
/// Files set aside beside a store's file (`<path>.damaged-<unix seconds>`)
/// because they could not be opened, by store (`ledger`, `spool`); counted
/// at start-up, so a set aside then shows from the first scrape on.
pub const STORE_FILES_SET_ASIDE: &str = "posbridge_store_files_set_aside";
/// Deliveries of a source over its fair share while the process was busy,
/// by provider, source and what was done (`action`: `refused` 429,
/// `spooled`, `waited` for a slot of its share, `taken` anyway once the
/// wait ran out).
pub const OVER_SHARE: &str = "posbridge_deliveries_over_share_total";

/// Label keys.
pub const PROVIDER: &str = "provider";
/// Label key: configured source name.
pub const SOURCE: &str = "source";
/// Label key: how a request or record ended (`published`, `duplicate`, …).
pub const OUTCOME: &str = "outcome";
/// Label key: topic name.
pub const TOPIC: &str = "topic";
/// Label key: entity type.
pub const ENTITY_TYPE: &str = "entity_type";
/// Label key: a bounded reason code.
pub const REASON: &str = "reason";
/// Label key: the package version.
pub const VERSION: &str = "version";
/// Label key: the wire format (`avro-single-object`, `confluent`).
pub const ENCODING: &str = "encoding";
/// Label key: retryable or permanent.
pub const KIND: &str = "kind";
/// Label key: what was done with a delivery over its share.
pub const ACTION: &str = "action";
/// Label key: which store file (`ledger`, `spool`).
pub const STORE: &str = "store";

/// Buckets fitting a delivery deadline of a few seconds.
const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Installs the process-wide Prometheus recorder once and returns its handle.
/// Several apps in one process (tests) share it.
pub fn install() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
                .expect("bucket list is non-empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder already installed (an embedding program): ours
            // still renders what it records through `handle`.
            let _ = metrics::set_global_recorder(recorder);
            keep_up(handle.clone());
            handle
        })
        .clone()
}

/// How often the histograms' samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Folds the histograms' samples into their buckets every
/// [`UPKEEP_EVERY`], on a thread of its own. The recorder keeps every raw
/// sample until it folds them, which it otherwise does only when `/metrics`
/// is scraped: unscraped (or scraped rarely), memory would grow with every
/// delivery.
fn keep_up(handle: PrometheusHandle) {
    let started = crate::background::spawn("metrics-upkeep", move || {
        loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        }
    });
    if let Err(error) = started {
        tracing::warn!(%error, "The metrics' upkeep thread could not start: histogram samples are folded only when /metrics is scraped.");
    }
}

/// The first line a test's own recorder renders for the series `name`
/// (empty when it has none): a unit test reads its metric there, apart
/// from every other test in the process.
#[cfg(test)]
pub fn rendered(recorder: &metrics_exporter_prometheus::PrometheusRecorder, name: &str) -> String {
    recorder
        .handle()
        .render()
        .lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_default()
        .to_owned()
}
