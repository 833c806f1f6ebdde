//! A webhook body as a tree that borrows from the body's bytes.
//!
//! `serde_json::Value` owns every key and every string: parsing a sale made
//! about forty allocations (a `String` for each key and text, a node for
//! each map) before normalization read a dozen fields and wrote the
//! canonical content once. Here keys and strings point into the request's
//! `Bytes` (owned only when the JSON escapes them), objects are one vector
//! of members in the order sent, and numbers keep their text exactly as
//! sent, so amounts never pass through `f64`.
//!
//! Reading matches `serde_json::Value`'s: when a key repeats in an object,
//! its last member counts ([`Json::get`], and the canonical content).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// One JSON value, borrowing its text from the parsed bytes.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer that fits 64 bits, as `serde_json` reads one: kept as
    /// its value, whose text is the one sent (JSON has no leading zeros or
    /// `+`), so the usual amount costs no allocation of its own.
    Integer(i128),
    /// Any other number, as its text (`51000.50` stays `51000.50`).
    Number(Cow<'a, str>),
    /// A string, unescaped.
    String(Cow<'a, str>),
    /// An array.
    Array(Vec<Json<'a>>),
    /// An object's members in the order sent, repeated keys included.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
}

/// The key under which `serde_json` (with its `arbitrary_precision`
/// feature, which posbridge enables) hands a number's text to a visitor, as
/// a one-member map: how its own `Value` tells a number from an object.
/// `numbers_keep_their_text` fails should a release of `serde_json` rename it.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

impl<'a> Json<'a> {
    /// Parses `bytes`, borrowing from them. A parsed body is valid UTF-8 as
    /// a whole: every string in it was checked, and what lies between them
    /// is JSON's ASCII.
    ///
    /// # Errors
    /// `serde_json`'s error for anything that is not one JSON value.
    pub fn parse(bytes: &'a [u8]) -> Result<Json<'a>, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The member `key` of an object (its last, should the key repeat);
    /// `None` for a missing key or a value that is no object.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Object(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// The string this is, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }
}

/// A tree borrowing from a `serde_json::Value`: for what arrives as one (an
/// API page read whole, a test's `json!`), read by the same functions.
impl<'a> From<&'a Value> for Json<'a> {
    fn from(value: &'a Value) -> Json<'a> {
        match value {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => integer(n.as_str())
                .map_or_else(|| Json::Number(Cow::Borrowed(n.as_str())), Json::Integer),
            Value::String(s) => Json::String(Cow::Borrowed(s)),
            Value::Array(values) => Json::Array(values.iter().map(Json::from).collect()),
            Value::Object(map) => Json::Object(
                map.iter()
                    .map(|(k, v)| (Cow::Borrowed(k.as_str()), Json::from(v)))
                    .collect(),
            ),
        }
    }
}

/// The integer `text` is when `serde_json` reads it as one (it keeps `-0`
/// as text).
fn integer(text: &str) -> Option<i128> {
    if text == "-0" {
        return None;
    }
    text.parse::<u64>()
        .map(i128::from)
        .or_else(|_| text.parse::<i64>().map(i128::from))
        .ok()
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json<'de>, D::Error> {
        deserializer.deserialize_any(TreeVisitor)
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Json<'de>, E> {
        Ok(Json::Integer(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Json<'de>, E> {
        Ok(Json::Integer(n.into()))
    }

    // With `arbitrary_precision` other numbers come as a map (`visit_map`);
    // this serves a deserializer without it.
    fn visit_f64<E>(self, n: f64) -> Result<Json<'de>, E> {
        Ok(Json::Number(Cow::Owned(n.to_string())))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(value) = seq.next_element()? {
            values.push(value);
        }
        Ok(Json::Array(values))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let Some(Key(first)) = map.next_key()? else {
            return Ok(Json::Object(Vec::new()));
        };
        if first == NUMBER_TOKEN {
            return Ok(Json::Number(Cow::Owned(map.next_value::<String>()?)));
        }
        // Most objects in a POS body hold a handful to a dozen members.
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(8).max(1));
        members.push((first, map.next_value()?));
        while let Some(Key(key)) = map.next_key()? {
            members.push((key, map.next_value()?));
        }
        Ok(Json::Object(members))
    }
}

/// An object's key, borrowed when the JSON does not escape it.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numbers keep their digits as sent, through `serde_json`'s own
    /// reading (an exponent gets its sign, as `Value` has it); 64-bit
    /// integers their value.
    #[test]
    fn numbers_keep_their_text() {
        let body = br#"{"a": 51000.50, "b": 123456789012345678901234567890, "c": -0.0001e3,
                        "d": 18446744073709551615, "e": -9223372036854775808, "f": -0}"#;
        let json = Json::parse(body).unwrap();
        let value: Value = serde_json::from_slice(body).unwrap();
        for (key, text) in [
            ("a", "51000.50"),
            ("b", "123456789012345678901234567890"),
            ("c", "-0.0001e+3"),
            ("f", "-0"),
        ] {
            let number = Json::Number(Cow::Borrowed(text));
            assert_eq!(json.get(key), Some(&number), "{key}");
            assert_eq!(Json::from(&value).get(key), Some(&number), "{key}");
            assert_eq!(value[key].to_string(), text, "{key}");
        }
        for (key, n) in [("d", i128::from(u64::MAX)), ("e", i128::from(i64::MIN))] {
            assert_eq!(json.get(key), Some(&Json::Integer(n)), "{key}");
            assert_eq!(
                Json::from(&value).get(key),
                Some(&Json::Integer(n)),
                "{key}"
            );
            assert_eq!(value[key].to_string(), n.to_string(), "{key}");
        }
    }

    #[test]
    fn unescaped_text_is_borrowed_and_escaped_text_unescaped() {
        let body = br#"{"plain": "Coffee", "esc\u0061ped": "a\"b\u00e9"}"#;
        let json = Json::parse(body).unwrap();
        let Json::Object(members) = &json else {
            panic!("an object: {json:?}")
        };
        assert!(matches!(
            members[0],
            (
                Cow::Borrowed("plain"),
                Json::String(Cow::Borrowed("Coffee"))
            )
        ));
        assert_eq!(members[1].0, "escaped");
        assert_eq!(members[1].1.as_str(), Some("a\"bé"));
    }

    /// The same reading as `serde_json::Value`: a repeated key's last member
    /// counts, and what `Value` refuses is refused.
    #[test]
    fn it_reads_as_serde_json_value_reads() {
        let bodies: [&[u8]; 6] = [
            br#"{"id": "a", "id": "b", "n": [1, 2.5, {"x": null}], "t": true}"#,
            br#"[]"#,
            br#""\ud83d\ude00""#,
            b"{\"bad\": \"\xff\"}",
            br#"{"id": 1,}"#,
            br#"{"a": 1} trailing"#,
        ];
        for body in bodies {
            match (Json::parse(body), serde_json::from_slice::<Value>(body)) {
                (Ok(tree), Ok(value)) => {
                    let from_value = Json::from(&value);
                    assert_eq!(tree.get("id"), from_value.get("id"));
                    assert_eq!(format!("{:?}", dedup(tree)), format!("{:?}", from_value));
                }
                (Err(_), Err(_)) => {}
                (tree, value) => panic!("{tree:?} against {value:?} for {body:?}"),
            }
        }
    }

    /// A tree with each object's repeated keys folded to their last member,
    /// in key order: `serde_json::Value`'s view of it.
    fn dedup(json: Json<'_>) -> Json<'_> {
        match json {
            Json::Object(members) => {
                let mut map = std::collections::BTreeMap::new();
                for (key, value) in members {
                    map.insert(key, dedup(value));
                }
                Json::Object(map.into_iter().collect())
            }
            Json::Array(values) => Json::Array(values.into_iter().map(dedup).collect()),
            other => other,
        }
    }
}
