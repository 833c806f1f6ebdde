//! Operations endpoints: liveness, readiness and Prometheus metrics.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;

/// How long `/readyz` waits for the broker's metadata answer.
const BROKER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`: the process is up and serving HTTP.
pub async fn healthz() -> Response {
    (StatusCode::OK, Json(json!({ "status": "ok" }))).into_response()
}

/// `GET /readyz`: every dependency a delivery needs answers. A load balancer
/// should stop sending traffic while this is 503.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let pipeline = &state.pipeline;
    let (broker, registry, ledger) = tokio::join!(
        pipeline.publisher().broker_reachable(BROKER_PROBE_TIMEOUT),
        pipeline.encoder().registry_reachable(),
        pipeline.ledger().check(),
    );
    let ready = broker && registry && ledger.is_ok();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    (
        status,
        Json(json!({
            "status": word(ready),
            "broker": word(broker),
            "schema_registry": word(registry),
            "ledger": ledger.map_or_else(|e| e.to_string(), |()| "ok".to_owned()),
        })),
    )
        .into_response()
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(),
    )
        .into_response()
}
