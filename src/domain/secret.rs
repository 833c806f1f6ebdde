//! A secret value (a webhook signing secret, an API or registry password)
//! kept out of every `Debug` output, so no log line can carry one.

use std::fmt;

use serde::Deserialize;

/// A secret value whose `Debug` never shows it, so it cannot reach logs.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret read from elsewhere than the configuration (a secrets file).
    pub fn new(secret: String) -> Secret {
        Secret(secret)
    }

    /// The secret itself; call only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}
