//! The Avro encoder against the well-kept alternative, in one run: every
//! record's value is written by posbridge's own datum writer
//! (`src/adapters/encode/datum.rs`, through [`Encoder::encode`]); apache-avro 0.22's
//! schema-aware serde serializer writes a `#[derive(Serialize)]` view of the
//! same event straight to bytes, without its value tree. Both write the same
//! bytes (checked before timing); the bench prints the time per record of
//! each and the ratio. Our writer earns its place only while it is clearly
//! cheaper; the view below is what replacing it would cost in code (a
//! second description of the schema, as the writer is).
//!
//! Run with `cargo bench --bench encode`. Prints figures; asserts nothing
//! about speed.

use std::hint::black_box;
use std::time::{Duration, Instant};

use apache_avro::writer::datum::GenericDatumWriter;
use posbridge::adapters::encode::{Encoder, SCHEMA};
use posbridge::adapters::providers::{self, Context, Json};
use posbridge::config::RegistryConfig;
use posbridge::domain::event::{
    Decimal, EntityType, LineItem, Origin, PosEvent, ProviderKind, Source, micros,
};
use serde::Serialize;

/// The Avro record, field for field in the schema's order.
#[derive(Serialize)]
struct View<'a> {
    event_id: &'a str,
    provider: ProviderSymbol,
    source: &'a str,
    account: Option<&'a str>,
    entity_type: EntitySymbol,
    entity_id: &'a str,
    event_type: &'a str,
    occurred_at: i64,
    version_at: i64,
    version_rank: i32,
    received_at: i64,
    origin: OriginSymbol,
    outlet_id: Option<&'a str>,
    store_id: Option<&'a str>,
    terminal_id: Option<&'a str>,
    currency: Option<&'a str>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    subtotal: Option<Vec<u8>>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    tax: Option<Vec<u8>>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    total: Option<Vec<u8>>,
    status: Option<&'a str>,
    kitchen_status: Option<&'a str>,
    items: Vec<ItemView<'a>>,
    business_at: Option<i64>,
    name: Option<&'a str>,
    sku: Option<&'a str>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    price: Option<Vec<u8>>,
    active: Option<bool>,
    product_ids: Option<&'a [String]>,
    order_id: Option<&'a str>,
    reason: Option<&'a str>,
    payment_method: Option<&'a str>,
    customer_id: Option<&'a str>,
    items_given: Option<Vec<ItemView<'a>>>,
    raw: &'a str,
}

#[derive(Serialize)]
struct ItemView<'a> {
    sku: Option<&'a str>,
    name: Option<&'a str>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    quantity: Option<Vec<u8>>,
    #[serde(with = "apache_avro::serde::bytes_opt")]
    unit_price: Option<Vec<u8>>,
}

/// The schema's enums: serde writes a unit variant as the symbol of its name.
#[derive(Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum ProviderSymbol {
    ReceiptRoller,
    Mekari,
}

#[derive(Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum EntitySymbol {
    Sale,
    Order,
    Refund,
    Return,
    Exchange,
    Product,
    Collection,
}

#[derive(Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum OriginSymbol {
    Webhook,
    Reconciler,
}

/// A decimal's `bytes`, owned, as the view carries them.
fn decimal(value: Decimal) -> Vec<u8> {
    let (all, start) = value.twos_complement();
    all[start..].to_vec()
}

fn items(lines: &[LineItem]) -> Vec<ItemView<'_>> {
    lines
        .iter()
        .map(|line| ItemView {
            sku: line.sku.as_deref(),
            name: line.name.as_deref(),
            quantity: line.quantity.map(decimal),
            unit_price: line.unit_price.map(decimal),
        })
        .collect()
}

fn view(event: &PosEvent) -> View<'_> {
    View {
        event_id: &event.event_id,
        provider: match event.provider {
            ProviderKind::ReceiptRoller => ProviderSymbol::ReceiptRoller,
            ProviderKind::Mekari => ProviderSymbol::Mekari,
        },
        source: &event.source,
        account: event.account.as_deref(),
        entity_type: match event.entity_type {
            EntityType::Sale => EntitySymbol::Sale,
            EntityType::Order => EntitySymbol::Order,
            EntityType::Refund => EntitySymbol::Refund,
            EntityType::Return => EntitySymbol::Return,
            EntityType::Exchange => EntitySymbol::Exchange,
            EntityType::Product => EntitySymbol::Product,
            EntityType::Collection => EntitySymbol::Collection,
        },
        entity_id: &event.entity_id,
        event_type: &event.event_type,
        occurred_at: micros(event.occurred_at),
        version_at: event.version.at_micros,
        version_rank: i32::try_from(event.version.rank).unwrap_or(i32::MAX),
        received_at: micros(event.received_at),
        origin: match event.origin {
            Origin::Webhook => OriginSymbol::Webhook,
            Origin::Reconciler => OriginSymbol::Reconciler,
        },
        outlet_id: event.outlet_id.as_deref(),
        store_id: event.store_id.as_deref(),
        terminal_id: event.terminal_id.as_deref(),
        currency: event.currency.as_deref(),
        subtotal: event.subtotal.map(decimal),
        tax: event.tax.map(decimal),
        total: event.total.map(decimal),
        status: event.status.as_deref(),
        kitchen_status: event.kitchen_status.as_deref(),
        items: items(&event.items),
        business_at: event.business_at.map(micros),
        name: event.name.as_deref(),
        sku: event.sku.as_deref(),
        price: event.price.map(decimal),
        active: event.active,
        product_ids: event.product_ids.as_deref(),
        order_id: event.order_id.as_deref(),
        reason: event.reason.as_deref(),
        payment_method: event.payment_method.as_deref(),
        customer_id: event.customer_id.as_deref(),
        items_given: event.items_given.as_deref().map(items),
        raw: std::str::from_utf8(&event.raw).expect("an event's raw body is UTF-8"),
    }
}

/// The webhook bench's sale, normalized as posbridge normalizes it.
fn sale() -> PosEvent {
    let body = serde_json::json!({
        "id": "bench-1", "type": "sale.created",
        "timestamp": "2026-11-29T10:15:30.123Z", "webhook_id": "wh_1",
        "data": {"id": "T1|2026-11|00000001", "terminal_id": "T1", "store_id": "S1",
                 "currency": "JPY", "sub_total": 1000, "tax_total": 100, "grand_total": 1100,
                 "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
    });
    let source = Source {
        provider: ProviderKind::ReceiptRoller,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    };
    let raw = bytes::Bytes::from(body.to_string());
    let ctx = Context {
        event_id: "bench-1",
        source: &source,
        received_at: time::macros::datetime!(2026-11-29 10:15:31 UTC),
        raw: &raw,
        origin: Origin::Webhook,
        max_event_ahead: Duration::from_secs(300),
    };
    providers::for_kind(ProviderKind::ReceiptRoller)
        .normalize(&Json::from(&body), &ctx)
        .expect("the bench's sale normalizes")
        .event
}

/// Runs `encode` `rounds` times and returns the time per call.
fn time_per(rounds: u32, mut encode: impl FnMut() -> usize) -> Duration {
    let started = Instant::now();
    let mut bytes = 0;
    for _ in 0..rounds {
        bytes += black_box(encode());
    }
    black_box(bytes);
    started.elapsed() / rounds
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("encode bench: run it with `cargo bench --bench encode`");
        return;
    }
    let event = sale();
    let encoder = Encoder::new(&RegistryConfig::default(), &[])
        .await
        .expect("the registry-less encoder needs nothing");
    let writer = GenericDatumWriter::builder(&SCHEMA)
        .validate(false)
        .build()
        .expect("the schema resolves");
    let ours = encoder.encode("bench.sales", &event).expect("encode");
    // The single-object header: 2 magic bytes and the 8-byte fingerprint.
    let datum = &ours[10..];
    let theirs = writer
        .write_ser_to_vec(&view(&event))
        .expect("apache-avro serializes the view");
    assert_eq!(datum, theirs.as_slice(), "both write the same datum");

    let rounds = 200_000;
    for repetition in 1..=3 {
        let own = time_per(rounds, || {
            encoder
                .encode("bench.sales", black_box(&event))
                .expect("encode")
                .len()
        });
        let serde = time_per(rounds, || {
            let mut out = Vec::with_capacity(ours.len());
            out.extend_from_slice(&ours[..10]);
            writer
                .write_ser(&mut out, &view(black_box(&event)))
                .expect("serialize");
            out.len()
        });
        println!(
            "rep {repetition}: {} bytes; datum.rs {:>6.0} ns/record   apache-avro serde {:>6.0} ns/record   ({:.2}×)",
            ours.len(),
            own.as_nanos(),
            serde.as_nanos(),
            serde.as_secs_f64() / own.as_secs_f64()
        );
    }
}
