//! Mekari POS as the simulator plays it: delivery rules and API.
//!
//! Delivery (mekari-pos-delivery.md): eight attempts, 30 s, 2 min, 10 min,
//! 30 min, 1 h, 3 h and 6 h after the previous failure. No answer (connection
//! error, 10 s timeout), 408, 429 and 5xx are retried, and a `Retry-After` in
//! seconds can lengthen the next wait up to one hour; any 3xx or other 4xx
//! fails for good at once. Ten deliveries in a row that fail for good pause
//! the endpoint: nothing is sent while paused and waiting retries are
//! cancelled; a 2xx resets the count; `PUT` on the endpoint resumes it.
//!
//! API (payloads.md), HMAC-signed requests (`Date` within 300 s, and
//! `Authorization` as [`api_authorization`] computes it over the request
//! line as received, `/mekari` prefix and raw query included):
//! * `GET /mekari/orders?outlet_id=&sold_at_from=&sold_at_to=&page=&per_page=`
//! * `GET /mekari/returns`, `/refunds`, `/exchanges` with `outlet_id`, optional
//!   `order_id`, newest first by `updated_at`
//! * `GET /mekari/products` (deleted ones omitted), `GET /mekari/collections`
//! * `GET /mekari/webhooks/endpoints`, `POST …/{key}/test`, `PUT …/{key}`

use std::time::{Duration, SystemTime};

use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use posbridge::event::{EntityType, ProviderKind};
use posbridge::providers::{API_CLOCK_SKEW_SECS, api_authorization};
use serde_json::{Value, json};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::api::{self, ApiError, Params};
use crate::send::{self, Answer, Outgoing};
use crate::state::{Fate, Sim, lock};
use crate::truth::Entity;

/// Attempts per delivery.
pub const ATTEMPTS: usize = 8;
/// Wait after each failed attempt, before the next (documented time).
pub const RETRY_DELAYS: [Duration; ATTEMPTS - 1] = [
    Duration::from_secs(30),
    Duration::from_secs(2 * 60),
    Duration::from_secs(10 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(60 * 60),
    Duration::from_secs(3 * 60 * 60),
    Duration::from_secs(6 * 60 * 60),
];
/// `Retry-After` lengthens a wait to at most this.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60 * 60);
/// Deliveries failing for good in a row that pause the endpoint.
pub const PAUSE_AFTER: u32 = 10;
/// The simulated endpoint's key.
pub const ENDPOINT_KEY: &str = "ep_sim";
/// The event families the endpoint subscribes to.
const EVENTS: [&str; 6] = [
    "order.*",
    "return.*",
    "refund.*",
    "exchange.*",
    "product.*",
    "collection.*",
];
/// Default and largest `per_page` of the list endpoints.
const PER_PAGE: (usize, usize) = (50, 200);

/// The simulated endpoint's state.
#[derive(Debug, Default)]
pub struct Endpoint {
    /// Paused after ten deliveries in a row failed for good.
    pub paused: bool,
    /// Deliveries in a row that failed for good; a 2xx resets it.
    pub consecutive_failures: u32,
    /// Cancelled when the endpoint pauses: waiting retries stop.
    cancel: CancellationToken,
}

impl Endpoint {
    /// `active` or `paused`, as `GET /webhooks/endpoints` shows it.
    pub fn status(&self) -> &'static str {
        if self.paused { "paused" } else { "active" }
    }

    /// A 2xx: the count goes back to zero.
    fn delivered(&mut self) {
        self.consecutive_failures = 0;
    }

    /// A delivery failed for good; pauses at the tenth in a row. Returns
    /// whether this one paused the endpoint.
    fn failed_for_good(&mut self) -> bool {
        self.consecutive_failures += 1;
        if self.paused || self.consecutive_failures < PAUSE_AFTER {
            return false;
        }
        self.paused = true;
        self.cancel.cancel();
        self.cancel = CancellationToken::new();
        true
    }

    /// The documented resume (`PUT`): active again, count back to zero.
    fn resume(&mut self) {
        self.paused = false;
        self.consecutive_failures = 0;
    }

    fn report(&self, url: &str) -> Value {
        json!({
            "key": ENDPOINT_KEY, "url": url, "status": self.status(),
            "consecutive_failures": self.consecutive_failures, "events": EVENTS,
        })
    }
}

/// What Mekari makes of one attempt's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx.
    Delivered,
    /// No answer, 408, 429 or 5xx: try again, waiting at least `retry_after` s.
    Retry {
        /// The answer's `Retry-After`, in seconds.
        retry_after: Option<u64>,
    },
    /// Any 3xx or other 4xx (or 1xx): no more attempts.
    FailForGood,
}

/// Sorts an answer by Mekari's table.
pub fn verdict(answer: Answer) -> Verdict {
    match answer {
        Answer::NoAnswer => Verdict::Retry { retry_after: None },
        Answer::Status { code, .. } if (200..300).contains(&code) => Verdict::Delivered,
        Answer::Status {
            code: 408 | 429 | 500..=599,
            retry_after,
        } => Verdict::Retry { retry_after },
        Answer::Status { .. } => Verdict::FailForGood,
    }
}

/// The documented wait before retry number `retry` (0 = the second
/// attempt): the table's, lengthened by `Retry-After` up to one hour.
pub fn wait_before(retry: usize, retry_after: Option<u64>) -> Duration {
    let table = RETRY_DELAYS[retry.min(RETRY_DELAYS.len() - 1)];
    match retry_after {
        Some(secs) => table.max(Duration::from_secs(secs).min(RETRY_AFTER_CAP)),
        None => table,
    }
}

/// Delivers one event by Mekari's rules.
pub async fn deliver(sim: &Sim, out: &Outgoing) {
    let cancel = lock(&sim.mekari).cancel.clone();
    let mut retry_after = None;
    for attempt in 1..=ATTEMPTS {
        if attempt > 1 {
            let wait = sim
                .settings
                .scale
                .real(wait_before(attempt - 2, retry_after));
            tokio::select! {
                () = sleep(wait) => {}
                () = cancel.cancelled() => {}
            }
        }
        if cancel.is_cancelled() {
            info!(delivery_id = %out.delivery_id, "Retry cancelled: the endpoint is paused.");
            sim.record(out.index, |r| r.fate = Fate::Abandoned);
            return;
        }
        let answer = send::attempt(sim, out).await;
        match verdict(answer) {
            Verdict::Delivered => {
                lock(&sim.mekari).delivered();
                sim.record(out.index, |r| r.fate = Fate::Delivered);
                return;
            }
            Verdict::Retry { retry_after: next } => {
                info!(provider = "mekari", delivery_id = %out.delivery_id, attempt,
                      status = answer.code(), retry_after = next, "Attempt failed; will retry.");
                retry_after = next;
            }
            Verdict::FailForGood => {
                info!(provider = "mekari", delivery_id = %out.delivery_id, attempt,
                      status = answer.code(), "Attempt failed for good.");
                break;
            }
        }
    }
    sim.record(out.index, |r| r.fate = Fate::Failed);
    let mut endpoint = lock(&sim.mekari);
    if endpoint.failed_for_good() {
        error!(
            consecutive_failures = endpoint.consecutive_failures,
            "Ten deliveries in a row failed for good: the Mekari endpoint is paused."
        );
    }
}

/// Why a Mekari API request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Date` header.
    #[error("missing Date header")]
    MissingDate,
    /// No `Authorization` header.
    #[error("missing Authorization header")]
    MissingAuthorization,
    /// `Authorization` is not what the client secret gives for this request.
    #[error("signature mismatch")]
    SignatureMismatch {
        /// The string the server signed, to compare with the client's.
        signing_string: String,
    },
    /// `Date` is not an RFC 7231 date.
    #[error("Date header is not an RFC 7231 date")]
    BadDate,
    /// `Date` is too far from the server's clock.
    #[error("clock skew: Date is {secs} s from the server clock (limit {API_CLOCK_SKEW_SECS} s)")]
    ClockSkew {
        /// The distance, in seconds.
        secs: u64,
    },
}

/// Checks one request's HMAC authentication: the signature first (so a
/// wrong secret is named as such), then the clock.
///
/// # Errors
/// The first check that failed.
pub fn check_auth(
    client_id: &str,
    client_secret: &str,
    method: &str,
    path_and_query: &str,
    date: Option<&str>,
    authorization: Option<&str>,
    now: SystemTime,
) -> Result<(), AuthError> {
    let date = date.ok_or(AuthError::MissingDate)?;
    let authorization = authorization.ok_or(AuthError::MissingAuthorization)?;
    let expected = api_authorization(client_id, client_secret, date, method, path_and_query);
    if authorization.trim() != expected {
        return Err(AuthError::SignatureMismatch {
            signing_string: format!("date: {date}\n{method} {path_and_query} HTTP/1.1"),
        });
    }
    let sent = httpdate::parse_http_date(date).map_err(|_| AuthError::BadDate)?;
    let skew = match now.duration_since(sent) {
        Ok(behind) => behind,
        Err(ahead) => ahead.duration(),
    };
    if skew.as_secs() > API_CLOCK_SKEW_SECS.unsigned_abs() {
        return Err(AuthError::ClockSkew {
            secs: skew.as_secs(),
        });
    }
    Ok(())
}

/// The gateway's clock: the real one moved by the configured offset.
fn sim_clock(offset_secs: i64) -> SystemTime {
    let offset = std::time::Duration::from_secs(offset_secs.unsigned_abs());
    if offset_secs >= 0 {
        SystemTime::now() + offset
    } else {
        SystemTime::now() - offset
    }
}

async fn hmac_auth(
    State(sim): State<Sim>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // Owned copies: a borrow of the request must not live across `.await`
    // (the body is not `Sync`).
    let header = |request: &Request, name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (date, authorization) = (header(&request, "date"), header(&request, "authorization"));
    let path_and_query = request.uri().path_and_query().map_or_else(
        || request.uri().path().to_owned(),
        |pq| pq.as_str().to_owned(),
    );
    let checked = check_auth(
        &sim.settings.mekari_client_id,
        &sim.settings.mekari_client_secret,
        request.method().as_str(),
        &path_and_query,
        date.as_deref(),
        authorization.as_deref(),
        sim_clock(sim.settings.api_clock_offset_secs),
    );
    match checked {
        Ok(()) => Ok(next.run(request).await),
        Err(error) => {
            info!(%error, path = %path_and_query, "Mekari API request refused.");
            let refusal = ApiError::unauthorized(error.to_string());
            Err(match error {
                AuthError::SignatureMismatch { signing_string } => {
                    refusal.with_extra(json!({"expected_signing_string": signing_string}))
                }
                _ => refusal,
            })
        }
    }
}

/// The API routes, behind the HMAC check.
pub fn routes(sim: Sim) -> Router<Sim> {
    Router::new()
        .route("/mekari/orders", get(orders))
        .route("/mekari/returns", get(returns))
        .route("/mekari/refunds", get(refunds))
        .route("/mekari/exchanges", get(exchanges))
        .route("/mekari/products", get(products))
        .route("/mekari/collections", get(collections))
        .route("/mekari/webhooks/endpoints", get(endpoints))
        .route("/mekari/webhooks/endpoints/{key}/test", post(test_endpoint))
        .route(
            "/mekari/webhooks/endpoints/{key}",
            axum::routing::put(resume_endpoint),
        )
        .route_layer(middleware::from_fn_with_state(sim, hmac_auth))
}

/// One page of entities as `{"data": [...], "meta": {...}}`.
fn list(entities: Vec<&Entity>, page: usize, per_page: usize) -> Json<Value> {
    let total = entities.len();
    let (items, total_pages) = api::page(entities, page, per_page);
    let data: Vec<&serde_json::Map<String, Value>> = items.into_iter().map(|e| &e.data).collect();
    Json(json!({
        "data": data,
        "meta": {"page": page, "per_page": per_page, "total_pages": total_pages, "total": total},
    }))
}

fn mekari_of(entity: &Entity, entity_type: EntityType) -> bool {
    entity.provider == ProviderKind::Mekari && entity.entity_type == entity_type
}

async fn orders(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    if sim.api_should_fail() {
        return Err(ApiError::unavailable());
    }
    let outlet = api::required(&params, "outlet_id")?;
    let from = api::time_param(&params, "sold_at_from")?;
    let to = api::time_param(&params, "sold_at_to")?;
    let (page, per_page) = api::paging(&params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, EntityType::Order) && e.outlet_id.as_deref() == Some(outlet))
        .filter(|e| api::in_window(e.business_at, from, to))
        .collect();
    found.sort_by(|a, b| (a.business_at, &a.id).cmp(&(b.business_at, &b.id)));
    Ok(list(found, page, per_page))
}

/// Returns, refunds or exchanges of one outlet, newest first.
fn after_sales(
    sim: &Sim,
    params: &Params,
    entity_type: EntityType,
) -> Result<Json<Value>, ApiError> {
    if sim.api_should_fail() {
        return Err(ApiError::unavailable());
    }
    let outlet = api::required(params, "outlet_id")?;
    let order = params.get("order_id").filter(|o| !o.is_empty());
    let (page, per_page) = api::paging(params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, entity_type) && e.outlet_id.as_deref() == Some(outlet))
        .filter(|e| order.is_none_or(|o| e.data.get("order_id").and_then(Value::as_str) == Some(o)))
        .collect();
    found.sort_by(|a, b| (b.updated_at, &b.id).cmp(&(a.updated_at, &a.id)));
    Ok(list(found, page, per_page))
}

async fn returns(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    after_sales(&sim, &params, EntityType::Return)
}

async fn refunds(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    after_sales(&sim, &params, EntityType::Refund)
}

async fn exchanges(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    after_sales(&sim, &params, EntityType::Exchange)
}

/// Products or collections, by id; deleted ones are omitted.
fn catalogue(sim: &Sim, params: &Params, entity_type: EntityType) -> Result<Json<Value>, ApiError> {
    if sim.api_should_fail() {
        return Err(ApiError::unavailable());
    }
    let (page, per_page) = api::paging(params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, entity_type) && !e.deleted)
        .collect();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(list(found, page, per_page))
}

async fn products(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    catalogue(&sim, &params, EntityType::Product)
}

async fn collections(
    State(sim): State<Sim>,
    Query(params): Query<Params>,
) -> Result<Json<Value>, ApiError> {
    catalogue(&sim, &params, EntityType::Collection)
}

async fn endpoints(State(sim): State<Sim>) -> Json<Value> {
    let endpoint = lock(&sim.mekari).report(&sim.settings.mekari_url);
    Json(json!({"data": [endpoint]}))
}

fn known_endpoint(key: &str) -> Result<(), ApiError> {
    if key == ENDPOINT_KEY {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no webhook endpoint {key}")))
    }
}

/// `POST /webhooks/endpoints/{key}/test`: answers 200 and does not resume.
/// (The simulator sends no test event: posbridge would dead-letter it.)
async fn test_endpoint(
    State(sim): State<Sim>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    known_endpoint(&key)?;
    let endpoint = lock(&sim.mekari).report(&sim.settings.mekari_url);
    Ok(Json(json!({"data": endpoint, "test": "ok"})))
}

/// `PUT /webhooks/endpoints/{key}`: the documented way to resume. The body
/// (the endpoint's settings) is accepted as it comes.
async fn resume_endpoint(
    State(sim): State<Sim>,
    Path(key): Path<String>,
) -> Result<Json<Value>, ApiError> {
    known_endpoint(&key)?;
    let mut endpoint = lock(&sim.mekari);
    if endpoint.paused {
        info!("Mekari endpoint resumed through the API.");
    }
    endpoint.resume();
    Ok(Json(
        json!({"data": endpoint.report(&sim.settings.mekari_url)}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u64>) -> Answer {
        Answer::Status { code, retry_after }
    }

    #[test]
    fn answers_are_sorted_as_the_table_says() {
        assert_eq!(verdict(status(204, None)), Verdict::Delivered);
        assert_eq!(
            verdict(Answer::NoAnswer),
            Verdict::Retry { retry_after: None }
        );
        for code in [408, 429, 500, 503] {
            assert_eq!(
                verdict(status(code, Some(7))),
                Verdict::Retry {
                    retry_after: Some(7)
                }
            );
        }
        for code in [301, 302, 400, 401, 404, 413] {
            assert_eq!(
                verdict(status(code, Some(7))),
                Verdict::FailForGood,
                "{code}"
            );
        }
    }

    #[test]
    fn retry_after_only_lengthens_and_at_most_to_an_hour() {
        assert_eq!(wait_before(0, None), Duration::from_secs(30));
        assert_eq!(wait_before(0, Some(10)), Duration::from_secs(30));
        assert_eq!(wait_before(0, Some(120)), Duration::from_secs(120));
        assert_eq!(wait_before(0, Some(99_999)), Duration::from_secs(3600));
        assert_eq!(wait_before(6, Some(99_999)), Duration::from_secs(6 * 3600));
    }

    #[test]
    fn the_whole_schedule_is_about_eleven_hours() {
        // 10 h 42 min 30 s of waiting; "about 11 hours" with the answer timeouts
        // and the up-to-a-minute lateness the document allows.
        let total: Duration = RETRY_DELAYS.iter().sum();
        assert_eq!(total, Duration::from_secs(38_550));
    }

    #[test]
    fn ten_permanent_failures_in_a_row_pause_and_a_success_resets() {
        let mut endpoint = Endpoint::default();
        for _ in 0..9 {
            assert!(!endpoint.failed_for_good());
        }
        endpoint.delivered();
        for _ in 0..9 {
            assert!(!endpoint.failed_for_good());
        }
        let token = endpoint.cancel.clone();
        assert!(endpoint.failed_for_good());
        assert_eq!(endpoint.status(), "paused");
        assert!(token.is_cancelled());
        endpoint.resume();
        assert_eq!(
            (endpoint.status(), endpoint.consecutive_failures),
            ("active", 0)
        );
    }

    const DATE: &str = "Mon, 30 Nov 2026 02:34:32 GMT";
    const PATH: &str = "/mekari/orders?outlet_id=OUT-9&page=1";

    fn at(date: &str) -> SystemTime {
        httpdate::parse_http_date(date).unwrap()
    }

    fn check(secret: &str, date: &str, now: SystemTime) -> Result<(), AuthError> {
        let authorization = api_authorization("sim-client", secret, date, "GET", PATH);
        check_auth(
            "sim-client",
            "sim-client-secret",
            "GET",
            PATH,
            Some(date),
            Some(&authorization),
            now,
        )
    }

    #[test]
    fn signed_requests_pass_and_wrong_secrets_or_clocks_are_named() {
        assert_eq!(check("sim-client-secret", DATE, at(DATE)), Ok(()));
        let near = at(DATE) + Duration::from_secs(300);
        assert_eq!(check("sim-client-secret", DATE, near), Ok(()));
        assert!(matches!(
            check("other-secret", DATE, at(DATE)),
            Err(AuthError::SignatureMismatch { .. })
        ));
        let far = at(DATE) + Duration::from_secs(301);
        assert_eq!(
            check("sim-client-secret", DATE, far),
            Err(AuthError::ClockSkew { secs: 301 })
        );
        assert!(
            check("sim-client-secret", DATE, far)
                .unwrap_err()
                .to_string()
                .starts_with("clock skew")
        );
        let early = at(DATE) - Duration::from_secs(301);
        assert!(matches!(
            check("sim-client-secret", DATE, early),
            Err(AuthError::ClockSkew { .. })
        ));
        assert_eq!(
            check_auth("c", "s", "GET", PATH, None, Some("x"), at(DATE)),
            Err(AuthError::MissingDate)
        );
    }

    #[test]
    fn the_signature_covers_the_query() {
        let authorization = api_authorization("sim-client", "sim-client-secret", DATE, "GET", PATH);
        let other = "/mekari/orders?outlet_id=OUT-1&page=1";
        assert!(matches!(
            check_auth(
                "sim-client",
                "sim-client-secret",
                "GET",
                other,
                Some(DATE),
                Some(&authorization),
                at(DATE)
            ),
            Err(AuthError::SignatureMismatch { .. })
        ));
    }
}
