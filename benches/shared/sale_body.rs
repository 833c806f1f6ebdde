//! The webhook bench's sale body, for the benches that read one.

use bytes::Bytes;

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
