//! Configuration: plain data, loaded once from a TOML file with every key
//! overridable by `POSBRIDGE__SECTION__KEY` environment variables.
//!
//! Nothing here opens a connection or knows a provider's rules: `App::build`
//! turns this data into a running service, and the checks that need the
//! providers (signature secrets, API settings, the bounds their delivery
//! rules set) run where the providers are assembled (`app::check`).
//! [`Config::problems`] reports every mistake the data alone shows, each
//! with its key path: each section checks its own values.

mod admin;
mod kafka;
mod ledger;
mod read;
mod reconcile;
pub mod redact;
mod registry;
mod server;
mod source;
pub mod source_files;
mod spool;
mod telemetry;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::event::{ProviderKind, Source};

pub use admin::AdminConfig;
pub use kafka::{
    KafkaConfig, collision_name, dead_letter_of, entity_topic, prefixes_nest, topic_prefix_problem,
    topics_of_prefix,
};
pub use ledger::{LedgerBackend, LedgerConfig};
pub use read::{ENV_PREFIX, ENV_SEPARATOR, LIBRDKAFKA_ENV_PREFIX};
pub use reconcile::{MIN_BODY_BYTES, ReconcileConfig, WatchdogConfig};
pub use registry::RegistryConfig;
pub use server::ServerConfig;
pub use source::{ApiSection, OnBrokerUnavailable, ProviderConfig, Secrets, SourceConfig};
pub use spool::SpoolConfig;
pub use telemetry::{OtlpConfig, TelemetryConfig};

/// The longest window or interval the reconciler and watchdog take: far
/// beyond any real need, and well inside what time arithmetic can hold.
const LONGEST_WINDOW: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A serde default for switches that are on unless turned off.
const fn default_true() -> bool {
    true
}

/// What a value past [`LONGEST_WINDOW`] is told.
fn longest_window_message() -> String {
    format!("must be at most {} (ten years)", LONGEST_WINDOW.as_secs())
}

/// Why the configuration could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is missing or is not valid TOML, or a value has the wrong type.
    #[error("cannot read configuration: {0}")]
    Read(#[from] config::ConfigError),
    /// The file parsed, but some values are wrong; each problem names its key.
    #[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// One mistake in the configuration, named by its key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted key path, e.g. `mekari.sources.main.secrets`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Problem {
    /// A problem at `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Problem {
        Problem {
            key: key.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP listener and answer policy.
    #[serde(default)]
    pub server: ServerConfig,
    /// Broker, topics, producer settings.
    #[serde(default)]
    pub kafka: KafkaConfig,
    /// Confluent Schema Registry; absent means registry-less single-object encoding.
    #[serde(default)]
    pub schema_registry: RegistryConfig,
    /// Where delivery ids and entity versions are kept.
    #[serde(default)]
    pub ledger: LedgerConfig,
    /// ReceiptRoller webhooks.
    #[serde(default)]
    pub receiptroller: ProviderConfig,
    /// Mekari POS webhooks.
    #[serde(default)]
    pub mekari: ProviderConfig,
    /// A directory of more sources, one file each (`{provider}.{source}.toml`),
    /// read at start and while running ([`source_files`]).
    #[serde(default)]
    pub sources_dir: Option<std::path::PathBuf>,
    /// Catching up from the providers' APIs.
    #[serde(default)]
    pub reconcile: ReconcileConfig,
    /// Watching that the providers still send to us.
    #[serde(default)]
    pub watchdog: WatchdogConfig,
    /// The outage spool of sources with `on_broker_unavailable = "spool"`.
    #[serde(default)]
    pub spool: SpoolConfig,
    /// The operator's status page.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Traces (OpenTelemetry over OTLP); off by default.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
}

/// One configured source, as [`Config::sources`] yields it.
#[derive(Debug, Clone, Copy)]
pub struct SourceEntry<'a> {
    /// Its provider.
    pub provider: ProviderKind,
    /// Its name, the `{source}` in the URL.
    pub name: &'a str,
    /// Its settings.
    pub config: &'a SourceConfig,
}

impl SourceEntry<'_> {
    /// Its key path in the file, for problems: `mekari.sources.main`.
    pub fn key(&self) -> String {
        format!("{}.sources.{}", self.provider, self.name)
    }

    /// Its identity, as deliveries and reconciled records carry it.
    pub fn source(&self) -> Source {
        Source {
            provider: self.provider,
            name: self.name.to_owned(),
            account: self.config.account.clone(),
            topic_prefix: self.config.topic_prefix.as_deref().map(Arc::from),
        }
    }
}

impl Config {
    /// The sources of one provider: the one place a provider's name maps to
    /// its section of the file.
    pub fn provider(&self, provider: ProviderKind) -> &ProviderConfig {
        match provider {
            ProviderKind::ReceiptRoller => &self.receiptroller,
            ProviderKind::Mekari => &self.mekari,
        }
    }

    /// The largest record posbridge writes, set as the producer's
    /// `message.max.bytes` and the created topics' `max.message.bytes`:
    /// `kafka.librdkafka."message.max.bytes"` when set (check-config makes
    /// sure it holds every accepted event), else what the largest accepted
    /// body needs. A record still refused (an older topic, a broker limit)
    /// is dead-lettered, cut if need be: a permanent outcome either way.
    pub fn max_record_bytes(&self) -> usize {
        self.kafka
            .librdkafka
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| self.record_bytes_needed())
    }

    /// Room for an event's record at `server.body_limit_bytes`: the raw body
    /// once, its normalized fields (never longer than the JSON they came
    /// from), and the envelope.
    fn record_bytes_needed(&self) -> usize {
        2 * self.server.body_limit_bytes + kafka::RECORD_ENVELOPE_BYTES
    }

    /// Whether any source spools deliveries Kafka cannot take: then the spool
    /// is opened and drained. With a sources directory, always: a source
    /// that spools may appear in it while posbridge runs.
    pub fn spools(&self) -> bool {
        self.sources_dir.is_some()
            || self
                .sources()
                .any(|entry| entry.config.on_broker_unavailable == OnBrokerUnavailable::Spool)
    }

    /// Every configured source of every provider, with its key path
    /// (`mekari.sources.main`): the one loop over sources that start-up,
    /// the checks and the reconciler share.
    pub fn sources(&self) -> impl Iterator<Item = SourceEntry<'_>> {
        ProviderKind::ALL.into_iter().flat_map(move |provider| {
            self.provider(provider)
                .sources
                .iter()
                .map(move |(name, config)| SourceEntry {
                    provider,
                    name,
                    config,
                })
        })
    }

    /// Every mistake the data alone shows, each with its key path: each
    /// section's own, then what two sections must agree on. Empty means
    /// valid. What the providers' delivery rules ask of the settings is
    /// checked in `app::check`, with them.
    pub fn problems(&self) -> Vec<Problem> {
        let sources = self.sources().flat_map(|entry| {
            let key = entry.key();
            entry.config.problems(&key, entry.name)
        });
        self.server
            .problems()
            .into_iter()
            .chain(self.admin.problems())
            .chain(self.telemetry.otlp.problems())
            .chain(
                self.kafka
                    .problems(self.record_bytes_needed(), self.server.body_limit_bytes),
            )
            .chain(self.schema_registry.problems())
            .chain(self.ledger.problems())
            .chain(sources)
            .chain(self.reconcile.problems())
            .chain(self.watchdog.problems())
            .chain(self.spool.problems())
            .chain(self.across_sections())
            .map(|(key, message)| Problem::new(key, message))
            .collect()
    }

    /// What two sections must agree on.
    fn across_sections(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if let Some(listen) = &self.admin.listen {
            let admin = listen.parse::<std::net::SocketAddr>();
            if admin.is_err() {
                problems.push((
                    "admin.listen".to_owned(),
                    format!("`{listen}` is not an address like 127.0.0.1:9090"),
                ));
            } else if let (Ok(admin), Ok(server)) = (admin, self.server.listen.parse())
                && listeners_collide(admin, server)
            {
                problems.push((
                    "admin.listen".to_owned(),
                    "takes the same port as server.listen: the status page needs a listener of its own"
                        .to_owned(),
                ));
            }
        }
        if self.spools() && self.ledger.embedded_file_is(&self.spool.path) {
            problems.push((
                "spool.path".to_owned(),
                format!(
                    "`{}` is ledger.path too; the spool and the embedded ledger need a file each (one process may hold a file once)",
                    self.spool.path.display()
                ),
            ));
        }
        // Each source's own topics are its own: by the name Kafka tells
        // them apart by, no two sources give the same topic.
        let mut own_topics = std::collections::BTreeMap::new();
        for entry in self.sources() {
            let Some(prefix) = entry.config.topic_prefix.as_deref() else {
                continue;
            };
            if let Some(why) = self.kafka.shared_topic_clash(prefix) {
                problems.push((format!("{}.topic_prefix", entry.key()), why));
                continue;
            }
            let taken = kafka::topics_of_prefix(prefix)
                .into_iter()
                .find_map(|topic| {
                    own_topics
                        .insert(kafka::collision_name(&topic), entry.key())
                        .filter(|owner| *owner != entry.key())
                });
            if let Some(owner) = taken {
                problems.push((
                    format!("{}.topic_prefix", entry.key()),
                    format!("gives a topic {owner}'s topic_prefix gives too (or a name Kafka takes for it, `.` and `_` alike): each source's own topics are its own"),
                ));
            } else if let Some(owner) = self
                .sources()
                .take_while(|other| other.key() != entry.key())
                .find(|other| {
                    other
                        .config
                        .topic_prefix
                        .as_deref()
                        .is_some_and(|p| prefixes_nest(prefix, p))
                })
            {
                problems.push((
                    format!("{}.topic_prefix", entry.key()),
                    format!("its topics and {}'s would be inside one another's pattern: a subscriber to one source's topics would read the other's records and raw dead letters", owner.key()),
                ));
            }
        }
        if self.sources().next().is_none() && self.sources_dir.is_none() {
            problems.push((
                "receiptroller.sources / mekari.sources".to_owned(),
                "no webhook source is configured (nor a sources_dir); every request would get 404"
                    .to_owned(),
            ));
        }
        problems
    }
}

fn listeners_collide(a: std::net::SocketAddr, b: std::net::SocketAddr) -> bool {
    use std::net::IpAddr;
    let covers = |wide: IpAddr, other: IpAddr| match wide {
        IpAddr::V6(ip) => ip.is_unspecified(),
        IpAddr::V4(ip) => ip.is_unspecified() && other.is_ipv4(),
    };
    // `[::ffff:127.0.0.1]` is 127.0.0.1.
    let (a_ip, b_ip) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() == b.port()
        && a.port() != 0
        && (a_ip == b_ip || covers(a_ip, b_ip) || covers(b_ip, a_ip))
}

#[cfg(test)]
mod tests;
