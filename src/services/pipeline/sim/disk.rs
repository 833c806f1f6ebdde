//! A simulated disk under the ledger's and the spool's redb files (redb's
//! `StorageBackend`), kept as TigerBeetle's storage simulator keeps one.
//!
//! What was synced is durable, and lives in the file itself: the crash
//! copies that file to the next life, the salvage and the damage read it.
//! What was written since the last sync is held apart, per file as a page
//! cache holds it (a reopened handle sees it too), and read back over the
//! file. At a crash posbridge alone dies (the page cache outlives it and is
//! written out) or the machine does (each unsynced write lost, kept, or
//! torn at a sector boundary), as the seed says; after a clean stop all of
//! it is kept.
//!
//! Every write and sync takes virtual time drawn by the seed. The clock
//! cannot move while one runs (the spool's run on tokio's blocking pool,
//! the ledger's checkpoints on the world's thread), so a crash whose time
//! falls inside an op's span lands in it: a write is cut at a sector
//! boundary, the disk dies at once (every later op fails and changes
//! nothing) and the world is told to end the life now. A crash aimed at a
//! store lands in that store's first op after its time ([`AIM_WITHIN`]).
//! While a failure window lasts, a store's writes fail: no space left
//! (every write past the file's durable length), or an I/O error (one op
//! in four, syncs too; a failed sync leaves its writes unsynced).

use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;
use redb::{Builder, DatabaseError, StorageBackend};
use tokio::sync::Notify;

use super::clock::Clock;
use super::disk_plan::{Failing, Failure, Store};
use super::world::Shared;
use crate::adapters::store_file::Disk;

/// How long after its time a crash aimed at a store waits for an op of
/// that store; then it comes anyway.
pub(super) const AIM_WITHIN: Duration = Duration::from_secs(30);

/// How a life of posbridge ends, for what its disk keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// Stopped, its files closed: what it wrote is all kept.
    Clean,
    /// Crashed: with the machine (`true`: unsynced writes lost or torn),
    /// or the process alone (the page cache is written out).
    Crash { machine: bool },
}

/// The world's disk, across posbridge's lives. Cheap to clone.
#[derive(Clone)]
pub(super) struct SimDisk {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimDisk")
    }
}

struct State {
    rng: StdRng,
    clock: Clock,
    /// Where the disk says what happened, and notes the classes of fault
    /// it met ([`super::DRAWN`]).
    shared: Shared,
    /// 512 or 4096 bytes: where a write can be torn.
    sector: u64,
    /// Which life of posbridge the disk serves: a handle of an earlier one
    /// is a dead process's.
    life: u64,
    /// Whether posbridge serves (faults and crashes land only then: its
    /// start-up must open its files) and the crash armed for this life.
    serving: Option<Option<Armed>>,
    /// Whether a crash landed in an op this life: every op fails since.
    dead: bool,
    /// Told when a crash lands in an op of this life (one per life, so no
    /// word of an earlier one is left for the next).
    died: Arc<Notify>,
    failing: Option<Failing>,
    /// What was written and not synced, per file (inode), in first-written order.
    cache: Vec<Unsynced>,
}

/// A crash armed for this life: when, and the store it is aimed at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Armed {
    pub(super) at: Duration,
    pub(super) aimed: Option<Store>,
}

/// One file's writes since its last sync.
struct Unsynced {
    inode: (u64, u64),
    file: Arc<std::fs::File>,
    name: &'static str,
    /// Its length as posbridge sees it.
    len: u64,
    ops: Vec<Op>,
}

#[derive(Debug)]
enum Op {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

impl SimDisk {
    pub(super) fn new(
        rng: StdRng,
        (clock, shared): (Clock, Shared),
        sector: u64,
        failing: Option<Failing>,
    ) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(State {
                rng,
                clock,
                shared,
                sector,
                life: 0,
                serving: None,
                dead: false,
                died: Arc::new(Notify::new()),
                failing,
                cache: Vec::new(),
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The disk the ledger and the spool are opened on: each file opened
    /// through a [`SimFile`] of this life.
    pub(super) fn store_disk(&self) -> Disk {
        let disk = self.clone();
        Disk::simulated(Arc::new(move |builder: &Builder, path: &Path| {
            let file = disk
                .open(path)
                .map_err(|e| DatabaseError::Storage(e.into()))?;
            builder.create_with_backend(file)
        }))
    }

    fn open(&self, path: &Path) -> io::Result<SimFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let meta = file.metadata()?;
        Ok(SimFile {
            disk: self.clone(),
            name: Store::name_of(path),
            store: Store::of(path),
            inode: (meta.dev(), meta.ino()),
            file: Arc::new(file),
            life: self.state().life,
        })
    }

    /// posbridge has started and serves: faults land from now, and `crash`
    /// (this life's, unless it ends cleanly) is armed.
    pub(super) fn serve(&self, crash: Option<Armed>) {
        self.state().serving = Some(crash);
    }

    /// posbridge has stopped cleanly: its files close without faults (off
    /// the life's runtime, where the world's clock cannot be read).
    pub(super) fn rest(&self) {
        self.state().serving = None;
    }

    /// Waits until a crash lands in an op of this life.
    pub(super) async fn died(&self) {
        let died = self.state().died.clone();
        died.notified().await;
    }

    /// Ends this life as `end` says, at world time `now`: what its files
    /// keep of the writes not synced is made durable (or lost, or torn),
    /// and every handle of it dies.
    pub(super) fn end_life(&self, end: End, now: Duration) {
        let mut state = self.state();
        let state = &mut *state;
        for unsynced in std::mem::take(&mut state.cache) {
            let kept = match end {
                End::Clean | End::Crash { machine: false } => unsynced.keep_all(),
                End::Crash { machine: true } => {
                    let (kept, lost) = unsynced.tear(&mut state.rng, state.sector);
                    if lost > 0 {
                        state.shared.drew("unsynced writes lost");
                        state.shared.step(
                            now,
                            format!(
                                "the machine went down: {lost} of {} write(s) to {} not synced are lost or torn",
                                unsynced.ops.len(),
                                unsynced.name
                            ),
                        );
                    }
                    kept
                }
            };
            if let Err(error) = apply(&unsynced.file, &kept) {
                panic!("the simulated disk cannot write its file: {error}");
            }
        }
        state.life += 1;
        state.serving = None;
        state.dead = false;
        state.died = Arc::new(Notify::new());
    }

    /// The state, if `life` is the one served and the disk alive.
    fn alive(&self, life: u64) -> io::Result<MutexGuard<'_, State>> {
        let state = self.state();
        if state.life != life || state.dead {
            return Err(io::Error::other("the simulated process is dead"));
        }
        Ok(state)
    }

    /// One write or change of length: it takes its time, may be cut by the
    /// crash or fail, else is held unsynced.
    fn op(&self, file: &SimFile, op: Op) -> io::Result<()> {
        let mut state = self.alive(file.life)?;
        let took = Duration::from_micros(state.rng.random_range(50..2_000));
        if state.lands(file.store, took) {
            let sector = state.sector;
            let cut = match op {
                Op::Write(at, data) => {
                    let kept = torn_at(&mut state.rng, at, &data, sector);
                    Some(Op::Write(at, data[..kept].to_vec()))
                }
                Op::SetLen(_) => None,
            };
            state.unsynced(file)?.ops.extend(cut);
            return Err(state.die("write", file.name));
        }
        // Space is taken where the file had none on disk: past its durable
        // length (what a set_len added since is a hole until written).
        let durable = file.file.metadata()?.len();
        let grows = match &op {
            Op::Write(at, data) => at + data.len() as u64 > durable,
            Op::SetLen(len) => *len > durable,
        };
        if let Some(error) = state.fails(file, grows) {
            return Err(error);
        }
        let unsynced = state.unsynced(file)?;
        match &op {
            Op::Write(at, data) => unsynced.len = unsynced.len.max(at + data.len() as u64),
            Op::SetLen(len) => unsynced.len = *len,
        }
        unsynced.ops.push(op);
        Ok(())
    }

    /// A sync: it takes its time, may be cut by the crash or fail (its
    /// writes stay unsynced), else makes the file's writes durable.
    fn sync(&self, file: &SimFile) -> io::Result<()> {
        let mut state = self.alive(file.life)?;
        let took = if state.rng.random_bool(0.1) {
            Duration::from_millis(state.rng.random_range(30..1_000))
        } else {
            Duration::from_micros(state.rng.random_range(1_000..30_000))
        };
        if state.lands(file.store, took) {
            return Err(state.die("sync", file.name));
        }
        if let Some(error) = state.fails(file, false) {
            return Err(error);
        }
        if let Some(at) = state.cache.iter().position(|u| u.inode == file.inode) {
            let unsynced = state.cache.remove(at);
            apply(&file.file, &unsynced.ops)?;
        }
        Ok(())
    }
}

impl State {
    /// The crash lands in an op: the disk dies, the world is told.
    fn die(&mut self, what: &str, name: &str) -> io::Error {
        let now = self.clock.now();
        self.dead = true;
        self.shared.drew("crash in a disk op");
        self.shared
            .step(now, format!("the crash lands in a {what} of {name}"));
        self.died.notify_one();
        io::Error::other("the simulated process crashed in this op")
    }

    /// Whether this life's crash lands in an op of `store` that starts now
    /// and takes `took`.
    fn lands(&self, store: Option<Store>, took: Duration) -> bool {
        let Some(Some(armed)) = self.serving else {
            return false;
        };
        let ends = self.clock.now() + took;
        match armed.aimed {
            None => ends > armed.at,
            Some(aimed) => {
                (store == Some(aimed) && ends > armed.at) || ends > armed.at + AIM_WITHIN
            }
        }
    }

    /// The error an op of `file` meets now, if its store's failure window
    /// is open: no space for one that `grows` the file, or an I/O error.
    fn fails(&mut self, file: &SimFile, grows: bool) -> Option<io::Error> {
        let failing = self.failing.filter(|f| Some(f.store) == file.store)?;
        self.serving?;
        let now = self.clock.now();
        if now < failing.from || now >= failing.to {
            return None;
        }
        let error = match failing.failure {
            Failure::Full if grows => {
                self.shared.drew("disk full");
                io::Error::from(io::ErrorKind::StorageFull)
            }
            Failure::Io if self.rng.random_bool(0.25) => {
                self.shared.drew("disk write failed");
                io::Error::other("simulated I/O error")
            }
            _ => return None,
        };
        self.shared
            .step(now, format!("an op of {} fails: {error}", file.name));
        Some(error)
    }

    /// `file`'s unsynced writes, begun at its durable length.
    fn unsynced(&mut self, file: &SimFile) -> io::Result<&mut Unsynced> {
        let at = match self.cache.iter().position(|u| u.inode == file.inode) {
            Some(at) => at,
            None => {
                self.cache.push(Unsynced {
                    inode: file.inode,
                    file: file.file.clone(),
                    name: file.name,
                    len: file.file.metadata()?.len(),
                    ops: Vec::new(),
                });
                self.cache.len() - 1
            }
        };
        Ok(&mut self.cache[at])
    }
}

impl Unsynced {
    fn keep_all(&self) -> Vec<Op> {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Write(at, data) => Op::Write(*at, data.clone()),
                Op::SetLen(len) => Op::SetLen(*len),
            })
            .collect()
    }

    /// What a machine's crash keeps of the writes: each lost (one in two),
    /// kept, or torn at a sector boundary; and how many were not kept whole.
    fn tear(&self, rng: &mut StdRng, sector: u64) -> (Vec<Op>, usize) {
        let mut kept = Vec::new();
        let mut lost = 0;
        for op in &self.ops {
            match (op, rng.random_range(0..4)) {
                (_, 0..2) => lost += 1,
                (Op::Write(at, data), 2) => {
                    lost += 1;
                    let upto = torn_at(rng, *at, data, sector);
                    kept.push(Op::Write(*at, data[..upto].to_vec()));
                }
                (Op::Write(at, data), _) => kept.push(Op::Write(*at, data.clone())),
                (Op::SetLen(len), _) => kept.push(Op::SetLen(*len)),
            }
        }
        (kept, lost)
    }

    /// `out` (read at `offset`) as these writes left it.
    fn over(&self, offset: u64, out: &mut [u8]) {
        let end = offset + out.len() as u64;
        for op in &self.ops {
            match op {
                Op::Write(at, data) => {
                    let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
                    if from < to {
                        out[(from - offset) as usize..(to - offset) as usize]
                            .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
                    }
                }
                Op::SetLen(len) if *len < end => {
                    out[(*len).saturating_sub(offset) as usize..].fill(0);
                }
                Op::SetLen(_) => {}
            }
        }
    }
}

/// How many bytes of a write at `at` land when it is torn: whole sectors
/// from its start, up to a sector boundary drawn among those inside it
/// (or none of it).
fn torn_at(rng: &mut StdRng, at: u64, data: &[u8], sector: u64) -> usize {
    let end = at + data.len() as u64;
    let first = (at / sector + 1) * sector;
    let inside = if end > first {
        (end - 1 - first) / sector + 1
    } else {
        0
    };
    match rng.random_range(0..=inside) {
        0 => 0,
        k => (first + (k - 1) * sector - at) as usize,
    }
}

/// Writes `ops` into the file, in order: they are durable now.
fn apply(file: &std::fs::File, ops: &[Op]) -> io::Result<()> {
    for op in ops {
        match op {
            Op::Write(at, data) => file.write_all_at(data, *at)?,
            Op::SetLen(len) => file.set_len(*len)?,
        }
    }
    Ok(())
}

/// One store file opened on the simulated disk by one life of posbridge.
#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    name: &'static str,
    store: Option<Store>,
    /// The page cache is per file, not per path: a file set aside keeps
    /// its own.
    inode: (u64, u64),
    /// The durable bytes.
    file: Arc<std::fs::File>,
    life: u64,
}

impl StorageBackend for SimFile {
    fn len(&self) -> io::Result<u64> {
        let state = self.disk.alive(self.life)?;
        match state.cache.iter().find(|u| u.inode == self.inode) {
            Some(unsynced) => Ok(unsynced.len),
            None => Ok(self.file.metadata()?.len()),
        }
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.disk.alive(self.life)?;
        let durable = self.file.metadata()?.len();
        let unsynced = state.cache.iter().find(|u| u.inode == self.inode);
        let len = unsynced.map_or(durable, |u| u.len);
        if offset + out.len() as u64 > len {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        out.fill(0);
        if offset < durable {
            let n = out.len().min((durable - offset) as usize);
            self.file.read_exact_at(&mut out[..n], offset)?;
        }
        if let Some(unsynced) = unsynced {
            unsynced.over(offset, out);
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.op(self, Op::SetLen(len))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.sync(self)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.disk.op(self, Op::Write(offset, data.to_vec()))
    }
}
