//! The providers: each delivery sent by its provider's documented rules (a
//! first attempt, then a retry after each answer that is not 2xx, for as
//! many attempts as the provider makes), to whichever posbridge process is
//! up. Their state outlives a crash of posbridge: an attempt a crash cut
//! is a failed one, and its retry comes on schedule.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::json;
use time::OffsetDateTime;
use tokio::time::Instant;

use super::clock::Clock;
use super::world::{Answer, Shared};
use crate::adapters::publish::Topics;
use crate::config::{KafkaConfig, Secrets};
use crate::domain::event::{EntityType, ProviderKind, Source};
use crate::domain::verify::{SchemeName, Verifier, sign};
use crate::observe::traces::DeliveryTrace;
use crate::services::pipeline::{Delivery, Pipeline};

const SECRET: &str = "simulation-secret";

/// Each provider's waits before its retries, after the first attempt
/// (`docs/PROVIDERS.md`): Mekari's eight attempts over about 11 hours,
/// ReceiptRoller's four over about 71 minutes.
fn retry_waits(provider: ProviderKind) -> &'static [u64] {
    match provider {
        ProviderKind::Mekari => &[30, 120, 600, 1800, 3600, 10_800, 21_600],
        ProviderKind::ReceiptRoller => &[60, 600, 3600],
    }
}

/// One delivery (or a duplicate copy of it) as its provider sends it.
#[derive(Debug, Clone)]
pub(super) struct Sender {
    pub(super) delivery: String,
    pub(super) body: Vec<u8>,
    pub(super) provider: ProviderKind,
    /// Whether its source spools (`on_broker_unavailable = "spool"`).
    pub(super) spools: bool,
    /// The attempt it makes next, from 0.
    attempt: usize,
    /// When, from the world's start.
    next_at: Duration,
    /// The jitter added to each wait, in ms.
    jitter: Vec<u64>,
    /// When the attempt in flight began, if one is.
    started: Option<Duration>,
    /// Whether it sends nothing more (answered 2xx, or its last attempt made).
    finished: bool,
}

impl Sender {
    pub(super) fn new(
        delivery: String,
        body: Vec<u8>,
        provider: ProviderKind,
        spools: bool,
        first: Duration,
        jitter: Vec<u64>,
    ) -> Sender {
        Sender {
            delivery,
            body,
            provider,
            spools,
            attempt: 0,
            next_at: first,
            jitter,
            started: None,
            finished: false,
        }
    }

    /// The attempt in flight was answered at `now`: its retry is scheduled
    /// unless it was 2xx or the last. Whether it was the last.
    fn answered(&mut self, now: Duration, ok: bool) -> bool {
        let waits = retry_waits(self.provider);
        self.started = None;
        let last = ok || self.attempt == waits.len();
        if last {
            self.finished = true;
        } else {
            self.next_at = now
                + Duration::from_secs(waits[self.attempt])
                + Duration::from_millis(self.jitter[self.attempt]);
            self.attempt += 1;
        }
        last
    }
}

/// Every delivery's provider state, by index.
pub(super) type Senders = Arc<Mutex<Vec<Sender>>>;

/// Every delivery the providers send, with its provider.
pub(super) fn deliveries(senders: &Senders) -> Vec<(ProviderKind, String)> {
    locked(senders)
        .iter()
        .map(|sender| (sender.provider, sender.delivery.clone()))
        .collect()
}

/// Whichever posbridge process is up, if one is: what a provider's request
/// reaches.
pub(super) type Door = Arc<Mutex<Option<Pipeline>>>;

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends delivery `index` by its provider's rules until it is finished, or
/// until the runtime it runs on (one life of posbridge) ends with a crash.
pub(super) async fn send(index: usize, senders: Senders, door: Door, shared: Shared, clock: Clock) {
    loop {
        let sender = {
            let mut senders = locked(&senders);
            let sender = &mut senders[index];
            if sender.finished {
                return;
            }
            sender.clone()
        };
        tokio::time::sleep_until(clock.instant_at(sender.next_at)).await;
        let at = clock.now();
        locked(&senders)[index].started = Some(at);
        let sent = Instant::now();
        let pipeline = locked(&door).clone();
        let outcome = match pipeline {
            None => Err("connection refused: posbridge is down".to_owned()),
            Some(pipeline) => match pipeline.deliver(signed(&sender, clock.wall(at))).await {
                Ok(handled) => Ok(handled.outcome),
                Err(error) if error.is_retryable() => Err(error.to_string()),
                Err(error) => panic!(
                    "{}: a valid delivery refused for good: {error}",
                    sender.delivery
                ),
            },
        };
        let took = sent.elapsed();
        let last = locked(&senders)[index].answered(clock.now(), outcome.is_ok());
        shared.answered(Answer {
            delivery: sender.delivery.clone(),
            outcome,
            took,
            log_len: 0,
            last,
            at,
            era: 0,
        });
    }
}

/// A crash at `now` cut every attempt in flight: each is a failed one to
/// its provider, which retries on schedule.
pub(super) fn cut(senders: &Senders, shared: &Shared, now: Duration) {
    for sender in locked(senders).iter_mut() {
        if let Some(at) = sender.started {
            let last = sender.answered(now, false);
            shared.answered(Answer {
                delivery: sender.delivery.clone(),
                outcome: Err("the connection was cut: posbridge crashed".to_owned()),
                took: now - at,
                log_len: 0,
                last,
                at,
                era: 0,
            });
        }
    }
}

/// The deliveries not finished yet.
pub(super) fn unfinished(senders: &Senders) -> Vec<usize> {
    locked(senders)
        .iter()
        .enumerate()
        .filter(|(_, sender)| !sender.finished)
        .map(|(index, _)| index)
        .collect()
}

/// `sender`'s body as the ingress hands it on, verified, received at `at`.
fn signed(sender: &Sender, received_at: OffsetDateTime) -> Delivery {
    let secrets: Secrets = serde_json::from_value(json!([SECRET])).expect("one secret");
    let verifier = Verifier::new(SchemeName::Hex, "x-sig", &secrets.0, 300).expect("a verifier");
    let mut headers = HeaderMap::new();
    for (name, value) in sign(
        SchemeName::Hex,
        "x-sig",
        SECRET,
        &sender.delivery,
        0,
        &sender.body,
    ) {
        headers.insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    Delivery {
        source: source(sender.provider),
        delivery_id: sender.delivery.as_str().into(),
        body: verifier
            .verify(&headers, Bytes::from(sender.body.clone()), 0)
            .expect("signed with the secret"),
        received_at,
        arrived: Instant::now(),
        spools: sender.spools,
        trace: DeliveryTrace::default(),
    }
}

/// The body of event `index` of entity `entity` of `provider`, bringing
/// `state` (its amounts), and the entity's record key. Versions rise with
/// `index` (the event's time); states may repeat (the world draws them). A
/// `broken` one's data is no entity.
pub(super) fn body(
    provider: ProviderKind,
    delivery: &str,
    (entity, index, state): (usize, usize, usize),
    broken: bool,
) -> (String, Vec<u8>) {
    let at = event_time(index)
        .format(&time::format_description::well_known::Rfc3339)
        .expect("a time formats");
    let mut body = match provider {
        ProviderKind::Mekari => json!({
            "id": delivery, "event": "order.updated",
            "occurred_at": at,
            "data": {"id": format!("ORD-{entity}"), "status": "paid", "total": 100 + state,
                     "kitchen_status": "preparing"}
        }),
        ProviderKind::ReceiptRoller => json!({
            "id": delivery, "type": "sale.updated",
            "timestamp": at, "webhook_id": "wh_1",
            "data": {"id": format!("T1|2026-11|{entity:04}"), "terminal_id": "T1", "store_id": "S1",
                     "transaction_id": "000001", "transaction_type": 1,
                     "transaction_at": "2026-11-29T10:00:00Z", "currency": "JPY",
                     "sub_total": 100 + state, "tax_total": 0, "grand_total": 100 + state,
                     "items": []}
        }),
    };
    if broken {
        body["data"] = json!("not an entity");
    }
    let key = match provider {
        ProviderKind::Mekari => format!("mekari:ORD-{entity}"),
        ProviderKind::ReceiptRoller => format!("receiptroller:T1|2026-11|{entity:04}"),
    };
    (key, serde_json::to_vec(&body).expect("JSON serializes"))
}

/// The time of event `index` of an entity (its body's time, in UTC).
pub(super) fn event_time(index: usize) -> OffsetDateTime {
    let minutes = i64::try_from(10 + index).expect("a few events");
    OffsetDateTime::parse(
        "2026-11-29T10:00:00Z",
        &time::format_description::well_known::Rfc3339,
    )
    .expect("an RFC 3339 time")
        + time::Duration::minutes(minutes)
}

/// The Mekari source's own topics' prefix: its records and letters go
/// there, the ReceiptRoller source's to the shared topics, and the ledger's
/// fill reads both.
pub(super) const OWN_PREFIX: &str = "merchant.";

/// Each provider's one source here.
pub(super) fn source(provider: ProviderKind) -> Arc<Source> {
    Arc::new(Source {
        provider,
        name: "main".into(),
        account: None,
        topic_prefix: (provider == ProviderKind::Mekari).then(|| OWN_PREFIX.into()),
    })
}

/// Where each provider's source writes: [`OWN_PREFIX`]'s topics for
/// Mekari's, the shared ones for ReceiptRoller's.
pub(super) fn topics_of(provider: ProviderKind) -> Topics {
    match provider {
        ProviderKind::Mekari => Topics::prefixed(OWN_PREFIX),
        ProviderKind::ReceiptRoller => Topics::new(&KafkaConfig::default()),
    }
}

/// The entity type each provider's events are of here.
pub(super) fn entity_type(provider: ProviderKind) -> EntityType {
    match provider {
        ProviderKind::Mekari => EntityType::Order,
        ProviderKind::ReceiptRoller => EntityType::Sale,
    }
}
