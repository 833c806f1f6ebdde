//! The HTTP side: routes, shared state, and serving with graceful shutdown.
//!
//! No route redirects (Mekari treats any 3xx as a permanent failure), and
//! anything unrouted gets a JSON 404 (a wrong method a JSON 405). `tests.rs`
//! covers every status the ingress can answer without Kafka (all but 200
//! `published` and `dead_lettered`, which the integration tests cover).

mod admin;
mod leaving;
mod listen;
mod meters;
mod ops;
mod response;
#[cfg(test)]
mod tests;
mod webhook;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::domain::event::{ProviderKind, Source};
use crate::domain::verify::Verifier;
use crate::observe::Board;
use crate::services::pipeline::Pipeline;

pub use admin::{AdminState, router as admin_router};
pub use leaving::Leaving;
pub use listen::ConnectionLimits;
pub use meters::RequestMeters;
pub use response::{RequestOutcome, WebhookError};

/// One configured webhook, ready to verify.
#[derive(Debug, Clone)]
pub struct WebhookSource {
    /// Provider, name and account, shared with every delivery through it.
    pub source: Arc<Source>,
    /// Its signature check.
    pub verifier: Verifier,
    /// Whether it spools what Kafka cannot take in time.
    pub spools: bool,
    /// Its requests and their latency, by outcome.
    pub meters: RequestMeters,
}

/// The webhooks in use, by provider and name.
pub type SourceMap = HashMap<(ProviderKind, String), WebhookSource>;

/// What every handler needs; cheap handles only.
#[derive(Clone)]
pub struct AppState {
    /// The webhooks in use: a sources directory's reads swap the whole map,
    /// and a request keeps the one it found.
    pub sources: Arc<ArcSwap<SourceMap>>,
    /// The data line.
    pub pipeline: Pipeline,
    /// Largest body read.
    pub body_limit: usize,
    /// How long a body may take to arrive.
    pub body_read_timeout: std::time::Duration,
    /// Bytes of bodies that may be read and handled at once (one permit a byte).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    /// Connection bounds for [`serve`].
    pub connections: ConnectionLimits,
    /// `Retry-After` on 503.
    pub retry_after_secs: u64,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
    /// What the status page shows of the last hour.
    pub board: Board,
    /// Set at the shutdown signal: `/readyz` answers 503 and every answer
    /// closes its connection while the balancer moves away.
    pub leaving: Leaving,
}

/// The router; `App::serve` and the handler tests share it. The state is
/// shared behind one `Arc`: axum clones it for every request, and one
/// reference count is cheaper than one per handle.
pub fn router(state: AppState) -> Router {
    let retry_after_secs = state.retry_after_secs;
    answered(
        ops_routes().route(
            "/webhooks/{provider}/{source}",
            guarded(post(webhook::receive), retry_after_secs),
        ),
        state,
    )
}

/// The operations endpoints alone (`/healthz`, `/readyz`, `/metrics`), for
/// `posbridge reconciler`: its probes and its scrape, and no webhook route,
/// since it takes no deliveries.
pub fn ops_router(state: AppState) -> Router {
    answered(ops_routes(), state)
}

/// The operations routes both routers hold.
fn ops_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
}

/// `routes` with the JSON answers for what they do not route, every answer
/// closing its connection while leaving, and the state.
fn answered(routes: Router<Arc<AppState>>, state: AppState) -> Router {
    routes
        .fallback(|| async { WebhookError::NoRoute.into_response() })
        .method_not_allowed_fallback(|| async { WebhookError::MethodNotAllowed.into_response() })
        .layer(axum::middleware::map_response_with_state(
            state.leaving.clone(),
            leaving::close_while_leaving,
        ))
        .with_state(Arc::new(state))
}

/// The webhook route's answer rules: a panic becomes a 503 with a JSON body
/// (never a connection closed without an answer), and every 503 carries
/// `Retry-After`.
fn guarded(
    route: axum::routing::MethodRouter<Arc<AppState>>,
    retry_after_secs: u64,
) -> axum::routing::MethodRouter<Arc<AppState>> {
    route
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            response::panicked,
        ))
        .layer(axum::middleware::map_response_with_state(
            retry_after_secs,
            response::add_retry_after,
        ))
}

/// Connections the admin listener keeps open at once: a few operators'
/// browsers, not the providers' traffic.
const ADMIN_CONNECTIONS: usize = 32;

/// Serves the admin router the way [`serve`] serves the webhooks (header
/// read timeout, bounded shutdown, a connection cap), with at most
/// [`ADMIN_CONNECTIONS`] connections, so a slow or hostile client of the
/// status page cannot hold sockets the webhooks need.
///
/// # Errors
/// When the listener fails.
pub async fn serve_admin(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = ConnectionLimits {
        max_connections: ADMIN_CONNECTIONS.min(limits.max_connections),
        ..limits
    };
    listen::serve(listener, router, limits, shutdown).await
}

/// Serves until `shutdown` resolves, then stops accepting and lets open
/// connections finish their requests for at most `shutdown_timeout_ms`.
///
/// # Errors
/// When the listener fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.connections;
    listen::serve(listener, router(state), limits, shutdown).await
}

/// Serves [`ops_router`] under the same rules as [`serve`], until
/// `shutdown` resolves.
///
/// # Errors
/// When the listener fails.
pub async fn serve_ops(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.connections;
    listen::serve(listener, ops_router(state), limits, shutdown).await
}
