//! The admin listener's routes: `/status` (the operator's page) and
//! `/status.json` (the same data), behind a bearer token or basic auth when
//! one is configured. On a listener of its own (`[admin] listen`), so the
//! page can stay on a private network while the webhooks face the providers.

use axum::Json;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::ops::Readiness;
use crate::config::AdminConfig;
use crate::pipeline::Pipeline;
use crate::status::{Board, Health, Status};

/// What the admin routes read.
#[derive(Clone)]
pub struct AdminState {
    /// Broker, ledger, registry and spool state.
    pub pipeline: Pipeline,
    /// The last hour of deliveries, checks and runs.
    pub board: Board,
}

/// What a request must carry, as digests (compared whole, never byte by
/// byte on the secret itself).
#[derive(Clone, Default)]
struct Credentials {
    /// SHA-256 of `Bearer <token>`.
    bearer: Option<[u8; 32]>,
    /// SHA-256 of `Basic <base64(user:password)>`.
    basic: Option<[u8; 32]>,
}

impl Credentials {
    fn from_config(config: &AdminConfig) -> Credentials {
        let digest = |text: String| -> [u8; 32] { Sha256::digest(text.as_bytes()).into() };
        Credentials {
            bearer: config
                .token
                .as_ref()
                .map(|t| digest(format!("Bearer {}", t.expose()))),
            basic: match (&config.username, &config.password) {
                (Some(user), Some(password)) => Some(digest(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("{user}:{}", password.expose()))
                ))),
                _ => None,
            },
        }
    }

    fn required(&self) -> bool {
        self.bearer.is_some() || self.basic.is_some()
    }

    fn admits(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(given) = authorization.map(|v| Sha256::digest(v.as_bytes())) else {
            return false;
        };
        let given: [u8; 32] = given.into();
        [self.bearer, self.basic]
            .into_iter()
            .flatten()
            .any(|expected| expected == given)
    }
}

/// The admin router.
pub fn router(state: AdminState, config: &AdminConfig) -> Router {
    let credentials = Credentials::from_config(config);
    Router::new()
        .route("/status", get(status_page))
        .route("/status.json", get(status_json))
        .layer(middleware::from_fn_with_state(credentials, authorize))
        .with_state(state)
}

async fn authorize(
    State(credentials): State<Credentials>,
    request: Request,
    next: Next,
) -> Response {
    if !credentials.required() || credentials.admits(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    let challenge = if credentials.basic.is_some() {
        "Basic realm=\"posbridge\""
    } else {
        "Bearer realm=\"posbridge\""
    };
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
        Json(json!({"error": "the status page needs the admin credentials"})),
    )
        .into_response()
}

/// The page forbids itself scripts and outside resources: whatever a
/// provider sent cannot make it load or run anything.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'";

async fn status_page(State(state): State<AdminState>) -> Response {
    (
        [(header::CONTENT_SECURITY_POLICY, PAGE_POLICY)],
        Html(crate::status::page::render(&gather(&state).await)),
    )
        .into_response()
}

async fn status_json(State(state): State<AdminState>) -> Response {
    Json(gather(&state).await).into_response()
}

/// The page's data: the board, and the shared parts' state as `/readyz`
/// sees it, but for the broker: its state as the last send or probe found
/// it, not asked again.
async fn gather(state: &AdminState) -> Status {
    let pipeline = &state.pipeline;
    let readiness = Readiness::of(pipeline, false).await;
    let now = OffsetDateTime::now_utc();
    Status {
        generated_at: now,
        health: Health {
            broker: if readiness.broker {
                "ok"
            } else {
                "unavailable"
            },
            ledger: readiness.ledger_text(),
            schema_registry: match (pipeline.encoder().uses_registry(), readiness.registry) {
                (false, _) => "not used",
                (true, true) => "ok",
                (true, false) => "unavailable",
            },
            spool: readiness.spool,
            dead_letters_since_start: pipeline.dead_letters_written(),
            failing_topics: pipeline.publisher().health().failing_topics(),
        },
        sources: state.board.snapshot(now),
    }
}
