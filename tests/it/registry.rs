//! Registry mode: Confluent wire format, schema registered under
//! TopicNameStrategy, bytes decoded by Confluent's own Python client.

use posbridge::app::App;
use posbridge::encode::decode;

use crate::support::registry_fake::RegistryFake;
use crate::support::{TestApp, brokers, config, decode_with_python, read_topic, rr_sale, unique};

#[tokio::test]
async fn registry_mode_writes_confluent_wire_format_that_confluents_client_decodes() {
    let registry = RegistryFake::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("registry");
    let mut config = config(&brokers(), &prefix, dir.path());
    config.schema_registry.url = Some(registry.url.clone());
    let app = TestApp::start_with(config).await;
    let topic = app.topic("sales");
    let subject_id = registry
        .id_of(&format!("{topic}-value"))
        .expect("registered at start-up");

    let body = rr_sale(
        "reg-1",
        "sale.created",
        "2026-11-29T10:15:30.123Z",
        "T001|2026-11|000777",
        1100,
    );
    assert_eq!(app.send("receiptroller", "main", &body).await.status(), 200);
    let records = read_topic(&brokers(), &topic);
    assert_eq!(records.len(), 1);
    let payload = records[0].payload.as_deref().unwrap();
    assert_eq!(payload[0], 0, "Confluent magic byte");
    assert_eq!(
        u32::from_be_bytes(payload[1..5].try_into().unwrap()),
        subject_id
    );
    assert_eq!(decode(payload).unwrap().entity_id, "T001|2026-11|000777");

    let line = decode_with_python(&topic, Some(&registry.url)).await;
    assert_eq!(line["key"], "receiptroller:T001|2026-11|000777");
    assert_eq!(line["framing"], "confluent");
    assert_eq!(line["schema_id"], subject_id);
    let value = &line["value"];
    assert_eq!(value["event_id"], "reg-1");
    assert_eq!(value["provider"], "RECEIPTROLLER");
    assert_eq!(value["entity_type"], "SALE");
    assert_eq!(value["total"], "1100.0000");
    assert_eq!(value["items"][0]["quantity"], "2.0000");
    assert!(
        value["occurred_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-11-29 10:15:30.123")
    );
    app.stop().await;
}

#[tokio::test]
async fn start_up_fails_clearly_when_the_registry_rejects_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("incompatible");
    let registry = RegistryFake::start(&[&format!("{prefix}.orders-value")]).await;
    let mut config = config(&brokers(), &prefix, dir.path());
    config.schema_registry.url = Some(registry.url.clone());
    let error = match App::build(&config).await {
        Ok(_) => panic!("start-up must fail"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("refused the event schema"), "{error}");
    assert!(error.contains(&format!("{prefix}.orders-value")), "{error}");
}
