//! Registry mode: Confluent wire format, schema registered under
//! TopicNameStrategy in the real registry (Apicurio, through its
//! Confluent-compatible API), bytes decoded by Confluent's own Python client.

use posbridge::adapters::encode::decode;
use posbridge::app::App;
use posbridge::domain::event::EntityType;

use crate::support::registry::{Registry, V1_SCHEMA};
use std::time::Duration;

use crate::support::wait::wait_until;
use crate::support::{
    RR_SECRET, TestApp, brokers, config, decode_with_python, read_topic, rr_sale, unique,
};

/// The first release's schema with a numeric `event_id`: a schema this
/// version cannot read, so the registry refuses this version over it.
fn numeric_event_id_schema() -> String {
    let mut numeric: serde_json::Value = serde_json::from_str(V1_SCHEMA).unwrap();
    numeric["fields"][0]["type"] = "long".into();
    numeric.to_string()
}

/// The registry, with `refused` topics' subjects holding a schema this
/// version cannot read, and a config with fresh topics (`{prefix}.…`) and
/// its ledger in `dir` that uses it.
async fn with_registry(
    tag: &str,
    refused: &[&str],
    dir: &tempfile::TempDir,
) -> (Registry, String, posbridge::config::Config) {
    let prefix = unique(tag);
    let registry = Registry::shared();
    for topic in refused {
        let subject = format!("{prefix}.{topic}-value");
        assert_eq!(
            registry
                .register(&subject, &numeric_event_id_schema())
                .await,
            200
        );
    }
    let mut config = config(&brokers(), &prefix, dir.path());
    config.schema_registry.url = Some(registry.url.clone());
    (registry, prefix, config)
}

#[tokio::test]
async fn registry_mode_writes_confluent_wire_format_that_confluents_client_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, _, config) = with_registry("registry", &[], &dir).await;
    let app = TestApp::start_with(config).await;
    let topic = app.topic("sales");
    let subject_id = registry
        .id_of(&format!("{topic}-value"))
        .await
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

/// A source file with topics of its own, added while running: its
/// subjects are registered before it takes a delivery, and its records
/// carry their id, as Confluent's client reads them.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_added_with_its_own_topics_has_its_subjects_registered_first() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, _, mut config) = with_registry("regown", &[], &dir).await;
    let sources = dir.path().join("sources");
    std::fs::create_dir(&sources).unwrap();
    config.sources_dir = Some(sources.clone());
    config.spool.path = dir.path().join("spool.redb");
    let app = TestApp::start_with(config).await;
    let shop = unique("regshop");
    std::fs::write(
        sources.join(format!("receiptroller.{shop}.toml")),
        format!("secrets = [\"{RR_SECRET}\"]\naccount = \"{shop}\"\ntopic_prefix = \"{shop}.\"\n"),
    )
    .unwrap();
    let body = rr_sale(
        "regown-1",
        "sale.created",
        "2026-12-04T10:15:30Z",
        "T001|2026-12|000001",
        1100,
    );
    wait_until(
        Duration::from_secs(10),
        "the source to appear",
        async || app.send("receiptroller", &shop, &body).await.status() != 404,
    )
    .await;
    let topic = format!("{shop}.sales");
    let subject_id = registry
        .id_of(&format!("{topic}-value"))
        .await
        .expect("registered as the source appeared");
    let line = decode_with_python(&topic, Some(&registry.url)).await;
    assert_eq!(
        line["key"],
        format!("receiptroller:{shop}:T001|2026-12|000001")
    );
    assert_eq!(line["schema_id"], subject_id);
    assert_eq!(line["value"]["event_id"], "regown-1");
    app.stop().await;
}

#[tokio::test]
async fn start_up_fails_clearly_when_the_registry_rejects_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let (_registry, prefix, config) = with_registry("incompatible", &["orders"], &dir).await;
    let error = match App::build(&config).await {
        Ok(_) => panic!("start-up must fail"),
        Err(error) => format!("{:#}", anyhow::Error::new(error)),
    };
    assert!(error.contains("refused the event schema"), "{error}");
    assert!(error.contains(&format!("{prefix}.orders-value")), "{error}");
}

/// A registry holding the previous schema version for every subject takes
/// this version (BACKWARD), and refuses one that could not read it.
#[tokio::test]
async fn the_registry_accepts_this_schema_over_the_previous_version() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, prefix, config) = with_registry("evolve", &[], &dir).await;
    let subjects: Vec<String> = EntityType::ALL
        .iter()
        .map(|t| format!("{prefix}.{}-value", t.plural()))
        .collect();
    for subject in &subjects {
        assert_eq!(registry.register(subject, V1_SCHEMA).await, 200);
    }
    App::build(&config).await.expect("v2 registers over v1");
    for subject in &subjects {
        assert_eq!(registry.versions(subject).await, 2, "{subject}");
    }
    // A schema with a new field and no default cannot read v1's records.
    let mut breaking: serde_json::Value =
        serde_json::from_str(posbridge::adapters::encode::SCHEMA_JSON).unwrap();
    breaking["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "required_now", "type": "string"}));
    assert_eq!(
        registry.register(&subjects[0], &breaking.to_string()).await,
        409
    );
}

/// fastavro (under Confluent's Python client) reads a v1 record with this
/// schema, the new fields null, and a record of this version with v1's
/// schema, the new fields ignored.
#[tokio::test]
async fn fastavro_reads_records_across_schema_versions() {
    let python = crate::support::python_path();
    let dir = tempfile::tempdir().unwrap();
    let v1_path = dir.path().join("v1.avsc");
    std::fs::write(&v1_path, V1_SCHEMA).unwrap();
    let v2_path = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/pos_event.avsc");
    let read = |writer: &std::path::Path, reader: &std::path::Path, message: &[u8]| {
        let output = std::process::Command::new(&python)
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/python/evolve.py"
            ))
            .args([writer, reader])
            .arg(hex::encode(message))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()
    };
    let v2 = std::path::Path::new(v2_path);

    // A record the first release wrote (its pinned bytes).
    let v1_message = hex::decode("c301ecb1a1634e293ff804643102086d61696e000606522d311c72657475726e2e6372656174656480dbadaaf2d9b00680dbadaaf2d9b0060680db98abf2d9b00600020a4f55542d39000002064944520202ff02061388000208e199f0f80208646f6e6500020202410002043a9802100de0b6b3a763ffff00167b226964223a226431227d").unwrap();
    let old = read(&v1_path, v2, &v1_message);
    assert_eq!(old["entity_id"], "R-1");
    assert_eq!(old["total"], "-51000.5000");
    assert_eq!(old["name"], serde_json::Value::Null);
    assert_eq!(old["product_ids"], serde_json::Value::Null);

    // A record of this version, with the new fields set.
    let body = crate::support::mekari_order(
        "ev-1",
        "order.created",
        "2026-11-29T17:15:30+07:00",
        "ORD-EV",
        "new",
    );
    let source = posbridge::domain::event::Source {
        provider: posbridge::domain::event::ProviderKind::Mekari,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    };
    let ctx = posbridge::adapters::providers::Context {
        event_id: "ev-1",
        source: &source,
        received_at: time::OffsetDateTime::now_utc(),
        raw: &bytes::Bytes::from_static(b"{}"),
        origin: posbridge::domain::event::Origin::Webhook,
        max_event_ahead: posbridge::config::ServerConfig::default().max_event_ahead(),
    };
    let mut event =
        posbridge::adapters::providers::for_kind(posbridge::domain::event::ProviderKind::Mekari)
            .normalize(&posbridge::adapters::providers::Json::from(&body), &ctx)
            .unwrap()
            .event;
    event.name = Some("Teh Manis".into());
    event.product_ids = Some(vec!["P-1".into()]);
    let encoder = posbridge::adapters::encode::Encoder::new(
        &posbridge::config::RegistryConfig::default(),
        &[],
    )
    .await
    .unwrap();
    let message = encoder.encode("t", &event).unwrap();
    let new = read(v2, v2, &message);
    assert_eq!(new["name"], "Teh Manis");
    assert_eq!(new["product_ids"][0], "P-1");
    let as_v1 = read(v2, &v1_path, &message);
    assert_eq!(as_v1["entity_id"], "ORD-EV");
    assert!(as_v1.get("name").is_none(), "v1 has no such field: {as_v1}");
}

/// With `auto_register = false` posbridge registers nothing: it refuses to
/// start until the schema is registered, then frames records with the id it
/// looked up, which Confluent's client decodes.
#[tokio::test]
async fn without_auto_register_posbridge_starts_only_once_ci_registered_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let (registry, prefix, mut config) = with_registry("noregister", &[], &dir).await;
    config.schema_registry.auto_register = false;
    let error = match App::build(&config).await {
        Ok(_) => panic!("nothing is registered yet"),
        Err(error) => format!("{:#}", anyhow::Error::new(error)),
    };
    assert!(error.contains("not registered"), "{error}");
    assert_eq!(
        registry.versions(&format!("{prefix}.sales-value")).await,
        0,
        "it registered nothing"
    );

    for entity in EntityType::ALL {
        let subject = format!("{prefix}.{}-value", entity.plural());
        assert_eq!(
            registry
                .register(&subject, posbridge::adapters::encode::SCHEMA_JSON)
                .await,
            200
        );
    }
    let app = TestApp::start_with(config).await;
    let body = rr_sale(
        "noreg-1",
        "sale.created",
        "2026-11-29T10:15:30Z",
        "T1|2026-11|0777",
        700,
    );
    assert_eq!(app.send("receiptroller", "main", &body).await.status(), 200);
    let topic = app.topic("sales");
    let records = read_topic(&brokers(), &topic);
    let payload = records[0].payload.as_deref().unwrap();
    assert_eq!(payload[0], 0, "Confluent framing");
    assert_eq!(
        Some(u32::from_be_bytes(payload[1..5].try_into().unwrap())),
        registry.id_of(&format!("{topic}-value")).await
    );
    let line = decode_with_python(&topic, Some(&registry.url)).await;
    assert_eq!(line["value"]["entity_id"], "T1|2026-11|0777");
    app.stop().await;
}

/// `posbridge schema check` says per subject whether this version's schema
/// is registered, may be registered, or is refused, and fails CI on a
/// refusal; Confluent's client, asking the same registry, agrees.
#[tokio::test]
async fn schema_check_says_which_subjects_take_this_schema() {
    let registry = Registry::shared();
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("check");
    let subject = |topic: &str| format!("{prefix}.{topic}-value");
    // sales: the previous version; orders: this version; returns: a schema
    // whose event_id is a number, which this version cannot read.
    assert_eq!(registry.register(&subject("sales"), V1_SCHEMA).await, 200);
    assert_eq!(
        registry
            .register(&subject("orders"), posbridge::adapters::encode::SCHEMA_JSON)
            .await,
        200
    );
    assert_eq!(
        registry
            .register(&subject("returns"), &numeric_event_id_schema())
            .await,
        200
    );

    let text = crate::support::config_text(&brokers(), &prefix, dir.path())
        + &format!(
            "\n[schema_registry]\nurl = \"{}\"\nauto_register = false\n",
            registry.url
        );
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, text).unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(["schema", "check", "--config"])
        .arg(&path)
        .env("POSBRIDGE_LOG", "off")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "a refusing subject fails the check: {stdout}"
    );
    assert!(!stdout.is_empty(), "{stderr}");
    for (topic, verdict) in [
        ("sales", "compatible"),
        ("orders", "registered"),
        ("returns", "INCOMPATIBLE"),
        ("products", "new subject"),
    ] {
        assert!(
            stdout.contains(&format!("{}: {verdict}\n", subject(topic))),
            "{topic}: {stdout}"
        );
    }

    let schema_file = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/pos_event.avsc");
    let check = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/registry_check.py"
    );
    for (topic, registered, compatible) in [
        ("sales", false, serde_json::json!(true)),
        ("orders", true, serde_json::json!(true)),
        ("returns", false, serde_json::json!(false)),
        ("products", false, serde_json::Value::Null),
    ] {
        let output =
            crate::support::python(&[check, registry.url.as_str(), &subject(topic), schema_file])
                .await;
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(answer["registered"], registered, "{topic}: {answer}");
        assert_eq!(answer["compatible"], compatible, "{topic}: {answer}");
    }
}
