//! Integration tests against a real Kafka-protocol broker (tansu), real HTTP
//! over loopback and the real embedded ledger. Run them with `scripts/test`,
//! which starts the broker and sets `POSBRIDGE_TEST_BROKERS`.

mod support;

mod broker_outage;
mod catch_up;
mod consumers;
mod crash;
mod damaged_files;
mod dedup;
mod ledger_full;
mod ordering;
mod registry;
mod rejects;
mod replay;
mod round_trip;
mod shared_ledger;
mod slow_clients;
mod spool;
mod status_page;
mod tls;
