//! The `[schema_registry]` section: where the schema is registered, and
//! how posbridge authenticates there.

use serde::Deserialize;

/// Confluent Schema Registry settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Registry base URL; when absent, records use Avro single-object encoding.
    #[serde(default)]
    pub url: Option<String>,
    /// Basic-auth user, when the registry needs one.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<crate::domain::secret::Secret>,
    /// Bearer token (`Authorization: Bearer …`), instead of basic auth.
    #[serde(default)]
    pub token: Option<crate::domain::secret::Secret>,
    /// PEM file of the CA that signed the registry's certificate, when it is
    /// not in the system's trust store.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Register the schema at start-up (`true`), or only look it up and
    /// refuse to start when it is not registered (`false`: registries where
    /// only CI registers schemas; see `posbridge schema check`).
    #[serde(default = "super::default_true")]
    pub auto_register: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            url: None,
            username: None,
            password: None,
            token: None,
            ca_file: None,
            auto_register: true,
        }
    }
}

impl RegistryConfig {
    /// The section's mistakes, as (key, what is wrong).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if self.token.is_some() && (self.username.is_some() || self.password.is_some()) {
            problems.push((
                "schema_registry.token".to_owned(),
                "a registry takes either a bearer token or basic auth (username/password), not both"
                    .to_owned(),
            ));
        }
        if let Some(file) = &self.ca_file
            && !file.is_file()
        {
            problems.push((
                "schema_registry.ca_file".to_owned(),
                format!("`{}` is not a readable file", file.display()),
            ));
        }
        if let Some(url) = &self.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            problems.push((
                "schema_registry.url".to_owned(),
                format!("`{url}` must start with http:// or https://"),
            ));
        }
        problems
    }
}
