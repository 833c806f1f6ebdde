//! The checks that need provider knowledge, where the providers are
//! assembled: each source's secrets against its (provider's default) scheme,
//! and each `api` table against its provider's settings. `check-config` and
//! start-up run the same code that builds the running pieces.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::adapters::providers;
use crate::adapters::secrets::{self, LoadError};
use crate::config::{Config, ConfigError, OnBrokerUnavailable, Problem, SourceEntry};
use crate::domain::verify::Verifier;
use crate::http::ingress::{RequestMeters, SourceShare, WebhookSource};

/// Reads a configuration file with its environment overrides and checks it
/// completely: what the data alone shows and what the providers need.
///
/// # Errors
/// [`ConfigError::Read`] when the file cannot be read, [`ConfigError::Invalid`]
/// listing every problem [`problems`] finds.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let config = Config::read(Some(path))?;
    let problems = problems(&config);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// Where librdkafka's message names `name`: in double quotes (a single
/// property's refusal) or in backticks (a refusal weighing two).
fn named_at(message: &str, name: &str) -> Option<usize> {
    [format!("\"{name}\""), format!("`{name}`")]
        .iter()
        .filter_map(|quoted| message.find(quoted.as_str()))
        .min()
}

/// Every mistake in `config`, each with its key path. Empty means valid.
pub fn problems(config: &Config) -> Vec<Problem> {
    let mut problems = config.problems();
    problems.extend(delivery_rule_problems(config));
    if let Err(error) = crate::adapters::publish::validate(&config.kafka, config.max_record_bytes())
    {
        // librdkafka names the property it refuses: point at that key.
        let message = error.to_string();
        let refused = match &error {
            rdkafka::error::KafkaError::ClientConfig(_, _, key, _) => Some(key.clone()),
            _ => config
                .kafka
                .librdkafka
                .keys()
                .filter_map(|name| named_at(&message, name).map(|at| (at, name)))
                .min()
                .map(|(_, name)| name.clone()),
        };
        let key = refused.map_or_else(
            || "kafka.librdkafka".to_owned(),
            |name| format!("kafka.librdkafka.\"{name}\""),
        );
        problems.push(Problem::new(key, message));
    }
    for entry in config.sources() {
        problems.extend(source_problems(entry));
    }
    problems
}

/// What a source needs of its provider: its secrets (its files read) fit
/// its signature scheme, its `api` table its provider's settings. The main
/// file's sources and the sources directory's files are checked alike.
pub fn source_problems(entry: SourceEntry<'_>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let key = entry.key();
    let (scheme, _) = signature(entry);
    // The files are read as start-up reads them: a missing one stops it.
    match secrets::read(entry.config) {
        Err(error) => problems.push(Problem::new(
            format!("{key}.{}", error.key()),
            error.to_string(),
        )),
        Ok(found) => {
            for found in found {
                if let Err(error) = scheme.key(found.secret.expose()) {
                    let message = match &found.origin {
                        secrets::Origin::Inline(_) => error.to_string(),
                        origin => format!("{origin}: {error}"),
                    };
                    problems.push(Problem::new(
                        format!("{key}.{}", found.origin.key()),
                        message,
                    ));
                }
            }
        }
    }
    if let Some(api) = &entry.config.api {
        for (field, message) in providers::for_kind(entry.provider).api_problems(api) {
            let at = if field.is_empty() {
                format!("{key}.api")
            } else {
                format!("{key}.api.{field}")
            };
            problems.push(Problem::new(at, message));
        }
    }
    problems
}

/// What the providers' delivery rules ask of the settings, each against
/// the strictest provider: answers well inside the shortest answer limit,
/// done ids kept past the last retry of any, a `Retry-After` every one
/// honours.
fn delivery_rule_problems(config: &Config) -> Vec<Problem> {
    let rules = || {
        providers::ALL
            .iter()
            .map(|p| (p.kind(), p.delivery_rules()))
    };
    let mut problems = Vec::new();
    if let Some((name, limit)) = rules()
        .map(|(k, r)| (k, r.answer_timeout))
        .min_by_key(|(_, t)| *t)
    {
        for (key, ms) in [
            (
                "server.header_read_timeout_ms",
                config.server.header_read_timeout_ms,
            ),
            (
                "server.body_read_timeout_ms",
                config.server.body_read_timeout_ms,
            ),
        ] {
            if Duration::from_millis(ms) >= limit {
                problems.push(Problem::new(
                    key,
                    format!(
                        "must be well under {name}'s {} s answer limit",
                        limit.as_secs()
                    ),
                ));
            }
        }
        let budget = Duration::from_millis(config.kafka.delivery_timeout_ms)
            + Duration::from_millis(config.server.inflight_wait_ms);
        let room = limit.mul_f32(0.9);
        if budget >= room {
            problems.push(Problem::new(
                "kafka.delivery_timeout_ms",
                format!(
                    "delivery_timeout_ms + server.inflight_wait_ms = {} ms leaves no room inside {name}'s {} s answer limit; keep the sum under {}",
                    budget.as_millis(),
                    limit.as_secs(),
                    room.as_millis()
                ),
            ));
        }
    }
    if let Some((name, window)) = rules()
        .map(|(k, r)| (k, r.retry_window))
        .max_by_key(|(_, w)| *w)
        && Duration::from_secs(config.ledger.dedup_ttl_secs) <= window
    {
        problems.push(Problem::new(
            "ledger.dedup_ttl_secs",
            format!(
                "{} s is shorter than {name}'s retry window ({} s); a late retry would be published twice. Use at least {}",
                config.ledger.dedup_ttl_secs,
                window.as_secs(),
                window.as_secs() + 1
            ),
        ));
    }
    if let Some((name, longest)) = rules()
        .filter_map(|(k, r)| Some((k, r.longest_retry_after?)))
        .min_by_key(|(_, l)| *l)
    {
        for (key, secs) in [
            ("server.retry_after_secs", config.server.retry_after_secs),
            (
                "server.share_retry_after_secs",
                config.server.share_retry_after_secs,
            ),
        ] {
            if secs > longest.as_secs() {
                problems.push(Problem::new(
                    key,
                    format!(
                        "must be at most {} ({name} caps Retry-After there)",
                        longest.as_secs()
                    ),
                ));
            }
        }
    }
    problems
}

/// A source's scheme and signature header: its own, else the scheme's fixed
/// header, else the provider's defaults.
pub(super) fn signature(entry: SourceEntry<'_>) -> (crate::domain::verify::SchemeName, &str) {
    let defaults = providers::for_kind(entry.provider);
    let scheme = entry
        .config
        .scheme
        .unwrap_or_else(|| defaults.default_scheme());
    let header = entry
        .config
        .header
        .as_deref()
        .or(scheme.fixed_header())
        .unwrap_or(defaults.default_signature_header());
    (scheme, header)
}

/// Builds a source's webhook side: its identity and its verifier, with
/// the secrets of its configuration and its secret files.
///
/// # Errors
/// A [`LoadError`]: a secret file that cannot be read, or the first secret
/// that does not fit the scheme ([`problems`] reports all of them beforehand).
pub fn webhook_source(entry: SourceEntry<'_>) -> Result<WebhookSource, LoadError> {
    let (scheme, header) = signature(entry);
    let config = entry.config;
    let source = entry.source();
    let found = secrets::load(config, scheme)?;
    let verifier = Verifier::new(
        scheme,
        header,
        &secrets::secrets_of(&found),
        config.tolerance_secs,
    )
    .map_err(|refused| secrets::unfit(&found, refused))?;
    Ok(WebhookSource {
        verifier,
        spools: config.on_broker_unavailable == OnBrokerUnavailable::Spool,
        share: SourceShare::new(config.max_in_flight, config.max_per_second),
        meters: RequestMeters::register(&source),
        source: Arc::new(source),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_configs_are_valid() {
        for text in [
            include_str!("../../config/posbridge.example.toml"),
            // The only one with live `api` tables of both providers.
            include_str!("../../config/posbridge.demo.toml"),
            readme_configuration(),
        ] {
            assert_eq!(problems(&Config::from_toml(text).unwrap()), vec![]);
        }
    }

    /// The TOML block under the README's "A minimal configuration".
    fn readme_configuration() -> &'static str {
        let readme = include_str!("../../README.md");
        let section = readme
            .split("## A minimal configuration")
            .nth(1)
            .expect("the README has a minimal configuration");
        let block = section.split("```toml\n").nth(1).expect("a TOML block");
        block.split("```").next().unwrap()
    }

    /// The image's configuration carries no secrets: without them from the
    /// environment posbridge refuses to start, with them it is valid.
    #[test]
    fn the_container_config_needs_secrets_from_outside() {
        let mut config =
            Config::from_toml(include_str!("../../config/posbridge.container.toml")).unwrap();
        let keys: Vec<String> = problems(&config).into_iter().map(|p| p.key).collect();
        assert_eq!(
            keys,
            [
                "receiptroller.sources.main.secrets",
                "mekari.sources.main.secrets"
            ]
        );
        for provider in [&mut config.receiptroller, &mut config.mekari] {
            provider.sources.get_mut("main").unwrap().secrets =
                serde_json::from_value(serde_json::json!(["set-from-the-environment"])).unwrap();
        }
        assert_eq!(problems(&config), vec![]);
    }

    /// Secrets may come from files only; a source needs them from somewhere,
    /// and its files are read and checked as start-up reads them.
    #[test]
    fn a_source_may_take_its_secrets_from_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "rr-secret-1\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "rr-secret-1\nshort\n").unwrap();
        let mount = dir.path().join("mount");
        std::fs::create_dir(&mount).unwrap();
        std::fs::write(mount.join("current"), "rr-secret-2").unwrap();
        let keys = |source: &str| -> Vec<(String, String)> {
            let config = Config::from_toml(&format!(
                "[receiptroller.sources.main]\n{source}\n[mekari.sources.main]\nsecrets = [\"mekari-secret-1\"]\n"
            ))
            .unwrap();
            problems(&config)
                .into_iter()
                .map(|p| (p.key, p.message))
                .collect()
        };
        let path = |path: &std::path::Path| format!("{:?}", path.display().to_string());
        assert_eq!(keys(&format!("secrets_files = [{}]", path(&file))), []);
        assert_eq!(keys(&format!("secrets_dir = {}", path(&mount))), []);
        let refused = keys("scheme = \"hex\"");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "receiptroller.sources.main.secrets");
        assert!(refused[0].1.contains("secrets_files"), "{refused:?}");

        let missing = keys(&format!(
            "secrets_files = [{}, {}]",
            path(&file),
            path(&dir.path().join("missing"))
        ));
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].0, "receiptroller.sources.main.secrets_files[1]");
        let unfit = keys(&format!("secrets_files = [{}]", path(&short)));
        assert_eq!(unfit.len(), 1, "{unfit:?}");
        assert_eq!(unfit[0].0, "receiptroller.sources.main.secrets_files[0]");
        // By its key: its path is a value of the table, not repeated.
        assert!(
            !unfit[0].1.contains(&short.display().to_string()),
            "{unfit:?}"
        );
    }

    #[test]
    fn provider_mistakes_are_reported_with_their_keys() {
        let config = Config::from_toml(
            r#"
            [receiptroller.sources.main]
            secrets = ["short"]
            [receiptroller.sources.main.api]
            base_url = "https://rr.example"
            resume_when_off = true
            [receiptroller.sources.hooks]
            secrets = ["no-prefix"]
            scheme = "standard-webhooks"
            [mekari.sources.main]
            secrets = ["mekari-secret-1"]
            [mekari.sources.main.api]
            base_url = "not a url"
            client_id = "c"
            client_secret = "s"
            per_page = 0
            [mekari.sources.main.api.paths]
            order = "/orders"
            [mekari.sources.other]
            secrets = ["mekari-secret-1"]
            [mekari.sources.other.api]
            base_url = "https://m.example"
            client_id = "c"
            client_secret = "s"
            outlets = ["OUT-1"]
            colour = "blue"
            "#,
        )
        .unwrap();
        let found = problems(&config);
        let keys: Vec<&str> = found.iter().map(|p| p.key.as_str()).collect();
        for expected in [
            "receiptroller.sources.main.secrets[0]",
            "receiptroller.sources.main.api.token",
            "receiptroller.sources.main.api.webhook_id",
            "receiptroller.sources.hooks.secrets[0]",
            "mekari.sources.main.api.outlets",
            "mekari.sources.main.api.base_url",
            "mekari.sources.main.api.paths",
            "mekari.sources.main.api.per_page",
            "mekari.sources.other.api",
        ] {
            assert!(keys.contains(&expected), "{expected} in {keys:?}");
        }
        let unknown = found
            .iter()
            .find(|p| p.key == "mekari.sources.other.api")
            .unwrap();
        // A key of its own, perhaps a secret pasted there: not repeated.
        assert!(
            unknown.message.contains("a key it does not take"),
            "{unknown}"
        );
        assert!(!unknown.message.contains("colour"), "{unknown}");
    }

    /// Each setting the providers' rules bound is refused past the
    /// strictest provider's bound, at its key, and taken within it.
    #[test]
    fn the_providers_delivery_rules_bound_the_settings() {
        let keys = |settings: &str| {
            let config = Config::from_toml(&format!(
                "{settings}\n[mekari.sources.main]\nsecrets = [\"mekari-secret-1\"]\n"
            ))
            .unwrap();
            problems(&config)
                .into_iter()
                .map(|p| p.key)
                .collect::<Vec<_>>()
        };
        for (settings, key) in [
            (
                "[server]\nheader_read_timeout_ms = 10000",
                "server.header_read_timeout_ms",
            ),
            (
                "[server]\nbody_read_timeout_ms = 10000",
                "server.body_read_timeout_ms",
            ),
            (
                "[kafka]\ndelivery_timeout_ms = 6000",
                "kafka.delivery_timeout_ms",
            ),
            ("[ledger]\ndedup_ttl_secs = 39900", "ledger.dedup_ttl_secs"),
            (
                "[server]\nretry_after_secs = 3601",
                "server.retry_after_secs",
            ),
            (
                "[server]\nshare_retry_after_secs = 3601",
                "server.share_retry_after_secs",
            ),
        ] {
            assert_eq!(keys(settings), [key], "{settings}");
        }
        for settings in [
            "[server]\nheader_read_timeout_ms = 9000",
            "[kafka]\ndelivery_timeout_ms = 5999",
            "[ledger]\ndedup_ttl_secs = 39901",
            "[server]\nretry_after_secs = 3600",
            "[server]\nshare_retry_after_secs = 3600",
        ] {
            assert_eq!(keys(settings), Vec::<String>::new(), "{settings}");
        }
        let config = Config::from_toml(
            "[ledger]\ndedup_ttl_secs = 3600\n[mekari.sources.main]\nsecrets = [\"mekari-secret-1\"]\n",
        )
        .unwrap();
        let found = problems(&config);
        assert!(
            found[0].message.contains("mekari's retry window"),
            "{}",
            found[0]
        );
    }

    /// librdkafka itself judges its properties: an unknown one, a value it
    /// refuses; what it was built with (TLS, SASL, zstd) passes.
    #[test]
    fn librdkafka_refusals_are_problems_at_their_key() {
        let config = Config::from_toml(
            r#"
            [kafka.librdkafka]
            "security.protocol" = "SASL_SSL"
            "sasl.mechanism" = "SCRAM-SHA-512"
            "sasl.username" = "u"
            "sasl.password" = "p"
            "compression.type" = "zstd"
            [mekari.sources.main]
            secrets = ["mekari-secret-1"]
            "#,
        )
        .unwrap();
        assert_eq!(
            problems(&config),
            vec![],
            "TLS, SCRAM and zstd are built in"
        );
        for (property, value) in [("compression.type", "brotli"), ("no.such.property", "1")] {
            assert_eq!(
                the_one_problems_key(&with_librdkafka(&config, &[(property, value)])),
                format!("kafka.librdkafka.\"{property}\"")
            );
        }
    }

    /// `config` with these pass-through properties added.
    fn with_librdkafka(config: &Config, properties: &[(&str, &str)]) -> Config {
        let mut config = config.clone();
        for (property, value) in properties {
            config
                .kafka
                .librdkafka
                .insert((*property).into(), (*value).into());
        }
        config
    }

    /// The key of the one problem `config` has.
    fn the_one_problems_key(config: &Config) -> String {
        let found = problems(config);
        assert_eq!(found.len(), 1, "{found:?}");
        found[0].key.clone()
    }

    /// A refusal that weighs two properties (librdkafka quotes them in
    /// backticks) points at the first it names.
    #[test]
    fn a_refusal_naming_two_properties_is_at_the_first_it_names() {
        let config = Config::from_toml(
            r#"
            [mekari.sources.main]
            secrets = ["mekari-secret-1"]
            "#,
        )
        .unwrap();
        let config = with_librdkafka(
            &config,
            &[
                ("reconnect.backoff.ms", "2000"),
                ("reconnect.backoff.max.ms", "1500"),
            ],
        );
        assert_eq!(
            the_one_problems_key(&config),
            "kafka.librdkafka.\"reconnect.backoff.max.ms\""
        );
    }

    #[test]
    fn a_source_takes_its_providers_default_signature() {
        let config = Config::from_toml(
            r#"
            [mekari.sources.main]
            secrets = ["mekari-secret-1"]
            [mekari.sources.stripe]
            secrets = ["mekari-secret-1"]
            scheme = "stripe"
            "#,
        )
        .unwrap();
        let mut entries = config.sources();
        let main = entries.next().unwrap();
        assert_eq!(
            signature(main),
            (
                crate::domain::verify::SchemeName::Base64,
                "x-mekari-signature"
            )
        );
        let stripe = entries.next().unwrap();
        assert_eq!(
            signature(stripe),
            (
                crate::domain::verify::SchemeName::Stripe,
                "stripe-signature"
            )
        );
    }
}
