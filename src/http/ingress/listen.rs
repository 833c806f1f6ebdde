//! The accept loop: HTTP/1.1 connections with bounds a hostile or broken
//! client cannot stretch.
//!
//! `axum::serve` has no read timeouts and no connection limit, so a few
//! hundred slow or idle clients could hold memory and file descriptors and
//! keep shutdown waiting. Here every connection is served by hyper with a
//! header read timeout (which also closes kept-alive connections that sit
//! idle), the number of open connections is capped (one more is answered 503
//! and closed), and shutdown waits for open connections at most
//! `shutdown_timeout_ms`, then closes them. The answers hyper gives by itself
//! (400, 414, 431) get the JSON body every other answer has, and so does an
//! HTTP/2 preface, which hyper's HTTP/1 server would close unanswered. Body read
//! timeouts and the cap on body bytes in flight live in the webhook handler,
//! which knows the body.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use hyper::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::Routes;

/// The connection bounds, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// `header_read_timeout_ms`.
    pub header_read_timeout: Duration,
    /// `max_connections`.
    pub max_connections: usize,
    /// `shutdown_timeout_ms`: how long open connections may take to finish.
    pub shutdown_timeout: Duration,
    /// `retry_after_secs`, for the answer to a connection over the cap.
    pub retry_after_secs: u64,
}

/// Connections over the cap answered at once; more are closed unanswered.
const REFUSALS: usize = 64;

/// How long accepting pauses after the listener fails (e.g. out of file
/// descriptors), so the loop does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` resolves.
///
/// # Errors
/// None today; the signature keeps room for a listener that cannot go on.
pub async fn serve(
    listener: TcpListener,
    router: impl Routes,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(REFUSALS));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut accept_failing = false;
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    if !accept_failing {
                        warn!(%error, "Cannot accept connections; retrying until it works.");
                        accept_failing = true;
                    }
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        if std::mem::take(&mut accept_failing) {
            info!("Accepting connections again.");
        }
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Answering holds a descriptor for up to a second: past REFUSALS
            // at once, accepting waits for one to end, and new connections
            // wait in the kernel's backlog instead of being reset unanswered.
            let refusal = tokio::select! {
                () = &mut shutdown => break,
                refusal = refusals.clone().acquire_owned() => refusal,
            };
            connections.spawn(async move {
                refuse(stream, limits.retry_after_secs).await;
                drop(refusal);
            });
            continue;
        };
        // hyper's request body into axum's, as `axum::serve` maps it.
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(|request: Request<Incoming>| request.map(Body::new)),
        );
        let http = http.clone();
        let watcher = graceful.watcher();
        connections.spawn(async move {
            match opening(&stream, limits.header_read_timeout).await {
                // The 400 the status codes table promises for anything not HTTP/1.1.
                Opening::Http2 => {
                    let answer =
                        closing_json_answer("400 Bad Request", "", "malformed HTTP request");
                    answer_and_close(stream, &answer).await;
                }
                // Nothing within the header read timeout: closed, as hyper
                // closes a connection whose head does not come.
                Opening::Silent => {}
                Opening::Http1 => {
                    let connection = watcher.watch(
                        http.serve_connection(TokioIo::new(JsonErrors::new(stream)), service),
                    );
                    if let Err(error) = connection.await {
                        debug!(%error, "Connection ended with an error.");
                    }
                }
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            open = connections.len(),
            "Connections still open after shutdown_timeout_ms; closing them."
        );
    }
    connections.shutdown().await;
    Ok(())
}

/// A connection whose bodiless error answers become JSON.
///
/// hyper answers a request it cannot parse (400), a URI too long (414) or
/// headers too large (431) itself, with an empty body, before any handler
/// runs. Every other answer of posbridge carries a JSON body, so exactly these
/// heads (a 4xx with `content-length: 0`) are rewritten on their way out.
struct JsonErrors<S> {
    inner: S,
    /// A rewritten answer and how much of it is written.
    pending: Option<(Vec<u8>, usize)>,
}

impl<S> JsonErrors<S> {
    fn new(inner: S) -> Self {
        JsonErrors {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes what is left of a rewritten answer.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while let Some((bytes, written)) = self.pending.as_mut() {
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    *written += n;
                    if *written == bytes.len() {
                        self.pending = None;
                    }
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        match json_error_answer(buf) {
            Some(answer) => {
                self.pending = Some((answer, 0));
                // Reported as written: the rest goes out on flush.
                let _ = self.drain(cx)?;
                Poll::Ready(Ok(buf.len()))
            }
            None => Pin::new(&mut self.inner).poll_write(cx, buf),
        }
    }

    /// Kept vectored, so hyper writes a head and its body without first
    /// copying both into one buffer.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        // hyper's own error heads have no body, so they come alone; judged
        // as in `poll_write`.
        let mut filled = bufs.iter().filter(|buf| !buf.is_empty());
        if let (Some(only), None) = (filled.next(), filled.next()) {
            return self.poll_write(cx, only);
        }
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.drain(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The JSON version of a bodiless error head hyper wrote itself, if `head` is one.
fn json_error_answer(head: &[u8]) -> Option<Vec<u8>> {
    // Every answer passes here: decide on the status bytes before reading more.
    let message = match head.get(..12)? {
        b"HTTP/1.1 400" => "malformed HTTP request",
        b"HTTP/1.1 414" => "request URI too long",
        b"HTTP/1.1 431" => "request headers too large",
        _ => return None,
    };
    let text = std::str::from_utf8(head).ok()?;
    let (status_line, fields) = text.split_once("\r\n")?;
    let status = status_line.strip_prefix("HTTP/1.1 ")?;
    // One head and nothing after it: a buffer holding several answers (a
    // pipelined client) or a body is never one of hyper's own.
    let bodiless = fields
        .find("\r\n\r\n")
        .is_some_and(|end| end + 4 == fields.len())
        && fields
            .to_ascii_lowercase()
            .split("\r\n")
            .any(|field| field == "content-length: 0");
    if !bodiless {
        return None;
    }
    Some(closing_json_answer(status, "", message))
}

/// A whole answer written by hand (where no handler runs): `status` (code
/// and reason), `extra` header lines (each ending in CRLF), the JSON body
/// `{"error": message}`, and `connection: close`.
fn closing_json_answer(status: &str, extra: &str, message: &str) -> Vec<u8> {
    let body = format!(r#"{{"error":"{message}"}}"#);
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// How long a refused connection's request head is waited for, and how
/// long what follows the answer is read: a client that sends its request
/// at once gets its answer at once; an idle one holds a refusal this long.
const REFUSAL_READ: Duration = Duration::from_millis(500);

/// The first bytes of an HTTP/2 connection with prior knowledge
/// (`PRI * HTTP/2.0…`), which hyper's HTTP/1 server closes without a word.
const HTTP2_PREFACE: &[u8] = b"PRI ";

/// How a connection opens.
enum Opening {
    /// With the HTTP/2 preface.
    Http2,
    /// With anything else: hyper's HTTP/1 server takes it.
    Http1,
    /// With nothing: no byte came in time, or the client closed.
    Silent,
}

/// How the connection opens, peeked (nothing is consumed) for at most
/// `wait`. Decided on the first bytes that differ from the preface, so an
/// HTTP/1.1 request is handed on as soon as its first byte arrives.
async fn opening(stream: &TcpStream, wait: Duration) -> Opening {
    let mut first = [0u8; HTTP2_PREFACE.len()];
    let peeked = tokio::time::timeout(wait, async {
        loop {
            match stream.peek(&mut first).await {
                Ok(0) | Err(_) => return Opening::Silent,
                Ok(n) if first[..n] != HTTP2_PREFACE[..n] => return Opening::Http1,
                Ok(n) if n == HTTP2_PREFACE.len() => return Opening::Http2,
                // A prefix of the preface so far: wait for the rest.
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await;
    peeked.unwrap_or(Opening::Silent)
}

/// Answers a connection over `max_connections`: 503 with `Retry-After` and
/// the usual JSON body, then closes it.
async fn refuse(stream: TcpStream, retry_after_secs: u64) {
    let answer = closing_json_answer(
        "503 Service Unavailable",
        &format!("retry-after: {retry_after_secs}\r\n"),
        "too many open connections, retry later",
    );
    answer_and_close(stream, &answer).await;
}

/// Writes `answer` on a connection no handler serves and closes it. The
/// request's head is read first (for at most [`REFUSAL_READ`]) and what
/// follows the answer is read and dropped: closing a socket with unread
/// bytes resets the connection, and the client would never read the answer.
async fn answer_and_close(mut stream: TcpStream, answer: &[u8]) {
    let mut buffer = [0u8; 4096];
    let mut head = Vec::new();
    let _ = tokio::time::timeout(REFUSAL_READ, async {
        while let Ok(n @ 1..) = stream.read(&mut buffer).await {
            head.extend_from_slice(&buffer[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.len() > 64 * 1024 {
                break;
            }
        }
    })
    .await;
    let _ = tokio::time::timeout(REFUSAL_READ, async {
        let _ = stream.write_all(answer).await;
        let _ = stream.shutdown().await;
        while stream.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves a one-route router on a loopback port until the test ends.
    async fn serving() -> std::net::SocketAddr {
        serving_with(Duration::from_secs(2)).await
    }

    /// [`serving`] closing idle connections after `header_read_timeout`;
    /// at most 8 open.
    async fn serving_with(header_read_timeout: Duration) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let router = axum::Router::new().route("/ok", axum::routing::get(|| async { "ok" }));
        let limits = ConnectionLimits {
            header_read_timeout,
            max_connections: 8,
            shutdown_timeout: Duration::from_secs(1),
            retry_after_secs: 7,
        };
        tokio::spawn(serve(listener, router, limits, std::future::pending()));
        address
    }

    async fn exchange(address: std::net::SocketAddr, request: Vec<u8>) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        let _ = stream.write_all(&request).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[test]
    fn only_bodiless_4xx_heads_are_rewritten() {
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 24\r\n\r\n";
        assert_eq!(json_error_answer(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(json_error_answer(ok), None);
        let pipelined = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            json_error_answer(pipelined),
            None,
            "two answers in one buffer"
        );
        assert_eq!(json_error_answer(b"HTTP/1.1 400 X\r\nab"), None);
        let hypers = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let answer = String::from_utf8(json_error_answer(hypers).unwrap()).unwrap();
        assert!(
            answer.ends_with(r#"{"error":"request headers too large"}"#),
            "{answer}"
        );
    }

    #[tokio::test]
    async fn requests_hyper_refuses_get_json_bodies() {
        let address = serving().await;
        let big_header = [
            b"GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec(),
            vec![b'a'; 600_000],
            b"\r\n\r\n".to_vec(),
        ]
        .concat();
        let long_uri = [
            b"GET /".to_vec(),
            vec![b'a'; 70_000],
            b" HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ]
        .concat();
        for (request, status) in [
            (big_header, "431"),
            (b"NOT HTTP AT ALL\r\n\r\n".to_vec(), "400"),
            (long_uri, "414"),
        ] {
            let answer = exchange(address, request).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "{answer}"
            );
            assert!(
                answer.contains("content-type: application/json"),
                "{answer}"
            );
            let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert!(json["error"].is_string(), "{answer}");
        }
    }

    /// The JSON error body of an answer, asserting the head says JSON.
    fn json_body(answer: &str) -> serde_json::Value {
        assert!(
            answer.contains("content-type: application/json"),
            "{answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer}"))
    }

    #[tokio::test]
    async fn an_http2_preface_gets_the_json_400_not_a_closed_connection() {
        let address = serving().await;
        for request in [
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            // The preface and the client's first SETTINGS frame, as curl
            // --http2-prior-knowledge sends them.
            [
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(),
                &[0, 0, 0, 4, 0, 0, 0, 0, 0],
            ]
            .concat(),
        ] {
            let answer = exchange(address, request).await;
            assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
            assert_eq!(json_body(&answer)["error"], "malformed HTTP request");
        }
        let fine = exchange(
            address,
            b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
        )
        .await;
        assert!(fine.starts_with("HTTP/1.1 200"), "{fine}");
    }

    /// Every connection past the cap gets the JSON 503, however many idle
    /// ones hold the cap and the refusals: none is reset unanswered and
    /// none is let in while the cap is held.
    #[tokio::test]
    async fn every_request_past_max_connections_gets_the_json_503() {
        let address = serving_with(Duration::from_secs(20)).await;
        let mut held = Vec::new();
        for _ in 0..8 + REFUSALS + 10 {
            held.push(TcpStream::connect(address).await.unwrap());
        }
        // Let the server accept them all (the cap, then the refusals).
        tokio::time::sleep(Duration::from_millis(300)).await;
        for _ in 0..3 {
            let answer = exchange(
                address,
                b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
            assert!(answer.contains("retry-after: 7"), "{answer}");
            assert!(json_body(&answer)["error"].is_string());
        }
        drop(held);
    }
}
