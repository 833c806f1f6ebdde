//! What every provider's API offers the reconciler and the watchdog, and the
//! pieces the providers' API clients share.
//!
//! Each provider implements [`ProviderApi`] in its own folder
//! (`receiptroller/api.rs`, `mekari/api.rs`): which lists to read, how one
//! page is asked for, and the webhook's on/off state. The reconciler pages
//! and checkpoints provider-neutrally on top of it.

mod client;
#[cfg(test)]
pub(crate) mod fake;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::config::ReconcileConfig;
use crate::config::redact::{SettingError, keys_of};
use crate::domain::event::EntityType;

pub use client::{ApiClient, AttemptError, Authorize, FetchError};

/// How a list is paged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paging {
    /// The API filters by a time window (ReceiptRoller transactions, Mekari orders).
    Window,
    /// The API lists newest first; stop once past the window's start.
    NewestFirst,
    /// The whole list, every run (products, collections).
    All,
}

/// One list to read for a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// What the list holds.
    pub entity_type: EntityType,
    /// The outlet it is read for, where the API is per outlet.
    pub outlet: Option<String>,
    /// How it pages.
    pub paging: Paging,
}

/// One page of records.
#[derive(Debug, Clone)]
pub struct Page {
    /// The entities' data, as in a webhook's `data`.
    pub records: Vec<Value>,
    /// How many pages the list has.
    pub total_pages: u32,
}

impl Page {
    /// Reads a page from an answer to a request for `asked` records, at JSON
    /// pointers for the records and the page count.
    ///
    /// # Errors
    /// [`FetchError::Shape`] when either is missing; [`FetchError::PageTooLarge`]
    /// when the page holds more records than were asked for: an API that
    /// ignores `per_page` would otherwise hand the reconciler any number.
    pub fn from_answer(
        url: &str,
        mut answer: Value,
        records: &str,
        total_pages: &str,
        asked: u32,
    ) -> Result<Page, FetchError> {
        let shape = |reason: String| FetchError::Shape {
            url: url.to_owned(),
            reason,
        };
        let total_pages = answer
            .pointer(total_pages)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| shape(format!("no page count at {total_pages}")))?;
        let records = match answer.pointer_mut(records).map(Value::take) {
            Some(Value::Array(records)) => records,
            _ => return Err(shape(format!("no array at {records}"))),
        };
        if records.len() > usize::try_from(asked).unwrap_or(usize::MAX) {
            return Err(FetchError::PageTooLarge {
                url: url.to_owned(),
                records: records.len(),
                asked,
            });
        }
        Ok(Page {
            records,
            total_pages,
        })
    }
}

/// A webhook's state as its provider reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookState {
    /// Delivering.
    Active,
    /// Switched off (ReceiptRoller) or paused (Mekari), with the provider's detail.
    Off(String),
    /// No webhook id / endpoint key configured for this source.
    NotWatched,
}

/// One provider's API, for one source's account.
#[async_trait]
pub trait ProviderApi: Send + Sync {
    /// The lists to read.
    fn jobs(&self) -> Vec<Job>;
    /// One page of a list, for the window `[from, to)` where the list is windowed.
    async fn page(
        &self,
        job: &Job,
        from: OffsetDateTime,
        to: OffsetDateTime,
        page: u32,
    ) -> Result<Page, FetchError>;
    /// A record's time, for newest-first lists.
    fn record_time(&self, job: &Job, record: &Value) -> Option<OffsetDateTime>;
    /// The source's webhook state.
    async fn webhook_state(&self) -> Result<WebhookState, FetchError>;
    /// Switches the webhook back on, the provider's documented way, when the
    /// source is configured to (`resume_when_off`); `Ok(true)` if it did.
    async fn resume(&self) -> Result<bool, FetchError>;
}

/// How every API client behaves, whatever the provider: from `[reconcile]`.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Attempts per request (408, 429, 5xx and transport errors are retried).
    pub max_attempts: u32,
    /// Timeout of one attempt, its body included.
    pub timeout: Duration,
    /// Largest answer body read; reading stops there.
    pub max_body_bytes: usize,
    /// The HTTP client every source's API shares, made by the first: one
    /// per source would load the TLS roots a thousand times for a thousand
    /// sources, and keep a connection pool each.
    http: Arc<std::sync::OnceLock<reqwest::Client>>,
}

impl ApiOptions {
    /// The options `[reconcile]` sets.
    pub fn new(config: &ReconcileConfig) -> ApiOptions {
        ApiOptions {
            max_attempts: config.max_attempts,
            timeout: Duration::from_millis(config.request_timeout_ms),
            max_body_bytes: usize::try_from(config.max_body_bytes).unwrap_or(usize::MAX),
            http: Arc::default(),
        }
    }

    /// The shared client, made by `make` the first time.
    ///
    /// # Errors
    /// What `make` returns when the client cannot be made.
    pub fn http(
        &self,
        make: impl FnOnce() -> reqwest::Result<reqwest::Client>,
    ) -> reqwest::Result<reqwest::Client> {
        if let Some(http) = self.http.get() {
            return Ok(http.clone());
        }
        let made = make()?;
        Ok(self.http.get_or_init(|| made).clone())
    }
}

/// A provider's API paths by name, with the source's overrides (`api.paths`).
#[derive(Debug, Clone)]
pub struct Paths {
    /// The provider's documented paths.
    defaults: &'static [(&'static str, &'static str)],
    /// The source's overrides.
    overrides: BTreeMap<String, String>,
}

impl Paths {
    /// The provider's `defaults` with a source's `overrides`.
    pub fn new(
        defaults: &'static [(&'static str, &'static str)],
        overrides: BTreeMap<String, String>,
    ) -> Paths {
        Paths {
            defaults,
            overrides,
        }
    }

    /// The path named `name`: the override, else the default, else `/{name}`.
    pub fn get(&self, name: &str) -> String {
        self.overrides
            .get(name)
            .cloned()
            .or_else(|| {
                self.defaults
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, p)| (*p).to_owned())
            })
            .unwrap_or_else(|| format!("/{name}"))
    }
}

/// The checks every provider's `api` table shares, as (field, problem):
/// a URL, a page size, and only path names the provider knows.
fn common_problems(base_url: &str, per_page: u32, paths: &Paths) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    for name in paths.overrides.keys() {
        if !paths.defaults.iter().any(|(known, _)| known == name) {
            problems.push((
                "paths".to_owned(),
                format!(
                    "holds a path name it does not know; use one of {}",
                    paths
                        .defaults
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
    }
    // The URL is not repeated (it may hold a password: `https://user:…@`);
    // the URL parser's reason is its own words.
    if let Err(error) = reqwest::Url::parse(base_url) {
        problems.push(("base_url".to_owned(), format!("is not a URL: {error}")));
    }
    if per_page == 0 {
        problems.push(("per_page".to_owned(), "must be above 0".to_owned()));
    }
    problems
}

/// A provider's `api` settings type: what every provider's table holds
/// (base URL, page size, paths) and the checks only this provider needs.
pub trait Settings: serde::de::DeserializeOwned {
    /// The base URL, the page size and the paths with their overrides.
    fn common(&self) -> (&str, u32, Paths);
    /// This provider's own problems, as (field, problem).
    fn own_problems(&self) -> Vec<(String, String)>;
}

/// Every mistake in a source's `api` table read as `S`, as (field, problem);
/// a table that does not read as `S` is one problem, at the key the reader
/// names, said without the table's values.
pub fn problems<S: Settings>(api: &crate::config::ApiSection) -> Vec<(String, String)> {
    let settings: S = match api.read() {
        Ok(settings) => settings,
        Err(error) => {
            let error = SettingError::of(&error, keys_of::<S>());
            return vec![(error.key, error.kind.to_string())];
        }
    };
    let (base_url, per_page, paths) = settings.common();
    let mut problems = common_problems(base_url, per_page, &paths);
    problems.extend(settings.own_problems());
    problems
}

/// The keys a provider's `api` table takes: those of its settings `S` and
/// the names of its `paths`.
pub fn keys<S: Settings>(paths: &[(&'static str, &'static str)]) -> Vec<&'static str> {
    let mut keys = keys_of::<S>().to_vec();
    keys.extend(paths.iter().map(|(name, _)| *name));
    keys
}

/// Records per page when a source names no `per_page`.
pub const fn default_per_page() -> u32 {
    100
}

/// RFC 3339 in UTC, as the list APIs take it.
pub fn rfc3339(at: OffsetDateTime) -> String {
    at.to_offset(time::UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_default()
}
