//! Mekari POS webhook bodies (orders, returns, refunds, exchanges, products,
//! collections) into the one event.
//!
//! `occurred_at` orders events about one entity; at one instant, kitchen
//! events also compare `kitchen_status`, so a later stage wins a tie.

use time::OffsetDateTime;

use crate::adapters::providers::json::{
    Json, content, envelope, first_decimal, items, lines, optional_bool, optional_decimal,
    optional_ids, optional_text, optional_time, required_str,
};
use crate::adapters::providers::{Context, NormalizeError};
use crate::domain::event::{EntityType, Normalized, PosEvent, ProviderKind, Version};

/// Top-level data fields that say when the record was last touched, not what
/// the entity is: left out of the business content, so a webhook and an API
/// read of the same state compare equal.
const VOLATILE: [&str; 1] = ["updated_at"];

/// Product and collection statuses that mean "not in use".
const INACTIVE: [&str; 4] = ["inactive", "archived", "disabled", "deleted"];

/// Kitchen progress in order. At one `occurred_at`, a later stage wins; an
/// unknown status ranks lowest so it never hides a known later stage.
const KITCHEN_PROGRESS: [&str; 9] = [
    "new",
    "pending",
    "queued",
    "accepted",
    "preparing",
    "ready",
    "served",
    "completed",
    "cancelled",
];

/// A webhook body: `event`, `occurred_at` (the version), the entity's
/// `data`, and the envelope's `outlet_id` where the data has none.
pub fn normalize(body: &Json<'_>, ctx: &Context<'_>) -> Result<Normalized, NormalizeError> {
    let (event_type, occurred_at, data) = envelope(body, "event", "occurred_at", ctx)?;
    let mut normalized = entity_event(event_type, occurred_at, data, ctx)?;
    if normalized.event.outlet_id.is_none() {
        normalized.event.outlet_id = optional_text(body, "outlet_id");
    }
    Ok(normalized)
}

/// Builds the event from the entity's data; `at` is the version time
/// (`occurred_at` for webhooks, the fetch time for reconciled records).
/// Each entity type's own fields are read only for that type (docs/SCHEMA.md
/// has the table): products' name, SKU, price and activity, collections'
/// name, members and activity, the order a return, refund or exchange
/// belongs to with its reason, a refund's method, an exchange's given lines.
pub fn entity_event(
    event_type: &str,
    at: OffsetDateTime,
    data: &Json<'_>,
    ctx: &Context<'_>,
) -> Result<Normalized, NormalizeError> {
    let (family, verb) = event_type.split_once('.').unwrap_or((event_type, ""));
    let entity_type = match family {
        "order" => EntityType::Order,
        "return" => EntityType::Return,
        "refund" => EntityType::Refund,
        "exchange" => EntityType::Exchange,
        "product" => EntityType::Product,
        "collection" => EntityType::Collection,
        _ => return Err(NormalizeError::UnknownEventType(event_type.to_owned())),
    };
    let kitchen_status = optional_text(data, "kitchen_status");
    let status = optional_text(data, "status");
    let deleted = verb == "deleted";
    let catalogue = matches!(entity_type, EntityType::Product | EntityType::Collection);
    let after_sale = matches!(
        entity_type,
        EntityType::Return | EntityType::Refund | EntityType::Exchange
    );
    let active = match optional_bool(data, "data.active")? {
        Some(active) => Some(active && !deleted),
        None if deleted => Some(false),
        None => status.as_deref().map(|s| {
            !INACTIVE
                .iter()
                .any(|inactive| inactive.eq_ignore_ascii_case(s))
        }),
    };
    let business_at = match entity_type {
        EntityType::Order => optional_time(data, "data.sold_at")?,
        _ => optional_time(data, "data.created_at")?,
    };
    let payment_method = match entity_type {
        EntityType::Refund => {
            optional_text(data, "method").or_else(|| optional_text(data, "payment_method"))
        }
        _ => optional_text(data, "payment_method"),
    };
    let event = PosEvent {
        event_id: ctx.event_id.into(),
        provider: ProviderKind::Mekari,
        source: ctx.source.name.as_str().into(),
        account: ctx.source.account.as_deref().map(Into::into),
        entity_type,
        entity_id: required_str(data, "data.id")?.into(),
        event_type: event_type.into(),
        occurred_at: at,
        version: Version::new(at, kitchen_rank(kitchen_status.as_deref())),
        received_at: ctx.received_at,
        origin: ctx.origin,
        outlet_id: optional_text(data, "outlet_id"),
        store_id: None,
        terminal_id: None,
        currency: optional_text(data, "currency"),
        subtotal: first_decimal(data, &["data.subtotal", "data.sub_total"])?,
        tax: first_decimal(data, &["data.tax", "data.tax_total"])?,
        total: first_decimal(data, &["data.total", "data.amount"])?,
        status,
        kitchen_status,
        items: items(data)?,
        deleted,
        business_at,
        name: catalogue.then(|| optional_text(data, "name")).flatten(),
        sku: (entity_type == EntityType::Product)
            .then(|| optional_text(data, "sku"))
            .flatten(),
        price: if entity_type == EntityType::Product {
            optional_decimal(data, "data.price")?
        } else {
            None
        },
        active: active.filter(|_| catalogue),
        product_ids: if entity_type == EntityType::Collection {
            optional_ids(data, "data.product_ids")?
        } else {
            None
        },
        order_id: after_sale
            .then(|| optional_text(data, "order_id"))
            .flatten(),
        reason: after_sale.then(|| optional_text(data, "reason")).flatten(),
        payment_method,
        customer_id: optional_text(data, "customer_id"),
        items_given: if entity_type == EntityType::Exchange {
            lines(data, "data.items_given")?
        } else {
            None
        },
        raw: ctx.raw.clone(),
        topic_prefix: ctx.source.topic_prefix.clone(),
    };
    Ok(Normalized {
        event,
        content: content(data, &VOLATILE),
    })
}

fn kitchen_rank(status: Option<&str>) -> u32 {
    status
        .and_then(|s| {
            KITCHEN_PROGRESS
                .iter()
                .position(|known| known.eq_ignore_ascii_case(s))
        })
        .map_or(0, |i| u32::try_from(i + 1).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::mekari::Mekari;
    use crate::adapters::providers::{Provider, test_source};
    use crate::domain::event::Origin;
    use serde_json::{Value, json};
    use time::macros::datetime;

    fn ctx() -> Context<'static> {
        Context {
            event_id: "01JD8Y6Q",
            source: test_source(ProviderKind::Mekari, Some("acme")),
            received_at: datetime!(2026-11-29 10:15:31 UTC),
            raw: &crate::adapters::providers::TEST_RAW,
            origin: Origin::Webhook,
            max_event_ahead: std::time::Duration::from_secs(300),
        }
    }

    fn order(kitchen: &str) -> Value {
        json!({
          "id": "01JD8Y6Q", "event": "order.updated",
          "occurred_at": "2026-11-29T17:15:30.120+07:00", "outlet_id": "OUT-9",
          "data": {"id": "ORD-5512", "outlet_id": "OUT-9", "status": "paid",
                   "kitchen_status": kitchen, "total": 51000.5, "currency": "IDR",
                   "sold_at": "2026-11-29T17:14:02+07:00", "items": []}
        })
    }

    #[test]
    fn the_documented_order_normalizes_with_fractional_idr() {
        let event = Mekari
            .normalize(&Json::from(&order("preparing")), &ctx())
            .unwrap()
            .event;
        assert_eq!(event.key().as_str(), "mekari:acme:ORD-5512");
        assert_eq!(event.total.unwrap().to_string(), "51000.5000");
        assert_eq!(event.outlet_id.as_deref(), Some("OUT-9"));
        assert_eq!(event.occurred_at, datetime!(2026-11-29 10:15:30.120 UTC));
        assert!(!event.deleted);
    }

    #[test]
    fn kitchen_progress_breaks_ties_at_one_instant() {
        let preparing = Mekari
            .normalize(&Json::from(&order("preparing")), &ctx())
            .unwrap()
            .event;
        let ready = Mekari
            .normalize(&Json::from(&order("ready")), &ctx())
            .unwrap()
            .event;
        let unknown = Mekari
            .normalize(&Json::from(&order("juggling")), &ctx())
            .unwrap()
            .event;
        assert!(ready.version > preparing.version);
        assert!(unknown.version < preparing.version);
    }

    /// An order stamped by a terminal with a wrong clock (2099) is refused,
    /// so it cannot version its order ahead of every genuine update; so is
    /// one before 1970, which a Kafka record timestamp cannot carry.
    #[test]
    fn an_order_before_1970_or_far_ahead_is_refused() {
        for (occurred_at, code) in [
            ("1970-01-01T06:59:59+07:00", "time_before_epoch"),
            ("1900-01-01T00:00:00Z", "time_before_epoch"),
            ("2099-01-01T00:00:00+07:00", "time_in_future"),
        ] {
            let mut body = order("preparing");
            body["occurred_at"] = json!(occurred_at);
            let error = Mekari.normalize(&Json::from(&body), &ctx()).unwrap_err();
            assert_eq!(error.code(), code, "{occurred_at}");
            assert!(error.to_string().contains("`occurred_at`"), "{error}");
        }
    }

    #[test]
    fn deleted_products_are_marked_for_a_tombstone() {
        let body = json!({"id": "e1", "event": "product.deleted",
                          "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "P-1"}});
        let event = Mekari.normalize(&Json::from(&body), &ctx()).unwrap().event;
        assert_eq!(event.entity_type, EntityType::Product);
        assert!(event.deleted);
    }

    #[test]
    fn unknown_families_are_refused() {
        let body = json!({"id": "e1", "event": "shift.closed",
                          "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "S"}});
        assert!(matches!(
            Mekari.normalize(&Json::from(&body), &ctx()).unwrap_err(),
            NormalizeError::UnknownEventType(t) if t == "shift.closed"
        ));
    }
}
