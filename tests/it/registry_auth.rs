//! The Schema Registry over HTTPS with authentication: a private Apicurio
//! Registry with a certificate from a CA the test makes, taking basic auth
//! from the users it is given and bearer tokens signed by the key it trusts.
//! posbridge registers with the configured CA and credentials, and does not
//! start without the CA, with wrong credentials or with a role that may
//! not register.

use std::path::Path;

use posbridge::app::App;
use posbridge::config::Config;
use posbridge::domain::secret::Secret;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::apicurio::{JwtSigner, PrivateRegistry, basic_users};
use crate::support::tls::TestCa;
use crate::support::{brokers, config, unique};

fn secret(text: &str) -> Secret {
    serde_json::from_value(serde_json::json!(text)).unwrap()
}

/// A config for one start attempt against `registry`: fresh topics, and a
/// ledger of its own in `dir/{tag}` (a previous attempt's may still be
/// closing). Trusts `ca`; no credentials yet.
fn attempt(dir: &Path, tag: &str, registry: &PrivateRegistry, ca: &TestCa) -> (Config, String) {
    let prefix = unique(tag);
    let own = dir.join(tag);
    std::fs::create_dir(&own).unwrap();
    let mut config = config(&brokers(), &prefix, &own);
    config.schema_registry.url = Some(registry.url.clone());
    config.schema_registry.ca_file = Some(ca.ca_file.clone());
    (config, format!("{prefix}.sales-value"))
}

/// Builds the app: `Err` holds the whole error chain.
async fn build(config: &Config) -> Result<App, String> {
    assert_eq!(posbridge::app::problems(config), vec![]);
    App::build(config)
        .await
        .map_err(|error| format!("{:#}", anyhow::Error::new(error)))
}

/// The registry's answer to `GET /subjects/{subject}/versions/latest`, with
/// the request's credentials set by `auth`.
async fn latest(
    http: &reqwest::Client,
    registry: &PrivateRegistry,
    subject: &str,
    auth: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
) -> (StatusCode, Value) {
    let response = auth(http.get(format!(
        "{}/subjects/{subject}/versions/latest",
        registry.url
    )))
    .send()
    .await
    .unwrap();
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// One registry (one JVM: its start is the expensive part) for every case.
#[tokio::test(flavor = "multi_thread")]
async fn the_registry_client_trusts_the_configured_ca_and_authenticates() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path());
    let issuer = JwtSigner::new();
    let mut settings = basic_users(&[
        ("alice", "alice-pw", "sr-admin"),
        ("rita", "rita-pw", "sr-readonly"),
    ]);
    settings.extend(issuer.oidc_settings());
    let registry = PrivateRegistry::start(Some(&ca), &settings).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&ca.ca_file).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let alice = |request: reqwest::RequestBuilder| request.basic_auth("alice", Some("alice-pw"));

    // Basic auth as an admin, trusting the CA: registers.
    let (mut basic, subject) = attempt(dir.path(), "ra-basic", &registry, &ca);
    basic.schema_registry.username = Some("alice".into());
    basic.schema_registry.password = Some(secret("alice-pw"));
    drop(
        build(&basic)
            .await
            .expect("registers over TLS with basic auth"),
    );
    let (status, answer) = latest(&http, &registry, &subject, alice).await;
    assert_eq!(status, StatusCode::OK, "{subject}: {answer}");
    assert!(answer["id"].as_u64().is_some(), "{answer}");
    // The registry does want credentials.
    let (status, _) = latest(&http, &registry, &subject, |r| r).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // The same without the CA: the registry's certificate is not trusted.
    let (mut untrusting, _) = attempt(dir.path(), "ra-untrusting", &registry, &ca);
    untrusting.schema_registry.ca_file = None;
    untrusting.schema_registry.username = Some("alice".into());
    untrusting.schema_registry.password = Some(secret("alice-pw"));
    let error = build(&untrusting)
        .await
        .err()
        .expect("an unknown CA is refused");
    assert!(error.contains("schema registry"), "{error}");
    assert!(error.contains("certificate verify failed"), "{error}");

    // A wrong password.
    let (mut wrong, subject) = attempt(dir.path(), "ra-wrong", &registry, &ca);
    wrong.schema_registry.username = Some("alice".into());
    wrong.schema_registry.password = Some(secret("not-alice-pw"));
    let error = build(&wrong)
        .await
        .err()
        .expect("a wrong password is refused");
    assert!(error.contains("schema registry"), "{error}");
    assert!(error.contains("status 401 Unauthorized"), "{error}");
    let (status, _) = latest(&http, &registry, &subject, alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A user who may read but not register.
    let (mut reader, subject) = attempt(dir.path(), "ra-readonly", &registry, &ca);
    reader.schema_registry.username = Some("rita".into());
    reader.schema_registry.password = Some(secret("rita-pw"));
    let error = build(&reader)
        .await
        .err()
        .expect("a read-only user may not register");
    assert!(error.contains("schema registry"), "{error}");
    assert!(error.contains("status 403 Forbidden"), "{error}");
    let (status, _) = latest(&http, &registry, &subject, alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A bearer token from the issuer the registry trusts: registers.
    let token = issuer.token("posbridge", &["sr-admin"]);
    let (mut bearer, subject) = attempt(dir.path(), "ra-bearer", &registry, &ca);
    bearer.schema_registry.token = Some(secret(&token));
    drop(
        build(&bearer)
            .await
            .expect("registers over TLS with a bearer token"),
    );
    let (status, answer) = latest(&http, &registry, &subject, |r| r.bearer_auth(&token)).await;
    assert_eq!(status, StatusCode::OK, "{subject}: {answer}");
    assert!(answer["id"].as_u64().is_some(), "{answer}");

    // A token of the same shape signed by another key.
    let forged = JwtSigner::new().token("posbridge", &["sr-admin"]);
    let (mut impostor, subject) = attempt(dir.path(), "ra-forged", &registry, &ca);
    impostor.schema_registry.token = Some(secret(&forged));
    let error = build(&impostor)
        .await
        .err()
        .expect("a token signed by another key is refused");
    assert!(error.contains("schema registry"), "{error}");
    assert!(error.contains("status 401 Unauthorized"), "{error}");
    let (status, _) = latest(&http, &registry, &subject, alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
