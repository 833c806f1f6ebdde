//! One delivery on the wire: the signed request ([`Outgoing::signed`]), one
//! HTTP attempt of it ([`attempt`]) and what came back ([`Answer`]).
//!
//! Both providers sign the body with HMAC-SHA256 and send the same body and
//! headers on every attempt; signing goes through posbridge's own
//! `verify::sign` with each provider's default scheme and header, so the
//! signatures match what posbridge checks by construction. Every attempt is
//! counted on its event's record.

use bytes::Bytes;
use posbridge::adapters::providers;
use posbridge::domain::event::ProviderKind;
use posbridge::domain::verify::sign;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use tracing::debug;

use crate::state::Sim;
use crate::truth::Happened;

/// One signed delivery, ready to be attempted as often as the rules say.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Index of its [`EventRecord`](crate::state::EventRecord).
    pub index: usize,
    /// Who sends it.
    pub provider: ProviderKind,
    /// Its delivery id.
    pub delivery_id: String,
    /// The body, identical on every attempt.
    pub body: Bytes,
    /// Delivery id and signature headers, identical on every attempt.
    pub headers: Vec<(String, String)>,
}

impl Outgoing {
    /// Signs a happened event the way its provider does.
    pub fn signed(sim: &Sim, index: usize, happened: &Happened) -> Outgoing {
        // Signed exactly as posbridge's defaults for the provider expect.
        let provider = providers::for_kind(happened.provider);
        let secret = match happened.provider {
            ProviderKind::ReceiptRoller => &sim.settings.receiptroller_secret,
            ProviderKind::Mekari => &sim.settings.mekari_secret,
        };
        let mut headers = sign(
            provider.default_scheme(),
            provider.default_signature_header(),
            secret,
            &happened.delivery_id,
            happened.at.unix_timestamp(),
            &happened.body,
        );
        let id_header = provider.delivery_id_header();
        headers.push((id_header.to_owned(), happened.delivery_id.clone()));
        Outgoing {
            index,
            provider: happened.provider,
            delivery_id: happened.delivery_id.clone(),
            body: happened.body.clone(),
            headers,
        }
    }
}

/// What one HTTP attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status, with `Retry-After` when it was whole seconds.
    Status {
        /// The status code.
        code: u16,
        /// `Retry-After` in seconds; a date value is ignored.
        retry_after: Option<u64>,
    },
    /// Connection error or no answer within 10 s (delivery logs show 0).
    NoAnswer,
}

impl Answer {
    /// A 2xx.
    pub fn is_success(self) -> bool {
        matches!(self, Answer::Status { code, .. } if (200..300).contains(&code))
    }

    /// The status as a delivery log shows it: 0 for no answer.
    pub fn code(self) -> u16 {
        match self {
            Answer::Status { code, .. } => code,
            Answer::NoAnswer => 0,
        }
    }
}

/// One HTTP attempt of a delivery.
pub async fn attempt(sim: &Sim, out: &Outgoing) -> Answer {
    // The semaphore is never closed, so acquiring cannot fail.
    let _permit = sim.permits.acquire().await.ok();
    let url = match out.provider {
        ProviderKind::ReceiptRoller => &sim.settings.receiptroller_url,
        ProviderKind::Mekari => &sim.settings.mekari_url,
    };
    let mut request = sim
        .client
        .post(url)
        .header(CONTENT_TYPE, "application/json")
        .body(out.body.clone());
    for (name, value) in &out.headers {
        request = request.header(name, value);
    }
    let answer = match request.send().await {
        Ok(response) => {
            let retry_after = response
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let code = response.status().as_u16();
            // Read the body so the connection can be reused; its content is
            // ignored, as both providers do.
            let _ = response.bytes().await;
            Answer::Status { code, retry_after }
        }
        Err(error) => {
            debug!(delivery_id = %out.delivery_id, %error, "No answer.");
            Answer::NoAnswer
        }
    };
    sim.record(out.index, |r| {
        r.attempts += 1;
        r.failed_attempts += u32::from(!answer.is_success());
        r.unanswered_attempts += u32::from(answer == Answer::NoAnswer);
        r.last_status = Some(answer.code());
    });
    answer
}
