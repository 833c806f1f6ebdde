//! The delivery side: makes the planned events happen and hands each one to
//! its provider's delivery rules, with the planned faults.
//!
//! Events happen at an even pace over `--spread-secs` real seconds. A dropped
//! event changes the truth but is never sent; a reordered one is held back
//! until the entity's next event (or the next event, if the entity's is far
//! off) went out; a duplicated one is sent a second time a little later. A
//! provider whose webhook is off (ReceiptRoller) or whose endpoint is paused
//! (Mekari) sends nothing new. The retry rules themselves live in
//! [`receiptroller`] and [`mekari`]; the signed request and one
//! HTTP attempt of it in [`outgoing`].

pub mod mekari;
pub mod outgoing;
pub mod receiptroller;

use std::sync::atomic::Ordering;
use std::time::Duration;

use posbridge::domain::event::ProviderKind;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{debug, info};

use crate::clock;
use crate::deliver::outgoing::Outgoing;
use crate::plan::Step;
use crate::state::{EventRecord, Fate, Sim, lock};

/// A held-back delivery is released at most this many events later.
const MAX_HOLD_EVENTS: usize = 10;
/// Gap between a released held-back delivery and the one it was swapped
/// with, so the swap survives concurrent sending.
const RELEASE_GAP: Duration = Duration::from_millis(50);

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
                unanswered_attempts: 0,
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
            let out = Outgoing::signed(&sim, index, &happened);
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
                let answer = outgoing::attempt(&sim2, &copy).await;
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
