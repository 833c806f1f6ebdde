//! The delivery rules and the APIs over real HTTP: a scripted receiver plays
//! posbridge, the simulator runs on a clock compressed far enough that the
//! providers' hours take milliseconds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use base64::Engine;
use posbridge::adapters::providers::mekari::api_authorization;
use posbridge::domain::event::ProviderKind;
use posbridge::domain::verify::hmac_sha256;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::Value;

use crate::clock::TimeScale;
use crate::plan::{self, Plan, PlanConfig, Step};
use crate::state::{Fate, Settings, Sim, lock};
use crate::truth::Truth;
use crate::{api, deliver};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// How the receiver answers: status and `Retry-After` for a request path.
type Script = Arc<dyn Fn(&str) -> (StatusCode, Option<&'static str>) + Send + Sync>;

#[derive(Clone)]
struct Receiver {
    script: Script,
    received: Arc<Mutex<Vec<Received>>>,
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let path = uri.path().to_owned();
    let (status, retry_after) = (receiver.script)(&path);
    lock(&receiver.received).push(Received {
        path,
        headers,
        body,
    });
    let mut response = status.into_response();
    if let Some(secs) = retry_after {
        response.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static(secs),
        );
    }
    response
}

/// Starts a receiver on a free port; returns its base URL and its log.
async fn receiver(script: Script) -> (String, Arc<Mutex<Vec<Received>>>) {
    let received = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().fallback(receive).with_state(Receiver {
        script,
        received: received.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn settings(target: &str, scale: f64) -> Settings {
    Settings {
        target: target.to_owned(),
        receiptroller_url: format!("{target}/webhooks/receiptroller/main"),
        mekari_url: format!("{target}/webhooks/mekari/main"),
        receiptroller_secret: "rr-secret".into(),
        mekari_secret: "mekari-secret".into(),
        receiptroller_token: "rr-token".into(),
        mekari_client_id: "client".into(),
        mekari_client_secret: "client-secret".into(),
        api_fail_rate: 0.0,
        api_clock_offset_secs: 0,
        api_fault: None,
        scale: TimeScale::new(scale),
        seed: 9,
        run_id: "T".into(),
    }
}

fn plan_config(events: usize) -> PlanConfig {
    PlanConfig {
        events,
        outlets: vec!["OUT-1".into(), "OUT-2".into()],
        duplicates: 0.0,
        duplicates_at_once: false,
        reorder: 0.0,
        drop: 0.0,
        offline: 0.0,
        run_id: "T".into(),
    }
}

fn sim(target: &str, config: &PlanConfig, scale: f64) -> (Sim, Plan) {
    let plan = plan::generate(config, &mut StdRng::seed_from_u64(9));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let sim = Sim::new(
        settings(target, scale),
        Truth::new(plan.entities.clone()),
        plan.steps.len(),
        4,
        client,
    );
    (sim, plan)
}

fn fates(sim: &Sim, provider: ProviderKind) -> Vec<(Fate, u32)> {
    lock(&sim.events)
        .iter()
        .filter(|r| r.provider == provider)
        .map(|r| (r.fate, r.attempts))
        .collect()
}

/// Runs a whole plan against a receiver answering by `script`; returns the
/// simulator once every delivery is over, and what the receiver got.
async fn run_plan(
    script: Script,
    config: &PlanConfig,
    scale: f64,
    spread: Duration,
) -> (Sim, Arc<Mutex<Vec<Received>>>) {
    let (url, received) = receiver(script).await;
    let (sim, plan) = sim(&url, config, scale);
    deliver::run(sim.clone(), plan.steps, spread).await;
    (sim, received)
}

/// Serves the simulator's APIs on a free port; returns their base URL.
async fn serve_api(sim: &Sim) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(axum::serve(listener, api::router(sim.clone())).into_future());
    base
}

fn always(status: StatusCode) -> Script {
    Arc::new(move |_| (status, None))
}

/// `status` (with `Retry-After`) for one provider's webhooks, 200 for the other's.
fn failing(
    provider: &'static str,
    status: StatusCode,
    retry_after: Option<&'static str>,
) -> Script {
    Arc::new(move |path: &str| {
        if path.contains(provider) {
            (status, retry_after)
        } else {
            (StatusCode::OK, None)
        }
    })
}

#[tokio::test]
async fn every_event_arrives_signed_once_plus_its_duplicates() {
    let (url, received) = receiver(always(StatusCode::OK)).await;
    let mut config = plan_config(60);
    config.duplicates = 0.3;
    config.reorder = 0.3;
    config.drop = 0.2;
    let (sim, plan) = sim(&url, &config, 600.0);
    let planned_drops = plan.steps.iter().filter(|s| s.faults.drop).count();
    deliver::run(sim.clone(), plan.steps, Duration::from_millis(300)).await;

    let status = sim.status();
    let deliveries = &status["deliveries"];
    assert_eq!(status["sending_done"], true);
    assert_eq!(deliveries["dropped"], planned_drops);
    assert_eq!(deliveries["delivered"], 60 - planned_drops);
    let duplicated = deliveries["duplicated"].as_u64().unwrap();
    assert!(duplicated > 0);
    assert_eq!(
        deliveries["succeeded"],
        (60 - planned_drops) as u64 + duplicated
    );
    assert_eq!(deliveries["failed"], 0);
    let received = lock(&received).clone();
    assert_eq!(
        deliveries["attempted"].as_u64().unwrap(),
        received.len() as u64
    );
    for request in &received {
        let header = |name: &str| request.headers.get(name).unwrap().to_str().unwrap();
        let body: Value = serde_json::from_slice(&request.body).unwrap();
        if request.path == "/webhooks/receiptroller/main" {
            assert_eq!(header("x-rr-delivery"), body["id"]);
            let mac = hmac_sha256(b"rr-secret", &[&request.body]);
            assert_eq!(
                header("x-rr-signature"),
                format!("sha256={}", hex::encode(mac))
            );
        } else {
            assert_eq!(request.path, "/webhooks/mekari/main");
            assert_eq!(header("x-mekari-event-id"), body["id"]);
            let mac = hmac_sha256(b"mekari-secret", &[&request.body]);
            assert_eq!(
                header("x-mekari-signature"),
                base64::engine::general_purpose::STANDARD.encode(mac)
            );
        }
    }
}

#[tokio::test]
async fn four_failures_switch_the_receiptroller_webhook_off() {
    let script = failing("receiptroller", StatusCode::UNAUTHORIZED, None);
    // 1 h of documented time is 36 ms.
    let (sim, _) = run_plan(
        script,
        &plan_config(40),
        100_000.0,
        Duration::from_millis(400),
    )
    .await;

    assert!(!lock(&sim.receiptroller).active);
    let fates = fates(&sim, ProviderKind::ReceiptRoller);
    assert!(fates.contains(&(Fate::Failed, 4)), "{fates:?}");
    assert!(fates.iter().any(|(f, _)| *f == Fate::Lost), "{fates:?}");
    assert!(
        fates
            .iter()
            .all(|(f, a)| matches!((f, a), (Fate::Failed, 4) | (Fate::Lost, 0))),
        "{fates:?}"
    );
    assert_eq!(sim.status()["mekari_status"], "active");
}

#[tokio::test]
async fn a_restart_drops_pending_retries_without_switching_off() {
    let (url, received) = receiver(always(StatusCode::SERVICE_UNAVAILABLE)).await;
    let mut config = plan_config(20);
    config.outlets = vec!["OUT-1".into()];
    // The first retry comes after a real second: time to restart.
    let (sim, plan) = sim(&url, &config, 60.0);
    let steps: Vec<Step> = plan
        .steps
        .iter()
        .filter(|s| plan.entities[s.entity].provider == ProviderKind::ReceiptRoller)
        .take(1)
        .cloned()
        .collect();
    let run = tokio::spawn(deliver::run(sim.clone(), steps, Duration::ZERO));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(lock(&sim.receiptroller).restart(), 1);
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap();
    let all = lock(&sim.events).clone();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].provider, ProviderKind::ReceiptRoller);
    assert_eq!((all[0].fate, all[0].attempts), (Fate::Abandoned, 1));
    assert!(lock(&sim.receiptroller).active);
    assert_eq!(lock(&received).len(), 1);
}

#[tokio::test]
async fn ten_permanent_failures_pause_mekari_and_put_resumes_it() {
    let script = failing("mekari", StatusCode::BAD_REQUEST, None);
    let (sim, _) = run_plan(
        script,
        &plan_config(80),
        100_000.0,
        Duration::from_millis(1600),
    )
    .await;

    let fates = fates(&sim, ProviderKind::Mekari);
    let failed = fates.iter().filter(|f| **f == (Fate::Failed, 1)).count();
    // The tenth pauses; one still in flight at that moment may fail too.
    assert!((10..=11).contains(&failed), "{fates:?}");
    assert!(fates.contains(&(Fate::Lost, 0)), "{fates:?}");
    assert_eq!(sim.status()["mekari_status"], "paused");
    assert!(lock(&sim.receiptroller).active);

    // Resume through the API, signed as the reconciler signs.
    let base = serve_api(&sim).await;
    let path = "/mekari/webhooks/endpoints/ep_sim";
    let date = httpdate::fmt_http_date(std::time::SystemTime::now());
    let client = reqwest::Client::new();
    let put = |authorization: String| {
        client
            .put(format!("{base}{path}"))
            .header("date", &date)
            .header("authorization", authorization)
            .send()
    };
    let refused = put(api_authorization("client", "wrong", &date, "PUT", path))
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["message"], "signature mismatch");
    assert_eq!(sim.status()["mekari_status"], "paused");
    let resumed = put(api_authorization(
        "client",
        "client-secret",
        &date,
        "PUT",
        path,
    ))
    .await
    .unwrap();
    assert_eq!(resumed.status(), 200);
    let body: Value = resumed.json().await.unwrap();
    assert_eq!(body["data"]["status"], "active");
    assert_eq!(body["data"]["consecutive_failures"], 0);
}

#[tokio::test]
async fn retryable_answers_are_retried_eight_times_then_fail_for_good() {
    let script = failing("mekari", StatusCode::TOO_MANY_REQUESTS, Some("120"));
    let mut config = plan_config(30);
    config.drop = 0.0;
    let (sim, received) = run_plan(script, &config, 1_000_000.0, Duration::from_millis(100)).await;
    let fates = fates(&sim, ProviderKind::Mekari);
    assert!(fates.contains(&(Fate::Failed, 8)), "{fates:?}");
    // A delivery that used up its eight attempts failed for good and counts
    // towards the pause, which cancels the retries still waiting.
    for fate in &fates {
        assert!(
            matches!(
                fate,
                (Fate::Failed, 8) | (Fate::Lost, 0) | (Fate::Abandoned, 1..8)
            ),
            "{fates:?}"
        );
    }
    let mekari_requests = lock(&received)
        .iter()
        .filter(|r| r.path.contains("mekari"))
        .count();
    let attempts: u32 = fates.iter().map(|(_, a)| a).sum();
    assert_eq!(mekari_requests, attempts as usize);
}

/// The APIs answer from the truth: sales in a window for the bearer token,
/// Mekari lists only for a signed request with a current `Date`.
#[tokio::test]
async fn the_apis_serve_the_truth_behind_their_auth_checks() {
    let mut config = plan_config(240);
    config.drop = 1.0;
    let (sim, _) = run_plan(always(StatusCode::OK), &config, 600.0, Duration::ZERO).await;
    let base = serve_api(&sim).await;
    let client = reqwest::Client::new();

    let truth: Value = client
        .get(format!("{base}/sim/truth"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entities = truth["entities"].as_array().unwrap();
    let count = |provider: &str, entity_type: &str| {
        entities
            .iter()
            .filter(|e| {
                e["provider"] == provider
                    && e["entity_type"] == entity_type
                    && e["deleted"] == false
            })
            .count()
    };

    let now = time::OffsetDateTime::now_utc();
    let fmt = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let window = [
        ("from", fmt(now - time::Duration::hours(1))),
        ("to", fmt(now + time::Duration::hours(1))),
        ("per_page", "3".to_owned()),
    ];
    let unauthorized = client
        .get(format!("{base}/receiptroller/transactions"))
        .query(&window)
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    let mut sales = 0;
    let mut page = 1;
    loop {
        let answer: Value = client
            .get(format!("{base}/receiptroller/transactions"))
            .query(&window)
            .query(&[("page", page)])
            .bearer_auth("rr-token")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sales += answer["items"].as_array().unwrap().len();
        if page >= answer["total_pages"].as_u64().unwrap() {
            break;
        }
        page += 1;
    }
    assert_eq!(sales, count("receiptroller", "sale"));
    assert!(sales > 0);

    let signed_get = |path_and_query: String, secret: &'static str, date: String| {
        let authorization = api_authorization("client", secret, &date, "GET", &path_and_query);
        client
            .get(format!("{base}{path_and_query}"))
            .header("date", date)
            .header("authorization", authorization)
            .send()
    };
    let now_date = || httpdate::fmt_http_date(std::time::SystemTime::now());
    // Every list (240 events make at least one of each): the outlet-scoped
    // ones per outlet, the catalogue at once.
    let lists = [
        ("orders", "order"),
        ("returns", "return"),
        ("refunds", "refund"),
        ("exchanges", "exchange"),
        ("products", "product"),
        ("collections", "collection"),
    ];
    for (list, entity_type) in lists {
        let queries: &[&str] = match list {
            "products" | "collections" => &[""],
            _ => &["outlet_id=OUT-1&", "outlet_id=OUT-2&"],
        };
        let mut found = 0;
        for query in queries {
            let answer: Value = signed_get(
                format!("/mekari/{list}?{query}per_page=200"),
                "client-secret",
                now_date(),
            )
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
            found += answer["data"].as_array().unwrap().len();
            assert_eq!(answer["meta"]["total_pages"], 1, "{list}");
        }
        assert_eq!(found, count("mekari", entity_type), "{list}");
        assert!(found > 0, "{list}");
    }
    let products: Value = signed_get("/mekari/products".into(), "client-secret", now_date())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        products["data"].as_array().unwrap().len(),
        count("mekari", "product")
    );
    let missing_outlet = signed_get("/mekari/returns".into(), "client-secret", now_date())
        .await
        .unwrap();
    assert_eq!(missing_outlet.status(), 400);

    let skewed = httpdate::fmt_http_date(std::time::SystemTime::now() - Duration::from_secs(400));
    let refused = signed_get("/mekari/products".into(), "client-secret", skewed)
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["message"].as_str().unwrap().starts_with("clock skew"),
        "{body}"
    );
    let refused = signed_get("/mekari/products".into(), "wrong-secret", now_date())
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["message"], "signature mismatch");
}
