//! What the admin listener shows of the answers: the status board, its page
//! and the page's credentials.

use super::*;

/// The admin router over the harness's pipeline and board.
fn admin(h: &Harness, config: &crate::config::AdminConfig) -> Router {
    super::admin_router(
        super::AdminState {
            pipeline: h.pipeline.clone(),
            board: h.board.clone(),
            sources: Arc::new(crate::http::status::SourcesReport::default),
            rederive: crate::services::rederive::Runs::idle(h.pipeline.clone()),
            lookup: crate::services::lookup::Lookup::idle(h.pipeline.clone()),
        },
        config,
    )
}

async fn get(router: &Router, path: &str, authorization: Option<&str>) -> (StatusCode, String) {
    let mut request = Request::get(path);
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn every_answer_reaches_the_status_board() {
    let h = harness().await;
    let (status, _, _) = answer(
        &h,
        signed(
            "/webhooks/mekari/main",
            Some("d-bad-sig"),
            order("d-bad-sig", "2026-11-29T10:00:00Z"),
            "wrong-secret",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, _) =
        post_order(&h, Some("d-other"), "d-mismatch", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) =
        post_order(&h, Some("d-no-kafka"), "d-no-kafka", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    let (status, json) = get(&admin(&h, &Default::default()), "/status.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let json: Value = serde_json::from_str(&json).unwrap();
    let main = json["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "main")
        .expect("the configured source is listed");
    assert_eq!(main["last_5_min"]["401"], 1);
    assert_eq!(main["last_5_min"]["400"], 1);
    assert_eq!(main["last_5_min"]["503"], 1);
    assert_eq!(main["signature_failures"], 1);
    let recent: Vec<&str> = main["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["delivery_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        recent,
        ["d-no-kafka", "d-other", "d-bad-sig"],
        "newest first"
    );
    assert_eq!(json["health"]["broker"], "unavailable");
}

#[tokio::test]
async fn a_handled_delivery_reaches_the_board_with_its_event_and_entity() {
    let h = harness().await;
    h.broker.recover();
    let (status, _, _) = post_order(&h, Some("d-board"), "d-board", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::OK);
    let (_, json) = get(&admin(&h, &Default::default()), "/status.json", None).await;
    let json: Value = serde_json::from_str(&json).unwrap();
    let row = &json["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "main")
        .expect("the configured source is listed")["recent"][0];
    assert_eq!(row["delivery_id"], "d-board", "{row}");
    assert_eq!(row["event_type"], "order.updated", "{row}");
    assert_eq!(row["entity_key"], "mekari:ORD-7", "{row}");
    assert_eq!(row["answer"]["outcome"], "published", "{row}");
    assert_eq!(row["answer"]["status"], 200, "{row}");
}

#[tokio::test]
async fn the_status_page_escapes_what_providers_sent() {
    let h = harness().await;
    let hostile = "<script>alert(1)</script>";
    post_order(&h, Some(hostile), "d-x", "2026-11-29T10:00:00Z").await;
    let (status, html) = get(&admin(&h, &Default::default()), "/status", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{html}"
    );
    assert!(!html.contains(hostile));
    assert!(html.contains("mekari / main"));
}

#[tokio::test]
async fn the_status_page_asks_for_its_credentials_when_configured() {
    let h = harness().await;
    let config: crate::config::AdminConfig = serde_json::from_value(json!({
        "token": "t0ken", "username": "ops", "password": "pa55"
    }))
    .unwrap();
    let router = admin(&h, &config);
    for path in ["/status", "/status.json"] {
        assert_eq!(
            get(&router, path, None).await.0,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
        assert_eq!(
            get(&router, path, Some("Bearer wrong")).await.0,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            get(&router, path, Some("Bearer t0ken")).await.0,
            StatusCode::OK
        );
        // ops:pa55
        assert_eq!(
            get(&router, path, Some("Basic b3BzOnBhNTU=")).await.0,
            StatusCode::OK
        );
    }
}
