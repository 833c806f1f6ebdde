//! The `[telemetry]` section: where traces go. Off unless
//! `[telemetry.otlp] endpoint` names a collector; off, no span is made and
//! no record carries a `traceparent`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::secret::Secret;

/// Telemetry beyond `/metrics`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OpenTelemetry traces over OTLP/HTTP.
    #[serde(default)]
    pub otlp: OtlpConfig,
}

/// One span per delivery, exported over OTLP/HTTP (protobuf).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP URL; a URL without a path gets the traces
    /// path `/v1/traces`. None: no traces.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `service.name` of every span.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// The share of traces started here that are sampled, 0 to 1. A
    /// request's `traceparent` decides for the trace it continues, so one
    /// trace is sampled everywhere or nowhere.
    #[serde(default = "default_sampling_ratio")]
    pub sampling_ratio: f64,
    /// How long one export request may take.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Headers of every export request (a collector's API key); values are
    /// secrets.
    #[serde(default)]
    pub headers: BTreeMap<String, Secret>,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: None,
            service_name: default_service_name(),
            sampling_ratio: default_sampling_ratio(),
            timeout_ms: default_timeout_ms(),
            headers: BTreeMap::new(),
        }
    }
}

/// The path of traces on an OTLP/HTTP collector.
const TRACES_PATH: &str = "/v1/traces";

impl OtlpConfig {
    /// Where spans are posted: the endpoint, with [`TRACES_PATH`] when it
    /// names no path; none when traces are off.
    pub fn traces_url(&self) -> Option<String> {
        let endpoint = self.endpoint.as_deref()?;
        // An http(s) URL without a path parses with the path `/`.
        Some(match url::Url::parse(endpoint) {
            Ok(url) if url.path() == "/" => {
                format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
            }
            _ => endpoint.to_owned(),
        })
    }

    /// How long one export request may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// What the data alone shows is wrong, each with its key.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |key: &str, message: String| {
            problems.push((format!("telemetry.otlp.{key}"), message));
        };
        if let Some(endpoint) = &self.endpoint {
            match url::Url::parse(endpoint) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
                _ => problem(
                    "endpoint",
                    format!(
                        "`{endpoint}` is not an http:// or https:// URL like http://collector:4318"
                    ),
                ),
            }
        }
        if self.service_name.trim().is_empty() {
            problem("service_name", "must not be empty".into());
        }
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            problem(
                "sampling_ratio",
                format!("{} is not between 0 and 1", self.sampling_ratio),
            );
        }
        if self.timeout_ms == 0 {
            problem("timeout_ms", "must be above 0".into());
        }
        for (name, value) in &self.headers {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                problem(
                    &format!("headers.{name}"),
                    "is not an HTTP header name".into(),
                );
            } else if axum::http::HeaderValue::from_str(value.expose()).is_err() {
                problem(
                    &format!("headers.{name}"),
                    "holds characters an HTTP header cannot".into(),
                );
            }
        }
        problems
    }
}

fn default_service_name() -> String {
    "posbridge".into()
}
// Every trace: a delivery is worth one span tree, and sampling is for
// volumes where the collector's cost counts.
const fn default_sampling_ratio() -> f64 {
    1.0
}
// OTLP's own default export timeout.
const fn default_timeout_ms() -> u64 {
    10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn otlp(endpoint: &str) -> OtlpConfig {
        OtlpConfig {
            endpoint: Some(endpoint.into()),
            ..OtlpConfig::default()
        }
    }

    #[test]
    fn a_bare_collector_address_gets_the_traces_path() {
        assert_eq!(OtlpConfig::default().traces_url(), None, "off by default");
        for (endpoint, url) in [
            ("http://c:4318", "http://c:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("https://c/otlp/v1/traces", "https://c/otlp/v1/traces"),
            ("http://c:4318/v1/traces", "http://c:4318/v1/traces"),
        ] {
            assert_eq!(
                otlp(endpoint).traces_url().as_deref(),
                Some(url),
                "{endpoint}"
            );
        }
    }

    #[test]
    fn each_mistake_is_named_by_its_key() {
        let keys = |otlp: &str| -> Vec<String> {
            let config =
                crate::config::Config::from_toml(&format!("[telemetry.otlp]\n{otlp}")).unwrap();
            config
                .telemetry
                .otlp
                .problems()
                .into_iter()
                .map(|(key, _)| key)
                .collect()
        };
        assert!(keys("endpoint = \"http://127.0.0.1:4318\"").is_empty());
        assert_eq!(
            keys("endpoint = \"collector:4318\""),
            ["telemetry.otlp.endpoint"]
        );
        assert_eq!(keys("endpoint = \"ftp://c\""), ["telemetry.otlp.endpoint"]);
        assert_eq!(
            keys(
                "service_name = \" \"\nsampling_ratio = 1.5\ntimeout_ms = 0\n\
                 headers = { \"bad name\" = \"v\", \"x-key\" = \"a\\nb\" }"
            ),
            [
                "telemetry.otlp.service_name",
                "telemetry.otlp.sampling_ratio",
                "telemetry.otlp.timeout_ms",
                "telemetry.otlp.headers.bad name",
                "telemetry.otlp.headers.x-key",
            ]
        );
    }
}
