//! A source file's text read as a source table, and what of it a reason
//! must not repeat ([`Held`]): every string value and every key no setting
//! has (a secret pasted in the wrong place), found by walking the parsed
//! TOML before the settings are read. Apart from the directory's listing in
//! `mod.rs`: this is about one text, not where it came from.

use crate::config::SourceConfig;
use crate::config::redact::{Held, Position, SettingError, keys_of};

/// A source table from TOML text, read as the main file's tables are, and
/// what of the text a reason must not repeat. Why not, said by key and by
/// place: the reason is shown on `/status` and `/admin/sources`, and the
/// file holds secrets. `table` is the source's key
/// (`mekari.sources.shop-1`), `api_keys` the keys its provider's `api`
/// table takes.
pub(super) fn parse(
    text: &str,
    table: &str,
    api_keys: &[&'static str],
) -> (Held, Result<SourceConfig, String>) {
    let source_keys = keys_of::<SourceConfig>();
    let sayable: Vec<&str> = source_keys
        .iter()
        .chain(api_keys)
        .copied()
        .chain([table])
        .collect();
    let parsed = match toml::de::DeTable::parse(text) {
        Ok(parsed) => parsed,
        Err(error) => {
            // toml's message is its own words (what it met, what it
            // expected); its excerpt of the file is left out.
            let at = error
                .span()
                .map(|span| format!(" at {}", Position::at(text, span.start)))
                .unwrap_or_default();
            let reason = format!("is not TOML{at}: {}", error.message());
            return (Held::new(Held::tokens(text), &sayable), Err(reason));
        }
    };
    let mut walk = Walk {
        text,
        source_keys,
        api_keys,
        words: Vec::new(),
        unknown: Vec::new(),
    };
    walk.table(parsed.get_ref(), table, Level::Source);
    let held = Held::new(walk.words.iter().map(String::as_str), &sayable);
    if !walk.unknown.is_empty() {
        walk.unknown.sort();
        let said: Vec<String> = walk.unknown.into_iter().map(|(_, said)| said).collect();
        return (held, Err(said.join("; ")));
    }
    let read = config::Config::builder()
        .add_source(config::File::from_str(text, config::FileFormat::Toml))
        .build()
        .and_then(config::Config::try_deserialize)
        .map_err(|error| {
            let error = SettingError::of(&error, source_keys);
            match error.key.as_str() {
                "" => format!("{table}: {}", error.kind),
                key => format!("{table}.{key}: {}", error.kind),
            }
        });
    (held, read)
}

/// Which keys a table of a source file takes.
#[derive(Clone, Copy)]
enum Level {
    /// The source's own: [`SourceConfig`]'s.
    Source,
    /// Its `api` table, at any depth: the provider's.
    Api,
    /// A table in a setting that takes none: no key.
    Other,
}

/// A walk over a parsed file: its string values and its keys no setting
/// has, to hold ([`Held`]), and each of those keys refused by its place
/// (its name may be a secret pasted there).
struct Walk<'a> {
    text: &'a str,
    source_keys: &'a [&'static str],
    api_keys: &'a [&'static str],
    words: Vec<String>,
    /// By their place in the text: said in the file's order.
    unknown: Vec<(usize, String)>,
}

impl Walk<'_> {
    /// A table at key path `at`.
    fn table(&mut self, table: &toml::de::DeTable<'_>, at: &str, level: Level) {
        let keys = match level {
            Level::Source => self.source_keys,
            Level::Api => self.api_keys,
            Level::Other => &[],
        };
        for (key, value) in table {
            let name: &str = key.get_ref();
            if keys.contains(&name) {
                let inner = match level {
                    Level::Source if name == "api" => Level::Api,
                    Level::Api => Level::Api,
                    _ => Level::Other,
                };
                self.value(value.get_ref(), &format!("{at}.{name}"), inner);
            } else {
                let start = key.span().start;
                let place = Position::at(self.text, start);
                self.unknown
                    .push((start, format!("{at}: {place}: a key it does not take")));
                self.words.push(name.to_owned());
                self.value(value.get_ref(), at, Level::Other);
            }
        }
    }

    /// A value at key path `at`; its tables take `level`'s keys.
    fn value(&mut self, value: &toml::de::DeValue<'_>, at: &str, level: Level) {
        match value {
            toml::de::DeValue::String(text) => self.words.push(text.to_string()),
            toml::de::DeValue::Array(items) => {
                for item in items.iter() {
                    self.value(item.get_ref(), at, level);
                }
            }
            toml::de::DeValue::Table(table) => self.table(table, at, level),
            _ => {}
        }
    }
}
