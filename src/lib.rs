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
//! * [`config`]: the configuration file and its validation.
//! * [`app`]: start-up; turns config into running pieces.
//! * [`ingress`]: routes, the webhook handler, status codes, ops endpoints.
//! * [`verify`]: signature schemes, constant-time, several secrets.
//! * [`providers`]: all that differs between ReceiptRoller and Mekari.
//! * [`event`]: the normalized event and its identifiers.
//! * [`pipeline`]: the data line both the ingress and the reconciler call.
//! * [`ledger`]: delivery ids, entity versions and per-entity locks.
//! * [`guard`]: an older state never overwrites a newer one.
//! * [`encode`]: Avro, Confluent wire format or single-object encoding.
//! * [`publish`]: the idempotent producer and topic creation.
//! * [`reconcile`]: reads what webhooks missed from the providers' APIs.
//! * [`watchdog`]: notices switched-off webhooks, resumes them, catches up.
//! * [`shutdown`]: background loops that stop with the service.
//! * [`metrics`]: every metric name in one place.

pub mod app;
pub mod config;
pub mod encode;
pub mod event;
pub mod guard;
pub mod ingress;
pub mod ledger;
pub mod metrics;
pub mod pipeline;
pub mod providers;
pub mod publish;
pub mod reconcile;
pub mod shutdown;
pub mod verify;
pub mod watchdog;
