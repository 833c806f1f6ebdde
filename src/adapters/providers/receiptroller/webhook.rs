//! ReceiptRoller's webhook bodies (sales and orders) into the one event.
//!
//! The body's `timestamp` is the send time, unchanged on retries, and is the
//! version that keeps newer state from being overwritten; a sale's state is
//! its event's verb (`sale.created`, `sale.cancelled`), as sales carry no status.

use time::OffsetDateTime;

use crate::adapters::providers::json::{
    Json, content, envelope, items, optional_decimal, optional_text, optional_time, required_str,
};
use crate::adapters::providers::{Context, NormalizeError, RECONCILED_VERB};
use crate::domain::event::{EntityType, Normalized, PosEvent, ProviderKind, Version};

/// A webhook body: `type`, `timestamp` (the version) and the entity's `data`.
pub fn normalize(body: &Json<'_>, ctx: &Context<'_>) -> Result<Normalized, NormalizeError> {
    let (event_type, sent_at, data) = envelope(body, "type", "timestamp", ctx)?;
    entity_event(event_type, sent_at, data, ctx)
}

/// Builds the event from the entity's data; `at` is the version time (the
/// body's `timestamp` for webhooks, the fetch time for reconciled records).
/// A sale's business time is `transaction_at`, an order's `created_at`;
/// `payment_method` and `customer_id` are read where sent (assumed names).
pub fn entity_event(
    event_type: &str,
    at: OffsetDateTime,
    data: &Json<'_>,
    ctx: &Context<'_>,
) -> Result<Normalized, NormalizeError> {
    let (family, verb) = event_type.split_once('.').unwrap_or((event_type, ""));
    // Without a status field, a sale's state is its event's verb (created, cancelled, …).
    let verb = if verb == RECONCILED_VERB { "" } else { verb };
    let (entity_type, entity_id, business_at) = match family {
        // Sales are keyed `{terminal_id}|{yyyy-MM}|{transaction_id}` in data.id.
        "sale" => (
            EntityType::Sale,
            required_str(data, "data.id")?,
            optional_time(data, "data.transaction_at")?,
        ),
        "order" => (
            EntityType::Order,
            required_str(data, "data.order_id")?,
            optional_time(data, "data.created_at")?,
        ),
        _ => return Err(NormalizeError::UnknownEventType(event_type.to_owned())),
    };
    let status = optional_text(data, "status").unwrap_or_else(|| verb.into());
    let event = PosEvent {
        event_id: ctx.event_id.into(),
        provider: ProviderKind::ReceiptRoller,
        source: ctx.source.name.as_str().into(),
        account: ctx.source.account.as_deref().map(Into::into),
        entity_type,
        entity_id: entity_id.into(),
        event_type: event_type.into(),
        occurred_at: at,
        version: Version::new(at, 0),
        received_at: ctx.received_at,
        origin: ctx.origin,
        outlet_id: None,
        store_id: optional_text(data, "store_id"),
        terminal_id: optional_text(data, "terminal_id"),
        currency: optional_text(data, "currency"),
        subtotal: optional_decimal(data, "data.sub_total")?,
        tax: optional_decimal(data, "data.tax_total")?,
        total: optional_decimal(data, "data.grand_total")?,
        status: Some(status).filter(|s| !s.is_empty()),
        kitchen_status: None,
        items: items(data)?,
        deleted: false,
        business_at,
        name: None,
        sku: None,
        price: None,
        active: None,
        product_ids: None,
        order_id: None,
        reason: None,
        payment_method: optional_text(data, "payment_method"),
        customer_id: optional_text(data, "customer_id"),
        items_given: None,
        raw: ctx.raw.clone(),
        topic_prefix: ctx.source.topic_prefix.clone(),
    };
    Ok(Normalized {
        event,
        // ReceiptRoller's data holds nothing but the entity.
        content: content(data, &[]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::receiptroller::ReceiptRoller;
    use crate::adapters::providers::{Provider, test_source};
    use crate::domain::event::Origin;
    use serde_json::{Value, json};
    use time::macros::datetime;

    fn ctx() -> Context<'static> {
        Context {
            event_id: "rr_dlv_1",
            source: test_source(ProviderKind::ReceiptRoller, None),
            received_at: datetime!(2026-11-29 10:15:31 UTC),
            raw: &crate::adapters::providers::TEST_RAW,
            origin: Origin::Webhook,
            max_event_ahead: std::time::Duration::from_secs(300),
        }
    }

    fn sale() -> Value {
        json!({
          "id": "rr_dlv_1", "type": "sale.created", "timestamp": "2026-11-29T10:15:30.123Z",
          "webhook_id": "wh_123",
          "data": {"id": "T001|2026-11|000123", "terminal_id": "T001", "store_id": "S01",
                   "transaction_id": "000123", "transaction_type": 1,
                   "transaction_at": "2026-11-29T10:15:29Z", "currency": "JPY",
                   "sub_total": 1000, "tax_total": 100, "grand_total": 1100,
                   "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
        })
    }

    #[test]
    fn the_documented_sale_normalizes() {
        let body = sale();
        let event = ReceiptRoller
            .normalize(&Json::from(&body), &ctx())
            .unwrap()
            .event;
        assert_eq!(event.entity_type, EntityType::Sale);
        assert_eq!(event.key().as_str(), "receiptroller:T001|2026-11|000123");
        assert_eq!(event.total.unwrap().to_string(), "1100.0000");
        assert_eq!(event.items[0].quantity.unwrap().to_string(), "2.0000");
        assert_eq!(event.status.as_deref(), Some("created"));
        assert_eq!(event.occurred_at, datetime!(2026-11-29 10:15:30.123 UTC));
        assert_eq!(event.version.at_micros, 1_795_947_330_123_000);
    }

    #[test]
    fn a_fetched_sale_normalizes_like_its_webhook_with_the_fetch_time_as_version() {
        let body = sale();
        let webhook = ReceiptRoller
            .normalize(&Json::from(&body), &ctx())
            .unwrap()
            .event;
        let mut fetched = ctx();
        fetched.origin = Origin::Reconciler;
        let record = ReceiptRoller
            .normalize_record(EntityType::Sale, &Json::from(&body["data"]), &fetched)
            .unwrap()
            .event;
        assert_eq!(record.key(), webhook.key());
        assert_eq!(record.event_type, "sale.reconciled");
        assert_eq!(record.origin, Origin::Reconciler);
        assert_eq!(record.version, Version::new(fetched.received_at, 0));
        assert_eq!(record.total, webhook.total);
    }

    /// The body's `timestamp` becomes the record timestamp and the version:
    /// before 1970, or further ahead of the arrival than the bound, the sale
    /// is refused with the field named.
    #[test]
    fn a_sale_sent_before_1970_or_far_ahead_is_refused() {
        for (timestamp, code) in [
            ("1969-12-31T23:59:59Z", "time_before_epoch"),
            ("0000-01-01T00:00:00Z", "time_before_epoch"),
            ("2026-11-29T10:20:32Z", "time_in_future"),
            ("2099-01-01T00:00:00Z", "time_in_future"),
        ] {
            let mut body = sale();
            body["timestamp"] = json!(timestamp);
            let error = ReceiptRoller
                .normalize(&Json::from(&body), &ctx())
                .unwrap_err();
            assert_eq!(error.code(), code, "{timestamp}");
            assert!(error.to_string().contains("`timestamp`"), "{error}");
        }
        let mut body = sale();
        body["timestamp"] = json!("2026-11-29T10:20:31Z");
        assert!(ReceiptRoller.normalize(&Json::from(&body), &ctx()).is_ok());
    }

    #[test]
    fn orders_are_keyed_by_order_id() {
        let body = json!({"id": "d2", "type": "order.updated", "timestamp": "2026-11-29T10:15:30Z",
                          "data": {"order_id": "O-9", "status": "paid"}});
        let event = ReceiptRoller
            .normalize(&Json::from(&body), &ctx())
            .unwrap()
            .event;
        assert_eq!(event.entity_type, EntityType::Order);
        assert_eq!(event.entity_id, "O-9");
        assert_eq!(event.status.as_deref(), Some("paid"));
    }

    #[test]
    fn unknown_types_and_missing_fields_are_refused() {
        let mut body = sale();
        body["type"] = json!("customer.created");
        assert!(matches!(
            ReceiptRoller.normalize(&Json::from(&body), &ctx()).unwrap_err(),
            NormalizeError::UnknownEventType(t) if t == "customer.created"
        ));
        let mut body = sale();
        body["data"].as_object_mut().unwrap().remove("id");
        assert!(matches!(
            ReceiptRoller
                .normalize(&Json::from(&body), &ctx())
                .unwrap_err(),
            NormalizeError::MissingField("data.id")
        ));
        let mut body = sale();
        body["timestamp"] = json!("yesterday");
        assert_eq!(
            ReceiptRoller
                .normalize(&Json::from(&body), &ctx())
                .unwrap_err()
                .code(),
            "invalid_field"
        );
    }
}
