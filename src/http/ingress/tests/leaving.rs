//! Leaving: from the shutdown signal on, `/readyz` turns 503 while the
//! webhooks are still answered, each answer closing its connection.

use super::*;

/// The status and the `Connection` header of the router's answer.
async fn status_and_connection(
    h: &Harness,
    request: Request<Body>,
) -> (StatusCode, Option<String>) {
    let response = h.router.clone().oneshot(request).await.unwrap();
    let connection = response
        .headers()
        .get(header::CONNECTION)
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), connection)
}

fn spooled_order(id: &str) -> Request<Body> {
    signed(
        "/webhooks/mekari/spooled",
        Some(id),
        order(id, "2026-11-29T10:00:00Z"),
        SECRET,
    )
}

#[tokio::test]
async fn leaving_turns_readiness_503_and_keeps_answering_webhooks_on_closing_connections() {
    let h = harness().await;
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    assert_eq!(
        status_and_connection(&h, get("/readyz")).await,
        (StatusCode::OK, None)
    );
    assert_eq!(
        status_and_connection(&h, spooled_order("L-1")).await,
        (StatusCode::OK, None)
    );

    h.leaving.begin();
    let (status, _, json) = answer(&h, get("/readyz")).await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("stopping"))
    );
    assert_eq!(
        status_and_connection(&h, get("/healthz")).await,
        (StatusCode::OK, Some("close".into())),
        "alive all the same"
    );
    let (status, connection) = status_and_connection(&h, spooled_order("L-2")).await;
    assert_eq!(
        (status, connection.as_deref()),
        (StatusCode::OK, Some("close")),
        "still answered, its connection closed after it"
    );
}
