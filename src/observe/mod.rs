//! What the service tells about itself, gathered on one floor so every
//! stage reports through the same names: metrics, spans, the operator's
//! board, and the progress of a long run.
//!
//! * [`telemetry`]: every metric name and label key; the Prometheus recorder.
//! * [`traces`]: a span per delivery and its stages over OTLP, the records' `traceparent`.
//! * [`delivery`]: each stage's counter beside its one log line, and the
//!   series made to exist at start-up.
//! * [`gone`]: the series of sources no longer in use, left off `/metrics`.
//! * [`board`]: the in-memory board of recent deliveries, webhook checks and
//!   reconcile runs that the status page draws.
//! * [`progress`]: a long run's live line or periodic log line.
//! * [`panics`]: the text of a caught panic.

pub mod board;
pub mod delivery;
pub mod gone;
pub mod panics;
pub mod progress;
pub mod telemetry;
pub mod traces;

pub use board::Board;
