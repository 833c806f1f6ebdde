//! # posbridge
//!
//! Point-of-sale webhooks in, one clean Kafka stream per entity type out.
//!
//! ```text
//! provider ─HTTP─▶ ingress ─▶ verify ─▶ ledger.begin ─▶ normalize ─▶ guard ─▶ encode ─▶ publish ─▶ ledger.commit ─▶ 2xx
//! reconciler ───────────────────────────────────────▶ normalize ─▶ guard ─▶ encode ─▶ publish ─▶ ledger.commit
//! ```
//!
//! A webhook is verified over its raw bytes, deduplicated by delivery id,
//! normalized into the one Avro event schema, kept out of the topic if an
//! entity already has a newer state, produced with an idempotent `acks=all`
//! producer keyed by the entity's business id, and answered 2xx only after
//! Kafka acknowledged it.
//!
//! # Layout
//!
//! From the bottom up; a module uses only those above it in this list.
//!
//! * [`event`]: the normalized event and its identifiers.
//! * [`config`]: the configuration file as plain data, and the checks the data alone allows.
//! * [`telemetry`]: every metric name and label key; the Prometheus recorder.
//! * [`traces`]: a span per delivery and its stages over OTLP, the records' `traceparent`.
//! * [`ticker`]: the tick of background loops that stop with the service.
//! * [`verify`]: signature schemes, constant-time, several secrets.
//! * [`secrets`]: secrets from files, read again when they change.
//! * [`panics`]: the text of a caught panic.
//! * [`store_file`]: opening the redb files, refusing damaged ones.
//! * [`ledger`]: delivery ids, entity versions, per-entity locks, checkpoints.
//! * [`guard`]: an older state never overwrites a newer one.
//! * [`encode`]: Avro, Confluent wire format or single-object encoding.
//! * [`publish`]: the idempotent producer, topic routing and creation.
//! * [`spool`]: the outage spool, verified deliveries Kafka could not take in time.
//! * [`providers`]: all that differs between ReceiptRoller and Mekari, one folder each.
//! * [`pipeline`]: the data line both the ingress and the reconciler call.
//! * [`drain`]: replays the spool through the pipeline once Kafka is back.
//! * [`rebuild`]: fills a lost ledger from the topics at start.
//! * [`reconcile`]: reads what webhooks missed from the providers' APIs.
//! * [`replay`]: puts dead letters through the pipeline again once their cause is cleared.
//! * [`watchdog`]: notices switched-off webhooks, resumes them, catches up.
//! * [`ingress`]: routes, the webhook handler, the status mapping, ops endpoints.
//! * [`app`]: start-up; checks the config against the providers and builds the pieces.

pub mod app;
pub mod config;
pub mod drain;
pub mod encode;
pub mod event;
pub mod guard;
pub mod ingress;
pub mod ledger;
pub mod panics;
pub mod pipeline;
pub mod progress;
pub mod providers;
pub mod publish;
pub mod rebuild;
pub mod reconcile;
pub mod replay;
pub mod secrets;
pub mod spool;
pub mod status;
pub mod store_file;
pub mod telemetry;
pub mod ticker;
pub mod traces;
pub mod verify;
pub mod watchdog;
