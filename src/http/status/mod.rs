//! The operator's view: the in-memory board of recent deliveries, webhook
//! checks and reconcile runs (`board.rs`), and the page drawn from it
//! (`page.rs`, its charts in `chart.rs`). Served by `ingress::admin` on the admin listener.

pub mod board;
pub mod chart;
pub mod page;

pub use board::Board;
pub use page::{Health, Status};
