//! HTTP to the providers' APIs: authentication, paging answers, and retries.
//!
//! 408, 429, 5xx and transport errors are retried with exponential backoff,
//! honouring `Retry-After` (seconds); any other non-2xx fails at once with
//! the provider's answer, so a wrong credential or a skewed clock surfaces as
//! a clear error instead of a silent retry loop.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde_json::Value;

use super::ApiOptions;

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
    /// Still failing after every attempt (408, 429, 5xx, transport).
    #[error("{method} {url} failed after {attempts} attempts: {last}")]
    GaveUp {
        /// Request method.
        method: Method,
        /// Request URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        #[source]
        last: AttemptError,
    },
    /// The answer is not the JSON the provider documents.
    #[error("{url}: unexpected answer: {reason}")]
    Shape {
        /// Request URL.
        url: String,
        /// What was missing.
        reason: String,
    },
    /// The answer is not JSON at all.
    #[error("{url}: the answer is not JSON: {source}")]
    NotJson {
        /// Request URL.
        url: String,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The source's `api` table does not fit the provider's settings (boxed:
    /// a start-up error need not size every API error).
    #[error("api settings: {0}")]
    Settings(#[source] Box<config::ConfigError>),
    /// A setting the provider needs is absent.
    #[error("api settings: `{0}` is missing")]
    MissingSetting(&'static str),
    /// The base URL and path do not make a URL.
    #[error("`{url}` is not a URL: {source}")]
    InvalidUrl {
        /// What was tried.
        url: String,
        /// The parser's error.
        #[source]
        source: url::ParseError,
    },
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// Why one attempt failed in a way a later attempt may not.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// A retryable status (408, 429, 5xx).
    #[error("status {0}")]
    Status(StatusCode),
    /// No answer: connection refused, reset, timed out.
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
}

/// How a provider authenticates its API requests; each provider's folder
/// holds its own (ReceiptRoller: a bearer token; Mekari: HMAC over the request).
pub trait Authorize: Send + Sync {
    /// Adds the credentials to a request for `url`, made now.
    fn authorize(&self, request: RequestBuilder, method: &Method, url: &Url) -> RequestBuilder;
}

/// One provider API, for one source's account.
#[derive(Clone)]
pub struct ApiClient {
    /// Shared connection pool.
    http: reqwest::Client,
    /// Base URL, without a trailing slash.
    base: String,
    /// Credentials.
    auth: Arc<dyn Authorize>,
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
    /// Builds a client; `options.timeout` bounds each attempt.
    ///
    /// # Errors
    /// [`FetchError::Client`] when the HTTP client cannot be built.
    pub fn new(
        base: &str,
        auth: Arc<dyn Authorize>,
        options: &ApiOptions,
    ) -> Result<ApiClient, FetchError> {
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .build()
            .map_err(FetchError::Client)?;
        Ok(ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            auth,
            max_attempts: options.max_attempts.max(1),
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
        let full = format!("{}{path}", self.base);
        let mut url = Url::parse(&full).map_err(|source| FetchError::InvalidUrl {
            url: full.clone(),
            source,
        })?;
        if !query.is_empty() {
            url.query_pairs_mut()
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())));
        }
        let mut last = None;
        for attempt in 1..=self.max_attempts {
            let request = self.http.request(method.clone(), url.clone());
            let mut request = self.auth.authorize(request, &method, &url);
            if let Some(body) = body {
                request = request.json(body);
            }
            let wait = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let text = response.text().await.unwrap_or_default();
                    if text.trim().is_empty() {
                        return Ok(Value::Null);
                    }
                    return serde_json::from_str(&text).map_err(|source| FetchError::NotJson {
                        url: url.to_string(),
                        source,
                    });
                }
                Ok(response) if retryable(response.status()) => {
                    let retry_after = response
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    last = Some(AttemptError::Status(response.status()));
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
                    last = Some(AttemptError::Transport(error));
                    None
                }
            };
            if attempt < self.max_attempts {
                let backoff = FIRST_BACKOFF * 2u32.saturating_pow(attempt - 1);
                let wait = wait.unwrap_or(backoff).min(MAX_BACKOFF);
                if let Some(failure) = &last {
                    tracing::debug!(%url, attempt, wait_ms = wait.as_millis() as u64, %failure, "API call failed; retrying.");
                }
                tokio::time::sleep(wait).await;
            }
        }
        Err(FetchError::GaveUp {
            method,
            url: url.to_string(),
            attempts: self.max_attempts,
            // The loop runs at least once and every failed attempt sets it.
            last: last.expect("a failed attempt left its failure"),
        })
    }
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}
