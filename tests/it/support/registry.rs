//! The real schema registry `scripts/test` started: Apicurio Registry 3.3
//! (in-memory, global compatibility BACKWARD), spoken to through its
//! Confluent-compatible API at `POSBRIDGE_TEST_REGISTRY`. Tests keep apart
//! by subject: every topic prefix is new.

use reqwest::StatusCode;
use serde_json::{Value, json};

/// The first released schema (schemas/history/): what an older posbridge
/// registered and wrote.
pub const V1_SCHEMA: &str = include_str!("../../../schemas/history/pos_event.v1.avsc");

/// The registry's Confluent-compatible base URL.
pub fn registry_url() -> String {
    std::env::var("POSBRIDGE_TEST_REGISTRY")
        .expect("POSBRIDGE_TEST_REGISTRY (Apicurio's /apis/ccompat/v7 URL) is set by scripts/test")
}

/// The shared registry, as a client of the test.
pub struct Registry {
    /// What goes into `schema_registry.url`.
    pub url: String,
    http: reqwest::Client,
}

impl Registry {
    /// The registry `scripts/test` started.
    pub fn shared() -> Registry {
        Registry {
            url: registry_url(),
            http: reqwest::Client::new(),
        }
    }

    /// Registers an Avro schema under `subject`, as a CI job would: the
    /// registry's status (200, or 409 for a schema that cannot read the
    /// subject's latest version).
    pub async fn register(&self, subject: &str, schema: &str) -> StatusCode {
        self.http
            .post(format!("{}/subjects/{subject}/versions", self.url))
            .json(&json!({ "schema": schema }))
            .send()
            .await
            .unwrap()
            .status()
    }

    /// How many versions `subject` holds (0 for an unknown subject).
    pub async fn versions(&self, subject: &str) -> usize {
        let response = self
            .http
            .get(format!("{}/subjects/{subject}/versions", self.url))
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::NOT_FOUND {
            return 0;
        }
        let versions: Vec<Value> = response.json().await.unwrap();
        versions.len()
    }

    /// The id of `subject`'s latest version, if any.
    pub async fn id_of(&self, subject: &str) -> Option<u32> {
        let response = self
            .http
            .get(format!("{}/subjects/{subject}/versions/latest", self.url))
            .send()
            .await
            .unwrap();
        if !response.status().is_success() {
            return None;
        }
        let latest: Value = response.json().await.unwrap();
        latest["id"].as_u64().map(|id| id as u32)
    }
}
