//! ReceiptRoller's API: the Transactions API for sales in a period, and the
//! webhook's `active` flag for the watchdog (payloads.md, assumed paths).

use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::client::{ApiClient, FetchError};
use super::{Fetcher, Job, Page, Paging, WebhookState, rfc3339};
use crate::config::ApiConfig;
use crate::event::EntityType;

/// Default paths; each can be overridden under `api.paths`.
pub const DEFAULT_PATHS: [(&str, &str); 2] = [
    ("transactions", "/transactions"),
    ("webhook", "/webhooks/{webhook_id}"),
];

/// Reads one ReceiptRoller account.
pub struct ReceiptRollerApi {
    /// The HTTP client with the bearer token.
    client: ApiClient,
    /// API settings of the source.
    config: ApiConfig,
}

impl ReceiptRollerApi {
    /// Wraps a client for a source's API settings.
    pub fn new(client: ApiClient, config: ApiConfig) -> Self {
        ReceiptRollerApi { client, config }
    }

    fn path(&self, name: &str) -> String {
        super::path(&self.config, &DEFAULT_PATHS, name)
    }

    fn webhook_path(&self) -> Option<String> {
        let id = self.config.webhook_id.as_deref()?;
        Some(self.path("webhook").replace("{webhook_id}", id))
    }
}

/// What must be configured for ReceiptRoller, as (field, problem).
pub fn problems(api: &ApiConfig) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if api.token.is_none() {
        problems.push((
            "token",
            "the Transactions API needs a bearer token".to_owned(),
        ));
    }
    if api.resume_when_off && api.webhook_id.is_none() {
        problems.push((
            "webhook_id",
            "resume_when_off needs the webhook's id".to_owned(),
        ));
    }
    problems
}

#[async_trait]
impl Fetcher for ReceiptRollerApi {
    fn jobs(&self) -> Vec<Job> {
        vec![Job {
            entity_type: EntityType::Sale,
            outlet: None,
            paging: Paging::Window,
        }]
    }

    async fn page(
        &self,
        _job: &Job,
        from: OffsetDateTime,
        to: OffsetDateTime,
        page: u32,
    ) -> Result<Page, FetchError> {
        let path = self.path("transactions");
        let answer = self
            .client
            .get(
                &path,
                &[
                    ("from", rfc3339(from)),
                    ("to", rfc3339(to)),
                    ("page", page.to_string()),
                    ("per_page", self.config.per_page.to_string()),
                ],
            )
            .await?;
        Page::from_answer(&path, &answer, "/items", "/total_pages")
    }

    fn record_time(&self, _job: &Job, _record: &Value) -> Option<OffsetDateTime> {
        None
    }

    async fn webhook_state(&self) -> Result<WebhookState, FetchError> {
        let Some(path) = self.webhook_path() else {
            return Ok(WebhookState::NotWatched);
        };
        let answer = self.client.get(&path, &[]).await?;
        Ok(match answer.get("active").and_then(Value::as_bool) {
            Some(true) => WebhookState::Active,
            Some(false) => WebhookState::Off("active: false".into()),
            None => {
                return Err(FetchError::Shape {
                    url: path,
                    reason: "no boolean `active`".into(),
                });
            }
        })
    }

    async fn resume(&self) -> Result<bool, FetchError> {
        let Some(path) = self.webhook_path().filter(|_| self.config.resume_when_off) else {
            return Ok(false);
        };
        self.client
            .call(Method::PATCH, &path, &[], Some(&json!({"active": true})))
            .await
            .map(|_| true)
    }
}
