//! Mekari POS: orders, returns, refunds, exchanges, products, collections.
//!
//! Delivery rules (mekari-pos-delivery.md): eight attempts over ~11 h; only
//! 408, 429 and 5xx are retried (ask with 503 + `Retry-After`), any 3xx or
//! other 4xx fails for good and ten of those in a row pause the endpoint.
//! `occurred_at` orders events about one entity; kitchen events also compare
//! `kitchen_status`.

use serde_json::Value;

use time::OffsetDateTime;

use super::{
    Context, NormalizeError, Provider, first_money, items, optional_text, required_str,
    required_time,
};
use crate::event::{EntityType, PosEvent, ProviderKind, Version};
use crate::verify::SchemeName;

/// Delivery id header (documented).
pub const DELIVERY_HEADER: &str = "x-mekari-event-id";
/// Signature header (assumed in payloads.md; configurable per source).
pub const SIGNATURE_HEADER: &str = "x-mekari-signature";

/// Mekari's API gateway refuses a request whose `Date` is further than this
/// from its clock.
pub const API_CLOCK_SKEW_SECS: i64 = 300;

/// The `Authorization` value for one Mekari API request (HMAC API
/// authentication, payloads.md): HMAC-SHA256 with the client secret over
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
    let signature = base64::engine::general_purpose::STANDARD.encode(crate::verify::hmac_sha256(
        client_secret.as_bytes(),
        &[signing.as_bytes()],
    ));
    format!(
        "hmac username=\"{client_id}\", algorithm=\"hmac-sha256\", headers=\"date request-line\", signature=\"{signature}\""
    )
}

/// Kitchen progress in order. At one `occurred_at`, a later stage wins; an
/// unknown status ranks lowest so it never hides a known later stage.
const KITCHEN_PROGRESS: [&str; 9] = [
    "new",
    "pending",
    "queued",
    "accepted",
    "preparing",
    "ready",
    "served",
    "completed",
    "cancelled",
];

/// Mekari POS's wire format.
#[derive(Debug, Clone, Copy)]
pub struct Mekari;

impl Provider for Mekari {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Mekari
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

    fn normalize(&self, body: &Value, ctx: &Context<'_>) -> Result<PosEvent, NormalizeError> {
        let event_type = required_str(body, "event")?;
        let occurred_at = required_time(body, "occurred_at")?;
        let data = body
            .get("data")
            .ok_or(NormalizeError::MissingField("data"))?;
        let mut event = self.entity_event(event_type, occurred_at, data, ctx)?;
        if event.outlet_id.is_none() {
            event.outlet_id = optional_text(body, "outlet_id");
        }
        Ok(event)
    }

    /// Builds the event from the entity's data; `at` is the version time
    /// (`occurred_at` for webhooks, the fetch time for reconciled records).
    fn entity_event(
        &self,
        event_type: &str,
        at: OffsetDateTime,
        data: &Value,
        ctx: &Context<'_>,
    ) -> Result<PosEvent, NormalizeError> {
        let (family, verb) = event_type.split_once('.').unwrap_or((event_type, ""));
        let entity_type = match family {
            "order" => EntityType::Order,
            "return" => EntityType::Return,
            "refund" => EntityType::Refund,
            "exchange" => EntityType::Exchange,
            "product" => EntityType::Product,
            "collection" => EntityType::Collection,
            _ => return Err(NormalizeError::UnknownEventType(event_type.to_owned())),
        };
        let kitchen_status = optional_text(data, "kitchen_status");
        Ok(PosEvent {
            event_id: ctx.event_id.to_owned(),
            provider: ProviderKind::Mekari,
            source: ctx.source.to_owned(),
            account: ctx.account.map(str::to_owned),
            entity_type,
            entity_id: required_str(data, "data.id")?.to_owned(),
            event_type: event_type.to_owned(),
            occurred_at: at,
            version: Version::new(at, kitchen_rank(kitchen_status.as_deref())),
            received_at: ctx.received_at,
            origin: ctx.origin,
            outlet_id: optional_text(data, "outlet_id"),
            store_id: None,
            terminal_id: None,
            currency: optional_text(data, "currency"),
            subtotal: first_money(data, &["data.subtotal", "data.sub_total"])?,
            tax: first_money(data, &["data.tax", "data.tax_total"])?,
            total: first_money(data, &["data.total", "data.amount"])?,
            status: optional_text(data, "status"),
            kitchen_status,
            items: items(data)?,
            deleted: verb == "deleted",
            raw: ctx.raw.to_owned(),
        })
    }
}

fn kitchen_rank(status: Option<&str>) -> u32 {
    status
        .and_then(|s| {
            KITCHEN_PROGRESS
                .iter()
                .position(|known| known.eq_ignore_ascii_case(s))
        })
        .map_or(0, |i| u32::try_from(i + 1).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Origin;
    use serde_json::json;
    use time::macros::datetime;

    fn ctx() -> Context<'static> {
        Context {
            event_id: "01JD8Y6Q",
            source: "main",
            account: Some("acme"),
            received_at: datetime!(2026-11-29 10:15:31 UTC),
            raw: "{}",
            origin: Origin::Webhook,
        }
    }

    fn order(kitchen: &str) -> Value {
        json!({
          "id": "01JD8Y6Q", "event": "order.updated",
          "occurred_at": "2026-11-29T17:15:30.120+07:00", "outlet_id": "OUT-9",
          "data": {"id": "ORD-5512", "outlet_id": "OUT-9", "status": "paid",
                   "kitchen_status": kitchen, "total": 51000.5, "currency": "IDR",
                   "sold_at": "2026-11-29T17:14:02+07:00", "items": []}
        })
    }

    #[test]
    fn the_documented_order_normalizes_with_fractional_idr() {
        let event = Mekari.normalize(&order("preparing"), &ctx()).unwrap();
        assert_eq!(event.key().as_str(), "mekari:acme:ORD-5512");
        assert_eq!(event.total.unwrap().to_string(), "51000.5000");
        assert_eq!(event.outlet_id.as_deref(), Some("OUT-9"));
        assert_eq!(event.occurred_at, datetime!(2026-11-29 10:15:30.120 UTC));
        assert!(!event.deleted);
    }

    #[test]
    fn kitchen_progress_breaks_ties_at_one_instant() {
        let preparing = Mekari.normalize(&order("preparing"), &ctx()).unwrap();
        let ready = Mekari.normalize(&order("ready"), &ctx()).unwrap();
        let unknown = Mekari.normalize(&order("juggling"), &ctx()).unwrap();
        assert!(ready.version > preparing.version);
        assert!(unknown.version < preparing.version);
    }

    #[test]
    fn deleted_products_are_marked_for_a_tombstone() {
        let body = json!({"id": "e1", "event": "product.deleted",
                          "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "P-1"}});
        let event = Mekari.normalize(&body, &ctx()).unwrap();
        assert_eq!(event.entity_type, EntityType::Product);
        assert!(event.deleted);
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

    #[test]
    fn unknown_families_are_refused() {
        let body = json!({"id": "e1", "event": "shift.closed",
                          "occurred_at": "2026-11-29T17:15:30+07:00", "data": {"id": "S"}});
        assert_eq!(
            Mekari.normalize(&body, &ctx()).unwrap_err(),
            NormalizeError::UnknownEventType("shift.closed".into())
        );
    }
}
