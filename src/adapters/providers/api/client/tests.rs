//! The client against `FakeProviderApi`: retries, waits, and answers that
//! misbehave.

use std::sync::Mutex;

use serde_json::json;

use super::*;
use crate::adapters::providers::api::fake::{Answer, FakeProviderApi};
use crate::config::ReconcileConfig;

struct NoAuth;

impl Authorize for NoAuth {
    fn authorize(&self, request: RequestBuilder, _: &Method, _: &Url) -> RequestBuilder {
        request
    }
}

/// A client of `base` with `max_attempts` whose waits are recorded, not slept.
fn client(base: &str, max_attempts: u32) -> (ApiClient, Arc<Mutex<Vec<Duration>>>) {
    client_with(base, max_attempts, Duration::from_secs(10))
}

/// The same with `timeout` per attempt.
fn client_with(
    base: &str,
    max_attempts: u32,
    timeout: Duration,
) -> (ApiClient, Arc<Mutex<Vec<Duration>>>) {
    let options = ApiOptions::new(&ReconcileConfig {
        max_attempts,
        request_timeout_ms: u64::try_from(timeout.as_millis()).unwrap(),
        ..ReconcileConfig::default()
    });
    let waits = Arc::new(Mutex::new(Vec::new()));
    let recorded = waits.clone();
    let client = ApiClient::new(base, Arc::new(NoAuth), &options)
        .unwrap()
        .with_sleep(move |wait| {
            recorded.lock().unwrap().push(wait);
            Box::pin(std::future::ready(()))
        });
    (client, waits)
}

fn waits(recorded: &Arc<Mutex<Vec<Duration>>>) -> Vec<Duration> {
    recorded.lock().unwrap().clone()
}

fn busy(status: u16, retry_after: Option<String>) -> Answer {
    Answer::Status(StatusCode::from_u16(status).unwrap(), retry_after)
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn retry_after_in_seconds_is_waited() {
    let (fake, base) = FakeProviderApi::serve(vec![
        busy(429, Some("3".into())),
        busy(503, Some(" 7 ".into())),
        busy(429, Some("7200".into())),
    ])
    .await;
    let (client, recorded) = client(&base, 5);
    assert_eq!(
        client.get("/sales", &[]).await.unwrap(),
        serde_json::json!({})
    );
    assert_eq!(fake.requests(), 4);
    assert_eq!(
        waits(&recorded),
        [3 * SECOND, 7 * SECOND, MAX_WAIT],
        "an hour's Retry-After waits the cap"
    );
}

#[tokio::test]
async fn retry_after_as_an_http_date_is_waited_until_then() {
    let date = |from_now: Duration| Some(httpdate::fmt_http_date(SystemTime::now() + from_now));
    let (fake, base) = FakeProviderApi::serve(vec![
        busy(503, date(Duration::from_secs(20))),
        busy(429, date(Duration::from_secs(3600))),
        busy(503, Some("Sun, 06 Nov 1994 08:49:37 GMT".into())),
    ])
    .await;
    let (client, recorded) = client(&base, 4);
    client.get("/sales", &[]).await.unwrap();
    assert_eq!(fake.requests(), 4);
    let waits = waits(&recorded);
    // The date has whole seconds: 20 s from now is 19 to 20 s away.
    assert!(
        (15 * SECOND..=20 * SECOND).contains(&waits[0]),
        "until the date: {waits:?}"
    );
    assert_eq!(waits[1], MAX_WAIT, "an hour away waits the cap");
    // A date gone by asks for nothing: the third backoff, 1 to 2 s.
    assert!(
        (SECOND..2 * SECOND).contains(&waits[2]),
        "the backoff: {waits:?}"
    );
}

#[tokio::test]
async fn the_backoff_doubles_with_jitter_and_the_attempts_end() {
    let (fake, base) = FakeProviderApi::serve(vec![busy(500, None); 4]).await;
    let (client, recorded) = client(&base, 4);
    let error = client.get("/sales", &[]).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::GaveUp { attempts: 4, last: AttemptError::Status(s), .. } if *s == StatusCode::INTERNAL_SERVER_ERROR),
        "{error}"
    );
    assert_eq!(fake.requests(), 4);
    let waits = waits(&recorded);
    assert_eq!(waits.len(), 3, "{waits:?}");
    for (wait, base) in waits.iter().zip([1, 2, 4].map(|n| FIRST_BACKOFF * n)) {
        // Jitter adds a random part of up to as much again; exactly the
        // base would mean none (a chance of 1 in 2^24).
        assert!(
            *wait > base && *wait < 2 * base,
            "{wait:?} after a base of {base:?}: {waits:?}"
        );
    }
}

#[tokio::test]
async fn a_refusal_is_not_retried() {
    let (fake, base) = FakeProviderApi::serve(vec![busy(401, Some("1".into()))]).await;
    let (client, recorded) = client(&base, 4);
    let error = client.get("/sales", &[]).await.unwrap_err();
    assert!(
        matches!(&error, FetchError::Refused { status, .. } if *status == StatusCode::UNAUTHORIZED),
        "{error}"
    );
    assert_eq!(fake.requests(), 1);
    assert_eq!(waits(&recorded), Vec::<Duration>::new());
}

const MIB: usize = 1024 * 1024;

/// A page as ReceiptRoller's Transactions API answers it.
fn page() -> serde_json::Value {
    json!({"items": [{"id": "T1|2026-11|000001"}], "page": 1, "total_pages": 1})
}

#[tokio::test]
async fn a_body_past_the_limit_is_refused_while_it_streams() {
    let (fake, base) = FakeProviderApi::serve(vec![Answer::Huge(64 * MIB)]).await;
    let (client, recorded) = client(&base, 4);
    let error = client.get("/transactions", &[]).await.unwrap_err();
    assert!(error.to_string().contains("larger than"), "{error}");
    assert_eq!(fake.requests(), 1, "a body too large is not asked again");
    assert_eq!(waits(&recorded), Vec::<Duration>::new());
    // Stopped near the limit: what the fake handed over is the limit
    // plus the sockets' buffers, not the whole body.
    assert!(
        fake.streamed() < 32 * MIB as u64,
        "{} bytes streamed",
        fake.streamed()
    );
}

#[tokio::test]
async fn a_body_cut_short_is_retried_as_a_connection_error() {
    let (fake, base) =
        FakeProviderApi::serve(vec![Answer::CutShort(100_000), Answer::Json(page())]).await;
    let (client, recorded) = client(&base, 3);
    assert_eq!(client.get("/transactions", &[]).await.unwrap(), page());
    assert_eq!(fake.requests(), 2);
    assert_eq!(
        waits(&recorded).len(),
        1,
        "one wait, as for a refused connection"
    );
}

#[tokio::test]
async fn a_body_dripping_past_the_timeout_is_retried_as_a_connection_error() {
    let (fake, base) = FakeProviderApi::serve(vec![
        Answer::Drip(Duration::from_millis(20)),
        Answer::Drip(Duration::from_millis(20)),
    ])
    .await;
    let (client, _) = client_with(&base, 2, Duration::from_millis(300));
    let error = client.get("/transactions", &[]).await.unwrap_err();
    assert!(
        matches!(
            &error,
            FetchError::GaveUp {
                attempts: 2,
                last: AttemptError::Transport(_),
                ..
            }
        ),
        "{error}"
    );
    assert_eq!(fake.requests(), 2);
}

#[tokio::test]
async fn a_redirect_to_another_host_is_not_followed() {
    let (elsewhere, other) = FakeProviderApi::serve_on("127.0.0.2", vec![]).await;
    let (fake, base) =
        FakeProviderApi::serve(vec![Answer::Redirect(format!("{other}/webhooks/wh_1"))]).await;
    let (client, _) = client(&base, 3);
    let error = client
        .call(
            Method::PATCH,
            "/webhooks/wh_1",
            &[],
            Some(&json!({"active": true})),
        )
        .await
        .unwrap_err();
    assert!(error.to_string().contains("redirect"), "{error}");
    assert_eq!(fake.requests(), 1);
    assert_eq!(elsewhere.requests(), 0, "the other host was never asked");
}

#[tokio::test]
async fn a_redirect_on_the_same_host_is_followed() {
    let (fake, base) =
        FakeProviderApi::serve(vec![Answer::Redirect("/v2/transactions".into())]).await;
    let (client, _) = client(&base, 3);
    assert_eq!(client.get("/transactions", &[]).await.unwrap(), json!({}));
    assert_eq!(fake.requests(), 2, "the redirect and its target");
}

#[test]
fn retry_after_reads_seconds_and_dates() {
    let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
    assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
    assert_eq!(
        retry_after("Sun, 06 Nov 1994 08:51:37 GMT", now),
        Some(Duration::from_secs(120))
    );
    assert_eq!(
        retry_after("Sun, 06 Nov 1994 08:48:37 GMT", now),
        Some(Duration::ZERO),
        "a date gone by"
    );
    assert_eq!(retry_after("soon", now), None);
    assert_eq!(retry_after("-5", now), None);
}
