//! The webhook bench's sale, for the benches that read one: its body, its
//! source and the context a normalizer reads it in.

use std::time::Duration;

use bytes::Bytes;
use posbridge::adapters::providers::Context;
use posbridge::domain::event::{Origin, ProviderKind, Source};

/// The webhook bench's body (`benches/webhooks/load.rs`), 346 bytes.
pub fn body() -> Bytes {
    let body = serde_json::to_vec(&serde_json::json!({
        "id": "bench-1", "type": "sale.created",
        "timestamp": "2026-11-29T10:15:30.123Z", "webhook_id": "wh_1",
        "data": {"id": "T1|2026-11|bench-1", "terminal_id": "T1", "store_id": "S1",
                 "currency": "JPY", "sub_total": 1000, "tax_total": 100, "grand_total": 1100,
                 "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
    }))
    .expect("json");
    Bytes::from(body)
}

/// The source the sale comes through.
pub fn source() -> Source {
    Source {
        provider: ProviderKind::ReceiptRoller,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    }
}

/// The context `body` is normalized in, as a webhook a second after it was sent.
pub fn context<'a>(source: &'a Source, body: &'a Bytes) -> Context<'a> {
    Context {
        event_id: "bench-1",
        source,
        received_at: time::macros::datetime!(2026-11-29 10:15:31 UTC),
        raw: body,
        origin: Origin::Webhook,
        max_event_ahead: Duration::from_secs(300),
    }
}
