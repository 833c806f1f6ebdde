//! The one place where errors become HTTP answers.
//!
//! Status codes are chosen for what they make each provider do
//! (`docs/PROVIDERS.md` has the table):
//! * 2xx: delivered, no retry (also duplicates, stale events, dead letters).
//! * 503 + `Retry-After`: retried by both; the only way to ask for a retry
//!   (Mekari never retries other 4xx, and never follows 3xx).
//! * 429 + `Retry-After`: a source over its fair share while the process
//!   is busy, answered so only to a provider that honours `Retry-After`
//!   (Mekari retries a 429 like a 5xx, waiting at least that long).
//! * 401 / 400 / 404 / 405 / 413: the request is wrong and retrying it
//!   unchanged cannot help. Mekari gives up on that delivery; ReceiptRoller
//!   retries it and switches the webhook off after four failures, which is
//!   why a refused signature is logged at ERROR and counted.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::{debug, error};

use super::Leaving;
use super::share::ShareBound;
use crate::domain::verify::VerifyError;
use crate::services::pipeline::{Outcome, PipelineError};

/// Why a webhook request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Nothing is routed at this path.
    #[error("no such route")]
    NoRoute,
    /// The path exists but not for this method (webhooks are POST only).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// An admin request whose body or query does not say what it asks.
    #[error("{0}")]
    BadAdminRequest(String),
    /// An admin route with nothing to show yet.
    #[error("{0}")]
    NothingYet(&'static str),
    /// A rederive run was asked while one runs.
    #[error(transparent)]
    RunInProgress(#[from] crate::services::rederive::Busy),
    /// A lookup could not read the topics or the ledger.
    #[error(transparent)]
    Lookup(#[from] crate::services::lookup::LookupError),
    /// The path names a provider posbridge does not serve.
    #[error("unknown provider `{0}`")]
    UnknownProvider(String),
    /// No source of that name is configured for the provider.
    #[error("unknown webhook source `{0}`")]
    UnknownSource(String),
    /// The body is larger than `server.body_limit_bytes`.
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// The body did not arrive within `server.body_read_timeout_ms`.
    #[error("the body did not arrive within {} ms", .0.as_millis())]
    BodyTimeout(std::time::Duration),
    /// Reading this body would pass `server.max_body_bytes_in_flight`.
    #[error("too many request bodies being read at once, retry later")]
    Busy,
    /// The body could not be read from the connection.
    #[error("could not read the body: {0}")]
    BodyRead(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The signature was refused.
    #[error("signature refused: {0}")]
    Unauthorized(#[from] VerifyError),
    /// The delivery-id header is missing or not text.
    #[error("missing or unreadable delivery id header `{0}`")]
    MissingDeliveryId(&'static str),
    /// The source is over its fair share (of the deliveries in flight
    /// while the process is busy, or past its pace), and its provider
    /// honours `Retry-After`.
    #[error("this source {by}, retry later")]
    OverShare {
        /// The answer's `Retry-After`, in seconds.
        retry_after_secs: u64,
        /// Which bound it is over.
        by: ShareBound,
    },
    /// The pipeline could not handle the delivery.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

/// How a webhook request ended: the `outcome` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestOutcome {
    /// The pipeline handled it (2xx).
    Handled(Outcome),
    /// Signature refused.
    Unauthorized,
    /// Malformed request (4xx other than 401).
    Rejected,
    /// Could not be handled now; 503, retryable.
    Unavailable,
    /// Its source is over its fair share; 429, retryable.
    OverShare,
}

impl RequestOutcome {
    /// Every outcome a request can have, for series that exist from start-up.
    pub fn all() -> impl Iterator<Item = RequestOutcome> {
        Outcome::ALL
            .into_iter()
            .map(RequestOutcome::Handled)
            .chain([
                RequestOutcome::Unauthorized,
                RequestOutcome::Rejected,
                RequestOutcome::Unavailable,
                RequestOutcome::OverShare,
            ])
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Handled(outcome) => outcome.as_str(),
            RequestOutcome::Unauthorized => "unauthorized",
            RequestOutcome::Rejected => "rejected",
            RequestOutcome::Unavailable => "unavailable",
            RequestOutcome::OverShare => "over_share",
        }
    }
}

impl WebhookError {
    /// The `outcome` metric label.
    pub fn outcome(&self) -> RequestOutcome {
        match self {
            WebhookError::Unauthorized(_) => RequestOutcome::Unauthorized,
            WebhookError::Pipeline(error) if error.is_retryable() => RequestOutcome::Unavailable,
            WebhookError::Busy => RequestOutcome::Unavailable,
            WebhookError::OverShare { .. } => RequestOutcome::OverShare,
            _ => RequestOutcome::Rejected,
        }
    }

    /// The status, chosen for what it makes each provider do.
    pub fn status(&self) -> StatusCode {
        match self {
            WebhookError::NoRoute
            | WebhookError::UnknownProvider(_)
            | WebhookError::UnknownSource(_)
            | WebhookError::NothingYet(_) => StatusCode::NOT_FOUND,
            WebhookError::RunInProgress(_) => StatusCode::CONFLICT,
            WebhookError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            WebhookError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            // Both providers retry a 408.
            WebhookError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            WebhookError::Busy | WebhookError::Lookup(_) => StatusCode::SERVICE_UNAVAILABLE,
            WebhookError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            WebhookError::OverShare { .. } => StatusCode::TOO_MANY_REQUESTS,
            WebhookError::Pipeline(error) if error.is_retryable() => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            WebhookError::BodyRead(_)
            | WebhookError::BadAdminRequest(_)
            | WebhookError::MissingDeliveryId(_)
            | WebhookError::Pipeline(_) => StatusCode::BAD_REQUEST,
        }
    }
}

impl IntoResponse for WebhookError {
    /// A JSON `{"error": …}` with the status; [`finish`] puts
    /// `Retry-After` on the 503s, a 429 carries its own.
    fn into_response(self) -> Response {
        let status = self.status();
        if let WebhookError::OverShare {
            retry_after_secs, ..
        } = self
        {
            let message = self.to_string();
            let mut response = (status, Json(json!({ "error": message }))).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
            return response;
        }
        let message = match &self {
            // Internals stay in our logs; the provider learns only to retry.
            WebhookError::Pipeline(error) if error.is_retryable() => {
                if error.is_announced() {
                    debug!(%error, "Delivery not handled; asking the provider to retry.");
                } else {
                    error!(%error, "Delivery not handled; asking the provider to retry.");
                }
                "temporarily unavailable, retry later".to_owned()
            }
            other => other.to_string(),
        };
        (status, Json(json!({ "error": message }))).into_response()
    }
}

/// The 2xx answer for a handled delivery: `{"status": "<outcome>"}`.
pub fn accepted(outcome: Outcome) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        outcome.answer(),
    )
        .into_response()
}

/// What every answer passes through: the configured `Retry-After`
/// (seconds) on every 503 (Mekari waits at least that long before its next
/// attempt; a balancer's probe ignores it), and `Connection: close` while
/// leaving, so a kept-alive client opens its next connection elsewhere.
pub fn finish(mut response: Response, retry_after_secs: u64, leaving: &Leaving) -> Response {
    if response.status() == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    }
    if leaving.is_leaving() {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request that panicked (a bug): 503 + `Retry-After` with the usual JSON
/// body, logged at ERROR, instead of a connection closed without an answer.
/// The provider retries; the lease of its delivery lapses meanwhile.
pub fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let detail = crate::observe::panics::message(panic.as_ref());
    error!(
        panic = detail,
        "A request panicked; answered 503 so the provider retries."
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": "temporarily unavailable, retry later" })),
    )
        .into_response()
}
