//! The operator's page, drawn from [`crate::observe::board`] and the spool's
//! and ledger's figures (`page.rs`, its charts in `chart.rs`), and its
//! lookup of a delivery or an entity (`lookup.rs`). Served by
//! `ingress::admin` on the admin listener.

pub mod chart;
pub mod lookup;
pub mod page;
pub mod sources;

pub use page::{Health, Shown, Status};
pub use sources::{Origin, RefusedFile, SourceView, SourcesReport};
