//! The series a directory's sources add to `/metrics`, beside the ones
//! the stages record as they go: made to exist when a source is (the
//! alerts watch them from the start), set as its files read.

use super::DirState;
use crate::config::source_files::SourceFile;
use crate::http::ingress::WebhookSource;
use crate::observe::{delivery, telemetry};

/// `posbridge_source_files_refused` and `posbridge_sources_from_files`.
pub(super) fn gauges(state: &DirState) {
    let refused = state.refused.len() + usize::from(state.unreadable.is_some());
    metrics::gauge!(telemetry::SOURCE_FILES_REFUSED).set(refused as f64);
    metrics::gauge!(telemetry::SOURCES_FROM_FILES).set(state.loaded.len() as f64);
}

/// `posbridge_secret_files_readable` of a directory file's source, as the
/// main file's sources' watch sets it (the alert on unreadable secret
/// files reads it for every source).
pub(super) fn secret_files_readable(file: &SourceFile, readable: bool) {
    metrics::gauge!(
        telemetry::SECRET_FILES_READABLE,
        telemetry::PROVIDER => file.provider.as_str(),
        telemetry::SOURCE => file.name.clone()
    )
    .set(f64::from(u8::from(readable)));
}

/// Makes a new source's series exist at 0 (alerts watch them from the
/// start).
pub(in crate::app) fn announce(webhook: &WebhookSource) {
    metrics::gauge!(
        telemetry::SECRETS,
        telemetry::PROVIDER => webhook.source.provider.as_str(),
        telemetry::SOURCE => webhook.source.name.clone()
    )
    .set(webhook.verifier.secrets_in_use() as f64);
    delivery::announce_source(&webhook.source, webhook.spools);
    delivery::announce_over_share(
        &webhook.source,
        crate::http::ingress::over_share_actions(webhook),
    );
}
