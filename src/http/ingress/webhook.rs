//! The webhook handler: raw bytes in, a status out.
//!
//! Order matters: find the source, read at most the body limit, verify the
//! signature over the untouched bytes, read the delivery id, take the
//! delivery's place in its source's fair share (`share.rs`; over it, slowed
//! as its provider understands, `over_share.rs`), and only then hand the
//! delivery to the pipeline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use compact_str::CompactString;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use time::OffsetDateTime;
use tracing::{Instrument, info_span};

use super::meters;
use super::over_share::{self, Slowed};
use super::response::{RequestOutcome, WebhookError, accepted};
use super::{AppState, WebhookSource};
use crate::adapters::providers;
use crate::domain::event::ProviderKind;
use crate::observe::board;
use crate::observe::delivery;
use crate::observe::traces::{DeliveryTrace, Stage};
use crate::services::pipeline::{Delivery, Handled, Outcome};

/// `POST /webhooks/{provider}/{source}`.
pub async fn receive(
    State(state): State<Arc<AppState>>,
    Path((provider_name, source_name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let Some(provider) = ProviderKind::parse(&provider_name) else {
        return WebhookError::UnknownProvider(provider_name).into_response();
    };
    let key = (provider, source_name);
    let sources = state.sources.load_full();
    let source = sources.get(&key);
    let source_label = source.map_or(meters::UNKNOWN_SOURCE, |s| s.source.name.as_str());
    let span = info_span!("delivery", provider = %provider, source = %source_label, delivery_id = tracing::field::Empty);
    // Read once: the pipeline's key, and the status page's whatever becomes
    // of the request.
    let delivery_id = headers
        .get(providers::for_kind(provider).delivery_id_header())
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(CompactString::from);
    // A configured source's request is a delivery, traced from here,
    // continuing the request's own trace when it names one.
    let trace = match source {
        Some(source) => state.pipeline.traces().delivery(
            &headers,
            provider,
            &source.source.name,
            delivery_id.as_deref(),
        ),
        None => DeliveryTrace::default(),
    };
    let result = match source {
        Some(source) => {
            let delivery = Request {
                headers,
                body,
                delivery_id: delivery_id.clone(),
                arrived: started,
                trace: trace.clone(),
            };
            handle(&state, source, delivery).instrument(span).await
        }
        None => Err(WebhookError::UnknownSource(key.1)),
    };
    let answered = Answered {
        result,
        elapsed: started.elapsed(),
        delivery_id,
    };
    match observe_answer(&state, source, provider, &trace, answered) {
        Ok(outcome) => accepted(outcome),
        Err(error) => error.into_response(),
    }
}

/// How a request was answered, for [`observe_answer`].
struct Answered {
    /// What the pipeline did, or why the request was refused.
    result: Result<Handled, WebhookError>,
    /// From arrival to the answer.
    elapsed: Duration,
    /// The delivery-id header's value, when it had one.
    delivery_id: Option<CompactString>,
}

/// The request's answer as the operator sees it, in one place: the end of
/// its delivery's span, the request meters (a source that is not configured
/// counted under `unknown`) and the status board's row of a configured source.
/// Hands back what the answer is made of: the outcome, or the refusal (the
/// delivery's strings move into the board's row, copied nowhere).
fn observe_answer(
    state: &AppState,
    source: Option<&WebhookSource>,
    provider: ProviderKind,
    trace: &DeliveryTrace,
    answered: Answered,
) -> Result<Outcome, WebhookError> {
    let Answered {
        result,
        elapsed,
        delivery_id,
    } = answered;
    let (outcome, status) = match &result {
        Ok(handled) => (RequestOutcome::Handled(handled.outcome), StatusCode::OK),
        Err(error) => (error.outcome(), error.status()),
    };
    match &result {
        Ok(handled) => trace.answered(
            outcome.as_str(),
            handled.dead_letter_reason,
            status.as_u16(),
            None,
        ),
        Err(error) => trace.answered(outcome.as_str(), None, status.as_u16(), Some(error)),
    }
    let Some(source) = source else {
        meters::record_unknown(provider, outcome, elapsed);
        return result.map(|handled| handled.outcome);
    };
    source.meters.record(outcome, elapsed);
    let (handled, answer) = match result {
        Ok(handled) => {
            let outcome = handled.outcome;
            (Some(handled), Ok(outcome))
        }
        Err(error) => (None, Err(error)),
    };
    let (event_type, entity_key, dead_letter_reason) = handled.map_or((None, None, None), |h| {
        (h.event_type, h.entity_key, h.dead_letter_reason)
    });
    state.board.delivered(
        provider,
        &source.source.name,
        board::Delivery {
            at: OffsetDateTime::now_utc(),
            delivery_id,
            event_type,
            entity_key,
            dead_letter_reason,
            answer: board::Answer {
                outcome: outcome.as_str(),
                status: status.as_u16(),
            },
            latency_ms: board::millis(elapsed),
        },
    );
    answer
}

/// A webhook request as it came, for [`handle`].
struct Request {
    /// Its headers: signature, delivery id.
    headers: HeaderMap,
    /// Its body, not read yet.
    body: Body,
    /// The delivery-id header's value, when it has one.
    delivery_id: Option<CompactString>,
    /// When it started: the answer budget counts from here.
    arrived: Instant,
    /// Its delivery's span.
    trace: DeliveryTrace,
}

async fn handle(
    state: &AppState,
    webhook: &WebhookSource,
    request: Request,
) -> Result<Handled, WebhookError> {
    let Request {
        headers,
        body,
        delivery_id,
        arrived,
        trace,
    } = request;
    let provider = webhook.source.provider;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > state.body_limit) {
        return Err(WebhookError::TooLarge(state.body_limit));
    }
    // Held until the answer: the body stays in memory that long.
    let _budget = u32::try_from(declared.unwrap_or(state.body_limit).max(1))
        .ok()
        .and_then(|bytes| state.body_budget.clone().try_acquire_many_owned(bytes).ok())
        .ok_or(WebhookError::Busy)?;
    let read = tokio::time::timeout(
        state.body_read_timeout,
        Limited::new(body, state.body_limit).collect(),
    );
    let bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(WebhookError::TooLarge(state.body_limit));
        }
        Ok(Err(e)) => return Err(WebhookError::BodyRead(e)),
        Err(_) => return Err(WebhookError::BodyTimeout(state.body_read_timeout)),
    };
    let now = OffsetDateTime::now_utc();
    let verifying = trace.stage(Stage::Verify);
    let verified = verifying.result(
        webhook
            .verifier
            .verify(&headers, bytes, now.unix_timestamp()),
    );
    let body = verified.inspect_err(|e| delivery::signature_refused(&webhook.source, e))?;
    // Checked only now: a request that is not signed is a 401 first.
    let delivery_id = delivery_id.ok_or_else(|| {
        WebhookError::MissingDeliveryId(providers::for_kind(provider).delivery_id_header())
    })?;
    tracing::Span::current().record("delivery_id", delivery_id.as_str());
    let delivery = Delivery {
        source: webhook.source.clone(),
        delivery_id,
        body,
        received_at: now,
        arrived,
        spools: webhook.spools,
        trace,
    };
    if let Some(handled) = over_share::keep_pace(state, webhook, &delivery).await? {
        return Ok(handled);
    }
    // Held until the delivery's outcome, on its task: the delivery counts
    // against its source's share that long, answered or not.
    let place = match state.shares.try_admit(&webhook.share) {
        Ok(place) => place,
        Err(over) => match over_share::slow_down(state, webhook, &delivery, over).await? {
            Slowed::Answered(handled) => return Ok(handled),
            Slowed::Admitted(place) => place,
        },
    };
    Ok(state.pipeline.deliver_holding(delivery, place).await?)
}
