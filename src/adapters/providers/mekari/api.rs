//! Mekari POS's API for one account: the list endpoints for catching up
//! (orders, returns, refunds, exchanges per outlet; products, collections)
//! and `GET /webhooks/endpoints` for the watchdog. Every request is signed
//! with Mekari's HMAC API authentication.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use reqwest::{Method, RequestBuilder, Url};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::adapters::providers::api::{
    ApiClient, ApiOptions, Authorize, FetchError, Job, Page, Paging, Paths, ProviderApi,
    Settings as ApiSettings, WebhookState, default_per_page, rfc3339,
};
use crate::config::ApiSection;
use crate::domain::event::EntityType;
use crate::domain::secret::Secret;

/// Default paths; each can be overridden under `api.paths`.
pub(super) const DEFAULT_PATHS: [(&str, &str); 8] = [
    ("orders", "/orders"),
    ("returns", "/returns"),
    ("refunds", "/refunds"),
    ("exchanges", "/exchanges"),
    ("products", "/products"),
    ("collections", "/collections"),
    ("endpoints", "/webhooks/endpoints"),
    ("endpoint", "/webhooks/endpoints/{key}"),
];

/// A source's `api` table for Mekari POS.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// API base URL; paths are appended to it.
    base_url: String,
    /// HMAC client id (the `username` of the signature).
    #[serde(default)]
    client_id: Option<String>,
    /// HMAC client secret.
    #[serde(default)]
    client_secret: Option<Secret>,
    /// Outlets whose orders, returns, refunds and exchanges are read.
    #[serde(default)]
    outlets: Vec<String>,
    /// Records per page requested.
    #[serde(default = "default_per_page")]
    per_page: u32,
    /// Path overrides by name (see `DEFAULT_PATHS`).
    #[serde(default)]
    paths: BTreeMap<String, String>,
    /// This source's endpoint key, for the watchdog.
    #[serde(default)]
    endpoint_key: Option<String>,
    /// `test`, then the same `PUT`, when the watchdog finds the endpoint paused.
    #[serde(default)]
    resume_when_off: bool,
}

impl ApiSettings for Settings {
    fn common(&self) -> (&str, u32, Paths) {
        (
            &self.base_url,
            self.per_page,
            Paths::new(&DEFAULT_PATHS, self.paths.clone()),
        )
    }

    fn own_problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.client_id.is_none() || self.client_secret.is_none() {
            problems.push((
                "client_id".to_owned(),
                "Mekari's HMAC API authentication needs client_id and client_secret".to_owned(),
            ));
        }
        if self.outlets.is_empty() {
            problems.push((
                "outlets".to_owned(),
                "orders, returns, refunds and exchanges are read per outlet: name at least one"
                    .to_owned(),
            ));
        }
        if self.resume_when_off && self.endpoint_key.is_none() {
            problems.push((
                "endpoint_key".to_owned(),
                "resume_when_off needs the endpoint's key".to_owned(),
            ));
        }
        problems
    }
}

/// The API of the account an `api` table names.
///
/// # Errors
/// [`FetchError`] when the table or the client is unusable.
pub fn connect(api: &ApiSection, options: &ApiOptions) -> Result<Box<dyn ProviderApi>, FetchError> {
    let settings: Settings = api
        .read()
        .map_err(|error| FetchError::Settings(Box::new(error)))?;
    let auth = Hmac {
        client_id: settings
            .client_id
            .clone()
            .ok_or(FetchError::MissingSetting("client_id"))?,
        secret: settings
            .client_secret
            .clone()
            .ok_or(FetchError::MissingSetting("client_secret"))?,
    };
    let client = ApiClient::new(&settings.base_url, Arc::new(auth), options)?;
    Ok(Box::new(MekariApi {
        client,
        paths: Paths::new(&DEFAULT_PATHS, settings.paths.clone()),
        settings,
    }))
}

/// Mekari's API gateway refuses a request whose `Date` is further than this
/// from its clock.
pub const API_CLOCK_SKEW_SECS: i64 = 300;

/// The `Authorization` value for one Mekari API request (HMAC API
/// authentication, `docs/PROVIDERS.md`): HMAC-SHA256 with the client secret over
/// `date: {date}\n{METHOD} {path with query} HTTP/1.1`, base64. `date` is the
/// request's `Date` header (RFC 7231, GMT). The simulator checks requests
/// with the same function, so both sides sign one way.
pub fn api_authorization(
    client_id: &str,
    client_secret: &str,
    date: &str,
    method: &str,
    path_and_query: &str,
) -> String {
    use base64::Engine;
    let signing = format!("date: {date}\n{method} {path_and_query} HTTP/1.1");
    let signature = base64::engine::general_purpose::STANDARD.encode(
        crate::domain::verify::hmac_sha256(client_secret.as_bytes(), &[signing.as_bytes()]),
    );
    format!(
        "hmac username=\"{client_id}\", algorithm=\"hmac-sha256\", headers=\"date request-line\", signature=\"{signature}\""
    )
}

/// Mekari's HMAC API authentication over `Date` and the request line.
struct Hmac {
    /// The client id (`username`).
    client_id: String,
    /// The client secret.
    secret: Secret,
}

impl Authorize for Hmac {
    fn authorize(&self, request: RequestBuilder, method: &Method, url: &Url) -> RequestBuilder {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let path_and_query = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let authorization = api_authorization(
            &self.client_id,
            self.secret.expose(),
            &date,
            method.as_str(),
            &path_and_query,
        );
        request
            .header(reqwest::header::DATE, date)
            .header(reqwest::header::AUTHORIZATION, authorization)
    }
}

/// Reads one Mekari account.
struct MekariApi {
    /// The HTTP client with HMAC credentials.
    client: ApiClient,
    /// The paths, defaults with the source's overrides.
    paths: Paths,
    /// API settings of the source.
    settings: Settings,
}

impl MekariApi {
    async fn endpoint(&self) -> Result<Option<Value>, FetchError> {
        let Some(key) = self.settings.endpoint_key.as_deref() else {
            return Ok(None);
        };
        let path = self.paths.get("endpoints");
        let answer = self.client.get(&path, &[]).await?;
        let endpoints = answer
            .get("data")
            .and_then(Value::as_array)
            .ok_or_else(|| FetchError::Shape {
                url: path.clone(),
                reason: "no `data` array".into(),
            })?;
        endpoints
            .iter()
            .find(|e| e.get("key").and_then(Value::as_str) == Some(key))
            .cloned()
            .map(Some)
            .ok_or_else(|| FetchError::Shape {
                url: path,
                reason: format!("no endpoint with key `{key}`"),
            })
    }
}

#[async_trait]
impl ProviderApi for MekariApi {
    fn jobs(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for outlet in &self.settings.outlets {
            jobs.push(Job {
                entity_type: EntityType::Order,
                outlet: Some(outlet.clone()),
                paging: Paging::Window,
            });
            for entity_type in [EntityType::Return, EntityType::Refund, EntityType::Exchange] {
                jobs.push(Job {
                    entity_type,
                    outlet: Some(outlet.clone()),
                    paging: Paging::NewestFirst,
                });
            }
        }
        for entity_type in [EntityType::Product, EntityType::Collection] {
            jobs.push(Job {
                entity_type,
                outlet: None,
                paging: Paging::All,
            });
        }
        jobs
    }

    async fn page(
        &self,
        job: &Job,
        from: OffsetDateTime,
        to: OffsetDateTime,
        page: u32,
    ) -> Result<Page, FetchError> {
        let path = self.paths.get(job.entity_type.plural());
        let mut query = vec![
            ("page", page.to_string()),
            ("per_page", self.settings.per_page.to_string()),
        ];
        if let Some(outlet) = &job.outlet {
            query.insert(0, ("outlet_id", outlet.clone()));
        }
        if job.entity_type == EntityType::Order {
            query.push(("sold_at_from", rfc3339(from)));
            query.push(("sold_at_to", rfc3339(to)));
        }
        let answer = self.client.get(&path, &query).await?;
        Page::from_answer(
            &path,
            answer,
            "/data",
            "/meta/total_pages",
            self.settings.per_page,
        )
    }

    fn record_time(&self, _job: &Job, record: &Value) -> Option<OffsetDateTime> {
        ["updated_at", "created_at"]
            .iter()
            .filter_map(|f| record.get(*f).and_then(Value::as_str))
            .find_map(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
    }

    async fn webhook_state(&self) -> Result<WebhookState, FetchError> {
        let Some(endpoint) = self.endpoint().await? else {
            return Ok(WebhookState::NotWatched);
        };
        let failures = endpoint
            .get("consecutive_failures")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Ok(match endpoint.get("status").and_then(Value::as_str) {
            Some("active") => WebhookState::Active,
            Some(status) => WebhookState::Off(format!(
                "status: {status}, consecutive_failures: {failures}"
            )),
            None => WebhookState::Off("no status".into()),
        })
    }

    /// The documented way: `test`, then the same `PUT` again.
    async fn resume(&self) -> Result<bool, FetchError> {
        if !self.settings.resume_when_off {
            return Ok(false);
        }
        let (Some(key), Some(endpoint)) = (
            self.settings.endpoint_key.as_deref(),
            self.endpoint().await?,
        ) else {
            return Ok(false);
        };
        let path = self.paths.get("endpoint").replace("{key}", key);
        self.client
            .call(Method::POST, &format!("{path}/test"), &[], None)
            .await?;
        let body = json!({"url": endpoint.get("url"), "events": endpoint.get("events")});
        self.client
            .call(Method::PUT, &path, &[], Some(&body))
            .await
            .map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::providers::api::fake::{Answer, FakeProviderApi, api_section};
    use crate::config::ReconcileConfig;

    #[tokio::test]
    async fn a_page_with_more_items_than_asked_is_refused() {
        let items = vec![json!({"id": "P-1"}); 1_000];
        let (fake, base) = FakeProviderApi::serve(vec![Answer::Json(
            json!({"data": items, "meta": {"page": 1, "total_pages": 1}}),
        )])
        .await;
        let api = connect(
            &api_section(&format!(
                "base_url = \"{base}\"\nclient_id = \"c\"\nclient_secret = \"s\"\noutlets = [\"OUT-1\"]\nper_page = 50"
            )),
            &ApiOptions::new(&ReconcileConfig::default()),
        )
        .unwrap();
        let products = api
            .jobs()
            .into_iter()
            .find(|job| job.entity_type == EntityType::Product)
            .unwrap();
        let now = OffsetDateTime::now_utc();
        let error = api.page(&products, now, now, 1).await.unwrap_err();
        assert!(error.to_string().contains("50 asked"), "{error}");
        assert_eq!(fake.requests(), 1);
    }

    #[test]
    fn api_requests_are_signed_as_the_gateway_documents() {
        let header = api_authorization(
            "client-1",
            "secret-1",
            "Mon, 30 Nov 2026 02:34:32 GMT",
            "GET",
            "/orders?outlet_id=OUT-9&page=1",
        );
        // Expected value computed independently with:
        // printf 'date: Mon, 30 Nov 2026 02:34:32 GMT\nGET /orders?outlet_id=OUT-9&page=1 HTTP/1.1' \
        //   | openssl dgst -sha256 -hmac secret-1 -binary | base64
        assert_eq!(
            header,
            format!(
                "hmac username=\"client-1\", algorithm=\"hmac-sha256\", headers=\"date request-line\", signature=\"{}\"",
                "uJOU5JBGnvBHSkSu5rPPXU6EO98Efs8e3ooYN88D/5g="
            )
        );
    }
}
