//! The script of one run, drawn up front from the seed.
//!
//! A [`Plan`] lists every entity the run will touch and every event, in the
//! order they will happen, with the faults each delivery gets. Everything
//! random is decided here, so one seed gives one script; only the times (the
//! real wall clock when an event happens) differ between runs with one seed.
//! Each event carries a patch of the entity's data; the `truth` module
//! applies it and stamps the times when the event happens.

use std::collections::VecDeque;
use std::time::Duration;

use posbridge::domain::event::{EntityType, ProviderKind};
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde_json::{Map, Value, json};

/// What a run is made of: `--events`, the outlets and the fault rates.
#[derive(Debug, Clone)]
pub struct PlanConfig {
    /// How many events happen in the run.
    pub events: usize,
    /// Mekari outlets orders, returns, refunds and exchanges belong to.
    pub outlets: Vec<String>,
    /// Probability that a delivery is sent twice.
    pub duplicates: f64,
    /// The second copy goes out at the same moment as the first attempt
    /// (behind a load balancer: to another replica while the first is in
    /// flight), not 100–800 ms later.
    pub duplicates_at_once: bool,
    /// Probability that a delivery is held back until after a later one.
    pub reorder: f64,
    /// Probability that an event is never sent (only events the APIs can show).
    pub drop: f64,
    /// Probability that a Mekari order was sold offline (earlier `sold_at`).
    pub offline: f64,
    /// Goes into every business id, so runs against one posbridge never collide.
    pub run_id: String,
}

/// One entity the run touches, as far as it is known before it happens.
#[derive(Debug, Clone)]
pub struct EntitySpec {
    /// Who owns it.
    pub provider: ProviderKind,
    /// Which topic its records go to.
    pub entity_type: EntityType,
    /// Mekari outlet, for the outlet-scoped lists.
    pub outlet_id: Option<String>,
    /// A Mekari order sold offline: `sold_at` is this much before its first event.
    pub offline: Duration,
}

/// Faults one delivery gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Never sent; the reconciler must find the change through the API.
    pub drop: bool,
    /// Sent a second time this long after the first attempt.
    pub duplicate_after: Option<Duration>,
    /// Held back until after a later delivery (the entity's next, if soon).
    pub reorder: bool,
}

/// One event: a change to one entity.
#[derive(Debug, Clone)]
pub struct Step {
    /// Index into [`Plan::entities`].
    pub entity: usize,
    /// The provider's event name, e.g. `order.kitchen_status_changed`.
    pub event_type: &'static str,
    /// Fields of the entity's data this event sets (all of them on creation).
    pub patch: Map<String, Value>,
    /// A delete event (`product.deleted`).
    pub deletes: bool,
    /// What goes wrong with its delivery.
    pub faults: Faults,
    /// Index of the same entity's next event, if it has one.
    pub next_of_entity: Option<usize>,
    /// Random bits for the delivery id (its time part is the event time).
    pub id_random: u128,
}

/// The whole script.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Every entity, referred to by index.
    pub entities: Vec<EntitySpec>,
    /// Every event, in the order they happen.
    pub steps: Vec<Step>,
}

/// Whether the providers' APIs show the effect of this event, so a dropped
/// delivery can be caught up: ReceiptRoller has no orders API, and Mekari's
/// product list omits deleted products.
pub fn reconcilable(provider: ProviderKind, entity_type: EntityType, deletes: bool) -> bool {
    match provider {
        ProviderKind::ReceiptRoller => entity_type == EntityType::Sale,
        ProviderKind::Mekari => !deletes,
    }
}

/// ReceiptRoller's menu: sku, name, yen.
const YEN_MENU: [(&str, &str, i64); 6] = [
    ("A-1", "Coffee", 500),
    ("A-2", "Green tea", 450),
    ("B-1", "Sandwich", 680),
    ("B-2", "Onigiri", 180),
    ("C-1", "Cheesecake", 520),
    ("C-2", "Melon pan", 240),
];

/// Mekari's menu: product id, name, rupiah in quarters (exact fractions).
const RUPIAH_MENU: [(&str, &str, i64); 6] = [
    ("P-101", "Nasi goreng", 35_000 * 4),
    ("P-102", "Es teh manis", 8_000 * 4 + 2),
    ("P-103", "Sate ayam", 42_500 * 4 + 1),
    ("P-104", "Kopi susu", 18_000 * 4 + 3),
    ("P-105", "Mie ayam", 27_500 * 4),
    ("P-106", "Pisang goreng", 12_000 * 4 + 2),
];

/// A rupiah amount held in quarters, as JSON: an integer when whole,
/// otherwise an exact binary fraction such as `51000.5`.
pub fn rupiah(quarters: i64) -> Value {
    if quarters % 4 == 0 {
        json!(quarters / 4)
    } else {
        // Quarters are exact in binary floating point, so this prints exactly.
        json!(quarters as f64 / 4.0)
    }
}

/// The kinds of entity a run creates, with their share of new entities.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Sale,
    RrOrder,
    MekariOrder,
    Return,
    Refund,
    Exchange,
    Product,
    Collection,
}

const KIND_WEIGHTS: [(Kind, u32); 8] = [
    (Kind::Sale, 30),
    (Kind::RrOrder, 12),
    (Kind::MekariOrder, 28),
    (Kind::Return, 4),
    (Kind::Refund, 4),
    (Kind::Exchange, 3),
    (Kind::Product, 12),
    (Kind::Collection, 7),
];

/// The life of a return, refund or exchange.
struct AfterSaleLife {
    entity_type: EntityType,
    /// Id prefix.
    prefix: &'static str,
    /// Status when created.
    first: &'static str,
    /// Statuses it moves through afterwards.
    later: &'static [&'static str],
    /// Event names.
    created: &'static str,
    updated: &'static str,
}

const RETURN_LIFE: AfterSaleLife = AfterSaleLife {
    entity_type: EntityType::Return,
    prefix: "RET",
    first: "requested",
    later: &["approved", "completed"],
    created: "return.created",
    updated: "return.updated",
};

const REFUND_LIFE: AfterSaleLife = AfterSaleLife {
    entity_type: EntityType::Refund,
    prefix: "RFD",
    first: "pending",
    later: &["completed"],
    created: "refund.created",
    updated: "refund.updated",
};

const EXCHANGE_LIFE: AfterSaleLife = AfterSaleLife {
    entity_type: EntityType::Exchange,
    prefix: "EXC",
    first: "requested",
    later: &["completed"],
    created: "exchange.created",
    updated: "exchange.updated",
};

/// A step before its faults are drawn.
struct Change {
    event_type: &'static str,
    patch: Map<String, Value>,
    deletes: bool,
}

fn change(event_type: &'static str, patch: Value) -> Change {
    Change {
        event_type,
        patch: match patch {
            Value::Object(map) => map,
            _ => Map::new(),
        },
        deletes: false,
    }
}

/// Draws the script for `config` from `rng`.
pub fn generate(config: &PlanConfig, rng: &mut StdRng) -> Plan {
    let mut g = Generator {
        config,
        rng,
        entities: Vec::new(),
        mekari_orders: Vec::new(),
        products: Vec::new(),
        counters: [0; 8],
    };
    let mut steps: Vec<Step> = Vec::with_capacity(config.events);
    // Entities with events still to come, each with its remaining changes.
    let mut open: Vec<(usize, VecDeque<Change>)> = Vec::new();
    let mut last_step_of: Vec<Option<usize>> = Vec::new();
    while steps.len() < config.events {
        let (entity, next) = if !open.is_empty() && g.rng.random_bool(0.55) {
            let slot = g.rng.random_range(0..open.len());
            let entity = open[slot].0;
            let next = open[slot].1.pop_front();
            if open[slot].1.is_empty() {
                open.swap_remove(slot);
            }
            (entity, next)
        } else {
            let (entity, mut changes) = g.new_entity();
            let next = changes.pop_front();
            if !changes.is_empty() {
                open.push((entity, changes));
            }
            (entity, next)
        };
        // Every lifecycle has at least one change, and emptied ones are removed.
        let Some(next) = next else { continue };
        last_step_of.resize(g.entities.len(), None);
        let index = steps.len();
        if let Some(previous) = last_step_of[entity] {
            steps[previous].next_of_entity = Some(index);
        }
        last_step_of[entity] = Some(index);
        let spec = &g.entities[entity];
        let faults = g.faults(reconcilable(spec.provider, spec.entity_type, next.deletes));
        steps.push(Step {
            entity,
            event_type: next.event_type,
            patch: next.patch,
            deletes: next.deletes,
            faults,
            next_of_entity: None,
            id_random: g.rng.random(),
        });
    }
    Plan {
        entities: g.entities,
        steps,
    }
}

struct Generator<'a> {
    config: &'a PlanConfig,
    rng: &'a mut StdRng,
    entities: Vec<EntitySpec>,
    /// Mekari orders created so far: (id, outlet), for returns and the like.
    mekari_orders: Vec<(String, String)>,
    /// Mekari products created so far, for collections.
    products: Vec<String>,
    /// Per-kind sequence numbers for ids.
    counters: [u32; 8],
}

impl Generator<'_> {
    fn faults(&mut self, can_drop: bool) -> Faults {
        let drop = self.rng.random_bool(self.config.drop);
        let duplicate = self.rng.random_bool(self.config.duplicates);
        // Drawn either way, so a seed plans the same events with or
        // without `duplicates_at_once`.
        let delay = Duration::from_millis(self.rng.random_range(100..800));
        let delay = if self.config.duplicates_at_once {
            Duration::ZERO
        } else {
            delay
        };
        let reorder = self.rng.random_bool(self.config.reorder);
        if drop && can_drop {
            return Faults {
                drop: true,
                ..Faults::default()
            };
        }
        Faults {
            drop: false,
            duplicate_after: duplicate.then_some(delay),
            reorder,
        }
    }

    fn next_id(&mut self, kind: Kind) -> u32 {
        let counter = &mut self.counters[kind as usize];
        *counter += 1;
        *counter
    }

    fn push(&mut self, spec: EntitySpec) -> usize {
        self.entities.push(spec);
        self.entities.len() - 1
    }

    fn new_entity(&mut self) -> (usize, VecDeque<Change>) {
        let total: u32 = KIND_WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut pick = self.rng.random_range(0..total);
        let mut kind = Kind::Sale;
        for (k, weight) in KIND_WEIGHTS {
            if pick < weight {
                kind = k;
                break;
            }
            pick -= weight;
        }
        let needs_order = matches!(kind, Kind::Return | Kind::Refund | Kind::Exchange);
        if needs_order && self.mekari_orders.is_empty() {
            kind = Kind::MekariOrder;
        }
        match kind {
            Kind::Sale => self.sale(),
            Kind::RrOrder => self.rr_order(),
            Kind::MekariOrder => self.mekari_order(),
            Kind::Return | Kind::Refund | Kind::Exchange => self.after_sale(kind),
            Kind::Product => self.product(),
            Kind::Collection => self.collection(),
        }
    }

    /// Yen lines and totals (10 % consumption tax, rounded down).
    fn yen_lines(&mut self) -> Value {
        let count = self.rng.random_range(1..=3);
        let mut items = Vec::new();
        let mut sub_total = 0;
        for (sku, name, price) in YEN_MENU.sample(self.rng, count) {
            let quantity = self.rng.random_range(1..=3);
            sub_total += price * quantity;
            items
                .push(json!({"sku": sku, "name": name, "quantity": quantity, "unit_price": price}));
        }
        let tax_total = sub_total / 10;
        json!({"currency": "JPY", "sub_total": sub_total, "tax_total": tax_total,
               "grand_total": sub_total + tax_total, "items": items})
    }

    /// Rupiah lines and totals (11 % VAT, in whole quarters).
    fn rupiah_lines(&mut self) -> (Value, i64) {
        let count = self.rng.random_range(1..=3);
        let mut items = Vec::new();
        let mut subtotal = 0;
        for (id, name, price) in RUPIAH_MENU.sample(self.rng, count) {
            let qty = self.rng.random_range(1..=4);
            subtotal += price * qty;
            items
                .push(json!({"product_id": id, "name": name, "qty": qty, "price": rupiah(*price)}));
        }
        let tax = subtotal * 11 / 100;
        let total = subtotal + tax;
        (
            json!({"currency": "IDR", "subtotal": rupiah(subtotal), "tax": rupiah(tax),
                   "total": rupiah(total), "items": items}),
            total,
        )
    }

    fn sale(&mut self) -> (usize, VecDeque<Change>) {
        let n = self.next_id(Kind::Sale);
        let entity = self.push(EntitySpec {
            provider: ProviderKind::ReceiptRoller,
            entity_type: EntityType::Sale,
            outlet_id: None,
            offline: Duration::ZERO,
        });
        let terminal = format!("T00{}", self.rng.random_range(1..=3));
        let mut created = self.yen_lines();
        merge(
            &mut created,
            json!({"terminal_id": terminal, "store_id": "S01",
                   "transaction_id": format!("{}{n:05}", self.config.run_id),
                   "transaction_type": 1, "status": "created"}),
        );
        let mut changes = VecDeque::from([change("sale.created", created)]);
        if self.rng.random_bool(0.2) {
            changes.push_back(change("sale.cancelled", json!({"status": "cancelled"})));
        }
        (entity, changes)
    }

    fn rr_order(&mut self) -> (usize, VecDeque<Change>) {
        let n = self.next_id(Kind::RrOrder);
        let entity = self.push(EntitySpec {
            provider: ProviderKind::ReceiptRoller,
            entity_type: EntityType::Order,
            outlet_id: None,
            offline: Duration::ZERO,
        });
        let mut created = self.yen_lines();
        merge(
            &mut created,
            json!({"order_id": format!("RO-{}-{n:04}", self.config.run_id),
                   "store_id": "S01", "status": "created"}),
        );
        let mut changes = VecDeque::from([change("order.created", created)]);
        if self.rng.random_bool(0.15) {
            changes.push_back(change("order.updated", json!({"status": "cancelled"})));
        } else {
            let stages = self.rng.random_range(1..=4);
            for status in ["paid", "preparing", "ready", "completed"]
                .into_iter()
                .take(stages)
            {
                changes.push_back(change("order.updated", json!({"status": status})));
            }
        }
        (entity, changes)
    }

    fn mekari_order(&mut self) -> (usize, VecDeque<Change>) {
        let n = self.next_id(Kind::MekariOrder);
        let outlet = self.outlet();
        let offline = if self.rng.random_bool(self.config.offline) {
            Duration::from_secs(self.rng.random_range(60..1800))
        } else {
            Duration::ZERO
        };
        let entity = self.push(EntitySpec {
            provider: ProviderKind::Mekari,
            entity_type: EntityType::Order,
            outlet_id: Some(outlet.clone()),
            offline,
        });
        let id = format!("ORD-{}-{n:04}", self.config.run_id);
        self.mekari_orders.push((id.clone(), outlet.clone()));
        let (mut created, _) = self.rupiah_lines();
        merge(
            &mut created,
            json!({"id": id, "outlet_id": outlet, "status": "open", "kitchen_status": "new"}),
        );
        let mut changes = VecDeque::from([change("order.created", created)]);
        if self.rng.random_bool(0.1) {
            changes.push_back(change("order.updated", json!({"status": "void"})));
            return (entity, changes);
        }
        changes.push_back(change("order.updated", json!({"status": "paid"})));
        for stage in ["preparing", "ready", "served"] {
            changes.push_back(change(
                "order.kitchen_status_changed",
                json!({"kitchen_status": stage}),
            ));
        }
        (entity, changes)
    }

    /// A return, refund or exchange against an earlier Mekari order.
    fn after_sale(&mut self, kind: Kind) -> (usize, VecDeque<Change>) {
        let n = self.next_id(kind);
        let (order_id, outlet) = self
            .mekari_orders
            .choose(self.rng)
            .cloned()
            // new_entity only picks these kinds once an order exists.
            .unwrap_or_default();
        let life = match kind {
            Kind::Return => &RETURN_LIFE,
            Kind::Refund => &REFUND_LIFE,
            _ => &EXCHANGE_LIFE,
        };
        let entity = self.push(EntitySpec {
            provider: ProviderKind::Mekari,
            entity_type: life.entity_type,
            outlet_id: Some(outlet.clone()),
            offline: Duration::ZERO,
        });
        let (product, name, price) = *RUPIAH_MENU.choose(self.rng).unwrap_or(&RUPIAH_MENU[0]);
        let qty = self.rng.random_range(1..=2);
        let mut created = json!({
            "id": format!("{}-{}-{n:03}", life.prefix, self.config.run_id),
            "order_id": order_id, "outlet_id": outlet, "status": life.first,
            "currency": "IDR", "total": rupiah(price * qty),
            "items": [{"product_id": product, "name": name, "qty": qty, "price": rupiah(price)}],
        });
        match kind {
            Kind::Return => merge(&mut created, json!({"reason": "damaged"})),
            Kind::Refund => {
                let method = *["cash", "card", "qris"].choose(self.rng).unwrap_or(&"cash");
                merge(&mut created, json!({"method": method}));
            }
            _ => {
                let (given, given_name, given_price) =
                    *RUPIAH_MENU.choose(self.rng).unwrap_or(&RUPIAH_MENU[0]);
                let difference = (given_price - price).max(0) * qty;
                merge(
                    &mut created,
                    json!({"total": rupiah(difference),
                           "items_given": [{"product_id": given, "name": given_name,
                                            "qty": qty, "price": rupiah(given_price)}]}),
                );
            }
        }
        let mut changes = VecDeque::from([change(life.created, created)]);
        for status in life.later {
            changes.push_back(change(life.updated, json!({"status": status})));
        }
        (entity, changes)
    }

    fn product(&mut self) -> (usize, VecDeque<Change>) {
        let n = self.next_id(Kind::Product);
        let entity = self.push(EntitySpec {
            provider: ProviderKind::Mekari,
            entity_type: EntityType::Product,
            outlet_id: None,
            offline: Duration::ZERO,
        });
        let id = format!("PRD-{}-{n:03}", self.config.run_id);
        self.products.push(id.clone());
        let (_, name, price) = *RUPIAH_MENU.choose(self.rng).unwrap_or(&RUPIAH_MENU[0]);
        let mut changes = VecDeque::from([change(
            "product.created",
            json!({"id": id, "sku": format!("SKU-{}-{n:03}", self.config.run_id),
                   "name": name, "price": rupiah(price), "currency": "IDR", "status": "active"}),
        )]);
        for update in 0..self.rng.random_range(0..=2) {
            let new_price = price + self.rng.random_range(-8..=8) * 1000 * 4 / 2;
            let mut patch = json!({"price": rupiah(new_price.max(4))});
            // A second update also renames the product: a change the schema
            // carries in `name` and the guard must see.
            if update == 1 {
                merge(&mut patch, json!({"name": format!("{name} Special")}));
            }
            changes.push_back(change("product.updated", patch));
        }
        if self.rng.random_bool(0.15) {
            let mut deleted = change("product.deleted", json!({"status": "deleted"}));
            deleted.deletes = true;
            changes.push_back(deleted);
        }
        (entity, changes)
    }

    fn collection(&mut self) -> (usize, VecDeque<Change>) {
        let n = self.next_id(Kind::Collection);
        let entity = self.push(EntitySpec {
            provider: ProviderKind::Mekari,
            entity_type: EntityType::Collection,
            outlet_id: None,
            offline: Duration::ZERO,
        });
        let members = |g: &mut Self| -> Vec<String> {
            let count = g.rng.random_range(0..=3).min(g.products.len());
            g.products.sample(g.rng, count).cloned().collect()
        };
        let name = *["Breakfast", "Drinks", "Promo", "Snacks"]
            .choose(self.rng)
            .unwrap_or(&"Promo");
        let product_ids = members(self);
        let mut changes = VecDeque::from([change(
            "collection.created",
            json!({"id": format!("COL-{}-{n:02}", self.config.run_id), "name": name,
                   "product_ids": product_ids, "status": "active"}),
        )]);
        for _ in 0..self.rng.random_range(0..=2) {
            let product_ids = members(self);
            changes.push_back(change(
                "collection.updated",
                json!({"product_ids": product_ids}),
            ));
        }
        (entity, changes)
    }

    fn outlet(&mut self) -> String {
        self.config
            .outlets
            .choose(self.rng)
            .cloned()
            .unwrap_or_else(|| "OUT-1".into())
    }
}

/// Sets every field of `patch` on `target` (both objects).
pub fn merge(target: &mut Value, patch: Value) {
    if let (Value::Object(target), Value::Object(patch)) = (target, patch) {
        target.extend(patch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    pub(crate) fn config(events: usize) -> PlanConfig {
        PlanConfig {
            events,
            outlets: vec!["OUT-1".into(), "OUT-2".into()],
            duplicates: 0.1,
            duplicates_at_once: false,
            reorder: 0.1,
            drop: 0.1,
            offline: 0.1,
            run_id: "TEST".into(),
        }
    }

    fn plan(events: usize, seed: u64) -> Plan {
        generate(&config(events), &mut StdRng::seed_from_u64(seed))
    }

    #[test]
    fn a_plan_has_exactly_the_requested_events() {
        for n in [0, 1, 50, 500] {
            assert_eq!(plan(n, 7).steps.len(), n);
        }
    }

    #[test]
    fn one_seed_gives_one_script() {
        let (a, b) = (plan(200, 42), plan(200, 42));
        let script = |p: &Plan| {
            p.steps
                .iter()
                .map(|s| format!("{}{}{:?}{}", s.entity, s.event_type, s.faults, s.id_random))
                .collect::<Vec<_>>()
        };
        assert_eq!(script(&a), script(&b));
        assert_ne!(script(&a), script(&plan(200, 43)));
    }

    #[test]
    fn duplicates_at_once_sends_the_copy_with_the_first_attempt_and_changes_nothing_else() {
        let later = plan(300, 9);
        let mut together = config(300);
        together.duplicates_at_once = true;
        let together = generate(&together, &mut StdRng::seed_from_u64(9));
        let copies = later
            .steps
            .iter()
            .zip(&together.steps)
            .filter(|(l, t)| {
                assert_eq!(
                    (l.entity, l.event_type, l.id_random),
                    (t.entity, t.event_type, t.id_random)
                );
                assert_eq!(
                    l.faults.duplicate_after.is_some(),
                    t.faults.duplicate_after.is_some()
                );
                t.faults.duplicate_after.is_some()
            })
            .inspect(|(l, t)| {
                assert!(l.faults.duplicate_after > Some(Duration::ZERO));
                assert_eq!(t.faults.duplicate_after, Some(Duration::ZERO));
            })
            .count();
        assert!(copies > 0, "the plan duplicates some deliveries");
    }

    #[test]
    fn every_entity_starts_with_a_create_and_links_its_next_event() {
        let plan = plan(500, 3);
        let mut seen = vec![false; plan.entities.len()];
        for (i, step) in plan.steps.iter().enumerate() {
            if !seen[step.entity] {
                assert!(step.event_type.ends_with(".created"), "{}", step.event_type);
                seen[step.entity] = true;
            }
            if let Some(next) = step.next_of_entity {
                assert!(next > i);
                assert_eq!(plan.steps[next].entity, step.entity);
            }
        }
    }

    #[test]
    fn only_events_the_apis_can_show_are_dropped() {
        let mut config = config(2000);
        config.drop = 1.0;
        let plan = generate(&config, &mut StdRng::seed_from_u64(5));
        let mut dropped = 0;
        for step in &plan.steps {
            let spec = &plan.entities[step.entity];
            let can = reconcilable(spec.provider, spec.entity_type, step.deletes);
            assert_eq!(step.faults.drop, can, "{}", step.event_type);
            dropped += usize::from(step.faults.drop);
        }
        assert!(dropped > 1000);
    }

    #[test]
    fn the_mix_covers_every_event_family() {
        let plan = plan(1000, 11);
        for event in [
            "sale.created",
            "sale.cancelled",
            "order.created",
            "order.updated",
            "order.kitchen_status_changed",
            "return.created",
            "refund.updated",
            "exchange.created",
            "product.updated",
            "product.deleted",
            "collection.updated",
        ] {
            assert!(
                plan.steps.iter().any(|s| s.event_type == event),
                "{event} missing"
            );
        }
    }

    #[test]
    fn rupiah_is_exact() {
        assert_eq!(rupiah(51_000 * 4 + 2).to_string(), "51000.5");
        assert_eq!(rupiah(51_000 * 4 + 1).to_string(), "51000.25");
        assert_eq!(rupiah(51_000 * 4).to_string(), "51000");
    }
}
