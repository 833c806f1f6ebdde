//! ReceiptRoller's API, as the simulator serves it from the truth.
//!
//! A bearer token on every request (`Authorization: Bearer <token>`, else 401
//! with `WWW-Authenticate: Bearer`); the requests and answers are described
//! in `docs/PROVIDERS.md`:
//! * `GET /receiptroller/transactions?from=&to=&page=&per_page=`: sales whose
//!   `transaction_at` is in `[from, to)`, oldest first.
//! * `GET /receiptroller/webhooks/{webhook_id}`, `PATCH` with `{"active": true}`.
//!
//! `--api-fault` makes the list pages or the `PATCH` misbehave ([`ApiFault`]).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use futures::StreamExt as _;
use posbridge::domain::event::{EntityType, ProviderKind};
use serde_json::{Value, json};
use tracing::info;

use crate::api::error::ApiError;
use crate::api::query::{self, Params};
use crate::fault::ApiFault;
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
/// The page count an endless list claims.
const ENDLESS_PAGES: u64 = 1_000_000_000;
/// How many times the items asked for an oversized page holds.
const OVERSIZED_PAGE_FACTOR: usize = 100;
/// How large an oversized body is.
const OVERSIZED_BODY_BYTES: usize = 200_000_000;
/// The pause between two bytes of a dripping body.
const DRIP_EVERY: Duration = Duration::from_millis(100);

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
) -> Result<Response, ApiError> {
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
    let fault = sim.settings.api_fault;
    // An endless list answers its first page whatever page is asked.
    let asked = if fault == Some(ApiFault::EndlessPages) {
        1
    } else {
        page
    };
    let (items, total_pages) = query::page(sales, asked, per_page);
    let mut items: Vec<Value> = items.into_iter().map(|(_, _, data)| data).collect();
    let mut answer = json!({"items": items, "page": page, "total_pages": total_pages});
    match fault {
        Some(ApiFault::EndlessPages) => answer["total_pages"] = json!(ENDLESS_PAGES),
        Some(ApiFault::OversizedPage) => {
            let first = items.clone();
            while !first.is_empty() && items.len() < per_page * OVERSIZED_PAGE_FACTOR {
                items.extend(first.iter().cloned());
            }
            answer["items"] = json!(items);
        }
        Some(ApiFault::OversizedBody) => return Ok(padded(&answer, OVERSIZED_BODY_BYTES)),
        Some(ApiFault::CutShort) => return Ok(cut_short(answer.to_string().into_bytes())),
        Some(ApiFault::Drip) => return Ok(drip(answer.to_string().into_bytes())),
        Some(ApiFault::ResumeRedirect | ApiFault::ResumeUnconfirmed) | None => {}
    }
    Ok(Json(answer).into_response())
}

/// `answer` with a `padding` string making it about `bytes` long, streamed
/// a chunk at a time so the simulator never holds it whole.
fn padded(answer: &Value, bytes: usize) -> Response {
    const CHUNK: usize = 64 * 1024;
    let text = answer.to_string();
    let open = text.strip_suffix('}').unwrap_or(&text);
    let head = Bytes::from(format!("{open},\"padding\":\""));
    let chunk = Bytes::from(vec![b'x'; CHUNK]);
    let body = futures::stream::iter(
        std::iter::once(head)
            .chain(std::iter::repeat_n(chunk, bytes / CHUNK))
            .chain(std::iter::once(Bytes::from_static(b"\"}")))
            .map(Ok::<_, Infallible>),
    );
    json_response(Body::from_stream(body))
}

/// The first half of `body` under its full `Content-Length`, then the
/// connection closes.
fn cut_short(body: Vec<u8>) -> Response {
    let length = body.len();
    let half = Bytes::from(body).slice(..length / 2);
    // The failure comes after a pause, so the head and the half go out
    // first, as from a connection that dies mid-answer.
    let stream = futures::stream::iter([Ok(half)]).chain(futures::stream::once(async {
        tokio::task::yield_now().await;
        Err(std::io::Error::other("simulated connection cut"))
    }));
    let mut response = json_response(Body::from_stream(stream));
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    response
}

/// `body` one byte every [`DRIP_EVERY`].
fn drip(body: Vec<u8>) -> Response {
    let stream = futures::stream::iter(body).then(|byte| async move {
        tokio::time::sleep(DRIP_EVERY).await;
        Ok::<_, Infallible>(Bytes::from(vec![byte]))
    });
    json_response(Body::from_stream(stream))
}

fn json_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
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
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    known_webhook(&id)?;
    let body: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("body is not JSON: {e}")))?;
    let active = body
        .get("active")
        .map(|active| {
            active
                .as_bool()
                .ok_or_else(|| ApiError::bad_request("active must be true or false"))
        })
        .transpose()?;
    match sim.settings.api_fault {
        Some(ApiFault::ResumeRedirect) => return Ok(elsewhere(&headers, &id)),
        Some(ApiFault::ResumeUnconfirmed) => {
            let mut answer = webhook_body(&sim);
            if let Some(active) = active {
                answer["active"] = json!(active);
            }
            info!("ReceiptRoller webhook update answered, but not made (--api-fault).");
            return Ok(Json(answer).into_response());
        }
        _ => {}
    }
    if let Some(active) = active {
        lock(&sim.receiptroller).active = active;
        info!(active, "ReceiptRoller webhook updated through the API.");
    }
    Ok(Json(webhook_body(&sim)).into_response())
}

/// 307 to this API under another host name (`localhost` for `127.0.0.1`),
/// at `/sim/elsewhere/…`, which answers anything 200 and changes nothing.
fn elsewhere(headers: &HeaderMap, id: &str) -> Response {
    let port = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .and_then(|host| host.rsplit_once(':'))
        .map_or("80", |(_, port)| port)
        .to_owned();
    let location = format!("http://localhost:{port}/sim/elsewhere/receiptroller/webhooks/{id}");
    (
        StatusCode::TEMPORARY_REDIRECT,
        [(header::LOCATION, location)],
    )
        .into_response()
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
