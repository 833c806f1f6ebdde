//! What a delivery over its source's fair share gets (`share/` says when
//! one is: over its share in flight, or its slot at its source's pace past
//! its wait), chosen by what its provider understands:
//!
//! * a provider that honours `Retry-After` (Mekari: a 429 is retried like a
//!   5xx, waiting at least that long, up to an hour) is answered 429 +
//!   `server.share_retry_after_secs`: the cheapest answer, and the burst
//!   comes back spread out;
//! * a provider that ignores it and counts every non-2xx toward switching
//!   the webhook off (ReceiptRoller, four failed attempts of one event) is
//!   never refused: the delivery first waits for a slot of its share (or
//!   at its pace, for its slot), for the part of the answer budget Kafka
//!   does not need (`server.inflight_wait_ms`), and is taken in when one
//!   comes free. The
//!   wait holds the provider's connection, so a provider that sends as fast
//!   as it is answered (a replay) is slowed to what its share gets through,
//!   instead of being answered at once and sending the next. When the wait
//!   runs out, a source that spools has the delivery kept in the spool (200
//!   `spooled`, one durable write; the drainer publishes it), and one that
//!   does not (or whose spool cannot take it: full, unwritable) is taken in
//!   over its share all the same, with Kafka's whole deadline still ahead.
//!
//! Spooling at once, without the wait, was measured first
//! (`scripts/bench fairshare`): the flood's answers came as fast as the
//! spool's writes, so it kept sending, and the drainer published the
//! spooled deliveries right away (Kafka was up), so each cost the line
//! twice; the others' p99 went from 14 ms to 2.2 s.

use super::response::WebhookError;
use super::share::{OverShare, Paced, Place, ShareBound};
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
        (Some(_), _) => &[OverShareAction::Refused, OverShareAction::Paced],
        (None, true) => &[
            OverShareAction::Spooled,
            OverShareAction::Waited,
            OverShareAction::Paced,
            OverShareAction::Taken,
        ],
        (None, false) => &[
            OverShareAction::Waited,
            OverShareAction::Paced,
            OverShareAction::Taken,
        ],
    }
}

/// Holds `delivery` to its source's pace (`share/pace.rs`): on at once,
/// or after a wait for its slot; when its slot lies past its wait, slowed
/// as its provider understands (429 at once for a provider that honours
/// `Retry-After`; else, at the wait's end, the spool or taken in all the
/// same). The answer when it was answered without the pipeline.
///
/// # Errors
/// As [`slow_down`].
pub(super) async fn keep_pace(
    state: &AppState,
    webhook: &WebhookSource,
    delivery: &Delivery,
) -> Result<Option<Handled>, WebhookError> {
    let source = &webhook.source;
    let until = delivery.arrived + state.share_wait;
    match state.shares.pace(&webhook.share, delivery.arrived, until) {
        Paced::Now => Ok(None),
        Paced::Until(slot) => {
            tokio::time::sleep_until(slot).await;
            observe::over_share(source, OverShareAction::Paced);
            Ok(None)
        }
        Paced::Over => {
            refuse_where_honoured(state, webhook, ShareBound::Pace)?;
            // Held for the whole wait, as a delivery over its share in
            // flight is: answered at once, a provider that sends as fast
            // as it is answered would send the next at once.
            tokio::time::sleep_until(until).await;
            let answered = spool(state, delivery).await?;
            if answered.is_none() {
                observe::over_share(source, OverShareAction::Taken);
            }
            Ok(answered)
        }
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
    refuse_where_honoured(state, webhook, ShareBound::InFlight)?;
    let until = delivery.arrived + state.share_wait;
    if let Some(place) = state.shares.wait_for(&webhook.share, until).await {
        observe::over_share(source, OverShareAction::Waited);
        return Ok(Slowed::Admitted(place));
    }
    if let Some(handled) = spool(state, delivery).await? {
        return Ok(Slowed::Answered(handled));
    }
    observe::over_share(source, OverShareAction::Taken);
    Ok(Slowed::Admitted(state.shares.take_anyway(&webhook.share)))
}

/// 429 + `Retry-After` for a source whose provider honours the header.
fn refuse_where_honoured(
    state: &AppState,
    webhook: &WebhookSource,
    by: ShareBound,
) -> Result<(), WebhookError> {
    let Some(longest) = longest_retry_after(webhook.source.provider) else {
        return Ok(());
    };
    observe::over_share(&webhook.source, OverShareAction::Refused);
    Err(WebhookError::OverShare {
        retry_after_secs: state.shares.retry_after_secs().min(longest),
        by,
    })
}

/// `delivery` kept in the spool when its source spools and the spool takes
/// it: 200 `spooled`, or a duplicate of a delivery it holds. `None` when it
/// cannot (no spool; full, unwritable: it says so itself), for the delivery
/// to be taken in instead of refused.
async fn spool(state: &AppState, delivery: &Delivery) -> Result<Option<Handled>, WebhookError> {
    match state.pipeline.spool_at_once(delivery).await {
        Some(Ok(handled)) => {
            // Not a duplicate of a delivery the spool held already.
            if handled.outcome == Outcome::Spooled {
                observe::over_share(&delivery.source, OverShareAction::Spooled);
            }
            Ok(Some(handled))
        }
        Some(Err(PipelineError::DeliveryIdMismatch)) => {
            Err(PipelineError::DeliveryIdMismatch.into())
        }
        Some(Err(error)) => {
            tracing::debug!(%error, "Spool refused a delivery over its share; taken in.");
            Ok(None)
        }
        None => Ok(None),
    }
}
