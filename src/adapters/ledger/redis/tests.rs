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
