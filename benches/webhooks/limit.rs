//! The limit server: the least any bridge must do per webhook, so the most
//! it can reach on a given broker. It verifies the HMAC over the raw bytes,
//! parses the JSON, produces one record with the same idempotent `acks=all`
//! producer settings as posbridge (the same topics, partitions, key, five
//! string headers and a value as long as posbridge's) and answers 200 once
//! the broker acknowledged it. Nothing else: no ledger, no dedup, no guard,
//! no schema, no metrics.
//!
//! With `produce = false` it answers right after verify + parse: the limit
//! of the duplicate path, where posbridge also produces nothing.

use std::net::SocketAddr;
use std::sync::Arc;

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
    /// Whether to produce (false: the duplicate path's limit).
    pub produce: bool,
    /// librdkafka properties given to posbridge as well.
    pub librdkafka: Vec<(String, String)>,
}

struct Limit {
    producer: FutureProducer,
    topic: String,
    secret: Vec<u8>,
    produce: bool,
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
    let limit = Arc::new(Limit {
        producer: client.create().expect("limit producer"),
        topic: settings.topic,
        secret: settings.secret.into_bytes(),
        produce: settings.produce,
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
    if !limit.produce {
        return StatusCode::OK;
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
