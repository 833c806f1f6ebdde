//! Broker outages against a real broker: every answer within the budget
//! whatever the outage looks like (refused, frozen, killed); the spool takes
//! what a spooling source sends meanwhile, drains it when Kafka is back, and
//! survives SIGKILL; a full spool answers 503; retries of spooled deliveries
//! are duplicates.

use crate::support::kafka_only;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::wait::{look_for, wait_until};
use crate::support::{
    Meter, OwnBroker, TestApp, free_port, latest_per_key, listening_on, mekari_order, own_source,
    read_topic, rr_sale, signed_request, spawn_serve, spool_config, spool_config_text, timed,
    unique, wait_healthy,
};

/// `delivery_timeout_ms` + `inflight_wait_ms` of the test configuration.
const BUDGET: Duration = Duration::from_millis(3000 + 2000);
/// HTTP over loopback on a loaded two-core machine, on top of the budget.
const SLACK: Duration = Duration::from_millis(500);

fn sale(n: u32) -> Value {
    rr_sale(
        &format!("sp-{n}"),
        "sale.created",
        "2026-11-29T10:15:30Z",
        &format!("T1|2026-11|{n:04}"),
        100 + u64::from(n),
    )
}

/// Waits until the spool is empty (the drainer published everything).
async fn drained(app: &TestApp) {
    let spool = app.pipeline.spool().expect("a spooling configuration");
    wait_until(Duration::from_secs(60), "the spool to drain", async || {
        spool.stats().entries == 0
    })
    .await;
}

/// Sends a spooling ReceiptRoller sale and a retrying Mekari order every
/// 250 ms for `span`, and returns the slowest answer and every status.
async fn traffic_during(
    app: &TestApp,
    tag: &str,
    span: Duration,
) -> (Duration, Vec<(String, u16, String)>) {
    let mut requests = Vec::new();
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < span {
        n += 1;
        let rr = rr_sale(
            &format!("{tag}-rr-{n}"),
            "sale.created",
            "2026-11-29T10:15:30Z",
            &format!("{tag}|2026-11|{n:04}"),
            100,
        );
        let mk = mekari_order(
            &format!("{tag}-mk-{n}"),
            "order.updated",
            "2026-11-29T17:15:30+07:00",
            &format!("{tag}-ORD-{n}"),
            "new",
        );
        for (provider, body) in [("receiptroller", rr), ("mekari", mk)] {
            let request = app.request(provider, "main", &body);
            requests.push(tokio::spawn(async move {
                let answer = timed(request).await;
                if answer.status == 503 {
                    assert_eq!(
                        answer.retry_after.as_deref(),
                        Some("7"),
                        "503 carries Retry-After"
                    );
                }
                (
                    provider.to_owned(),
                    answer.status,
                    answer.what(),
                    answer.took,
                )
            }));
        }
        // The traffic's pace: four deliveries a second, as a provider sends.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut slowest = Duration::ZERO;
    let mut answers = Vec::new();
    for request in requests {
        let (provider, status, what, took) = request.await.unwrap();
        slowest = slowest.max(took);
        answers.push((provider, status, what));
    }
    (slowest, answers)
}

/// Every answer comes within the budget during each kind of outage; the
/// spooling source is answered 2xx throughout, the other 2xx or 503.
#[tokio::test(flavor = "multi_thread")]
async fn every_answer_comes_within_the_budget_whatever_the_outage() {
    for outage in ["refused", "frozen", "killed"] {
        let mut broker = OwnBroker::start().await;
        let dir = tempfile::tempdir().unwrap();
        let app =
            TestApp::start_with(spool_config(&broker.address(), &unique(outage), dir.path())).await;
        assert_eq!(
            app.send("receiptroller", "main", &sale(0)).await.status(),
            200
        );
        match outage {
            "refused" => broker.cut(),
            "frozen" => broker.freeze(),
            _ => broker.kill(),
        }
        let (slowest, answers) = traffic_during(&app, outage, Duration::from_secs(8)).await;
        println!(
            "outage {outage}: {} answers, slowest {slowest:?} (budget {BUDGET:?})",
            answers.len()
        );
        assert!(
            slowest <= BUDGET + SLACK,
            "{outage}: slowest answer {slowest:?}"
        );
        for (provider, status, what) in &answers {
            match provider.as_str() {
                "receiptroller" => assert!(
                    *status == 200 && (what == "spooled" || what == "published"),
                    "{outage}: a spooling source is never refused: {status} {what}"
                ),
                _ => assert!(
                    *status == 503 || *status == 200,
                    "{outage}: {status} {what}"
                ),
            }
        }
        assert!(
            answers.iter().any(|(_, _, what)| what == "spooled"),
            "{outage}: the outage was seen"
        );
        if outage == "frozen" {
            broker.thaw();
        }
        app.stop().await;
    }
}

/// A spool bounded at two entries: a retry of a spooled delivery is a
/// duplicate, a third delivery gets 503; after the broker returns the spool
/// drains and every delivery is in the topic exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn spooled_deliveries_are_deduplicated_bounded_and_drained_once() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = spool_config(&broker.address(), &unique("spool"), dir.path());
    config.spool.max_entries = 2;
    // A source of its own, so the series labelled with it are this test's.
    let source = unique("spool");
    own_source(&mut config, "receiptroller", "main", &source);
    let app = TestApp::start_with(config).await;
    let before = Meter::read(&app).await;
    assert_eq!(
        app.send("receiptroller", &source, &sale(0)).await.status(),
        200
    );

    broker.cut();
    let status = |response: reqwest::Response| async move {
        let code = response.status().as_u16();
        let json: Value = response.json().await.unwrap();
        (code, json["status"].as_str().unwrap_or("error").to_owned())
    };
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(1)).await).await,
        (200, "spooled".into())
    );
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(1)).await).await,
        (200, "duplicate".into())
    );
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(2)).await).await,
        (200, "spooled".into())
    );
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(3)).await).await,
        (503, "error".into())
    );
    assert_eq!(app.pipeline.spool().unwrap().stats().entries, 2);

    broker.heal();
    drained(&app).await;
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(1)).await).await,
        (200, "duplicate".into())
    );
    assert_eq!(
        status(app.send("receiptroller", &source, &sale(3)).await).await,
        (200, "published".into())
    );

    let records = read_topic(&broker.address(), &app.topic("sales"));
    let mut keys: Vec<&str> = records.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "receiptroller:T1|2026-11|0000",
            "receiptroller:T1|2026-11|0001",
            "receiptroller:T1|2026-11|0002",
            "receiptroller:T1|2026-11|0003",
        ],
        "each delivery exactly once"
    );
    let after = Meter::read(&app).await;
    let source_labels = [("provider", "receiptroller"), ("source", source.as_str())];
    assert_eq!(
        after.delta(&before, "posbridge_spooled_total", &source_labels),
        2.0,
        "sales 1 and 2 spooled"
    );
    let requests = |outcome: &str| {
        let labels = [source_labels[0], source_labels[1], ("outcome", outcome)];
        after.delta(&before, "posbridge_webhook_requests_total", &labels)
    };
    assert_eq!(
        ["published", "spooled", "duplicate", "unavailable"].map(requests),
        [2.0, 2.0, 2.0, 1.0],
        "published, spooled, duplicate, unavailable"
    );
    // Sale 0, the two drained and sale 3: acknowledged on this test's topic.
    let topic = app.topic("sales");
    assert_eq!(
        after.delta(
            &before,
            "posbridge_publish_duration_seconds_count",
            &[("topic", topic.as_str())]
        ),
        4.0
    );
    // By provider and outcome only, so other tests' drains count here too:
    // at least this test's two.
    assert!(
        after.delta(
            &before,
            "posbridge_spool_drained_total",
            &[("provider", "receiptroller"), ("outcome", "published")]
        ) >= 2.0,
        "the two spooled sales drained"
    );
    app.stop().await;
}

/// posbridge killed (SIGKILL) with deliveries in its spool loses none: the
/// next start drains them.
#[tokio::test(flavor = "multi_thread")]
async fn a_spool_survives_sigkill_and_drains_on_the_next_start() {
    let broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("sigkill");
    let port = free_port();
    let text = listening_on(
        &spool_config_text(&broker.address(), &prefix, dir.path()),
        port,
    );
    let config_path = dir.path().join("posbridge.toml");
    std::fs::write(&config_path, text).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let start = || spawn_serve(&config_path);

    // Start-up creates the topics, so it needs the broker.
    let mut first = start();
    wait_healthy(&http, &base).await;
    broker.cut();
    const SPOOLED: u32 = 30;
    for n in 1..=SPOOLED {
        let body = sale(n);
        let response = signed_request(
            &http,
            &base,
            "receiptroller",
            "main",
            body["id"].as_str().unwrap(),
            serde_json::to_vec(&body).unwrap(),
            None,
        )
        .send()
        .await
        .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.json::<Value>().await.unwrap()["status"], "spooled");
    }
    first.kill().unwrap();
    first.wait().unwrap();

    broker.heal();
    let mut second = start();
    wait_healthy(&http, &base).await;
    let read = || latest_per_key(&read_topic(&broker.address(), &format!("{prefix}.sales")));
    // Waited for; then read once more, so the assertion below says what came.
    look_for(Duration::from_secs(60), async || {
        (read().len() as u32 == SPOOLED).then_some(())
    })
    .await;
    let sales = read();
    assert_eq!(
        sales.len() as u32,
        SPOOLED,
        "every spooled delivery was published"
    );
    let readiness: Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(readiness["spool"]["entries"], 0, "{readiness}");
    second.kill().unwrap();
    second.wait().unwrap();
}

/// Apache Kafka SIGKILLed under steady traffic and restarted on its own
/// data: every delivery answered 2xx is in its topic afterwards (the
/// spooling source's from the spool, the other's from the provider's
/// retries of its 503s). Kafka only (`kafka_only` in its name): tansu 0.6
/// cannot restart on its data (its storage panics on the first idempotent
/// produce afterwards).
#[tokio::test(flavor = "multi_thread")]
async fn kafka_only_a_broker_killed_under_load_and_restarted_on_its_data_loses_nothing() {
    kafka_only("tansu cannot restart on its data");
    let mut broker = OwnBroker::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tag = "restart";
    let app = TestApp::start_with(spool_config(&broker.address(), &unique(tag), dir.path())).await;
    let ((slowest, answers), ()) =
        tokio::join!(traffic_during(&app, tag, Duration::from_secs(14)), async {
            // The outage's timeline under steady traffic: times, not conditions.
            tokio::time::sleep(Duration::from_secs(2)).await;
            broker.kill();
            tokio::time::sleep(Duration::from_secs(3)).await;
            broker.restart().await;
        });
    assert!(slowest <= BUDGET + SLACK, "slowest answer {slowest:?}");
    // `traffic_during` sends the pair n as answers 2n-2 (ReceiptRoller) and
    // 2n-1 (Mekari); a 503 is retried as the provider would.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut retried = 0;
    for (index, (provider, status, what)) in answers.iter().enumerate() {
        let n = index / 2 + 1;
        if provider == "receiptroller" {
            assert_eq!((*status, what.as_str() != "error"), (200, true), "{what}");
            continue;
        }
        if *status == 200 {
            continue;
        }
        assert_eq!(*status, 503, "{what}");
        retried += 1;
        let body = mekari_order(
            &format!("{tag}-mk-{n}"),
            "order.updated",
            "2026-11-29T17:15:30+07:00",
            &format!("{tag}-ORD-{n}"),
            "new",
        );
        wait_until(
            deadline.saturating_duration_since(Instant::now()),
            &format!("the retry of {n} to publish"),
            async || app.send("mekari", "main", &body).await.status() == 200,
        )
        .await;
    }
    drained(&app).await;
    let sales: std::collections::HashSet<String> =
        read_topic(&broker.address(), &app.topic("sales"))
            .into_iter()
            .map(|r| r.key)
            .collect();
    let orders: std::collections::HashSet<String> =
        read_topic(&broker.address(), &app.topic("orders"))
            .into_iter()
            .map(|r| r.key)
            .collect();
    let pairs = answers.len() / 2;
    for n in 1..=pairs {
        assert!(
            sales.contains(&format!("receiptroller:{tag}|2026-11|{n:04}")),
            "sale {n} answered 2xx is in its topic"
        );
        assert!(
            orders.contains(&format!("mekari:{tag}-ORD-{n}")),
            "order {n} is in its topic"
        );
    }
    let spooled = answers
        .iter()
        .filter(|(_, _, what)| what == "spooled")
        .count();
    println!(
        "restart: {pairs} pairs, {spooled} spooled, {retried} answered 503 then retried, slowest answer {slowest:?}"
    );
    assert!(spooled > 0, "the outage was seen");
    app.stop().await;
}
