//! Deliveries over their source's fair share while the process is busy:
//! 429 + `Retry-After` for Mekari, the spool for a spooling ReceiptRoller
//! source, and the others' deliveries taken in meanwhile.

use super::*;
use crate::http::ingress::share::Place;

/// The share settings of the test router ([`state`]).
const BUSY: usize = 64;
const SHARE: usize = 16;

/// Makes the process busy with one delivery each of many other sources,
/// and takes the whole share of `source`: holding far more than they do,
/// its next delivery is over its share.
fn busy_with(shares: &FairShares, source: &SourceShare) -> Vec<Place> {
    let mut places: Vec<Place> = (0..BUSY)
        .map(|_| shares.try_admit(&SourceShare::new(None, None)).unwrap())
        .collect();
    places.extend((0..SHARE).map(|_| shares.try_admit(source).unwrap()));
    assert!(shares.try_admit(source).is_err(), "over its share");
    places
}

#[tokio::test]
async fn a_mekari_source_over_its_share_is_429_with_retry_after_while_another_is_taken_in() {
    let h = harness().await;
    let main = &h.sources[&(ProviderKind::Mekari, "main".to_owned())];
    let places = busy_with(&h.shares, &main.share);
    // The recorder is the test process's: the count this test adds.
    let refused_before = refused_of_mekari_main();

    let (status, retry_after, json) =
        post_order(&h, Some("o-1"), "o-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after.as_deref(), Some("60"));
    assert_eq!(
        error_text(&json),
        "this source has its share of deliveries in flight, retry later"
    );
    // Another source, within its own share, is taken in (and spooled: the
    // broker is down).
    let request = signed(
        "/webhooks/mekari/spooled",
        Some("o-2"),
        order("o-2", "2026-11-29T10:00:00Z"),
        SECRET,
    );
    let (status, _, json) = answer(&h, request).await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("spooled"))
    );

    // Its share free again, the refused delivery is taken in.
    drop(places);
    h.broker.recover();
    let (status, _, json) = post_order(&h, Some("o-1"), "o-1", "2026-11-29T10:00:00Z").await;
    assert_eq!(
        (status, json["status"].as_str()),
        (StatusCode::OK, Some("published"))
    );
    assert_eq!(
        refused_of_mekari_main() - refused_before,
        1.0,
        "counted once"
    );
}

/// Mekari `main`'s deliveries refused over its share, as `/metrics` has them.
fn refused_of_mekari_main() -> f64 {
    let metrics = crate::observe::telemetry::install().render();
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("posbridge_deliveries_over_share_total{")
                && [
                    "provider=\"mekari\"",
                    "source=\"main\"",
                    "action=\"refused\"",
                ]
                .iter()
                .all(|label| line.contains(label))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_receiptroller_source_over_its_share_is_spooled_never_refused() {
    crate::observe::telemetry::install();
    let dir = tempfile::tempdir().unwrap();
    let (pipeline, broker) = Pipeline::on_fake_broker(dir.path(), Duration::from_millis(100)).await;
    // Kafka answers: what is spooled is spooled for its share alone.
    broker.recover();
    let secrets: Secrets = serde_json::from_value(json!([SECRET])).unwrap();
    let source = Source {
        provider: ProviderKind::ReceiptRoller,
        name: "shop".into(),
        account: None,
        topic_prefix: None,
    };
    let webhook = WebhookSource {
        meters: super::RequestMeters::register(&source),
        source: Arc::new(source),
        verifier: Verifier::new(SchemeName::Hex, "x-rr-signature", &secrets.0, 300).unwrap(),
        spools: true,
        share: SourceShare::default(),
    };
    let share = webhook.share.clone();
    let state = state(
        pipeline.clone(),
        HashMap::from([((ProviderKind::ReceiptRoller, "shop".to_owned()), webhook)]),
    );
    let shares = state.shares.clone();
    let router = router(state);
    let _places = busy_with(&shares, &share);

    let sale = |id: &str| {
        let body = serde_json::to_vec(&json!({"id": id, "type": "sale.created"})).unwrap();
        let mut request = Request::post("/webhooks/receiptroller/shop")
            .header(header::CONTENT_TYPE, "application/json")
            .header("X-RR-Delivery", id);
        for (name, value) in sign(SchemeName::Hex, "X-RR-Signature", SECRET, "", 0, &body) {
            request = request.header(name, value);
        }
        request.body(Body::from(body)).unwrap()
    };
    let status_of = async |request| {
        let response: Response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json: Value = serde_json::from_slice(&bytes).unwrap();
        (
            status,
            json["status"].as_str().unwrap_or("error").to_owned(),
        )
    };
    assert_eq!(
        status_of(sale("r-1")).await,
        (StatusCode::OK, "spooled".to_owned())
    );
    assert_eq!(pipeline.spool().unwrap().stats().entries, 1);
    // Its retry, over its share again, is the spool's duplicate.
    assert_eq!(
        status_of(sale("r-1")).await,
        (StatusCode::OK, "duplicate".to_owned())
    );
    assert_eq!(pipeline.spool().unwrap().stats().entries, 1);
    assert!(broker.taken().is_empty(), "nothing reached Kafka");
}
