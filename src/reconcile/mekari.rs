//! Mekari POS's API: the list endpoints the delivery document names for
//! catching up, and `GET /webhooks/endpoints` for the watchdog. Requests are
//! signed with Mekari's HMAC API authentication (see `ApiClient`).

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::client::{ApiClient, FetchError};
use super::{Fetcher, Job, Page, Paging, WebhookState, rfc3339};
use crate::config::ApiConfig;
use crate::event::EntityType;

/// Default paths; each can be overridden under `api.paths`.
pub const DEFAULT_PATHS: [(&str, &str); 8] = [
    ("orders", "/orders"),
    ("returns", "/returns"),
    ("refunds", "/refunds"),
    ("exchanges", "/exchanges"),
    ("products", "/products"),
    ("collections", "/collections"),
    ("endpoints", "/webhooks/endpoints"),
    ("endpoint", "/webhooks/endpoints/{key}"),
];

/// Reads one Mekari account.
pub struct MekariApi {
    /// The HTTP client with HMAC credentials.
    client: ApiClient,
    /// API settings of the source.
    config: ApiConfig,
}

impl MekariApi {
    /// Wraps a client for a source's API settings.
    pub fn new(client: ApiClient, config: ApiConfig) -> Self {
        MekariApi { client, config }
    }

    fn path(&self, name: &str) -> String {
        super::path(&self.config, &DEFAULT_PATHS, name)
    }

    async fn endpoint(&self) -> Result<Option<Value>, FetchError> {
        let Some(key) = self.config.endpoint_key.as_deref() else {
            return Ok(None);
        };
        let path = self.path("endpoints");
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

/// What must be configured for Mekari, as (field, problem).
pub fn problems(api: &ApiConfig) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if api.client_id.is_none() || api.client_secret.is_none() {
        problems.push((
            "client_id",
            "Mekari's HMAC API authentication needs client_id and client_secret".to_owned(),
        ));
    }
    if api.outlets.is_empty() {
        problems.push((
            "outlets",
            "orders, returns, refunds and exchanges are read per outlet: name at least one"
                .to_owned(),
        ));
    }
    if api.resume_when_off && api.endpoint_key.is_none() {
        problems.push((
            "endpoint_key",
            "resume_when_off needs the endpoint's key".to_owned(),
        ));
    }
    problems
}

#[async_trait]
impl Fetcher for MekariApi {
    fn jobs(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        for outlet in &self.config.outlets {
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
        let path = self.path(job.entity_type.plural());
        let mut query = vec![
            ("page", page.to_string()),
            ("per_page", self.config.per_page.to_string()),
        ];
        if let Some(outlet) = &job.outlet {
            query.insert(0, ("outlet_id", outlet.clone()));
        }
        if job.entity_type == EntityType::Order {
            query.push(("sold_at_from", rfc3339(from)));
            query.push(("sold_at_to", rfc3339(to)));
        }
        let answer = self.client.get(&path, &query).await?;
        Page::from_answer(&path, &answer, "/data", "/meta/total_pages")
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
        if !self.config.resume_when_off {
            return Ok(false);
        }
        let (Some(key), Some(endpoint)) =
            (self.config.endpoint_key.as_deref(), self.endpoint().await?)
        else {
            return Ok(false);
        };
        let path = self.path("endpoint").replace("{key}", key);
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
