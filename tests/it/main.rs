//! Integration tests against real servers: Apache Kafka (or tansu with
//! `POSBRIDGE_TEST_BROKER=tansu`), Apicurio Registry, Redis, real HTTP over
//! loopback and the real embedded ledger. Run them with `scripts/test`,
//! which starts the servers and names them in `POSBRIDGE_TEST_*` variables.

mod support;

mod broker_outage;
mod catch_up;
mod compaction;
mod compose;
mod consumers;
mod crash;
mod damaged_files;
mod dead_letter_limit;
mod dedup;
mod deploy;
mod dev_stack;
mod event_times;
mod fair_shares;
mod hostile_api;
mod kafka_acls;
mod kafka_security;
mod leader_loss;
mod ledger_full;
mod ledger_topics;
mod long_outage;
mod lookup;
mod monitoring;
mod ordering;
mod outage_start;
mod rebuild;
mod rederive;
mod redis_cluster;
mod redis_lost_writes;
mod redis_refusals;
mod redis_schedules;
mod registry;
mod registry_auth;
mod rejects;
mod replay;
mod replicas;
mod rolling_restart;
mod round_trip;
mod secret_rotation;
mod shared_ledger;
mod sink;
mod slow_clients;
mod source_owners;
mod sources_dir;
mod spool;
mod spool_full;
mod status_page;
mod tls;
mod topic_changes;
mod topic_failure;
mod traces;
