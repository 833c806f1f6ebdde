//! The data line and the loops that drive it. The pipeline is the one path
//! every record takes; the others feed it or keep what it relies on.
//!
//! * [`pipeline`]: the data line the ingress, the reconciler, the drain and the replay call.
//! * [`lookup`]: finds an entity's records and the ledger's state of it.
//! * [`drain`]: replays the spool through the pipeline once Kafka is back.
//! * [`rebuild`]: fills a lost ledger from the topics at start.
//! * [`reconcile`]: reads what webhooks missed from the providers' APIs.
//! * [`rederive`]: derives the topics' states again with today's code.
//! * [`replay`]: puts dead letters through the pipeline again once their cause is cleared.
//! * [`watchdog`]: notices switched-off webhooks, resumes them, catches up.
//! * [`ticker`]: the tick of background loops that stop with the service.

pub mod drain;
pub mod lookup;
pub mod pipeline;
pub mod rebuild;
pub mod reconcile;
pub mod rederive;
pub mod replay;
pub mod ticker;
pub mod watchdog;
