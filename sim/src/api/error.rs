//! The simulated APIs' error answer: a status and a short JSON body
//! `{"error", "message"}`, with optional extra fields and headers.
//!
//! Every API handler and auth check answers its refusals with an
//! [`ApiError`], so both providers' APIs and `/sim` fail the same way.

use axum::Json;
use axum::http::{self, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error: a status and a short JSON body `{"error", "message"}`.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    status: StatusCode,
    /// A fixed code (`unauthorized`, `bad_request`, …).
    error: &'static str,
    /// What was wrong, for a person reading a test log.
    message: String,
    /// Extra fields for the body.
    extra: Option<Value>,
    /// Extra headers (`Retry-After`, `WWW-Authenticate`).
    headers: Vec<(http::HeaderName, HeaderValue)>,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(status: StatusCode, error: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            error,
            message: message.into(),
            extra: None,
            headers: Vec::new(),
        }
    }

    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401 with a message saying which check failed.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 404 for an unknown webhook or endpoint.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// The injected 503 (`--api-fail-rate`), asking to retry in a second.
    pub fn unavailable() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "simulated outage, retry later",
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
    }

    /// Adds fields to the body.
    pub fn with_extra(mut self, extra: Value) -> ApiError {
        self.extra = Some(extra);
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: http::HeaderName, value: HeaderValue) -> ApiError {
        self.headers.push((name, value));
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({"error": self.error, "message": self.message});
        if let (Some(Value::Object(extra)), Value::Object(map)) = (self.extra, &mut body) {
            map.extend(extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        for (name, value) in self.headers {
            response.headers_mut().insert(name, value);
        }
        response
    }
}
