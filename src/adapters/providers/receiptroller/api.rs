//! ReceiptRoller's API for one account: the Transactions API for sales in a
//! period, and the webhook's `active` flag for the watchdog (paths as assumed
//! in `docs/PROVIDERS.md`; each can be overridden). Every request carries the
//! account's bearer token.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use reqwest::{Method, RequestBuilder, Url};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::adapters::providers::api::{
    ApiClient, ApiOptions, Authorize, FetchError, Job, Page, Paging, Paths, ProviderApi,
    Settings as ApiSettings, WebhookState, default_per_page, rfc3339,
};
use crate::config::ApiSection;
use crate::domain::event::EntityType;
use crate::domain::secret::Secret;

/// Default paths; each can be overridden under `api.paths`.
pub(super) const DEFAULT_PATHS: [(&str, &str); 2] = [
    ("transactions", "/transactions"),
    ("webhook", "/webhooks/{webhook_id}"),
];

/// A source's `api` table for ReceiptRoller.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// API base URL; paths are appended to it.
    base_url: String,
    /// Bearer token of the account.
    #[serde(default)]
    token: Option<Secret>,
    /// Records per page requested.
    #[serde(default = "default_per_page")]
    per_page: u32,
    /// Path overrides by name (`transactions`, `webhook`).
    #[serde(default)]
    paths: BTreeMap<String, String>,
    /// This source's webhook id, for the watchdog.
    #[serde(default)]
    webhook_id: Option<String>,
    /// `PATCH active=true` when the watchdog finds the webhook switched off.
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
        if self.token.is_none() {
            problems.push((
                "token".to_owned(),
                "the Transactions API needs a bearer token".to_owned(),
            ));
        }
        if self.resume_when_off && self.webhook_id.is_none() {
            problems.push((
                "webhook_id".to_owned(),
                "resume_when_off needs the webhook's id".to_owned(),
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
    let token = settings
        .token
        .clone()
        .ok_or(FetchError::MissingSetting("token"))?;
    let client = ApiClient::new(&settings.base_url, Arc::new(Bearer(token)), options)?;
    Ok(Box::new(ReceiptRollerApi {
        client,
        paths: Paths::new(&DEFAULT_PATHS, settings.paths.clone()),
        settings,
    }))
}

/// `Authorization: Bearer <token>`.
struct Bearer(Secret);

impl Authorize for Bearer {
    fn authorize(&self, request: RequestBuilder, _: &Method, _: &Url) -> RequestBuilder {
        request.bearer_auth(self.0.expose())
    }
}

/// Reads one ReceiptRoller account.
struct ReceiptRollerApi {
    /// The HTTP client with the bearer token.
    client: ApiClient,
    /// The paths, defaults with the source's overrides.
    paths: Paths,
    /// API settings of the source.
    settings: Settings,
}

impl ReceiptRollerApi {
    fn webhook_path(&self) -> Option<String> {
        let id = self.settings.webhook_id.as_deref()?;
        Some(self.paths.get("webhook").replace("{webhook_id}", id))
    }
}

#[async_trait]
impl ProviderApi for ReceiptRollerApi {
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
        let path = self.paths.get("transactions");
        let answer = self
            .client
            .get(
                &path,
                &[
                    ("from", rfc3339(from)),
                    ("to", rfc3339(to)),
                    ("page", page.to_string()),
                    ("per_page", self.settings.per_page.to_string()),
                ],
            )
            .await?;
        Page::from_answer(
            &path,
            answer,
            "/items",
            "/total_pages",
            self.settings.per_page,
        )
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
        let Some(path) = self
            .webhook_path()
            .filter(|_| self.settings.resume_when_off)
        else {
            return Ok(false);
        };
        self.client
            .call(Method::PATCH, &path, &[], Some(&json!({"active": true})))
            .await
            .map(|_| true)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::adapters::providers::api::fake::{Answer, FakeProviderApi, api_section};
    use crate::config::ReconcileConfig;

    #[tokio::test]
    async fn a_page_with_more_items_than_asked_is_refused() {
        let items = vec![json!({"id": "T1|2026-11|000001"}); 200_000];
        let (fake, base) = FakeProviderApi::serve(vec![Answer::Json(
            json!({"items": items, "page": 1, "total_pages": 1}),
        )])
        .await;
        let api = connect(
            &api_section(&format!(
                "base_url = \"{base}\"\ntoken = \"t\"\nper_page = 100"
            )),
            &ApiOptions::new(&ReconcileConfig::default()),
        )
        .unwrap();
        let job = &api.jobs()[0];
        let now = OffsetDateTime::now_utc();
        let error = api
            .page(job, now - time::Duration::hours(1), now, 1)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("100 asked"), "{error}");
        assert_eq!(fake.requests(), 1);
    }
}
