//! Who holds a store file. redb admits one handle per file and refuses a
//! second with "already open"; told only that, an operator may take the
//! file for damaged and move it aside under the running posbridge that
//! holds it, which then loses its dedup state. So the refusal names the
//! process, found through `/proc`: the one whose open descriptor of the
//! file carries redb's lock, else any that has it open.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// How much of a holder's command line a message quotes.
const COMMAND_CHARS: usize = 200;

/// A process that has a store file open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// Its command line, arguments separated by spaces (cut at 200 characters).
    pub command: String,
    /// Whether it is the process asking: then the file is configured twice
    /// (or an earlier handle is still closing).
    pub this_process: bool,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.this_process {
            write!(
                f,
                "this process itself (pid {}): is one file configured twice, e.g. spool.path equal to ledger.path?",
                self.pid
            )
        } else {
            write!(f, "process {} (`{}`)", self.pid, self.command)
        }
    }
}

/// What a process's descriptors of the file show.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    Locked,
    Open,
}

/// The process holding `path`: one with a lock on it, else one that has it
/// open; `None` when no process this one may look into has it open (one in
/// another container, or of another user).
pub fn find(path: &Path) -> Option<Holder> {
    let target = std::fs::metadata(path).ok()?;
    let file = (target.dev(), target.ino());
    let own = std::process::id();
    // This process first: a reopen meets its own closing handle, and its
    // few descriptors cost little.
    let others = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own);
    let mut opener = None;
    for pid in std::iter::once(own).chain(others) {
        match seen_in(pid, file) {
            Some(Seen::Locked) => return Some(holder(pid, own)),
            Some(Seen::Open) => {
                opener.get_or_insert(pid);
            }
            None => {}
        }
    }
    opener.map(|pid| holder(pid, own))
}

/// Whether process `pid` has the file `(device, inode)` open, and locked.
fn seen_in(pid: u32, file: (u64, u64)) -> Option<Seen> {
    let mut seen = None;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        // The link's target: the file itself, wherever it is mounted.
        let Ok(meta) = std::fs::metadata(fd.path()) else {
            continue;
        };
        if (meta.dev(), meta.ino()) != file {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        if info.lines().any(|line| line.starts_with("lock:")) {
            return Some(Seen::Locked);
        }
        seen = Some(Seen::Open);
    }
    seen
}

fn holder(pid: u32, own: u32) -> Holder {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let command = raw
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    Holder {
        pid,
        command: command.chars().take(COMMAND_CHARS).collect(),
        this_process: pid == own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_another_process_holds_names_that_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("held");
        std::fs::write(&path, b"x").unwrap();
        // A real other process with the file open on its standard input.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::fs::File::open(&path).unwrap())
            .spawn()
            .unwrap();
        // `spawn` returns once the child has left this process's memory,
        // which is before the kernel has set up its new command line: until
        // then /proc shows it empty. Wait for the exec to finish.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let found = loop {
            let found = find(&path);
            let execed = found
                .as_ref()
                .is_some_and(|holder| !holder.command.is_empty());
            if execed || std::time::Instant::now() > deadline {
                break found;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        child.kill().unwrap();
        child.wait().unwrap();
        let found = found.expect("the sleeping child has it open");
        assert_eq!(found.pid, child.id());
        assert_eq!(found.command, "sleep 30");
        assert!(!found.this_process);
        assert_eq!(find(&path), None, "nobody has it open now");
    }
}
