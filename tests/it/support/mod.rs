//! Shared test plumbing: start the real app on port 0, sign like the
//! providers, read topics back with a real Kafka consumer.

pub mod apicurio;
mod broker;
pub mod cluster;
pub mod connect;
pub mod operator;
pub mod ports;
pub mod postgres;
mod processes;
pub mod proxy;
mod records;
pub mod redis;
pub mod registry;
pub mod schedule;
pub mod schedule_plan;
pub mod secret_mount;
pub mod tls;
pub mod tmpfs;
pub mod v1;
pub mod wait;

pub use broker::{BrokerKind, KafkaSecurity, OwnBroker, broker_kind, kafka_only, kafka_security};
pub use ports::{free_port, free_ports};
pub use processes::{
    assert_fresh, decode_with_python, example_binary, log_tail, off_the_runtime, python,
    python_path, script, spawn_posbridge, spawn_serve, spawn_serve_logging, wait_healthy,
};
pub use records::{Record, latest_per_key, produce, produce_all, read_topic, read_topic_with};

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use posbridge::app::App;
use posbridge::config::Config;
use posbridge::domain::verify::SchemeName;
use posbridge::domain::verify::sign;
use serde_json::{Value, json};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// ReceiptRoller secret of the `main` and `backup` test sources.
pub const RR_SECRET: &str = "rr-test-secret-1";
/// Mekari secret of the `main` test source.
pub const MEKARI_SECRET: &str = "mekari-test-secret-1";

/// The broker `scripts/test` started.
pub fn brokers() -> String {
    std::env::var("POSBRIDGE_TEST_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into())
}

/// A name no other test uses, for topic prefixes.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "t{}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        COUNTER.fetch_add(1, Ordering::Relaxed),
        tag
    )
}

/// A config with fresh topics (`{prefix}.sales`, …) and a ledger in `dir`.
pub fn config(brokers: &str, prefix: &str, dir: &Path) -> Config {
    let config = Config::from_toml(&config_text(brokers, prefix, dir)).unwrap();
    assert_eq!(posbridge::app::problems(&config), vec![]);
    config
}

/// The same with the ReceiptRoller `main` source spooling (its spool in `dir`).
pub fn spool_config(brokers: &str, prefix: &str, dir: &Path) -> Config {
    let config = Config::from_toml(&spool_config_text(brokers, prefix, dir)).unwrap();
    assert!(config.spools());
    assert_eq!(posbridge::app::problems(&config), vec![]);
    config
}

/// The TOML of [`spool_config`], for a posbridge started as its own process.
pub fn spool_config_text(brokers: &str, prefix: &str, dir: &Path) -> String {
    config_text(brokers, prefix, dir).replace(
        "[receiptroller.sources.main]\n",
        "[receiptroller.sources.main]\n        on_broker_unavailable = \"spool\"\n",
    ) + &format!(
        "\n[spool]\npath = \"{}\"\n",
        dir.join("spool.redb").display()
    )
}

/// `text` listening on `port` instead of any free port.
pub fn listening_on(text: &str, port: u16) -> String {
    text.replace(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:{port}\""),
    )
}

/// The TOML of a replica of a fleet sharing the Redis ledger at `redis`
/// (under `prefix`, its topics too), listening on `port`, with both
/// providers' `main` sources: `server` adds lines to `[server]`, `rest`
/// tables after it and lines to each source (`on_broker_unavailable`).
pub fn replica_config_text(
    (port, brokers, redis, prefix): (u16, &str, &str, &str),
    server: &str,
    (rest, each_source): (&str, &str),
) -> String {
    format!(
        r#"
        [server]
        listen = "127.0.0.1:{port}"
        {server}
        {kafka}
        [ledger]
        backend = "redis"
        redis_url = "{redis}"
        redis_prefix = "{prefix}:"
        {rest}
        [receiptroller.sources.main]
        secrets = ["{RR_SECRET}"]
        {each_source}
        [mekari.sources.main]
        secrets = ["{MEKARI_SECRET}"]
        {each_source}
        "#,
        kafka = kafka_section(brokers, prefix),
    )
}

/// The `[kafka]` section every posbridge started as its own process has:
/// one partition, a short delivery timeout, a new producer after a timeout
/// on tansu.
fn kafka_section(brokers: &str, prefix: &str) -> String {
    format!(
        r#"[kafka]
        brokers = "{brokers}"
        topic_prefix = "{prefix}."
        partitions = 1
        delivery_timeout_ms = 3000
        new_producer_after_timeout = {tansu}"#,
        // tansu 0.6 panics on the epoch librdkafka bumps after a timeout.
        tansu = broker_kind() == BrokerKind::Tansu,
    )
}

/// The TOML of [`config`], for a posbridge started as its own process.
pub fn config_text(brokers: &str, prefix: &str, dir: &Path) -> String {
    format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        inflight_wait_ms = 2000
        retry_after_secs = 7
        {kafka}
        [ledger]
        path = "{ledger}"
        [receiptroller.sources.main]
        secrets = ["old-secret-0", "{RR_SECRET}"]
        [receiptroller.sources.backup]
        secrets = ["{RR_SECRET}"]
        [mekari.sources.main]
        secrets = ["{MEKARI_SECRET}"]
        [mekari.sources.acme]
        secrets = ["{MEKARI_SECRET}"]
        account = "acme"
        "#,
        ledger = dir.join("ledger.redb").display(),
        kafka = kafka_section(brokers, prefix),
    )
}

/// A running posbridge on a loopback port.
pub struct TestApp {
    pub base: String,
    /// The running app's pipeline, for a reconciler in the test.
    pub pipeline: posbridge::services::pipeline::Pipeline,
    /// The running app's producer, for what only it knows.
    pub publisher: posbridge::adapters::publish::Publisher,
    /// The running app's status board, for the admin router in the test.
    pub board: posbridge::observe::Board,
    /// The running app's sources, for `/admin/sources` in the test.
    pub sources: posbridge::app::sources::Sources,
    pub config: Config,
    pub prefix: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    pub http: reqwest::Client,
    _dir: Option<tempfile::TempDir>,
}

impl TestApp {
    /// Starts the app with fresh topics and a fresh ledger.
    pub async fn start() -> TestApp {
        let dir = tempfile::tempdir().unwrap();
        let prefix = unique("app");
        let config = config(&brokers(), &prefix, dir.path());
        let mut app = TestApp::start_with(config).await;
        app.prefix = prefix;
        app._dir = Some(dir);
        app
    }

    /// Starts the app with a given config. Retries while a previous app in
    /// this process still holds the same ledger file.
    pub async fn start_with(config: Config) -> TestApp {
        let mut last = None;
        let app = wait::look_for(Duration::from_secs(10), async || {
            match App::build(&config).await {
                Ok(app) => Some(app),
                Err(e) if e.to_string().contains("ledger") => {
                    last = Some(format!("{:#}", anyhow::Error::new(e)));
                    None
                }
                Err(e) => panic!("app did not start: {:#}", anyhow::Error::new(e)),
            }
        })
        .await;
        let Some(app) = app else {
            panic!(
                "app did not start within 10 s: {}",
                last.unwrap_or_default()
            );
        };
        let pipeline = app.pipeline().clone();
        let publisher = app.publisher().clone();
        let board = app.board().clone();
        let sources = app.sources().clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.serve(listener, async {
            let _ = stopped.await;
        }));
        let prefix = config.kafka.topic_prefix.trim_end_matches('.').to_owned();
        TestApp {
            base: format!("http://{addr}"),
            pipeline,
            publisher,
            board,
            sources,
            config,
            prefix,
            stop: Some(stop),
            task: Some(task),
            // Idle connections are dropped before posbridge closes them
            // (`header_read_timeout_ms`, 2 s), so that a request never goes
            // out on a connection the server is closing at that moment.
            http: reqwest::Client::builder()
                .pool_idle_timeout(Duration::from_millis(1000))
                .build()
                .unwrap(),
            _dir: None,
        }
    }

    /// Keeps `dir` (the app's files) as long as the app.
    pub fn keep(&mut self, dir: tempfile::TempDir) {
        self._dir = Some(dir);
    }

    /// Graceful shutdown, waiting for it to finish.
    pub async fn stop(mut self) -> Option<tempfile::TempDir> {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.take().unwrap().await.unwrap().unwrap();
        self._dir.take()
    }

    /// Topic of an entity type's plural name.
    pub fn topic(&self, plural: &str) -> String {
        format!("{}.{plural}", self.prefix)
    }

    /// A request of `body` signed as the provider would, to
    /// `/webhooks/{provider}/{source}`, not yet sent (to send on a task).
    pub fn request(&self, provider: &str, source: &str, body: &Value) -> reqwest::RequestBuilder {
        signed_request(
            &self.http,
            &self.base,
            provider,
            source,
            body["id"].as_str().unwrap_or_default(),
            serde_json::to_vec(body).unwrap(),
            None,
        )
    }

    /// Sends a body signed as the provider would, to `/webhooks/{provider}/{source}`.
    pub async fn send(&self, provider: &str, source: &str, body: &Value) -> reqwest::Response {
        let bytes = serde_json::to_vec(body).unwrap();
        let id = body["id"].as_str().unwrap_or_default().to_owned();
        self.send_raw(provider, source, &id, bytes, None).await
    }

    /// Sends exact bytes with a delivery id, signed with `secret` (or the
    /// source's real one).
    pub async fn send_raw(
        &self,
        provider: &str,
        source: &str,
        delivery_id: &str,
        bytes: Vec<u8>,
        secret: Option<&str>,
    ) -> reqwest::Response {
        signed_request(
            &self.http,
            &self.base,
            provider,
            source,
            delivery_id,
            bytes,
            secret,
        )
        .send()
        .await
        .unwrap()
    }

    /// GET `path` (e.g. `/readyz`).
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }

    /// The running app's reconciler over `config`'s sources and its sources
    /// directory's, as `serve` makes it.
    pub fn reconciler(&self, config: &Config) -> posbridge::services::reconcile::Reconciler {
        posbridge::app::reconciler(config, &self.pipeline, &self.board, &self.sources).unwrap()
    }

    /// What the admin router reads, on this app's pipeline, board and sources.
    pub fn admin_state(&self) -> posbridge::http::ingress::AdminState {
        let sources = self.sources.clone();
        posbridge::http::ingress::AdminState {
            pipeline: self.pipeline.clone(),
            board: self.board.clone(),
            sources: std::sync::Arc::new(move || sources.report()),
            rederive: posbridge::services::rederive::Runs::new(
                &self.config,
                self.pipeline.clone(),
                posbridge::adapters::publish::TopicSets::new(&self.config.kafka),
            ),
            lookup: posbridge::services::lookup::Lookup::new(
                &self.config,
                self.pipeline.shared_ledger(),
                posbridge::adapters::publish::TopicSets::new(&self.config.kafka),
            )
            .expect("the registry's client"),
        }
    }

    /// The status page's HTML, from the admin router on this app's
    /// pipeline and board (no credentials).
    pub async fn status_page(&self) -> String {
        let router = posbridge::http::ingress::admin_router(
            self.admin_state(),
            &posbridge::config::AdminConfig::default(),
        );
        let page = tower::ServiceExt::oneshot(
            router,
            axum::http::Request::get("/status")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
        let page = axum::body::to_bytes(page.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8_lossy(&page).into_owned()
    }
}

/// A webhook request signed as the provider does, with the header names of
/// the provider documents (written out here, not taken from posbridge, so a
/// wrong constant in posbridge fails the tests). `secret` defaults to the
/// source's real one.
pub fn signed_request(
    http: &reqwest::Client,
    base: &str,
    provider: &str,
    source: &str,
    delivery_id: &str,
    bytes: Vec<u8>,
    secret: Option<&str>,
) -> reqwest::RequestBuilder {
    let (scheme, header, id_header, default_secret) = match provider {
        "receiptroller" => (
            SchemeName::Hex,
            "X-RR-Signature",
            "X-RR-Delivery",
            RR_SECRET,
        ),
        _ => (
            SchemeName::Base64,
            "X-Mekari-Signature",
            "X-Mekari-Event-ID",
            MEKARI_SECRET,
        ),
    };
    let mut request = http
        .post(format!("{base}/webhooks/{provider}/{source}"))
        .header("content-type", "application/json")
        .header(id_header, delivery_id);
    for (name, value) in sign(
        scheme,
        header,
        secret.unwrap_or(default_secret),
        delivery_id,
        0,
        &bytes,
    ) {
        request = request.header(name, value);
    }
    request.body(bytes)
}

/// The value of one metric line with all the given label pairs, or 0.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A ReceiptRoller sale body as `docs/PROVIDERS.md` describes it.
pub fn rr_sale(
    delivery_id: &str,
    event: &str,
    timestamp: &str,
    sale_id: &str,
    total: u64,
) -> Value {
    json!({
        "id": delivery_id, "type": event, "timestamp": timestamp, "webhook_id": "wh_123",
        "data": {"id": sale_id, "terminal_id": "T001", "store_id": "S01",
                 "transaction_id": "000123", "transaction_type": 1,
                 "transaction_at": "2026-11-29T10:15:29Z", "currency": "JPY",
                 "sub_total": total - total / 11, "tax_total": total / 11, "grand_total": total,
                 "items": [{"sku": "A-1", "name": "Coffee", "quantity": 2, "unit_price": 500}]}
    })
}

/// A Mekari order event body as `docs/PROVIDERS.md` describes it.
pub fn mekari_order(
    event_id: &str,
    event: &str,
    occurred_at: &str,
    order_id: &str,
    kitchen: &str,
) -> Value {
    json!({
        "id": event_id, "event": event, "occurred_at": occurred_at, "outlet_id": "OUT-9",
        "data": {"id": order_id, "outlet_id": "OUT-9", "status": "paid",
                 "kitchen_status": kitchen, "total": 51000.5, "currency": "IDR",
                 "sold_at": "2026-11-29T17:14:02+07:00", "items": []}
    })
}

/// An answer to a request sent with [`timed`].
pub struct Timed {
    /// Its status.
    pub status: u16,
    /// Its JSON body, or null.
    pub json: Value,
    /// Its `Retry-After` header.
    pub retry_after: Option<String>,
    /// How long it took.
    pub took: std::time::Duration,
}

impl Timed {
    /// The `status` field of the body (`published`, `spooled`, …), or `error`.
    pub fn what(&self) -> String {
        self.json["status"].as_str().unwrap_or("error").to_owned()
    }
}

/// Sends `request` and times its answer.
pub async fn timed(request: reqwest::RequestBuilder) -> Timed {
    let sent = Instant::now();
    let response = request
        .send()
        .await
        .expect("an answer, not a cut connection");
    let took = sent.elapsed();
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let json = response.json().await.unwrap_or(Value::Null);
    Timed {
        status,
        json,
        retry_after,
        took,
    }
}

/// The `/metrics` text at one moment. Every app of the test process records
/// into one registry, so a test asserts the change it caused between two
/// readings ([`Meter::delta`]), exactly on series whose labels only it uses:
/// its own topics, or a source it renamed with [`own_source`].
pub struct Meter(String);

impl Meter {
    /// Reads `app`'s `/metrics` now.
    pub async fn read(app: &TestApp) -> Meter {
        Meter(app.metrics().await)
    }

    /// How much `name{labels}` (summed over the matching lines, as
    /// [`metric`]) grew from `before` to this reading.
    pub fn delta(&self, before: &Meter, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric(&self.0, name, labels) - metric(&before.0, name, labels)
    }
}

/// Renames `provider`'s source `from` to `to` (a [`unique`] name), so that
/// the series labelled `source="{to}"` count this test's requests alone.
pub fn own_source(config: &mut Config, provider: &str, from: &str, to: &str) {
    let sources = match provider {
        "receiptroller" => &mut config.receiptroller.sources,
        "mekari" => &mut config.mekari.sources,
        _ => panic!("no provider {provider}"),
    };
    let source = sources
        .remove(from)
        .unwrap_or_else(|| panic!("no source {provider}.{from}"));
    sources.insert(to.to_owned(), source);
    assert_eq!(posbridge::app::problems(config), vec![]);
}
