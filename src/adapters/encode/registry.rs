//! The Schema Registry's REST calls posbridge makes itself: looking a schema
//! up without registering it (`auto_register = false`) and asking whether a
//! schema is compatible with a subject's latest version (`posbridge schema
//! check`). Registering and the encoder's own lookups go through
//! `schema_registry_converter`, built here with the same credentials and CA.

use reqwest::StatusCode;
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use serde_json::{Value, json};

use crate::config::RegistryConfig;
use crate::domain::secret::Secret;

/// How long one registry call may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a registry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The CA file could not be read or is not PEM.
    #[error("schema_registry.ca_file `{path}`: {source}")]
    CaFile {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The HTTP client could not be built.
    #[error("HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The registry did not answer.
    #[error("{url}: {source}")]
    Unreachable {
        /// The request.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The registry answered with an error.
    #[error("{url} answered {status}: {body}")]
    Answer {
        /// The request.
        url: String,
        /// Its status.
        status: StatusCode,
        /// Its body.
        body: String,
    },
    /// The registry's settings could not be built.
    #[error("schema registry settings: {0}")]
    Settings(#[source] schema_registry_converter::error::SRCError),
}

/// The registry, with the configured credentials and CA.
#[derive(Debug, Clone)]
pub struct RegistryClient {
    /// Base URL without a trailing slash.
    base: String,
    /// Shared connection pool, trusting the configured CA.
    http: reqwest::Client,
    /// Basic or bearer credentials.
    auth: Auth,
}

#[derive(Clone)]
enum Auth {
    None,
    Basic(String, Option<Secret>),
    Bearer(Secret),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Basic(..) => "Basic([redacted])",
            Auth::Bearer(_) => "Bearer([redacted])",
        })
    }
}

impl RegistryClient {
    /// A client for the configured registry at `url`.
    ///
    /// # Errors
    /// [`RegistryError`] when the CA file or the client cannot be built.
    pub fn new(config: &RegistryConfig, url: &str) -> Result<RegistryClient, RegistryError> {
        let auth = match (&config.token, &config.username) {
            (Some(token), _) => Auth::Bearer(token.clone()),
            (None, Some(user)) => Auth::Basic(user.clone(), config.password.clone()),
            (None, None) => Auth::None,
        };
        Ok(RegistryClient {
            base: url.trim_end_matches('/').to_owned(),
            http: client_builder(config)?
                .build()
                .map_err(RegistryError::Client)?,
            auth,
        })
    }

    /// The settings `schema_registry_converter` encodes with: same URL,
    /// credentials and CA.
    ///
    /// # Errors
    /// [`RegistryError`] when they cannot be built.
    pub fn settings(config: &RegistryConfig, url: &str) -> Result<SrSettings, RegistryError> {
        let mut builder = SrSettings::new_builder(url.trim_end_matches('/').to_owned());
        builder.no_proxy().set_timeout(TIMEOUT);
        if let Some(token) = &config.token {
            builder.set_token_authorization(token.expose());
        } else if let Some(user) = &config.username {
            builder.set_basic_authorization(user, config.password.as_ref().map(Secret::expose));
        }
        builder
            .build_with(client_builder(config)?)
            .map_err(RegistryError::Settings)
    }

    /// The id of `schema` under `subject`, or `None` when it is not
    /// registered there.
    ///
    /// # Errors
    /// [`RegistryError`] when the registry cannot say.
    pub async fn lookup(&self, subject: &str, schema: &str) -> Result<Option<u32>, RegistryError> {
        let url = format!("{}/subjects/{subject}", self.base);
        let answer = self.post(&url, schema).await?;
        match answer {
            None => Ok(None),
            Some(body) => Ok(body
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|id| u32::try_from(id).ok())),
        }
    }

    /// Whether `schema` may be registered under `subject` by the subject's
    /// compatibility rules; `None` for a subject that does not exist yet.
    /// Whether it exists is asked first: Confluent's registry answers the
    /// compatibility check of an unknown subject with 404, Apicurio's
    /// Confluent-compatible API with "compatible".
    ///
    /// # Errors
    /// [`RegistryError`] when the registry cannot say.
    pub async fn compatible(
        &self,
        subject: &str,
        schema: &str,
    ) -> Result<Option<bool>, RegistryError> {
        let versions = format!("{}/subjects/{subject}/versions", self.base);
        if self
            .answer(self.http.get(&versions), &versions)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let url = format!(
            "{}/compatibility/subjects/{subject}/versions/latest",
            self.base
        );
        Ok(self
            .post(&url, schema)
            .await?
            .map(|body| body.get("is_compatible").and_then(Value::as_bool) == Some(true)))
    }

    /// The schema registered under `id` (its JSON text); `None` for an id
    /// the registry does not know.
    ///
    /// # Errors
    /// [`RegistryError`] when the registry cannot answer.
    pub async fn schema_of(&self, id: u32) -> Result<Option<String>, RegistryError> {
        let url = format!("{}/schemas/ids/{id}", self.base);
        Ok(self
            .answer(self.http.get(&url), &url)
            .await?
            .and_then(|body| {
                body.get("schema")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            }))
    }

    /// POSTs a schema; `None` for 404 (no such subject or schema).
    async fn post(&self, url: &str, schema: &str) -> Result<Option<Value>, RegistryError> {
        let request = self
            .http
            .post(url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .json(&json!({ "schema": schema }));
        self.answer(request, url).await
    }

    /// Sends a request with the configured credentials: its JSON body, or
    /// `None` for 404.
    async fn answer(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<Option<Value>, RegistryError> {
        let request = match &self.auth {
            Auth::None => request,
            Auth::Basic(user, password) => {
                request.basic_auth(user, password.as_ref().map(Secret::expose))
            }
            Auth::Bearer(token) => request.bearer_auth(token.expose()),
        };
        let response = request
            .send()
            .await
            .map_err(|source| RegistryError::Unreachable {
                url: url.to_owned(),
                source,
            })?;
        let status = response.status();
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let body = response.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(RegistryError::Answer {
                url: url.to_owned(),
                status,
                body,
            });
        }
        Ok(Some(serde_json::from_str(&body).unwrap_or(Value::Null)))
    }
}

/// An HTTP client builder trusting `ca_file` when one is configured.
fn client_builder(config: &RegistryConfig) -> Result<reqwest::ClientBuilder, RegistryError> {
    let mut builder = reqwest::Client::builder().timeout(TIMEOUT).no_proxy();
    if let Some(path) = &config.ca_file {
        let ca_error = |source: Box<dyn std::error::Error + Send + Sync>| RegistryError::CaFile {
            path: path.display().to_string(),
            source,
        };
        let pem = std::fs::read(path).map_err(|e| ca_error(e.into()))?;
        let certificate = reqwest::Certificate::from_pem(&pem).map_err(|e| ca_error(e.into()))?;
        builder = builder.add_root_certificate(certificate);
    }
    Ok(builder)
}
