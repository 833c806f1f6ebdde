//! One seed's world: the entities and their events, the providers that
//! deliver them by their rules, the broker's faults, and what happened.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderMap;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::error::RDKafkaErrorCode;
use serde_json::json;
use time::macros::datetime;
use tokio::time::Instant;

use crate::adapters::publish::{FakeBroker, Fault, OutgoingRecord};
use crate::config::Secrets;
use crate::domain::event::{EntityType, ProviderKind, Source};
use crate::domain::verify::{SchemeName, Verifier, sign};
use crate::observe::traces::DeliveryTrace;
use crate::services::drain::Drainer;
use crate::services::pipeline::{Delivery, HEADER_DELIVERY_ID, Outcome, Pipeline};

const SECRET: &str = "simulation-secret";

/// How long a delivery may wait for another attempt of its own.
const INFLIGHT_WAIT: Duration = Duration::from_millis(200);

/// Each provider's waits before its retries, after the first attempt
/// (`docs/PROVIDERS.md`): Mekari's eight attempts over about 11 hours,
/// ReceiptRoller's four over about 71 minutes.
fn retry_waits(provider: ProviderKind) -> &'static [u64] {
    match provider {
        ProviderKind::Mekari => &[30, 120, 600, 1800, 3600, 10_800, 21_600],
        ProviderKind::ReceiptRoller => &[60, 600, 3600],
    }
}

/// Broker errors a send may meet that a later attempt may not: never a
/// refusal for good (that is a dead letter, a decision of its own).
const RETRYABLE: [RDKafkaErrorCode; 4] = [
    RDKafkaErrorCode::NotEnoughReplicas,
    RDKafkaErrorCode::RequestTimedOut,
    RDKafkaErrorCode::NetworkException,
    RDKafkaErrorCode::LeaderNotAvailable,
];

/// One event of one entity: its delivery, and its place among its entity's
/// events (a higher index is a newer state).
#[derive(Debug, Clone)]
pub(super) struct Event {
    /// The entity's record key.
    pub(super) key: String,
    /// Its place: events of one entity are made with rising versions.
    pub(super) index: usize,
    /// Its provider.
    pub(super) provider: ProviderKind,
}

/// One attempt's answer, as its provider saw it.
#[derive(Debug, Clone)]
pub(super) struct Answer {
    /// Which delivery.
    pub(super) delivery: String,
    /// 2xx with its outcome, or the error a provider retries.
    pub(super) outcome: Result<Outcome, String>,
    /// How long the answer took.
    pub(super) took: Duration,
    /// How many records the broker's log held when it was answered.
    pub(super) log_len: usize,
    /// Whether its provider sends no further attempt after it.
    pub(super) last: bool,
    /// When it started, from the world's start.
    pub(super) at: Duration,
}

/// What a world ended with, for the checks.
pub(super) struct Ended {
    /// Every event, by delivery id.
    pub(super) events: BTreeMap<String, Event>,
    /// Every answer, in the order given.
    pub(super) answers: Vec<Answer>,
    /// The broker's log, in order.
    pub(super) log: Vec<OutgoingRecord>,
    /// Acknowledgements lost, by delivery id: each lets one more copy be written.
    pub(super) lost_acks: BTreeMap<String, u32>,
    /// When the broker's faults ended, from the world's start.
    pub(super) faults_end: Duration,
    /// Whether ReceiptRoller's source spools (`on_broker_unavailable = "spool"`).
    pub(super) spools: bool,
    /// Deliveries the spool still held at the end.
    pub(super) spooled_at_end: usize,
    /// The schedule, step by step.
    pub(super) steps: Vec<String>,
}

/// The world of one seed.
pub(super) struct World {
    rng: StdRng,
    pipeline: Pipeline,
    broker: Arc<FakeBroker>,
    /// Shared with the broker's plan and the providers.
    record: Arc<Mutex<Record>>,
    started: Instant,
    faults: (Duration, Duration),
    spools: bool,
}

/// What the world notes as it runs.
#[derive(Default)]
struct Record {
    answers: Vec<Answer>,
    lost_acks: BTreeMap<String, u32>,
    steps: Vec<String>,
}

fn noted(record: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    record.lock().unwrap_or_else(PoisonError::into_inner)
}

impl World {
    /// The world of `seed`, its ledger and spool files in `dir`.
    pub(super) async fn new(seed: u64, dir: &std::path::Path) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let (pipeline, broker) = Pipeline::on_fake_broker_spooling(dir, INFLIGHT_WAIT, 1_000).await;
        let start = Duration::from_millis(rng.random_range(0..120_000));
        let length = Duration::from_millis(rng.random_range(0..900_000));
        let spools = rng.random_bool(0.5);
        World {
            rng,
            pipeline,
            broker,
            record: Arc::default(),
            started: Instant::now(),
            faults: (start, start + length),
            spools,
        }
    }

    /// Plays the schedule to its end: every provider's attempts, then the
    /// records still in flight.
    pub(super) async fn run(mut self) -> Ended {
        self.plan_faults();
        let events = self.events();
        let spool = self
            .pipeline
            .spool()
            .expect("the fake broker's pipeline spools")
            .clone();
        let draining = tokio_util::sync::CancellationToken::new();
        // Only a world whose source spools needs its drainer (it looks
        // four times a second of virtual time, hours of it).
        let drainer = self.spools.then(|| {
            tokio::spawn(Drainer::new(self.pipeline.clone(), spool.clone()).run(draining.clone()))
        });
        if self.spools {
            record_step(
                &self.record,
                Duration::ZERO,
                "ReceiptRoller spools".to_owned(),
            );
        }
        let mut senders = Vec::new();
        for (delivery, (event, body)) in &events {
            let first = Duration::from_millis(self.rng.random_range(0..60_000));
            // A provider may send a delivery twice at once (a duplicate).
            let copies = if self.rng.random_bool(0.2) { 2 } else { 1 };
            for copy in 0..copies {
                let jitter: Vec<u64> = retry_waits(event.provider)
                    .iter()
                    .map(|_| self.rng.random_range(0..5_000))
                    .collect();
                let offset = Duration::from_millis(copy * self.rng.random_range(0..500));
                let spools = self.spools && event.provider == ProviderKind::ReceiptRoller;
                senders.push(tokio::spawn(send(
                    self.pipeline.clone(),
                    self.broker.clone(),
                    self.record.clone(),
                    self.started,
                    (Arc::new(source(event.provider)), spools),
                    delivery.clone(),
                    body.clone(),
                    first + offset,
                    jitter,
                )));
            }
        }
        for sender in senders {
            sender.await.expect("a provider's task does not panic");
        }
        // Records still in the producer when their answer was cut are
        // committed by their own tasks, and the drainer empties the spool
        // once the faults ended: let them end.
        let deadline = self.started + self.faults.1 + Duration::from_secs(3600);
        loop {
            tokio::time::sleep(Duration::from_secs(60)).await;
            if spool.stats().entries == 0 || Instant::now() > deadline {
                break;
            }
        }
        draining.cancel();
        if let Some(drainer) = drainer {
            drainer.await.expect("the drainer does not panic");
        }
        let record = std::mem::take(&mut *noted(&self.record));
        Ended {
            events: events
                .into_iter()
                .map(|(id, (event, _))| (id, event))
                .collect(),
            answers: record.answers,
            log: self.broker.taken(),
            lost_acks: record.lost_acks,
            faults_end: self.faults.1,
            spools: self.spools,
            spooled_at_end: usize::try_from(spool.stats().entries).unwrap_or(usize::MAX),
            steps: record.steps,
        }
    }

    /// The broker's answer to each send: faults while the window lasts,
    /// acknowledgements (some late) outside it.
    fn plan_faults(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.rng.random());
        let (record, started, (from, to)) = (self.record.clone(), self.started, self.faults);
        record_step(
            &self.record,
            Duration::ZERO,
            format!(
                "broker faults from {:.3}s to {:.3}s",
                from.as_secs_f64(),
                to.as_secs_f64()
            ),
        );
        self.broker.plan(move |sent| {
            let now = started.elapsed();
            let fault = if now >= from && now < to {
                match rng.random_range(0..100) {
                    0..40 => Fault::Fail(RETRYABLE[rng.random_range(0..RETRYABLE.len())]),
                    40..55 => Fault::LoseAck,
                    55..75 => Fault::Late(Duration::from_millis(rng.random_range(0..3_000))),
                    _ => Fault::Take,
                }
            } else if rng.random_bool(0.1) {
                Fault::Late(Duration::from_millis(rng.random_range(0..400)))
            } else {
                Fault::Take
            };
            let delivery = delivery_of(sent).unwrap_or_default();
            let mut noted = noted(&record);
            if fault == Fault::LoseAck {
                *noted.lost_acks.entry(delivery.clone()).or_default() += 1;
            }
            if fault != Fault::Take {
                noted.steps.push(format!(
                    "t={:.3}s broker: {fault:?} for {delivery} on {}",
                    now.as_secs_f64(),
                    sent.topic
                ));
            }
            fault
        });
    }

    /// A few entities of each provider, each with a few events of rising
    /// versions: delivery id → event and body.
    fn events(&mut self) -> BTreeMap<String, (Event, Vec<u8>)> {
        let mut events = BTreeMap::new();
        let mut next = 0;
        for provider in ProviderKind::ALL {
            for entity in 0..self.rng.random_range(1..4) {
                for index in 0..self.rng.random_range(1..5) {
                    next += 1;
                    let delivery = format!("d-{next}");
                    let (key, body) = body(provider, &delivery, entity, index);
                    events.insert(
                        delivery,
                        (
                            Event {
                                key,
                                index,
                                provider,
                            },
                            body,
                        ),
                    );
                }
            }
        }
        events
    }
}

/// Notes a step of the schedule.
fn record_step(record: &Mutex<Record>, at: Duration, step: String) {
    noted(record)
        .steps
        .push(format!("t={:.3}s {step}", at.as_secs_f64()));
}

/// A provider delivering one delivery by its rules: the first attempt at
/// `first`, then a retry after each answer that is not 2xx, for as many
/// attempts as the provider makes.
#[allow(clippy::too_many_arguments)]
async fn send(
    pipeline: Pipeline,
    broker: Arc<FakeBroker>,
    noted: Arc<Mutex<Record>>,
    started: Instant,
    (source, spools): (Arc<Source>, bool),
    delivery_id: String,
    body: Vec<u8>,
    first: Duration,
    jitter: Vec<u64>,
) {
    tokio::time::sleep_until(started + first).await;
    let waits = retry_waits(source.provider);
    for attempt in 0..=waits.len() {
        let at = started.elapsed();
        let sent = Instant::now();
        let answered = pipeline
            .deliver(signed(source.clone(), &delivery_id, body.clone(), spools))
            .await;
        let took = sent.elapsed();
        let outcome = match answered {
            Ok(handled) => Ok(handled.outcome),
            Err(error) if error.is_retryable() => Err(error.to_string()),
            Err(error) => panic!("{delivery_id}: a valid delivery refused for good: {error}"),
        };
        let last = outcome.is_ok() || attempt == waits.len();
        {
            let mut noted = self::noted(&noted);
            noted.steps.push(format!(
                "t={:.3}s {delivery_id} attempt {} → {} in {} ms",
                at.as_secs_f64(),
                attempt + 1,
                match &outcome {
                    Ok(outcome) => outcome.as_str().to_owned(),
                    Err(error) => format!("retry ({error})"),
                },
                took.as_millis()
            ));
            noted.answers.push(Answer {
                delivery: delivery_id.clone(),
                outcome: outcome.clone(),
                took,
                log_len: broker.taken().len(),
                last,
                at,
            });
        }
        if last {
            return;
        }
        tokio::time::sleep(
            Duration::from_secs(waits[attempt]) + Duration::from_millis(jitter[attempt]),
        )
        .await;
    }
}

fn source(provider: ProviderKind) -> Source {
    Source {
        provider,
        name: "main".into(),
        account: None,
    }
}

/// `body` from `source` as the ingress hands it on: verified.
fn signed(source: Arc<Source>, delivery_id: &str, body: Vec<u8>, spools: bool) -> Delivery {
    let secrets: Secrets = serde_json::from_value(json!([SECRET])).expect("one secret");
    let verifier = Verifier::new(SchemeName::Hex, "x-sig", &secrets.0, 300).expect("a verifier");
    let mut headers = HeaderMap::new();
    for (name, value) in sign(SchemeName::Hex, "x-sig", SECRET, delivery_id, 0, &body) {
        headers.insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    Delivery {
        source,
        delivery_id: delivery_id.into(),
        body: verifier
            .verify(&headers, Bytes::from(body), 0)
            .expect("signed with the secret"),
        // After every event time: none lies ahead of its arrival.
        received_at: datetime!(2026-11-29 12:00 UTC),
        arrived: Instant::now(),
        spools,
        trace: DeliveryTrace::default(),
    }
}

/// The body of event `index` of entity `entity` of `provider`, and the
/// entity's record key. Versions rise with `index` (the event's time), and
/// every event's content differs.
fn body(provider: ProviderKind, delivery: &str, entity: usize, index: usize) -> (String, Vec<u8>) {
    let minute = 10 + index;
    let body = match provider {
        ProviderKind::Mekari => json!({
            "id": delivery, "event": "order.updated",
            "occurred_at": format!("2026-11-29T17:{minute:02}:00+07:00"),
            "data": {"id": format!("ORD-{entity}"), "status": "paid", "total": 100 + index,
                     "kitchen_status": "preparing"}
        }),
        ProviderKind::ReceiptRoller => json!({
            "id": delivery, "type": "sale.updated",
            "timestamp": format!("2026-11-29T10:{minute:02}:00Z"), "webhook_id": "wh_1",
            "data": {"id": format!("T1|2026-11|{entity:04}"), "terminal_id": "T1", "store_id": "S1",
                     "transaction_id": "000001", "transaction_type": 1,
                     "transaction_at": "2026-11-29T10:00:00Z", "currency": "JPY",
                     "sub_total": 100 + index, "tax_total": 0, "grand_total": 100 + index,
                     "items": []}
        }),
    };
    let key = match provider {
        ProviderKind::Mekari => format!("mekari:ORD-{entity}"),
        ProviderKind::ReceiptRoller => format!("receiptroller:T1|2026-11|{entity:04}"),
    };
    (key, serde_json::to_vec(&body).expect("JSON serializes"))
}

/// The entity type each provider's events are of here.
pub(super) fn entity_type(provider: ProviderKind) -> EntityType {
    match provider {
        ProviderKind::Mekari => EntityType::Order,
        ProviderKind::ReceiptRoller => EntityType::Sale,
    }
}

/// A record's delivery id header.
pub(super) fn delivery_of(record: &OutgoingRecord) -> Option<String> {
    record.header(HEADER_DELIVERY_ID).map(str::to_owned)
}
