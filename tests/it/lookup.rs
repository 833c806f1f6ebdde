//! "What became of this product?": an entity's records found in its key's
//! partition alone, each with its place, headers and value, beside the
//! ledger's state; "what became of this delivery?": its answer and its
//! record, from the ledger and after the ledger was lost; both through the
//! admin listener.

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use posbridge::adapters::publish::TopicSets;
use posbridge::services::lookup::Lookup;
use serde_json::Value;
use tower::ServiceExt;

use crate::support::v1;
use crate::support::{
    BrokerKind, OwnBroker, TestApp, broker_kind, brokers, config, config_text, rr_sale, unique,
};

#[tokio::test(flavor = "multi_thread")]
async fn an_entity_is_found_in_its_keys_partition_with_its_records_and_the_ledgers_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&brokers(), &unique("lookup"), dir.path());
    config.kafka.partitions = 6;
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    for n in 1..=20 {
        let body = v1::product_created(
            &unique("look"),
            &format!("P-{n}"),
            &format!("Kopi {n}"),
            "2026-11-29T10:00:00Z",
        );
        assert_eq!(app.send("mekari", "main", &body).await.status(), 200);
    }
    let renamed = v1::product_created(&unique("look"), "P-7", "Kopi Baru", "2026-11-29T11:00:00Z");
    assert_eq!(app.send("mekari", "main", &renamed).await.status(), 200);

    let sets = TopicSets::new(&app.config.kafka);
    let lookup = Lookup::new(&app.config, app.pipeline.shared_ledger(), sets).unwrap();
    let report = lookup.entity("mekari:P-7").await.unwrap();
    assert_eq!(report.found.len(), 1, "{report:?}");
    let found = &report.found[0];
    assert_eq!(found.topic, app.topic("products"));
    // Created, then renamed; tansu 0.6 may have compacted the first away.
    let kept = found.records.len();
    assert!(
        kept == 2 || (kept == 1 && broker_kind() == BrokerKind::Tansu),
        "created, then renamed: {kept} records"
    );
    let last = found.records.last().unwrap();
    assert_eq!(last.value.as_ref().unwrap()["name"], "Kopi Baru");
    assert_eq!(
        last.headers["posbridge-delivery-id"],
        renamed["id"].as_str().unwrap()
    );
    let state = found.ledger_state.as_ref().expect("the ledger's state");
    assert_eq!(state.version, last.headers["posbridge-version"]);
    assert_eq!(state.state_hash, last.headers["posbridge-state-hash"]);
    assert!(
        report.read < 21,
        "one partition of six read, not the topic: {} records",
        report.read
    );
    assert!(
        lookup
            .entity("mekari:P-none")
            .await
            .unwrap()
            .found
            .is_empty()
    );

    let admin = posbridge::http::ingress::admin_router(app.admin_state(), &app.config.admin);
    let answer = admin
        .oneshot(
            Request::get("/admin/entities/mekari%3AP-7")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let json: Value =
        serde_json::from_slice(&answer.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let records = json["found"][0]["records"].as_array().unwrap();
    assert_eq!(records.last().unwrap()["value"]["name"], "Kopi Baru");
    app.stop().await;
}

/// Each outcome a delivery can have is found by its id with when it was
/// answered and its record read back; an unknown id says why nothing is
/// found; after the ledger file is lost, the published and the
/// dead-lettered deliveries are found again (the fill reads their answers
/// from the records), the stale one no longer (it wrote nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_is_found_by_its_id_with_its_answer_and_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(&brokers(), &unique("lookup-delivery"), dir.path());
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let (published, stale, unchanged, letter) = (
        unique("published"),
        unique("stale"),
        unique("unchanged"),
        unique("letter"),
    );
    // Within the dedup window, so a fill marks them done again.
    let ago = |minutes| {
        (time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let at = ago(10);
    let sent = [
        v1::product_created(&published, "P-1", "Kopi", &at),
        v1::product_created(&stale, "P-1", "Kopi Lama", &ago(20)),
        v1::product_created(&unchanged, "P-1", "Kopi", &at),
        serde_json::json!({"id": letter, "event": "shift.closed",
            "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "S-1"}}),
    ];
    for (body, status) in sent
        .iter()
        .zip(["published", "stale", "unchanged", "dead_lettered"])
    {
        let answer = app.send("mekari", "main", body).await;
        let code = answer.status();
        let json = answer.json::<Value>().await.unwrap();
        assert_eq!(code, 200, "{json}");
        assert_eq!(json["status"], status);
    }

    let admin = posbridge::http::ingress::admin_router(app.admin_state(), &app.config.admin);
    let ask = |id: String| {
        let admin = admin.clone();
        async move {
            let answer = admin
                .oneshot(
                    Request::get(format!("/admin/deliveries/{id}"))
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            assert_eq!(answer.status(), 200);
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&body).unwrap()
        }
    };
    let json = ask(published.clone()).await;
    let found = &json["found"][0];
    assert_eq!(found["key"], format!("mekari:{published}"), "{json}");
    assert_eq!(found["outcome"], "published");
    assert!(found["answered_at"].as_str().unwrap().starts_with("20"));
    assert_eq!(found["record"]["topic"], app.topic("products"));
    assert_eq!(found["record"]["read"]["value"]["name"], "Kopi");
    assert_eq!(
        found["record"]["read"]["headers"]["posbridge-delivery-id"],
        published.as_str()
    );
    assert!(found["record"].get("note").is_none(), "{json}");
    let published_place = found["record"]["offset"].clone();

    let json = ask(format!("mekari%3A{stale}")).await;
    assert_eq!(json["found"][0]["outcome"], "stale", "{json}");
    assert!(json["found"][0].get("record").is_none());
    let json = ask(unchanged.clone()).await;
    assert_eq!(json["found"][0]["outcome"], "unchanged", "{json}");

    let json = ask(letter.clone()).await;
    let found = &json["found"][0];
    assert_eq!(found["outcome"], "dead_lettered", "{json}");
    assert_eq!(
        found["record"]["topic"],
        app.config.kafka.dead_letter_topic()
    );
    assert_eq!(found["record"]["read"]["value"], sent[3]);

    // The status page's lookup box: both readings of the text on one page.
    let page = admin
        .clone()
        .oneshot(
            Request::get(format!("/status/lookup?id=mekari%3A{published}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = String::from_utf8(
        page.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        html.contains(r#"<td class="outcome">published</td>"#),
        "{html}"
    );
    assert!(html.contains(&app.topic("products")), "{html}");
    assert!(html.contains("As an entity key"), "{html}");

    let json = ask(unique("never")).await;
    assert_eq!(json["found"], Value::Array(vec![]));
    assert!(json["note"].as_str().unwrap().contains("dedup_ttl_secs"));

    // The ledger lost: the fill reads the answers back from the records.
    let config = app.config.clone();
    let dir = app.stop().await.unwrap();
    std::fs::remove_file(&config.ledger.path).unwrap();
    let mut app = TestApp::start_with(config).await;
    app.keep(dir);
    let sets = TopicSets::new(&app.config.kafka);
    let lookup = Lookup::new(&app.config, app.pipeline.shared_ledger(), sets).unwrap();
    let json = serde_json::to_value(lookup.delivery(&published).await.unwrap()).unwrap();
    let found = &json["found"][0];
    assert_eq!(found["outcome"], "published", "{json}");
    assert_eq!(found["record"]["offset"], published_place);
    assert_eq!(found["record"]["read"]["value"]["name"], "Kopi");
    let json = serde_json::to_value(lookup.delivery(&letter).await.unwrap()).unwrap();
    assert_eq!(json["found"][0]["outcome"], "dead_lettered", "{json}");
    let json = serde_json::to_value(lookup.delivery(&stale).await.unwrap()).unwrap();
    assert_eq!(json["found"], Value::Array(vec![]), "{json}");
    app.stop().await;
}

/// While Kafka is away a lookup answers what the ledger knows within
/// seconds and says the record could not be read: through the admin route
/// of a running posbridge, and as the command (which reads the ledger as it
/// was left, and says so).
#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_while_kafka_is_away_answers_what_the_ledger_knows() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("lookup-away");
    let app = TestApp::start_with(config(&broker.address(), &prefix, dir.path())).await;
    let id = unique("away");
    let sale = rr_sale(
        &id,
        "sale.created",
        "2026-11-29T10:00:00Z",
        "T1|2026-11|9",
        1000,
    );
    let answer = app.send("receiptroller", "main", &sale).await;
    assert_eq!(answer.json::<Value>().await.unwrap()["status"], "published");

    broker.cut();
    let admin = posbridge::http::ingress::admin_router(app.admin_state(), &app.config.admin);
    let asked = std::time::Instant::now();
    let answer = admin
        .oneshot(
            Request::get(format!("/admin/deliveries/receiptroller:{id}"))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let took = asked.elapsed();
    assert_eq!(answer.status(), 200);
    let report: Value =
        serde_json::from_slice(&answer.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert!(
        took < std::time::Duration::from_secs(10),
        "{took:?}: {report}"
    );
    assert_eq!(report["found"][0]["outcome"], "published", "{report}");
    let note = report["found"][0]["record"]["note"]
        .as_str()
        .unwrap_or_default();
    assert!(note.contains("could not be read"), "{report}");
    broker.heal();
    app.stop().await;

    // The command, once serve let go of the embedded ledger's file.
    broker.cut();
    let path = dir.path().join("posbridge.toml");
    std::fs::write(&path, config_text(&broker.address(), &prefix, dir.path())).unwrap();
    let lookup = tokio::process::Command::new(env!("CARGO_BIN_EXE_posbridge"))
        .args(["lookup", "--config"])
        .arg(&path)
        .args(["--delivery", &id])
        .env("POSBRIDGE_LOG", "info")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(std::time::Duration::from_secs(30), lookup)
        .await
        .expect("lookup answers within 30 s while Kafka is away")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("stdout is the JSON report alone: {e}; stderr: {stderr}"));
    assert_eq!(report["found"][0]["key"], format!("receiptroller:{id}"));
    assert_eq!(report["found"][0]["outcome"], "published", "{report}");
    let note = report["found"][0]["record"]["note"]
        .as_str()
        .unwrap_or_default();
    assert!(note.contains("could not be read"), "{report}");
    assert!(report["ledger_note"].is_string(), "{report}");
}
