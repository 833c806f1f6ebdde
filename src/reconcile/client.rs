//! HTTP to the providers' APIs: authentication, paging answers, and retries.
//!
//! 408, 429, 5xx and transport errors are retried with exponential backoff,
//! honouring `Retry-After` (seconds); any other non-2xx fails at once with
//! the provider's answer, so a wrong credential or a skewed clock surfaces as
//! a clear error instead of a silent retry loop.

use std::time::{Duration, SystemTime};

use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

use crate::config::Secret;
use crate::providers::api_authorization;

/// Longest wait between two attempts, whatever `Retry-After` says.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// First backoff; doubles per attempt.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);

/// Why an API call failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The provider refused the request (401, 403, 404, …): retrying cannot help.
    #[error("{method} {url} refused with {status}: {body}")]
    Refused {
        /// Request method.
        method: Method,
        /// Request URL.
        url: String,
        /// The status.
        status: StatusCode,
        /// The provider's answer, for the operator.
        body: String,
    },
    /// Still failing after every attempt (429, 5xx, transport).
    #[error("{method} {url} failed after {attempts} attempts: {last}")]
    GaveUp {
        /// Request method.
        method: Method,
        /// Request URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
    /// The answer is not the JSON the provider documents.
    #[error("{url}: unexpected answer: {reason}")]
    Shape {
        /// Request URL.
        url: String,
        /// What was missing.
        reason: String,
    },
    /// The configuration does not make a valid URL or client.
    #[error("API configuration: {0}")]
    Config(String),
}

/// How requests authenticate.
#[derive(Clone)]
pub enum Auth {
    /// `Authorization: Bearer <token>` (ReceiptRoller).
    Bearer(Secret),
    /// Mekari's HMAC API authentication over `Date` and the request line.
    MekariHmac {
        /// The client id (`username`).
        client_id: String,
        /// The client secret.
        secret: Secret,
    },
}

/// One provider API, for one source's account.
#[derive(Clone)]
pub struct ApiClient {
    /// Shared connection pool.
    http: reqwest::Client,
    /// Base URL, without a trailing slash.
    base: String,
    /// Credentials.
    auth: Auth,
    /// Attempts per request.
    max_attempts: u32,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// Builds a client; `timeout` bounds each attempt.
    ///
    /// # Errors
    /// [`FetchError::Config`] when the HTTP client cannot be built.
    pub fn new(
        base: &str,
        auth: Auth,
        max_attempts: u32,
        timeout: Duration,
    ) -> Result<ApiClient, FetchError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| FetchError::Config(e.to_string()))?;
        Ok(ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            auth,
            max_attempts: max_attempts.max(1),
        })
    }

    /// `GET path?query`, retried as the module describes.
    ///
    /// # Errors
    /// [`FetchError`] as described there.
    pub async fn get(&self, path: &str, query: &[(&str, String)]) -> Result<Value, FetchError> {
        self.call(Method::GET, path, query, None).await
    }

    /// A request with a JSON body (webhook state changes).
    ///
    /// # Errors
    /// [`FetchError`] as for [`ApiClient::get`].
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, FetchError> {
        let mut url = Url::parse(&format!("{}{path}", self.base))
            .map_err(|e| FetchError::Config(format!("{}{path}: {e}", self.base)))?;
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut last = String::new();
        for attempt in 1..=self.max_attempts {
            let mut request = self.http.request(method.clone(), url.clone());
            request = match &self.auth {
                Auth::Bearer(token) => request.bearer_auth(token.expose()),
                Auth::MekariHmac { client_id, secret } => {
                    let date = httpdate::fmt_http_date(SystemTime::now());
                    let path_and_query = match url.query() {
                        Some(q) => format!("{}?{q}", url.path()),
                        None => url.path().to_owned(),
                    };
                    let authorization = api_authorization(
                        client_id,
                        secret.expose(),
                        &date,
                        method.as_str(),
                        &path_and_query,
                    );
                    request
                        .header(reqwest::header::DATE, date)
                        .header(reqwest::header::AUTHORIZATION, authorization)
                }
            };
            if let Some(body) = body {
                request = request.json(body);
            }
            let wait = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let text = response.text().await.unwrap_or_default();
                    if text.trim().is_empty() {
                        return Ok(Value::Null);
                    }
                    return serde_json::from_str(&text).map_err(|e| FetchError::Shape {
                        url: url.to_string(),
                        reason: format!("not JSON: {e}"),
                    });
                }
                Ok(response) if retryable(response.status()) => {
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    last = format!("status {}", response.status());
                    retry_after
                }
                Ok(response) => {
                    let status = response.status();
                    return Err(FetchError::Refused {
                        method,
                        url: url.to_string(),
                        status,
                        body: response.text().await.unwrap_or_default(),
                    });
                }
                Err(error) => {
                    last = error.to_string();
                    None
                }
            };
            if attempt < self.max_attempts {
                let backoff = FIRST_BACKOFF * 2u32.saturating_pow(attempt - 1);
                let wait = wait.unwrap_or(backoff).min(MAX_BACKOFF);
                tracing::debug!(%url, attempt, wait_ms = wait.as_millis() as u64, failure = %last, "API call failed; retrying.");
                tokio::time::sleep(wait).await;
            }
        }
        Err(FetchError::GaveUp {
            method,
            url: url.to_string(),
            attempts: self.max_attempts,
            last,
        })
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}
