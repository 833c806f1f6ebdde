//! What posbridge decides without I/O, and the words every other floor
//! uses: the normalized event and its identifiers, the rule that keeps an
//! older state out of the topic, and the signature schemes a webhook is
//! verified with. Nothing here reads a file, a socket or the clock of a
//! server; every floor above builds on it.
//!
//! * [`event`]: the normalized event and its identifiers.
//! * [`guard`]: an older state never overwrites a newer one.
//! * [`verify`]: signature schemes, constant-time, several secrets.
//! * [`secret`]: a secret value that never reaches a log.
//! * [`record_at`]: where a record lies in Kafka.

pub mod event;
pub mod guard;
pub mod record_at;
pub mod secret;
pub mod verify;
