//! Reading a configuration: the TOML file and the `POSBRIDGE__…`
//! environment overrides, one reader for the service and its tests.

use std::path::Path;

use super::{Config, ConfigError};

/// Environment variables with this prefix override file keys.
pub const ENV_PREFIX: &str = "POSBRIDGE";
/// Separates the prefix and the path segments of an override.
pub const ENV_SEPARATOR: &str = "__";
/// Variables that start so (in any case) set one `kafka.librdkafka`
/// property each, named by the rest of the variable's name as librdkafka
/// spells it, dots and all (`…__sasl.password`; lower-cased). The config
/// crate would read those dots as a deeper path, so they are taken apart
/// from the other overrides: an orchestrator's secret (a Kubernetes Secret)
/// can then hold the Kafka password without a file.
pub const LIBRDKAFKA_ENV_PREFIX: &str = "POSBRIDGE__KAFKA__LIBRDKAFKA__";

impl Config {
    /// Reads the file (when given) and the environment overrides, without
    /// validating: `app::load` adds every check, and `check-config` reports
    /// them itself.
    ///
    /// # Errors
    /// [`ConfigError::Read`] when the file cannot be read or has a key of the
    /// wrong type or an unknown key.
    pub fn read(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::read_with_env(path, std::env::vars_os())
    }

    /// [`Config::read`] with the given variables instead of the process's
    /// environment: the one reader, so tests see what the service does.
    pub(super) fn read_with_env(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    ) -> Result<Config, ConfigError> {
        let mut overrides = config::Map::new();
        let mut librdkafka = Vec::new();
        for (name, value) in env {
            // The config crate skips names that are not Unicode, too.
            let (Ok(name), Some(value)) = (name.into_string(), value.to_str()) else {
                continue;
            };
            match name.get(..LIBRDKAFKA_ENV_PREFIX.len()) {
                Some(head) if head.eq_ignore_ascii_case(LIBRDKAFKA_ENV_PREFIX) => {
                    let property = name[LIBRDKAFKA_ENV_PREFIX.len()..].to_lowercase();
                    librdkafka.push((property, value.to_owned()));
                }
                _ => {
                    overrides.insert(name, value.to_owned());
                }
            }
        }
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            builder = builder.add_source(
                config::File::from(path)
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        let built = builder
            .add_source(
                config::Environment::with_prefix(ENV_PREFIX)
                    .prefix_separator(ENV_SEPARATOR)
                    .separator(ENV_SEPARATOR)
                    .source(Some(overrides)),
            )
            .build()?;
        let mut config: Config = built.try_deserialize()?;
        config.kafka.librdkafka.extend(librdkafka);
        Ok(config)
    }

    /// Reads a configuration from TOML text alone, without environment
    /// overrides: for tests and programs that embed posbridge.
    ///
    /// # Errors
    /// [`ConfigError::Read`] as for [`Config::read`].
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Ok(config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .build()?
            .try_deserialize()?)
    }
}
