use redis::cluster_routing::Slot;

use super::delivery_key;

#[test]
fn an_error_names_the_server_without_its_password() {
    assert_eq!(
        super::without_password("redis://posbridge:secret@10.0.0.1:6379,rediss://:pw@b:7000"),
        "redis://posbridge:***@10.0.0.1:6379,rediss://:***@b:7000"
    );
    assert_eq!(super::without_password("redis://a:6379"), "redis://a:6379");
}

#[test]
fn a_deliverys_keys_share_one_slot_whatever_its_id_or_prefix() {
    for prefix in ["posbridge:", "", "a{b:", "x}", "{posbridge}:", "p{q}r{"] {
        for id in ["mekari:e1", "receiptroller:}", "x:{y}", "z:{", "", "x:}}{{"] {
            let (done, lease) = (
                delivery_key(prefix, id, "done"),
                delivery_key(prefix, id, "lease"),
            );
            assert_ne!(done, lease);
            assert_eq!(
                Slot::for_key(&done),
                Slot::for_key(&lease),
                "{done} and {lease}"
            );
        }
    }
}

#[test]
fn deliveries_spread_over_slots() {
    let slots: std::collections::HashSet<_> = (0..100)
        .map(|i| Slot::for_key(delivery_key("posbridge:", &format!("mekari:e{i}"), "done")))
        .collect();
    assert!(slots.len() > 90, "{} slots", slots.len());
}

/// A lock's waiting key lies in the lock's hash slot, as the scripts that
/// set and delete it with the lock need on a cluster, under the prefix;
/// two locks never share one. Every lock has one under a prefix without
/// braces or with a whole tag, but for an entity key holding a `}` under a
/// prefix without a tag (its waiters poll instead).
#[test]
fn a_locks_waiting_key_shares_its_slot_under_the_prefix() {
    use super::wait::waiting_key;
    let names = [
        "orders/mekari:O-1",
        "sales/receiptroller:T1|2026-12|1",
        "sales/posbridge:rebuilt-from-topics",
        "posbridge:rederive",
        "orders/x:{y}",
        "orders/z:{",
        "orders/w:}",
        "products/x:}}{{",
        "orders/{}",
    ];
    let mut seen = std::collections::HashSet::new();
    for prefix in [
        "posbridge:",
        "",
        "a{b:",
        "x}",
        "{posbridge}:",
        "p{q}r{",
        "{}",
    ] {
        for name in names {
            let lock = format!("{prefix}lock:{name}");
            let waiting = waiting_key(prefix, &lock);
            if let Some(waiting) = &waiting {
                assert_eq!(Slot::for_key(waiting), Slot::for_key(&lock), "{waiting}");
                assert!(waiting.starts_with(&format!("{prefix}waiting:")));
                assert!(seen.insert(waiting.clone()), "{waiting} twice");
            }
            let tagged_prefix = ["{posbridge}:", "p{q}r{"].contains(&prefix);
            let plain_prefix = !prefix.contains(['{', '}']);
            if tagged_prefix || (plain_prefix && !name.contains('}')) {
                assert!(waiting.is_some(), "{lock} has no waiting key");
            }
        }
    }
    assert_eq!(
        waiting_key("posbridge:", "posbridge:lock:orders/w:}"),
        None,
        "an untagged lock holding a `}}`: no tag holds its whole key"
    );
    assert_eq!(
        waiting_key("posbridge:", "posbridge:lock:orders/mekari:O-1").as_deref(),
        Some("posbridge:waiting:{posbridge:lock:orders/mekari:O-1}"),
        "an untagged lock's: its whole key as the tag"
    );
    assert_eq!(
        waiting_key("{posbridge}:", "{posbridge}:lock:orders/mekari:O-1").as_deref(),
        Some("{posbridge}:waiting:orders/mekari:O-1"),
        "a tagged prefix's: the lock's name after it"
    );
}
