//! The accept loop: HTTP/1.1 connections with bounds a hostile or broken
//! client cannot stretch.
//!
//! `axum::serve` has no read timeouts and no connection limit, so a few
//! hundred slow or idle clients could hold memory and file descriptors and
//! keep shutdown waiting. Here every connection is served by hyper with a
//! header read timeout (which also closes kept-alive connections that sit
//! idle), the number of open connections is capped (one more is answered 503
//! and closed), and shutdown waits for open connections at most
//! `shutdown_timeout_ms`, then closes them. Body read timeouts and the cap on
//! body bytes in flight live in the webhook handler, which knows the body.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

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

/// How long accepting pauses after the listener fails (e.g. out of file
/// descriptors), so the loop does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `shutdown` resolves.
///
/// # Errors
/// None today; the signature keeps room for a listener that cannot go on.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
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
            connections.spawn(refuse(stream, limits.retry_after_secs));
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        connections.spawn(async move {
            if let Err(error) = connection.await {
                debug!(%error, "Connection ended with an error.");
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

/// Answers a connection over `max_connections` without reading its request:
/// 503 with `Retry-After` and the usual JSON body, then closes it. What the
/// client already sent is read and dropped first, so closing does not reset
/// the connection before the client reads the answer.
async fn refuse(mut stream: TcpStream, retry_after_secs: u64) {
    let body = r#"{"error":"too many open connections, retry later"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {retry_after_secs}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await.is_ok_and(|n| n > 0) {}
    })
    .await;
}
