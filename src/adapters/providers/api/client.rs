//! HTTP to the providers' APIs: authentication, paging answers, and retries.
//!
//! 408, 429, 5xx and transport errors are retried with exponential backoff
//! and jitter (`backon`), waiting at least what a `Retry-After` asks (in
//! seconds or as an HTTP date), at most [`MAX_WAIT`]; any other non-2xx fails
//! at once with the provider's answer, so a wrong credential or a skewed
//! clock surfaces as a clear error instead of a silent retry loop.
//!
//! An answer is not trusted further than it must be. Its body is read chunk
//! by chunk up to `max_body_bytes` and no further; a body cut short or still
//! arriving at the timeout is a transport error like a refused connection,
//! retried as one. A redirect is followed only on the same scheme, host and
//! port: a 2xx from another host says nothing about the provider's state.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use reqwest::{Method, RequestBuilder, Response, StatusCode, Url, redirect};
use serde_json::Value;

use super::ApiOptions;

/// Longest wait between two attempts, whatever `Retry-After` says: a
/// reconcile run waits for its page rather than give up on a long answer,
/// but not for an hour.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// First backoff; doubles per attempt, each wait lengthened by a random part
/// of up to as much again, so clients that failed together do not retry together.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Redirects followed per request, on the same host.
const MAX_REDIRECTS: usize = 5;
/// How much of a refusal's body is kept for the operator.
const REFUSAL_SHOWN_BYTES: usize = 4096;

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
    /// A redirect that is not followed: to another host, or one too many.
    #[error(
        "{method} {url} answered {status}, a redirect to `{location}` that is not followed (another host, or more than {MAX_REDIRECTS})"
    )]
    Redirected {
        /// Request method.
        method: Method,
        /// Request URL.
        url: String,
        /// The redirect's status.
        status: StatusCode,
        /// Where it pointed.
        location: String,
    },
    /// The answer's body is larger than `reconcile.max_body_bytes`; reading
    /// stopped there. Not retried: the next answer would be as large.
    #[error("{url}: the answer is larger than {limit} bytes (reconcile.max_body_bytes)")]
    BodyTooLarge {
        /// Request URL.
        url: String,
        /// The limit.
        limit: usize,
    },
    /// A page holds more records than were asked for.
    #[error("{url}: a page of {records} records where {asked} asked (per_page)")]
    PageTooLarge {
        /// Request URL.
        url: String,
        /// Records in the page.
        records: usize,
        /// Records asked for.
        asked: u32,
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
    /// No whole answer: connection refused, reset or cut mid-body, timed out.
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
}

/// Why one attempt ended without an answer to return.
enum Failure {
    /// Worth another attempt, after at least `retry_after` when the provider said so.
    Retry {
        /// What failed.
        error: AttemptError,
        /// The answer's `Retry-After`, as a wait from when it arrived.
        retry_after: Option<Duration>,
    },
    /// Another attempt cannot help.
    Final(FetchError),
}

impl Failure {
    fn is_retry(&self) -> bool {
        matches!(self, Failure::Retry { .. })
    }

    /// Says a retry at DEBUG: the run's result tells what finally happened.
    fn say(&self, url: &Url, wait: Duration) {
        if let Failure::Retry { error, .. } = self {
            let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            tracing::debug!(%url, wait_ms, %error, "API call failed; retrying.");
        }
    }

    /// The wait before the next attempt, given backon's `backoff` (none when
    /// the attempts are spent): the backoff, or longer when the provider
    /// asked for longer; at most [`MAX_WAIT`].
    fn wait(&self, backoff: Option<Duration>) -> Option<Duration> {
        let asked = match self {
            Failure::Retry { retry_after, .. } => *retry_after,
            Failure::Final(_) => None,
        };
        backoff.map(|backoff| {
            asked
                .map_or(backoff, |asked| asked.max(backoff))
                .min(MAX_WAIT)
        })
    }
}

/// Sleeps between attempts: `tokio::time::sleep`, or for tests a recorder.
type Sleep = Arc<dyn Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync>;

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
    /// Largest answer body read.
    max_body_bytes: usize,
    /// Waits between attempts.
    sleep: Sleep,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ApiClient {
    /// Builds a client; `options.timeout` bounds each attempt, body and all.
    ///
    /// # Errors
    /// [`FetchError::Client`] when the HTTP client cannot be built.
    pub fn new(
        base: &str,
        auth: Arc<dyn Authorize>,
        options: &ApiOptions,
    ) -> Result<ApiClient, FetchError> {
        let http = options
            .http(|| {
                reqwest::Client::builder()
                    .timeout(options.timeout)
                    .redirect(redirect::Policy::custom(same_host))
                    .build()
            })
            .map_err(FetchError::Client)?;
        Ok(ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            auth,
            max_attempts: options.max_attempts.max(1),
            max_body_bytes: options.max_body_bytes,
            sleep: Arc::new(|wait| Box::pin(tokio::time::sleep(wait))),
        })
    }

    /// The same client calling `sleep` for each wait between attempts: for
    /// tests, which record the waits instead of sleeping them.
    #[cfg(test)]
    fn with_sleep(
        self,
        sleep: impl Fn(Duration) -> BoxFuture<'static, ()> + Send + Sync + 'static,
    ) -> ApiClient {
        ApiClient {
            sleep: Arc::new(sleep),
            ..self
        }
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
        let backoff = ExponentialBuilder::new()
            .with_min_delay(FIRST_BACKOFF)
            .with_max_delay(MAX_WAIT)
            .with_jitter()
            .with_max_times(self.max_attempts as usize - 1);
        let sleep = self.sleep.clone();
        let mut attempt = 0;
        let retried = (|| {
            attempt += 1;
            self.attempt(&method, &url, body)
        })
        .retry(backoff)
        .when(Failure::is_retry)
        .adjust(Failure::wait)
        .notify(|failure: &Failure, wait: Duration| failure.say(&url, wait))
        .sleep(move |wait| sleep(wait));
        // Boxed here, where its lifetimes are plain: left to the callers'
        // `async_trait` futures, proving it `Send` fails.
        let retried: BoxFuture<'_, Result<Value, Failure>> = Box::pin(retried);
        let answer = retried.await;
        answer.map_err(|failure| match failure {
            Failure::Final(error) => error,
            Failure::Retry { error, .. } => FetchError::GaveUp {
                method: method.clone(),
                url: url.to_string(),
                attempts: attempt,
                last: error,
            },
        })
    }

    /// One attempt: the answer's JSON, or why there is none.
    async fn attempt(
        &self,
        method: &Method,
        url: &Url,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        let request = self.http.request(method.clone(), url.clone());
        let mut request = self.auth.authorize(request, method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|error| Failure::Retry {
            error: AttemptError::Transport(error),
            retry_after: None,
        })?;
        let status = response.status();
        if status.is_success() {
            let body =
                read_body(response, self.max_body_bytes)
                    .await
                    .map_err(|error| match error {
                        BodyError::TooLarge => Failure::Final(FetchError::BodyTooLarge {
                            url: url.to_string(),
                            limit: self.max_body_bytes,
                        }),
                        BodyError::Transport(error) => Failure::Retry {
                            error: AttemptError::Transport(error),
                            retry_after: None,
                        },
                    })?;
            if body.trim_ascii().is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_slice(&body).map_err(|source| {
                Failure::Final(FetchError::NotJson {
                    url: url.to_string(),
                    source,
                })
            });
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            return Err(Failure::Final(FetchError::Redirected {
                method: method.clone(),
                url: url.to_string(),
                status,
                location,
            }));
        }
        if retryable(status) {
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| retry_after(v, SystemTime::now()));
            return Err(Failure::Retry {
                error: AttemptError::Status(status),
                retry_after,
            });
        }
        Err(Failure::Final(FetchError::Refused {
            method: method.clone(),
            url: url.to_string(),
            status,
            body: refusal_shown(response).await,
        }))
    }
}

/// Why a body was not read whole.
enum BodyError {
    /// It grew past the limit.
    TooLarge,
    /// The connection broke or the timeout passed before its end.
    Transport(reqwest::Error),
}

/// The body, read chunk by chunk, at most `limit` bytes: a `Content-Length`
/// past it is refused unread, and reading stops as soon as the chunks pass it.
async fn read_body(mut response: Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let announced = response.content_length().unwrap_or(0);
    if usize::try_from(announced).map_or(true, |announced| announced > limit) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The start of a refusal's body, for the operator: a provider's error
/// page can be as large as any other answer.
async fn refusal_shown(mut response: Response) -> String {
    let mut shown = Vec::new();
    while shown.len() < REFUSAL_SHOWN_BYTES
        && let Ok(Some(chunk)) = response.chunk().await
    {
        shown.extend_from_slice(&chunk);
    }
    shown.truncate(REFUSAL_SHOWN_BYTES);
    String::from_utf8_lossy(&shown).into_owned()
}

/// The redirect policy: follow on the same scheme, host and port, up to
/// [`MAX_REDIRECTS`]; otherwise hand the 3xx back, to fail as
/// [`FetchError::Redirected`]. Credentials and a webhook change are for the
/// provider's API alone.
fn same_host(attempt: redirect::Attempt<'_>) -> redirect::Action {
    let same = attempt
        .previous()
        .first()
        .is_some_and(|first| first.origin() == attempt.url().origin());
    if same && attempt.previous().len() <= MAX_REDIRECTS {
        attempt.follow()
    } else {
        attempt.stop()
    }
}

/// A `Retry-After` value as a wait from `now`: delay-seconds, or an HTTP
/// date (a date already past asks for no wait). `None` when it is neither.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

fn retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

#[cfg(test)]
mod tests;
