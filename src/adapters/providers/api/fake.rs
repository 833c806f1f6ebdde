//! A fake provider API for the API clients' tests: a loopback HTTP server
//! that answers each request with the next scripted [`Answer`], then 200
//! `{}`, and counts what it was asked and what it sent.
//!
//! A fake because neither provider's API (nor the simulator) can be made to
//! misbehave on demand the ways a flaky platform or a careless provider does:
//! 429/503 with a chosen `Retry-After`, a body far larger than any page, one
//! cut short or dripping past the timeout, a redirect to another host.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use serde_json::Value;

/// How much of a streamed body one chunk carries.
const CHUNK: usize = 64 * 1024;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// This status with body `busy` and, when given, this `Retry-After`.
    Status(StatusCode, Option<String>),
    /// 200 with this JSON.
    Json(Value),
    /// 200 with a JSON page `{"items": [...], "total_pages": 1}` of about
    /// this many bytes, streamed in chunks without a `Content-Length`.
    Huge(usize),
    /// 200 announcing this `Content-Length`, then closing after a tenth of it.
    CutShort(usize),
    /// 200 sending one space every this long, never ending.
    Drip(Duration),
    /// 307 to this URL.
    Redirect(String),
}

/// The fake's handle: its script and what it saw.
#[derive(Clone, Default)]
pub struct FakeProviderApi {
    /// The answers still to give, in order.
    script: Arc<Mutex<VecDeque<Answer>>>,
    /// Requests answered.
    requests: Arc<AtomicU64>,
    /// Body bytes handed to the connection (streamed answers only).
    streamed: Arc<AtomicU64>,
}

impl FakeProviderApi {
    /// Serves `script` on 127.0.0.1; the fake and its base URL.
    pub async fn serve(script: Vec<Answer>) -> (FakeProviderApi, String) {
        FakeProviderApi::serve_on("127.0.0.1", script).await
    }

    /// Serves `script` on `ip` (another loopback address is another host).
    pub async fn serve_on(ip: &str, script: Vec<Answer>) -> (FakeProviderApi, String) {
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
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await });
        (fake, base)
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Body bytes of streamed answers handed to the connection so far.
    pub fn streamed(&self) -> u64 {
        self.streamed.load(Ordering::SeqCst)
    }

    fn answer(&self) -> Response {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let next = self.script.lock().unwrap().pop_front();
        match next {
            None => (StatusCode::OK, "{}").into_response(),
            Some(Answer::Status(status, retry_after)) => {
                let mut response = (status, "busy").into_response();
                if let Some(value) = retry_after {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_str(&value).unwrap());
                }
                response
            }
            Some(Answer::Json(value)) => (StatusCode::OK, value.to_string()).into_response(),
            Some(Answer::Huge(bytes)) => self.huge(bytes),
            Some(Answer::CutShort(length)) => self.cut_short(length),
            Some(Answer::Drip(every)) => drip(every),
            Some(Answer::Redirect(location)) => (
                StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, location)],
            )
                .into_response(),
        }
    }

    /// A valid JSON page of about `bytes` bytes, made chunk by chunk as the
    /// connection takes it, so that [`FakeProviderApi::streamed`] tells how
    /// much the client read before it stopped.
    fn huge(&self, bytes: usize) -> Response {
        let record = br#"{"id":"T1|2026-11|000001","note":"padding padding padding"},"#;
        let mut chunk = Vec::with_capacity(CHUNK);
        while chunk.len() + record.len() <= CHUNK {
            chunk.extend_from_slice(record);
        }
        let chunk = Bytes::from(chunk);
        let chunks = bytes / chunk.len();
        let head = Bytes::from_static(br#"{"items":["#);
        let tail = Bytes::from_static(br#"{}],"total_pages":1}"#);
        let streamed = self.streamed.clone();
        let body = futures::stream::iter(
            std::iter::once(head)
                .chain(std::iter::repeat_n(chunk, chunks))
                .chain(std::iter::once(tail)),
        )
        .map(move |chunk| {
            streamed.fetch_add(chunk.len() as u64, Ordering::SeqCst);
            Ok::<_, Infallible>(chunk)
        });
        Response::new(Body::from_stream(body))
    }

    /// Announces `length` bytes, sends a tenth, then fails the body, which
    /// makes the server close the connection mid-answer.
    fn cut_short(&self, length: usize) -> Response {
        let part = Bytes::from(vec![b' '; length / 10]);
        self.streamed.fetch_add(part.len() as u64, Ordering::SeqCst);
        // The failure comes after a pause, so the server first sends the
        // head and the part, as a connection that dies mid-answer does.
        let body = futures::stream::iter([Ok(part)]).chain(futures::stream::once(async {
            tokio::task::yield_now().await;
            Err(std::io::Error::other("the fake cuts the answer short"))
        }));
        let mut response = Response::new(Body::from_stream(body));
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        response
    }
}

/// One space every `every`, for ever (until the client goes away).
fn drip(every: Duration) -> Response {
    let body = futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(every).await;
        Some((Ok::<_, Infallible>(Bytes::from_static(b" ")), ()))
    });
    Response::new(Body::from_stream(body))
}

/// A source's `api` table from its TOML keys, as a configuration file holds it.
pub fn api_section(toml: &str) -> crate::config::ApiSection {
    config::Config::builder()
        .add_source(config::File::from_str(toml, config::FileFormat::Toml))
        .build()
        .unwrap()
        .try_deserialize()
        .unwrap()
}
