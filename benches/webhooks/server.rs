//! The servers under test as child processes, and what the kernel says they
//! used: CPU time (`/proc/PID/stat`) and peak resident memory (`VmHWM`).

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server process.
pub struct Server {
    child: Child,
}

impl Server {
    /// Starts `program args…` (which must listen on `addr`) with its output in
    /// `log`, and waits up to a minute until `addr` accepts connections.
    pub fn start(command: Command, addr: SocketAddr, log: &Path) -> Server {
        Server::start_within(command, addr, log, Duration::from_secs(60))
    }

    /// [`Server::start`], waiting up to `within`: a peer's first start
    /// fetches its jars before it listens. A server that exits first fails
    /// the bench at once with the end of its log (the log's folder goes
    /// with the bench).
    pub fn start_within(
        mut command: Command,
        addr: SocketAddr,
        log_path: &Path,
        within: Duration,
    ) -> Server {
        let log = std::fs::File::create(log_path).expect("server log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start server");
        let mut server = Server { child };
        let deadline = Instant::now() + within;
        while std::net::TcpStream::connect(addr).is_err() {
            if let Some(status) = server.child.try_wait().expect("server status") {
                panic!(
                    "server exited ({status}) before listening on {addr}; its log ends:\n{}",
                    tail(log_path, 20)
                );
            }
            assert!(Instant::now() < deadline, "server did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The process's usage so far.
    pub fn usage(&self) -> Usage {
        Usage::of(self.child.id())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The processes one row measures: one server, or the replicas of a fleet.
pub struct Group {
    servers: Vec<Server>,
}

impl Group {
    /// The replicas, in order.
    pub fn of(servers: Vec<Server>) -> Group {
        Group { servers }
    }

    /// Their usage so far, summed: the CPU a fleet spends on its requests,
    /// and the memory it holds (the peaks of each, added).
    pub fn usage(&self) -> Usage {
        self.servers
            .iter()
            .map(Server::usage)
            .fold(Usage::default(), |sum, one| Usage {
                cpu: sum.cpu + one.cpu,
                peak_rss: sum.peak_rss + one.peak_rss,
            })
    }
}

/// The last `lines` lines of the file at `path`.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free loopback port.
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
}

/// CPU time used and peak RSS of one process, read at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User + system CPU time.
    pub cpu: Duration,
    /// Peak resident set, bytes.
    pub peak_rss: u64,
}

impl Usage {
    /// Reads the usage of `pid` (zero if it cannot be read).
    pub fn of(pid: u32) -> Usage {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which may hold spaces) start at 3.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let ticks = |i: usize| {
            fields
                .get(i - 3)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // utime and stime, in clock ticks of 1/100 s (USER_HZ on Linux).
        let cpu = Duration::from_millis((ticks(14) + ticks(15)) * 10);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let peak_rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024;
        Usage { cpu, peak_rss }
    }

    /// CPU used since `earlier`.
    pub fn cpu_since(&self, earlier: &Usage) -> Duration {
        self.cpu.saturating_sub(earlier.cpu)
    }
}
