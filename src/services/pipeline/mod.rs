//! The data line, in one place: ledger → normalize → guard → encode → publish
//! → ledger.
//!
//! Four entry points, one file each, each reading top-down and each on a
//! task of its own (`tasks.rs`) that runs to its commit whoever stops
//! waiting: [`Pipeline::deliver`] (`webhook.rs`, a verified webhook body;
//! the spool when Kafka cannot take it in time), [`Pipeline::replay`]
//! (`spooled.rs`, the drainer's), [`Pipeline::apply`] and
//! [`Pipeline::dead_letter`] (`reconciled.rs`, the reconciler's records and
//! the dead letters of the reconciler and the drainer) and
//! [`Pipeline::redeliver`] (`redeliver.rs`, a dead letter put through
//! again). All end in the same guard and the same producer, so neither a
//! reconciled record nor an old dead letter can roll an entity back.
//!
//! Each entry point calls the same two stages in order. **Taking in**
//! (`intake.rs`, then `write.rs`): the lease on the delivery id (`lease.rs`;
//! a done id is a duplicate, answered from the ledger), the body parsed and
//! normalized by its provider's folder, the guard's decision under the
//! entity's lock, the encoding and the record built without I/O
//! (`record.rs`). Nothing has reached Kafka yet, so this stage may be cut at
//! a deadline; the lease and the lock are given back as they drop.
//! **Sending** (`send.rs`): the record handed to the producer, its
//! acknowledgement, the commit. From here the record may be in Kafka, so
//! this stage is never cut: at a deadline the caller gets its answer
//! (spooled, or "try again") and the task goes on to the commit.
//!
//! A delivery id becomes *done* only once its outcome is durable: the record
//! acknowledged by Kafka, the raw body dead-lettered, or the event judged
//! stale or unchanged. Any failure before that releases the lease and answers
//! "try again", so the provider's retry is processed. `outcome.rs` holds what
//! the line answers.

#[cfg(test)]
mod fuzz;
mod intake;
mod lease;
mod outcome;
mod reconciled;
mod record;
mod redeliver;
mod send;
#[cfg(test)]
mod sim;
mod spooled;
mod tasks;
#[cfg(test)]
mod tests;
mod webhook;
mod write;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use compact_str::CompactString;
use time::OffsetDateTime;

use crate::adapters::encode::Encoder;
use crate::adapters::ledger::Ledger;
#[cfg(test)]
use crate::adapters::publish::FakeBroker;
use crate::adapters::publish::{Producer, TopicSets};
use crate::adapters::spool::Spool;
use crate::domain::event::Source;
use crate::domain::verify::VerifiedBody;
use crate::observe::traces::{DeliveryTrace, Origin as TraceOrigin, Traces};

pub use outcome::{Handled, Outcome, PipelineError, Redelivery};
pub use record::{
    DEAD_LETTER_KEPT_BYTES, DeadLetter, HEADER_BODY_BYTES, HEADER_BODY_SHA256, HEADER_CUT_REASON,
    HEADER_DELIVERY_ID, HEADER_EVENT_TYPE, HEADER_ORIGIN, HEADER_PROVIDER, HEADER_REASON,
    HEADER_REASON_CODE, HEADER_RECEIVED_AT, HEADER_SCHEMA, HEADER_SOURCE, HEADER_STATE_HASH,
    HEADER_VERSION, cut_dead_letter, dead_letter_record, entity_record, received_at_from_header,
    state_from_headers,
};

/// One verified webhook delivery, owned, on its way down the line.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Through which configured webhook (and so which provider).
    pub source: Arc<Source>,
    /// The delivery-id header's value.
    pub delivery_id: CompactString,
    /// The signed body.
    pub body: VerifiedBody,
    /// When it arrived.
    pub received_at: OffsetDateTime,
    /// When its request started: the answer budget counts from here.
    pub arrived: Instant,
    /// Whether its source spools what Kafka cannot take in time
    /// (`on_broker_unavailable = "spool"`).
    pub spools: bool,
    /// Its span, under which each stage opens its own; off unless traces
    /// are on.
    pub trace: DeliveryTrace,
}

/// The pipeline handle, shared by the ingress and the reconciler. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

struct Inner {
    /// Delivery ids, entity versions, locks.
    ledger: Arc<Ledger>,
    /// Avro, with or without a registry.
    encoder: Encoder,
    /// The idempotent producer (a fake broker in the unit tests).
    producer: Producer,
    /// Where each record goes: the shared topics, or its source's own.
    topics: TopicSets,
    /// How long a duplicate waits for the same delivery in flight.
    inflight_wait: Duration,
    /// How long a webhook may take from its request to its answer.
    answer_budget: Duration,
    /// How far ahead of its arrival a webhook's event time may lie.
    max_event_ahead: Duration,
    /// The outage spool, when any source spools.
    spool: Option<Spool>,
    /// The span exporter, when traces are on.
    traces: Traces,
    /// Dead letters written since start, whichever path wrote them.
    dead_letters: std::sync::atomic::AtomicU64,
    /// The work running, each on a task of its own; shutdown waits for it.
    deliveries: tokio_util::task::TaskTracker,
    /// The deliveries in flight, by provider.
    in_flight: crate::observe::delivery::InFlightGauges,
}

/// The stages a [`Pipeline`] joins; each is built from config by `App::build`.
pub struct Stages {
    /// Delivery ids, entity versions, locks.
    pub ledger: Arc<Ledger>,
    /// Avro, with or without a registry.
    pub encoder: Encoder,
    /// The idempotent producer (a fake broker in the unit tests).
    pub producer: Producer,
    /// Where each record goes: the shared topics, or its source's own.
    pub topics: TopicSets,
    /// The outage spool, when any source spools.
    pub spool: Option<Spool>,
    /// The span exporter, when traces are on.
    pub traces: Traces,
}

/// The pipeline's time limits, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a duplicate waits for the same delivery in flight.
    pub inflight_wait: Duration,
    /// How long a webhook may take from its request to its answer.
    pub answer_budget: Duration,
    /// How far ahead of its arrival a webhook's event time may lie
    /// (`server.max_event_ahead_ms`); later ones are dead-lettered.
    pub max_event_ahead: Duration,
}

impl Pipeline {
    /// Gives `delivery`, which no request started (a spooled delivery
    /// replayed, a dead letter redelivered), a trace of its own, and
    /// returns it.
    fn trace_of_its_own(&self, origin: TraceOrigin, delivery: &mut Delivery) -> DeliveryTrace {
        delivery.trace = self.inner.traces.start_root(
            origin,
            delivery.source.provider,
            &delivery.source.name,
            &delivery.delivery_id,
        );
        delivery.trace.clone()
    }

    /// Joins the stages; each is built from config by `App::build`. Call
    /// after `telemetry::install`: the gauges it looks up once record
    /// nowhere before it.
    pub fn new(stages: Stages, timing: Timing) -> Pipeline {
        let Stages {
            ledger,
            encoder,
            producer,
            topics,
            spool,
            traces,
        } = stages;
        Pipeline {
            inner: Arc::new(Inner {
                ledger,
                encoder,
                producer,
                topics,
                inflight_wait: timing.inflight_wait,
                answer_budget: timing.answer_budget,
                max_event_ahead: timing.max_event_ahead,
                spool,
                traces,
                dead_letters: std::sync::atomic::AtomicU64::new(0),
                deliveries: tokio_util::task::TaskTracker::new(),
                in_flight: crate::observe::delivery::InFlightGauges::register(),
            }),
        }
    }

    /// A pipeline on a fake broker, for tests of its decisions to the
    /// record acknowledged: an embedded ledger and a spool of three entries
    /// in `dir`, the registry-less encoder, and the [`FakeBroker`] it
    /// produces to, which the test commands.
    #[cfg(test)]
    pub(crate) async fn on_fake_broker(
        dir: &std::path::Path,
        inflight_wait: Duration,
    ) -> (Pipeline, Arc<FakeBroker>) {
        Self::on_fake_broker_spooling(dir, inflight_wait, 3).await
    }

    /// [`Pipeline::on_fake_broker`] with a spool of `spool_entries`.
    #[cfg(test)]
    pub(crate) async fn on_fake_broker_spooling(
        dir: &std::path::Path,
        inflight_wait: Duration,
        spool_entries: u64,
    ) -> (Pipeline, Arc<FakeBroker>) {
        let (pipeline, broker, gate) =
            Self::on_fake_broker_behind(dir, inflight_wait, spool_entries).await;
        // Nothing to fill it from: decided at once.
        gate.end(Ok(()));
        (pipeline, broker)
    }

    /// [`Pipeline::on_fake_broker_spooling`] with its ledger's gate closed,
    /// never opened yet: the test fills it, or not.
    #[cfg(test)]
    pub(crate) async fn on_fake_broker_behind(
        dir: &std::path::Path,
        inflight_wait: Duration,
        spool_entries: u64,
    ) -> (
        Pipeline,
        Arc<FakeBroker>,
        Arc<crate::adapters::ledger::Gate>,
    ) {
        use crate::config::LedgerConfig;
        let ledger = LedgerConfig {
            path: dir.join("ledger.redb"),
            ..LedgerConfig::default()
        };
        let opened = crate::adapters::ledger::open(&ledger, Duration::from_secs(30))
            .await
            .expect("a fresh ledger file opens");
        let broker = Arc::new(FakeBroker::default());
        let spool = Spool::open(&crate::config::SpoolConfig {
            path: dir.join("spool.redb"),
            max_bytes: 1 << 20,
            max_entries: spool_entries,
        })
        .expect("a fresh spool file opens");
        let timing = Timing {
            inflight_wait,
            answer_budget: Duration::from_millis(300) + inflight_wait,
            max_event_ahead: crate::config::ServerConfig::default().max_event_ahead(),
        };
        let pipeline = Pipeline::on_fake(opened.ledger, broker.clone(), spool, timing).await;
        (pipeline, broker, opened.gate)
    }

    /// A pipeline deciding with `ledger`, producing to `broker` and
    /// spooling to `spool`, with the registry-less encoder.
    #[cfg(test)]
    pub(crate) async fn on_fake(
        ledger: Arc<Ledger>,
        broker: Arc<FakeBroker>,
        spool: Spool,
        timing: Timing,
    ) -> Pipeline {
        use crate::config::{KafkaConfig, RegistryConfig};
        Pipeline::new(
            Stages {
                ledger,
                encoder: Encoder::new(&RegistryConfig::default(), &[])
                    .await
                    .expect("the registry-less encoder needs nothing"),
                producer: Producer::Fake(broker),
                topics: TopicSets::new(&KafkaConfig::default()),
                spool: Some(spool),
                traces: Traces::default(),
            },
            timing,
        )
    }

    /// The outage spool, when any source spools.
    pub fn spool(&self) -> Option<&Spool> {
        self.inner.spool.as_ref()
    }

    /// The producer, for readiness checks and the shutdown flush.
    pub fn producer(&self) -> &Producer {
        &self.inner.producer
    }

    /// The encoder, for readiness checks.
    pub fn encoder(&self) -> &Encoder {
        &self.inner.encoder
    }

    /// The span exporter: the ingress starts each delivery's span with it,
    /// and shutdown exports what is batched.
    pub fn traces(&self) -> &Traces {
        &self.inner.traces
    }

    /// The ledger, for readiness checks and the reconciler's checkpoints.
    pub fn ledger(&self) -> &Ledger {
        self.inner.ledger.as_ref()
    }

    /// The ledger, shared (a lookup reads it).
    pub fn shared_ledger(&self) -> Arc<Ledger> {
        self.inner.ledger.clone()
    }
}
