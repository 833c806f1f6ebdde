//! A private Apicurio Registry 3.3 for one test (`scripts/apicurio` on free
//! ports, in-memory, killed on drop): for settings the shared one
//! `scripts/test` starts cannot have, such as TLS and authentication. A JVM
//! takes 10–20 s to start: start few.
//!
//! Authentication needs no OIDC server: basic auth checks users given as
//! settings ([`basic_users`]), and bearer tokens are JWTs checked against a
//! public key given as a setting ([`JwtSigner::oidc_settings`]), their
//! `groups` claim holding the roles (`sr-admin`, `sr-developer`,
//! `sr-readonly`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::sign::Signer;
use serde_json::json;

use super::tls::TestCa;

/// How long the JVM may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The `iss` of the tokens [`JwtSigner`] signs, and the one the registry expects.
pub const ISSUER: &str = "https://local.test/issuer";

/// A running private registry.
pub struct PrivateRegistry {
    /// Its Confluent-compatible API (`…/apis/ccompat/v7`): what goes into
    /// `schema_registry.url`. `https://` with TLS.
    pub url: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PrivateRegistry {
    /// Starts a registry with `settings` (each passed as `-Dkey=value`) and
    /// waits until it answers. With `tls`, its API speaks only HTTPS, with
    /// `tls`'s server certificate (for 127.0.0.1), on the port of `url`.
    pub async fn start(tls: Option<&TestCa>, settings: &[(String, String)]) -> PrivateRegistry {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("apicurio.log");
        let port = super::ports::free_ports(2);
        let mut args: Vec<String> = Vec::new();
        if let Some(ca) = tls {
            // The HTTPS port is the one scripts/apicurio gives the plain
            // HTTP listener, which `insecure-requests=disabled` does not open.
            args.push(format!("-Dquarkus.http.ssl-port={port}"));
            args.push(format!(
                "-Dquarkus.http.ssl.certificate.files={}",
                ca.cert_file.display()
            ));
            args.push(format!(
                "-Dquarkus.http.ssl.certificate.key-files={}",
                ca.key_file.display()
            ));
            args.push("-Dquarkus.http.insecure-requests=disabled".into());
        }
        args.extend(
            settings
                .iter()
                .map(|(key, value)| format!("-D{key}={value}")),
        );
        let output = std::fs::File::create(&log).unwrap();
        let child = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/apicurio"))
            .arg(port.to_string())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .expect("scripts/apicurio");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut registry = PrivateRegistry {
            url: format!("{scheme}://127.0.0.1:{port}/apis/ccompat/v7"),
            child,
            log,
            _dir: dir,
        };
        let started = Instant::now();
        registry.wait_ready(port).await;
        println!(
            "private Apicurio answers on {} after {:.1} s",
            registry.url,
            started.elapsed().as_secs_f64()
        );
        registry
    }

    /// Waits until the management interface (plain HTTP on `port + 1`, no
    /// authentication) says ready and the API's port takes connections.
    async fn wait_ready(&mut self, port: u16) {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let health = format!("http://127.0.0.1:{}/health/ready", port + 1);
        let answered = super::wait::look_for(START_TIMEOUT, async || {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("Apicurio exited ({status}) before answering (its log follows)");
            }
            let ready = http
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            (ready
                && tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .is_ok())
            .then_some(())
        })
        .await;
        if answered.is_none() {
            panic!(
                "Apicurio did not answer on {health} within {START_TIMEOUT:?} (its log follows)"
            );
        }
    }

    /// The last lines of the registry's log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        // scripts/apicurio `exec`s the JVM: the child is the JVM.
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A test that failed (or a start that did) shows why the registry
        // answered as it did.
        if std::thread::panicking() {
            eprintln!("private Apicurio's log ends:\n{}", self.log_tail());
        }
    }
}

/// Settings for HTTP basic authentication with role-based authorization,
/// for `users` as (name, password, role).
pub fn basic_users(users: &[(&str, &str, &str)]) -> Vec<(String, String)> {
    let mut settings = vec![
        // Quarkus warns this is fixed at build time; without it, though,
        // Apicurio's authentication chain is OIDC alone.
        ("quarkus.http.auth.basic".into(), "true".into()),
        (
            "apicurio.auth.role-based-authorization".into(),
            "true".into(),
        ),
        (
            "quarkus.security.users.embedded.plain-text".into(),
            "true".into(),
        ),
    ];
    for (name, password, role) in users {
        settings.push((
            format!("quarkus.security.users.embedded.users.{name}"),
            (*password).to_owned(),
        ));
        settings.push((
            format!("quarkus.security.users.embedded.roles.{name}"),
            (*role).to_owned(),
        ));
    }
    settings
}

/// Signs RS256 JWTs with a fresh RSA key: the tokens an identity provider
/// would issue, for a registry that trusts the key's public half.
pub struct JwtSigner {
    key: PKey<Private>,
}

impl JwtSigner {
    /// A signer with a new 2048-bit key.
    pub fn new() -> JwtSigner {
        JwtSigner {
            key: PKey::from_rsa(Rsa::generate(2048).unwrap()).unwrap(),
        }
    }

    /// Settings making the registry take bearer tokens this signer signed
    /// (issuer [`ISSUER`], roles in the `groups` claim).
    pub fn oidc_settings(&self) -> Vec<(String, String)> {
        // The body of the public key's PEM: base64 of its DER, one line.
        let public_key = STANDARD.encode(self.key.public_key_to_der().unwrap());
        vec![
            (
                "apicurio.auth.role-based-authorization".into(),
                "true".into(),
            ),
            ("quarkus.oidc.tenant-enabled".into(), "true".into()),
            ("quarkus.oidc.public-key".into(), public_key),
            ("quarkus.oidc.token.issuer".into(), ISSUER.into()),
            ("quarkus.oidc.roles.role-claim-path".into(), "groups".into()),
        ]
    }

    /// A token for `user` with `groups` (roles), valid for ten minutes.
    pub fn token(&self, user: &str, groups: &[&str]) -> String {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = json!({
            "iss": ISSUER, "sub": user, "preferred_username": user,
            "groups": groups, "iat": now, "exp": now + 600,
        });
        let header = json!({"alg": "RS256", "typ": "JWT"});
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signer = Signer::new(MessageDigest::sha256(), &self.key).unwrap();
        let signature = signer.sign_oneshot_to_vec(message.as_bytes()).unwrap();
        format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}
