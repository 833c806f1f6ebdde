//! ReceiptRoller: sales and orders, hex HMAC signatures, four attempts.
//!
//! Delivery rules as posbridge relies on them (`docs/PROVIDERS.md`): four
//! attempts over ~71 min, every non-2xx or timeout is a failure and four
//! failures of one event switch the whole webhook off; `X-RR-Delivery` equals
//! the body's `id` and repeats across webhooks subscribed to one event.
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

/// Delivery id header (documented).
pub const DELIVERY_HEADER: &str = "x-rr-delivery";
/// Signature header (assumed; configurable per source).
pub const SIGNATURE_HEADER: &str = "x-rr-signature";

/// ReceiptRoller.
#[derive(Debug, Clone, Copy)]
pub struct ReceiptRoller;

impl Provider for ReceiptRoller {
    fn kind(&self) -> ProviderKind {
        ProviderKind::ReceiptRoller
    }

    fn delivery_rules(&self) -> DeliveryRules {
        DeliveryRules {
            answer_timeout: Duration::from_secs(10),
            // Four attempts, the last 71 minutes after the first plus up to
            // 10 s of waiting per attempt.
            retry_window: Duration::from_secs(71 * 60 + 40),
            longest_retry_after: None,
        }
    }

    fn delivery_id_header(&self) -> &'static str {
        DELIVERY_HEADER
    }

    fn default_scheme(&self) -> SchemeName {
        SchemeName::Hex
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
