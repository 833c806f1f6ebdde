//! What a delivery's stages tell the operator, each counter beside its one
//! log line: a stage says what happened in one call (a refused signature, a
//! spooled delivery, a duplicate, a stale event, a dead letter, the
//! in-flight gauge), and the series they count are made to exist here.
//!
//! Elsewhere, by what they belong to: the request's answer (its span's end,
//! the request meters of `http::ingress::meters`, the status board) is
//! observed in one place where the handler answers
//! (`http::ingress::webhook::observe_answer`); the producer's failures are
//! counted where they are sorted (`adapters::publish`); a stage's span wraps
//! the stage's work and so stays with it. The log lines here carry this
//! module as their target.

use std::fmt::Display;

use tracing::{debug, error, info, warn};

use super::telemetry;
use crate::domain::event::{EntityKey, PosEvent, ProviderKind, Source};

/// Makes the per-source series exist at 0 from start-up (a `rate()` or an
/// absence alert needs the series before the first event).
pub fn announce_source(source: &Source, spools: bool) {
    let provider = source.provider.as_str();
    metrics::counter!(
        telemetry::SIGNATURE_FAILURES,
        telemetry::PROVIDER => provider,
        telemetry::SOURCE => source.name.clone()
    )
    .increment(0);
    if spools {
        metrics::counter!(
            telemetry::SPOOLED,
            telemetry::PROVIDER => provider,
            telemetry::SOURCE => source.name.clone()
        )
        .increment(0);
    }
}

/// Makes a source's `posbridge_deliveries_over_share_total` series exist at
/// 0, one per action its deliveries over their share can get.
pub fn announce_over_share(source: &Source, actions: &[OverShareAction]) {
    for action in actions {
        over_share_counter(source, *action).increment(0);
    }
}

/// What was done with a delivery over its source's fair share: the
/// `action` label of `posbridge_deliveries_over_share_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverShareAction {
    /// Answered 429 + `Retry-After` (a provider that honours it).
    Refused,
    /// Waited the whole wait without a slot, then kept in the spool and
    /// answered 200 `spooled`.
    Spooled,
    /// Waited for a slot of its share, then taken in.
    Waited,
    /// Waited for its slot at its source's pace, then went on.
    Paced,
    /// Waited the whole wait without a slot and could not be spooled, then
    /// taken in over its share.
    Taken,
}

impl OverShareAction {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            OverShareAction::Refused => "refused",
            OverShareAction::Spooled => "spooled",
            OverShareAction::Waited => "waited",
            OverShareAction::Paced => "paced",
            OverShareAction::Taken => "taken",
        }
    }
}

/// A delivery of a source over its fair share while the process is busy,
/// and what was done with it.
pub fn over_share(source: &Source, action: OverShareAction) {
    debug!(
        action = action.as_str(),
        "Delivery over its source's fair share."
    );
    over_share_counter(source, action).increment(1);
}

fn over_share_counter(source: &Source, action: OverShareAction) -> metrics::Counter {
    metrics::counter!(
        telemetry::OVER_SHARE,
        telemetry::PROVIDER => source.provider.as_str(),
        telemetry::SOURCE => source.name.clone(),
        telemetry::ACTION => action.as_str()
    )
}

/// Makes the per-provider series exist at 0 from start-up, a dead-letter
/// series for each reason code in `dead_letter_codes`.
pub fn announce_provider(provider: ProviderKind, dead_letter_codes: &[&'static str]) {
    metrics::counter!(telemetry::DUPLICATES, telemetry::PROVIDER => provider.as_str()).increment(0);
    for &code in dead_letter_codes {
        metrics::counter!(
            telemetry::DEAD_LETTERS,
            telemetry::PROVIDER => provider.as_str(),
            telemetry::REASON => code
        )
        .increment(0);
    }
}

/// A webhook whose signature no secret of its source verifies.
pub fn signature_refused(source: &Source, reason: &dyn Display) {
    metrics::counter!(
        telemetry::SIGNATURE_FAILURES,
        telemetry::PROVIDER => source.provider.as_str(),
        telemetry::SOURCE => source.name.clone()
    )
    .increment(1);
    // Loud on purpose: a wrong secret silences a ReceiptRoller webhook after
    // four refused attempts, and pauses a Mekari endpoint after ten.
    error!(error = %reason, "Webhook signature refused; check this source's secrets and scheme.");
}

/// A delivery kept in the outage spool because Kafka could not take it in time.
pub fn spooled(source: &Source, reason: &dyn Display) {
    debug!(error = %reason, "Delivery spooled.");
    metrics::counter!(
        telemetry::SPOOLED,
        telemetry::PROVIDER => source.provider.as_str(),
        telemetry::SOURCE => source.name.clone()
    )
    .increment(1);
}

/// A delivery already handled, answered without producing.
pub fn duplicate(provider: ProviderKind) {
    metrics::counter!(telemetry::DUPLICATES, telemetry::PROVIDER => provider.as_str()).increment(1);
    debug!("Duplicate delivery answered without producing.");
}

/// An event older than its entity's written state, kept out of the topic.
pub fn stale(event: &PosEvent, key: &EntityKey) {
    metrics::counter!(
        telemetry::STALE_EVENTS,
        telemetry::PROVIDER => event.provider.as_str(),
        telemetry::ENTITY_TYPE => event.entity_type.as_str()
    )
    .increment(1);
    info!(
        entity = %key,
        event_type = %event.event_type,
        "Stale event held back: the topic already has a newer state."
    );
}

/// What a dead letter is about, for its log line.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterSeen<'a> {
    /// The provider that sent the event.
    pub provider: ProviderKind,
    /// The source it came through.
    pub source: &'a str,
    /// Its delivery id.
    pub delivery_id: &'a str,
    /// The bounded reason code.
    pub code: &'static str,
    /// The reason in words.
    pub reason: &'a str,
}

/// A dead letter Kafka acknowledged, with the event's raw body: said once,
/// whichever stage could not go on, and only once it is in the topic (an
/// attempt the broker refused is the caller's to say), and counted.
pub fn dead_lettered(letter: DeadLetterSeen<'_>) {
    warn!(
        provider = %letter.provider,
        source = letter.source,
        delivery_id = letter.delivery_id,
        code = letter.code,
        reason = %letter.reason,
        "Event dead-lettered with its raw body."
    );
    metrics::counter!(
        telemetry::DEAD_LETTERS,
        telemetry::PROVIDER => letter.provider.as_str(),
        telemetry::REASON => letter.code
    )
    .increment(1);
}

/// A record Kafka acknowledged whose ledger write failed: the fence keeps
/// the write and makes it before the ledger is read again, and logs the
/// failure itself, once; here only the record it was about.
pub fn committed_behind_fence(record_key: &str, error: &dyn Display) {
    debug!(entity = record_key, %error, "Published; its ledger write waits behind the fence.");
}

/// A dead letter the topic refused whole, to be written cut to `limit`.
pub fn dead_letter_cut(error: &dyn Display, limit: Option<usize>) {
    warn!(%error, limit, "Dead letter refused whole; writing the head that fits, with the body's length and hash.");
}

/// Work of the line still running when shutdown's budget for it ran out:
/// its records may be in Kafka without their commits (the next start's
/// rebuild reads them back).
pub fn still_running_at_shutdown(running: usize) {
    warn!(
        running,
        "Deliveries still running at the end of the shutdown budget."
    );
}

/// Each provider's `posbridge_deliveries_in_flight` gauge, looked up once:
/// a labelled `metrics::gauge!` builds, allocates and hashes its key on
/// every call, and every delivery counts itself here.
#[derive(Clone)]
pub struct InFlightGauges([metrics::Gauge; 2]);

impl InFlightGauges {
    /// Looks the gauges up. Call after [`telemetry::install`]: handles made
    /// before it record nowhere.
    pub fn register() -> InFlightGauges {
        InFlightGauges(ProviderKind::ALL.map(|provider| {
            metrics::gauge!(telemetry::IN_FLIGHT, telemetry::PROVIDER => provider.as_str())
        }))
    }

    /// Counts one more delivery of `provider` in flight.
    pub fn count(&self, provider: ProviderKind) -> InFlight {
        let gauge = match provider {
            ProviderKind::ReceiptRoller => &self.0[0],
            ProviderKind::Mekari => &self.0[1],
        };
        gauge.increment(1.0);
        InFlight(gauge.clone())
    }
}

/// Counts a delivery in `posbridge_deliveries_in_flight` while it lives, so
/// the gauge stays right when a client hangs up and its request is dropped.
#[must_use = "the delivery is counted only while this lives"]
pub struct InFlight(metrics::Gauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
