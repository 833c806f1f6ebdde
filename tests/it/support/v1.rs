//! What an older build wrote for a Mekari product's webhook: its record in
//! schema v1 (which has no product name, SKU, price or state), single-object
//! framed, with the headers it wrote and a made-up state hash (a ledger
//! takes it from the header). Shared by `tests/it/rederive.rs` and
//! `scripts/bench rederive`.

use std::sync::LazyLock;

use apache_avro::types::Value as Avro;
use rdkafka::message::{Header, OwnedHeaders};
use serde_json::{Value, json};

/// The v1 schema's single-object fingerprint, as its records carry it.
const V1_FINGERPRINT: [u8; 8] = [0xec, 0xb1, 0xa1, 0x63, 0x4e, 0x29, 0x3f, 0xf8];

/// Schema v1, parsed once (a million records are written with it in the
/// bench).
static SCHEMA: LazyLock<apache_avro::Schema> = LazyLock::new(|| {
    apache_avro::Schema::parse_str(include_str!("../../../schemas/history/pos_event.v1.avsc"))
        .expect("v1 parses")
});

/// The webhook body of Mekari product `id` (named `name`) created at `at`.
pub fn product_created(delivery: &str, id: &str, name: &str, at: &str) -> Value {
    json!({"id": delivery, "event": "product.created", "occurred_at": at,
        "data": {"id": id, "sku": format!("SKU-{id}"), "name": name, "price": 18000,
                 "currency": "IDR", "status": "active"}})
}

/// The record v1 wrote for `body` (a product's webhook), versioned at
/// `micros`, single-object framed: its key, value and headers.
pub fn product_record(body: &Value, micros: i64) -> (String, Vec<u8>, OwnedHeaders) {
    product_record_framed(body, micros, [&[0xC3, 0x01][..], &V1_FINGERPRINT].concat())
}

/// [`product_record`] with its event time `off` microseconds from its
/// version (as a time-zone bug writes it) and `state_hash` (32 hex digits)
/// in its header: the hash today's code gives the state, which leaves the
/// event time out.
pub fn product_record_misdated(
    body: &Value,
    micros: i64,
    off: i64,
    state_hash: &str,
) -> (String, Vec<u8>, OwnedHeaders) {
    let frame = [&[0xC3, 0x01][..], &V1_FINGERPRINT].concat();
    let (key, value, headers) = encode(body, (micros, micros + off), frame);
    (key, value, headers(state_hash.to_owned()))
}

/// [`product_record`], its value after `frame` (the Confluent wire format's
/// magic byte and schema id, where a registry is used).
pub fn product_record_framed(
    body: &Value,
    micros: i64,
    frame: Vec<u8>,
) -> (String, Vec<u8>, OwnedHeaders) {
    let (key, value, headers) = encode(body, (micros, micros), frame);
    (key, value, headers(format!("{micros:032x}")))
}

/// The key and value of `body`'s record at (version, event time), and its
/// headers given a state hash.
fn encode(
    body: &Value,
    (micros, occurred): (i64, i64),
    frame: Vec<u8>,
) -> (String, Vec<u8>, impl FnOnce(String) -> OwnedHeaders) {
    let id = body["data"]["id"].as_str().expect("a product id");
    let delivery = body["id"].as_str().expect("a delivery id");
    let some = |v: Avro| Avro::Union(1, Box::new(v));
    let none = || Avro::Union(0, Box::new(Avro::Null));
    let record = Avro::Record(vec![
        ("event_id".into(), Avro::String(delivery.into())),
        ("provider".into(), Avro::Enum(1, "MEKARI".into())),
        ("source".into(), Avro::String("main".into())),
        ("account".into(), none()),
        ("entity_type".into(), Avro::Enum(5, "PRODUCT".into())),
        ("entity_id".into(), Avro::String(id.into())),
        ("event_type".into(), Avro::String("product.created".into())),
        ("occurred_at".into(), Avro::TimestampMicros(occurred)),
        ("version_at".into(), Avro::TimestampMicros(micros)),
        ("version_rank".into(), Avro::Int(0)),
        ("received_at".into(), Avro::TimestampMicros(micros)),
        ("origin".into(), Avro::Enum(0, "WEBHOOK".into())),
        ("outlet_id".into(), none()),
        ("store_id".into(), none()),
        ("terminal_id".into(), none()),
        ("currency".into(), some(Avro::String("IDR".into()))),
        ("subtotal".into(), none()),
        ("tax".into(), none()),
        ("total".into(), none()),
        ("status".into(), some(Avro::String("active".into()))),
        ("kitchen_status".into(), none()),
        ("items".into(), Avro::Array(vec![])),
        ("raw".into(), Avro::String(body.to_string())),
    ]);
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(&SCHEMA)
        .build()
        .expect("a v1 writer");
    let mut value = frame;
    writer.write_value(&mut value, record).expect("a v1 datum");
    let delivery = delivery.to_owned();
    let headers = move |state_hash: String| {
        [
            ("posbridge-delivery-id", delivery),
            ("posbridge-provider", "mekari".to_owned()),
            ("posbridge-event-type", "product.created".to_owned()),
            ("posbridge-source", "main".to_owned()),
            ("posbridge-origin", "webhook".to_owned()),
            ("posbridge-version", format!("{micros}:0")),
            ("posbridge-state-hash", state_hash),
        ]
        .into_iter()
        .fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: Some(&value),
            })
        })
    };
    (format!("mekari:{id}"), value, headers)
}
