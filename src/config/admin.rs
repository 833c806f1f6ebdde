//! The `[admin]` section: the operator's status page, on a listener of its
//! own so it can stay off the network the providers reach.

use serde::Deserialize;

use crate::domain::secret::Secret;

/// The shortest token or password a status page beyond loopback takes:
/// the page shows the whole pipeline and its replay actions.
const MIN_SECRET_CHARS: usize = 16;

/// The admin listener; off unless `listen` is set.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener (`/status`, `/status.json`); none: no
    /// status page.
    #[serde(default)]
    pub listen: Option<String>,
    /// A bearer token the page asks for (`Authorization: Bearer …`).
    #[serde(default)]
    pub token: Option<Secret>,
    /// Basic-auth user name the page asks for, with `password`.
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password.
    #[serde(default)]
    pub password: Option<Secret>,
}

impl AdminConfig {
    /// What the data alone shows is wrong: a user name without a password
    /// or the other way round, an empty credential, or a page anyone on the
    /// network could read (a listener beyond loopback without credentials,
    /// or with one short enough to guess).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let open = self.token.is_none() && self.username.is_none();
        let beyond_loopback = self
            .listen
            .as_deref()
            .and_then(|l| l.parse::<std::net::SocketAddr>().ok())
            .is_some_and(|addr| !addr.ip().to_canonical().is_loopback());
        if open && beyond_loopback {
            problems.push((
                "admin.listen".to_owned(),
                "listens beyond loopback without a token or username/password: set one, or bind it to 127.0.0.1".to_owned(),
            ));
        }
        if self.username.is_some() != self.password.is_some() {
            problems.push((
                "admin.username".to_owned(),
                "basic auth needs both `username` and `password`".to_owned(),
            ));
        }
        for (key, empty) in [
            (
                "admin.token",
                self.token.as_ref().is_some_and(|t| t.expose().is_empty()),
            ),
            (
                "admin.password",
                self.password
                    .as_ref()
                    .is_some_and(|p| p.expose().is_empty()),
            ),
        ] {
            if empty {
                problems.push((key.to_owned(), "must not be empty".to_owned()));
            }
        }
        if beyond_loopback {
            for (key, secret) in [
                ("admin.token", &self.token),
                ("admin.password", &self.password),
            ] {
                let chars = secret.as_ref().map_or(0, |s| s.expose().chars().count());
                if (1..MIN_SECRET_CHARS).contains(&chars) {
                    problems.push((
                        key.to_owned(),
                        format!(
                            "is {chars} character(s) long on a listener beyond loopback, where anyone on the network can try it: use at least {MIN_SECRET_CHARS} random characters (`openssl rand -hex 16` gives 32)"
                        ),
                    ));
                }
            }
        }
        problems
    }
}
