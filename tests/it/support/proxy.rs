//! A TCP proxy a test can cut, in front of a server of the test's (a
//! broker, the registry): what a crashed server or a network partition
//! looks like to posbridge. `cut` drops every connection and refuses new
//! ones until `heal`. Optionally it terminates TLS (for tansu, which has
//! none of its own).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// A running proxy on a loopback port.
pub struct CutProxy {
    port: u16,
    open: Arc<AtomicBool>,
    cut: watch::Sender<u64>,
}

impl CutProxy {
    /// Forwards a free loopback port to `upstream_port`, presenting
    /// `tls`'s certificate when given.
    pub async fn start(upstream_port: u16, tls: Option<tokio_native_tls::TlsAcceptor>) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = Arc::new(AtomicBool::new(true));
        let (cut, cuts) = watch::channel(0u64);
        tokio::spawn(proxy(listener, upstream_port, open.clone(), cuts, tls));
        CutProxy { port, open, cut }
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
}

async fn proxy(
    listener: tokio::net::TcpListener,
    upstream_port: u16,
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
