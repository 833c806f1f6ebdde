//! What the world's disk does, drawn from a generator of its own (so that
//! a seed's other draws are what they were before the disk was simulated):
//! where its writes tear, a window in which one store's writes fail, how
//! much the spool may hold, and for each crash whether the machine went
//! down with posbridge and whether it is aimed at a store's next op.

use std::path::Path;
use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use super::world::Shared;

/// The ledger's file in each life's directory.
pub(super) const LEDGER_FILE: &str = "ledger.redb";
/// The spool's.
pub(super) const SPOOL_FILE: &str = "spool.redb";

/// A store whose file is on the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum Store {
    Ledger,
    Spool,
}

impl Store {
    /// The store whose file `path` is (a file set aside is none).
    pub(super) fn of(path: &Path) -> Option<Store> {
        match path.file_name()?.to_str()? {
            LEDGER_FILE => Some(Store::Ledger),
            SPOOL_FILE => Some(Store::Spool),
            _ => None,
        }
    }

    /// Its file's name, for the world's steps.
    pub(super) fn name_of(path: &Path) -> &'static str {
        match Store::of(path) {
            Some(Store::Ledger) => LEDGER_FILE,
            Some(Store::Spool) => SPOOL_FILE,
            None => "a store file",
        }
    }
}

/// A window of world time in which one store's writes fail.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(super) struct Failing {
    pub(super) store: Store,
    pub(super) from: Duration,
    pub(super) to: Duration,
    pub(super) failure: Failure,
}

/// How a store's writes fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) enum Failure {
    /// No space left: every write past the file's durable length.
    Full,
    /// An I/O error, now and then.
    Io,
}

/// One crash as the disk sees it.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(super) struct OnDisk {
    /// Whether the machine went down too: its writes not synced are lost
    /// or torn (else the page cache outlives the process).
    pub(super) machine: bool,
    /// The store whose next op it lands in, if it is aimed at one.
    pub(super) aimed: Option<Store>,
}

/// The disk's plan for one world.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct DiskPlan {
    /// Where a write tears: 512 or 4096 bytes.
    pub(super) sector: u64,
    pub(super) failing: Option<Failing>,
    /// One per crash of the world, in order (a clean stop's is not used).
    pub(super) crashes: Vec<OnDisk>,
    /// `spool.max_entries`, when the spool is small enough to fill.
    pub(super) spool_room: Option<u64>,
}

/// The plan for a world of `crashes` crashes whose source `spools` or not,
/// with its broker `outage` (from, to) if it has one; the first attempts
/// come within `spread` ms.
pub(super) fn plan(
    rng: &mut StdRng,
    crashes: usize,
    spools: bool,
    outage: Option<(Duration, Duration)>,
    spread: u64,
) -> DiskPlan {
    let sector = if rng.random_bool(0.5) { 512 } else { 4096 };
    // The spool is written while the broker is out: its failures there.
    let failing = rng.random_bool(0.3).then(|| {
        let (store, from) = match outage {
            Some((start, end)) if spools && rng.random_bool(0.6) => (
                Store::Spool,
                start + (end - start).mul_f64(rng.random_range(0.0..1.0)),
            ),
            _ => (
                Store::Ledger,
                Duration::from_millis(rng.random_range(0..spread + 5_000)),
            ),
        };
        Failing {
            store,
            from,
            to: from + Duration::from_millis(rng.random_range(1_000..20_000)),
            failure: if rng.random_bool(0.5) {
                Failure::Full
            } else {
                Failure::Io
            },
        }
    });
    let crashes = (0..crashes)
        .map(|_| OnDisk {
            machine: rng.random_bool(0.5),
            aimed: rng.random_bool(0.4).then(|| {
                if spools && rng.random_bool(0.7) {
                    Store::Spool
                } else {
                    Store::Ledger
                }
            }),
        })
        .collect();
    let spool_room = (spools && rng.random_bool(0.3)).then(|| rng.random_range(1..=4));
    DiskPlan {
        sector,
        failing,
        crashes,
        spool_room,
    }
}

impl DiskPlan {
    /// Says the plan in the world's steps, and notes the classes it drew
    /// (those the disk meets as it runs it notes itself).
    pub(super) fn announce(&self, shared: &Shared) {
        shared.step(
            Duration::ZERO,
            format!("the disk tears writes at {}-byte sectors", self.sector),
        );
        if let Some(failing) = &self.failing {
            shared.step(
                Duration::ZERO,
                format!(
                    "the {:?}'s writes fail ({:?}) from {:.3}s to {:.3}s",
                    failing.store,
                    failing.failure,
                    failing.from.as_secs_f64(),
                    failing.to.as_secs_f64()
                ),
            );
        }
        if let Some(room) = self.spool_room {
            shared.step(Duration::ZERO, format!("the spool holds {room} at most"));
            shared.drew("spool full");
        }
    }
}
