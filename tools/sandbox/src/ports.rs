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
/// thousands of connections beside them.
///
/// A port handed out stays reserved for as long as this process lives, by
/// a lock on a file named after it (see [`reserve`]): two tests starting
/// sandboxes side by side used to be handed the same free port now and
/// then, and the process of one of them, binding it second, exited.
pub fn free_port() -> anyhow::Result<u16> {
    let ceiling = ephemeral_start().max(FLOOR + 1_000);
    for _ in 0..1_000 {
        let port = fastrand::u16(FLOOR..ceiling);
        // Binding the unspecified address fails while anything listens on
        // the port on any address.
        if reserve(port) && TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free port between {FLOOR} and {ceiling} after 1,000 tries")
}

/// Reserves `port` for this process: an exclusive lock on
/// `<temp>/ccm-sandbox-ports/<port>`, held until the process exits (the
/// system lets go of it then, however the process ends). `false` when
/// another process, or this one, holds it already.
fn reserve(port: u16) -> bool {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("ccm-sandbox-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        // Nowhere to keep reservations: the bind check alone.
        return true;
    }
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return true;
    };
    // A lock belongs to its open file: this process's own earlier
    // reservation of the port refuses this one too.
    use rustix::fs::{FlockOperation, flock};
    if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false;
    }
    HELD.lock().unwrap_or_else(|e| e.into_inner()).push(file);
    true
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
    fn a_port_handed_out_is_never_handed_out_again_even_before_it_is_bound() {
        let ports: Vec<u16> = (0..300).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<&u16> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
        // Another process sees them reserved.
        let dir = std::env::temp_dir().join("ccm-sandbox-ports");
        let script = format!(
            "for p in {}; do flock -n {}/$p true && echo $p; done",
            ports
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            dir.display()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "", "locked by none");
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
