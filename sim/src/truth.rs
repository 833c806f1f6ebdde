//! The truth: every entity's current state, as the providers themselves hold it.
//!
//! Webhooks are sent from it and the list APIs answer from it, so whatever a
//! delivery lost (dropped, sent while a webhook was off) the APIs still show.
//! [`Truth::apply`] makes one planned event happen: it changes the entity,
//! stamps the times and builds the webhook body. [`Truth::report`] is what a
//! test compares with the compacted topics: keys and totals are formatted the
//! way posbridge writes them.

use bytes::Bytes;
use posbridge::domain::event::{Decimal, EntityKey, EntityType, ProviderKind};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;

use crate::clock;
use crate::plan::{EntitySpec, Step, reconcilable};

/// ReceiptRoller's webhook, as named in every body it sends.
pub const RECEIPTROLLER_WEBHOOK_ID: &str = "wh_sim";

/// One entity's current state.
#[derive(Debug, Clone)]
pub struct Entity {
    /// Who owns it.
    pub provider: ProviderKind,
    /// Which topic its records go to.
    pub entity_type: EntityType,
    /// The business id: sale `data.id`, order `data.order_id`, Mekari `data.id`.
    pub id: String,
    /// The provider's current data object, as the API and the webhooks show it.
    pub data: Map<String, Value>,
    /// Deleted (Mekari `product.deleted`): gone from the lists, a tombstone in Kafka.
    pub deleted: bool,
    /// Mekari outlet, for the outlet-scoped lists.
    pub outlet_id: Option<String>,
    /// Business time the lists filter on: `transaction_at` or `sold_at`.
    pub business_at: OffsetDateTime,
    /// Time of the latest event; lists sort on it ("newest first").
    pub updated_at: OffsetDateTime,
    /// How many events it has had.
    pub events: u32,
    /// Name of its latest event.
    pub last_event_type: &'static str,
}

impl Entity {
    /// The record key posbridge writes for it (no merchant account).
    pub fn key(&self) -> EntityKey {
        EntityKey::new(self.provider, None, &self.id)
    }

    /// The amount posbridge keeps as `total`, formatted as posbridge's `Decimal`.
    pub fn total(&self) -> Option<String> {
        let field = match self.provider {
            ProviderKind::ReceiptRoller => "grand_total",
            ProviderKind::Mekari => "total",
        };
        let number = self.data.get(field)?.as_number()?;
        Decimal::parse(&number.to_string()).map(|m| m.to_string())
    }

    fn text(&self, field: &str) -> Option<&str> {
        self.data.get(field).and_then(Value::as_str)
    }

    /// Whether the APIs show this entity's current state (see
    /// [`reconcilable`]): a test compares only these after a reconcile.
    pub fn reconcilable(&self) -> bool {
        reconcilable(self.provider, self.entity_type, self.deleted)
    }

    /// The entity as `GET /sim/truth` lists it.
    pub fn report(&self) -> Value {
        let updated_at = match self.provider {
            ProviderKind::ReceiptRoller => clock::receiptroller_timestamp(self.updated_at),
            ProviderKind::Mekari => clock::mekari_timestamp(self.updated_at),
        };
        json!({
            "provider": self.provider.as_str(),
            "entity_type": self.entity_type.as_str(),
            "entity_id": self.id,
            "key": self.key().as_str(),
            "deleted": self.deleted,
            "status": self.text("status"),
            "kitchen_status": self.text("kitchen_status"),
            "name": self.text("name"),
            "total": self.total(),
            "reconcilable": self.reconcilable(),
            "events": self.events,
            "last_event_type": self.last_event_type,
            "updated_at": updated_at,
            "data": self.data,
        })
    }
}

/// An event that just happened: what the provider will try to deliver.
#[derive(Debug, Clone)]
pub struct Happened {
    /// Who sends it.
    pub provider: ProviderKind,
    /// `X-RR-Delivery` / `X-Mekari-Event-ID`, equal to the body's `id`.
    pub delivery_id: String,
    /// The event name.
    pub event_type: &'static str,
    /// The entity's record key.
    pub key: String,
    /// When it happened (the body's `timestamp` / `occurred_at`).
    pub at: OffsetDateTime,
    /// The exact bytes to sign and send.
    pub body: Bytes,
}

/// Every entity of the run, indexed like [`crate::plan::Plan::entities`].
#[derive(Debug)]
pub struct Truth {
    /// What the plan knows about each entity.
    specs: Vec<EntitySpec>,
    /// Each entity's state once its first event has happened.
    entities: Vec<Option<Entity>>,
}

impl Truth {
    /// An empty truth for the plan's entities; they appear as their events happen.
    pub fn new(specs: Vec<EntitySpec>) -> Truth {
        let entities = vec![None; specs.len()];
        Truth { specs, entities }
    }

    /// Entities that exist so far.
    pub fn entities(&self) -> impl Iterator<Item = &Entity> {
        self.entities.iter().flatten()
    }

    /// Makes `step` happen at `at`: updates the entity and builds the body.
    pub fn apply(&mut self, step: &Step, at: OffsetDateTime) -> Happened {
        let spec = &self.specs[step.entity];
        let entity = self.entities[step.entity].get_or_insert_with(|| create(spec, step, at));
        entity.data.extend(step.patch.clone());
        entity.deleted |= step.deletes;
        entity.updated_at = at;
        entity.events += 1;
        entity.last_event_type = step.event_type;
        let (delivery_id, body) = match entity.provider {
            ProviderKind::ReceiptRoller => {
                entity.data.insert(
                    "updated_at".into(),
                    clock::receiptroller_timestamp(at).into(),
                );
                let id = format!(
                    "rr_dlv_{}",
                    clock::ulid(at, step.id_random).to_ascii_lowercase()
                );
                let body = json!({
                    "id": id, "type": step.event_type,
                    "timestamp": clock::receiptroller_timestamp(at),
                    "webhook_id": RECEIPTROLLER_WEBHOOK_ID, "data": entity.data,
                });
                (id, body)
            }
            ProviderKind::Mekari => {
                entity
                    .data
                    .insert("updated_at".into(), clock::mekari_timestamp(at).into());
                let id = clock::ulid(at, step.id_random);
                let body = json!({
                    "id": id, "event": step.event_type,
                    "occurred_at": clock::mekari_timestamp(at),
                    "outlet_id": entity.outlet_id, "data": entity.data,
                });
                (id, body)
            }
        };
        Happened {
            provider: entity.provider,
            delivery_id,
            event_type: step.event_type,
            key: entity.key().as_str().to_owned(),
            at,
            // Serializing a JSON value cannot fail.
            body: Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
        }
    }

    /// `GET /sim/truth`: every entity, sorted by key.
    pub fn report(&self) -> Value {
        let mut entities: Vec<&Entity> = self.entities().collect();
        entities.sort_by_key(|e| e.key());
        json!({"entities": entities.iter().map(|e| e.report()).collect::<Vec<_>>()})
    }
}

/// The entity at its first event: business id and business time, which
/// depend on when it happens.
fn create(spec: &EntitySpec, step: &Step, at: OffsetDateTime) -> Entity {
    let mut data = Map::new();
    // The sale's or order's business time: a moment before the provider
    // reports it, in whole seconds; an offline sale much earlier.
    let business_at = clock::whole_seconds(at - time::Duration::seconds(1) - spec.offline);
    let text = |field: &str| step.patch.get(field).and_then(Value::as_str).unwrap_or("");
    let id = match (spec.provider, spec.entity_type) {
        (ProviderKind::ReceiptRoller, EntityType::Sale) => {
            let id = format!(
                "{}|{}|{}",
                text("terminal_id"),
                clock::receiptroller_month(business_at),
                text("transaction_id")
            );
            data.insert("id".into(), id.clone().into());
            data.insert(
                "transaction_at".into(),
                clock::receiptroller_seconds(business_at).into(),
            );
            id
        }
        (ProviderKind::ReceiptRoller, _) => {
            data.insert(
                "created_at".into(),
                clock::receiptroller_seconds(business_at).into(),
            );
            text("order_id").to_owned()
        }
        (ProviderKind::Mekari, EntityType::Order) => {
            data.insert("sold_at".into(), clock::mekari_seconds(business_at).into());
            text("id").to_owned()
        }
        (ProviderKind::Mekari, _) => {
            data.insert("created_at".into(), clock::mekari_timestamp(at).into());
            text("id").to_owned()
        }
    };
    Entity {
        provider: spec.provider,
        entity_type: spec.entity_type,
        id,
        data,
        deleted: false,
        outlet_id: spec.outlet_id.clone(),
        business_at,
        updated_at: at,
        events: 0,
        last_event_type: step.event_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{self, PlanConfig};
    use posbridge::adapters::providers::{Context, Json, for_kind};
    use posbridge::domain::event::Origin;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use time::macros::datetime;

    fn config() -> PlanConfig {
        PlanConfig {
            events: 600,
            outlets: vec!["OUT-1".into(), "OUT-2".into()],
            duplicates: 0.0,
            duplicates_at_once: false,
            reorder: 0.0,
            drop: 0.0,
            offline: 0.1,
            run_id: "TEST".into(),
        }
    }

    /// posbridge's own normalizer reads every body the simulator sends the
    /// way the truth describes the entity after that event: same key, total,
    /// status, kitchen status and delete flag.
    #[test]
    fn posbridge_reads_every_body_as_the_truth_describes_it() {
        let plan = plan::generate(&config(), &mut StdRng::seed_from_u64(1));
        let mut truth = Truth::new(plan.entities.clone());
        let mut at = datetime!(2026-11-30 23:59:50 UTC);
        for step in &plan.steps {
            at += time::Duration::milliseconds(37);
            let happened = truth.apply(step, at);
            let body: Value = serde_json::from_slice(&happened.body).unwrap();
            let source = posbridge::domain::event::Source {
                provider: happened.provider,
                name: "main".into(),
                account: None,
                topic_prefix: None,
            };
            let ctx = Context {
                event_id: &happened.delivery_id,
                source: &source,
                received_at: at,
                raw: &Bytes::from_static(b"{}"),
                origin: Origin::Webhook,
                max_event_ahead: posbridge::config::ServerConfig::default().max_event_ahead(),
            };
            let provider = for_kind(happened.provider);
            let pushed = provider
                .normalize(&Json::from(&body), &ctx)
                .unwrap_or_else(|e| panic!("{}: {e}", happened.event_type));
            let event = &pushed.event;
            let entity = truth.entities[step.entity].as_ref().unwrap();
            assert_eq!(event.occurred_at, at);
            // What the reconciler reads from the API: the entity's data alone.
            let reconciled = provider
                .normalize_record(
                    entity.entity_type,
                    &Json::from(&Value::Object(entity.data.clone())),
                    &Context {
                        origin: Origin::Reconciler,
                        ..ctx.clone()
                    },
                )
                .unwrap_or_else(|e| panic!("{} record: {e}", happened.event_type));
            if !entity.deleted {
                // The same state read back from the API is the same state.
                assert_eq!(
                    posbridge::domain::guard::state_hash(&pushed.event, &pushed.content),
                    posbridge::domain::guard::state_hash(&reconciled.event, &reconciled.content),
                    "{} pushed and fetched",
                    happened.event_type
                );
            }
            for event in [event, &reconciled.event] {
                assert_eq!(event.key().as_str(), happened.key);
                assert_eq!(happened.key, entity.key().as_str());
                assert_eq!(event.entity_type, entity.entity_type);
                assert_eq!(event.total.map(|m| m.to_string()), entity.total());
                assert_eq!(event.status.as_deref(), entity.text("status"));
                assert_eq!(
                    event.kitchen_status.as_deref(),
                    entity.text("kitchen_status")
                );
            }
            assert_eq!(event.deleted, entity.deleted);
            assert_eq!(body["id"], happened.delivery_id.as_str());
        }
    }

    #[test]
    fn sales_are_keyed_by_terminal_month_and_transaction() {
        let plan = plan::generate(&config(), &mut StdRng::seed_from_u64(2));
        let mut truth = Truth::new(plan.entities.clone());
        let step = plan
            .steps
            .iter()
            .find(|s| s.event_type == "sale.created")
            .unwrap();
        let happened = truth.apply(step, datetime!(2026-12-01 00:00:00.5 UTC));
        let entity = truth.entities().next().unwrap();
        // One second before the event, whole seconds: still November.
        assert_eq!(entity.data["transaction_at"], "2026-11-30T23:59:59Z");
        assert!(entity.id.contains("|2026-11|TEST"), "{}", entity.id);
        assert_eq!(happened.key, format!("receiptroller:{}", entity.id));
        assert!(happened.delivery_id.starts_with("rr_dlv_"));
    }

    #[test]
    fn totals_use_posbridge_money_formatting() {
        let plan = plan::generate(&config(), &mut StdRng::seed_from_u64(3));
        let mut truth = Truth::new(plan.entities.clone());
        let at = datetime!(2026-11-29 10:00 UTC);
        for step in &plan.steps {
            truth.apply(step, at);
        }
        let report = truth.report();
        let entities = report["entities"].as_array().unwrap();
        assert!(entities.iter().any(|e| {
            e["total"]
                .as_str()
                .is_some_and(|t| t.ends_with(".5000") || t.ends_with(".2500"))
        }));
        for e in entities {
            if let Some(total) = e["total"].as_str() {
                assert_eq!(total.split('.').nth(1).unwrap().len(), 4, "{total}");
            }
            assert!(
                e["key"]
                    .as_str()
                    .unwrap()
                    .starts_with(e["provider"].as_str().unwrap())
            );
        }
    }
}
