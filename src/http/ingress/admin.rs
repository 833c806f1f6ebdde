//! The admin listener's routes: `/status` (the operator's page) and
//! `/status.json` (the same data), behind a bearer token or basic auth when
//! one is configured. On a listener of its own (`[admin] listen`), so the
//! page can stay on a private network while the webhooks face the providers.

use axum::Json;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::ops::Readiness;
use super::response::WebhookError;
use crate::config::AdminConfig;
use std::sync::Arc;

use crate::http::status::{Health, Shown, SourcesReport, Status};
use crate::observe::Board;
use crate::services::pipeline::Pipeline;

/// What the admin routes read.
#[derive(Clone)]
pub struct AdminState {
    /// Broker, ledger, registry and spool state.
    pub pipeline: Pipeline,
    /// The last hour of deliveries, checks and runs.
    pub board: Board,
    /// The sources in use and the refused files, as of now.
    pub sources: Arc<dyn Fn() -> SourcesReport + Send + Sync>,
    /// Rederive runs inside this process (`/admin/rederive`).
    pub rederive: crate::services::rederive::Runs,
    /// An entity's records and state (`/admin/entities/{key}`).
    pub lookup: crate::services::lookup::Lookup,
}

/// What a request must carry, as digests (compared whole, never byte by
/// byte on the secret itself).
#[derive(Clone, Default)]
struct Credentials {
    /// SHA-256 of `Bearer <token>`.
    bearer: Option<[u8; 32]>,
    /// SHA-256 of `Basic <base64(user:password)>`.
    basic: Option<[u8; 32]>,
}

impl Credentials {
    fn from_config(config: &AdminConfig) -> Credentials {
        let digest = |text: String| -> [u8; 32] { Sha256::digest(text.as_bytes()).into() };
        Credentials {
            bearer: config
                .token
                .as_ref()
                .map(|t| digest(format!("Bearer {}", t.expose()))),
            basic: match (&config.username, &config.password) {
                (Some(user), Some(password)) => Some(digest(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD
                        .encode(format!("{user}:{}", password.expose()))
                ))),
                _ => None,
            },
        }
    }

    fn required(&self) -> bool {
        self.bearer.is_some() || self.basic.is_some()
    }

    fn admits(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(given) = authorization.map(|v| Sha256::digest(v.as_bytes())) else {
            return false;
        };
        let given: [u8; 32] = given.into();
        [self.bearer, self.basic]
            .into_iter()
            .flatten()
            .any(|expected| expected == given)
    }
}

/// The admin router. An unknown path or method gets the webhook listener's
/// JSON error (one mapping, `WebhookError`'s), so a script reading the page
/// meets one error shape on both listeners; the fallbacks sit inside the
/// credentials check, so a stranger learns nothing of the routes.
pub fn router(state: AdminState, config: &AdminConfig) -> Router {
    let credentials = Credentials::from_config(config);
    Router::new()
        .route("/status", get(status_page))
        .route("/status.json", get(status_json))
        .route("/status/lookup", get(lookup_page))
        .route("/admin/sources", get(sources_json))
        .route("/admin/rederive", get(rederive_view).post(rederive_start))
        .route("/admin/entities/{key}", get(entity_json))
        .route("/admin/deliveries/{id}", get(delivery_json))
        .fallback(|| async { WebhookError::NoRoute.into_response() })
        .method_not_allowed_fallback(|| async { WebhookError::MethodNotAllowed.into_response() })
        .layer(middleware::from_fn_with_state(credentials, authorize))
        .with_state(state)
}

async fn authorize(
    State(credentials): State<Credentials>,
    request: Request,
    next: Next,
) -> Response {
    if !credentials.required() || credentials.admits(request.headers().get(header::AUTHORIZATION)) {
        return next.run(request).await;
    }
    let challenge = if credentials.basic.is_some() {
        "Basic realm=\"posbridge\""
    } else {
        "Bearer realm=\"posbridge\""
    };
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, challenge)],
        Json(json!({"error": "the status page needs the admin credentials"})),
    )
        .into_response()
}

/// The page forbids itself scripts and outside resources: whatever a
/// provider sent cannot make it load or run anything.
const PAGE_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'";

/// Sources a status page shows at once.
const SOURCES_PER_PAGE: usize = 20;

/// `?q=` (what a source's provider or name holds) and `?page=` (from 0).
#[derive(Debug, Default, serde::Deserialize)]
struct Search {
    #[serde(default)]
    q: String,
    #[serde(default)]
    page: usize,
}

async fn status_page(State(state): State<AdminState>, Query(search): Query<Search>) -> Response {
    (
        [(header::CONTENT_SECURITY_POLICY, PAGE_POLICY)],
        Html(crate::http::status::page::render(
            &gather(&state, &search, SOURCES_PER_PAGE).await,
        )),
    )
        .into_response()
}

/// What the status page's lookup box sends.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct LookupQuery {
    id: String,
}

/// `/status/lookup?id=…`: the text as a delivery id and, with a provider's
/// prefix, as an entity key, on one page.
async fn lookup_page(
    State(state): State<AdminState>,
    Query(query): Query<LookupQuery>,
) -> Response {
    use crate::http::status::lookup::{Looked, render};
    let id = query.id.trim().to_owned();
    if id.is_empty() {
        return axum::response::Redirect::to("../status").into_response();
    }
    let delivery = state.lookup.delivery(&id).await.map_err(|e| e.to_string());
    let entity = if crate::services::lookup::provider_scoped(&id).is_some() {
        Some(state.lookup.entity(&id).await.map_err(|e| e.to_string()))
    } else {
        None
    };
    (
        [(header::CONTENT_SECURITY_POLICY, PAGE_POLICY)],
        Html(render(&Looked {
            id,
            delivery,
            entity,
        })),
    )
        .into_response()
}

/// Every source unless `?q=` or `?page=` asks for fewer (a page then holds
/// as many as the status page's).
async fn status_json(State(state): State<AdminState>, Query(search): Query<Search>) -> Response {
    let per_page = if search.q.is_empty() && search.page == 0 {
        usize::MAX
    } else {
        SOURCES_PER_PAGE
    };
    Json(gather(&state, &search, per_page).await).into_response()
}

/// `GET /admin/sources`: every source, where it came from, when it was
/// read, why its file is refused; never a secret.
async fn sources_json(State(state): State<AdminState>) -> Response {
    Json((state.sources)()).into_response()
}

/// `GET /admin/entities/{key}`: the entity's records on every entity topic
/// (its key's partition of each), with their places, headers and values,
/// and the state the ledger holds; an empty `found` for a key never seen.
async fn entity_json(
    State(state): State<AdminState>,
    key: Result<axum::extract::Path<String>, PathRejection>,
) -> Response {
    match key {
        Ok(axum::extract::Path(key)) => looked_up(state.lookup.entity(&key).await),
        Err(rejected) => unreadable_path(&rejected),
    }
}

/// `GET /admin/deliveries/{id}`: what posbridge answered the delivery
/// (`{provider}:{id}`, or the provider's id alone), when, and its record
/// read back; an empty `found` with a note for an id the ledger does not
/// know.
async fn delivery_json(
    State(state): State<AdminState>,
    id: Result<axum::extract::Path<String>, PathRejection>,
) -> Response {
    match id {
        Ok(axum::extract::Path(id)) => looked_up(state.lookup.delivery(&id).await),
        Err(rejected) => unreadable_path(&rejected),
    }
}

/// A lookup path that does not decode (percent-encoded bytes that are not
/// UTF-8): the JSON error every admin answer has, 400.
fn unreadable_path(rejected: &PathRejection) -> Response {
    WebhookError::BadAdminRequest(format!(
        "the key or id in the path is not UTF-8 text: {rejected}"
    ))
    .into_response()
}

/// A lookup's report as JSON, or why it could not look (503).
fn looked_up(
    report: Result<impl serde::Serialize, crate::services::lookup::LookupError>,
) -> Response {
    match report {
        Ok(report) => Json(report).into_response(),
        Err(error) => WebhookError::from(error).into_response(),
    }
}

/// What `POST /admin/rederive` takes, as JSON; each part left out takes
/// the command's default.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RederiveRequest {
    entity: Option<String>,
    provider: Option<String>,
    source: Option<String>,
    dry_run: bool,
    rate: Option<u32>,
    sample: Option<usize>,
    from_start: bool,
}

impl RederiveRequest {
    fn options(self) -> Result<crate::services::rederive::Options, WebhookError> {
        use crate::domain::event::{EntityType, ProviderKind};
        let bad = |what: String| WebhookError::BadAdminRequest(what);
        let entity = self
            .entity
            .map(|plural| {
                EntityType::ALL
                    .into_iter()
                    .find(|t| t.plural() == plural)
                    .ok_or_else(|| bad(format!("entity `{plural}` is not an entity type's plural")))
            })
            .transpose()?;
        let provider = self
            .provider
            .map(|name| {
                ProviderKind::parse(&name).ok_or_else(|| bad(format!("unknown provider `{name}`")))
            })
            .transpose()?;
        Ok(crate::services::rederive::Options {
            entity,
            provider,
            source: self.source,
            dry_run: self.dry_run,
            rate: self.rate.unwrap_or(200),
            sample: self.sample.unwrap_or(20),
            from_start: self.from_start,
        })
    }
}

/// `POST /admin/rederive`: starts a run inside this process (the one that
/// holds the embedded ledger), 202 with its view; 409 while one runs.
async fn rederive_start(State(state): State<AdminState>, body: axum::body::Bytes) -> Response {
    let request: RederiveRequest = if body.is_empty() {
        RederiveRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(error) => return WebhookError::BadAdminRequest(error.to_string()).into_response(),
        }
    };
    match request
        .options()
        .and_then(|options| Ok(state.rederive.start(options)?))
    {
        Ok(view) => (axum::http::StatusCode::ACCEPTED, Json(view)).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /admin/rederive`: the run in progress or the last one.
async fn rederive_view(State(state): State<AdminState>) -> Response {
    match state.rederive.view() {
        Some(view) => Json(view).into_response(),
        None => WebhookError::NothingYet("no rederive run since start").into_response(),
    }
}

/// The page's data: the board, and the shared parts' state as `/readyz`
/// sees it, but for the broker: its state as the last send or probe found
/// it, not asked again.
async fn gather(state: &AdminState, search: &Search, per_page: usize) -> Status {
    let pipeline = &state.pipeline;
    let readiness = Readiness::of(pipeline, false).await;
    let now = OffsetDateTime::now_utc();
    let page = state.board.page(now, &search.q, search.page, per_page);
    Status {
        generated_at: now,
        health: Health {
            broker: if readiness.broker {
                "ok"
            } else {
                "unavailable"
            },
            ledger: readiness.ledger_text(),
            ledger_rebuild: Some(pipeline.ledger().rebuild_progress()),
            schema_registry: match (pipeline.encoder().uses_registry(), readiness.registry) {
                (false, _) => "not used",
                (true, true) => "ok",
                (true, false) => "unavailable",
            },
            spool: readiness.spool,
            spool_depth_per_minute: pipeline
                .spool()
                .map(|spool| spool.depth_per_minute(now))
                .unwrap_or_default(),
            dead_letters_since_start: pipeline.dead_letters_written(),
            failing_topics: pipeline.producer().health().failing_topics(),
        },
        sources: page.sources,
        shown: Shown {
            query: search.q.clone(),
            page: search.page,
            per_page,
            matched: page.matched,
            total: page.total,
        },
        refused_source_files: (state.sources)().refused(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::domain::event::ProviderKind;

    /// The status, content type and body of one request to the admin router.
    async fn answer(
        router: &Router,
        method: Method,
        path: &str,
        authorization: Option<&str>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let response = router
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// The admin routes over a pipeline on the fake broker in `dir`,
    /// showing `board`.
    async fn idle_state(dir: &std::path::Path, board: Board) -> AdminState {
        let pipeline = Pipeline::on_fake_broker(dir, Duration::from_millis(100))
            .await
            .0;
        AdminState {
            pipeline: pipeline.clone(),
            board,
            sources: Arc::new(SourcesReport::default),
            lookup: crate::services::lookup::Lookup::idle(pipeline.clone()),
            rederive: crate::services::rederive::Runs::idle(pipeline),
        }
    }

    /// A lookup's key or id that is not UTF-8 once decoded gets the JSON
    /// error shape every admin answer has, not axum's plain text.
    #[tokio::test]
    async fn a_lookup_path_that_is_not_text_is_a_json_error() {
        let dir = tempfile::tempdir().unwrap();
        let state = idle_state(dir.path(), Board::new([])).await;
        let open = router(state, &AdminConfig::default());
        for path in ["/admin/deliveries/%FF%FE", "/admin/entities/mekari%3A%FF"] {
            let (status, content_type, body) = answer(&open, Method::GET, path, None).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
            assert_eq!(content_type.as_deref(), Some("application/json"), "{path}");
            assert!(
                body["error"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("not UTF-8"),
                "{path}: {body}"
            );
        }
    }

    /// An unknown path and a wrong method get the webhook listener's JSON
    /// error, not an empty answer; behind credentials only once admitted, so
    /// the listener tells a stranger nothing of its routes.
    #[tokio::test]
    async fn unknown_paths_and_methods_are_json_errors() {
        let dir = tempfile::tempdir().unwrap();
        let state = idle_state(dir.path(), Board::new([])).await;
        let json = Some("application/json".to_owned());
        let open = router(state.clone(), &AdminConfig::default());
        for path in ["/nothing", "/status/", "/"] {
            assert_eq!(
                answer(&open, Method::GET, path, None).await,
                (
                    StatusCode::NOT_FOUND,
                    json.clone(),
                    json!({"error": "no such route"})
                ),
                "{path}"
            );
        }
        for path in ["/status", "/status.json"] {
            assert_eq!(
                answer(&open, Method::POST, path, None).await,
                (
                    StatusCode::METHOD_NOT_ALLOWED,
                    json.clone(),
                    json!({"error": "method not allowed"})
                ),
                "{path}"
            );
        }
        let config: AdminConfig = serde_json::from_value(json!({"token": "t0ken"})).unwrap();
        let guarded = router(state, &config);
        let (status, _, _) = answer(&guarded, Method::GET, "/nothing", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, content_type, _) =
            answer(&guarded, Method::GET, "/nothing", Some("Bearer t0ken")).await;
        assert_eq!((status, content_type), (StatusCode::NOT_FOUND, json));
    }

    /// A thousand sources stay usable: the page draws a page of those a
    /// search matches, with links to the next and the one before.
    #[tokio::test]
    async fn the_page_shows_a_search_and_a_page_of_its_matches() {
        let dir = tempfile::tempdir().unwrap();
        let sources = (0..45).map(|n| (ProviderKind::Mekari, format!("shop-{n}")));
        let board = Board::new(sources.chain([(ProviderKind::ReceiptRoller, "main".to_owned())]));
        let state = idle_state(dir.path(), board).await;
        let router = router(state, &AdminConfig::default());
        let (_, _, all) = answer(&router, Method::GET, "/status.json", None).await;
        assert_eq!(all["sources"].as_array().unwrap().len(), 46);
        let (_, _, found) = answer(&router, Method::GET, "/status.json?q=SHOP-1", None).await;
        let names: Vec<&str> = found["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["source"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 11, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("shop-1")), "{names:?}");
        assert_eq!(found["shown"]["matched"], 11);
        assert_eq!(found["shown"]["total"], 46);

        let page = |path: &str| {
            let router = router.clone();
            let path = path.to_owned();
            async move {
                let response = router
                    .oneshot(Request::get(path).body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                String::from_utf8(bytes.to_vec()).unwrap()
            }
        };
        let second = page("/status?q=shop&page=1").await;
        assert!(
            second.contains("sources 21–40 of 45 matching (of 46)"),
            "{second}"
        );
        assert!(second.contains("href=\"?q=shop&amp;page=0\""), "{second}");
        assert!(second.contains("href=\"?q=shop&amp;page=2\""), "{second}");
        assert_eq!(second.matches("<section class=\"source\"").count(), 20);
        let last = page("/status?q=shop&page=2").await;
        assert_eq!(last.matches("<section class=\"source\"").count(), 5);
        assert!(!last.contains("next →"), "{last}");
        let none = page("/status?q=%3Cscript%3E").await;
        assert!(none.contains("no source matches (of 46)"), "{none}");
        assert!(!none.contains("<script>"), "{none}");
    }
}
