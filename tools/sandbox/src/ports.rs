//! Loopback ports for the processes the tools and tests start.

use std::net::{Ipv4Addr, TcpListener};

use anyhow::bail;

/// Where the kernel's own choice of ports starts when nothing says
/// otherwise (Linux's default `ip_local_port_range`).
const EPHEMERAL_START: u16 = 32_768;

/// The lowest port handed out: above the well-known and most registered
/// services' ports.
const FLOOR: u16 = 10_000;

/// A port free now on every address, for a process started next to listen
/// on. It is taken below the kernel's ephemeral range: a port from that
/// range (a listener on port 0) can be handed to any outgoing connection
/// or any other port-0 listener before the process binds it, which made
/// tests fail with "address in use" while the benchmark test opened
/// thousands of connections beside them. Picked at random, so that test
/// processes running side by side rarely try the same one.
pub fn free_port() -> anyhow::Result<u16> {
    let ceiling = ephemeral_start().max(FLOOR + 1_000);
    for _ in 0..1_000 {
        let port = fastrand::u16(FLOOR..ceiling);
        // Binding the unspecified address fails while anything listens on
        // the port on any address.
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port between {FLOOR} and {ceiling} after 1,000 tries")
}

/// The first port of the kernel's ephemeral range on this machine.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_below_the_ephemeral_range() {
        for _ in 0..50 {
            let port = free_port().unwrap();
            assert!((FLOOR..ephemeral_start().max(FLOOR + 1_000)).contains(&port));
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
    }

    #[test]
    fn a_port_in_use_is_never_handed_out() {
        let held: Vec<TcpListener> = (0..200)
            .filter_map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, free_port().ok()?)).ok())
            .collect();
        let taken: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        for _ in 0..200 {
            assert!(!taken.contains(&free_port().unwrap()));
        }
    }
}
