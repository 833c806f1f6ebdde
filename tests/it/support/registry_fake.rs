//! A Schema Registry FAKE: only the endpoints posbridge's client
//! (schema_registry_converter) and Confluent's Python deserializer call.
//! No Confluent-compatible registry can be installed on these machines; the
//! bytes this fake helps produce are cross-checked by Confluent's own Python
//! client in `registry.rs`.
//!
//! * `POST /subjects/{subject}/versions` registers (same schema → same id),
//!   or answers 409 for a schema that cannot read the subject's latest
//!   version (BACKWARD, the real registry's default, checked with
//!   apache-avro's schema compatibility) and for subjects configured as
//!   incompatible.
//! * `POST /subjects/{subject}` looks a schema up (id and version, or 404).
//! * `POST /compatibility/subjects/{subject}/versions/latest` says whether a
//!   schema reads what the subject's latest version wrote.
//! * `GET /schemas/ids/{id}` returns a registered schema.
//! * `GET /subjects` lists subjects (readiness probe).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

#[derive(Default)]
struct Registry {
    schemas: Vec<String>,
    subjects: HashMap<String, Vec<u32>>,
    incompatible: HashSet<String>,
}

/// A running fake; its URL goes into `schema_registry.url`.
pub struct RegistryFake {
    pub url: String,
    state: Arc<Mutex<Registry>>,
}

impl RegistryFake {
    /// Starts the fake on a loopback port. Subjects in `incompatible` refuse
    /// registration the way a real registry refuses an incompatible schema.
    pub async fn start(incompatible: &[&str]) -> RegistryFake {
        let state = Self::state(incompatible);
        let app = Self::app(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        RegistryFake { url, state }
    }

    /// The same over HTTPS with `acceptor`'s certificate, answering only
    /// requests that carry `Authorization: Bearer {token}`.
    pub async fn start_tls(acceptor: tokio_native_tls::TlsAcceptor, token: &str) -> RegistryFake {
        let state = Self::state(&[]);
        let app = Self::app(state.clone()).layer(axum::middleware::from_fn_with_state(
            Arc::new(format!("Bearer {token}")),
            require_token,
        ));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", tcp.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(TlsListener { tcp, acceptor }, app).await });
        RegistryFake { url, state }
    }

    fn state(incompatible: &[&str]) -> Shared {
        Arc::new(Mutex::new(Registry {
            incompatible: incompatible.iter().map(|s| (*s).to_owned()).collect(),
            ..Registry::default()
        }))
    }

    fn app(state: Shared) -> Router {
        Router::new()
            .route("/subjects/{subject}/versions", post(register))
            .route("/subjects/{subject}", post(lookup))
            .route(
                "/compatibility/subjects/{subject}/versions/latest",
                post(compatibility),
            )
            .route("/schemas/ids/{id}", get(schema_by_id))
            .route("/subjects", get(subjects))
            .with_state(state)
    }

    /// Registers `schema` under `subject` as a client would.
    pub async fn register(&self, subject: &str, schema: &str) -> reqwest::StatusCode {
        reqwest::Client::new()
            .post(format!("{}/subjects/{subject}/versions", self.url))
            .json(&json!({ "schema": schema }))
            .send()
            .await
            .unwrap()
            .status()
    }

    /// How many versions `subject` has.
    pub fn versions(&self, subject: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .subjects
            .get(subject)
            .map_or(0, Vec::len)
    }

    /// The id registered last under a subject, if any.
    pub fn id_of(&self, subject: &str) -> Option<u32> {
        self.state
            .lock()
            .unwrap()
            .subjects
            .get(subject)
            .and_then(|ids| ids.last().copied())
    }
}

type Shared = Arc<Mutex<Registry>>;

/// Refuses a request without the expected `Authorization` value.
async fn require_token(
    State(expected): State<Arc<String>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let given = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if given == Some(expected.as_str()) {
        next.run(request).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error_code": 40101, "message": "Unauthorized"})),
        )
            .into_response()
    }
}

/// A loopback listener that speaks TLS.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_native_tls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_native_tls::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            // A client that fails the handshake (an untrusted certificate) is dropped.
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

async fn register(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let mut registry = state.lock().unwrap();
    if registry.incompatible.contains(&subject) {
        return (
            StatusCode::CONFLICT,
            Json(json!({"error_code": 409, "message": "Schema being registered is incompatible with an earlier schema for subject"})),
        )
            .into_response();
    }
    let Some(schema) = body["schema"].as_str() else {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error_code": 42201, "message": "Invalid schema"})),
        )
            .into_response();
    };
    // BACKWARD, the registry's default: the new schema must read what the
    // subject's latest version wrote.
    let latest = registry
        .subjects
        .get(&subject)
        .and_then(|ids| ids.last())
        .map(|id| registry.schemas[*id as usize - 1].clone());
    if let Some(latest) = latest
        && !reads(&latest, schema)
    {
        return (
                StatusCode::CONFLICT,
                Json(json!({"error_code": 409, "message": "Schema being registered is incompatible with an earlier schema for subject"})),
            )
                .into_response();
    }
    let id = match registry.schemas.iter().position(|s| s == schema) {
        Some(i) => i + 1,
        None => {
            registry.schemas.push(schema.to_owned());
            registry.schemas.len()
        }
    };
    let id = u32::try_from(id).unwrap();
    let versions = registry.subjects.entry(subject).or_default();
    if !versions.contains(&id) {
        versions.push(id);
    }
    Json(json!({ "id": id })).into_response()
}

/// Whether `reader` reads what `writer` wrote (BACKWARD from the new schema's side).
fn reads(writer: &str, reader: &str) -> bool {
    match (
        apache_avro::Schema::parse_str(writer),
        apache_avro::Schema::parse_str(reader),
    ) {
        (Ok(writer), Ok(reader)) => {
            apache_avro::schema_compatibility::SchemaCompatibility::can_read(&writer, &reader)
                .is_ok()
        }
        _ => false,
    }
}

fn not_found(code: u32, message: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error_code": code, "message": message})),
    )
        .into_response()
}

/// `POST /subjects/{subject}`: the id and version of a schema registered
/// under the subject, or 404.
async fn lookup(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let registry = state.lock().unwrap();
    let Some(ids) = registry.subjects.get(&subject) else {
        return not_found(40401, "Subject not found");
    };
    let schema = body["schema"].as_str().unwrap_or_default();
    match ids
        .iter()
        .enumerate()
        .find(|(_, id)| registry.schemas[**id as usize - 1] == schema)
    {
        Some((version, id)) => Json(json!({
            "subject": subject, "id": id, "version": version + 1, "schema": schema
        }))
        .into_response(),
        None => not_found(40403, "Schema not found"),
    }
}

/// `POST /compatibility/subjects/{subject}/versions/latest`: whether the
/// schema reads what the subject's latest version wrote.
async fn compatibility(
    State(state): State<Shared>,
    Path(subject): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    let registry = state.lock().unwrap();
    let Some(latest) = registry.subjects.get(&subject).and_then(|ids| ids.last()) else {
        return not_found(40401, "Subject not found");
    };
    let latest = &registry.schemas[*latest as usize - 1];
    let schema = body["schema"].as_str().unwrap_or_default();
    Json(json!({"is_compatible": reads(latest, schema)})).into_response()
}

async fn schema_by_id(State(state): State<Shared>, Path(id): Path<u32>) -> Response {
    let registry = state.lock().unwrap();
    match registry.schemas.get(id as usize - 1) {
        Some(schema) => Json(json!({"schema": schema, "schemaType": "AVRO"})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error_code": 40403, "message": "Schema not found"})),
        )
            .into_response(),
    }
}

async fn subjects(State(state): State<Shared>) -> Json<Vec<String>> {
    Json(state.lock().unwrap().subjects.keys().cloned().collect())
}
