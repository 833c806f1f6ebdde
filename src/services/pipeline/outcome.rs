//! What the pipeline answers: the outcome of a delivery, why one was not
//! handled, and what a redelivered dead letter came to.

use crate::adapters::encode::EncodeError;
use crate::adapters::ledger::LedgerError;
use crate::adapters::publish::PublishError;
use crate::adapters::spool::SpoolError;
use crate::domain::event::EntityKey;
use crate::observe::traces::DeliveryTrace;

/// What the pipeline did with an event; the `outcome` metric label of a
/// handled request and of a reconciled record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Produced and acknowledged (including tombstones).
    Published,
    /// Already handled, nothing produced.
    Duplicate,
    /// Older than the entity's written state, not produced.
    Stale,
    /// Same content as written, not produced.
    Unchanged,
    /// Written to the dead-letter topic.
    DeadLettered,
    /// Kafka could not take it in time: kept in the outage spool, to be
    /// published by the drainer.
    Spooled,
}

impl Outcome {
    /// Every outcome, for series that exist from start-up.
    pub const ALL: [Outcome; 6] = [
        Outcome::Published,
        Outcome::Duplicate,
        Outcome::Stale,
        Outcome::Unchanged,
        Outcome::DeadLettered,
        Outcome::Spooled,
    ];

    /// The 2xx answer's body, `{"status":"<outcome>"}`, written once: the
    /// usual answer costs no serialization.
    pub fn answer(self) -> &'static str {
        match self {
            Outcome::Published => r#"{"status":"published"}"#,
            Outcome::Duplicate => r#"{"status":"duplicate"}"#,
            Outcome::Stale => r#"{"status":"stale"}"#,
            Outcome::Unchanged => r#"{"status":"unchanged"}"#,
            Outcome::DeadLettered => r#"{"status":"dead_lettered"}"#,
            Outcome::Spooled => r#"{"status":"spooled"}"#,
        }
    }

    /// The label value, and the `status` of the 2xx answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Published => "published",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Unchanged => "unchanged",
            Outcome::DeadLettered => "dead_lettered",
            Outcome::Spooled => "spooled",
        }
    }
}

/// What became of a webhook delivery, with what the operator's page shows
/// of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Handled {
    /// The outcome, answered 2xx.
    pub outcome: Outcome,
    /// The provider's event type, once the body was read as an event.
    pub event_type: Option<compact_str::CompactString>,
    /// The entity's record key, once the event was normalized.
    pub entity_key: Option<String>,
    /// A dead letter's reason code, so the operator sees why without
    /// reading the dead-letter topic.
    pub dead_letter_reason: Option<&'static str>,
}

impl Handled {
    /// An outcome decided before the body was read as an event.
    pub(super) fn bare(outcome: Outcome) -> Handled {
        Handled {
            outcome,
            event_type: None,
            entity_key: None,
            dead_letter_reason: None,
        }
    }

    /// What a delivery whose record was sent came to: `outcome`, with a
    /// dead letter's reason `code`.
    pub(super) fn sent(self, outcome: Outcome, code: Option<&'static str>) -> Handled {
        Handled {
            outcome,
            dead_letter_reason: code,
            ..self
        }
    }
}

/// Why a delivery was not handled. The ingress turns each into a status.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The delivery id header does not equal the body's `id`: retrying the
    /// same bytes cannot help.
    #[error("the delivery id header does not equal the body's `id`")]
    DeliveryIdMismatch,
    /// A duplicate waited for the same delivery in flight, and it is still
    /// running.
    #[error("the same delivery is still being processed")]
    InFlight,
    /// The ledger could not be read or written.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerError),
    /// The record was not acknowledged in time.
    #[error("publish: {0}")]
    Publish(#[from] PublishError),
    /// The event could not be encoded for its topic (none the encoder was
    /// built for: a bug, retried in case a restart mends it).
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The answer budget (`delivery_timeout_ms` + `inflight_wait_ms`) ran out.
    #[error("no durable outcome within the answer budget")]
    DeadlinePassed,
    /// The outage spool could not take the delivery (full, or its disk failed).
    #[error("spool: {0}")]
    Spool(#[from] SpoolError),
}

impl PipelineError {
    /// Whether the provider's retry may succeed: everything but a request
    /// that is wrong in itself.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, PipelineError::DeliveryIdMismatch)
    }

    /// Whether the cause is a state already logged once when it began (no
    /// broker answers, ledger writes failing, the ledger being filled from
    /// the topics), so each refused delivery need
    /// not say it again.
    pub fn is_announced(&self) -> bool {
        match self {
            PipelineError::Publish(error) => error.is_announced(),
            PipelineError::Ledger(
                LedgerError::Unwritable { .. }
                | LedgerError::Rebuilding { .. }
                | LedgerError::Lost
                | LedgerError::Changed { .. },
            ) => true,
            _ => false,
        }
    }

    /// Whether the spool may take the delivery instead: Kafka, the registry
    /// or the ledger could not make its outcome durable in time (not a wrong
    /// request, and not the same delivery still being processed).
    pub(super) fn spoolable(&self) -> bool {
        !matches!(
            self,
            PipelineError::DeliveryIdMismatch | PipelineError::InFlight | PipelineError::Spool(_)
        )
    }
}

/// What putting a dead letter through again came to, or on a dry run would
/// come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redelivery {
    /// Through the guard: `Published`, `Stale` or `Unchanged` (on a dry run,
    /// what the guard decides against the ledger now).
    Applied {
        /// What the guard decided, and for a redelivery what was done.
        outcome: Outcome,
        /// The entity it is about.
        entity: EntityKey,
    },
    /// It still cannot be normalized, encoded or taken by the broker. It is
    /// not dead-lettered again: its dead letter is still on the topic.
    StillFailing {
        /// A bounded reason code, as on a dead letter.
        code: &'static str,
        /// The reason in words.
        reason: String,
    },
}

impl Redelivery {
    pub(super) fn still_failing(code: &'static str, reason: impl ToString) -> Redelivery {
        Redelivery::StillFailing {
            code,
            reason: reason.to_string(),
        }
    }
}

/// The reason code of a body whose `id` names another delivery than its
/// dead letter's header: only a foreign record can look like that.
pub(super) const MISMATCH_CODE: &str = "delivery_id_mismatch";

/// Puts how work no request waits for ended on its span (for a webhook,
/// the request's answer does that).
pub(super) fn ended(trace: &DeliveryTrace, result: &Result<Outcome, PipelineError>) {
    match result {
        Ok(outcome) => trace.outcome(outcome.as_str(), None),
        Err(error) => trace.failed(error),
    }
}

#[cfg(test)]
mod tests {
    use super::Outcome;

    /// Each answer written out is the JSON of its outcome's `status`.
    #[test]
    fn each_written_answer_is_its_status_as_json() {
        for outcome in Outcome::ALL {
            let json = serde_json::json!({ "status": outcome.as_str() }).to_string();
            assert_eq!(outcome.answer(), json, "{outcome:?}");
        }
    }
}
