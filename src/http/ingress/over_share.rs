//! What a delivery over its source's fair share gets (`share.rs` says when
//! one is), chosen by what its provider understands:
//!
//! * a provider that honours `Retry-After` (Mekari: a 429 is retried like a
//!   5xx, waiting at least that long, up to an hour) is answered 429 +
//!   `server.share_retry_after_secs`: the cheapest answer, and the burst
//!   comes back spread out;
//! * a provider that ignores it and counts every non-2xx toward switching
//!   the webhook off (ReceiptRoller, four failed attempts of one event) is
//!   never refused: a source that spools has the delivery kept in the spool
//!   at once (200 `spooled`, one durable write, no Kafka, no ledger), which
//!   the drainer publishes; one that does not (or whose spool cannot take
//!   it: full, unwritable) waits for a slot of its share for the part of
//!   the answer budget Kafka does not need (`server.inflight_wait_ms`), then
//!   is taken in all the same. The wait holds the provider's connection, so
//!   it slows the flood to what its share gets through, and still leaves
//!   Kafka's whole deadline for the delivery once taken in.

use super::response::WebhookError;
use super::share::{OverShare, Place, Waited};
use super::{AppState, WebhookSource};
use crate::adapters::providers;
use crate::domain::event::ProviderKind;
use crate::observe::delivery::{self as observe, OverShareAction};
use crate::services::pipeline::{Delivery, Handled, Outcome, PipelineError};

/// A delivery over its share, slowed.
pub(super) enum Slowed {
    /// Answered without the pipeline taking it in (spooled, or a duplicate
    /// of a delivery the spool holds).
    Answered(Handled),
    /// Taken in after a wait: its place in flight.
    Admitted(Place),
}

/// The `Retry-After` a provider honours at most, when it honours one.
fn longest_retry_after(provider: ProviderKind) -> Option<u64> {
    providers::for_kind(provider)
        .delivery_rules()
        .longest_retry_after
        .map(|longest| longest.as_secs())
}

/// What can be done with a delivery of `webhook` over its share: the
/// series made to exist at start-up.
pub fn actions(webhook: &WebhookSource) -> &'static [OverShareAction] {
    match (longest_retry_after(webhook.source.provider), webhook.spools) {
        (Some(_), _) => &[OverShareAction::Refused],
        (None, true) => &[
            OverShareAction::Spooled,
            OverShareAction::Waited,
            OverShareAction::Taken,
        ],
        (None, false) => &[OverShareAction::Waited, OverShareAction::Taken],
    }
}

/// Slows `delivery`, whose source is over its share ([`OverShare`]), the
/// way its provider understands (see the module's doc).
///
/// # Errors
/// [`WebhookError::OverShare`] (429) for a provider that honours
/// `Retry-After`; a delivery whose body names another id than its header
/// is the request's mistake (400), whichever way it goes.
pub(super) async fn slow_down(
    state: &AppState,
    webhook: &WebhookSource,
    delivery: &Delivery,
    _over: OverShare,
) -> Result<Slowed, WebhookError> {
    let source = &webhook.source;
    if let Some(longest) = longest_retry_after(source.provider) {
        observe::over_share(source, OverShareAction::Refused);
        return Err(WebhookError::OverShare {
            retry_after_secs: state.shares.retry_after_secs().min(longest),
        });
    }
    match state.pipeline.spool_at_once(delivery).await {
        Some(Ok(handled)) => {
            // Not a duplicate of a delivery the spool held already.
            if handled.outcome == Outcome::Spooled {
                observe::over_share(source, OverShareAction::Spooled);
            }
            return Ok(Slowed::Answered(handled));
        }
        Some(Err(PipelineError::DeliveryIdMismatch)) => {
            return Err(PipelineError::DeliveryIdMismatch.into());
        }
        // The spool cannot take it (full, unwritable): it says so itself;
        // the delivery waits for its share instead of being refused.
        Some(Err(error)) => {
            tracing::debug!(%error, "Spool refused a delivery over its share; it waits for its share.");
        }
        None => {}
    }
    let (place, waited) = state
        .shares
        .wait_for(&webhook.share, delivery.arrived + state.share_wait)
        .await;
    observe::over_share(
        source,
        match waited {
            Waited::ForShare => OverShareAction::Waited,
            Waited::TakenAnyway => OverShareAction::Taken,
        },
    );
    Ok(Slowed::Admitted(place))
}
