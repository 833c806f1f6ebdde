//! Every status the ingress can answer, through the router as a tower
//! service (`oneshot`), without a socket or a broker: the pipeline behind it
//! has a real ledger and the fake broker, down unless a test brings it up.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::adapters::ledger::{Commit, EntitySlot, Held};
use crate::config::Secrets;
use crate::domain::event::{EntityKey, EntityType, Version};
use crate::domain::guard::EntityState;
use crate::domain::verify::SchemeName;
use crate::domain::verify::sign;

const SECRET: &str = "ingress-test-secret";
const BODY_LIMIT: usize = 4096;
const RETRY_AFTER_SECS: u64 = 7;

struct Harness {
    /// The routes, boxed to be named.
    router:
        tower::util::BoxCloneSyncService<super::HttpRequest, Response, std::convert::Infallible>,
    pipeline: Pipeline,
    /// The broker the pipeline produces to; down until `recover`.
    broker: Arc<crate::adapters::publish::FakeBroker>,
    /// What the status page would show.
    board: Board,
    /// The router's bound on body bytes in flight, to see it taken.
    body_budget: Arc<tokio::sync::Semaphore>,
    /// What the shutdown signal sets.
    leaving: Leaving,
    /// The router's fair shares, to make the process busy.
    shares: FairShares,
    /// The router's sources, to take a source's share.
    sources: SourceMap,
    _dir: tempfile::TempDir,
}

/// Body read timeout of the test router.
const BODY_READ_TIMEOUT: Duration = Duration::from_millis(300);

fn state(pipeline: Pipeline, sources: HashMap<(ProviderKind, String), WebhookSource>) -> AppState {
    AppState {
        pipeline,
        body_limit: BODY_LIMIT,
        body_read_timeout: BODY_READ_TIMEOUT,
        body_budget: Arc::new(tokio::sync::Semaphore::new(2 * BODY_LIMIT)),
        connections: ConnectionLimits {
            header_read_timeout: Duration::from_secs(1),
            max_connections: 4,
            shutdown_timeout: Duration::from_secs(1),
            retry_after_secs: RETRY_AFTER_SECS,
        },
        retry_after_secs: RETRY_AFTER_SECS,
        shares: super::FairShares::new(super::ShareSettings {
            busy: 64,
            default_share: 16,
            default_rate: 200,
            retry_after_secs: 60,
        }),
        share_wait: Duration::from_millis(100),
        metrics: crate::observe::telemetry::install(),
        board: Board::new(sources.keys().cloned()),
        sources: Arc::new(arc_swap::ArcSwap::from_pointee(sources)),
        leaving: Leaving::default(),
    }
}

async fn harness() -> Harness {
    // Before the meters are registered, so they record.
    crate::observe::telemetry::install();
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    harness_on(dir, pipeline, broker)
}

/// The routes over `pipeline`, whose broker is taken down (the meters
/// installed before it was made, so they record).
fn harness_on(
    dir: tempfile::TempDir,
    pipeline: Pipeline,
    broker: Arc<crate::adapters::publish::FakeBroker>,
) -> Harness {
    broker.go_down();
    let secrets: Secrets = serde_json::from_value(json!([SECRET])).unwrap();
    let verifier =
        Verifier::new(SchemeName::Base64, "x-mekari-signature", &secrets.0, 300).unwrap();
    let webhook = |name: &str, spools: bool| {
        let source = Source {
            provider: ProviderKind::Mekari,
            name: name.into(),
            account: None,
            topic_prefix: None,
        };
        let webhook = WebhookSource {
            meters: super::RequestMeters::register(&source),
            source: Arc::new(source),
            verifier: verifier.clone(),
            spools,
            share: super::SourceShare::default(),
        };
        ((ProviderKind::Mekari, name.to_owned()), webhook)
    };
    let state = state(
        pipeline.clone(),
        HashMap::from([webhook("main", false), webhook("spooled", true)]),
    );
    Harness {
        body_budget: state.body_budget.clone(),
        leaving: state.leaving.clone(),
        board: state.board.clone(),
        shares: state.shares.clone(),
        sources: state.sources.load_full().as_ref().clone(),
        router: tower::util::BoxCloneSyncService::new(router(state)),
        pipeline,
        broker,
        _dir: dir,
    }
}

fn order(id: &str, occurred_at: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "event": "order.updated", "occurred_at": occurred_at,
        "data": {"id": "ORD-7", "status": "paid", "total": 10}
    }))
    .unwrap()
}

/// A request signed as Mekari signs, with the documented header names.
fn signed(path: &str, delivery_id: Option<&str>, body: Vec<u8>, secret: &str) -> Request<Body> {
    let mut request = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if let Some(id) = delivery_id {
        request = request.header("X-Mekari-Event-ID", id);
    }
    for (name, value) in sign(
        SchemeName::Base64,
        "X-Mekari-Signature",
        secret,
        "",
        0,
        &body,
    ) {
        request = request.header(name, value);
    }
    request.body(Body::from(body)).unwrap()
}

async fn answer(harness: &Harness, request: Request<Body>) -> (StatusCode, Option<String>, Value) {
    let response: Response = harness.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    assert!(!status.is_redirection(), "nothing redirects");
    let retry_after = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry_after, json)
}

/// Posts a correctly signed Mekari order whose body `id` is `body_id`.
async fn post_order(
    harness: &Harness,
    delivery_id: Option<&str>,
    body_id: &str,
    occurred_at: &str,
) -> (StatusCode, Option<String>, Value) {
    let request = signed(
        "/webhooks/mekari/main",
        delivery_id,
        order(body_id, occurred_at),
        SECRET,
    );
    answer(harness, request).await
}

fn error_text(json: &Value) -> &str {
    json["error"].as_str().expect("a JSON error message")
}

#[tokio::test]
async fn unknown_provider_source_and_path_are_json_404s() {
    let h = harness().await;
    for path in [
        "/webhooks/square/main",
        "/webhooks/mekari/nope",
        "/nothing/here",
    ] {
        let (status, _, json) = answer(
            &h,
            signed(path, Some("d"), order("d", "2026-11-29T10:00:00Z"), SECRET),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert!(!error_text(&json).is_empty(), "{path}");
    }
}

#[tokio::test]
async fn a_webhook_path_takes_only_post() {
    let h = harness().await;
    let request = Request::builder()
        .method(Method::GET)
        .uri("/webhooks/mekari/main")
        .body(Body::empty())
        .unwrap();
    let (status, _, json) = answer(&h, request).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_text(&json), "method not allowed");
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_whether_declared_or_streamed() {
    let h = harness().await;
    let big = vec![b' '; BODY_LIMIT + 1];
    let (status, _, json) = answer(
        &h,
        signed("/webhooks/mekari/main", Some("d"), big.clone(), SECRET),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error_text(&json).contains("larger than 4096"));

    let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(big))]);
    let request = Request::post("/webhooks/mekari/main")
        .header("X-Mekari-Event-ID", "d")
        .body(Body::from_stream(stream))
        .unwrap();
    assert!(request.headers().get(header::CONTENT_LENGTH).is_none());
    let (status, _, _) = answer(&h, request).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_wrong_or_missing_signature_is_401() {
    let h = harness().await;
    let body = order("d-sig", "2026-11-29T10:00:00Z");
    let (status, _, json) = answer(
        &h,
        signed(
            "/webhooks/mekari/main",
            Some("d-sig"),
            body.clone(),
            "another-secret",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_text(&json).contains("signature"));
    let unsigned = Request::post("/webhooks/mekari/main")
        .header("X-Mekari-Event-ID", "d-sig")
        .body(Body::from(body))
        .unwrap();
    let (status, _, json) = answer(&h, unsigned).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(error_text(&json).contains("x-mekari-signature"));
}

#[tokio::test]
async fn a_missing_or_mismatched_delivery_id_is_400() {
    let h = harness().await;
    let (status, _, json) = post_order(&h, None, "d-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_text(&json).contains("x-mekari-event-id"));
    let (status, _, json) = post_order(&h, Some("d-other"), "d-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_text(&json).contains("does not equal"));
}

#[tokio::test]
async fn kafka_unreachable_is_503_with_retry_after_and_no_internals() {
    let h = harness().await;
    let (status, retry_after, json) =
        post_order(&h, Some("d-503"), "d-503", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("7"));
    assert_eq!(error_text(&json), "temporarily unavailable, retry later");
}

#[tokio::test]
async fn a_delivery_kafka_takes_is_200_published_and_its_retry_200_duplicate() {
    let h = harness().await;
    h.broker.recover();
    for status in ["published", "duplicate"] {
        let (code, retry_after, json) =
            post_order(&h, Some("d-200"), "d-200", "2026-11-29T10:00:00Z").await;
        assert_eq!(
            (code, json["status"].as_str()),
            (StatusCode::OK, Some(status)),
            "{json}"
        );
        assert_eq!(retry_after, None);
    }
    assert_eq!(h.broker.taken().len(), 1);
}

#[tokio::test]
async fn a_duplicate_of_a_delivery_in_flight_is_503() {
    let h = harness().await;
    let key = crate::domain::event::DeliveryKey::new(ProviderKind::Mekari, "d-busy");
    h.pipeline.ledger().begin(&key).await.unwrap();
    let (status, retry_after, _) =
        post_order(&h, Some("d-busy"), "d-busy", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("7"));
}

#[tokio::test]
async fn a_done_delivery_and_a_stale_event_are_200_without_kafka() {
    let h = harness().await;
    h.pipeline
        .ledger()
        .commit(
            Commit::done(crate::adapters::ledger::Done::published_now(
                crate::domain::event::DeliveryKey::new(ProviderKind::Mekari, "d-done"),
            ))
            .and_state(
                EntitySlot::new(
                    EntityType::Order,
                    &EntityKey::new(ProviderKind::Mekari, None, "ORD-7"),
                ),
                Held::unplaced(EntityState {
                    version: Version::new(time::macros::datetime!(2026-11-29 12:00 UTC), 0),
                    state_hash: [0; 16],
                }),
            ),
        )
        .await
        .unwrap();
    let (status, _, json) = post_order(&h, Some("d-done"), "d-done", "2026-11-29T13:00:00Z").await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("duplicate"))
    );
    let (status, _, json) = post_order(&h, Some("d-old"), "d-old", "2026-11-29T11:00:00Z").await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("stale"))
    );
}

#[tokio::test]
async fn without_a_broker_a_spool_with_room_keeps_posbridge_ready() {
    let h = harness().await;
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    let (status, _, json) = answer(&h, get("/healthz")).await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("ok"))
    );
    let (status, retry_after, json) = answer(&h, get("/readyz")).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(retry_after, None, "Retry-After is for webhook answers");
    assert_eq!(json["broker"], "unavailable");
    assert_eq!(json["ledger"], "ok");
    assert_eq!(json["spool"]["has_room"], true);
    assert_eq!(json["encoding"], "avro-single-object");
}

/// A replica restarted behind a balancer is filled from the topics before
/// it takes the traffic of sources that do not spool: its first fill holds
/// `/readyz` at 503 though its spool has room. A fill that does not run (the
/// broker away at start-up) holds nothing: every replica is alike then.
#[tokio::test]
async fn a_replica_on_its_first_fill_is_not_ready_though_its_spool_has_room() {
    crate::observe::telemetry::install();
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker, gate) =
        Pipeline::on_fake_broker_behind(dir.path(), Duration::from_millis(100), 3).await;
    let h = harness_on(dir, pipeline, broker);
    // `/readyz`'s status and `status` word, and its body.
    let readiness = async || {
        let get = Request::get("/readyz").body(Body::empty()).unwrap();
        let (status, _, json) = answer(&h, get).await;
        let word = json["status"].as_str().map(str::to_owned);
        ((status, word), json)
    };
    let word = |w: &str| Some(w.to_owned());
    let (seen, json) = readiness().await;
    assert_eq!(
        seen,
        (StatusCode::OK, word("degraded")),
        "no fill runs: {json}"
    );
    gate.begin(1, 100);
    let (seen, json) = readiness().await;
    assert_eq!(
        seen,
        (StatusCode::SERVICE_UNAVAILABLE, word("filling")),
        "{json}"
    );
    assert!(
        json["ledger_rebuild"]["first_fill_secs"].is_number(),
        "{json}"
    );
    assert_eq!(json["spool"]["has_room"], true);
    // An attempt that failed is tried again: not ready between the two.
    gate.end(Err("the broker went away".to_owned()));
    let (seen, json) = readiness().await;
    assert_eq!(
        seen,
        (StatusCode::SERVICE_UNAVAILABLE, word("filling")),
        "between two attempts: {json}"
    );
    gate.begin(1, 100);
    gate.end(Ok(()));
    let (seen, json) = readiness().await;
    assert_eq!(
        seen,
        (StatusCode::OK, word("degraded")),
        "filled, the broker away: {json}"
    );
    assert_eq!(json["ledger_rebuild"]["first_fill_secs"], Value::Null);
    // A fill after the first (the ledger found lost while serving) holds
    // nothing either: the spool takes deliveries meanwhile.
    gate.begin(1, 100);
    let (seen, json) = readiness().await;
    assert_eq!(seen.0, StatusCode::OK, "{json}");
}

#[tokio::test]
async fn the_same_state_again_is_200_unchanged() {
    let h = harness().await;
    let body: Value = serde_json::from_slice(&order("d-first", "2026-11-29T10:00:00Z")).unwrap();
    let source = Source {
        provider: ProviderKind::Mekari,
        name: "main".into(),
        account: None,
        topic_prefix: None,
    };
    let ctx = crate::adapters::providers::Context {
        event_id: "d-first",
        source: &source,
        received_at: time::OffsetDateTime::now_utc(),
        raw: &crate::adapters::providers::TEST_RAW,
        origin: crate::domain::event::Origin::Webhook,
        max_event_ahead: std::time::Duration::from_secs(300),
    };
    let crate::domain::event::Normalized { event, content } =
        crate::adapters::providers::for_kind(ProviderKind::Mekari)
            .normalize(&crate::adapters::providers::Json::from(&body), &ctx)
            .unwrap();
    h.pipeline
        .ledger()
        .commit(Commit::state(
            EntitySlot::new(event.entity_type, &event.key()),
            Held::unplaced(EntityState {
                version: event.version,
                state_hash: crate::domain::guard::state_hash(&event, &content),
            }),
        ))
        .await
        .unwrap();
    let (status, _, json) =
        post_order(&h, Some("d-again"), "d-again", "2026-11-29T10:00:00Z").await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("unchanged"))
    );
}

#[tokio::test]
async fn a_trailing_slash_is_404_not_a_redirect_and_ops_paths_take_only_get() {
    let h = harness().await;
    let (status, _, _) = answer(
        &h,
        signed(
            "/webhooks/mekari/main/",
            Some("d"),
            order("d", "2026-11-29T10:00:00Z"),
            SECRET,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in ["/healthz", "/readyz", "/metrics"] {
        let request = Request::post(path).body(Body::empty()).unwrap();
        let (status, _, json) = answer(&h, request).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{path}");
        assert_eq!(error_text(&json), "method not allowed");
    }
}

#[tokio::test]
async fn a_body_that_breaks_off_is_400() {
    let h = harness().await;
    let stream = futures::stream::iter([
        Ok(Bytes::from_static(b"{\"id\":")),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "client went away",
        )),
    ]);
    let request = Request::post("/webhooks/mekari/main")
        .header("X-Mekari-Event-ID", "d-cut")
        .body(Body::from_stream(stream))
        .unwrap();
    let (status, _, json) = answer(&h, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_text(&json).contains("could not read the body"));
}

#[tokio::test]
async fn a_spooling_source_answers_200_spooled_then_503_when_the_spool_is_full() {
    let h = harness().await;
    for id in ["s-1", "s-2", "s-3"] {
        let request = signed(
            "/webhooks/mekari/spooled",
            Some(id),
            order(id, "2026-11-29T10:00:00Z"),
            SECRET,
        );
        let (status, _, json) = answer(&h, request).await;
        assert_eq!(
            (status, json["status"].as_str()),
            (StatusCode::OK, Some("spooled"))
        );
    }
    let request = signed(
        "/webhooks/mekari/spooled",
        Some("s-4"),
        order("s-4", "2026-11-29T10:00:00Z"),
        SECRET,
    );
    let (status, retry_after, json) = answer(&h, request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after.as_deref(), Some("7"));
    assert_eq!(error_text(&json), "temporarily unavailable, retry later");
    let get = Request::get("/readyz").body(Body::empty()).unwrap();
    let (status, _, json) = answer(&h, get).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "no broker and no room: {json}"
    );
    assert_eq!(json["spool"]["entries"], 3);
}

async fn boom() -> &'static str {
    panic!("a bug")
}

/// A bug that panics inside a webhook request is answered 503 + Retry-After
/// with the JSON body, not a connection closed without an answer.
#[tokio::test]
async fn a_panic_in_a_request_is_a_503_with_a_json_body() {
    let h = harness().await;
    let state = state(h.pipeline.clone(), HashMap::new());
    let router = super::answered(
        Router::new().route("/boom", axum::routing::post(boom)),
        state,
    );
    let response: Response = router
        .oneshot(Request::post("/boom").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[header::RETRY_AFTER], "7");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let json: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(json["error"], "temporarily unavailable, retry later");
}

/// A body that stops arriving is answered 408 (retried by both providers)
/// once `body_read_timeout_ms` passes, not waited for.
#[tokio::test]
async fn a_body_that_stalls_is_a_408_after_the_body_timeout() {
    let h = harness().await;
    let stalled =
        futures::stream::once(async { Ok::<_, std::io::Error>(Bytes::from_static(b"{")) })
            .chain(futures::stream::pending());
    let request = Request::post("/webhooks/mekari/main")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stalled))
        .unwrap();
    let started = std::time::Instant::now();
    let (status, _, json) = answer(&h, request).await;
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT, "{json}");
    assert!(
        json["error"].as_str().unwrap().contains("did not arrive"),
        "{json}"
    );
    assert!(started.elapsed() >= BODY_READ_TIMEOUT);
}

/// Bodies being read at once are bounded in bytes: a request that would
/// pass the bound is answered 503 + Retry-After before its body is read.
#[tokio::test]
async fn bodies_past_the_bytes_in_flight_bound_are_a_503() {
    let h = harness().await;
    let (_hold, held) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    // Two stalled bodies of the largest size take the whole budget (2 × BODY_LIMIT).
    let stalled = |body| {
        Request::post("/webhooks/mekari/main")
            .header(header::CONTENT_LENGTH, BODY_LIMIT)
            .body(Body::from_stream(body))
            .unwrap()
    };
    let (_hold2, held2) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let first = tokio::spawn(h.router.clone().oneshot(stalled(held)));
    let second = tokio::spawn(h.router.clone().oneshot(stalled(held2)));
    while h.body_budget.available_permits() > 0 {
        tokio::task::yield_now().await;
    }
    let (status, retry_after, json) =
        post_order(&h, Some("E-1"), "E-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert_eq!(retry_after.as_deref(), Some("7"));
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains("too many request bodies"),
        "{json}"
    );
    // Once the stalled ones time out, their bytes are free again.
    for stalled in [first, second] {
        assert_eq!(
            stalled.await.unwrap().unwrap().status(),
            StatusCode::REQUEST_TIMEOUT
        );
    }
    // (Without a broker it now gets as far as Kafka: 503 for that reason.)
    let (_, _, json) = post_order(&h, Some("E-1"), "E-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(json["error"], "temporarily unavailable, retry later");
}

mod board;
mod leaving;
mod share;
