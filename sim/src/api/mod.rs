//! The simulator's HTTP side: both providers' APIs and its own control and
//! report endpoints, on one listener.
//!
//! ReceiptRoller's API lives under `/receiptroller` ([`receiptroller`]),
//! Mekari's under `/mekari` ([`mekari`]), each behind its own auth check;
//! [`error`] and [`query`] hold what both share. `/sim` is the simulator's
//! own:
//!
//! * `GET /sim/status`: sending done?, delivery counters, webhook states.
//! * `GET /sim/truth`: every entity's current state, keyed as posbridge keys it.
//! * `GET /sim/events`: every event with its delivery's fate.
//! * `POST /sim/restart-receiptroller`: a ReceiptRoller server restart, which
//!   drops pending retries without switching the webhook off.
//! * `/sim/elsewhere/…`: the other host `--api-fault resume-redirect` sends
//!   a webhook update to; answers anything 200, changes nothing, and counts
//!   the requests (`elsewhere_requests` in the status).

pub mod error;
pub mod mekari;
pub mod query;
pub mod receiptroller;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::state::{Sim, lock};

/// Every route the simulator serves.
pub fn router(sim: Sim) -> Router {
    Router::new()
        .route("/sim/status", get(status))
        .route("/sim/truth", get(truth))
        .route("/sim/events", get(events))
        .route("/sim/restart-receiptroller", post(restart_receiptroller))
        .route("/sim/elsewhere/{*rest}", any(elsewhere))
        .merge(receiptroller::routes(sim.clone()))
        .merge(mekari::routes(sim.clone()))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(sim)
}

async fn status(State(sim): State<Sim>) -> Json<Value> {
    Json(sim.status())
}

async fn truth(State(sim): State<Sim>) -> Json<Value> {
    Json(lock(&sim.truth).report())
}

async fn events(State(sim): State<Sim>) -> Json<Value> {
    Json(json!({"events": *lock(&sim.events)}))
}

async fn elsewhere(State(sim): State<Sim>) -> Json<Value> {
    sim.elsewhere_requests
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Json(json!({"active": true}))
}

async fn restart_receiptroller(State(sim): State<Sim>) -> Json<Value> {
    let dropped = lock(&sim.receiptroller).restart();
    Json(json!({"restarted": true, "pending_retries_dropped": dropped}))
}
