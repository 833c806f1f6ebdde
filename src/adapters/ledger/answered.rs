//! What the ledger remembers of a done delivery beside its id: the outcome
//! posbridge answered, when, and where its record lies, so "what became of
//! delivery X?" is answered from the ledger (`posbridge lookup --delivery`)
//! without reading a topic from its start. Kept in the same write as the
//! done id, under the same key, for as long (`ledger.dedup_ttl_secs`): one
//! value of a few dozen bytes instead of a mark, no second index.

use std::sync::Arc;

use crate::domain::event::{DeliveryKey, micros};
use crate::domain::record_at::RecordAt;

/// A delivery done: its id and what it was answered, the ledger's part of a
/// [`super::Commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The provider-scoped delivery id.
    pub key: DeliveryKey,
    /// What it came to.
    pub answered: Answered,
    /// Read back from its record by a fill, which knows less than the answer
    /// given (an entity record's time is its event's): an answer the store
    /// already holds is kept. Redis keeps it (`SET NX`); the embedded store
    /// writes it, since what it held past its recorded offsets was lost with
    /// the crash that makes a fill read them.
    pub read_back: bool,
}

impl Done {
    /// `key` published now, where untold: a done id as tests and tools
    /// write one.
    pub fn published_now(key: DeliveryKey) -> Done {
        Done {
            key,
            answered: Answered::now(Recorded::Published, None),
            read_back: false,
        }
    }
}

/// What a done delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The outcome.
    pub outcome: Recorded,
    /// When the outcome was made durable, µs since the epoch; 0 when not
    /// known (a done id the ledger was filled with from an entity record,
    /// whose time is its event's; a dead letter's is its arrival).
    pub at_micros: i64,
    /// Where its record lies; none when nothing was written.
    pub place: Option<RecordAt>,
}

/// The outcome of a done delivery as the ledger keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Written before the ledger kept outcomes (an older version's done
    /// mark), or by a store that keeps marks only.
    Unknown,
    /// Its entity's record was produced and acknowledged.
    Published,
    /// Older than the entity's written state: nothing produced.
    Stale,
    /// The same content as written: nothing produced.
    Unchanged,
    /// Written to the dead-letter topic.
    DeadLettered,
}

impl Recorded {
    /// The word an answer uses (the pipeline's outcome label).
    pub fn as_str(self) -> &'static str {
        match self {
            Recorded::Unknown => "unknown",
            Recorded::Published => "published",
            Recorded::Stale => "stale",
            Recorded::Unchanged => "unchanged",
            Recorded::DeadLettered => "dead_lettered",
        }
    }

    fn code(self) -> u8 {
        match self {
            Recorded::Unknown => 0,
            Recorded::Published => 1,
            Recorded::Stale => 2,
            Recorded::Unchanged => 3,
            Recorded::DeadLettered => 4,
        }
    }

    fn of_code(code: u8) -> Recorded {
        match code {
            1 => Recorded::Published,
            2 => Recorded::Stale,
            3 => Recorded::Unchanged,
            4 => Recorded::DeadLettered,
            _ => Recorded::Unknown,
        }
    }
}

/// The storage form's first byte: its layout, so a later one can be told apart.
const LAYOUT: u8 = 1;
/// Layout, outcome, time.
const HEAD: usize = 1 + 1 + 8;
/// A place's partition and offset, before its topic.
const PLACE: usize = 4 + 8;

impl Answered {
    /// An outcome made durable now.
    pub fn now(outcome: Recorded, place: Option<RecordAt>) -> Answered {
        Answered {
            outcome,
            at_micros: micros(time::OffsetDateTime::now_utc()),
            place,
        }
    }

    /// The storage form, the same in both backends: the layout byte, the
    /// outcome, the time (big-endian), then the place's partition, offset
    /// and topic when there is one.
    pub fn to_bytes(&self) -> Vec<u8> {
        let topic = self
            .place
            .as_ref()
            .map_or(0, |place| PLACE + place.topic.len());
        let mut bytes = Vec::with_capacity(HEAD + topic);
        self.write_to(&mut bytes);
        bytes
    }

    /// Appends the storage form to `bytes`.
    pub fn write_to(&self, bytes: &mut Vec<u8>) {
        bytes.push(LAYOUT);
        bytes.push(self.outcome.code());
        bytes.extend_from_slice(&self.at_micros.to_be_bytes());
        if let Some(place) = &self.place {
            bytes.extend_from_slice(&place.partition.to_be_bytes());
            bytes.extend_from_slice(&place.offset.to_be_bytes());
            bytes.extend_from_slice(place.topic.as_bytes());
        }
    }

    /// Reads the storage form back. Anything else (an older version's
    /// mark, `1` on Redis) is a done delivery whose outcome is unknown.
    pub fn from_bytes(bytes: &[u8]) -> Answered {
        let unknown = Answered {
            outcome: Recorded::Unknown,
            at_micros: 0,
            place: None,
        };
        if bytes.len() < HEAD || bytes[0] != LAYOUT {
            return unknown;
        }
        let at_micros = i64::from_be_bytes(bytes[2..HEAD].try_into().unwrap_or_default());
        let place = bytes
            .get(HEAD..)
            .filter(|rest| rest.len() >= PLACE)
            .and_then(|rest| {
                Some(RecordAt {
                    partition: i32::from_be_bytes(rest[..4].try_into().ok()?),
                    offset: i64::from_be_bytes(rest[4..PLACE].try_into().ok()?),
                    topic: Arc::from(std::str::from_utf8(&rest[PLACE..]).ok()?),
                })
            });
        Answered {
            outcome: Recorded::of_code(bytes[1]),
            at_micros,
            place,
        }
    }
}

/// What the ledger knows of a delivery id now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    /// Not known: never seen, not decided yet (spooled), or forgotten after
    /// `ledger.dedup_ttl_secs`.
    Nothing,
    /// An attempt holds its lease right now.
    InFlight,
    /// Done: what it came to, and until when (unix second, when the store
    /// says) the ledger remembers it.
    Done {
        /// What it came to.
        answered: Answered,
        /// The unix second after which it is forgotten.
        until: Option<i64>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_storage_form_reads_back() {
        for answered in [
            Answered {
                outcome: Recorded::Published,
                at_micros: 1_764_000_000_123_456,
                place: Some(RecordAt {
                    topic: "acme.sales".into(),
                    partition: 5,
                    offset: 1 << 40,
                }),
            },
            Answered {
                outcome: Recorded::Stale,
                at_micros: -1,
                place: None,
            },
        ] {
            assert_eq!(Answered::from_bytes(&answered.to_bytes()), answered);
        }
        assert_eq!(Answered::from_bytes(b"1").outcome, Recorded::Unknown);
        assert_eq!(Answered::from_bytes(&[]).outcome, Recorded::Unknown);
    }
}
