//! The embedded ledger's redo log: what makes a group commit durable
//! without a durable redb commit each time.
//!
//! A durable redb commit writes every B-tree page the batch touched (a leaf
//! per random delivery id and per entity) and syncs them: under load that
//! was a fifth of posbridge's CPU (docs/BENCHMARKS.md). So each batch is
//! instead appended here as one checksummed frame and synced (one small
//! overwrite of space the file already has, so the sync writes no file
//! metadata); its writes wait in memory, where reads look first. Every
//! 100 ms one durable redb commit writes everything waiting, in key order,
//! and records the log's generation as covered; the log then moves to the
//! next generation, which makes every frame in it stale without rewriting
//! it. Opening the ledger applies the frames of a generation the database
//! has not covered, in order, durably.
//!
//! File layout: a header block (magic, generation, salt, checksum), then
//! frames from [`HEADER_BYTES`] to [`CAPACITY`]: generation, payload length,
//! checksum (seeded with the salt), payload. Reading stops at the first
//! frame that is not of the header's generation or whose checksum fails (a
//! torn last write).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{Xxh3, xxh3_64};

/// The header block: frames start after it.
pub const HEADER_BYTES: u64 = 4096;
/// The file's fixed size: written once with zeros, so later frames
/// overwrite space the file has and a sync carries no size change. About
/// ten thousand deliveries; a batch that does not fit is committed durably
/// in redb instead.
pub const CAPACITY: u64 = 1024 * 1024;
const MAGIC: &[u8; 16] = b"posbridge-redo\0\x02";
/// Magic, generation, salt, checksum.
const HEADER_LEN: usize = 16 + 8 + 8 + 8;
/// Generation, payload length, checksum.
const FRAME_HEAD: usize = 8 + 4 + 8;

/// One write the ledger makes, in both the log and the database. Ordered by
/// kind, then key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Write<'a> {
    /// A delivery id done, forgotten after the unix second.
    Done(&'a str, u64),
    /// An entity slot's stored state (`EntityState::to_bytes`).
    Entity(&'a str, [u8; 28]),
    /// A reconciler checkpoint and its unix second.
    Checkpoint(&'a str, i64),
}

const DONE: u8 = 1;
const ENTITY: u8 = 2;
const CHECKPOINT: u8 = 3;

/// Appends one write's frame payload form to `out`.
pub fn encode(write: &Write<'_>, out: &mut Vec<u8>) {
    let mut text = |tag: u8, text: &str| {
        out.push(tag);
        out.extend_from_slice(&u32::try_from(text.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    };
    match write {
        Write::Done(id, expires) => {
            text(DONE, id);
            out.extend_from_slice(&expires.to_le_bytes());
        }
        Write::Entity(slot, state) => {
            text(ENTITY, slot);
            out.extend_from_slice(state);
        }
        Write::Checkpoint(name, at) => {
            text(CHECKPOINT, name);
            out.extend_from_slice(&at.to_le_bytes());
        }
    }
}

/// Reads the writes of one frame payload back; `None` when it is not one
/// this version wrote.
pub fn decode(mut payload: &[u8]) -> Option<Vec<Write<'_>>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = bytes.split_at_checked(n)?;
        *bytes = rest;
        Some(head)
    }
    let mut writes = Vec::new();
    while let Some((&tag, rest)) = payload.split_first() {
        payload = rest;
        let len = u32::from_le_bytes(take(&mut payload, 4)?.try_into().ok()?);
        let text = std::str::from_utf8(take(&mut payload, usize::try_from(len).ok()?)?).ok()?;
        writes.push(match tag {
            DONE => Write::Done(
                text,
                u64::from_le_bytes(take(&mut payload, 8)?.try_into().ok()?),
            ),
            ENTITY => Write::Entity(text, take(&mut payload, 28)?.try_into().ok()?),
            CHECKPOINT => Write::Checkpoint(
                text,
                i64::from_le_bytes(take(&mut payload, 8)?.try_into().ok()?),
            ),
            _ => return None,
        });
    }
    Some(writes)
}

/// The log file beside a ledger file: `ledger.redb.wal`.
pub fn path_of(ledger: &Path) -> PathBuf {
    let mut name = ledger.as_os_str().to_owned();
    name.push(".wal");
    PathBuf::from(name)
}

/// The open log.
#[derive(Debug)]
pub struct Wal {
    file: File,
    generation: u64,
    /// Random per generation, a seed of every frame's checksum: stale bytes
    /// (which hold provider-chosen ids) cannot pass for a frame of a later
    /// generation.
    salt: u64,
    /// Where the next frame goes.
    end: u64,
}

impl Wal {
    /// Opens (or creates, full size) the log at `path`.
    ///
    /// # Errors
    /// The file cannot be opened, read or sized.
    pub fn open(path: &Path) -> io::Result<Wal> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let len = file.metadata()?.len();
        if len < CAPACITY {
            // Zeros, not a sparse extent: a sync after overwriting written
            // blocks has no allocation to record.
            let zeros = vec![0u8; usize::try_from(CAPACITY - len).unwrap_or(0)];
            file.write_all_at(&zeros, len)?;
            file.sync_all()?;
        }
        if len == 0 {
            // A new file: its directory entry must be durable too, or a
            // power loss takes the synced frames with it.
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        }
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0)?;
        let (head, hash) = header.split_at(HEADER_LEN - 8);
        let (generation, salt) =
            if head.starts_with(MAGIC) && hash == xxh3_64(head).to_le_bytes().as_slice() {
                (word(&head[16..24]), word(&head[24..32]))
            } else {
                (0, 0)
            };
        Ok(Wal {
            file,
            generation,
            salt,
            end: HEADER_BYTES,
        })
    }

    /// The generation frames are written in now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The payloads of the frames of the current generation, in order.
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn frames(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut frames = Vec::new();
        let mut at = HEADER_BYTES;
        let mut head = [0u8; FRAME_HEAD];
        while at + FRAME_HEAD as u64 <= CAPACITY {
            self.file.read_exact_at(&mut head, at)?;
            let generation = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
            let len = u64::from(u32::from_le_bytes(
                head[8..12].try_into().unwrap_or_default(),
            ));
            if generation != self.generation || at + FRAME_HEAD as u64 + len > CAPACITY {
                break;
            }
            let mut payload = vec![0u8; usize::try_from(len).unwrap_or(0)];
            self.file
                .read_exact_at(&mut payload, at + FRAME_HEAD as u64)?;
            if checksum(self.salt, &head[..12], &payload).to_le_bytes() != head[12..] {
                break;
            }
            frames.push(payload);
            at += FRAME_HEAD as u64 + len;
        }
        Ok(frames)
    }

    /// Moves to a generation after both the current one and `covered` (the
    /// last one the database holds), which empties the log: durable when
    /// this returns.
    ///
    /// # Errors
    /// The header cannot be written or synced; the log must not be used.
    pub fn advance_past(&mut self, covered: u64) -> io::Result<()> {
        let generation = self.generation.max(covered) + 1;
        let salt = rand::random::<u64>();
        let mut header = [0u8; HEADER_LEN];
        header[..16].copy_from_slice(MAGIC);
        header[16..24].copy_from_slice(&generation.to_le_bytes());
        header[24..32].copy_from_slice(&salt.to_le_bytes());
        let hash = xxh3_64(&header[..HEADER_LEN - 8]);
        header[HEADER_LEN - 8..].copy_from_slice(&hash.to_le_bytes());
        self.file.write_all_at(&header, 0)?;
        self.file.sync_data()?;
        self.generation = generation;
        self.salt = salt;
        self.end = HEADER_BYTES;
        Ok(())
    }

    /// Appends one frame and syncs it; `false` (nothing written) when it
    /// does not fit before [`CAPACITY`].
    ///
    /// # Errors
    /// The write or the sync failed; the log must not be used.
    pub fn append(&mut self, payload: &[u8]) -> io::Result<bool> {
        let len = u32::try_from(payload.len()).map_err(io::Error::other)?;
        let size = FRAME_HEAD as u64 + u64::from(len);
        if self.end + size > CAPACITY {
            return Ok(false);
        }
        let mut frame = Vec::with_capacity(FRAME_HEAD + payload.len());
        frame.extend_from_slice(&self.generation.to_le_bytes());
        frame.extend_from_slice(&len.to_le_bytes());
        let hash = checksum(self.salt, &frame, payload);
        frame.extend_from_slice(&hash.to_le_bytes());
        frame.extend_from_slice(payload);
        self.file.write_all_at(&frame, self.end)?;
        self.file.sync_data()?;
        self.end += size;
        Ok(true)
    }
}

/// A little-endian u64 from 8 bytes.
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap_or_default())
}

/// The checksum of a frame's generation and length with its payload,
/// seeded with the generation's salt.
fn checksum(salt: u64, head: &[u8], payload: &[u8]) -> u64 {
    let mut hasher = Xxh3::with_seed(salt);
    hasher.update(head);
    hasher.update(payload);
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes() -> Vec<Write<'static>> {
        vec![
            Write::Done("mekari:e1", 1_700_000_000),
            Write::Entity("orders/mekari:O-1", [7; 28]),
            Write::Checkpoint("mekari/main/orders", -5),
        ]
    }

    fn payload(writes: &[Write<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for write in writes {
            encode(write, &mut out);
        }
        out
    }

    #[test]
    fn writes_read_back_as_written() {
        let bytes = payload(&writes());
        assert_eq!(decode(&bytes).unwrap(), writes());
        assert_eq!(decode(&bytes[..bytes.len() - 1]), None, "a cut payload");
        assert_eq!(decode(&[9, 0, 0, 0, 0]), None, "an unknown tag");
    }

    #[test]
    fn frames_of_the_current_generation_survive_a_reopen_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.redo");
        let mut wal = Wal::open(&path).unwrap();
        assert_eq!(wal.generation(), 0);
        assert!(wal.frames().unwrap().is_empty(), "a new log is empty");
        wal.advance_past(0).unwrap();
        assert!(wal.append(b"one").unwrap());
        assert!(wal.append(b"two").unwrap());
        drop(wal);
        let wal = Wal::open(&path).unwrap();
        assert_eq!(wal.generation(), 1);
        assert_eq!(wal.frames().unwrap(), [b"one".to_vec(), b"two".to_vec()]);
    }

    #[test]
    fn advancing_empties_the_log_without_rewriting_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.redo");
        let mut wal = Wal::open(&path).unwrap();
        wal.advance_past(0).unwrap();
        assert!(wal.append(b"old").unwrap());
        wal.advance_past(7).unwrap();
        assert_eq!(wal.generation(), 8, "past what the database covers");
        assert!(wal.frames().unwrap().is_empty());
        assert!(wal.append(b"new").unwrap());
        drop(wal);
        assert_eq!(
            Wal::open(&path).unwrap().frames().unwrap(),
            [b"new".to_vec()]
        );
    }

    /// A frame whose last bytes never reached the disk ends the log there.
    #[test]
    fn a_torn_frame_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.redo");
        let mut wal = Wal::open(&path).unwrap();
        wal.advance_past(0).unwrap();
        assert!(wal.append(b"whole").unwrap());
        assert!(wal.append(b"torn frame").unwrap());
        assert!(wal.append(b"after").unwrap());
        let torn_at = HEADER_BYTES + (FRAME_HEAD + 5 + FRAME_HEAD + 9) as u64;
        wal.file.write_all_at(&[0], torn_at).unwrap();
        assert_eq!(wal.frames().unwrap(), [b"whole".to_vec()]);
    }

    #[test]
    fn a_frame_that_does_not_fit_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(&dir.path().join("l.redo")).unwrap();
        wal.advance_past(0).unwrap();
        let big = vec![1u8; usize::try_from(CAPACITY / 2).unwrap()];
        assert!(wal.append(&big).unwrap());
        assert!(!wal.append(&big).unwrap());
        assert_eq!(wal.frames().unwrap().len(), 1);
    }
}
