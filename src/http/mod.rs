//! The listeners: the webhook ingress with its status mapping, the ops
//! endpoints (health, metrics) and the admin listener with the status page.
//!
//! * [`ingress`]: routes, the webhook handler, the one place errors become HTTP answers.
//! * [`status`]: the status page drawn from the board.

pub mod ingress;
pub mod status;
