//! The load generator, the same for every server: signed ReceiptRoller
//! `sale.created` deliveries over keep-alive HTTP/1.1 connections, either a
//! closed loop (each connection sends its next request when the last is
//! answered) or a fixed rate (requests due on a schedule; a request's latency
//! counts from when it was due, so a server that falls behind is charged for
//! the wait).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use crate::percentile::percentile;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use posbridge::domain::verify::SchemeName;
use posbridge::domain::verify::sign;

/// The webhook secret both servers are configured with.
pub const SECRET: &str = "bench-secret-1";

/// What a server expects beside the delivery and answers once it took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// posbridge and the limits: the signed delivery, answered 200.
    Bridge,
    /// A peer such as Apache Camel's HTTP→Kafka route: it keys its record by
    /// an `Idempotency-Key` header (the delivery id here, so its records
    /// spread over the partitions as the limit's do, and the compacted topic
    /// takes them) and answers 202 after the broker's ack.
    Peer,
    /// posbridge with sources `s0`, `s1`, … (a sources directory):
    /// delivery `{prefix}-{n}` goes to source `s{first + n % count}`.
    Spread {
        /// The first source sent to.
        first: usize,
        /// How many sources, from `first` on.
        count: usize,
    },
}

impl Dialect {
    fn accepted(self) -> hyper::StatusCode {
        match self {
            Dialect::Bridge | Dialect::Spread { .. } => hyper::StatusCode::OK,
            Dialect::Peer => hyper::StatusCode::ACCEPTED,
        }
    }
}

/// How requests are sent.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// `connections` connections, each sending as soon as answered.
    Closed {
        /// Connections.
        connections: usize,
    },
    /// Each delivery of a [`Ids::Replay`] list once, on `connections` connections.
    Once {
        /// Connections.
        connections: usize,
    },
    /// `per_second` requests a second on `connections` connections.
    Fixed {
        /// Target rate.
        per_second: f64,
        /// Connections available to the schedule.
        connections: usize,
    },
}

impl Load {
    /// How many connections it keeps open.
    pub fn connections(self) -> usize {
        match self {
            Load::Closed { connections }
            | Load::Once { connections }
            | Load::Fixed { connections, .. } => connections,
        }
    }
}

/// Which deliveries are sent.
#[derive(Debug, Clone)]
pub enum Ids {
    /// Every request a new delivery of a new entity: `{prefix}-{n}`.
    Fresh(String),
    /// The same deliveries again, round robin (all answered before).
    Replay(Arc<Vec<String>>),
}

impl Ids {
    fn len(&self) -> usize {
        match self {
            Ids::Fresh(_) => usize::MAX,
            Ids::Replay(ids) => ids.len(),
        }
    }

    fn get(&self, n: usize) -> String {
        match self {
            Ids::Fresh(prefix) => format!("{prefix}-{n}"),
            Ids::Replay(ids) => ids[n % ids.len()].clone(),
        }
    }
}

/// When the requests are due.
#[derive(Debug, Clone, Copy)]
enum Schedule {
    /// As fast as answered, until then.
    Until(Instant),
    /// Request `n` at `start + n × interval`, `total` of them.
    Rate {
        start: Instant,
        interval: Duration,
        total: usize,
    },
    /// As fast as answered, this many.
    Count(usize),
}

impl Schedule {
    /// When request `n` is due (after waiting for it) and `n`; `None` once
    /// the schedule is over.
    async fn due(self, n: usize) -> Option<(Instant, usize)> {
        match self {
            Schedule::Until(end) => (Instant::now() < end).then(|| (Instant::now(), n)),
            Schedule::Count(total) => (n < total).then(|| (Instant::now(), n)),
            Schedule::Rate {
                start,
                interval,
                total,
            } => {
                if n >= total {
                    return None;
                }
                let due = start + interval.mul_f64(n as f64);
                tokio::time::sleep_until(due.into()).await;
                Some((due, n))
            }
        }
    }
}

/// What one phase measured on the client side.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Answers received.
    pub requests: usize,
    /// Answers other than the server's [`Dialect`] takes a delivery with.
    pub errors: usize,
    /// Of `errors`, connections that broke instead of answering (each
    /// connection's loop ends there): closed by the server, or reset.
    pub broken: usize,
    /// Wall time of the phase.
    pub elapsed: Duration,
    /// Latency percentiles.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// For a fixed rate: how far the last answer came after the schedule's end.
    pub behind: Duration,
    /// The five slowest answers: when each was due (from the phase's
    /// start) and its latency, slowest first.
    pub slowest: Vec<(Duration, Duration)>,
    /// Every answer's latency, fastest first: phases pooled.
    pub latencies: Vec<Duration>,
}

impl Measured {
    /// Answers a second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// The signed request of delivery `id`, in `dialect`.
pub fn request(addr: SocketAddr, dialect: Dialect, id: &str) -> hyper::Request<Full<Bytes>> {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": id, "type": "sale.created",
        "timestamp": "2026-11-29T10:15:30.123Z", "webhook_id": "wh_1",
        "data": {"id": format!("T1|2026-11|{id}"), "terminal_id": "T1", "store_id": "S1",
                 "currency": "JPY", "sub_total": 1000, "tax_total": 100, "grand_total": 1100,
                 "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
    }))
    .expect("json");
    let path = match dialect {
        Dialect::Spread { first, count } => {
            let n: usize = id
                .rsplit('-')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            format!("/webhooks/receiptroller/s{}", first + n % count.max(1))
        }
        Dialect::Bridge | Dialect::Peer => "/webhooks/receiptroller/main".to_owned(),
    };
    let mut builder = hyper::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("x-rr-delivery", id);
    if dialect == Dialect::Peer {
        builder = builder.header("idempotency-key", id);
    }
    for (name, value) in sign(SchemeName::Hex, "X-RR-Signature", SECRET, "", 0, &body) {
        builder = builder.header(name, value);
    }
    builder.body(Full::new(Bytes::from(body))).expect("request")
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

/// Sends one request and reads the whole answer: whether it was
/// `accepted`, `None` when the connection broke (a server killed under
/// load, as `scripts/bench rebuild` does).
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    request: hyper::Request<Full<Bytes>>,
    accepted: hyper::StatusCode,
) -> Option<bool> {
    sender.ready().await.ok()?;
    let response = sender.send_request(request).await.ok()?;
    let ok = response.status() == accepted;
    response.into_body().collect().await.ok()?;
    Some(ok)
}

/// Runs `load` against `addr`, which speaks `dialect`, for `duration`
/// (closed loop), for `duration`'s worth of scheduled requests (fixed
/// rate), or once per id.
pub async fn run(
    addr: SocketAddr,
    dialect: Dialect,
    load: Load,
    ids: Ids,
    duration: Duration,
) -> Measured {
    run_spread(&[addr], dialect, load, ids, duration).await
}

/// [`run`] against several replicas of one server: connection `i` goes to
/// `addrs[i % len]`, as a Kubernetes Service spreads connections (not
/// requests), and the requests follow the connections.
pub async fn run_spread(
    addrs: &[SocketAddr],
    dialect: Dialect,
    load: Load,
    ids: Ids,
    duration: Duration,
) -> Measured {
    let connected = connect_spread(addrs, load.connections()).await;
    run_connected(connected, dialect, load, ids, duration).await
}

/// Connections opened before a phase starts, for two loads to start at
/// once without either's connecting inside the other's phase.
pub struct Connected(Vec<(SocketAddr, SendRequest<Full<Bytes>>)>);

/// `connections` connections, connection `i` to `addrs[i % len]`.
pub async fn connect_spread(addrs: &[SocketAddr], connections: usize) -> Connected {
    let mut senders = Vec::new();
    for i in 0..connections {
        let addr = addrs[i % addrs.len()];
        senders.push((addr, connect(addr).await));
    }
    Connected(senders)
}

/// [`run_spread`] over connections opened already (`load`'s count of them).
pub async fn run_connected(
    Connected(senders): Connected,
    dialect: Dialect,
    load: Load,
    ids: Ids,
    duration: Duration,
) -> Measured {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let schedule = match load {
        Load::Fixed { per_second, .. } => Schedule::Rate {
            start: started,
            interval: Duration::from_secs_f64(1.0 / per_second),
            total: (per_second * duration.as_secs_f64()) as usize,
        },
        Load::Closed { .. } => Schedule::Until(started + duration),
        Load::Once { .. } => Schedule::Count(ids.len()),
    };
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|(addr, mut sender)| {
            let next = next.clone();
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0;
                let mut broken = 0;
                while let Some(due) = schedule.due(next.fetch_add(1, Ordering::Relaxed)).await {
                    let request = request(addr, dialect, &ids.get(due.1));
                    let answer = send(&mut sender, request, dialect.accepted()).await;
                    latencies.push((due.0.elapsed(), due.0 - started));
                    if answer != Some(true) {
                        errors += 1;
                    }
                    if answer.is_none() {
                        broken += 1;
                        break;
                    }
                }
                (latencies, errors, broken)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut broken = 0;
    for task in tasks {
        let (mine, my_errors, my_broken) = task.await.expect("load task");
        latencies.extend(mine);
        errors += my_errors;
        broken += my_broken;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let slowest = latencies
        .iter()
        .rev()
        .take(5)
        .copied()
        .map(|(l, at)| (at, l))
        .collect();
    let latencies: Vec<Duration> = latencies.into_iter().map(|(latency, _)| latency).collect();
    Measured {
        requests: latencies.len(),
        errors,
        broken,
        elapsed,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        behind: match schedule {
            Schedule::Rate { .. } => elapsed.saturating_sub(duration),
            Schedule::Until(_) | Schedule::Count(_) => Duration::ZERO,
        },
        slowest,
        latencies,
    }
}
