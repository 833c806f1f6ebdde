//! The limit server: the least any bridge must do per webhook, so the most
//! it can reach on a given broker. It verifies the HMAC over the raw bytes,
//! parses the JSON, produces one record with the same idempotent `acks=all`
//! producer settings as posbridge (the same topics, partitions, key, five
//! string headers and a value as long as posbridge's) and answers 200 once
//! the broker acknowledged it. Nothing else: no ledger, no dedup, no guard,
//! no schema, no metrics.
//!
//! With [`LimitKind::VerifyOnly`] it answers right after verify + parse: the
//! limit of the duplicate path, where posbridge also produces nothing. With
//! [`LimitKind::Dedup`] it is the **dedup limit**: before the produce, the
//! delivery id is inserted if absent into a durable store, and the insert is
//! on disk before the answer: the least any bridge that drops duplicates
//! across restarts must do. The store is the cheapest durable one there is:
//! an in-memory set and an append-only file, group-committed (every id that
//! arrived while the last `fdatasync` ran is written and synced by the next
//! one, as posbridge's ledger journal does). A known id is answered 200
//! without producing.

use std::collections::HashSet;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use hmac::{Hmac, KeyInit, Mac};
use posbridge::config::{Config, KafkaConfig};
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use sha2::Sha256;

/// What posbridge's sale record adds to the webhook body: the normalized
/// fields around the raw body in the Avro value (measured on the bench's
/// body by normalizing and encoding it: 346 bytes of body, 548 of value).
pub const VALUE_PADDING: usize = 202;

/// The limit server's settings, passed on its command line by the bench.
pub struct LimitSettings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic the sales go to (created beforehand with posbridge's layout).
    pub topic: String,
    /// The webhook secret.
    pub secret: String,
    /// What it does per request.
    pub kind: LimitKind,
    /// librdkafka properties given to posbridge as well.
    pub librdkafka: Vec<(String, String)>,
}

/// What the limit server does per request, beyond verify + parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// Nothing more: the duplicate path's limit.
    VerifyOnly,
    /// One produce, awaiting the ack: the bare limit.
    Produce,
    /// A durable insert-if-absent of the delivery id, then the produce.
    Dedup,
}

impl LimitKind {
    /// Its name on the limit server's command line.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::VerifyOnly => "verify",
            LimitKind::Produce => "produce",
            LimitKind::Dedup => "dedup",
        }
    }

    /// The kind a command line names.
    pub fn parse(name: &str) -> LimitKind {
        match name {
            "verify" => LimitKind::VerifyOnly,
            "produce" => LimitKind::Produce,
            "dedup" => LimitKind::Dedup,
            other => panic!("limit kind verify|produce|dedup, not {other}"),
        }
    }
}

struct Limit {
    producer: FutureProducer,
    topic: String,
    secret: Vec<u8>,
    kind: LimitKind,
    /// The dedup store's writer (with [`LimitKind::Dedup`]).
    dedup: Option<mpsc::Sender<Insert>>,
}

/// One insert-if-absent: the id, and where to say whether it was new once
/// it is durable.
type Insert = (String, tokio::sync::oneshot::Sender<bool>);

/// Starts the dedup store's writer thread on a file in `dir`: it takes
/// every insert waiting, appends the new ids, syncs once, then answers them.
fn dedup_store(dir: &std::path::Path) -> mpsc::Sender<Insert> {
    let (send, inserts) = mpsc::channel::<Insert>();
    let mut file = std::fs::File::create(dir.join("delivery-ids")).expect("dedup file");
    std::thread::spawn(move || {
        let mut seen = HashSet::new();
        let mut batch = Vec::new();
        let mut bytes = Vec::new();
        while let Ok(first) = inserts.recv() {
            batch.push(first);
            batch.extend(inserts.try_iter());
            let fresh: Vec<bool> = batch
                .iter()
                .map(|(id, _)| {
                    let new = seen.insert(id.clone());
                    if new {
                        bytes.extend_from_slice(id.as_bytes());
                        bytes.push(b'\n');
                    }
                    new
                })
                .collect();
            if !bytes.is_empty() {
                file.write_all(&bytes).expect("dedup append");
                file.sync_data().expect("dedup sync");
                bytes.clear();
            }
            for ((_, answer), new) in batch.drain(..).zip(fresh) {
                let _ = answer.send(new);
            }
        }
    });
    send
}

/// Serves until killed.
pub async fn serve(settings: LimitSettings) {
    // posbridge's own producer settings with its defaults: the same
    // idempotence, acks, partitioner, deadline and record size limit.
    let kafka = KafkaConfig {
        brokers: settings.brokers.clone(),
        ..KafkaConfig::default()
    };
    let mut client = ClientConfig::new();
    for (key, value) in &settings.librdkafka {
        client.set(key, value);
    }
    for (key, value) in kafka.fixed_producer_properties() {
        client.set(key, value);
    }
    client.set(
        "message.max.bytes",
        Config::default().max_record_bytes().to_string(),
    );
    // Kept for the process's life: the dedup store's file is in it.
    let dir = tempfile::tempdir().expect("limit dir");
    let limit = Arc::new(Limit {
        producer: client.create().expect("limit producer"),
        topic: settings.topic,
        secret: settings.secret.into_bytes(),
        kind: settings.kind,
        dedup: (settings.kind == LimitKind::Dedup).then(|| dedup_store(dir.path())),
    });
    let app = Router::new()
        .route("/webhooks/receiptroller/main", post(handle))
        .with_state(limit);
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .expect("limit listen");
    axum::serve(listener, app).await.expect("limit serve");
}

async fn handle(State(limit): State<Arc<Limit>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let Some(signature) = headers
        .get("x-rr-signature")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("sha256="))
        .and_then(|v| hex::decode(v).ok())
    else {
        return StatusCode::UNAUTHORIZED;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(&limit.secret).expect("any key length");
    mac.update(&body);
    if mac.verify_slice(&signature).is_err() {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return StatusCode::BAD_REQUEST;
    };
    if limit.kind == LimitKind::VerifyOnly {
        return StatusCode::OK;
    }
    if let Some(store) = &limit.dedup {
        let Some(id) = headers.get("x-rr-delivery").and_then(|v| v.to_str().ok()) else {
            return StatusCode::BAD_REQUEST;
        };
        let (answer, new) = tokio::sync::oneshot::channel();
        store.send((id.to_owned(), answer)).expect("dedup writer");
        match new.await {
            Ok(true) => {}
            Ok(false) => return StatusCode::OK,
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
        }
    }
    let field = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let key = field(&json["data"]["id"]);
    let delivery = field(&json["id"]);
    let event_type = field(&json["type"]);
    let mut value = Vec::with_capacity(body.len() + VALUE_PADDING);
    value.extend_from_slice(&body);
    value.resize(body.len() + VALUE_PADDING, 0);
    let headers = [
        ("posbridge-delivery-id", delivery.as_str()),
        ("posbridge-provider", "receiptroller"),
        ("posbridge-event-type", event_type.as_str()),
        ("posbridge-source", "main"),
        ("posbridge-origin", "webhook"),
    ]
    .into_iter()
    .fold(OwnedHeaders::new_with_capacity(5), |h, (key, value)| {
        h.insert(Header {
            key,
            value: Some(value),
        })
    });
    let record = FutureRecord::to(&limit.topic)
        .key(key.as_bytes())
        .payload(&value)
        .headers(headers);
    match limit.producer.send(record, Timeout::Never).await {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}
