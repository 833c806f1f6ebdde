//! The stale-event guard: an older state never overwrites a newer one.
//!
//! Compaction keeps the last *written* record per key, and providers deliver
//! out of order, so the only way the compacted view holds the newest state is
//! to not write older ones. The pipeline calls [`decide`] while holding the
//! entity's lock, with the ledger's record of what was last written.

use compact_str::CompactString;
use sha2::{Digest, Sha256};

use crate::domain::event::{Content, Decimal, LineItem, Origin, PosEvent, Version, micros};

/// The latest state written for an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntityState {
    /// Its version; anything older is stale.
    pub version: Version,
    /// A hash of its content, so an equal version with equal content is a
    /// no-op and a reconciled copy of the same state publishes nothing.
    pub state_hash: [u8; 16],
}

impl EntityState {
    /// The hash a state is kept with while it is *in doubt*: its record was
    /// handed to Kafka and no acknowledgement came (a timeout), so it may or
    /// may not be in the topic. Kept at its version, an older event is
    /// [`Decision::Stale`] (had it passed, it could land after the newer
    /// record and compaction would keep it); the delivery's own retry, at the
    /// same version with another hash, is [`Decision::Publish`]ed again
    /// (at most one more copy of what may have landed, never a loss). No
    /// state hashes to it (a SHA-256 prefix of 128 ones).
    pub const IN_DOUBT: [u8; 16] = [0xff; 16];

    /// This state, kept as in doubt.
    pub fn in_doubt(self) -> EntityState {
        EntityState {
            state_hash: EntityState::IN_DOUBT,
            ..self
        }
    }
}

/// What to do with an incoming state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Newer (or first, or same version with new content): write it.
    Publish,
    /// Older than what is written: keep it out of the topic.
    Stale,
    /// Same version and same content as written: nothing to do.
    Unchanged,
}

/// Compares an incoming state with the written one.
///
/// Versions keep the precision the provider sent (nanoseconds below the
/// stored microsecond order first within it; see [`crate::domain::event::Version`]),
/// so equal versions are one instant as the provider sent it, never two
/// instants truncated together.
///
/// A reconciled record is the provider's current state at fetch time, its
/// version the fetch time: it is published only when its content differs
/// from what the topic holds, so re-running a window publishes nothing, and
/// its later version keeps older webhook retries from rolling it back.
pub fn decide(written: Option<&EntityState>, incoming: &EntityState, origin: Origin) -> Decision {
    match written {
        None => Decision::Publish,
        Some(w) if origin == Origin::Reconciler && incoming.state_hash == w.state_hash => {
            Decision::Unchanged
        }
        Some(w) if incoming.version < w.version => Decision::Stale,
        Some(w) if incoming.version == w.version && incoming.state_hash == w.state_hash => {
            Decision::Unchanged
        }
        Some(_) => Decision::Publish,
    }
}

/// Decides an entity's state derived again from a record of the topic
/// (`posbridge rederive`): it takes that record's place only while the
/// ledger still holds the state that record wrote (`replaces`), or that
/// state's version in doubt (a run cut while this record's replacement was
/// on the wire: whether or not the replacement landed, nothing newer did);
/// anything else (a newer state arrived meanwhile, the state already
/// replaced) keeps it out. The caller derives again only what differs from
/// the record, so a state hash equal to the record's (a difference in fields
/// the hash leaves out, such as the event time) still publishes.
pub fn decide_replacing(written: Option<&EntityState>, replaces: &EntityState) -> Decision {
    match written {
        Some(w) if w == replaces || *w == replaces.in_doubt() => Decision::Publish,
        _ => Decision::Stale,
    }
}

/// A hash of an entity's state: the event's business fields and the
/// entity's whole business content as the provider sent it (canonical JSON
/// of its data), not ids, times of delivery or raw text, so the same state
/// reached by two different deliveries (a webhook and an API read) hashes
/// equal and a change in any business field (a product's name, a
/// collection's members) does not. Every field of [`PosEvent`] is named here
/// (no `..`): a new field must be placed in the hash or explicitly left out,
/// or this does not compile.
pub fn state_hash(event: &PosEvent, content: &Content) -> [u8; 16] {
    fn text(s: &Option<CompactString>) -> &[u8] {
        s.as_deref().unwrap_or("\u{0}").as_bytes()
    }
    fn decimal(m: Option<Decimal>) -> [u8; 17] {
        let mut out = [0u8; 17];
        if let Some(m) = m {
            out[0] = 1;
            out[1..].copy_from_slice(&m.unscaled.to_be_bytes());
        }
        out
    }
    let PosEvent {
        // Which delivery, when and how it arrived: not the entity's state.
        event_id: _,
        provider: _,
        source: _,
        event_type: _,
        occurred_at: _,
        version: _,
        received_at: _,
        origin: _,
        raw: _,
        topic_prefix: _,
        entity_type,
        entity_id,
        account,
        outlet_id,
        store_id,
        terminal_id,
        currency,
        subtotal,
        tax,
        total,
        status,
        kitchen_status,
        items,
        deleted,
        business_at,
        name,
        sku,
        price,
        active,
        product_ids,
        order_id,
        reason,
        payment_method,
        customer_id,
        items_given,
    } = event;
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(entity_type.as_str().as_bytes());
    field(entity_id.as_bytes());
    field(text(account));
    field(text(outlet_id));
    field(text(store_id));
    field(text(terminal_id));
    field(text(currency));
    field(&decimal(*subtotal));
    field(&decimal(*tax));
    field(&decimal(*total));
    field(text(status));
    field(text(kitchen_status));
    field(&[u8::from(*deleted)]);
    let given = items_given.as_deref().unwrap_or_default();
    field(&[u8::from(items_given.is_some())]);
    field(&(items.len() as u64).to_be_bytes());
    for LineItem {
        sku,
        name,
        quantity,
        unit_price,
    } in items.iter().chain(given)
    {
        field(text(sku));
        field(text(name));
        field(&decimal(*quantity));
        field(&decimal(*unit_price));
    }
    field(&business_at.map_or(i64::MIN, micros).to_be_bytes());
    field(text(name));
    field(text(sku));
    field(&decimal(*price));
    field(&[active.map_or(2, u8::from)]);
    field(&[u8::from(product_ids.is_some())]);
    for id in product_ids.iter().flatten() {
        field(id.as_bytes());
    }
    field(text(order_id));
    field(text(reason));
    field(text(payment_method));
    field(text(customer_id));
    field(content.as_str().as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Version;

    fn state(at: i64, rank: u32, hash: u8) -> EntityState {
        EntityState {
            version: Version {
                at_micros: at,
                rank,
            },
            state_hash: [hash; 16],
        }
    }

    #[test]
    fn older_is_stale_newer_publishes_equal_is_unchanged() {
        let written = state(100, 1, 1);
        let decide = |w: Option<&EntityState>, i: &EntityState| decide(w, i, Origin::Webhook);
        assert_eq!(decide(None, &written), Decision::Publish);
        assert_eq!(decide(Some(&written), &state(99, 9, 1)), Decision::Stale);
        assert_eq!(decide(Some(&written), &state(100, 0, 2)), Decision::Stale);
        assert_eq!(
            decide(Some(&written), &state(100, 1, 1)),
            Decision::Unchanged
        );
        assert_eq!(decide(Some(&written), &state(100, 1, 2)), Decision::Publish);
        assert_eq!(decide(Some(&written), &state(100, 2, 1)), Decision::Publish);
        assert_eq!(decide(Some(&written), &state(101, 0, 1)), Decision::Publish);
    }

    /// A state derived again replaces its record's state, or that state's
    /// version in doubt (a run cut while the replacement was on the wire);
    /// nothing else.
    #[test]
    fn a_derived_state_replaces_its_records_state_or_that_version_in_doubt() {
        let replaces = state(100, 0, 1);
        let decide = |w: Option<EntityState>| decide_replacing(w.as_ref(), &replaces);
        assert_eq!(decide(Some(replaces)), Decision::Publish);
        assert_eq!(decide(Some(replaces.in_doubt())), Decision::Publish);
        assert_eq!(decide(Some(state(100, 0, 2))), Decision::Stale);
        assert_eq!(decide(Some(state(101, 0, 1).in_doubt())), Decision::Stale);
        assert_eq!(decide(Some(state(99, 0, 1).in_doubt())), Decision::Stale);
        assert_eq!(decide(None), Decision::Stale);
    }

    /// Two sales sent with nanoseconds inside one microsecond: the older is
    /// stale whichever arrives second, and the newer publishes, because
    /// versions keep the precision the provider sent. A provider's own
    /// tie-breaker (Mekari's kitchen stage) orders only within one instant.
    #[test]
    fn times_inside_one_microsecond_compare_at_the_precision_sent() {
        use time::OffsetDateTime;
        use time::format_description::well_known::Rfc3339;
        let at = |text: &str, rank: u32, hash: u8| EntityState {
            version: Version::new(OffsetDateTime::parse(text, &Rfc3339).unwrap(), rank),
            state_hash: [hash; 16],
        };
        let newer = at("2026-11-29T10:15:30.0000009Z", 0, 1);
        let older = at("2026-11-29T10:15:30.0000001Z", 0, 2);
        let decide = |w: &EntityState, i: &EntityState| decide(Some(w), i, Origin::Webhook);
        assert_eq!(decide(&newer, &older), Decision::Stale);
        assert_eq!(decide(&older, &newer), Decision::Publish);
        let ready_earlier = at("2026-11-29T10:15:30.0000001Z", 6, 3);
        let preparing_later = at("2026-11-29T10:15:30.0000002Z", 5, 4);
        assert_eq!(decide(&preparing_later, &ready_earlier), Decision::Stale);
        let preparing = at("2026-11-29T10:15:30.0000001Z", 5, 5);
        assert_eq!(decide(&preparing, &ready_earlier), Decision::Publish);
        assert_eq!(
            decide(&newer, &at("2026-11-29T10:15:30.000001Z", 0, 6)),
            Decision::Publish,
            "the next microsecond is newer than any nanosecond before it"
        );
    }

    #[test]
    fn the_state_hash_follows_content_not_ids_or_times() {
        use time::macros::datetime;
        let event = PosEvent {
            outlet_id: Some("OUT-9".into()),
            currency: Some("IDR".into()),
            total: Decimal::parse("51000.5"),
            status: Some("paid".into()),
            kitchen_status: Some("ready".into()),
            ..PosEvent::sample()
        };
        let mut reconciled = event.clone();
        reconciled.event_id = "reconcile:1".into();
        reconciled.event_type = "order.reconciled".into();
        reconciled.origin = Origin::Reconciler;
        reconciled.received_at = datetime!(2026-11-29 11:00 UTC);
        reconciled.raw = "{\"id\":\"O-1\"}".into();
        reconciled.source = "backup".into();
        reconciled.occurred_at = datetime!(2026-11-29 10:30 UTC);
        reconciled.version = Version::new(datetime!(2026-11-29 11:00 UTC), 4);
        assert_eq!(
            state_hash(&event, &Content::default()),
            state_hash(&reconciled, &Content::default())
        );
        let mut changed = event.clone();
        changed.total = Decimal::parse("51000.6");
        assert_ne!(
            state_hash(&event, &Content::default()),
            state_hash(&changed, &Content::default())
        );
        let mut no_total = event.clone();
        no_total.total = None;
        assert_ne!(
            state_hash(&event, &Content::default()),
            state_hash(&no_total, &Content::default())
        );
    }

    /// The hash ledgers hold: a change here makes every reconciled entity
    /// look changed, and republish, once after an upgrade. Change it only on
    /// purpose (schema v2 did: the hash now covers the new fields and the
    /// entity's whole business content; v1 wrote 02c7c024c1684a201b0347a1b757be89).
    #[test]
    fn the_state_hash_is_pinned() {
        let content = Content::new("{\"id\":\"R-1\"}".into());
        assert_eq!(
            hex::encode(state_hash(&PosEvent::with_every_field(), &content)),
            "cff7de8eed1e973a19923def4f914e0d"
        );
    }

    #[test]
    fn every_business_field_changes_the_hash() {
        use crate::domain::event::EntityType;
        let base = PosEvent {
            items: vec![LineItem {
                sku: None,
                name: None,
                quantity: None,
                unit_price: None,
            }],
            ..PosEvent::sample()
        };
        type Change = (&'static str, fn(&mut PosEvent));
        let changes: [Change; 30] = [
            ("entity_type", |e| e.entity_type = EntityType::Sale),
            ("entity_id", |e| e.entity_id = "S-2".into()),
            ("account", |e| e.account = Some("x".into())),
            ("outlet_id", |e| e.outlet_id = Some("x".into())),
            ("store_id", |e| e.store_id = Some("x".into())),
            ("terminal_id", |e| e.terminal_id = Some("x".into())),
            ("currency", |e| e.currency = Some("x".into())),
            ("subtotal", |e| e.subtotal = Decimal::parse("1")),
            ("tax", |e| e.tax = Decimal::parse("1")),
            ("total", |e| e.total = Decimal::parse("1")),
            ("status", |e| e.status = Some("x".into())),
            ("kitchen_status", |e| e.kitchen_status = Some("x".into())),
            ("deleted", |e| e.deleted = true),
            ("items[].sku", |e| e.items[0].sku = Some("x".into())),
            ("items[].name", |e| e.items[0].name = Some("x".into())),
            ("items[].quantity", |e| {
                e.items[0].quantity = Decimal::parse("1");
            }),
            ("items[].unit_price", |e| {
                e.items[0].unit_price = Decimal::parse("1");
            }),
            ("business_at", |e| e.business_at = Some(e.occurred_at)),
            ("name", |e| e.name = Some("x".into())),
            ("sku", |e| e.sku = Some("x".into())),
            ("price", |e| e.price = Decimal::parse("1")),
            ("active", |e| e.active = Some(true)),
            ("product_ids", |e| e.product_ids = Some(Vec::new())),
            ("product_ids[]", |e| e.product_ids = Some(vec!["x".into()])),
            ("order_id", |e| e.order_id = Some("x".into())),
            ("reason", |e| e.reason = Some("x".into())),
            ("payment_method", |e| e.payment_method = Some("x".into())),
            ("customer_id", |e| e.customer_id = Some("x".into())),
            ("items_given", |e| e.items_given = Some(Vec::new())),
            ("items_given[]", |e| e.items_given = Some(e.items.clone())),
        ];
        for (name, change) in changes {
            let mut changed = base.clone();
            change(&mut changed);
            assert_ne!(
                state_hash(&base, &Content::default()),
                state_hash(&changed, &Content::default()),
                "{name}"
            );
        }
        let content = |text: &str| Content::new(text.into());
        assert_ne!(
            state_hash(&base, &content("{\"name\":\"Tea\"}")),
            state_hash(&base, &content("{\"name\":\"Coffee\"}")),
            "the business content"
        );
    }

    #[test]
    fn a_reconciled_copy_of_the_written_state_is_unchanged_whatever_its_version() {
        let written = state(100, 0, 1);
        let same = state(500, 0, 1);
        let changed = state(500, 0, 2);
        let older_changed = state(50, 0, 2);
        assert_eq!(
            decide(Some(&written), &same, Origin::Reconciler),
            Decision::Unchanged
        );
        assert_eq!(
            decide(Some(&written), &changed, Origin::Reconciler),
            Decision::Publish
        );
        assert_eq!(
            decide(Some(&written), &older_changed, Origin::Reconciler),
            Decision::Stale
        );
        assert_eq!(
            decide(Some(&written), &same, Origin::Webhook),
            Decision::Publish
        );
    }
}
