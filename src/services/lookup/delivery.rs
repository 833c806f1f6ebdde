//! "What became of delivery X?": what the ledger remembers of a delivery id
//! (in flight, or done: the outcome posbridge answered, when, and where its
//! record lies), and that record read back from its topic. One ledger read
//! and one record per provider the id may be of, whatever the topics hold.

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Deadline, Lookup, LookupError, RecordView, Unread};
use crate::adapters::ledger::{Answered, Recorded, Remembered};
use crate::domain::event::{DeliveryKey, ProviderKind, from_micros};
use crate::domain::record_at::RecordAt;
use crate::services::pipeline::{HEADER_DELIVERY_ID, HEADER_PROVIDER};
use crate::services::replay::Reader;

/// What a lookup of a delivery id found.
#[derive(Debug, Serialize)]
pub struct DeliveryReport {
    /// The id looked up, as given.
    pub delivery: String,
    /// Each provider-scoped id the ledger knows (one, nearly always).
    pub found: Vec<DeliveryFound>,
    /// Why nothing was found, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why the ledger's answer may be behind, when it may.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_note: Option<&'static str>,
}

/// One provider-scoped delivery id the ledger knows.
#[derive(Debug, Serialize)]
pub struct DeliveryFound {
    /// `{provider}:{delivery id}`.
    pub key: String,
    /// `done`, or `in_flight` while an attempt holds its lease.
    pub state: &'static str,
    /// What it was answered (`published`, `stale`, `unchanged`,
    /// `dead_lettered`; `unknown` for an id an earlier version marked done).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<&'static str>,
    /// When its outcome was made durable (RFC 3339, µs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_at: Option<String>,
    /// Until when the ledger remembers it (a retry until then is answered
    /// 2xx without producing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remembered_until: Option<String>,
    /// The record it wrote, read back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<PlacedRecord>,
}

/// A delivery's record: where the ledger says it lies, and what is there.
#[derive(Debug, Serialize)]
pub struct PlacedRecord {
    /// Where it lies: `topic`, `partition` and `offset` in the JSON.
    #[serde(flatten)]
    pub at: RecordAt,
    /// What the topic holds there; none when it no longer does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<RecordView>,
    /// Why the record is not shown, or not this delivery's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Lookup {
    /// What posbridge answered the delivery `id` (`{provider}:{id}`, or a
    /// provider's id alone, looked up for each provider; a scoped one is
    /// also looked up as given), and its record.
    ///
    /// # Errors
    /// [`LookupError`] when the ledger cannot be read; a record that cannot
    /// be read is said in its `note`, beside what the ledger knows.
    pub async fn delivery(&self, id: &str) -> Result<DeliveryReport, LookupError> {
        let _running = self.permit()?;
        // Scoped (`mekari:abc`: Mekari's `abc`), then as given for each
        // provider: an id that itself begins with a provider's name and a
        // colon is found either way.
        let keys: Vec<DeliveryKey> = provider_scoped(id)
            .map(|(provider, rest)| DeliveryKey::new(provider, rest))
            .into_iter()
            .chain(
                ProviderKind::ALL
                    .into_iter()
                    .map(|provider| DeliveryKey::new(provider, id)),
            )
            .collect();
        let mut found = Vec::new();
        let deadline = Deadline::start();
        for key in keys {
            match self.ledger.read().remembered(&key).await? {
                Remembered::Nothing => {}
                Remembered::InFlight => found.push(DeliveryFound {
                    key: key.to_string(),
                    state: "in_flight",
                    outcome: None,
                    answered_at: None,
                    remembered_until: None,
                    record: None,
                }),
                Remembered::Done { answered, until } => {
                    found.push(self.done(&key, answered, until, &deadline).await);
                }
            }
        }
        let note = found.is_empty().then(|| {
            format!(
                "the ledger does not know this delivery: not received, not decided yet (in the outage spool), or forgotten {} s after its answer (ledger.dedup_ttl_secs); an entity's records are found by its key (lookup --entity)",
                self.config.ledger.dedup_ttl_secs
            )
        });
        Ok(DeliveryReport {
            delivery: id.to_owned(),
            found,
            note,
            ledger_note: self.ledger_note(),
        })
    }

    async fn done(
        &self,
        key: &DeliveryKey,
        answered: Answered,
        until: Option<i64>,
        deadline: &Deadline,
    ) -> DeliveryFound {
        let record = match answered.place {
            Some(place) => Some(self.placed(key, answered.outcome, place, deadline).await),
            None => None,
        };
        DeliveryFound {
            key: key.to_string(),
            state: "done",
            outcome: Some(answered.outcome.as_str()),
            answered_at: (answered.at_micros != 0)
                .then(|| from_micros(answered.at_micros).and_then(rfc3339))
                .flatten(),
            remembered_until: until
                .and_then(|until| OffsetDateTime::from_unix_timestamp(until).ok())
                .and_then(rfc3339),
            record,
        }
    }

    /// The record at `place`, checked to be `key`'s: a compacted topic may
    /// have replaced it with a newer record of its entity, and retention
    /// may have removed it. A dead letter (`outcome` says) is shown raw, an
    /// entity record decoded.
    async fn placed(
        &self,
        key: &DeliveryKey,
        outcome: Recorded,
        place: RecordAt,
        deadline: &Deadline,
    ) -> PlacedRecord {
        let mut placed = PlacedRecord {
            at: place,
            read: None,
            note: None,
        };
        if let Err(unread) = self.read_placed(key, outcome, &mut placed, deadline).await {
            placed.note = Some(format!("the record could not be read: {unread}"));
        }
        placed
    }

    /// Reads the record at `placed`'s place into it, or says in its note
    /// why it is not shown.
    async fn read_placed(
        &self,
        key: &DeliveryKey,
        outcome: Recorded,
        placed: &mut PlacedRecord,
        deadline: &Deadline,
    ) -> Result<(), Unread> {
        let (partition, offset) = (placed.at.partition, placed.at.offset);
        let mut reader = Reader::new(&self.config.kafka, &placed.at.topic)?;
        let extent = deadline
            .read(reader.extents())
            .await?
            .into_iter()
            .find(|extent| extent.partition == partition);
        let Some(extent) = extent.filter(|extent| extent.low <= offset && offset < extent.high)
        else {
            placed.note = Some("the topic no longer keeps this offset (retention)".to_owned());
            return Ok(());
        };
        reader.assign(partition, offset, extent.high)?;
        let Some(record) = deadline.read(reader.next()).await? else {
            placed.note = Some("the topic no longer keeps this record".to_owned());
            return Ok(());
        };
        if record.offset != offset {
            placed.note = Some(format!(
                "compacted away: a newer record of its key replaced it (the next record kept is at offset {})",
                record.offset
            ));
            return Ok(());
        }
        let (view, own) = if outcome == Recorded::DeadLettered {
            let own = record.key.as_deref() == Some(key.as_str());
            (dead_letter_view(record), own)
        } else {
            let scoped = record
                .header(HEADER_PROVIDER)
                .and_then(ProviderKind::parse)
                .zip(record.header(HEADER_DELIVERY_ID))
                .map(|(provider, id)| DeliveryKey::new(provider, id));
            let own = scoped.as_ref() == Some(key);
            (self.entity_view(record).await, own)
        };
        if !own {
            placed.note = Some("the record there is not this delivery's".to_owned());
        }
        placed.read = Some(view);
        Ok(())
    }
}

/// A dead letter as a lookup shows it: its raw body, as JSON when it is.
fn dead_letter_view(record: crate::services::replay::Letter) -> RecordView {
    let value = record.body.as_deref().map(|body| {
        serde_json::from_slice(body)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(body).into()))
    });
    RecordView {
        offset: record.offset,
        timestamp_ms: record.timestamp_ms,
        headers: record.headers,
        value,
        error: None,
    }
}

/// `text`'s provider and the rest, when it starts with a provider's name
/// and a colon (`mekari:…`): a scoped delivery id, or an entity key.
pub fn provider_scoped(text: &str) -> Option<(ProviderKind, &str)> {
    let (provider, rest) = text.split_once(':')?;
    Some((ProviderKind::parse(provider)?, rest))
}

fn rfc3339(at: OffsetDateTime) -> Option<String> {
    at.format(&Rfc3339).ok()
}
