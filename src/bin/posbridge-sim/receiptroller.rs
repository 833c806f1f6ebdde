//! ReceiptRoller as the simulator plays it: delivery rules and API.
//!
//! Delivery (receiptroller-delivery.md, intervals from payloads.md): four
//! attempts, 1 min, 10 min and 60 min after the previous failure; every
//! non-2xx and every connection error or 10 s timeout is a failure; four
//! failures of one event switch the whole webhook off, after which new events
//! are not sent. Switching off does not stop retries already waiting, but a
//! server restart drops them without switching anything off.
//!
//! API (payloads.md), bearer token on every request:
//! * `GET /receiptroller/transactions?from=&to=&page=&per_page=`: sales whose
//!   `transaction_at` is in `[from, to)`, oldest first.
//! * `GET /receiptroller/webhooks/{webhook_id}`, `PATCH` with `{"active": true}`.

use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use posbridge::event::{EntityType, ProviderKind};
use serde_json::{Value, json};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::api::{self, ApiError, Params};
use crate::send::{self, Outgoing};
use crate::state::{Fate, Sim, lock};
use crate::truth::RECEIPTROLLER_WEBHOOK_ID;

/// Attempts per event.
pub const ATTEMPTS: usize = 4;
/// Wait after each failed attempt, before the next (documented time).
pub const RETRY_DELAYS: [Duration; ATTEMPTS - 1] = [
    Duration::from_secs(60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(60 * 60),
];
/// The events the simulated webhook subscribes to.
const EVENTS: [&str; 4] = [
    "sale.created",
    "sale.cancelled",
    "order.created",
    "order.updated",
];
/// Default and largest `per_page` of the Transactions API.
const PER_PAGE: (usize, usize) = (100, 500);

/// The simulated webhook's state.
#[derive(Debug)]
pub struct Webhook {
    /// Sends new events only while active.
    pub active: bool,
    /// Cancelled by a server restart: retries waiting on it are dropped.
    restart: CancellationToken,
    /// Deliveries currently between attempts, for the restart report.
    waiting: usize,
}

impl Default for Webhook {
    fn default() -> Webhook {
        Webhook {
            active: true,
            restart: CancellationToken::new(),
            waiting: 0,
        }
    }
}

/// A simulated server restart: pending retries are dropped, the webhook
/// keeps its state. Returns how many deliveries were waiting for a retry.
pub fn restart(sim: &Sim) -> usize {
    let mut webhook = lock(&sim.receiptroller);
    webhook.restart.cancel();
    webhook.restart = CancellationToken::new();
    let dropped = std::mem::take(&mut webhook.waiting);
    warn!(
        pending_retries = dropped,
        "ReceiptRoller server restarted; pending retries are dropped."
    );
    dropped
}

/// Delivers one event by ReceiptRoller's rules.
pub async fn deliver(sim: &Sim, out: &Outgoing) {
    let restart = lock(&sim.receiptroller).restart.clone();
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            let wait = sim.settings.scale.real(RETRY_DELAYS[attempt - 2]);
            {
                // Under the lock restart() takes, so a delivery is either
                // counted as waiting before the restart or sees it.
                let mut webhook = lock(&sim.receiptroller);
                if restart.is_cancelled() {
                    drop(webhook);
                    sim.record(out.index, |r| r.fate = Fate::Abandoned);
                    return;
                }
                webhook.waiting += 1;
            }
            let restarted = tokio::select! {
                () = sleep(wait) => false,
                () = restart.cancelled() => true,
            };
            if !restarted {
                let mut webhook = lock(&sim.receiptroller);
                webhook.waiting = webhook.waiting.saturating_sub(1);
            }
            if restarted {
                info!(delivery_id = %out.delivery_id, attempt, "Retry dropped by the restart.");
                sim.record(out.index, |r| r.fate = Fate::Abandoned);
                return;
            }
        }
        let answer = send::attempt(sim, out).await;
        if answer.is_success() {
            sim.record(out.index, |r| r.fate = Fate::Delivered);
            return;
        }
        info!(provider = "receiptroller", delivery_id = %out.delivery_id, attempt,
              status = answer.code(), "Attempt failed.");
        if restart.is_cancelled() {
            sim.record(out.index, |r| r.fate = Fate::Abandoned);
            return;
        }
    }
    sim.record(out.index, |r| r.fate = Fate::Failed);
    let mut webhook = lock(&sim.receiptroller);
    if webhook.active {
        webhook.active = false;
        error!(delivery_id = %out.delivery_id,
               "Four attempts failed: the ReceiptRoller webhook is switched off.");
    }
}

/// The API routes, behind the bearer check.
pub fn routes(sim: Sim) -> Router<Sim> {
    Router::new()
        .route("/receiptroller/transactions", get(transactions))
        .route(
            "/receiptroller/webhooks/{webhook_id}",
            get(webhook).patch(set_webhook),
        )
        .route_layer(middleware::from_fn_with_state(sim, bearer))
}

/// Whether an `Authorization` value is `Bearer <token>`.
pub fn bearer_matches(authorization: &str, token: &str) -> bool {
    authorization
        .trim()
        .split_once(' ')
        .is_some_and(|(scheme, value)| {
            scheme.eq_ignore_ascii_case("bearer") && value.trim() == token
        })
}

async fn bearer(
    State(sim): State<Sim>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match authorization {
        Some(value) if bearer_matches(value, &sim.settings.receiptroller_token) => {
            Ok(next.run(request).await)
        }
        Some(_) => Err(ApiError::unauthorized("invalid bearer token")
            .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))),
        None => Err(ApiError::unauthorized("missing bearer token")
            .with_header(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"))),
    }
}

async fn transactions(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    if sim.api_should_fail() {
        return Err(ApiError::unavailable());
    }
    let from = api::time_param(&params, "from")?
        .ok_or_else(|| ApiError::bad_request("from is required"))?;
    let to =
        api::time_param(&params, "to")?.ok_or_else(|| ApiError::bad_request("to is required"))?;
    let (page, per_page) = api::paging(&params, PER_PAGE.0, PER_PAGE.1)?;
    let mut sales: Vec<_> = lock(&sim.truth)
        .entities()
        .filter(|e| e.provider == ProviderKind::ReceiptRoller && e.entity_type == EntityType::Sale)
        .filter(|e| api::in_window(e.business_at, Some(from), Some(to)))
        .map(|e| (e.business_at, e.id.clone(), Value::Object(e.data.clone())))
        .collect();
    sales.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let (items, total_pages) = api::page(sales, page, per_page);
    let items: Vec<Value> = items.into_iter().map(|(_, _, data)| data).collect();
    Ok(Json(
        json!({"items": items, "page": page, "total_pages": total_pages}),
    ))
}

fn webhook_body(sim: &Sim) -> Value {
    json!({
        "id": RECEIPTROLLER_WEBHOOK_ID,
        "url": sim.settings.receiptroller_url,
        "active": lock(&sim.receiptroller).active,
        "events": EVENTS,
    })
}

fn known_webhook(id: &str) -> Result<(), ApiError> {
    if id == RECEIPTROLLER_WEBHOOK_ID {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no webhook {id}")))
    }
}

async fn webhook(State(sim): State<Sim>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    known_webhook(&id)?;
    Ok(Json(webhook_body(&sim)))
}

async fn set_webhook(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    known_webhook(&id)?;
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("body is not JSON: {e}")))?;
    if let Some(active) = body.get("active") {
        let active = active
            .as_bool()
            .ok_or_else(|| ApiError::bad_request("active must be true or false"))?;
        lock(&sim.receiptroller).active = active;
        info!(active, "ReceiptRoller webhook updated through the API.");
    }
    Ok(Json(webhook_body(&sim)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_must_match_exactly() {
        assert!(bearer_matches("Bearer rr-api-token", "rr-api-token"));
        assert!(bearer_matches("bearer  rr-api-token ", "rr-api-token"));
        assert!(!bearer_matches("Bearer rr-api-token2", "rr-api-token"));
        assert!(!bearer_matches("Basic rr-api-token", "rr-api-token"));
        assert!(!bearer_matches("rr-api-token", "rr-api-token"));
    }

    #[test]
    fn the_last_retry_is_about_71_minutes_after_the_first_attempt() {
        let total: Duration = RETRY_DELAYS.iter().sum();
        assert_eq!(total, Duration::from_secs(71 * 60));
    }
}
