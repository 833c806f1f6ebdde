//! "What became of this product?": an entity's records found in its key's
//! partition alone, each with its place, headers and value, beside the
//! ledger's state; the same through the admin listener.

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use posbridge::adapters::publish::TopicSets;
use posbridge::services::lookup::Lookup;
use serde_json::Value;
use tower::ServiceExt;

use crate::support::v1;
use crate::support::{BrokerKind, TestApp, broker_kind, brokers, config, unique};

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
    let lookup = Lookup::new(&app.config, app.pipeline.clone(), sets).unwrap();
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
