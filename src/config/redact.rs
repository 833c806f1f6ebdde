//! Saying what is wrong with a source's settings without repeating them.
//!
//! A source's table holds its secrets, and a secret pasted in the wrong
//! place (into `header`, as a key) is a value like any other. Why a source
//! file is refused is shown on `/status`, `/admin/sources` and in the log,
//! so a reason names the key and the kind of problem, never a value nor a
//! key no setting has: those are said by their place in the file. The
//! parsers' own messages quote what they read, so none is passed on: a
//! [`SettingError`] keeps only what a parser's error says of the key and
//! of the kind. [`Held`] is the safety net behind that.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, Visitor};

/// The keys a table read as `T` takes: the field names serde's derive
/// hands its deserializer (none for a type that is no derived struct).
/// Known names may be said; the checks name them from here so that a new
/// setting is known without a list to keep beside the struct.
pub fn keys_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    T::deserialize(FieldNames)
        .err()
        .map_or(&[], |caught| caught.0)
}

/// A deserializer that reads nothing: it fails with the field names a
/// struct asks it for.
struct FieldNames;

/// What [`FieldNames`] caught.
#[derive(Debug)]
struct Caught(&'static [&'static str]);

impl fmt::Display for Caught {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("only the field names are read")
    }
}

impl std::error::Error for Caught {}

impl serde::de::Error for Caught {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Caught(&[])
    }
}

impl<'de> Deserializer<'de> for FieldNames {
    type Error = Caught;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Caught> {
        Err(Caught(&[]))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Caught> {
        Err(Caught(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// A place in a file's text: its line and column, from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The line.
    pub line: usize,
    /// The column, in characters.
    pub column: usize,
}

impl Position {
    /// Where byte `offset` of `text` is.
    pub fn at(text: &str, offset: usize) -> Position {
        let before = text.get(..offset).unwrap_or(text);
        let line_start = before.rfind('\n').map_or(0, |n| n + 1);
        Position {
            line: before.matches('\n').count() + 1,
            column: before[line_start..].chars().count() + 1,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// A setting that does not read, said by its key and the kind of mistake.
#[derive(Debug)]
pub struct SettingError {
    /// The key, relative to the table read (`tolerance_secs`,
    /// `secrets[1]`); empty for the table itself. Only the part made of
    /// keys the table takes: a name under a map (`paths.{name}`) is the
    /// file's own.
    pub key: String,
    /// What is wrong with it.
    pub kind: Kind,
}

/// The kind of mistake a [`SettingError`] is.
#[derive(Debug, thiserror::Error)]
pub enum Kind {
    /// A value of another type than the key's.
    #[error("is {found}, where {expected} is wanted")]
    Type {
        /// What the value is (`a string`).
        found: &'static str,
        /// What the key takes, as serde words it (`u64`).
        expected: &'static str,
    },
    /// A value of the right type that the key does not take (a scheme
    /// no one has, a list holding a number).
    #[error("holds a value it does not take")]
    Value,
    /// A key the table needs.
    #[error("is missing")]
    Missing,
    /// A mistake the parser did not place: a key the table does not take,
    /// most often.
    #[error("holds a key it does not take or a value it cannot read (it takes {takes})")]
    Table {
        /// The keys the table takes.
        takes: String,
    },
}

impl SettingError {
    /// What the config crate's `error` says of a table read as the struct
    /// whose keys are `keys`, without what it quotes of the file.
    pub fn of(error: &config::ConfigError, keys: &[&str]) -> SettingError {
        use config::ConfigError;
        let (key, kind) = match error {
            ConfigError::Type {
                key,
                unexpected,
                expected,
                ..
            } => (
                key.as_deref(),
                type_error(&unexpected.to_string(), expected),
            ),
            ConfigError::At { error, key, .. } => (
                key.as_deref(),
                match error.as_ref() {
                    ConfigError::Type {
                        unexpected,
                        expected,
                        ..
                    } => type_error(&unexpected.to_string(), expected),
                    ConfigError::NotFound(_) => Kind::Missing,
                    _ => Kind::Value,
                },
            ),
            ConfigError::NotFound(key) => (Some(key.as_str()), Kind::Missing),
            _ => (
                None,
                Kind::Table {
                    takes: keys.join(", "),
                },
            ),
        };
        SettingError {
            key: key.map(|key| known_part(key, keys)).unwrap_or_default(),
            kind,
        }
    }
}

/// A type mistake, from the text of what the value is (`string "…"`), of
/// which only the first word is kept.
fn type_error(unexpected: &str, expected: &'static str) -> Kind {
    let found = [
        ("boolean", "a boolean"),
        ("64-bit", "an integer"),
        ("128-bit", "an integer"),
        ("floating", "a float"),
        ("string", "a string"),
        ("sequence", "a list"),
        ("map", "a table"),
    ]
    .into_iter()
    .find_map(|(word, said)| unexpected.starts_with(word).then_some(said))
    .unwrap_or("a value");
    Kind::Type { found, expected }
}

/// The leading part of a key path (`paths.x`, `secrets[0]`) that `keys`
/// name (`paths`, `secrets[0]`): a first segment the table does not take
/// leaves nothing.
fn known_part(key: &str, keys: &[&str]) -> String {
    let first = key.find(['.', '[']).map_or(key, |end| &key[..end]);
    if !keys.contains(&first) {
        return String::new();
    }
    let indexes = key[first.len()..]
        .split_inclusive(']')
        .take_while(|part| {
            part.strip_prefix('[')
                .and_then(|part| part.strip_suffix(']'))
                .is_some_and(|index| index.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect::<String>();
    format!("{first}{indexes}")
}

/// What of a file a reason must never repeat, for the one check every
/// refusal passes before it is shown or logged ([`Held::scrub`]): the
/// file's string values and its keys that no setting has, or every token
/// of a file that did not parse. The reasons are made not to quote the
/// file; this catches what a message from further down (a parser, the
/// system, a library) repeats of it all the same.
///
/// A word shorter than [`Held::SHORTEST`] is not held: it would wipe out
/// the reason's own words, and no secret is that short (a signing secret
/// has at least 8 characters). Nor is one that is part of a word a reason
/// may say (a key posbridge knows, the source's table): those are public.
/// And a held word is not taken out of the middle of a longer word of the
/// reason (`short` out of `shorter`).
#[derive(Clone, Default)]
pub struct Held {
    /// Longest first: a value inside another is replaced after it.
    words: Vec<String>,
}

impl Held {
    /// The length in characters from which a word is held.
    pub const SHORTEST: usize = 4;

    /// The `words` of a file (its values, its unknown keys or its tokens),
    /// but those inside one of `sayable`.
    pub fn new<'a>(words: impl IntoIterator<Item = &'a str>, sayable: &[&str]) -> Held {
        let mut held: Vec<String> = words
            .into_iter()
            // As written, and as a parser's message quotes it (`a\"b`).
            .flat_map(|word| {
                let quoted = format!("{word:?}");
                [word.to_owned(), quoted[1..quoted.len() - 1].to_owned()]
            })
            .filter(|word| word.chars().count() >= Self::SHORTEST)
            .filter(|word| !sayable.iter().any(|say| say.contains(word.as_str())))
            .collect();
        held.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        held.dedup();
        Held { words: held }
    }

    /// The tokens of a text: what lies between white space, quotes and
    /// TOML's punctuation. For a file that did not parse, whose values
    /// cannot be told from the rest.
    pub fn tokens(text: &str) -> impl Iterator<Item = &str> {
        text.split(|c: char| c.is_whitespace() || "\"'=,[]{}#".contains(c))
            .filter(|token| !token.is_empty())
    }

    /// `reason` with every held word replaced by `…`.
    pub fn scrub(&self, reason: &str) -> String {
        self.words
            .iter()
            .fold(reason.to_owned(), |reason, word| standing(&reason, word))
    }
}

/// `text` with `word` replaced by `…` wherever it does not cut a word of
/// the text in two (a secret `short` leaves `shorter` be, a prefix `acme.`
/// is taken out of `acme.sales`), nor names a source by its table
/// (`mekari.sources.acme`, a file's name or the main file's table, both
/// shown beside every reason: an account may be another source's name).
fn standing(text: &str, word: &str) -> String {
    let letter = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let (first, last) = (word.chars().next(), word.chars().next_back());
    let mut out = String::with_capacity(text.len());
    let mut done = 0;
    for (at, _) in text.match_indices(word) {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if at < done
            || (letter(before) && letter(first))
            || (letter(after) && letter(last))
            || text[..at].ends_with(".sources.")
        {
            continue;
        }
        out.push_str(&text[done..at]);
        out.push('…');
        done = at + word.len();
    }
    out.push_str(&text[done..]);
    out
}

/// The words held are the file's values: not for debug output.
impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Held({} words)", self.words.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_structs_keys_are_its_field_names() {
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Two {
            first: u8,
            #[serde(rename = "second_one")]
            second: String,
        }
        assert_eq!(keys_of::<Two>(), ["first", "second_one"]);
        assert!(keys_of::<String>().is_empty());
    }

    #[test]
    fn a_readers_error_is_said_by_key_and_kind_without_the_value() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Settings {
            count: u64,
            #[serde(default)]
            mode: Option<crate::config::OnBrokerUnavailable>,
            #[serde(default)]
            names: std::collections::BTreeMap<String, u8>,
        }
        let said = |text: &str| {
            let error = config::Config::builder()
                .add_source(config::File::from_str(text, config::FileFormat::Toml))
                .build()
                .and_then(config::Config::try_deserialize::<Settings>)
                .unwrap_err();
            let error = SettingError::of(&error, keys_of::<Settings>());
            format!("{}: {}", error.key, error.kind)
        };
        for (text, expected) in [
            (
                "count = \"s3cr3t\"",
                "count: is a string, where an integer is wanted",
            ),
            (
                "count = 1\nmode = \"s3cr3t\"",
                "mode: holds a value it does not take",
            ),
            ("mode = \"spool\"", "count: is missing"),
            (
                "count = 1\ns3cr3t = 1",
                ": holds a key it does not take or a value it cannot read (it takes count, mode, names)",
            ),
        ] {
            assert_eq!(said(text), expected, "{text}");
        }
        let under_a_map = said("count = 1\nnames = { s3cr3t = \"x\" }");
        assert!(
            under_a_map.starts_with("names: is a string"),
            "{under_a_map}"
        );
    }

    #[test]
    fn a_position_counts_lines_and_characters_from_one() {
        let text = "a = 1\nbé = x\n";
        assert_eq!(Position::at(text, 0).to_string(), "line 1, column 1");
        assert_eq!(Position::at(text, 11).to_string(), "line 2, column 5");
    }

    #[test]
    fn a_key_is_said_as_far_as_the_table_takes_it() {
        let keys = ["secrets", "paths"];
        assert_eq!(known_part("secrets[1]", &keys), "secrets[1]");
        assert_eq!(known_part("paths.s3cr3t", &keys), "paths");
        assert_eq!(known_part("paths[s3cr3t]", &keys), "paths");
        assert_eq!(known_part("s3cr3t.paths", &keys), "");
        assert_eq!(known_part("secrets[", &keys), "secrets");
    }

    #[test]
    fn a_scrubbed_reason_holds_no_word_of_the_file_but_what_may_be_said() {
        let held = Held::new(
            ["a\"s3cr3t", "s3cr3t-long", "abc", "shop", "header"],
            &["mekari.sources.shop-1", "header"],
        );
        assert_eq!(
            held.scrub("mekari.sources.shop-1.header: `s3cr3t-long`, \"a\\\"s3cr3t\", abc"),
            "mekari.sources.shop-1.header: `…`, \"…\", abc"
        );
        assert_eq!(format!("{held:?}"), "Held(3 words)");
        let held = Held::new(["short", "acme.", "acme"], &[]);
        assert_eq!(
            held.scrub("short: shorter, acme.sales, short, mekari.sources.acme has acme"),
            "…: shorter, …sales, …, mekari.sources.acme has …"
        );
        let tokens: Vec<&str> = Held::tokens("secrets = [\"s1\", 'x y'] # old").collect();
        assert_eq!(tokens, ["secrets", "s1", "x", "y", "old"]);
    }
}
