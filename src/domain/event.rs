//! The one event every provider is normalized into, and the small types that
//! name its parts.
//!
//! A [`PosEvent`] is what downstream consumers read from every topic, whoever
//! sent it and however it arrived (webhook or reconciler). Its Avro form lives
//! in `schemas/pos_event.avsc`; `encode` turns one into the other.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use compact_str::CompactString;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

mod decimal;

pub use decimal::Decimal;

/// The point-of-sale providers posbridge speaks to. One spelling per provider,
/// used in URLs, config keys, record keys and metric labels alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// ReceiptRoller: sales and orders, hex HMAC signatures, four attempts.
    ReceiptRoller,
    /// Mekari POS: orders, returns, refunds, exchanges, products, collections.
    Mekari,
}

impl ProviderKind {
    /// Every provider, for building routes and iterating configuration.
    pub const ALL: [ProviderKind; 2] = [ProviderKind::ReceiptRoller, ProviderKind::Mekari];

    /// The one spelling used in URLs, keys, config and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::ReceiptRoller => "receiptroller",
            ProviderKind::Mekari => "mekari",
        }
    }

    /// Parses the URL / config spelling; `None` for anything else.
    pub fn parse(name: &str) -> Option<ProviderKind> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of business entity posbridge keeps one compacted topic for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntityType {
    /// A completed sale (ReceiptRoller transaction).
    Sale,
    /// An order (both providers).
    Order,
    /// A refund (Mekari).
    Refund,
    /// A return (Mekari).
    Return,
    /// An exchange (Mekari).
    Exchange,
    /// A catalogue product (Mekari).
    Product,
    /// A product collection (Mekari).
    Collection,
}

impl EntityType {
    /// Every entity type, so topic creation and schema registration cover all.
    pub const ALL: [EntityType; 7] = [
        EntityType::Sale,
        EntityType::Order,
        EntityType::Refund,
        EntityType::Return,
        EntityType::Exchange,
        EntityType::Product,
        EntityType::Collection,
    ];

    /// Singular name: the Avro enum symbol (upper-cased) and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            EntityType::Sale => "sale",
            EntityType::Order => "order",
            EntityType::Refund => "refund",
            EntityType::Return => "return",
            EntityType::Exchange => "exchange",
            EntityType::Product => "product",
            EntityType::Collection => "collection",
        }
    }

    /// Plural name: the default topic suffix and the `kafka.topics` config key.
    pub fn plural(self) -> &'static str {
        match self {
            EntityType::Sale => "sales",
            EntityType::Order => "orders",
            EntityType::Refund => "refunds",
            EntityType::Return => "returns",
            EntityType::Exchange => "exchanges",
            EntityType::Product => "products",
            EntityType::Collection => "collections",
        }
    }

    /// Parses the singular name back (from the Avro enum symbol).
    pub fn parse(name: &str) -> Option<EntityType> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(name))
    }
}

/// How an event reached posbridge. Consumers use it to tell a pushed change
/// from a state read back during catch-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Pushed by the provider's webhook.
    Webhook,
    /// Read from the provider's API by the reconciler.
    Reconciler,
}

impl Origin {
    /// Lower-case name, used in headers and as the Avro symbol (upper-cased).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Webhook => "webhook",
            Origin::Reconciler => "reconciler",
        }
    }
}

/// Orders the states of one entity. An event with a smaller version must never
/// overwrite a larger one in the compacted topic.
///
/// `at` is the provider's own time for the state (ReceiptRoller `timestamp`,
/// Mekari `occurred_at`, the fetch time for reconciled records); `rank` breaks
/// ties within its microsecond: first by the nanoseconds below it, then where
/// the provider says to (Mekari's `kitchen_status` progression).
///
/// Times are compared at the precision the provider sent (RFC 3339 carries
/// up to nanoseconds), not at the microseconds `at_micros` keeps: otherwise
/// `…30.0000009Z` and `…30.0000001Z` would be one version, and whichever
/// arrived second would win. Treating equal microseconds as "not newer"
/// instead would only move the mistake to the other arrival order (the newer
/// held back as stale). The nanoseconds go into `rank`, above the provider's
/// own tie-breaker, so the stored form (the ledger's 12 bytes, the schema's
/// `version_at` and `version_rank`) stays as it was: every version stored
/// before had no sub-microsecond part and still compares as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Microseconds since the Unix epoch, UTC.
    pub at_micros: i64,
    /// Tie-breaker within one microsecond: the nanoseconds below it times
    /// [`Version::RANK_SPAN`], plus the provider's rank; 0 where neither.
    pub rank: u32,
}

impl Version {
    /// The provider ranks a version keeps apart (Mekari's kitchen
    /// progression has ten); a larger one counts as the largest.
    pub const RANK_SPAN: u32 = 1000;

    /// A version at a provider time, with the provider's tie-breaking rank.
    pub fn new(at: OffsetDateTime, rank: u32) -> Version {
        Version {
            at_micros: micros(at),
            rank: at.nanosecond() % 1000 * Self::RANK_SPAN + rank.min(Self::RANK_SPAN - 1),
        }
    }
}

/// Microseconds since the Unix epoch: how times are stored (Avro
/// `timestamp-micros`, versions, the spool). Saturates far outside any real date.
pub fn micros(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
}

/// The time `us` microseconds after the Unix epoch; `None` beyond what
/// `OffsetDateTime` holds (a corrupt stored value).
pub fn from_micros(us: i64) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000).ok()
}

/// The record key: `{provider}:{id}`, or `{provider}:{account}:{id}` when a
/// deployment serves several merchant accounts of one provider, where `{id}`
/// is the entity id with each `%` written `%25` and each `:` written `%3A`.
/// Compaction keeps the latest record per key, so this is an entity's
/// identity, and two entities must never share one: accounts hold no `:`
/// (config refuses one) and an escaped id holds none either, so the key's
/// colons say whether an account is in it and where it ends. Ids without
/// `%` or `:` (every documented id format) are written as sent.
/// docs/SCHEMA.md has the format and the migration of keys written before.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntityKey(String);

impl EntityKey {
    /// Builds the key; the entity type is not part of it because each entity
    /// type has its own topic.
    pub fn new(provider: ProviderKind, account: Option<&str>, entity_id: &str) -> EntityKey {
        // Pushed, not formatted: built for every event.
        let mut key = String::with_capacity(
            provider.as_str().len() + account.map_or(0, |a| a.len() + 1) + entity_id.len() + 1,
        );
        key.push_str(provider.as_str());
        key.push(':');
        if let Some(account) = account {
            key.push_str(account);
            key.push(':');
        }
        if entity_id.contains([':', '%']) {
            for c in entity_id.chars() {
                match c {
                    ':' => key.push_str("%3A"),
                    '%' => key.push_str("%25"),
                    c => key.push(c),
                }
            }
        } else {
            key.push_str(entity_id);
        }
        EntityKey(key)
    }

    /// The UTF-8 key as written to Kafka.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an owned string, without a copy.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for EntityKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A configured source: one webhook of a provider (and the API of the same
/// merchant account). Webhook deliveries and reconciled records both name the
/// source they came through; the account becomes part of record keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Source {
    /// Its provider.
    pub provider: ProviderKind,
    /// Configured name, the `{source}` in the URL.
    pub name: String,
    /// Merchant account, part of record keys when set.
    pub account: Option<String>,
    /// Its own topics' prefix; none for the shared topics.
    pub topic_prefix: Option<Arc<str>>,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.name)
    }
}

/// A provider's delivery id (`X-RR-Delivery`, `X-Mekari-Event-ID`), scoped by
/// provider: ids are unique per provider, and ReceiptRoller repeats one id
/// across all webhooks subscribed to an event, so sources are not part of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryKey(String);

impl DeliveryKey {
    /// Scopes a provider's delivery id to that provider.
    pub fn new(provider: ProviderKind, delivery_id: &str) -> DeliveryKey {
        DeliveryKey([provider.as_str(), ":", delivery_id].concat())
    }

    /// A key as stored (the spool keeps it beside its entry).
    pub fn from_stored(stored: String) -> DeliveryKey {
        DeliveryKey(stored)
    }

    /// The ledger's storage form.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeliveryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One line of a sale or order, where the provider sends lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineItem {
    /// The provider's product code, when sent.
    pub sku: Option<CompactString>,
    /// The product's display name, when sent.
    pub name: Option<CompactString>,
    /// Units sold; a decimal because weighed goods sell fractions.
    pub quantity: Option<Decimal>,
    /// Price of one unit, when sent.
    pub unit_price: Option<Decimal>,
}

/// One normalized event: the value of every record on every entity topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PosEvent {
    /// The provider's delivery id for webhooks; a derived id for reconciled records.
    pub event_id: CompactString,
    /// Who sent it.
    pub provider: ProviderKind,
    /// The configured webhook (or reconciler source) it came through.
    pub source: CompactString,
    /// The merchant account the source serves, when a deployment has several.
    pub account: Option<CompactString>,
    /// Which compacted topic it belongs to.
    pub entity_type: EntityType,
    /// The provider's business id of the entity.
    pub entity_id: CompactString,
    /// The event name exactly as the provider sent it (`sale.created`, …).
    pub event_type: CompactString,
    /// When the provider says the change happened; the Kafka record timestamp.
    pub occurred_at: OffsetDateTime,
    /// The ordering version the stale-event guard compared.
    pub version: Version,
    /// When posbridge received it.
    pub received_at: OffsetDateTime,
    /// Webhook or reconciler.
    pub origin: Origin,
    /// Mekari outlet, when known.
    pub outlet_id: Option<CompactString>,
    /// ReceiptRoller store, when known.
    pub store_id: Option<CompactString>,
    /// ReceiptRoller terminal, when known.
    pub terminal_id: Option<CompactString>,
    /// ISO 4217 code of every amount in the event.
    pub currency: Option<CompactString>,
    /// Amount before tax.
    pub subtotal: Option<Decimal>,
    /// Tax amount.
    pub tax: Option<Decimal>,
    /// Amount the customer paid (grand total).
    pub total: Option<Decimal>,
    /// The entity's status as the provider names it (`paid`, `cancelled`, …).
    pub status: Option<CompactString>,
    /// Mekari kitchen progress, for orders.
    pub kitchen_status: Option<CompactString>,
    /// Lines, where the provider sends them.
    pub items: Vec<LineItem>,
    /// True for delete events; such events are written as tombstones.
    pub deleted: bool,
    /// When it happened in the shop (sale, sold, created), where the provider says.
    pub business_at: Option<OffsetDateTime>,
    /// Products and collections: the display name.
    pub name: Option<CompactString>,
    /// Products: the stock-keeping unit.
    pub sku: Option<CompactString>,
    /// Products: the unit price.
    pub price: Option<Decimal>,
    /// Products and collections: whether it is on sale / in use.
    pub active: Option<bool>,
    /// Collections: the member products' ids.
    pub product_ids: Option<Vec<String>>,
    /// Returns, refunds and exchanges: the order they belong to.
    pub order_id: Option<CompactString>,
    /// Returns, refunds and exchanges: why.
    pub reason: Option<CompactString>,
    /// How it was paid (or, for refunds, paid back).
    pub payment_method: Option<CompactString>,
    /// The provider's customer reference.
    pub customer_id: Option<CompactString>,
    /// Exchanges: the lines given to the customer.
    pub items_given: Option<Vec<LineItem>>,
    /// The provider's JSON for this entity, untouched, for fields the schema
    /// lacks: UTF-8, as the Avro string it becomes. A webhook's shares the
    /// request's bytes (a body that parsed is UTF-8 as a whole).
    pub raw: Bytes,
    /// Where its records go: its source's own topics (that prefix), or the
    /// shared ones. Not part of the record.
    pub topic_prefix: Option<Arc<str>>,
}

/// The entity's business content as the provider sent it: its data in a
/// canonical form (keys sorted, numbers and times in one spelling), without
/// what does not describe the entity (the envelope, delivery ids, send
/// times). Two deliveries of the same state have the same content, whether
/// pushed or read from an API; the stale-event guard hashes it with the
/// event's fields, so a change anywhere in the entity (a product's name, a
/// collection's members) is a change.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Content(String);

impl Content {
    /// Content already in canonical form (built by the providers' JSON reader).
    pub fn new(canonical: String) -> Content {
        Content(canonical)
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What a normalizer makes of one webhook body or API record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The event, as written to the topic.
    pub event: PosEvent,
    /// The entity's business content, for the guard.
    pub content: Content,
}

impl PosEvent {
    /// The record key on the entity topic.
    pub fn key(&self) -> EntityKey {
        EntityKey::new(self.provider, self.account.as_deref(), &self.entity_id)
    }
}

#[cfg(test)]
impl PosEvent {
    /// A Mekari order with only its ids and times set: the event tests
    /// start from, changing what they are about.
    pub(crate) fn sample() -> PosEvent {
        let at = time::macros::datetime!(2026-11-29 10:00 UTC);
        PosEvent {
            event_id: "d1".into(),
            provider: ProviderKind::Mekari,
            source: "main".into(),
            account: None,
            entity_type: EntityType::Order,
            entity_id: "O-1".into(),
            event_type: "order.updated".into(),
            occurred_at: at,
            version: Version::new(at, 0),
            received_at: time::macros::datetime!(2026-11-29 10:00:01 UTC),
            origin: Origin::Webhook,
            outlet_id: None,
            store_id: None,
            terminal_id: None,
            currency: None,
            subtotal: None,
            tax: None,
            total: None,
            status: None,
            kitchen_status: None,
            items: Vec::new(),
            deleted: false,
            business_at: None,
            name: None,
            sku: None,
            price: None,
            active: None,
            product_ids: None,
            order_id: None,
            reason: None,
            payment_method: None,
            customer_id: None,
            items_given: None,
            raw: "{}".into(),
            topic_prefix: None,
        }
    }
}

#[cfg(test)]
impl PosEvent {
    /// An event with every kind of field set, negative and large decimals
    /// included: the one whose bytes and state hash tests pin.
    pub(crate) fn with_every_field() -> PosEvent {
        use time::macros::datetime;
        PosEvent {
            entity_type: EntityType::Return,
            entity_id: "R-1".into(),
            event_type: "return.created".into(),
            occurred_at: datetime!(2026-11-29 10:15:30.123456 UTC),
            version: Version::new(datetime!(2026-11-29 10:15:30.123456 UTC), 3),
            received_at: datetime!(2026-11-29 10:15:31 UTC),
            outlet_id: Some("OUT-9".into()),
            currency: Some("IDR".into()),
            subtotal: Decimal::parse("-0.0001"),
            tax: Decimal::parse("128"),
            total: Decimal::parse("-51000.5"),
            status: Some("done".into()),
            items: vec![LineItem {
                sku: Some("A".into()),
                name: None,
                quantity: Decimal::parse("1.5"),
                unit_price: Decimal::parse("99999999999999.9999"),
            }],
            raw: "{\"id\":\"d1\"}".into(),
            ..PosEvent::sample()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_by_time_then_rank() {
        let early = Version {
            at_micros: 1,
            rank: 9,
        };
        let late = Version {
            at_micros: 2,
            rank: 0,
        };
        assert!(early < late);
        assert!(
            Version {
                at_micros: 2,
                rank: 1
            } > late
        );
    }
}
