//! ReceiptRoller's API, as the simulator serves it from the truth.
//!
//! A bearer token on every request (`Authorization: Bearer <token>`, else 401
//! with `WWW-Authenticate: Bearer`); the requests and answers are described
//! in `docs/PROVIDERS.md`:
//! * `GET /receiptroller/transactions?from=&to=&page=&per_page=`: sales whose
//!   `transaction_at` is in `[from, to)`, oldest first.
//! * `GET /receiptroller/webhooks/{webhook_id}`, `PATCH` with `{"active": true}`.

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use posbridge::event::{EntityType, ProviderKind};
use serde_json::{Value, json};
use tracing::info;

use crate::api::error::ApiError;
use crate::api::query::{self, Params};
use crate::state::{Sim, lock};
use crate::truth::RECEIPTROLLER_WEBHOOK_ID;

/// The events the simulated webhook subscribes to.
const EVENTS: [&str; 4] = [
    "sale.created",
    "sale.cancelled",
    "order.created",
    "order.updated",
];
/// Default and largest `per_page` of the Transactions API.
const PER_PAGE: (usize, usize) = (100, 500);

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
    let from = query::time_param(&params, "from")?
        .ok_or_else(|| ApiError::bad_request("from is required"))?;
    let to =
        query::time_param(&params, "to")?.ok_or_else(|| ApiError::bad_request("to is required"))?;
    let (page, per_page) = query::paging(&params, PER_PAGE.0, PER_PAGE.1)?;
    let mut sales: Vec<_> = lock(&sim.truth)
        .entities()
        .filter(|e| e.provider == ProviderKind::ReceiptRoller && e.entity_type == EntityType::Sale)
        .filter(|e| query::in_window(e.business_at, Some(from), Some(to)))
        .map(|e| (e.business_at, e.id.clone(), Value::Object(e.data.clone())))
        .collect();
    sales.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let (items, total_pages) = query::page(sales, page, per_page);
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
}
