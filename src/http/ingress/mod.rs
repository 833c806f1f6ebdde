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
mod over_share;
mod response;
mod share;
#[cfg(test)]
mod tests;
mod webhook;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::Router;
use axum::response::{IntoResponse, Response};
use axum::routing::future::RouteFuture;
use axum::routing::{get, post};
use futures::FutureExt as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tower::{Service, ServiceBuilder};

use crate::domain::event::{ProviderKind, Source};
use crate::domain::verify::Verifier;
use crate::observe::Board;
use crate::services::pipeline::Pipeline;

pub use admin::{AdminState, router as admin_router};
pub use leaving::Leaving;
pub use listen::ConnectionLimits;
pub use meters::RequestMeters;
pub use over_share::actions as over_share_actions;
pub use response::{RequestOutcome, WebhookError};
pub use share::{FairShares, ShareSettings, SourceShare};

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
    /// Its share of the deliveries in flight while the process is busy.
    pub share: SourceShare,
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
    /// Every source's share of the deliveries in flight, and the count.
    pub shares: FairShares,
    /// How long a delivery over its share that must not be refused waits
    /// for its share, from its arrival, before it is taken in anyway.
    pub share_wait: std::time::Duration,
    /// Set at the shutdown signal: `/readyz` answers 503 and every answer
    /// closes its connection while the balancer moves away.
    pub leaving: Leaving,
}

/// A request as the routers take it (hyper's are mapped to it by `listen`).
pub type HttpRequest = axum::extract::Request;

/// The routes with what every answer passes through: a service of the
/// request, cloned for each by the listener. What `Router::layer` would
/// add is applied once around the router instead, as plain
/// (unboxed) tower layers: a layer inside the router is boxed, and each
/// box cloned with every request (about twenty allocations a request for
/// the three the routes had).
pub trait Routes:
    Service<HttpRequest, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Routes for S where
    S: Service<HttpRequest, Response = Response, Error = Infallible, Future: Send + 'static>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The webhook and operations routes; `App::serve` and the handler tests
/// share them. The state is shared behind one `Arc`: axum clones it for
/// every request, and one reference count is cheaper than one per handle.
pub fn router(state: AppState) -> impl Routes {
    answered(
        ops_routes().route("/webhooks/{provider}/{source}", post(webhook::receive)),
        state,
    )
}

/// The operations endpoints alone (`/healthz`, `/readyz`, `/metrics`), for
/// `posbridge reconciler`: its probes and its scrape, and no webhook route,
/// since it takes no deliveries.
pub fn ops_router(state: AppState) -> impl Routes {
    answered(ops_routes(), state)
}

/// The operations routes both routers hold.
fn ops_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
}

/// `routes` with the JSON answers for what they do not route and the
/// state, inside the answer rules: a panic becomes a 503 with a JSON body
/// (never a connection closed without an answer), every 503 carries
/// `Retry-After`, and every answer closes its connection while leaving
/// ([`response::finish`]).
fn answered(routes: Router<Arc<AppState>>, state: AppState) -> impl Routes {
    let retry_after_secs = state.retry_after_secs;
    let leaving = state.leaving.clone();
    let router = routes
        .fallback(|| async { WebhookError::NoRoute.into_response() })
        .method_not_allowed_fallback(|| async { WebhookError::MethodNotAllowed.into_response() })
        .with_state(Arc::new(state));
    ServiceBuilder::new()
        .map_response(move |answer| response::finish(answer, retry_after_secs, &leaving))
        .map_future(|answer: RouteFuture<Infallible>| async {
            // A panic in a handler is answered, not a dropped connection.
            AssertUnwindSafe(answer)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| Ok(response::panicked(panic)))
        })
        .service(router)
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
    router: impl Routes,
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
