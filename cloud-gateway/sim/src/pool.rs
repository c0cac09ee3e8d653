//! Address arithmetic over pools of networks: the n-th usable address of a
//! list of networks, and the next free one after a cursor. Handing out
//! addresses round-robin from a cursor means a released address is reused
//! last, as clouds do to spare stale DNS and client caches.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// At most this many addresses of one network are considered, so that a
/// huge IPv6 pool does not make a scan endless.
const MAX_PER_NETWORK: u128 = 1 << 20;

/// The usable addresses of a network: `(first, count)`. IPv4 networks wider
/// than /31 lose their network and broadcast addresses; IPv6 networks lose
/// their subnet-router anycast address.
fn usable(net: &IpNet) -> (u128, u128) {
    match net {
        IpNet::V4(n) => {
            let base = u32::from(n.network()) as u128;
            let size = 1u128 << (32 - n.prefix_len());
            if n.prefix_len() >= 31 {
                (base, size)
            } else {
                (base + 1, size - 2)
            }
        }
        IpNet::V6(n) => {
            let base = u128::from(n.network());
            let bits = 128 - n.prefix_len() as u32;
            let size = if bits >= 127 {
                u128::MAX
            } else {
                1u128 << bits
            };
            if n.prefix_len() == 128 {
                (base, 1)
            } else {
                (base + 1, (size - 1).min(MAX_PER_NETWORK))
            }
        }
    }
}

fn to_addr(net: &IpNet, value: u128) -> IpAddr {
    match net {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

fn total(pools: &[IpNet]) -> u128 {
    pools.iter().map(|n| usable(n).1).sum()
}

/// The `index`-th usable address over `pools`, in order.
pub fn address_at(pools: &[IpNet], index: u64) -> Option<IpAddr> {
    let mut index = index as u128;
    for net in pools {
        let (first, count) = usable(net);
        if index < count {
            return Some(to_addr(net, first + index));
        }
        index -= count;
    }
    None
}

/// The first address at or after `cursor` (wrapping) not in `used`, and the
/// cursor to use next time.
pub fn next_free(pools: &[IpNet], cursor: u64, used: &HashSet<IpAddr>) -> Option<(IpAddr, u64)> {
    let total = total(pools);
    if total == 0 {
        return None;
    }
    let start = cursor as u128 % total;
    for step in 0..total {
        let index = ((start + step) % total) as u64;
        let ip = address_at(pools, index)?;
        if !used.contains(&ip) {
            return Some((ip, index + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn ipv4_pools_skip_network_and_broadcast() {
        let pools = nets(&["192.0.2.0/30", "198.51.100.7/32"]);
        let all: Vec<_> = (0..4).map(|i| address_at(&pools, i)).collect();
        assert_eq!(
            all,
            vec![
                Some("192.0.2.1".parse().unwrap()),
                Some("192.0.2.2".parse().unwrap()),
                Some("198.51.100.7".parse().unwrap()),
                None,
            ]
        );
    }

    #[test]
    fn next_free_skips_used_wraps_and_reports_exhaustion() {
        let pools = nets(&["192.0.2.0/30"]);
        let mut used = HashSet::new();
        let (a, cursor) = next_free(&pools, 0, &used).unwrap();
        used.insert(a);
        let (b, cursor) = next_free(&pools, cursor, &used).unwrap();
        assert_ne!(a, b);
        used.insert(b);
        assert_eq!(next_free(&pools, cursor, &used), None);
        used.remove(&a);
        assert_eq!(next_free(&pools, cursor, &used).map(|x| x.0), Some(a));
    }

    #[test]
    fn ipv6_pools_are_bounded() {
        let pools = nets(&["2001:db8::/64"]);
        assert_eq!(address_at(&pools, 0), Some("2001:db8::1".parse().unwrap()));
        assert_eq!(total(&pools), MAX_PER_NETWORK);
    }
}
