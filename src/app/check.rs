//! The checks that need provider knowledge, where the providers are
//! assembled: each source's secrets against its (provider's default) scheme,
//! and each `api` table against its provider's settings. `check-config` and
//! start-up run the same code that builds the running pieces.

use std::path::Path;
use std::sync::Arc;

use crate::config::{Config, ConfigError, OnBrokerUnavailable, Problem, SourceEntry};
use crate::ingress::{RequestMeters, WebhookSource};
use crate::providers;
use crate::verify::{SecretError, Verifier};

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

/// Every mistake in `config`, each with its key path. Empty means valid.
pub fn problems(config: &Config) -> Vec<Problem> {
    let mut problems = config.problems();
    if let Err(error) = crate::publish::validate(&config.kafka, config.max_record_bytes()) {
        // librdkafka names the property it refuses: point at that key.
        let message = error.to_string();
        let refused = match &error {
            rdkafka::error::KafkaError::ClientConfig(_, _, key, _) => Some(key.clone()),
            _ => config
                .kafka
                .librdkafka
                .keys()
                .find(|name| message.contains(&format!("\"{name}\"")))
                .cloned(),
        };
        let key = refused.map_or_else(
            || "kafka.librdkafka".to_owned(),
            |name| format!("kafka.librdkafka.\"{name}\""),
        );
        problems.push(Problem::new(key, message));
    }
    for entry in config.sources() {
        let key = entry.key();
        let (scheme, _) = signature(entry);
        for (i, secret) in entry.config.secrets.0.iter().enumerate() {
            if let Err(error) = scheme.key(secret.expose()) {
                problems.push(Problem::new(
                    format!("{key}.secrets[{i}]"),
                    error.to_string(),
                ));
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
    }
    problems
}

/// A source's scheme and signature header: its own, else the scheme's fixed
/// header, else the provider's defaults.
fn signature(entry: SourceEntry<'_>) -> (crate::config::SchemeName, &str) {
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

/// Builds a source's webhook side: its identity and its verifier.
///
/// # Errors
/// The index and [`SecretError`] of the first secret that does not fit the
/// scheme ([`problems`] reports all of them beforehand).
pub fn webhook_source(entry: SourceEntry<'_>) -> Result<WebhookSource, (usize, SecretError)> {
    let (scheme, header) = signature(entry);
    let config = entry.config;
    let source = entry.source();
    Ok(WebhookSource {
        verifier: Verifier::new(scheme, header, &config.secrets.0, config.tolerance_secs)?,
        spools: config.on_broker_unavailable == OnBrokerUnavailable::Spool,
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
        ] {
            assert_eq!(problems(&Config::from_toml(text).unwrap()), vec![]);
        }
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
        assert!(unknown.message.contains("colour"), "{unknown}");
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
            let mut config = config.clone();
            config
                .kafka
                .librdkafka
                .insert(property.into(), value.into());
            let found = problems(&config);
            assert_eq!(found.len(), 1, "{found:?}");
            assert_eq!(
                found[0].key,
                format!("kafka.librdkafka.\"{property}\""),
                "{found:?}"
            );
        }
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
            (crate::config::SchemeName::Base64, "x-mekari-signature")
        );
        let stripe = entries.next().unwrap();
        assert_eq!(
            signature(stripe),
            (crate::config::SchemeName::Stripe, "stripe-signature")
        );
    }
}
