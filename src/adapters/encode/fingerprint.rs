//! The schema's single-object fingerprint: CRC-64-AVRO over its Parsing
//! Canonical Form, as the Avro specification defines both.

/// The schema's CRC-64-AVRO fingerprint over its Parsing Canonical Form, as
/// the Avro spec defines it for single-object encoding. Computed here rather
/// than by apache-avro, whose canonical form keeps logical-type attributes
/// and so disagrees with Java's `SchemaNormalization` and fastavro.
pub fn fingerprint() -> u64 {
    fingerprint_of(super::SCHEMA_JSON)
}

/// The CRC-64-AVRO fingerprint of any schema's Parsing Canonical Form.
pub(super) fn fingerprint_of(schema_json: &str) -> u64 {
    const EMPTY: u64 = 0xc15d_213a_a4d7_a795;
    let table: Vec<u64> = (0..256u64)
        .map(|i| (0..8).fold(i, |fp, _| (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg())))
        .collect();
    let schema: serde_json::Value =
        serde_json::from_str(schema_json).expect("an Avro schema is JSON");
    let mut canonical = String::new();
    canonical_form(&schema, "", &mut canonical);
    canonical.bytes().fold(EMPTY, |fp, b| {
        (fp >> 8) ^ table[usize::from((fp as u8) ^ b)]
    })
}

const PRIMITIVES: [&str; 8] = [
    "null", "boolean", "int", "long", "float", "double", "bytes", "string",
];

/// Writes the Parsing Canonical Form (Avro spec): full names, only the
/// attributes that affect parsing, in the spec's order, no whitespace; a
/// primitive with attributes (a logical type) becomes the bare primitive.
fn canonical_form(schema: &serde_json::Value, namespace: &str, out: &mut String) {
    use serde_json::Value as Json;
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let full_name = |name: &str, ns: &str| {
        if name.contains('.') || ns.is_empty() || PRIMITIVES.contains(&name) {
            name.to_owned()
        } else {
            format!("{ns}.{name}")
        }
    };
    match schema {
        Json::String(name) => out.push_str(&quote(&full_name(name, namespace))),
        Json::Array(branches) => {
            out.push('[');
            for (i, branch) in branches.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_form(branch, namespace, out);
            }
            out.push(']');
        }
        Json::Object(map) => match map.get("type") {
            Some(Json::String(kind))
                if ["record", "error", "enum", "fixed"].contains(&kind.as_str()) =>
            {
                let ns = map
                    .get("namespace")
                    .and_then(Json::as_str)
                    .unwrap_or(namespace);
                let name = full_name(
                    map.get("name").and_then(Json::as_str).unwrap_or_default(),
                    ns,
                );
                let inner_ns = name.rsplit_once('.').map_or("", |(ns, _)| ns).to_owned();
                out.push_str(&format!(
                    "{{\"name\":{},\"type\":{}",
                    quote(&name),
                    quote(kind)
                ));
                if let Some(Json::Array(fields)) = map.get("fields") {
                    out.push_str(",\"fields\":[");
                    for (i, field) in fields.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let field_name =
                            field.get("name").and_then(Json::as_str).unwrap_or_default();
                        out.push_str(&format!("{{\"name\":{},\"type\":", quote(field_name)));
                        canonical_form(&field["type"], &inner_ns, out);
                        out.push('}');
                    }
                    out.push(']');
                }
                if let Some(symbols) = map.get("symbols") {
                    out.push_str(&format!(",\"symbols\":{symbols}"));
                }
                if let Some(size) = map.get("size") {
                    out.push_str(&format!(",\"size\":{size}"));
                }
                out.push('}');
            }
            Some(Json::String(kind)) if kind == "array" => {
                out.push_str("{\"type\":\"array\",\"items\":");
                canonical_form(&map["items"], namespace, out);
                out.push('}');
            }
            Some(Json::String(kind)) if kind == "map" => {
                out.push_str("{\"type\":\"map\",\"values\":");
                canonical_form(&map["values"], namespace, out);
                out.push('}');
            }
            Some(inner) => canonical_form(inner, namespace, out),
            None => {}
        },
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_matches_fastavro_and_java() {
        // fastavro's CRC-64-AVRO of each version's Parsing Canonical Form
        // (fastavro.schema.fingerprint(to_parsing_canonical_form(..)), which
        // agrees with Java's SchemaNormalization.parsingFingerprint64),
        // printed as the header's little-endian bytes.
        assert_eq!(hex::encode(fingerprint().to_le_bytes()), "29ef1678077fa4da");
        assert_eq!(
            hex::encode(
                fingerprint_of(include_str!("../../../schemas/history/pos_event.v1.avsc"))
                    .to_le_bytes()
            ),
            "ecb1a1634e293ff8"
        );
    }
}
