//! What the guard sees of each entity type, both ways in: a webhook body and
//! the API record of the same state compare equal (same fields, same
//! business content), reordered keys and number spelling do not matter, and
//! a change in any one business field does.

use serde_json::{Value, json};
use time::macros::datetime;

use super::*;
use crate::domain::event::{EntityType, Normalized, Origin, ProviderKind};
use crate::domain::guard::state_hash;

#[test]
fn every_provider_kind_is_registered_once() {
    for kind in ProviderKind::ALL {
        assert_eq!(ALL.iter().filter(|p| p.kind() == kind).count(), 1, "{kind}");
    }
    assert_eq!(ALL.len(), ProviderKind::ALL.len());
}

/// The dead-letter series registered at start-up name every reason a
/// normalizer can give: a code missing from the list would be a series an
/// alert on dead letters only meets at its second event.
#[test]
fn every_normalize_error_code_is_listed() {
    let field = "data.sold_at";
    let every = [
        NormalizeError::InvalidJson(serde_json::from_str::<Value>("{").unwrap_err()),
        NormalizeError::UnknownEventType("shift.closed".into()),
        NormalizeError::MissingField(field),
        NormalizeError::InvalidField {
            field,
            reason: "is not a time",
        },
        NormalizeError::TimeBeforeEpoch {
            field,
            sent: "1969-12-31T23:59:59Z".into(),
        },
        NormalizeError::TimeInFuture {
            field,
            sent: "2999-01-01T00:00:00Z".into(),
            ahead_ms: 1,
            limit_ms: 0,
        },
    ];
    // No wildcard: a new variant does not compile here until it is listed above.
    for error in &every {
        match error {
            NormalizeError::InvalidJson(_)
            | NormalizeError::UnknownEventType(_)
            | NormalizeError::MissingField(_)
            | NormalizeError::InvalidField { .. }
            | NormalizeError::TimeBeforeEpoch { .. }
            | NormalizeError::TimeInFuture { .. } => {}
        }
    }
    let codes: Vec<&str> = every.iter().map(NormalizeError::code).collect();
    assert_eq!(codes, NormalizeError::CODES);
}

/// One entity of each type: its provider, webhook event name and data.
fn entities() -> Vec<(ProviderKind, EntityType, &'static str, Value)> {
    let lines = json!([{"product_id": "P-1", "name": "Teh", "qty": 2, "price": 8000.5}]);
    vec![
        (
            ProviderKind::ReceiptRoller,
            EntityType::Sale,
            "sale.created",
            json!({
            "id": "T1|2026-11|000123", "terminal_id": "T1", "store_id": "S1",
            "transaction_id": "000123", "transaction_type": 1, "status": "created",
            "transaction_at": "2026-11-29T10:15:29Z", "currency": "JPY", "sub_total": 1000,
            "tax_total": 100, "grand_total": 1100, "payment_method": "card", "customer_id": "C-9",
            "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}),
        ),
        (
            ProviderKind::ReceiptRoller,
            EntityType::Order,
            "order.updated",
            json!({
            "order_id": "RO-1", "store_id": "S1", "status": "paid",
            "created_at": "2026-11-29T10:15:29Z", "items": [{"sku": "A-1", "quantity": 1}]}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Order,
            "order.updated",
            json!({
            "id": "ORD-1", "outlet_id": "OUT-1", "status": "paid", "kitchen_status": "ready",
            "total": 51000.5, "currency": "IDR", "sold_at": "2026-11-29T17:14:02+07:00",
            "payment_method": "qris", "items": lines, "updated_at": "2026-11-29T17:15:30+07:00"}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Return,
            "return.created",
            json!({
            "id": "RET-1", "order_id": "ORD-1", "outlet_id": "OUT-1", "status": "requested",
            "currency": "IDR", "total": 8000.5, "reason": "damaged", "items": lines,
            "created_at": "2026-11-29T17:20:00+07:00", "updated_at": "2026-11-29T17:20:00+07:00"}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Refund,
            "refund.updated",
            json!({
            "id": "REF-1", "order_id": "ORD-1", "outlet_id": "OUT-1", "status": "paid",
            "currency": "IDR", "total": 8000.5, "method": "cash", "items": lines,
            "created_at": "2026-11-29T17:20:00+07:00", "updated_at": "2026-11-29T17:25:00+07:00"}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Exchange,
            "exchange.created",
            json!({
            "id": "EXC-1", "order_id": "ORD-1", "outlet_id": "OUT-1", "status": "open",
            "currency": "IDR", "total": 1000, "reason": "size", "items": lines,
            "items_given": [{"product_id": "P-2", "name": "Kopi", "qty": 2, "price": 9000}],
            "created_at": "2026-11-29T17:20:00+07:00", "updated_at": "2026-11-29T17:20:00+07:00"}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Product,
            "product.updated",
            json!({
            "id": "P-1", "sku": "SKU-1", "name": "Teh Manis", "price": 8000.5, "currency": "IDR",
            "status": "active", "updated_at": "2026-11-29T17:15:30+07:00"}),
        ),
        (
            ProviderKind::Mekari,
            EntityType::Collection,
            "collection.updated",
            json!({
            "id": "COL-1", "name": "Drinks", "product_ids": ["P-1", "P-2"], "status": "active",
            "updated_at": "2026-11-29T17:15:30+07:00"}),
        ),
    ]
}

/// The webhook body carrying `data`, as each provider wraps it.
fn webhook(provider: ProviderKind, event_type: &str, data: &Value) -> Value {
    match provider {
        ProviderKind::ReceiptRoller => json!({
            "id": "d-1", "type": event_type, "timestamp": "2026-11-29T10:15:30.123Z",
            "webhook_id": "wh_1", "data": data}),
        ProviderKind::Mekari => json!({
            "id": "d-1", "event": event_type, "occurred_at": "2026-11-29T17:15:30.120+07:00",
            "outlet_id": data.get("outlet_id"), "data": data}),
    }
}

fn ctx<'a>(source: &'a Source, origin: Origin) -> Context<'a> {
    Context {
        event_id: "d-1",
        source,
        received_at: datetime!(2026-11-29 10:20 UTC),
        raw: &crate::adapters::providers::TEST_RAW,
        origin,
        max_event_ahead: std::time::Duration::from_secs(300),
    }
}

fn hash(normalized: &Normalized) -> [u8; 16] {
    state_hash(&normalized.event, &normalized.content)
}

fn pushed(provider: ProviderKind, event_type: &str, data: &Value) -> Normalized {
    let source = crate::adapters::providers::test_source(provider, None);
    for_kind(provider)
        .normalize(
            &Json::from(&webhook(provider, event_type, data)),
            &ctx(source, Origin::Webhook),
        )
        .unwrap()
}

fn fetched(provider: ProviderKind, entity_type: EntityType, data: &Value) -> Normalized {
    let source = crate::adapters::providers::test_source(provider, None);
    for_kind(provider)
        .normalize_record(
            entity_type,
            &Json::from(data),
            &ctx(source, Origin::Reconciler),
        )
        .unwrap()
}

/// Every top-level business field of `data` changed in turn.
fn each_change(data: &Value) -> Vec<(String, Value)> {
    let Value::Object(map) = data else {
        return Vec::new();
    };
    map.iter()
        .filter(|(key, _)| !matches!(key.as_str(), "id" | "order_id" | "updated_at"))
        .map(|(key, value)| {
            let changed = match value {
                Value::String(s) if s.ends_with('Z') || s.contains('+') => {
                    Value::String("2026-01-01T00:00:00Z".into())
                }
                Value::String(s) => Value::String(format!("{s}-changed")),
                Value::Number(n) => json!(n.as_f64().unwrap_or(0.0) + 1.0),
                Value::Bool(b) => Value::Bool(!b),
                Value::Array(items) => {
                    let mut items = items.clone();
                    items.push(json!("extra"));
                    Value::Array(items)
                }
                other => json!({"was": other}),
            };
            let mut data = data.clone();
            data[key] = changed;
            (key.clone(), data)
        })
        .collect()
}

#[test]
fn the_same_state_pushed_or_fetched_compares_equal() {
    for (provider, entity_type, event_type, data) in entities() {
        let webhook = pushed(provider, event_type, &data);
        let record = fetched(provider, entity_type, &data);
        assert_eq!(webhook.event.entity_type, entity_type);
        assert_eq!(
            hash(&webhook),
            hash(&record),
            "{entity_type:?}: webhook and API"
        );
        // The same fields both ways (the version and origin aside).
        let mut pushed_event = webhook.event.clone();
        pushed_event.event_id = record.event.event_id.clone();
        pushed_event.event_type = record.event.event_type.clone();
        pushed_event.occurred_at = record.event.occurred_at;
        pushed_event.version = record.event.version;
        pushed_event.origin = record.event.origin;
        pushed_event.raw = record.event.raw.clone();
        assert_eq!(pushed_event, record.event, "{entity_type:?}");
    }
}

#[test]
fn reordered_keys_and_number_spelling_do_not_change_the_state() {
    for (provider, entity_type, _, data) in entities() {
        let original = fetched(provider, entity_type, &data);
        let text = data.to_string();
        // serde_json keeps keys sorted: rebuild the object in reverse order.
        let reversed: serde_json::Map<String, Value> = data
            .as_object()
            .unwrap()
            .iter()
            .rev()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let respelled: Value = serde_json::from_str(&text.replace("8000.5", "8000.50")).unwrap();
        assert_eq!(
            hash(&original),
            hash(&fetched(provider, entity_type, &Value::Object(reversed)))
        );
        assert_eq!(
            hash(&original),
            hash(&fetched(provider, entity_type, &respelled))
        );
        // When the record was last touched is not the entity's state.
        let mut touched = data.clone();
        if touched.get("updated_at").is_some() {
            touched["updated_at"] = json!("2026-11-30T00:00:00Z");
            assert_eq!(
                hash(&original),
                hash(&fetched(provider, entity_type, &touched))
            );
        }
    }
}

#[test]
fn a_change_in_any_business_field_changes_the_state() {
    for (provider, entity_type, _, data) in entities() {
        let original = hash(&fetched(provider, entity_type, &data));
        for (field, changed) in each_change(&data) {
            assert_ne!(
                original,
                hash(&fetched(provider, entity_type, &changed)),
                "{entity_type:?}.{field}"
            );
        }
    }
}

#[test]
fn each_entity_type_fills_its_own_fields() {
    let by_type: std::collections::HashMap<EntityType, Normalized> = entities()
        .into_iter()
        .filter(|(provider, ..)| *provider == ProviderKind::Mekari)
        .map(|(provider, entity_type, event_type, data)| {
            (entity_type, pushed(provider, event_type, &data))
        })
        .collect();
    let product = &by_type[&EntityType::Product].event;
    assert_eq!(product.name.as_deref(), Some("Teh Manis"));
    assert_eq!(product.sku.as_deref(), Some("SKU-1"));
    assert_eq!(product.price.unwrap().to_string(), "8000.5000");
    assert_eq!(product.active, Some(true));
    let collection = &by_type[&EntityType::Collection].event;
    assert_eq!(collection.name.as_deref(), Some("Drinks"));
    assert_eq!(
        collection.product_ids.as_deref(),
        Some(&["P-1".to_owned(), "P-2".to_owned()][..])
    );
    for entity_type in [EntityType::Return, EntityType::Refund, EntityType::Exchange] {
        assert_eq!(
            by_type[&entity_type].event.order_id.as_deref(),
            Some("ORD-1"),
            "{entity_type:?}"
        );
    }
    assert_eq!(
        by_type[&EntityType::Return].event.reason.as_deref(),
        Some("damaged")
    );
    assert_eq!(
        by_type[&EntityType::Refund].event.payment_method.as_deref(),
        Some("cash")
    );
    let given = by_type[&EntityType::Exchange]
        .event
        .items_given
        .as_ref()
        .unwrap();
    assert_eq!(given[0].sku.as_deref(), Some("P-2"));
    let order = &by_type[&EntityType::Order].event;
    assert_eq!(order.payment_method.as_deref(), Some("qris"));
    assert_eq!(order.business_at, Some(datetime!(2026-11-29 10:14:02 UTC)));
    assert_eq!(order.name, None, "orders have no name field");

    let sale = pushed(
        ProviderKind::ReceiptRoller,
        "sale.created",
        &entities()[0].3,
    )
    .event;
    assert_eq!(sale.business_at, Some(datetime!(2026-11-29 10:15:29 UTC)));
    assert_eq!(sale.customer_id.as_deref(), Some("C-9"));

    let deleted = pushed(
        ProviderKind::Mekari,
        "product.deleted",
        &json!({"id": "P-1", "status": "active"}),
    )
    .event;
    assert!(deleted.deleted);
    assert_eq!(deleted.active, Some(false));
}
