//! Makes the planned events happen and hands each one to its provider's
//! delivery rules, with the planned faults.
//!
//! Events happen at an even pace over `--spread-secs` real seconds. A dropped
//! event changes the truth but is never sent; a reordered one is held back
//! until the entity's next event (or the next event, if the entity's is far
//! off) went out; a duplicated one is sent a second time a little later. The
//! retry rules themselves live in [`crate::receiptroller`] and [`crate::mekari`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use posbridge::event::ProviderKind;
use posbridge::providers;
use posbridge::verify::sign;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{debug, info};

use crate::clock;
use crate::plan::Step;
use crate::state::{EventRecord, Fate, Sim, lock};
use crate::truth::Happened;
use crate::{mekari, receiptroller};

/// A held-back delivery is released at most this many events later.
const MAX_HOLD_EVENTS: usize = 10;
/// Gap between a released held-back delivery and the one it was swapped
/// with, so the swap survives concurrent sending.
const RELEASE_GAP: Duration = Duration::from_millis(50);

/// One signed delivery, ready to be attempted as often as the rules say.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Index of its [`EventRecord`].
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

/// Signs a happened event the way its provider does.
fn outgoing(sim: &Sim, index: usize, happened: &Happened) -> Outgoing {
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

/// Runs the whole script: events happen over `spread`, deliveries follow the
/// providers' rules; returns when every delivery is over.
pub async fn run(sim: Sim, steps: Vec<Step>, spread: Duration) {
    let start = Instant::now();
    let spacing = spread
        .checked_div(u32::try_from(steps.len()).unwrap_or(u32::MAX).max(1))
        .unwrap_or_default();
    // Held-back deliveries: release after the event with this index.
    let mut held: Vec<(usize, Outgoing, Option<Duration>)> = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        sleep_until(start + spacing * u32::try_from(i).unwrap_or(u32::MAX)).await;
        let at = sim.clock.now();
        let happened = lock(&sim.truth).apply(step, at);
        let index = {
            let mut events = lock(&sim.events);
            events.push(EventRecord {
                provider: happened.provider,
                delivery_id: happened.delivery_id.clone(),
                event_type: happened.event_type,
                key: happened.key.clone(),
                at: match happened.provider {
                    ProviderKind::ReceiptRoller => clock::receiptroller_timestamp(at),
                    ProviderKind::Mekari => clock::mekari_timestamp(at),
                },
                fate: Fate::Pending,
                attempts: 0,
                failed_attempts: 0,
                last_status: None,
                duplicated: false,
                reordered: step.faults.reorder && !step.faults.drop,
            });
            events.len() - 1
        };
        debug!(provider = %happened.provider, delivery_id = %happened.delivery_id,
               event = happened.event_type, key = %happened.key, "Event happened.");
        if step.faults.drop {
            info!(provider = %happened.provider, delivery_id = %happened.delivery_id,
                  key = %happened.key, "Dropping this event: it will never be sent.");
            sim.record(index, |r| r.fate = Fate::Dropped);
        } else {
            let out = outgoing(&sim, index, &happened);
            if step.faults.reorder {
                let release = step
                    .next_of_entity
                    .unwrap_or(i + 1)
                    .min(i + MAX_HOLD_EVENTS);
                held.push((release, out, step.faults.duplicate_after));
            } else {
                dispatch(&sim, out, Duration::ZERO, step.faults.duplicate_after);
            }
        }
        let (due, rest): (Vec<_>, Vec<_>) = held.into_iter().partition(|(r, ..)| *r <= i);
        held = rest;
        for (_, out, duplicate) in due {
            dispatch(&sim, out, RELEASE_GAP, duplicate);
        }
    }
    for (_, out, duplicate) in held {
        dispatch(&sim, out, RELEASE_GAP, duplicate);
    }
    sim.tasks.close();
    sim.tasks.wait().await;
    sim.sending_done.store(true, Ordering::SeqCst);
    info!(elapsed_ms = start.elapsed().as_millis(), "Sending is done.");
}

/// Starts one delivery after `delay`, and its duplicate copy if planned.
fn dispatch(sim: &Sim, out: Outgoing, delay: Duration, duplicate: Option<Duration>) {
    if let Some(after) = duplicate {
        let (sim2, copy) = (sim.clone(), out.clone());
        sim.tasks.spawn(async move {
            sleep(delay + after).await;
            if open(&sim2, copy.provider) {
                sim2.record(copy.index, |r| r.duplicated = true);
                let answer = attempt(&sim2, &copy).await;
                debug!(delivery_id = %copy.delivery_id, status = answer.code(), "Duplicate copy sent.");
            }
        });
    }
    let task_sim = sim.clone();
    sim.tasks.spawn(async move {
        let sim = task_sim;
        sleep(delay).await;
        if !open(&sim, out.provider) {
            info!(provider = %out.provider, delivery_id = %out.delivery_id,
                  "Not sent: the webhook is off / the endpoint is paused.");
            sim.record(out.index, |r| r.fate = Fate::Lost);
            return;
        }
        match out.provider {
            ProviderKind::ReceiptRoller => receiptroller::deliver(&sim, &out).await,
            ProviderKind::Mekari => mekari::deliver(&sim, &out).await,
        }
    });
}

/// Whether the provider sends new events now.
fn open(sim: &Sim, provider: ProviderKind) -> bool {
    match provider {
        ProviderKind::ReceiptRoller => lock(&sim.receiptroller).active,
        ProviderKind::Mekari => !lock(&sim.mekari).paused,
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
        r.last_status = Some(answer.code());
    });
    answer
}
