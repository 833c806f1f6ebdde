//! What the data passes through outside the process, each behind the
//! types the services above call: the providers' webhooks and APIs, Kafka,
//! the schema registry, the ledger's stores, the outage spool and secret
//! files.
//!
//! * [`providers`]: all that differs between ReceiptRoller and Mekari, one folder each.
//! * [`encode`]: Avro, Confluent wire format (with the registry) or single-object encoding.
//! * [`publish`]: the idempotent producer, topic routing and creation.
//! * [`ledger`]: delivery ids, entity versions, per-entity locks, checkpoints.
//! * [`spool`]: the outage spool, verified deliveries Kafka could not take in time.
//! * [`store_file`]: opening the redb files, refusing damaged ones.
//! * [`secrets`]: secrets from files, read again when they change.
//! * [`file_watch`]: watching the files read while serving, and when one is settled.

pub mod encode;
pub mod file_watch;
pub mod ledger;
pub mod providers;
pub mod publish;
pub mod secrets;
pub mod spool;
pub mod store_file;
