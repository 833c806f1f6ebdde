//! The records the pipeline produces, built without I/O: an entity's state
//! (or tombstone) on its compacted topic, and a raw body on the dead-letter
//! topic. Key, headers and timestamp are decided here and nowhere else;
//! the trace context a record carries (`traceparent`, when traces are on)
//! comes in as headers of the producing span (`traces::StageSpan::record_headers`).

use std::sync::Arc;

use compact_str::{CompactString, ToCompactString as _, format_compact};
use time::OffsetDateTime;

use crate::adapters::encode::SCHEMA_REVISION;
use crate::adapters::publish::OutgoingRecord;
use crate::domain::event::{DeliveryKey, EntityKey, PosEvent, ProviderKind, Version};
use crate::domain::guard::EntityState;

/// Record header: the provider's delivery id.
pub const HEADER_DELIVERY_ID: &str = "posbridge-delivery-id";
/// Record header: provider name.
pub const HEADER_PROVIDER: &str = "posbridge-provider";
/// Record header: the event type as the provider sent it.
pub const HEADER_EVENT_TYPE: &str = "posbridge-event-type";
/// Record header: configured source name.
pub const HEADER_SOURCE: &str = "posbridge-source";
/// Record header: webhook or reconciler.
pub const HEADER_ORIGIN: &str = "posbridge-origin";
/// Entity record header: the state's version, `<microseconds since the
/// epoch>:<rank>` in decimal ([`Version`]): with the state hash, what the
/// stale guard compares, so the ledger's entity states can be rebuilt from
/// the topics.
pub const HEADER_VERSION: &str = "posbridge-version";
/// Entity record header: the state hash the guard compares, 32 hex digits.
pub const HEADER_STATE_HASH: &str = "posbridge-state-hash";
/// Entity record header: the revision of the schema its value was written
/// with ([`crate::adapters::encode::SCHEMA_REVISION`]); records of earlier
/// versions have none, which a Kafka Connect predicate tells apart.
pub const HEADER_SCHEMA: &str = "posbridge-schema";
/// Entity record header: when the delivery that wrote it arrived (a
/// reconciled record: when it was fetched), microseconds since the epoch in
/// decimal. The record's timestamp is its event's time, which consumers
/// read as such; a delivery's id is remembered for `dedup_ttl` after its
/// arrival, so a ledger filled from the topics restores done ids by this.
pub const HEADER_RECEIVED_AT: &str = "posbridge-received-at";
/// Dead-letter header: why the event could not be normalized or published.
pub const HEADER_REASON: &str = "posbridge-reason";
/// Dead-letter header: the reason as a bounded code (`invalid_field`,
/// `publish_refused`, …), the metric label, so a replay can select by it.
pub const HEADER_REASON_CODE: &str = "posbridge-reason-code";

/// What could not become an event, kept raw for an operator.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// Who sent it.
    pub provider: ProviderKind,
    /// Through which source.
    pub source: &'a str,
    /// Its source's own topics' prefix; none for the shared topics.
    pub topic_prefix: Option<&'a str>,
    /// The delivery id (or a reconciled record's derived id); the record key.
    pub delivery_id: &'a str,
    /// When it arrived; the record timestamp.
    pub received_at: OffsetDateTime,
    /// The bytes exactly as received.
    pub body: Vec<u8>,
    /// A bounded reason code, the metric label.
    pub code: &'static str,
    /// The reason in words, the `posbridge-reason` header.
    pub reason: String,
}

impl<'a> DeadLetter<'a> {
    /// The raw body of an event that normalized but could not be written.
    pub fn of_event(event: &'a PosEvent, code: &'static str, reason: String) -> DeadLetter<'a> {
        DeadLetter {
            provider: event.provider,
            source: &event.source,
            topic_prefix: event.topic_prefix.as_deref(),
            delivery_id: &event.event_id,
            received_at: event.received_at,
            body: event.raw.to_vec(),
            code,
            reason,
        }
    }
}

/// An entity's state on its topic, keyed by the entity (`key`, the
/// event's own, built once by the caller); `payload` `None` writes a
/// tombstone. Timestamped with when the change happened; `state` (the
/// guard's view of it) goes into its headers. `trace`: the producing span's
/// context headers (none when traces are off).
pub fn entity_record(
    event: &PosEvent,
    key: &EntityKey,
    state: &EntityState,
    topic: &Arc<str>,
    payload: Option<Vec<u8>>,
    trace: Vec<(&'static str, String)>,
) -> OutgoingRecord {
    debug_assert_eq!(*key, event.key(), "the record is keyed by its own entity");
    let mut headers = vec![
        (HEADER_DELIVERY_ID, event.event_id.clone()),
        (
            HEADER_PROVIDER,
            CompactString::const_new(event.provider.as_str()),
        ),
        (HEADER_EVENT_TYPE, event.event_type.clone()),
        (HEADER_SOURCE, event.source.clone()),
        (
            HEADER_ORIGIN,
            CompactString::const_new(event.origin.as_str()),
        ),
        (
            HEADER_VERSION,
            format_compact!("{}:{}", state.version.at_micros, state.version.rank),
        ),
        (HEADER_STATE_HASH, hex::encode(state.state_hash).into()),
        (HEADER_SCHEMA, CompactString::const_new(SCHEMA_REVISION)),
        (
            HEADER_RECEIVED_AT,
            micros(event.received_at).to_compact_string(),
        ),
    ];
    with_trace(&mut headers, trace);
    OutgoingRecord {
        topic: topic.clone(),
        key: key.as_str().to_owned(),
        payload,
        timestamp_ms: millis(event.occurred_at),
        headers,
        provider: event.provider.as_str(),
    }
}

/// A dead letter on the dead-letter topic, keyed by its delivery and
/// timestamped with its arrival; `trace` as for [`entity_record`].
pub fn dead_letter_record(
    letter: DeadLetter<'_>,
    topic: &Arc<str>,
    trace: Vec<(&'static str, String)>,
) -> OutgoingRecord {
    let mut headers = vec![
        (HEADER_DELIVERY_ID, letter.delivery_id.into()),
        (
            HEADER_PROVIDER,
            CompactString::const_new(letter.provider.as_str()),
        ),
        (HEADER_SOURCE, letter.source.into()),
        (HEADER_REASON, letter.reason.into()),
        (HEADER_REASON_CODE, CompactString::const_new(letter.code)),
    ];
    with_trace(&mut headers, trace);
    OutgoingRecord {
        topic: topic.clone(),
        key: DeliveryKey::new(letter.provider, letter.delivery_id)
            .as_str()
            .to_owned(),
        payload: Some(letter.body),
        timestamp_ms: millis(letter.received_at),
        headers,
        provider: letter.provider.as_str(),
    }
}

/// The entity state an entity record's headers describe: what the ledger
/// held for its key once the record was written. `None` for a record without
/// both headers (written before they existed) or with values this version
/// does not write: its state is unknown.
pub fn state_from_headers(version: &[u8], state_hash: &[u8]) -> Option<EntityState> {
    let (at_micros, rank) = std::str::from_utf8(version).ok()?.split_once(':')?;
    let mut hash = [0u8; 16];
    hex::decode_to_slice(state_hash, &mut hash).ok()?;
    Some(EntityState {
        version: Version {
            at_micros: at_micros.parse().ok()?,
            rank: rank.parse().ok()?,
        },
        state_hash: hash,
    })
}

/// Adds the trace context headers, when traces are on; off, the headers
/// stay as allocated.
fn with_trace(
    headers: &mut Vec<(&'static str, CompactString)>,
    trace: Vec<(&'static str, String)>,
) {
    if !trace.is_empty() {
        headers.extend(trace.into_iter().map(|(name, value)| (name, value.into())));
    }
}

/// How much of a body a dead letter keeps at most when the whole one was refused.
pub const DEAD_LETTER_KEPT_BYTES: usize = 64 * 1024;
/// On a cut dead letter: the whole body's length in bytes.
pub const HEADER_BODY_BYTES: &str = "posbridge-body-bytes";
/// On a cut dead letter: the whole body's SHA-256, hex.
pub const HEADER_BODY_SHA256: &str = "posbridge-body-sha256";
/// On a cut dead letter: why it was cut (the topic's limit, the broker's
/// refusal).
pub const HEADER_CUT_REASON: &str = "posbridge-cut-reason";

/// What a record of one batch takes on the broker beside its key, value
/// and headers: the batch header (61 bytes) and the record's own fields,
/// with room to spare.
const RECORD_OVERHEAD_BYTES: usize = 128;
/// What each header takes beside its name and value (two varint lengths).
const HEADER_OVERHEAD_BYTES: usize = 10;

/// The dead letter cut for a body the broker refused whole (too large):
/// the delivery still gets a permanent outcome, and the headers say how
/// long the body was, what it hashed to (so it can be matched with the
/// provider's copy) and `why` it was cut. It keeps the body's first
/// [`DEAD_LETTER_KEPT_BYTES`], fewer where the topic's `max.message.bytes`
/// (`limit`, when known) leaves less room beside the key and headers; a
/// `limit` with no room keeps none.
pub fn cut_dead_letter(
    mut record: OutgoingRecord,
    limit: Option<usize>,
    why: &str,
) -> OutgoingRecord {
    use sha2::{Digest, Sha256};
    let Some(mut body) = record.payload.take() else {
        return record;
    };
    record
        .headers
        .push((HEADER_BODY_BYTES, body.len().to_compact_string()));
    record.headers.push((
        HEADER_BODY_SHA256,
        hex::encode(Sha256::digest(&body[..])).into(),
    ));
    record.headers.push((HEADER_CUT_REASON, why.into()));
    let beside_body = RECORD_OVERHEAD_BYTES
        + record.key.len()
        + record
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len() + HEADER_OVERHEAD_BYTES)
            .sum::<usize>();
    let room = limit.map_or(DEAD_LETTER_KEPT_BYTES, |limit| {
        limit.saturating_sub(beside_body)
    });
    body.truncate(room.min(DEAD_LETTER_KEPT_BYTES));
    record.payload = Some(body);
    record
}

/// A record timestamp: milliseconds since the epoch.
fn millis(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// Microseconds since the epoch.
fn micros(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX)
}

/// When an entity record's delivery arrived, from its
/// [`HEADER_RECEIVED_AT`]: `None` for a record without it (written before
/// it existed) or with a value this version does not write.
pub fn received_at_from_header(value: &str) -> Option<i64> {
    value.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::event::Origin;
    use time::macros::datetime;

    fn event() -> PosEvent {
        PosEvent {
            account: Some("acme".into()),
            occurred_at: datetime!(2026-11-29 10:00:00.123 UTC),
            origin: Origin::Reconciler,
            raw: "{\"id\":\"O-1\"}".into(),
            ..PosEvent::sample()
        }
    }

    #[test]
    fn a_cut_dead_letter_keeps_the_head_and_says_what_the_whole_was() {
        let body = vec![b'x'; DEAD_LETTER_KEPT_BYTES + 10];
        let record = cut_dead_letter(
            dead_letter_record(
                DeadLetter::of_event(&event(), "publish_refused", "too large".into()),
                &"dlq".into(),
                Vec::new(),
            ),
            None,
            "refused whole",
        );
        assert_eq!(header(&record, HEADER_BODY_BYTES), Some("12"));
        let mut big = dead_letter_record(
            DeadLetter::of_event(&event(), "publish_refused", "too large".into()),
            &"dlq".into(),
            vec![("traceparent", TRACEPARENT.to_owned())],
        );
        big.payload = Some(body.clone());
        let cut = cut_dead_letter(big.clone(), None, "refused whole");
        assert_eq!(
            cut.payload.as_ref().map(Vec::len),
            Some(DEAD_LETTER_KEPT_BYTES)
        );
        assert_eq!(
            header(&cut, HEADER_BODY_BYTES),
            Some(body.len().to_string().as_str())
        );
        assert_eq!(
            header(&cut, HEADER_BODY_SHA256).map(str::len),
            Some(64),
            "hex SHA-256"
        );
        assert_eq!(header(&cut, HEADER_REASON), Some("too large"));
        assert_eq!(
            header(&cut, "traceparent"),
            Some(TRACEPARENT),
            "the cut copy is the same record"
        );
        assert_eq!(header(&cut, HEADER_CUT_REASON), Some("refused whole"));
        assert_eq!(
            record.payload.map(|p| p.len()),
            Some(12),
            "a short body stays whole"
        );

        // A topic that takes 4 KiB: the head that fits beside key and headers.
        let fitted = cut_dead_letter(big.clone(), Some(4096), "the topic takes 4096 bytes");
        let kept = fitted.payload.as_ref().map_or(0, Vec::len);
        let headers: usize = fitted.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(kept > 2048, "as much as fits: {kept}");
        assert!(
            kept + headers + fitted.key.len() + RECORD_OVERHEAD_BYTES <= 4096,
            "{kept} + {headers} fits"
        );
        assert_eq!(&fitted.payload.unwrap()[..], &body[..kept], "the head");
        let none = cut_dead_letter(big, Some(100), "the topic takes 100 bytes");
        assert_eq!(
            none.payload.as_ref().map(Vec::len),
            Some(0),
            "no room: no body"
        );
        assert_eq!(
            header(&none, HEADER_BODY_BYTES),
            Some(body.len().to_string().as_str())
        );
    }

    fn header<'a>(record: &'a OutgoingRecord, name: &str) -> Option<&'a str> {
        record.header(name)
    }

    #[test]
    fn an_entity_record_is_keyed_by_the_entity_and_stamped_when_it_happened() {
        let record = entity_record(
            &event(),
            &event().key(),
            &STATE,
            &"pos.orders".into(),
            Some(vec![1, 2]),
            Vec::new(),
        );
        assert_eq!(&*record.topic, "pos.orders");
        assert_eq!(record.key, "mekari:acme:O-1");
        assert_eq!(record.payload.as_deref(), Some(&[1u8, 2][..]));
        assert_eq!(record.timestamp_ms, 1_795_946_400_123);
        assert_eq!(header(&record, HEADER_DELIVERY_ID), Some("d1"));
        assert_eq!(header(&record, HEADER_PROVIDER), Some("mekari"));
        assert_eq!(header(&record, HEADER_EVENT_TYPE), Some("order.updated"));
        assert_eq!(header(&record, HEADER_SOURCE), Some("main"));
        assert_eq!(header(&record, HEADER_ORIGIN), Some("reconciler"));
        assert_eq!(header(&record, HEADER_REASON), None);
        assert_eq!(header(&record, HEADER_VERSION), Some("1795946400123000:42"));
        assert_eq!(
            header(&record, HEADER_STATE_HASH),
            Some("0707070707070707070707070707070a")
        );
        assert_eq!(header(&record, HEADER_SCHEMA), Some(SCHEMA_REVISION));
        assert_eq!(
            header(&record, HEADER_RECEIVED_AT),
            Some("1795946401000000"),
            "its arrival, not its event's time"
        );
        assert_eq!(
            record.headers.len(),
            9,
            "no trace context while traces are off"
        );
        let traced = entity_record(
            &event(),
            &event().key(),
            &STATE,
            &"pos.orders".into(),
            None,
            vec![("traceparent", TRACEPARENT.to_owned())],
        );
        assert_eq!(header(&traced, "traceparent"), Some(TRACEPARENT));
        assert_eq!(traced.headers.len(), 10);
    }

    /// An entity state, its hash ending apart from its other bytes.
    const STATE: EntityState = EntityState {
        version: Version {
            at_micros: 1_795_946_400_123_000,
            rank: 42,
        },
        state_hash: [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 10],
    };

    #[test]
    fn an_entity_records_headers_give_back_the_state_the_guard_compared() {
        let record = entity_record(
            &event(),
            &event().key(),
            &STATE,
            &"t".into(),
            None,
            Vec::new(),
        );
        let read = |name| header(&record, name).unwrap().as_bytes();
        assert_eq!(
            state_from_headers(read(HEADER_VERSION), read(HEADER_STATE_HASH)),
            Some(STATE)
        );
        for (version, hash) in [
            ("1795946400123000", "0707070707070707070707070707070a"),
            ("1795946400123000:x", "0707070707070707070707070707070a"),
            ("1795946400123000:42", "07070707"),
            ("1795946400123000:42", "not hex, not hex, not hex, not h"),
            ("", ""),
        ] {
            assert_eq!(
                state_from_headers(version.as_bytes(), hash.as_bytes()),
                None,
                "{version} {hash}"
            );
        }
    }

    /// A W3C trace context (the specification's own example).
    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_deleted_entity_is_a_tombstone_under_the_same_key() {
        let record = entity_record(
            &event(),
            &event().key(),
            &STATE,
            &"pos.orders".into(),
            None,
            Vec::new(),
        );
        assert_eq!(record.key, "mekari:acme:O-1");
        assert_eq!(record.payload, None);
    }

    #[test]
    fn a_dead_letter_keeps_the_raw_body_and_says_why() {
        let event = event();
        let letter = DeadLetter::of_event(&event, "publish_refused", "record too large".into());
        let record = dead_letter_record(
            letter,
            &"pos.dead-letter".into(),
            vec![("traceparent", TRACEPARENT.to_owned())],
        );
        assert_eq!(&*record.topic, "pos.dead-letter");
        assert_eq!(record.key, "mekari:d1");
        assert_eq!(record.payload.as_deref(), Some(&event.raw[..]));
        assert_eq!(record.timestamp_ms, 1_795_946_401_000);
        assert_eq!(header(&record, HEADER_REASON), Some("record too large"));
        assert_eq!(header(&record, HEADER_REASON_CODE), Some("publish_refused"));
        assert_eq!(header(&record, HEADER_SOURCE), Some("main"));
        assert_eq!(header(&record, HEADER_DELIVERY_ID), Some("d1"));
        assert_eq!(header(&record, HEADER_PROVIDER), Some("mekari"));
        assert_eq!(header(&record, HEADER_EVENT_TYPE), None);
        assert_eq!(header(&record, HEADER_ORIGIN), None);
        assert_eq!(header(&record, "traceparent"), Some(TRACEPARENT));
        assert_eq!(record.headers.len(), 6);
    }
}
