//! The Avro binary datum of a [`PosEvent`], written straight from the event.
//!
//! Every published record is encoded here, so it skips building the
//! `apache_avro` value tree (a heap allocation per field, a schema walk per
//! value) that [`super::to_avro`] builds. The two must write the same bytes:
//! the tests below compare them on varied events, and `encode`'s tests pin
//! the bytes consumers already read. The field order is the schema's.

use crate::domain::event::{Decimal, LineItem, PosEvent, micros};

/// Appends an Avro `long` (or `int`): zig-zag, then base-128 varint.
fn long(out: &mut Vec<u8>, value: i64) {
    // Zig-zag folds the sign into the lowest bit: the cast keeps the bits.
    #[allow(clippy::cast_sign_loss)]
    let mut n = ((value << 1) ^ (value >> 63)) as u64;
    while n >= 0x80 {
        // The low seven bits with the continuation bit set.
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn count(out: &mut Vec<u8>, n: usize) {
    long(out, i64::try_from(n).unwrap_or(i64::MAX));
}

fn bytes(out: &mut Vec<u8>, value: &[u8]) {
    count(out, value.len());
    out.extend_from_slice(value);
}

fn string(out: &mut Vec<u8>, value: &str) {
    bytes(out, value.as_bytes());
}

/// A `["null", T]` union: branch 0 for none, branch 1 then the value.
fn optional<T>(out: &mut Vec<u8>, value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    match value {
        Some(value) => {
            out.push(2); // long 1
            write(out, value);
        }
        None => out.push(0), // long 0
    }
}

fn optional_string(out: &mut Vec<u8>, value: Option<&str>) {
    optional(out, value, string);
}

/// The `bytes` of a `decimal`: the shortest big-endian two's complement.
fn decimal(out: &mut Vec<u8>, value: Decimal) {
    let (all, start) = value.twos_complement();
    bytes(out, &all[start..]);
}

fn optional_decimal(out: &mut Vec<u8>, value: Option<Decimal>) {
    optional(out, value, decimal);
}

/// An array as one block: the count, the items, then the empty block that
/// ends it (an empty array is the end block alone).
fn array<T>(out: &mut Vec<u8>, items: &[T], write: impl Fn(&mut Vec<u8>, &T)) {
    if !items.is_empty() {
        count(out, items.len());
        for item in items {
            write(out, item);
        }
    }
    out.push(0);
}

fn lines(out: &mut Vec<u8>, items: &[LineItem]) {
    array(out, items, |out, item| {
        let LineItem {
            sku,
            name,
            quantity,
            unit_price,
        } = item;
        optional_string(out, sku.as_deref());
        optional_string(out, name.as_deref());
        optional_decimal(out, *quantity);
        optional_decimal(out, *unit_price);
    });
}

/// An enum symbol: its index among the schema's symbols, which list the
/// variants in `all`'s order.
fn symbol<T: PartialEq>(out: &mut Vec<u8>, all: &[T], item: &T) {
    count(out, all.iter().position(|x| x == item).unwrap_or(0));
}

/// Appends the event's datum to `out`. Every field of [`PosEvent`] is named
/// (no `..`), so a field added to the event without a place here fails to
/// compile.
pub fn write(event: &PosEvent, out: &mut Vec<u8>) {
    use crate::domain::event::{EntityType, ProviderKind};
    let PosEvent {
        event_id,
        provider,
        source,
        account,
        entity_type,
        entity_id,
        event_type,
        occurred_at,
        version,
        received_at,
        origin,
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
        // A deleted entity is written as a tombstone, never encoded.
        deleted: _,
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
        raw,
        // Where the record goes, not what it says.
        topic_prefix: _,
    } = event;
    string(out, event_id);
    symbol(out, &ProviderKind::ALL, provider);
    string(out, source);
    optional_string(out, account.as_deref());
    symbol(out, &EntityType::ALL, entity_type);
    string(out, entity_id);
    string(out, event_type);
    long(out, micros(*occurred_at));
    long(out, version.at_micros);
    long(
        out,
        i64::from(i32::try_from(version.rank).unwrap_or(i32::MAX)),
    );
    long(out, micros(*received_at));
    symbol(out, &super::avro::ORIGINS, origin);
    optional_string(out, outlet_id.as_deref());
    optional_string(out, store_id.as_deref());
    optional_string(out, terminal_id.as_deref());
    optional_string(out, currency.as_deref());
    optional_decimal(out, *subtotal);
    optional_decimal(out, *tax);
    optional_decimal(out, *total);
    optional_string(out, status.as_deref());
    optional_string(out, kitchen_status.as_deref());
    lines(out, items);
    optional(out, *business_at, |out, at| long(out, micros(at)));
    optional_string(out, name.as_deref());
    optional_string(out, sku.as_deref());
    optional_decimal(out, *price);
    optional(out, *active, |out, active| out.push(u8::from(active)));
    optional(out, product_ids.as_deref(), |out, ids| {
        array(out, ids, |out, id| string(out, id));
    });
    optional_string(out, order_id.as_deref());
    optional_string(out, reason.as_deref());
    optional_string(out, payment_method.as_deref());
    optional_string(out, customer_id.as_deref());
    optional(out, items_given.as_deref(), lines);
    bytes(out, raw);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::{EntityType, Origin, ProviderKind, Version};
    use time::macros::datetime;

    /// What `apache_avro` writes for the event's value tree.
    fn by_apache_avro(event: &PosEvent) -> Vec<u8> {
        let writer = apache_avro::writer::datum::GenericDatumWriter::builder(&super::super::SCHEMA)
            .build()
            .unwrap();
        let mut out = Vec::new();
        writer
            .write_value(&mut out, super::super::to_avro(event))
            .unwrap();
        out
    }

    fn direct(event: &PosEvent) -> Vec<u8> {
        let mut out = Vec::new();
        write(event, &mut out);
        out
    }

    #[test]
    fn the_direct_datum_is_the_value_trees_for_every_field() {
        let every = PosEvent::with_every_field();
        assert_eq!(direct(&every), by_apache_avro(&every));
        let sample = PosEvent::sample();
        assert_eq!(direct(&sample), by_apache_avro(&sample));
    }

    /// Edges of each encoding: varints across byte boundaries and both
    /// signs, decimals at the limits of i128 and at sign-byte boundaries,
    /// empty and long arrays, every enum symbol, long strings.
    #[test]
    fn the_direct_datum_is_the_value_trees_at_the_edges() {
        let decimals = [
            0,
            1,
            -1,
            127,
            128,
            -128,
            -129,
            255,
            256,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            // decimal(38, 4) holds 38 digits.
            10_i128.pow(38) - 1,
            1 - 10_i128.pow(38),
        ];
        let times = [
            datetime!(1970-01-01 00:00 UTC),
            datetime!(1969-12-31 23:59:59.999999 UTC),
            datetime!(2026-11-30 12:00:00.000001 UTC),
            datetime!(9999-12-31 23:59:59.999999 UTC),
        ];
        for (n, unscaled) in decimals.into_iter().enumerate() {
            let at = times[n % times.len()];
            let line = LineItem {
                sku: Some("s".repeat(n * 20).into()),
                name: (n % 2 == 0).then(|| "ü€".repeat(n).into()),
                quantity: Some(Decimal { unscaled }),
                unit_price: (n % 3 == 0).then_some(Decimal {
                    unscaled: unscaled.wrapping_neg(),
                }),
            };
            let event = PosEvent {
                provider: ProviderKind::ALL[n % 2],
                entity_type: EntityType::ALL[n % EntityType::ALL.len()],
                origin: [Origin::Webhook, Origin::Reconciler][n % 2],
                occurred_at: at,
                version: Version {
                    at_micros: micros(at),
                    rank: [0, 1, 63, 64, 8191, 8192, u32::MAX][n % 7],
                },
                received_at: at,
                total: Some(Decimal { unscaled }),
                items: vec![line.clone(); n * 11],
                items_given: (n % 2 == 1).then(|| vec![line; n]),
                business_at: (n % 2 == 0).then_some(at),
                active: [None, Some(true), Some(false)][n % 3],
                product_ids: (n % 3 != 0).then(|| (0..n * 9).map(|i| format!("P-{i}")).collect()),
                raw: "x".repeat(n * 100).into(),
                ..PosEvent::with_every_field()
            };
            assert_eq!(direct(&event), by_apache_avro(&event), "case {n}");
        }
    }
}
