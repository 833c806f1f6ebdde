//! The one place where errors become HTTP answers.
//!
//! Status codes are chosen for what they make each provider do:
//! * 2xx: delivered, no retry (also duplicates, stale events, dead letters).
//! * 503 + `Retry-After`: retried by both; the only way to ask for a retry
//!   (Mekari never retries other 4xx, and never follows 3xx).
//! * 401 / 400 / 404 / 413: the request is wrong and retrying it unchanged
//!   cannot help. Mekari gives up on that delivery; ReceiptRoller retries it
//!   and switches the webhook off after four failures, which is why a refused
//!   signature is logged at ERROR and counted.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tracing::error;

use crate::metrics::Outcome;
use crate::pipeline::PipelineError;
use crate::verify::VerifyError;

/// Why a webhook request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// Nothing is routed at this path.
    #[error("no such route")]
    NoRoute,
    /// The path exists but not for this method (webhooks are POST only).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The path names a provider posbridge does not serve.
    #[error("unknown provider `{0}`")]
    UnknownProvider(String),
    /// No source of that name is configured for the provider.
    #[error("unknown webhook source `{0}`")]
    UnknownSource(String),
    /// The body is larger than `server.body_limit_bytes`.
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    /// The body could not be read from the connection.
    #[error("could not read the body: {0}")]
    BodyRead(String),
    /// The signature was refused.
    #[error("signature refused: {0}")]
    Unauthorized(#[from] VerifyError),
    /// The delivery-id header is missing or not text.
    #[error("missing or unreadable delivery id header `{0}`")]
    MissingDeliveryId(&'static str),
    /// The pipeline could not handle the delivery.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
}

impl WebhookError {
    /// The `outcome` metric label.
    pub fn outcome(&self) -> Outcome {
        match self {
            WebhookError::Unauthorized(_) => Outcome::Unauthorized,
            WebhookError::Pipeline(PipelineError::Unavailable(_)) => Outcome::Unavailable,
            _ => Outcome::Rejected,
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            WebhookError::NoRoute
            | WebhookError::UnknownProvider(_)
            | WebhookError::UnknownSource(_) => StatusCode::NOT_FOUND,
            WebhookError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            WebhookError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            WebhookError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            WebhookError::BodyRead(_)
            | WebhookError::MissingDeliveryId(_)
            | WebhookError::Pipeline(PipelineError::Rejected(_)) => StatusCode::BAD_REQUEST,
            WebhookError::Pipeline(PipelineError::Unavailable(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// Builds the answer; `retry_after_secs` goes on 503s.
    pub fn into_response_with(self, retry_after_secs: u64) -> Response {
        let status = self.status();
        let message = match &self {
            // Internals stay in our logs; the provider learns only to retry.
            WebhookError::Pipeline(PipelineError::Unavailable(detail)) => {
                error!(error = %detail, "Delivery not handled; asking the provider to retry.");
                "temporarily unavailable, retry later".to_owned()
            }
            other => other.to_string(),
        };
        let mut response = (status, Json(json!({ "error": message }))).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}

/// The 2xx answer for a handled delivery.
pub fn accepted(outcome: Outcome) -> Response {
    (StatusCode::OK, Json(json!({ "status": outcome.as_str() }))).into_response()
}
