//! How one spool entry is stored: a self-describing frame with a checksum,
//! so that a changed byte is found when the entry is read (and never
//! published as something it was not), and so that intact entries can be
//! found in a spool file redb no longer opens (`salvage.rs`).
//!
//! ```text
//! 0..8    MAGIC
//! 8       VERSION
//! 9..13   payload length, u32 little-endian
//! 13..45  SHA-256 of bytes 8..13 and the payload
//! 45..    payload: the entry's header JSON, a newline, the body
//! ```
//!
//! SHA-256 rather than a CRC: `sha2` is already a dependency (no new
//! crate), an append is an fsync of milliseconds beside which hashing a few
//! KiB costs nothing, and 32 bytes make a salvage scan's false match (bytes
//! that happen to look like an intact frame) impossible in practice.
//!
//! Entries written before frames existed are the bare payload: they are
//! still read, but have no checksum, so damage inside their body goes
//! unseen (one in the header still fails to decode), and a salvage cannot
//! find them.

use sha2::{Digest, Sha256};

/// The first bytes of every framed entry. The first is not `{`, which
/// every unframed entry (its header JSON) starts with, and not text, so a
/// JSON body is unlikely to hold it.
pub(super) const MAGIC: [u8; 8] = [0x8f, b'p', b'b', b's', b'p', b'o', b'o', b'l'];
/// The frame's layout version.
const VERSION: u8 = 1;
/// Magic, version, length and checksum: the bytes before the payload.
pub(super) const HEADER_LEN: usize = 45;
const LENGTH_AT: usize = 9;
const CHECKSUM_AT: usize = 13;

/// Why a stored entry cannot be trusted: the quarantine record's `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    /// The payload does not match its checksum (a changed byte).
    #[error("its bytes do not match their checksum")]
    Checksum,
    /// The frame is cut short, or longer than its length says.
    #[error("its length does not match the frame's")]
    Length,
    /// A frame version this build does not know (written by a newer one).
    #[error("its frame version is unknown")]
    Version,
    /// The payload's header does not decode (an unframed entry's damage).
    #[error("its header does not decode")]
    Header,
    /// An entry's header found where no frame begins: the damage took its
    /// frame's header.
    #[error("its frame header is gone")]
    Unframed,
}

impl Damage {
    /// Its code, for the log and the quarantine record.
    pub fn as_str(self) -> &'static str {
        match self {
            Damage::Checksum => "checksum",
            Damage::Length => "length",
            Damage::Version => "version",
            Damage::Header => "header",
            Damage::Unframed => "unframed",
        }
    }
}

/// `payload` in a frame.
pub(super) fn seal(payload: &[u8]) -> Vec<u8> {
    // Bodies are bounded far below 4 GiB (server.max_body_bytes), and redb
    // refuses values past 3 GiB anyway.
    let length = u32::try_from(payload.len()).expect("a spool entry is under 4 GiB");
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(&MAGIC);
    frame.push(VERSION);
    frame.extend_from_slice(&length.to_le_bytes());
    frame.extend_from_slice(&checksum(VERSION, length, payload));
    frame.extend_from_slice(payload);
    frame
}

/// The payload of a stored entry, its checksum verified; an entry written
/// before frames existed is its own payload, unverified.
///
/// # Errors
/// [`Damage`] when the frame is not intact.
pub(super) fn open(stored: &[u8]) -> Result<&[u8], Damage> {
    if !stored.starts_with(&MAGIC) {
        return Ok(stored);
    }
    let (length, rest) = read_header(stored)?;
    if rest.len() != length {
        return Err(Damage::Length);
    }
    Ok(rest)
}

/// What follows a frame's header, unverified (an unframed entry whole):
/// for a person looking at a damaged entry.
pub(super) fn unverified_payload(stored: &[u8]) -> &[u8] {
    if stored.starts_with(&MAGIC) {
        stored.get(HEADER_LEN..).unwrap_or_default()
    } else {
        stored
    }
}

/// The payload length a frame's header states, and what follows the
/// header, once its version and checksum are verified against the first
/// `length` bytes of what follows.
fn read_header(frame: &[u8]) -> Result<(usize, &[u8]), Damage> {
    if frame.len() < HEADER_LEN {
        return Err(Damage::Length);
    }
    let version = frame[MAGIC.len()];
    if version != VERSION {
        return Err(Damage::Version);
    }
    let length = u32::from_le_bytes(
        frame[LENGTH_AT..CHECKSUM_AT]
            .try_into()
            .expect("four bytes"),
    );
    let rest = &frame[HEADER_LEN..];
    let Some(payload) = usize::try_from(length).ok().and_then(|n| rest.get(..n)) else {
        return Err(Damage::Length);
    };
    if frame[CHECKSUM_AT..HEADER_LEN] != checksum(version, length, payload) {
        return Err(Damage::Checksum);
    }
    Ok((payload.len(), rest))
}

/// What a scan found at one occurrence of [`MAGIC`].
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found<'a> {
    /// An intact frame's payload.
    Intact(&'a [u8]),
    /// A frame that does not verify (damaged, or bytes that only start
    /// like one), and its bytes up to the next frame's magic (at most
    /// [`DAMAGED_KEPT`]): what a person looking at it needs.
    Damaged(Damage, &'a [u8]),
}

/// The most bytes of a damaged frame a scan hands on.
pub(super) const DAMAGED_KEPT: usize = 64 * 1024;

/// Every frame in `bytes`, in file order: an intact frame is skipped whole
/// (a body that holds a frame's bytes is not taken for a second entry).
pub(super) fn scan(bytes: &[u8]) -> impl Iterator<Item = Found<'_>> {
    let finder = memchr::memmem::Finder::new(&MAGIC);
    let mut from = 0;
    std::iter::from_fn(move || {
        let at = from + finder.find(&bytes[from..])?;
        let found = match read_header(&bytes[at..]) {
            Ok((length, rest)) => {
                from = at + HEADER_LEN + length;
                Found::Intact(&rest[..length])
            }
            Err(damage) => {
                from = at + MAGIC.len();
                let end = finder
                    .find(&bytes[from..])
                    .map_or(bytes.len(), |next| from + next)
                    .min(at + DAMAGED_KEPT);
                Found::Damaged(damage, &bytes[at..end])
            }
        };
        Some(found)
    })
}

fn checksum(version: u8, length: u32, payload: &[u8]) -> [u8; 32] {
    Sha256::new()
        .chain_update([version])
        .chain_update(length.to_le_bytes())
        .chain_update(payload)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_payload_opens_and_a_changed_byte_does_not() {
        let sealed = seal(b"{\"key\":\"x\"}\ntotal 4321");
        assert_eq!(open(&sealed), Ok(&b"{\"key\":\"x\"}\ntotal 4321"[..]));
        let mut changed = sealed.clone();
        let at = changed.len() - 4;
        changed[at] = b'9';
        assert_eq!(open(&changed), Err(Damage::Checksum));
        assert_eq!(open(&sealed[..sealed.len() - 1]), Err(Damage::Length));
        let mut longer = sealed.clone();
        longer.push(b'!');
        assert_eq!(open(&longer), Err(Damage::Length));
        let mut newer = sealed;
        newer[MAGIC.len()] = VERSION + 1;
        assert_eq!(open(&newer), Err(Damage::Version));
    }

    #[test]
    fn an_unframed_entry_is_its_own_payload() {
        assert_eq!(
            open(b"{\"key\":\"x\"}\nbody"),
            Ok(&b"{\"key\":\"x\"}\nbody"[..])
        );
    }

    #[test]
    fn a_scan_finds_the_intact_frames_among_other_bytes() {
        let inner = seal(b"inner");
        let mut outer_payload = b"outer holds ".to_vec();
        outer_payload.extend_from_slice(&inner);
        let mut bytes = vec![0u8; 100];
        bytes.extend_from_slice(&seal(b"first"));
        bytes.extend_from_slice(b"page padding");
        let mut damaged = seal(b"total 4321");
        let at = damaged.len() - 4;
        damaged[at] = b'9';
        bytes.extend_from_slice(&damaged);
        bytes.extend_from_slice(&seal(&outer_payload));
        bytes.extend_from_slice(&MAGIC);
        let found: Vec<Found<'_>> = scan(&bytes).collect();
        assert_eq!(
            found,
            [
                Found::Intact(b"first"),
                Found::Damaged(Damage::Checksum, &damaged),
                Found::Intact(&outer_payload),
                Found::Damaged(Damage::Length, &MAGIC),
            ]
        );
    }
}
