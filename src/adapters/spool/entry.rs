//! One spooled delivery, and how it is stored: its header as JSON, a
//! newline and the verified body, in a frame with a checksum (`frame.rs`).

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::frame::{self, Damage};
use crate::domain::event::{DeliveryKey, ProviderKind, Source, from_micros, micros};

/// One spooled delivery: everything the pipeline needs to process it later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpooledDelivery {
    /// Its dedup key in the ledger (the provider and its delivery id); kept
    /// as stored, so an entry is removed under the key it was added with.
    pub key: DeliveryKey,
    /// The source it came through (its account is part of record keys).
    pub source: Source,
    /// The delivery-id header's value.
    pub delivery_id: String,
    /// When it arrived.
    pub received_at: OffsetDateTime,
    /// The verified body, exactly as signed.
    pub body: Bytes,
}

/// How every entry's header begins (`key` is its first field): what the
/// salvage looks for inside a damaged run of bytes, where a second entry
/// whose frame header the damage took may still be.
pub(super) const HEADER_START: &[u8] = b"{\"key\":\"";

/// The stored header of an entry; the body follows it after a newline.
#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    provider: ProviderKind,
    source: String,
    account: Option<String>,
    /// Absent for a source on the shared topics (and in entries written
    /// before sources had topics of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topic_prefix: Option<String>,
    delivery_id: String,
    received_at_us: i64,
}

impl SpooledDelivery {
    /// The entry as stored: its header and body in a frame (`frame.rs`).
    pub(super) fn encode(&self) -> Vec<u8> {
        let header = Header {
            key: self.key.as_str().to_owned(),
            provider: self.source.provider,
            source: self.source.name.clone(),
            account: self.source.account.clone(),
            topic_prefix: self.source.topic_prefix.as_deref().map(str::to_owned),
            delivery_id: self.delivery_id.clone(),
            received_at_us: micros(self.received_at),
        };
        // A struct of strings and numbers always serializes.
        let mut payload = serde_json::to_vec(&header).expect("a spool header serializes");
        payload.push(b'\n');
        payload.extend_from_slice(&self.body);
        frame::seal(&payload)
    }

    /// An entry as stored, its checksum verified (an entry written before
    /// frames existed has none, and is read as it is).
    ///
    /// # Errors
    /// [`Damage`] when the frame does not verify or the header does not decode.
    pub(super) fn decode(stored: &[u8]) -> Result<SpooledDelivery, Damage> {
        SpooledDelivery::from_payload(frame::open(stored)?)
    }

    /// An entry from its header JSON, a newline and its body.
    pub(super) fn from_payload(bytes: &[u8]) -> Result<SpooledDelivery, Damage> {
        let split = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(Damage::Header)?;
        let header: Header = serde_json::from_slice(&bytes[..split]).map_err(|_| Damage::Header)?;
        Ok(SpooledDelivery {
            key: DeliveryKey::from_stored(header.key),
            source: Source {
                provider: header.provider,
                name: header.source,
                account: header.account,
                topic_prefix: header.topic_prefix.map(std::sync::Arc::from),
            },
            delivery_id: header.delivery_id,
            received_at: from_micros(header.received_at_us).ok_or(Damage::Header)?,
            body: Bytes::copy_from_slice(&bytes[split + 1..]),
        })
    }
}
