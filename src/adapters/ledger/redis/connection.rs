//! The connection of the Redis ledger: one server or a Redis Cluster,
//! opened with time limits, and what an error may say of the server's URL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::super::LedgerError;

/// A connection to one server or to a cluster; both reconnect by themselves
/// and commands wait for them.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server.
    Single(ConnectionManager),
    /// A Redis Cluster: each command goes to the master of its keys' slot,
    /// following `MOVED`/`ASK` and the new slot map after a failover.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A [`Connection`] that counts the errors after which it reconnects: the
/// first command after a Redis restarted (or a failover on one address)
/// fails so, and the command after it reaches the new server. The count is
/// taken in the same poll as the error, before the caller sees it, so a
/// decision that began after the reconnect finds it changed.
#[derive(Clone)]
pub(super) struct Counted {
    /// One server or a cluster.
    pub(super) link: Connection,
    /// Connection errors so far.
    drops: Arc<AtomicU64>,
}

impl Counted {
    pub(super) fn new(link: Connection) -> Counted {
        Counted {
            link,
            drops: Arc::default(),
        }
    }

    /// Whether this is one server (whose scripts may touch keys of any slot).
    pub(super) fn is_single(&self) -> bool {
        matches!(self.link, Connection::Single(_))
    }

    /// How many commands failed for the connection so far.
    pub(super) fn drops(&self) -> u64 {
        self.drops.load(Ordering::Acquire)
    }

    /// Counts `result` when it is a connection's failure.
    fn saw<T>(drops: &AtomicU64, result: &redis::RedisResult<T>) {
        if let Err(error) = result
            && is_connection_error(error)
        {
            drops.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Whether an error means the connection (not the command) failed: the
/// server may be another one when it answers again.
pub(super) fn is_connection_error(error: &redis::RedisError) -> bool {
    error.is_unrecoverable_error()
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
}

impl ConnectionLike for Counted {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let drops = &self.drops;
        let sent = self.link.req_packed_command(cmd);
        Box::pin(async move {
            let answer = sent.await;
            Counted::saw(drops, &answer);
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let drops = &self.drops;
        let sent = self.link.req_packed_commands(pipeline, offset, count);
        Box::pin(async move {
            let answer = sent.await;
            Counted::saw(drops, &answer);
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.link.get_db()
    }
}

/// `url` (one node's, or a comma-separated list) as said in an error: its
/// passwords replaced, since the error reaches logs and start-up output.
pub(super) fn without_password(url: &str) -> String {
    url.split(',')
        .map(|node| match url::Url::parse(node.trim()) {
            Ok(mut parsed) if parsed.password().is_some() => {
                let _ = parsed.set_password(Some("***"));
                parsed.to_string()
            }
            _ => node.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Every string in a reply, one after another: `INFO` answers one text
/// from one server and a map of texts from a cluster's masters.
pub(super) fn collect_text(value: &Value, text: &mut String) {
    match value {
        Value::BulkString(bytes) => text.push_str(&String::from_utf8_lossy(bytes)),
        Value::SimpleString(s) => text.push_str(s),
        Value::VerbatimString { text: s, .. } => text.push_str(s),
        Value::Array(values) | Value::Set(values) => {
            for value in values {
                collect_text(value, text);
            }
        }
        Value::Map(pairs) => {
            for (_, value) in pairs {
                collect_text(value, text);
            }
        }
        _ => {}
    }
    text.push('\n');
}

/// Why a Redis Cluster could not be used.
#[derive(Debug, thiserror::Error)]
enum ClusterError {
    /// redis-rs's cluster client takes a CA only with rustls; posbridge's
    /// Redis TLS is native-tls (the same OpenSSL as its Kafka TLS).
    #[error(
        "ledger.redis_ca_file cannot be used with a Redis Cluster: its nodes are verified against the system's trust store only; add the CA there and remove redis_ca_file"
    )]
    CaFile,
}

/// How long to wait for a node to connect or answer: a command against a
/// server that is gone fails (the delivery is answered 503) instead of hanging.
const TIMEOUT: Duration = Duration::from_secs(3);

/// One server's client: `rediss://` uses the system's trust store, or
/// `ca_file` when given.
pub(super) fn single_client(
    url: &str,
    ca_file: Option<&std::path::Path>,
) -> Result<redis::Client, LedgerError> {
    let open_error = |e: redis::RedisError| LedgerError::Open {
        path: without_password(url),
        source: Box::new(e),
    };
    match ca_file {
        None => redis::Client::open(url).map_err(open_error),
        Some(path) => {
            let root_cert = std::fs::read(path).map_err(|e| LedgerError::Open {
                path: path.display().to_string(),
                source: Box::new(e),
            })?;
            redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            )
            .map_err(open_error)
        }
    }
}

/// One server's connection, from its client ([`single_client`]) at `url`.
pub(super) async fn connect_single(
    client: redis::Client,
    url: &str,
) -> Result<ConnectionManager, LedgerError> {
    let open_error = |e: redis::RedisError| LedgerError::Open {
        path: without_password(url),
        source: Box::new(e),
    };
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(TIMEOUT))
        .set_response_timeout(Some(TIMEOUT))
        .set_number_of_retries(2);
    tokio::time::timeout(
        Duration::from_secs(10),
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| LedgerError::Open {
        path: url.to_owned(),
        source: "no answer within 10 s".into(),
    })?
    .map_err(open_error)
}

/// Whether a server is a node of a Redis Cluster. A server that refuses
/// `INFO` (some managed ones restrict it) is taken for one server: a
/// cluster node always answers it.
pub(super) async fn is_cluster_node(mut conn: ConnectionManager) -> bool {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut conn)
        .await;
    info.is_ok_and(|info| info.lines().any(|line| line.trim() == "cluster_enabled:1"))
}

/// A Redis Cluster from its seed nodes; the client asks them for the slot
/// map and every other node.
pub(super) async fn connect_cluster(
    nodes: &[&str],
    ca_file: Option<&std::path::Path>,
) -> Result<ClusterConnection, LedgerError> {
    let path = without_password(&nodes.join(","));
    if ca_file.is_some() {
        return Err(LedgerError::Open {
            path,
            source: Box::new(ClusterError::CaFile),
        });
    }
    let open_error = |e: redis::RedisError| LedgerError::Open {
        path: path.clone(),
        source: Box::new(e),
    };
    let client = ClusterClient::builder(nodes.iter().copied())
        .connection_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .build()
        .map_err(open_error)?;
    tokio::time::timeout(Duration::from_secs(10), client.get_async_connection())
        .await
        .map_err(|_| LedgerError::Open {
            path: path.clone(),
            source: "no answer within 10 s".into(),
        })?
        .map_err(open_error)
}
