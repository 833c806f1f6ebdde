//! Signature verification over the raw body bytes, before anything parses them.
//!
//! Each configured source has a [`Verifier`]: a scheme, the header it reads
//! and every secret that may sign (several during a rotation). Comparisons are
//! constant-time (`Mac::verify_slice`). Only a verified body becomes a
//! [`VerifiedBody`], so no later stage can be reached without passing here.
//!
//! The secrets can change while serving ([`Verifier::replace`], from
//! `adapters::secrets::watch`): the set is swapped whole (`arc-swap`), so a request
//! takes no lock and a check in progress keeps the set it began with.

use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use serde::Deserialize;

use crate::domain::secret::Secret;

/// The signature schemes a source can be configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchemeName {
    /// Hex HMAC-SHA256 of the body, optionally prefixed `sha256=` (GitHub-style;
    /// ReceiptRoller's default).
    Hex,
    /// Base64 HMAC-SHA256 of the body (Shopify-style; Mekari's default).
    Base64,
    /// `t=<unix>,v1=<hex>` over `{t}.{body}`, with a time tolerance.
    Stripe,
    /// Standard Webhooks: `v1,<base64>` over `{id}.{timestamp}.{body}`, `whsec_` secrets.
    StandardWebhooks,
}

type HmacSha256 = Hmac<Sha256>;

/// Header of the Stripe-style scheme.
pub const STRIPE_SIGNATURE_HEADER: &str = "stripe-signature";
/// Standard Webhooks: the message id header.
pub const STANDARD_ID_HEADER: &str = "webhook-id";
/// Standard Webhooks: the signed unix time header.
pub const STANDARD_TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// Standard Webhooks: the signature list header.
pub const STANDARD_SIGNATURE_HEADER: &str = "webhook-signature";
/// Standard Webhooks secrets carry this prefix before their base64 key.
const STANDARD_SECRET_PREFIX: &str = "whsec_";

impl SchemeName {
    /// The header this scheme reads when the source names none and the
    /// provider's default does not apply (timestamped schemes fix their own).
    pub fn fixed_header(self) -> Option<&'static str> {
        match self {
            SchemeName::Hex | SchemeName::Base64 => None,
            SchemeName::Stripe => Some(STRIPE_SIGNATURE_HEADER),
            SchemeName::StandardWebhooks => Some(STANDARD_SIGNATURE_HEADER),
        }
    }

    /// The HMAC key a secret stands for under this scheme.
    ///
    /// # Errors
    /// [`SecretError`] when the secret does not have the form the scheme needs.
    pub fn key(self, secret: &str) -> Result<Vec<u8>, SecretError> {
        match self {
            SchemeName::StandardWebhooks => standard_key(secret),
            _ if secret.len() < MIN_SECRET_LEN => Err(SecretError::TooShort),
            _ => Ok(secret.as_bytes().to_vec()),
        }
    }
}

/// Shortest secret accepted for the plain HMAC schemes: a shorter one is a
/// placeholder or a typo, not a key.
const MIN_SECRET_LEN: usize = 8;

/// Why a configured secret cannot be a key for its scheme.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Plain HMAC secrets need at least [`MIN_SECRET_LEN`] characters.
    #[error("secret is shorter than {MIN_SECRET_LEN} characters")]
    TooShort,
    /// Standard Webhooks secrets carry the `whsec_` prefix.
    #[error("standard-webhooks secrets start with `whsec_`")]
    MissingPrefix,
    /// What follows `whsec_` is not base64.
    #[error("standard-webhooks secret is not base64 after `whsec_`")]
    NotBase64(#[source] base64::DecodeError),
}

fn standard_key(secret: &str) -> Result<Vec<u8>, SecretError> {
    let encoded = secret
        .strip_prefix(STANDARD_SECRET_PREFIX)
        .ok_or(SecretError::MissingPrefix)?;
    BASE64.decode(encoded).map_err(SecretError::NotBase64)
}

/// Why a signature was refused. Every variant means 401 and nothing stored.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// The signature header (or a header the scheme signs) is absent.
    #[error("missing header {0}")]
    MissingHeader(String),
    /// A header is present but not in the scheme's format.
    #[error("malformed signature header: {0}")]
    Malformed(&'static str),
    /// The signed timestamp is outside the configured tolerance (replay guard).
    #[error("signature timestamp outside tolerance")]
    Expired,
    /// No configured secret produced any of the given signatures.
    #[error("signature does not match any configured secret")]
    Mismatch,
}

/// Verifies one source's deliveries. Built once at start-up from its config.
#[derive(Clone)]
pub struct Verifier {
    /// The scheme.
    scheme: SchemeName,
    /// Lower-cased signature header name (hex/base64/stripe).
    header: String,
    /// HMAC keys, one per secret in use, already decoded; shared by every
    /// clone, so the secret files' watcher replaces them for the handler.
    keys: Arc<ArcSwap<Vec<Vec<u8>>>>,
    /// Allowed distance between a signed timestamp and now, in seconds.
    tolerance_secs: i64,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field("header", &self.header)
            .field(
                "keys",
                &format_args!("[{} redacted]", self.keys.load().len()),
            )
            .finish()
    }
}

/// A body whose signature was checked. Only [`Verifier::verify`] makes one
/// (and the spool and the dead-letter replay give back what it accepted).
#[derive(Debug, Clone)]
pub struct VerifiedBody(Bytes);

impl VerifiedBody {
    /// The raw bytes exactly as signed.
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// A body read back from the outage spool, which takes only bodies
    /// [`Verifier::verify`] accepted: the one other way to make one.
    pub(crate) fn from_spool(bytes: Bytes) -> VerifiedBody {
        VerifiedBody(bytes)
    }

    /// A webhook body read back from posbridge's own dead-letter topic, which
    /// holds bodies [`Verifier::verify`] accepted on arrival (the signature
    /// headers are not kept, so it cannot be checked again).
    pub(crate) fn from_dead_letter(bytes: Bytes) -> VerifiedBody {
        VerifiedBody(bytes)
    }
}

impl Verifier {
    /// Builds a verifier. `header` is the source's header or the provider's default.
    ///
    /// # Errors
    /// [`SecretError`] with the index of the first secret that does not fit
    /// the scheme (see [`SchemeName::key`]).
    pub fn new(
        scheme: SchemeName,
        header: &str,
        secrets: &[Secret],
        tolerance_secs: u64,
    ) -> Result<Verifier, (usize, SecretError)> {
        Ok(Verifier {
            scheme,
            header: header.to_ascii_lowercase(),
            keys: Arc::new(ArcSwap::from_pointee(keys(scheme, secrets)?)),
            tolerance_secs: i64::try_from(tolerance_secs).unwrap_or(i64::MAX),
        })
    }

    /// Puts `secrets` in use instead of the current ones, for this verifier
    /// and all its clones: a delivery checked from now on may be signed by
    /// any of them and by no other. Nothing changes when one does not fit.
    ///
    /// # Errors
    /// As [`Verifier::new`].
    pub fn replace(&self, secrets: &[Secret]) -> Result<KeyChange, (usize, SecretError)> {
        let new = keys(self.scheme, secrets)?;
        let old = self.keys.load();
        let change = KeyChange {
            added: new.iter().filter(|key| !old.contains(key)).count(),
            removed: old.iter().filter(|key| !new.contains(key)).count(),
            in_use: new.len(),
        };
        if change.changed() {
            self.keys.store(Arc::new(new));
        }
        Ok(change)
    }

    /// How many secrets are in use.
    pub fn secrets_in_use(&self) -> usize {
        self.keys.load().len()
    }

    /// Checks the signature of `body` against every configured secret.
    /// `now_unix` is passed in so tolerance is testable.
    ///
    /// # Errors
    /// A [`VerifyError`] saying why the delivery is refused.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: Bytes,
        now_unix: i64,
    ) -> Result<VerifiedBody, VerifyError> {
        match self.scheme {
            SchemeName::Hex => {
                let value = header(headers, &self.header)?;
                let hex_sig = value.strip_prefix("sha256=").unwrap_or(value);
                let sig =
                    hex::decode(hex_sig.trim()).map_err(|_| VerifyError::Malformed("not hex"))?;
                self.check(&[&body], &[sig])?;
            }
            SchemeName::Base64 => {
                let value = header(headers, &self.header)?;
                let sig = BASE64
                    .decode(value.trim())
                    .map_err(|_| VerifyError::Malformed("not base64"))?;
                self.check(&[&body], &[sig])?;
            }
            SchemeName::Stripe => {
                let value = header(headers, &self.header)?;
                let mut timestamp = None;
                let mut sigs = Vec::new();
                for part in value.split(',') {
                    match part.trim().split_once('=') {
                        Some(("t", t)) => timestamp = Some(t),
                        Some(("v1", sig)) => sigs.push(
                            hex::decode(sig).map_err(|_| VerifyError::Malformed("v1 not hex"))?,
                        ),
                        _ => {}
                    }
                }
                let timestamp = timestamp.ok_or(VerifyError::Malformed("no t="))?;
                self.check_time(timestamp, now_unix)?;
                self.check(&[timestamp.as_bytes(), b".", &body], &sigs)?;
            }
            SchemeName::StandardWebhooks => {
                let id = header(headers, STANDARD_ID_HEADER)?;
                let timestamp = header(headers, STANDARD_TIMESTAMP_HEADER)?;
                self.check_time(timestamp, now_unix)?;
                let sigs = header(headers, STANDARD_SIGNATURE_HEADER)?
                    .split_whitespace()
                    .filter_map(|s| s.strip_prefix("v1,"))
                    .map(|s| BASE64.decode(s))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| VerifyError::Malformed("v1 not base64"))?;
                self.check(
                    &[id.as_bytes(), b".", timestamp.as_bytes(), b".", &body],
                    &sigs,
                )?;
            }
        }
        Ok(VerifiedBody(body))
    }

    fn check_time(&self, timestamp: &str, now_unix: i64) -> Result<(), VerifyError> {
        let signed: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| VerifyError::Malformed("timestamp not an integer"))?;
        if (now_unix - signed).abs() > self.tolerance_secs {
            return Err(VerifyError::Expired);
        }
        Ok(())
    }

    /// Accepts when any key's MAC over `parts` equals any candidate signature.
    fn check(&self, parts: &[&[u8]], candidates: &[Vec<u8>]) -> Result<(), VerifyError> {
        for key in self.keys.load().iter() {
            let mut mac = mac(key);
            for part in parts {
                mac.update(part);
            }
            if candidates
                .iter()
                .any(|sig| mac.clone().verify_slice(sig).is_ok())
            {
                return Ok(());
            }
        }
        Err(VerifyError::Mismatch)
    }
}

/// The keys `secrets` stand for under `scheme`, in order.
fn keys(scheme: SchemeName, secrets: &[Secret]) -> Result<Vec<Vec<u8>>, (usize, SecretError)> {
    secrets
        .iter()
        .enumerate()
        .map(|(i, s)| scheme.key(s.expose()).map_err(|e| (i, e)))
        .collect()
}

/// What [`Verifier::replace`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyChange {
    /// Secrets that were not in use before.
    pub added: usize,
    /// Secrets no longer in use.
    pub removed: usize,
    /// Secrets in use now.
    pub in_use: usize,
}

impl KeyChange {
    /// Whether any secret came or went.
    pub fn changed(&self) -> bool {
        self.added + self.removed > 0
    }
}

/// HMAC-SHA256 of the concatenated `parts`: the primitive every scheme here
/// and the providers' API authentication share.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = mac(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length; new_from_slice cannot fail for it.
    HmacSha256::new_from_slice(key).expect("HMAC accepts any key length")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, VerifyError> {
    headers
        .get(name)
        .ok_or_else(|| VerifyError::MissingHeader(name.to_owned()))?
        .to_str()
        .map_err(|_| VerifyError::Malformed("header is not ASCII"))
}

/// Signs a body the way a provider would: the headers to send with it. Used
/// by tests and the provider simulator, so both sign exactly as verified here.
pub fn sign(
    scheme: SchemeName,
    header: &str,
    secret: &str,
    message_id: &str,
    now_unix: i64,
    body: &[u8],
) -> Vec<(String, String)> {
    let hmac = hmac_sha256;
    let t = now_unix.to_string();
    match scheme {
        SchemeName::Hex => vec![(
            header.into(),
            format!("sha256={}", hex::encode(hmac(secret.as_bytes(), &[body]))),
        )],
        SchemeName::Base64 => vec![(
            header.into(),
            BASE64.encode(hmac(secret.as_bytes(), &[body])),
        )],
        SchemeName::Stripe => vec![(
            header.into(),
            format!(
                "t={t},v1={}",
                hex::encode(hmac(secret.as_bytes(), &[t.as_bytes(), b".", body]))
            ),
        )],
        SchemeName::StandardWebhooks => {
            let key = standard_key(secret).unwrap_or_default();
            let sig = hmac(
                &key,
                &[message_id.as_bytes(), b".", t.as_bytes(), b".", body],
            );
            vec![
                (STANDARD_ID_HEADER.into(), message_id.into()),
                (STANDARD_TIMESTAMP_HEADER.into(), t),
                (
                    STANDARD_SIGNATURE_HEADER.into(),
                    format!("v1,{}", BASE64.encode(sig)),
                ),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue};

    const NOW: i64 = 1_700_000_000;

    fn secret(s: &str) -> Secret {
        serde_json::from_value(serde_json::Value::String(s.into())).unwrap()
    }

    fn headers(pairs: &[(String, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(
                HeaderName::from_bytes(k.to_ascii_lowercase().as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn verifier(scheme: SchemeName, secrets: &[&str]) -> Verifier {
        let secrets: Vec<Secret> = secrets.iter().map(|s| secret(s)).collect();
        Verifier::new(
            scheme,
            scheme.fixed_header().unwrap_or("X-Sig"),
            &secrets,
            300,
        )
        .unwrap()
    }

    #[test]
    fn standard_webhooks_test_vector_verifies() {
        let v = verifier(
            SchemeName::StandardWebhooks,
            &["whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"],
        );
        let body = Bytes::from_static(br#"{"email":"test@example.com","username":"test_user"}"#);
        let h = headers(&[
            (
                "webhook-id".into(),
                "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk".into(),
            ),
            ("webhook-timestamp".into(), "1649367553".into()),
            (
                "webhook-signature".into(),
                "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=".into(),
            ),
        ]);
        assert!(v.verify(&h, body.clone(), 1_649_367_553).is_ok());
        assert_eq!(
            v.verify(&h, body, 1_649_367_553 + 301).unwrap_err(),
            VerifyError::Expired
        );
        let signed = sign(
            SchemeName::StandardWebhooks,
            "",
            "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD",
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk",
            1_649_367_553,
            br#"{"email":"test@example.com","username":"test_user"}"#,
        );
        assert_eq!(
            signed[2].1,
            "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw="
        );
    }

    #[test]
    fn every_scheme_accepts_its_own_signature_and_refuses_a_changed_body() {
        for scheme in [
            SchemeName::Hex,
            SchemeName::Base64,
            SchemeName::Stripe,
            SchemeName::StandardWebhooks,
        ] {
            let key = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=";
            let v = verifier(scheme, &[key]);
            let header_name = scheme.fixed_header().unwrap_or("X-Sig");
            let h = headers(&sign(scheme, header_name, key, "id1", NOW, b"body"));
            assert!(
                v.verify(&h, Bytes::from_static(b"body"), NOW).is_ok(),
                "{scheme:?}"
            );
            assert_eq!(
                v.verify(&h, Bytes::from_static(b"bodY"), NOW).unwrap_err(),
                VerifyError::Mismatch,
                "{scheme:?}"
            );
        }
    }

    #[test]
    fn any_of_several_secrets_may_sign() {
        let v = verifier(SchemeName::Hex, &["old-secret-1", "new-secret-2"]);
        let h = headers(&sign(
            SchemeName::Hex,
            "X-Sig",
            "new-secret-2",
            "",
            NOW,
            b"b",
        ));
        assert!(v.verify(&h, Bytes::from_static(b"b"), NOW).is_ok());
        let h = headers(&sign(
            SchemeName::Hex,
            "X-Sig",
            "other-secret",
            "",
            NOW,
            b"b",
        ));
        assert_eq!(
            v.verify(&h, Bytes::from_static(b"b"), NOW).unwrap_err(),
            VerifyError::Mismatch
        );
    }

    #[test]
    fn hex_accepts_a_bare_digest_and_refuses_garbage() {
        let v = verifier(SchemeName::Hex, &["secret-abc"]);
        let signed = sign(SchemeName::Hex, "X-Sig", "secret-abc", "", NOW, b"b");
        let bare = signed[0].1.trim_start_matches("sha256=").to_owned();
        let h = headers(&[("X-Sig".into(), bare)]);
        assert!(v.verify(&h, Bytes::from_static(b"b"), NOW).is_ok());
        let h = headers(&[("X-Sig".into(), "sha256=zz".into())]);
        assert_eq!(
            v.verify(&h, Bytes::from_static(b"b"), NOW).unwrap_err(),
            VerifyError::Malformed("not hex")
        );
        assert_eq!(
            v.verify(&HeaderMap::new(), Bytes::from_static(b"b"), NOW)
                .unwrap_err(),
            VerifyError::MissingHeader("x-sig".into())
        );
    }

    #[test]
    fn stripe_refuses_an_old_timestamp_and_accepts_one_of_several_v1() {
        let v = verifier(SchemeName::Stripe, &["stripe-secret"]);
        let signed = sign(
            SchemeName::Stripe,
            "stripe-signature",
            "stripe-secret",
            "",
            NOW,
            b"b",
        );
        let h = headers(&signed);
        assert_eq!(
            v.verify(&h, Bytes::from_static(b"b"), NOW + 1000)
                .unwrap_err(),
            VerifyError::Expired
        );
        let (t, v1) = signed[0].1.split_once(',').unwrap();
        let h = headers(&[(
            "stripe-signature".into(),
            format!("{t},v1={},{v1}", "00".repeat(32)),
        )]);
        assert!(v.verify(&h, Bytes::from_static(b"b"), NOW).is_ok());
    }
}
