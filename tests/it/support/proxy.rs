//! A TCP proxy a test can cut, in front of a server of the test's (a
//! broker, the registry): what a crashed server or a network partition
//! looks like to posbridge. `cut` drops every connection and refuses new
//! ones until `heal`. `redirect` sends new connections to another server
//! and drops the old ones: a stable address that moves to a promoted
//! replica, as a managed Redis endpoint or a Sentinel-aware proxy does.
//! Optionally it terminates TLS (for tansu, which has none of its own).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};

use tokio::sync::watch;

/// A running proxy on a loopback port.
pub struct CutProxy {
    port: u16,
    open: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
    /// Where new connections go.
    upstream: Arc<AtomicU16>,
}

impl CutProxy {
    /// Forwards a free loopback port to `upstream_port`, presenting
    /// `tls`'s certificate when given.
    pub async fn start(upstream_port: u16, tls: Option<tokio_native_tls::TlsAcceptor>) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = watch::channel(0u64);
        let upstream = Arc::new(AtomicU16::new(upstream_port));
        tokio::spawn(proxy(listener, upstream.clone(), open.clone(), cuts, tls));
        CutProxy {
            port,
            open,
            cut,
            upstream,
        }
    }

    /// What clients connect to.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Accepts connections again.
    pub fn heal(&self) {
        self.open.store(true, Ordering::SeqCst);
    }

    /// Sends new connections to `upstream_port` and drops the old ones:
    /// clients reconnect to the other server at the same address.
    pub fn redirect(&self, upstream_port: u16) {
        self.upstream.store(upstream_port, Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }
}

async fn proxy(
    listener: tokio::net::TcpListener,
    upstream: Arc<AtomicU16>,
    open: Arc<AtomicBool>,
    cuts: watch::Receiver<u64>,
    tls: Option<tokio_native_tls::TlsAcceptor>,
) {
    while let Ok((client, _)) = listener.accept().await {
        if !open.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let mut cuts = cuts.clone();
        cuts.mark_unchanged();
        let tls = tls.clone();
        let upstream_port = upstream.load(Ordering::SeqCst);
        tokio::spawn(async move {
            let Ok(mut upstream) =
                tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
            else {
                return;
            };
            match tls {
                None => {
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cuts.changed() => {}
                    }
                }
                Some(acceptor) => {
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
                        _ = cuts.changed() => {}
                    }
                }
            }
        });
    }
}
