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
//! # Floors
//!
//! Each folder is a floor; a floor uses only the floors below it, never one
//! above, so the folders tell the design from the bottom up:
//!
//! * [`domain`]: what posbridge decides without any I/O: the normalized
//!   event, the stale-event guard, the signature schemes.
//! * [`config`]: the configuration file as plain data, and the checks the data alone allows.
//! * [`background`] (one file, below the floors that start such threads):
//!   threads for work no delivery waits for (a checkpoint, the metrics'
//!   upkeep, the sources directory's reads), at a lower CPU priority than
//!   the ones serving.
//! * [`observe`]: what the service tells about itself: metric names, spans,
//!   the status board, a long run's progress.
//! * [`adapters`]: what the data passes through outside the process: the
//!   providers (one folder each), Kafka, the registry, the ledger's stores,
//!   the spool, secret files. (The OTLP exporter and the Prometheus
//!   recorder are [`observe`]'s: they carry what the service says of
//!   itself, not its data.)
//! * [`services`]: the data line and the loops that drive it: the pipeline,
//!   the spool drain, the ledger rebuild, the reconciler, the dead-letter
//!   replay, the watchdog.
//! * [`http`]: the listeners: webhook ingress, ops and admin endpoints, the status page.
//! * [`app`]: start-up; checks the config against the providers and builds the pieces.

pub mod adapters;
pub mod app;
pub mod background;
pub mod config;
pub mod domain;
pub mod http;
pub mod observe;
pub mod services;
