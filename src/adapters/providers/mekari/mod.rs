//! Mekari POS: orders, returns, refunds, exchanges, products, collections;
//! base64 HMAC signatures; eight attempts over ~11 h.
//!
//! Delivery rules as posbridge relies on them (`docs/PROVIDERS.md`): only
//! 408, 429 and 5xx are retried (so posbridge asks with 503 + `Retry-After`),
//! any 3xx or other 4xx fails for good, and ten such failures in a row pause
//! the endpoint.
//!
//! `webhook.rs` turns bodies into events, `api.rs` reads the account's API.

mod api;
mod webhook;

use std::time::Duration;

use time::OffsetDateTime;

use super::api::{ApiOptions, FetchError, ProviderApi};
use super::{Context, DeliveryRules, Json, NormalizeError, Provider};
use crate::config::ApiSection;
use crate::domain::event::{Normalized, ProviderKind};
use crate::domain::verify::SchemeName;

pub use api::{API_CLOCK_SKEW_SECS, api_authorization};

/// Delivery id header (documented).
pub const DELIVERY_HEADER: &str = "x-mekari-event-id";
/// Signature header (assumed; configurable per source).
pub const SIGNATURE_HEADER: &str = "x-mekari-signature";

/// Mekari POS.
#[derive(Debug, Clone, Copy)]
pub struct Mekari;

impl Provider for Mekari {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Mekari
    }

    fn delivery_rules(&self) -> DeliveryRules {
        DeliveryRules {
            answer_timeout: Duration::from_secs(10),
            // Eight attempts, the last about 11 hours after the first (plus
            // up to a minute of jitter).
            retry_window: Duration::from_secs(11 * 3600 + 5 * 60),
            longest_retry_after: Some(Duration::from_secs(3600)),
        }
    }

    fn delivery_id_header(&self) -> &'static str {
        DELIVERY_HEADER
    }

    fn default_scheme(&self) -> SchemeName {
        SchemeName::Base64
    }

    fn default_signature_header(&self) -> &'static str {
        SIGNATURE_HEADER
    }

    fn normalize(&self, body: &Json<'_>, ctx: &Context<'_>) -> Result<Normalized, NormalizeError> {
        webhook::normalize(body, ctx)
    }

    fn entity_event(
        &self,
        event_type: &str,
        at: OffsetDateTime,
        data: &Json<'_>,
        ctx: &Context<'_>,
    ) -> Result<Normalized, NormalizeError> {
        webhook::entity_event(event_type, at, data, ctx)
    }

    fn api_problems(&self, api: &ApiSection) -> Vec<(String, String)> {
        super::api::problems::<api::Settings>(api)
    }

    fn api_keys(&self) -> Vec<&'static str> {
        super::api::keys::<api::Settings>(&api::DEFAULT_PATHS)
    }

    fn connect_api(
        &self,
        api: &ApiSection,
        options: &ApiOptions,
    ) -> Result<Box<dyn ProviderApi>, FetchError> {
        api::connect(api, options)
    }
}
