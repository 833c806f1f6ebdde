//! The series of sources no longer in use, left off `/metrics`.
//!
//! A sources directory's file removed ends its source, but the recorder
//! (metrics-exporter-prometheus 0.18) keeps every series it was ever
//! given: its handle renders and folds histograms, and forgets a series
//! only through `PrometheusBuilder::idle_timeout`, per metric kind. That
//! timeout would take every quiet series with the gone ones: the ones made
//! to exist at 0 for the alerts (`announce_source`), a gauge set once at
//! start. So the recorder keeps them and the rendering leaves out each
//! line labelled with a gone source's provider and name; a source of that
//! name coming back shows them again (its counters go on from where they
//! were, which Prometheus reads as one series). What the recorder holds
//! grows with the source names ever used, not with each add and removal.

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use metrics_exporter_prometheus::PrometheusHandle;

use super::telemetry::{PROVIDER, SOURCE};

/// The `provider="…"` and `source="…"` labels of the gone sources, as
/// rendered.
static GONE: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());

fn labels(provider: &str, name: &str) -> (String, String) {
    (
        format!("{PROVIDER}=\"{provider}\""),
        format!("{SOURCE}=\"{name}\""),
    )
}

/// The source `name` of `provider` ended: its series leave `/metrics`.
pub fn source_gone(provider: &str, name: &str) {
    GONE.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(labels(provider, name));
}

/// The source `name` of `provider` is in use (again): its series show.
pub fn source_back(provider: &str, name: &str) {
    GONE.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&labels(provider, name));
}

/// What `/metrics` serves: `handle`'s rendering without the gone sources'
/// series.
pub fn render(handle: &PrometheusHandle) -> String {
    let text = handle.render();
    let gone = GONE.lock().unwrap_or_else(PoisonError::into_inner);
    if gone.is_empty() {
        return text;
    }
    let mut kept = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if !of_gone(line, &gone) {
            kept.push_str(line);
        }
    }
    kept
}

/// Whether a sample line carries a gone source's labels (source names and
/// provider names hold no `,` nor `"`, so a label is one `,`-separated item).
fn of_gone(line: &str, gone: &BTreeSet<(String, String)>) -> bool {
    let Some(labels) = line
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .map(|(labels, _)| labels)
    else {
        return false;
    };
    let mut provider = None;
    let mut source = None;
    for label in labels.split(',') {
        if label.starts_with(PROVIDER) {
            provider = Some(label);
        } else if label.starts_with(SOURCE) {
            source = Some(label);
        }
    }
    match (provider, source) {
        (Some(p), Some(s)) => gone.contains(&(p.to_owned(), s.to_owned())),
        _ => false,
    }
}
