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

/// `GET /readyz`: a delivery can be accepted now. A load balancer should
/// stop sending traffic while this is 503. With Kafka down but a spool with
/// room, posbridge stays ready: sources that spool still accept (those that
/// do not answer 503 until Kafka is back), and taking the pod out of service
/// would fail every delivery instead.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let pipeline = &state.pipeline;
    let (broker, registry, ledger) = tokio::join!(
        pipeline.publisher().broker_reachable(BROKER_PROBE_TIMEOUT),
        pipeline.encoder().registry_reachable(),
        pipeline.ledger().check(),
    );
    let spool = pipeline.spool().map(crate::spool::Spool::stats);
    let spool_takes_it = spool.is_some_and(|stats| stats.has_room);
    let ready = (broker || spool_takes_it) && registry && ledger.is_ok();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    let spool = match spool {
        None => json!("disabled"),
        Some(stats) => json!({
            "entries": stats.entries,
            "bytes": stats.bytes,
            "has_room": stats.has_room,
            "draining": broker && stats.entries > 0,
        }),
    };
    (
        status,
        Json(json!({
            "status": word(ready),
            "encoding": pipeline.encoder().name(),
            "broker": word(broker),
            "schema_registry": word(registry),
            "ledger": ledger.map_or_else(|e| e.to_string(), |()| "ok".to_owned()),
            "spool": spool,
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
