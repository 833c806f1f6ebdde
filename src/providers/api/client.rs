//! HTTP to the providers' APIs: authentication, paging answers, and retries.
//!
//! 408, 429, 5xx and transport errors are retried with exponential backoff
//! and jitter (`backon`), waiting at least what a `Retry-After` asks (in
//! seconds or as an HTTP date), at most [`MAX_WAIT`]; any other non-2xx fails
//! at once with the provider's answer, so a wrong credential or a skewed
//! clock surfaces as a clear error instead of a silent retry loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use reqwest::{Method, RequestBuilder, StatusCode, Url};
use serde_json::Value;

use super::ApiOptions;

/// Longest wait between two attempts, whatever `Retry-After` says: a
/// reconcile run waits for its page rather than give up on a long answer,
/// but not for an hour.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// First backoff; doubles per attempt, each wait lengthened by a random part
/// of up to as much again, so clients that failed together do not retry together.
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
            let text = response.text().await.unwrap_or_default();
            if text.trim().is_empty() {
                return Ok(Value::Null);
            }
            return serde_json::from_str(&text).map_err(|source| {
                Failure::Final(FetchError::NotJson {
                    url: url.to_string(),
                    source,
                })
            });
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
            body: response.text().await.unwrap_or_default(),
        }))
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
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use axum::http::HeaderValue;
    use axum::response::{IntoResponse, Response};

    use super::*;

    /// One scripted answer: a status and its `Retry-After`.
    type Answer = (StatusCode, Option<String>);

    /// A fake provider API: answers each request with the next scripted
    /// status and `Retry-After`, then 200 `{}`, and counts the requests. A
    /// fake because neither provider's API (nor the simulator) can be made
    /// to answer 429 or 503 with a chosen `Retry-After` on demand.
    #[derive(Clone, Default)]
    struct FakeProviderApi {
        script: Arc<Mutex<VecDeque<Answer>>>,
        requests: Arc<Mutex<u32>>,
    }

    impl FakeProviderApi {
        /// Serves `script` on a loopback port; its base URL.
        async fn serve(script: Vec<Answer>) -> (FakeProviderApi, String) {
            let fake = FakeProviderApi {
                script: Arc::new(Mutex::new(script.into())),
                ..FakeProviderApi::default()
            };
            let answer = {
                let fake = fake.clone();
                move || {
                    let fake = fake.clone();
                    async move { fake.answer() }
                }
            };
            let router = axum::Router::new().fallback(answer);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move { axum::serve(listener, router).await });
            (fake, base)
        }

        fn answer(&self) -> Response {
            *self.requests.lock().unwrap() += 1;
            match self.script.lock().unwrap().pop_front() {
                None => (StatusCode::OK, "{}").into_response(),
                Some((status, retry_after)) => {
                    let mut response = (status, "busy").into_response();
                    if let Some(value) = retry_after {
                        response.headers_mut().insert(
                            reqwest::header::RETRY_AFTER,
                            HeaderValue::from_str(&value).unwrap(),
                        );
                    }
                    response
                }
            }
        }

        fn requests(&self) -> u32 {
            *self.requests.lock().unwrap()
        }
    }

    struct NoAuth;

    impl Authorize for NoAuth {
        fn authorize(&self, request: RequestBuilder, _: &Method, _: &Url) -> RequestBuilder {
            request
        }
    }

    /// A client of `base` with `max_attempts` whose waits are recorded, not slept.
    fn client(base: &str, max_attempts: u32) -> (ApiClient, Arc<Mutex<Vec<Duration>>>) {
        let options = ApiOptions {
            max_attempts,
            timeout: Duration::from_secs(10),
        };
        let waits = Arc::new(Mutex::new(Vec::new()));
        let recorded = waits.clone();
        let client = ApiClient::new(base, Arc::new(NoAuth), &options)
            .unwrap()
            .with_sleep(move |wait| {
                recorded.lock().unwrap().push(wait);
                Box::pin(std::future::ready(()))
            });
        (client, waits)
    }

    fn waits(recorded: &Arc<Mutex<Vec<Duration>>>) -> Vec<Duration> {
        recorded.lock().unwrap().clone()
    }

    fn busy(status: u16, retry_after: Option<String>) -> Answer {
        (StatusCode::from_u16(status).unwrap(), retry_after)
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn retry_after_in_seconds_is_waited() {
        let (fake, base) = FakeProviderApi::serve(vec![
            busy(429, Some("3".into())),
            busy(503, Some(" 7 ".into())),
            busy(429, Some("7200".into())),
        ])
        .await;
        let (client, recorded) = client(&base, 5);
        assert_eq!(
            client.get("/sales", &[]).await.unwrap(),
            serde_json::json!({})
        );
        assert_eq!(fake.requests(), 4);
        assert_eq!(
            waits(&recorded),
            [3 * SECOND, 7 * SECOND, MAX_WAIT],
            "an hour's Retry-After waits the cap"
        );
    }

    #[tokio::test]
    async fn retry_after_as_an_http_date_is_waited_until_then() {
        let date = |from_now: Duration| Some(httpdate::fmt_http_date(SystemTime::now() + from_now));
        let (fake, base) = FakeProviderApi::serve(vec![
            busy(503, date(Duration::from_secs(20))),
            busy(429, date(Duration::from_secs(3600))),
            busy(503, Some("Sun, 06 Nov 1994 08:49:37 GMT".into())),
        ])
        .await;
        let (client, recorded) = client(&base, 4);
        client.get("/sales", &[]).await.unwrap();
        assert_eq!(fake.requests(), 4);
        let waits = waits(&recorded);
        // The date has whole seconds: 20 s from now is 19 to 20 s away.
        assert!(
            (15 * SECOND..=20 * SECOND).contains(&waits[0]),
            "until the date: {waits:?}"
        );
        assert_eq!(waits[1], MAX_WAIT, "an hour away waits the cap");
        // A date gone by asks for nothing: the third backoff, 1 to 2 s.
        assert!(
            (SECOND..2 * SECOND).contains(&waits[2]),
            "the backoff: {waits:?}"
        );
    }

    #[tokio::test]
    async fn the_backoff_doubles_with_jitter_and_the_attempts_end() {
        let (fake, base) = FakeProviderApi::serve(vec![busy(500, None); 4]).await;
        let (client, recorded) = client(&base, 4);
        let error = client.get("/sales", &[]).await.unwrap_err();
        assert!(
            matches!(&error, FetchError::GaveUp { attempts: 4, last: AttemptError::Status(s), .. } if *s == StatusCode::INTERNAL_SERVER_ERROR),
            "{error}"
        );
        assert_eq!(fake.requests(), 4);
        let waits = waits(&recorded);
        assert_eq!(waits.len(), 3, "{waits:?}");
        for (wait, base) in waits.iter().zip([1, 2, 4].map(|n| FIRST_BACKOFF * n)) {
            // Jitter adds a random part of up to as much again; exactly the
            // base would mean none (a chance of 1 in 2^24).
            assert!(
                *wait > base && *wait < 2 * base,
                "{wait:?} after a base of {base:?}: {waits:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_refusal_is_not_retried() {
        let (fake, base) = FakeProviderApi::serve(vec![busy(401, Some("1".into()))]).await;
        let (client, recorded) = client(&base, 4);
        let error = client.get("/sales", &[]).await.unwrap_err();
        assert!(
            matches!(&error, FetchError::Refused { status, .. } if *status == StatusCode::UNAUTHORIZED),
            "{error}"
        );
        assert_eq!(fake.requests(), 1);
        assert_eq!(waits(&recorded), Vec::<Duration>::new());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:51:37 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:48:37 GMT", now),
            Some(Duration::ZERO),
            "a date gone by"
        );
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-5", now), None);
    }
}
