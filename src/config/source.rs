//! The webhook sources: one table per configured webhook of a provider, with
//! its secrets, signature settings and (optionally) the provider's API.
//!
//! The `api` table's shape belongs to the provider (`src/adapters/providers/<name>/api.rs`
//! reads it), so it stays opaque here: config knows no provider's fields.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

use crate::domain::secret::Secret;
use crate::domain::verify::SchemeName;

/// One provider's webhooks.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Configured webhooks by name; the name is the `{source}` in the URL.
    #[serde(default)]
    pub sources: BTreeMap<String, SourceConfig>,
}

/// One configured webhook.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// Secrets that may sign a delivery; any one matching accepts it, so a
    /// new secret can be added before the provider switches to it.
    #[serde(default)]
    pub secrets: Secrets,
    /// Files holding more secrets, one a line, read again when they change
    /// (and on SIGHUP), so a secret rotates without a restart. A file named
    /// here that cannot be read keeps the secrets in use.
    #[serde(default, deserialize_with = "list_or_joined")]
    pub secrets_files: Vec<PathBuf>,
    /// A directory whose every file (but those whose names start with `.`)
    /// holds more secrets, read like `secrets_files`: a Kubernetes Secret
    /// mounted as a volume, whose keys are files there. A file taken out of
    /// it takes its secrets out of use.
    #[serde(default)]
    pub secrets_dir: Option<PathBuf>,
    /// Signature scheme; the provider's default when absent.
    #[serde(default)]
    pub scheme: Option<SchemeName>,
    /// Signature header; the scheme's or provider's default when absent.
    #[serde(default)]
    pub header: Option<String>,
    /// For timestamped schemes (stripe, standard-webhooks): how far the
    /// signed time may be from ours.
    #[serde(default = "default_tolerance_secs")]
    pub tolerance_secs: u64,
    /// Merchant account this webhook serves; becomes part of record keys.
    #[serde(default)]
    pub account: Option<String>,
    /// The provider's API for this source's account: reconciler and watchdog.
    #[serde(default)]
    pub api: Option<ApiSection>,
    /// What a verified delivery gets when Kafka cannot take it in time.
    #[serde(default)]
    pub on_broker_unavailable: OnBrokerUnavailable,
    /// Topics of its own (`acme.` gives `acme.sales`, …, `acme-dead-letter`)
    /// for a merchant whose records must stay apart from the others'; by
    /// default the shared topics, the account in the key.
    #[serde(default)]
    pub topic_prefix: Option<String>,
    /// This source's share of the deliveries in flight while the process
    /// is busy (`server.busy_in_flight`); `server.share_in_flight` when
    /// absent. Raise it for a merchant that sends far more than the
    /// others, lower it for one that must not crowd them out.
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// This source's rate (deliveries a second) beside other active
    /// sources when it sends more than twice as many as the busiest of
    /// them; `server.share_per_second` when absent. Raise it for a source
    /// that stands for many merchants.
    #[serde(default)]
    pub max_per_second: Option<u32>,
}

/// What a verified delivery gets when Kafka cannot acknowledge it in time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBrokerUnavailable {
    /// 503 + `Retry-After`: 2xx means "acknowledged by Kafka". Right for a
    /// provider that retries long enough (Mekari: ~11 h).
    #[default]
    Retry,
    /// Append it to the local, fsync'd outage spool and answer 2xx
    /// (`spooled`); the drainer publishes it once Kafka is back. Right for a
    /// provider that gives up early (ReceiptRoller: four attempts over ~71 min,
    /// then the webhook is switched off).
    Spool,
}

/// The least `tolerance_secs` may be: a signed time is seconds old by the
/// time it arrives (clock drift, transit, the provider's own queue).
pub const MIN_TOLERANCE_SECS: u64 = 30;

const fn default_tolerance_secs() -> u64 {
    300
}

/// A source's `api` table, kept as read (environment overrides included) for
/// the provider to turn into its own typed settings. Its `Debug` hides the
/// values: the table holds credentials.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct ApiSection(config::Value);

impl ApiSection {
    /// Reads the table as the provider's settings type, with the same
    /// type coercion as the rest of the file (`"5"` from the environment
    /// reads as a number).
    ///
    /// # Errors
    /// The deserializer's error (a missing, unknown or mistyped key).
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, config::ConfigError> {
        self.0.clone().try_deserialize()
    }
}

impl fmt::Debug for ApiSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiSection([redacted])")
    }
}

impl SourceConfig {
    /// Whether some of its secrets come from files, to be read again.
    pub fn reads_secret_files(&self) -> bool {
        !self.secrets_files.is_empty() || self.secrets_dir.is_some()
    }
}

/// A list of secrets, from a TOML array or, for environment overrides, one
/// comma-separated string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Secrets(pub Vec<Secret>);

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let list: Vec<String> = list_or_joined(deserializer)?;
        Ok(Secrets(list.into_iter().map(Secret::new).collect()))
    }
}

/// A list from a TOML array or, for environment overrides, one
/// comma-separated string; items trimmed, empty ones dropped.
fn list_or_joined<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<String>),
        Joined(String),
    }
    let list = match Form::deserialize(deserializer)? {
        Form::List(list) => list,
        Form::Joined(joined) => joined.split(',').map(str::to_owned).collect(),
    };
    Ok(list
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .map(T::from)
        .collect())
}

impl SourceConfig {
    /// The source's mistakes, as (key, what is wrong); `key` is its table
    /// (`mekari.sources.main`) and `name` its name in URLs.
    pub fn problems(&self, key: &str, name: &str) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, message: String| {
            let at = if field.is_empty() {
                key.to_owned()
            } else {
                format!("{key}.{field}")
            };
            problems.push((at, message));
        };
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            problem(
                "",
                "source names go into URLs: use a-z, 0-9, - and _, at least one".into(),
            );
        }
        if self.secrets.0.is_empty() && !self.reads_secret_files() {
            problem(
                "secrets",
                "at least one secret is needed to verify signatures: set secrets, secrets_files or secrets_dir".into(),
            );
        }
        // The values are not repeated: a source file's problems are shown
        // on `/status`, and a secret pasted in the wrong key is a value.
        if let Some(header) = &self.header
            && axum::http::HeaderName::from_bytes(header.as_bytes()).is_err()
        {
            problem(
                "header",
                "is not an HTTP header name (letters, digits and - only, like X-Signature): no delivery could carry it, so every one would be refused 401".into(),
            );
        }
        if self.tolerance_secs < MIN_TOLERANCE_SECS {
            problem(
                "tolerance_secs",
                format!(
                    "under {MIN_TOLERANCE_SECS} s refuses good deliveries whose signed time is a moment off ours (clock drift, transit, a queue at the provider); use at least {MIN_TOLERANCE_SECS} (the default is 300)"
                ),
            );
        }
        if let Some(account) = &self.account
            && (account.is_empty() || account.contains(':'))
        {
            problem(
                "account",
                "must be non-empty and without `:` (it is part of the record key)".into(),
            );
        }
        if self.max_in_flight == Some(0) {
            problem(
                "max_in_flight",
                "must be above 0: a share of 0 slows every delivery of a busy process".into(),
            );
        }
        if self.max_per_second == Some(0) {
            problem(
                "max_per_second",
                "must be above 0: a rate of 0 would hold every delivery back".into(),
            );
        }
        if let Some(why) = self
            .topic_prefix
            .as_deref()
            .and_then(super::kafka::topic_prefix_problem)
        {
            problem("topic_prefix", why);
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_table_reads_text_as_numbers_like_the_rest_of_the_file() {
        #[derive(Deserialize)]
        struct Settings {
            per_page: u32,
        }
        // Environment overrides arrive as text, as here.
        let section: ApiSection = config::Config::builder()
            .set_override("per_page", "5")
            .unwrap()
            .build()
            .unwrap()
            .try_deserialize()
            .unwrap();
        assert_eq!(section.read::<Settings>().unwrap().per_page, 5);
        assert_eq!(format!("{section:?}"), "ApiSection([redacted])");
    }
}
