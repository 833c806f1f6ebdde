//! Two events of one entity compared field by field, in the schema's order
//! and spelling: what a record derived again would change.

use apache_avro::types::Value;
use serde::Serialize;

use crate::adapters::encode::{shown, to_avro};
use crate::domain::event::PosEvent;

/// One field whose value differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The schema's field name.
    pub field: String,
    /// Its value in the record.
    pub was: serde_json::Value,
    /// Its value derived again.
    pub now: serde_json::Value,
}

/// The fields of `now` whose values differ from `was`'s.
pub fn changes(was: &PosEvent, now: &PosEvent) -> Vec<Change> {
    let (Value::Record(was), Value::Record(now)) = (to_avro(was), to_avro(now)) else {
        return Vec::new();
    };
    was.into_iter()
        .zip(now)
        .filter(|((_, a), (_, b))| a != b)
        .map(|((field, a), (_, b))| Change {
            field,
            was: shown(a),
            now: shown(b),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Decimal;

    #[test]
    fn only_the_fields_that_differ_are_named_with_both_values() {
        let was = PosEvent::sample();
        assert_eq!(changes(&was, &was), []);
        let mut now = was.clone();
        now.name = Some("Kopi Susu".into());
        now.total = Some(Decimal { unscaled: 185_000 });
        let changed = changes(&was, &now);
        let fields: Vec<&str> = changed.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["total", "name"]);
        assert_eq!(changed[1].was, serde_json::Value::Null);
        assert_eq!(changed[1].now, "Kopi Susu");
        assert_eq!(changed[0].now, "18.5000");
    }
}
