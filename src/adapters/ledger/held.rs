//! An entity's state as the ledger holds it, and its storage form, the same
//! in both backends.

use super::{EntitySlot, LedgerError};
use crate::domain::event::Version;
use crate::domain::guard::EntityState;

/// An entity's latest state, and the offset of the record that wrote it in
/// its key's partition. The guard needs only the state; `posbridge
/// rederive` needs the offset too: a record derived again and published in
/// another's place may carry the very state (version and hash) of the one
/// it replaces (a fix to a field the hash leaves out, such as the event
/// time), and only the offset tells the replaced record from its
/// replacement, so that the next run passes over the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The state.
    pub state: EntityState,
    /// Its record's offset; none when not known: a record in doubt (it may
    /// not be in the topic), or a state stored before offsets were kept.
    pub offset: Option<i64>,
}

/// The storage form's length with an offset; one without (28 bytes) was
/// stored before offsets were kept, and still reads.
const WITH_OFFSET: usize = 36;

impl Held {
    /// A state whose record's place is not known.
    pub fn unplaced(state: EntityState) -> Held {
        Held {
            state,
            offset: None,
        }
    }

    /// Storage form: version time and rank big-endian (so byte order is
    /// version order: the Redis scripts compare the first 12 bytes), the
    /// hash, then the offset big-endian (-1: not known).
    pub fn to_bytes(&self) -> [u8; WITH_OFFSET] {
        let mut bytes = [0u8; WITH_OFFSET];
        bytes[..8].copy_from_slice(&self.state.version.at_micros.to_be_bytes());
        bytes[8..12].copy_from_slice(&self.state.version.rank.to_be_bytes());
        bytes[12..28].copy_from_slice(&self.state.state_hash);
        bytes[28..].copy_from_slice(&self.offset.unwrap_or(-1).to_be_bytes());
        bytes
    }

    /// Reads the storage form back; `None` when it is not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Held> {
        let state = EntityState {
            version: Version {
                at_micros: i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?),
                rank: u32::from_be_bytes(bytes.get(8..12)?.try_into().ok()?),
            },
            state_hash: bytes.get(12..28)?.try_into().ok()?,
        };
        let offset = match bytes.len() {
            28 => None,
            WITH_OFFSET => {
                Some(i64::from_be_bytes(bytes[28..].try_into().ok()?)).filter(|at| *at >= 0)
            }
            _ => return None,
        };
        Some(Held { state, offset })
    }

    /// Reads the stored state of `slot`, as both backends do.
    ///
    /// # Errors
    /// [`LedgerError::Corrupt`] when the bytes are not a stored state.
    pub fn decode(slot: &EntitySlot, bytes: &[u8]) -> Result<Held, LedgerError> {
        Held::from_bytes(bytes).ok_or_else(|| LedgerError::Corrupt {
            slot: slot.as_str().to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> EntityState {
        EntityState {
            version: Version {
                at_micros: 1_795_946_400_000_000,
                rank: 7,
            },
            state_hash: [3; 16],
        }
    }

    #[test]
    fn a_state_reads_back_with_its_offset_or_without_one() {
        for offset in [Some(0), Some(41), None] {
            let held = Held {
                state: state(),
                offset,
            };
            assert_eq!(Held::from_bytes(&held.to_bytes()), Some(held));
        }
    }

    #[test]
    fn a_state_stored_before_offsets_were_kept_still_reads() {
        let old = &Held::unplaced(state()).to_bytes()[..28];
        assert_eq!(Held::from_bytes(old), Some(Held::unplaced(state())));
        assert_eq!(Held::from_bytes(&[0; 30]), None, "neither form");
    }
}
