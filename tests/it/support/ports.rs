//! Loopback ports for the servers a test starts as processes of their own
//! (Kafka nodes, Apicurio, `posbridge serve`, the replicas script's cast).
//!
//! They are handed out below the kernel's ephemeral range. A port found by
//! binding port 0 lies inside that range, and stays free only until the
//! server binds it: meanwhile any outgoing connection of the other tests
//! running beside it, or another test's port-0 pick, can take it. A Kafka
//! node's JVM takes seconds to bind its four, a three-node cluster under a
//! loaded suite many more. Below the range nothing but this allocator picks
//! ports, and one cursor per test process never hands the same one out twice.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// First port handed out: above the ports `scripts/test` gives the shared
/// broker (19092…), registry (18181…) and Redis (16379).
const FLOOR: u32 = 20_000;

/// Where the next search starts, as an offset from `FLOOR`; set from the
/// process id on first use so two test binaries run at once start apart.
static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);

/// A loopback port nothing listens on.
pub fn free_port() -> u16 {
    free_ports(1)
}

/// A first port of `count` free consecutive ones (`scripts/kafka` takes
/// four from its first, `scripts/apicurio` two).
pub fn free_ports(count: u16) -> u16 {
    let span = ephemeral_floor().saturating_sub(FLOOR);
    if span < u32::from(count) * 64 {
        return from_the_ephemeral_range(count);
    }
    let _ = CURSOR.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    loop {
        let offset = CURSOR.fetch_add(u32::from(count), Ordering::Relaxed) % span;
        if offset + u32::from(count) > span {
            continue;
        }
        let first = (FLOOR + offset) as u16;
        if (0..count).all(|i| TcpListener::bind(("127.0.0.1", first + i)).is_ok()) {
            return first;
        }
    }
}

/// The lowest port of the kernel's ephemeral range (`ip_local_port_range`),
/// or Linux's default where it cannot be read.
fn ephemeral_floor() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Where the ephemeral range leaves no room below it: consecutive ports
/// found by binding port 0, as well as that can be done.
fn from_the_ephemeral_range(count: u16) -> u16 {
    loop {
        let first = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first < u16::MAX - count
            && (1..count).all(|i| TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            return first;
        }
    }
}
