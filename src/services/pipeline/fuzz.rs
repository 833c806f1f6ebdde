//! Property tests over verify → identify → normalize → encode, for both
//! providers, with arbitrary bytes, arbitrary JSON, valid events with
//! arbitrary fields replaced, and valid events with arbitrary amounts.
//!
//! Each case asserts: nothing panics; a signed body is either an event that
//! encodes and decodes back to itself, or a dead-letter reason (or, only when
//! the body's string `id` differs from the delivery id, a 400); an amount is
//! either exactly the decimal the JSON text wrote or refused, never rounded.
//!
//! `PROPTEST_CASES` sets the cases per property (256 by default, what
//! `scripts/test` runs); the long run is
//! `PROPTEST_CASES=20000 cargo test --release --lib pipeline::fuzz -- --nocapture`,
//! which prints how many cases each property ran.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use tokio::time::Instant;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::intake::{Envelope, identify};
use super::{Delivery, PipelineError};
use crate::adapters::encode::{Encoder, decode};
use crate::adapters::providers::{self, Context};
use crate::config::RegistryConfig;
use crate::domain::event::{Origin, ProviderKind, Source};
use crate::domain::secret::Secret;
use crate::domain::verify::{Verifier, sign};
use crate::observe::traces::DeliveryTrace;

const SECRET: &str = "fuzz-secret";

/// The single-object encoder (no registry), built once.
static ENCODER: LazyLock<Encoder> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(Encoder::new(&RegistryConfig::default(), &[]))
        .unwrap()
});

fn provider() -> impl Strategy<Value = ProviderKind> {
    prop_oneof![
        Just(ProviderKind::ReceiptRoller),
        Just(ProviderKind::Mekari)
    ]
}

/// Field names the normalizers read, so arbitrary objects hit real paths.
const KEYS: &[&str] = &[
    "id",
    "type",
    "event",
    "timestamp",
    "occurred_at",
    "data",
    "items",
    "total",
    "grand_total",
    "sub_total",
    "tax_total",
    "quantity",
    "unit_price",
    "price",
    "status",
    "currency",
    "sku",
    "name",
    "deleted",
    "store_id",
    "outlet_id",
    "transaction_at",
    "sold_at",
    "amount",
    "order_id",
    "product_ids",
    "x",
];

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        money().prop_map(|(text, _)| number_or_text(&text, true)),
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "sale.created",
            "sale.updated",
            "order.updated",
            "product.deleted",
            "2026-11-29T10:15:30Z",
            "2026-13-40T99:00:00Z",
            "",
        ])
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..8).prop_map(|pairs| {
                Value::Object(
                    pairs
                        .into_iter()
                        .map(|(k, v)| ((*k).to_owned(), v))
                        .collect(),
                )
            }),
        ]
    })
}

/// An amount as JSON text (sign, integer digits, fraction digits) and what
/// it must normalize to: `None` when `decimal(38,4)` cannot hold it exactly.
fn money() -> impl Strategy<Value = (String, Option<String>)> {
    (
        any::<bool>(),
        prop::collection::vec(0u8..10, 0..42),
        prop::option::of(prop::collection::vec(0u8..10, 1..8)),
    )
        .prop_map(|(negative, int, frac)| {
            let digits = |d: &[u8]| d.iter().map(|d| char::from(b'0' + d)).collect::<String>();
            let int = digits(&int);
            let int = match int.trim_start_matches('0') {
                "" => "0".to_owned(),
                stripped => stripped.to_owned(),
            };
            let frac = frac.map(|f| digits(&f)).unwrap_or_default();
            let text = format!(
                "{}{int}{}{frac}",
                if negative { "-" } else { "" },
                if frac.is_empty() { "" } else { "." }
            );
            (text, expected_decimal(negative, &int, &frac))
        })
}

/// The oracle: the exact value at scale 4, or `None` when it needs more
/// than 4 places or 38 digits.
fn expected_decimal(negative: bool, int: &str, frac: &str) -> Option<String> {
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    if frac.len() > 4 || int.len() > 34 {
        return None;
    }
    let zero = int.is_empty() && frac.is_empty();
    Some(format!(
        "{}{}.{frac:0<4}",
        if negative && !zero { "-" } else { "" },
        if int.is_empty() { "0" } else { int }
    ))
}

/// The amount as a JSON number with exactly this text, or as a string.
fn number_or_text(text: &str, as_number: bool) -> Value {
    if as_number {
        serde_json::from_str(text).unwrap()
    } else {
        Value::String(text.to_owned())
    }
}

/// A valid event of the provider, with its amount field's path.
fn valid_event(provider: ProviderKind, id: &str) -> (Value, &'static str) {
    match provider {
        ProviderKind::ReceiptRoller => (
            json!({
                "id": id, "type": "sale.created", "timestamp": "2026-11-29T10:15:30Z",
                "webhook_id": "wh_1",
                "data": {"id": "T1|2026-11|1", "terminal_id": "T001", "store_id": "S01",
                         "transaction_id": "000123", "transaction_type": 1,
                         "transaction_at": "2026-11-29T10:15:29Z", "currency": "JPY",
                         "sub_total": 455, "tax_total": 45, "grand_total": 500,
                         "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 250}]}
            }),
            "grand_total",
        ),
        ProviderKind::Mekari => (
            json!({
                "id": id, "event": "order.updated", "occurred_at": "2026-11-29T10:15:30Z",
                "outlet_id": "OUT-9",
                "data": {"id": "ORD-1", "outlet_id": "OUT-9", "status": "paid",
                         "kitchen_status": "done", "total": 51000.5, "currency": "IDR",
                         "sold_at": "2026-11-29T17:14:02+07:00", "items": []}
            }),
            "total",
        ),
    }
}

/// Replaces (or with `None`, removes) the value at one of the event's paths.
fn mutate(body: &mut Value, path: &[&str], value: Option<Value>) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = body;
    for key in parents {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(object) = at.as_object_mut() {
        match value {
            Some(value) => object.insert((*last).to_owned(), value),
            None => object.remove(*last),
        };
    }
}

const PATHS: &[&[&str]] = &[
    &["id"],
    &["type"],
    &["event"],
    &["timestamp"],
    &["occurred_at"],
    &["data"],
    &["data", "id"],
    &["data", "items"],
    &["data", "grand_total"],
    &["data", "total"],
    &["data", "transaction_at"],
    &["data", "sold_at"],
    &["data", "currency"],
    &["data", "status"],
    &["data", "transaction_type"],
    &["data", "sub_total"],
];

/// What became of one signed body.
#[derive(Debug)]
enum Fate {
    Event(Box<crate::domain::event::PosEvent>),
    DeadLetter(&'static str),
    Mismatch,
}

/// Signs `body` as the provider does, verifies it, and runs it down the line
/// as far as the broker. Panics where a property does not hold.
fn run(provider: ProviderKind, body: &[u8], delivery_id: &str) -> Fate {
    let adapter = providers::for_kind(provider);
    let scheme = adapter.default_scheme();
    let header = scheme.fixed_header().unwrap_or("x-signature");
    let secrets: Vec<Secret> = serde_json::from_value(json!([SECRET])).unwrap();
    let verifier = Verifier::new(scheme, header, &secrets, 300).unwrap();
    let mut headers = HeaderMap::new();
    for (name, value) in sign(scheme, header, SECRET, delivery_id, 0, body) {
        headers.insert(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&value).unwrap(),
        );
    }
    // The same bytes with one changed never pass.
    if !body.is_empty() {
        let mut tampered = body.to_vec();
        tampered[body.len() / 2] ^= 1;
        assert!(verifier.verify(&headers, Bytes::from(tampered), 0).is_err());
    }
    let verified = verifier
        .verify(&headers, Bytes::copy_from_slice(body), 0)
        .expect("a body signed with the source's secret verifies");
    let source = Source {
        provider,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    };
    // Just after the valid events' time, which must not lie ahead of it.
    let received_at = time::macros::datetime!(2026-11-29 10:15:31 UTC);
    let delivery = Delivery {
        source: Arc::new(source),
        delivery_id: delivery_id.into(),
        body: verified,
        received_at,
        arrived: Instant::now(),
        spools: false,
        trace: DeliveryTrace::default(),
    };
    let envelope = match identify(&delivery) {
        Ok((_, envelope)) => envelope,
        Err(PipelineError::DeliveryIdMismatch) => return Fate::Mismatch,
        Err(other) => panic!("identify failed with {other}"),
    };
    let ctx = Context {
        event_id: delivery_id,
        source: &delivery.source,
        received_at,
        raw: delivery.body.bytes(),
        origin: Origin::Webhook,
        max_event_ahead: std::time::Duration::from_secs(300),
    };
    let normalized = match envelope {
        Envelope::Unusable(reason) => return Fate::DeadLetter(reason.code()),
        Envelope::Event(json) => adapter.normalize(&json, &ctx),
    };
    match normalized {
        Err(reason) => Fate::DeadLetter(reason.code()),
        // A deletion is written as a tombstone: there is nothing to encode.
        Ok(normalized) if normalized.event.deleted => Fate::Event(Box::new(normalized.event)),
        Ok(normalized) => {
            let bytes = ENCODER
                .encode("pos.fuzz", &normalized.event)
                .expect("a normalized event always encodes");
            let back = decode(&bytes).expect("what posbridge encodes decodes");
            assert_eq!(back, normalized.event, "the encoding round-trips");
            Fate::Event(Box::new(normalized.event))
        }
    }
}

static CASES: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

fn count(property: usize) {
    let n = CASES[property].fetch_add(1, Ordering::Relaxed) + 1;
    if n.is_power_of_two() && n >= 256 {
        println!("fuzz property {property}: {n} cases so far");
    }
}

proptest! {
    #[test]
    fn arbitrary_bytes_are_an_event_or_a_dead_letter(
        provider in provider(),
        body in prop::collection::vec(any::<u8>(), 0..600),
        delivery_id in "[a-z0-9]{1,12}",
    ) {
        count(0);
        let _ = run(provider, &body, &delivery_id);
    }

    #[test]
    fn arbitrary_json_is_an_event_or_a_dead_letter(
        provider in provider(),
        body in any_json(),
        delivery_id in "[a-z0-9]{1,12}",
    ) {
        count(1);
        let bytes = serde_json::to_vec(&body).unwrap();
        let fate = run(provider, &bytes, &delivery_id);
        if matches!(fate, Fate::Mismatch) {
            let id = body.get("id").and_then(Value::as_str);
            prop_assert!(id.is_some_and(|id| id != delivery_id), "400 only for another string id");
        }
    }

    #[test]
    fn valid_events_with_fields_replaced_never_panic(
        provider in provider(),
        changes in prop::collection::vec(
            (prop::sample::select(PATHS), prop::option::of(any_json())),
            1..4,
        ),
    ) {
        count(2);
        let (mut body, _) = valid_event(provider, "evt-1");
        for (path, value) in changes {
            mutate(&mut body, path, value);
        }
        let bytes = serde_json::to_vec(&body).unwrap();
        let _ = run(provider, &bytes, "evt-1");
    }

    #[test]
    fn amounts_are_exact_or_refused_never_rounded(
        provider in provider(),
        (text, expected) in money(),
        as_number in any::<bool>(),
    ) {
        count(3);
        let (mut body, field) = valid_event(provider, "evt-2");
        body["data"][field] = number_or_text(&text, as_number);
        let bytes = serde_json::to_vec(&body).unwrap();
        prop_assert!(
            String::from_utf8_lossy(&bytes).contains(&text),
            "the JSON text carries the amount as written"
        );
        match (run(provider, &bytes, "evt-2"), expected) {
            (Fate::Event(event), Some(expected)) => {
                prop_assert_eq!(event.total.map(|t| t.to_string()), Some(expected));
            }
            (Fate::DeadLetter(code), None) => prop_assert_eq!(code, "invalid_field"),
            (fate, expected) => {
                prop_assert!(false, "{text} (expected {expected:?}) became {fate:?}");
            }
        }
    }
}
