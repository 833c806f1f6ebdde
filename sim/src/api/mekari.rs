//! Mekari POS's API, as the simulator serves it from the truth.
//!
//! HMAC-signed requests: `Date` within 300 s of the gateway's clock, and
//! `Authorization` as [`api_authorization`] computes it over the request line
//! as received, `/mekari` prefix and raw query included. The requests and
//! answers are described in `docs/PROVIDERS.md`:
//! * `GET /mekari/orders?outlet_id=&sold_at_from=&sold_at_to=&page=&per_page=`
//! * `GET /mekari/returns`, `/refunds`, `/exchanges` with `outlet_id`, optional
//!   `order_id`, newest first by `updated_at`
//! * `GET /mekari/products` (deleted ones omitted), `GET /mekari/collections`
//! * `GET /mekari/webhooks/endpoints`, `POST …/{key}/test`, `PUT …/{key}`
//!
//! Every list draws the injected outage (`--api-fail-rate`) first.

use std::time::SystemTime;

use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post, put};
use axum::{Json, Router};
use posbridge::adapters::providers::mekari::{API_CLOCK_SKEW_SECS, api_authorization};
use posbridge::domain::event::{EntityType, ProviderKind};
use serde_json::{Value, json};
use tracing::info;

use crate::api::error::ApiError;
use crate::api::query::{self, Params};
use crate::state::{Sim, lock};
use crate::truth::Entity;
use crate::webhook_state::Endpoint;

/// The simulated endpoint's key.
const ENDPOINT_KEY: &str = "ep_sim";
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

/// One list's answer for one entity type, from the truth and the query.
type Lister = fn(&Sim, &Params, EntityType) -> Result<Json<Value>, ApiError>;

/// The list endpoints: path, the entity type listed and how.
const LISTS: [(&str, EntityType, Lister); 6] = [
    ("/mekari/orders", EntityType::Order, orders),
    ("/mekari/returns", EntityType::Return, after_sales),
    ("/mekari/refunds", EntityType::Refund, after_sales),
    ("/mekari/exchanges", EntityType::Exchange, after_sales),
    ("/mekari/products", EntityType::Product, catalogue),
    ("/mekari/collections", EntityType::Collection, catalogue),
];

/// The API routes, behind the HMAC check.
pub fn routes(sim: Sim) -> Router<Sim> {
    LISTS
        .into_iter()
        .fold(Router::new(), |router, (path, entity_type, lister)| {
            router.route(path, list_route(entity_type, lister))
        })
        .route("/mekari/webhooks/endpoints", get(endpoints))
        .route("/mekari/webhooks/endpoints/{key}/test", post(test_endpoint))
        .route("/mekari/webhooks/endpoints/{key}", put(resume_endpoint))
        .route_layer(middleware::from_fn_with_state(sim, hmac_auth))
}

/// The `GET` handler of one list: the injected outage, then `lister` for
/// `entity_type`.
fn list_route(entity_type: EntityType, lister: Lister) -> MethodRouter<Sim> {
    get(
        move |State(sim): State<Sim>, Query(params): Query<Params>| async move {
            if sim.api_should_fail() {
                return Err(ApiError::unavailable());
            }
            lister(&sim, &params, entity_type)
        },
    )
}

/// One page of entities as `{"data": [...], "meta": {...}}`.
fn list(entities: Vec<&Entity>, page: usize, per_page: usize) -> Json<Value> {
    let total = entities.len();
    let (items, total_pages) = query::page(entities, page, per_page);
    let data: Vec<&serde_json::Map<String, Value>> = items.into_iter().map(|e| &e.data).collect();
    Json(json!({
        "data": data,
        "meta": {"page": page, "per_page": per_page, "total_pages": total_pages, "total": total},
    }))
}

fn mekari_of(entity: &Entity, entity_type: EntityType) -> bool {
    entity.provider == ProviderKind::Mekari && entity.entity_type == entity_type
}

/// Orders of one outlet sold in `[sold_at_from, sold_at_to)`, oldest first.
fn orders(sim: &Sim, params: &Params, entity_type: EntityType) -> Result<Json<Value>, ApiError> {
    let outlet = query::required(params, "outlet_id")?;
    let from = query::time_param(params, "sold_at_from")?;
    let to = query::time_param(params, "sold_at_to")?;
    let (page, per_page) = query::paging(params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, entity_type) && e.outlet_id.as_deref() == Some(outlet))
        .filter(|e| query::in_window(e.business_at, from, to))
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
    let outlet = query::required(params, "outlet_id")?;
    let order = params.get("order_id").filter(|o| !o.is_empty());
    let (page, per_page) = query::paging(params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, entity_type) && e.outlet_id.as_deref() == Some(outlet))
        .filter(|e| order.is_none_or(|o| e.data.get("order_id").and_then(Value::as_str) == Some(o)))
        .collect();
    found.sort_by(|a, b| (b.updated_at, &b.id).cmp(&(a.updated_at, &a.id)));
    Ok(list(found, page, per_page))
}

/// Products or collections, by id; deleted ones are omitted.
fn catalogue(sim: &Sim, params: &Params, entity_type: EntityType) -> Result<Json<Value>, ApiError> {
    let (page, per_page) = query::paging(params, PER_PAGE.0, PER_PAGE.1)?;
    let truth = lock(&sim.truth);
    let mut found: Vec<&Entity> = truth
        .entities()
        .filter(|e| mekari_of(e, entity_type) && !e.deleted)
        .collect();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(list(found, page, per_page))
}

/// The endpoint as `GET /webhooks/endpoints` shows it.
fn endpoint_report(endpoint: &Endpoint, url: &str) -> Value {
    json!({
        "key": ENDPOINT_KEY, "url": url, "status": endpoint.status(),
        "consecutive_failures": endpoint.consecutive_failures, "events": EVENTS,
    })
}

async fn endpoints(State(sim): State<Sim>) -> Json<Value> {
    let endpoint = endpoint_report(&lock(&sim.mekari), &sim.settings.mekari_url);
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
    let endpoint = endpoint_report(&lock(&sim.mekari), &sim.settings.mekari_url);
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
        json!({"data": endpoint_report(&endpoint, &sim.settings.mekari_url)}),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
