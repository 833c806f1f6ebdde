//! A small real tmpfs for a disk that fills up: the suite's full-ledger
//! test and the ledger storage bench's disk-full check (which includes this
//! file by path) mount one each.

use std::path::Path;
use std::process::Command;

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts one of `size` (`mount -o size=`, e.g. `4m`); needs root (CI
    /// runs the suite as root).
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("a mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(
            status.success(),
            "mounting a tmpfs needs root (CI runs the suite as root)"
        );
        Tmpfs { dir }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Writes a file at `path` until the filesystem is full, then gives `room`
/// bytes back.
pub fn fill(path: &Path, room: u64) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).expect("the filler");
    let chunk = vec![0u8; 64 * 1024];
    while file
        .write_all(&chunk)
        .and_then(|()| file.sync_all())
        .is_ok()
    {}
    let len = file.metadata().expect("the filler").len();
    file.set_len(len.saturating_sub(room)).expect("the filler");
}
