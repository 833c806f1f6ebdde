//! A signed delivery ends as a keyed record that decodes to the same event.

use posbridge::adapters::encode::decode;
use posbridge::domain::event::{EntityType, Origin, ProviderKind};

use crate::support::{
    TestApp, brokers, decode_with_python, latest_per_key, mekari_order, read_topic, rr_sale,
};

#[tokio::test]
async fn receiptroller_sale_lands_keyed_with_headers_and_decodes() {
    let app = TestApp::start().await;
    let body = rr_sale(
        "rr_dlv_1",
        "sale.created",
        "2026-11-29T10:15:30.123Z",
        "T001|2026-11|000123",
        1100,
    );
    let response = app.send("receiptroller", "main", &body).await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.json::<serde_json::Value>().await.unwrap()["status"],
        "published"
    );

    let records = read_topic(&brokers(), &app.topic("sales"));
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.key, "receiptroller:T001|2026-11|000123");
    assert_eq!(record.headers["posbridge-delivery-id"], "rr_dlv_1");
    assert_eq!(record.headers["posbridge-provider"], "receiptroller");
    assert_eq!(record.headers["posbridge-event-type"], "sale.created");
    assert_eq!(record.timestamp_ms, Some(1_795_947_330_123));

    let event = decode(record.payload.as_deref().unwrap()).unwrap();
    assert_eq!(event.provider, ProviderKind::ReceiptRoller);
    assert_eq!(event.entity_type, EntityType::Sale);
    assert_eq!(event.entity_id, "T001|2026-11|000123");
    assert_eq!(event.source, "main");
    assert_eq!(event.origin, Origin::Webhook);
    assert_eq!(event.total.unwrap().to_string(), "1100.0000");
    assert_eq!(event.terminal_id.as_deref(), Some("T001"));
    assert_eq!(event.items.len(), 1);
    let raw: serde_json::Value = serde_json::from_slice(&event.raw).unwrap();
    assert_eq!(raw, body);
    assert!(read_topic(&brokers(), &app.topic("orders")).is_empty());

    // Code that is not ours reads the registry-less bytes the same way.
    let line = decode_with_python(&app.topic("sales"), None).await;
    assert_eq!(line["framing"], "single-object");
    assert_eq!(line["value"]["entity_id"], "T001|2026-11|000123");
    assert_eq!(line["value"]["total"], "1100.0000");
    app.stop().await;
}

#[tokio::test]
async fn mekari_order_lands_keyed_by_account_and_keeps_fractional_money() {
    let app = TestApp::start().await;
    let body = mekari_order(
        "01JD8Y6Q-1",
        "order.updated",
        "2026-11-29T17:15:30.120+07:00",
        "ORD-5512",
        "preparing",
    );
    assert_eq!(app.send("mekari", "acme", &body).await.status(), 200);

    let records = read_topic(&brokers(), &app.topic("orders"));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key, "mekari:acme:ORD-5512");
    assert_eq!(records[0].headers["posbridge-delivery-id"], "01JD8Y6Q-1");
    assert_eq!(records[0].timestamp_ms, Some(1_795_947_330_120));
    let event = decode(records[0].payload.as_deref().unwrap()).unwrap();
    assert_eq!(event.total.unwrap().to_string(), "51000.5000");
    assert_eq!(event.kitchen_status.as_deref(), Some("preparing"));
    assert_eq!(event.outlet_id.as_deref(), Some("OUT-9"));
    assert_eq!(event.account.as_deref(), Some("acme"));
    app.stop().await;
}

/// Two merchants' orders whose account and id read alike once joined with
/// `:` (`acme:ORD-1` on a source without an account, `ORD-1` on the source
/// of account `acme`) are two entities: both are published, under two keys,
/// the second not held back as stale by the first's state.
#[tokio::test]
async fn an_id_with_a_colon_and_another_accounts_id_publish_under_two_keys() {
    let app = TestApp::start().await;
    let unscoped = mekari_order(
        "colon-1",
        "order.updated",
        "2026-11-29T17:15:30+07:00",
        "acme:ORD-1",
        "preparing",
    );
    let scoped = mekari_order(
        "colon-2",
        "order.updated",
        "2026-11-29T17:00:00+07:00",
        "ORD-1",
        "new",
    );
    for (source, body) in [("main", &unscoped), ("acme", &scoped)] {
        let response = app.send("mekari", source, body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.json::<serde_json::Value>().await.unwrap()["status"],
            "published",
            "{source}"
        );
    }
    let records = read_topic(&brokers(), &app.topic("orders"));
    let keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["mekari:acme%3AORD-1", "mekari:acme:ORD-1"]);
    let ids: Vec<String> = records
        .iter()
        .map(|r| {
            decode(r.payload.as_deref().unwrap())
                .unwrap()
                .entity_id
                .into()
        })
        .collect();
    assert_eq!(
        ids,
        ["acme:ORD-1", "ORD-1"],
        "the value keeps the id as sent"
    );
    app.stop().await;
}

#[tokio::test]
async fn mekari_product_deleted_writes_a_tombstone() {
    let app = TestApp::start().await;
    let created = serde_json::json!({"id": "p-1", "event": "product.created",
        "occurred_at": "2026-11-29T17:00:00+07:00", "data": {"id": "P-1", "name": "Tea"}});
    let deleted = serde_json::json!({"id": "p-2", "event": "product.deleted",
        "occurred_at": "2026-11-29T17:05:00+07:00", "data": {"id": "P-1"}});
    assert_eq!(app.send("mekari", "main", &created).await.status(), 200);
    assert_eq!(app.send("mekari", "main", &deleted).await.status(), 200);
    let records = read_topic(&brokers(), &app.topic("products"));
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].key, "mekari:P-1");
    assert!(records[1].payload.is_none(), "delete is a tombstone");
    assert_eq!(
        records[1].headers["posbridge-event-type"],
        "product.deleted"
    );
    app.stop().await;
}

/// A product renamed while its webhook was lost reaches the topic through
/// the reconciler: the name is in the schema and in the state the guard
/// compares, so the API's record is not "unchanged"; reading it again is.
#[tokio::test]
async fn a_reconciled_rename_reaches_the_topic_and_a_second_read_writes_nothing() {
    use posbridge::adapters::providers::{Context, Json, for_kind};
    use posbridge::services::pipeline::Outcome;
    let app = TestApp::start().await;
    let product = serde_json::json!({"id": "P-REN", "sku": "SKU-1", "name": "Teh Manis",
        "price": 8000, "currency": "IDR", "status": "active"});
    let body = serde_json::json!({"id": "ren-1", "event": "product.created",
        "occurred_at": "2026-11-29T17:15:30+07:00", "data": product});
    assert_eq!(app.send("mekari", "main", &body).await.status(), 200);

    let source = posbridge::domain::event::Source {
        provider: ProviderKind::Mekari,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    };
    let mut renamed = product.clone();
    renamed["name"] = "Teh Tarik".into();
    let reconcile = |record: serde_json::Value| {
        let pipeline = app.pipeline.clone();
        let source = source.clone();
        async move {
            let raw = bytes::Bytes::from(record.to_string());
            let ctx = Context {
                event_id: "reconcile:1",
                source: &source,
                received_at: time::OffsetDateTime::now_utc(),
                raw: &raw,
                origin: Origin::Reconciler,
                max_event_ahead: std::time::Duration::ZERO,
            };
            let normalized = for_kind(ProviderKind::Mekari)
                .normalize_record(EntityType::Product, &Json::from(&record), &ctx)
                .unwrap();
            pipeline.apply(normalized).await.unwrap()
        }
    };
    assert_eq!(
        reconcile(product.clone()).await,
        Outcome::Unchanged,
        "the same state"
    );
    assert_eq!(
        reconcile(renamed.clone()).await,
        Outcome::Published,
        "the rename"
    );
    assert_eq!(reconcile(renamed).await, Outcome::Unchanged, "read again");

    let products = latest_per_key(&read_topic(&brokers(), &app.topic("products")));
    let latest = decode(products["mekari:P-REN"].payload.as_deref().unwrap()).unwrap();
    assert_eq!(latest.name.as_deref(), Some("Teh Tarik"));
    assert_eq!(latest.sku.as_deref(), Some("SKU-1"));
    assert_eq!(latest.active, Some(true));
    app.stop().await;
}
