//! Security group ingress rules as plain data, whatever the kind of load
//! balancer: the rules a group holds, the permission that carries one
//! rule, and the rules a load balancer's own group (its clients) and the
//! nodes' groups (the load balancer itself) need. No cloud calls here.

use std::collections::BTreeSet;

use aws_sdk_ec2::types::{IpPermission, IpRange, Ipv6Range, SecurityGroup, UserIdGroupPair};

/// Where the traffic of one ingress rule comes from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Source {
    Cidr(String),
    Cidr6(String),
    Group(String),
}

/// One ingress rule: IP protocol (`tcp`/`udp`), port, source.
pub(super) type Rule = (String, i32, Source);

/// A port traffic reaches, with the IP protocols (`tcp`, `udp`) it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Opening {
    pub(super) port: i32,
    pub(super) protocols: &'static [&'static str],
}

/// The single-port rules of `group` (rules over a port range are not ours).
pub(super) fn rules_of(group: &SecurityGroup) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for p in group.ip_permissions() {
        let (Some(proto), Some(from), Some(to)) = (p.ip_protocol(), p.from_port(), p.to_port())
        else {
            continue;
        };
        if from != to {
            continue;
        }
        for r in p.ip_ranges() {
            if let Some(c) = r.cidr_ip() {
                out.insert((proto.to_owned(), from, Source::Cidr(c.to_owned())));
            }
        }
        for r in p.ipv6_ranges() {
            if let Some(c) = r.cidr_ipv6() {
                out.insert((proto.to_owned(), from, Source::Cidr6(c.to_owned())));
            }
        }
        for g in p.user_id_group_pairs() {
            if let Some(id) = g.group_id() {
                out.insert((proto.to_owned(), from, Source::Group(id.to_owned())));
            }
        }
    }
    out
}

/// Those of `group`'s rules whose source is the group `source`.
pub(super) fn rules_from(group: &SecurityGroup, source: &str) -> BTreeSet<Rule> {
    rules_of(group)
        .into_iter()
        .filter(|r| r.2 == Source::Group(source.to_owned()))
        .collect()
}

/// The permission that carries one rule.
pub(super) fn permission((proto, port, source): &Rule) -> IpPermission {
    let b = IpPermission::builder()
        .ip_protocol(proto)
        .from_port(*port)
        .to_port(*port);
    match source {
        Source::Cidr(c) => b.ip_ranges(IpRange::builder().cidr_ip(c).build()),
        Source::Cidr6(c) => b.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(c).build()),
        Source::Group(g) => b.user_id_group_pairs(UserIdGroupPair::builder().group_id(g).build()),
    }
    .build()
}

/// The load balancer's own group's rules: each of the Service's source
/// ranges (everyone when it names none, over IPv6 too when `dualstack`) on
/// each port the load balancer listens on.
pub(super) fn client_rules(
    source_ranges: &[String],
    dualstack: bool,
    listening: impl IntoIterator<Item = Opening>,
) -> BTreeSet<Rule> {
    let mut sources: Vec<Source> = source_ranges
        .iter()
        .filter_map(|r| r.parse::<ipnet::IpNet>().ok())
        .map(|n| match n.trunc() {
            ipnet::IpNet::V4(n) => Source::Cidr(n.to_string()),
            ipnet::IpNet::V6(n) => Source::Cidr6(n.to_string()),
        })
        .collect();
    if sources.is_empty() {
        sources.push(Source::Cidr("0.0.0.0/0".into()));
        if dualstack {
            sources.push(Source::Cidr6("::/0".into()));
        }
    }
    let mut out = BTreeSet::new();
    for opening in listening {
        for proto in opening.protocols {
            for s in &sources {
                out.insert(((*proto).to_owned(), opening.port, s.clone()));
            }
        }
    }
    out
}

/// The rules the nodes' groups need for the load balancer's group
/// `lb_group`: the ports its targets listen on (the node ports) and the
/// health check's own port, when it has one.
pub(super) fn node_rules(
    lb_group: &str,
    targets: impl IntoIterator<Item = Opening>,
    health_check_port: Option<i32>,
) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for opening in targets {
        for proto in opening.protocols {
            out.insert((
                (*proto).to_owned(),
                opening.port,
                Source::Group(lb_group.to_owned()),
            ));
        }
    }
    if let Some(port) = health_check_port {
        out.insert(("tcp".into(), port, Source::Group(lb_group.to_owned())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &[&str] = &["tcp"];
    const TCP_UDP: &[&str] = &["tcp", "udp"];

    fn rule(proto: &str, port: i32, source: Source) -> Rule {
        (proto.to_owned(), port, source)
    }

    #[test]
    fn clients_are_everyone_unless_source_ranges_name_them() {
        let ports = [Opening {
            port: 53,
            protocols: TCP_UDP,
        }];
        let everyone = client_rules(&[], true, ports);
        assert_eq!(
            everyone,
            BTreeSet::from([
                rule("tcp", 53, Source::Cidr("0.0.0.0/0".into())),
                rule("tcp", 53, Source::Cidr6("::/0".into())),
                rule("udp", 53, Source::Cidr("0.0.0.0/0".into())),
                rule("udp", 53, Source::Cidr6("::/0".into())),
            ])
        );
        let ranges = ["10.1.2.3/16".to_owned(), "not a range".to_owned()];
        let named = client_rules(
            &ranges,
            true,
            [Opening {
                port: 80,
                protocols: TCP,
            }],
        );
        assert_eq!(
            named,
            BTreeSet::from([rule("tcp", 80, Source::Cidr("10.1.0.0/16".into()))])
        );
    }

    #[test]
    fn nodes_admit_the_load_balancer_on_node_ports_and_the_health_check_port() {
        let node_ports = [Opening {
            port: 30053,
            protocols: TCP_UDP,
        }];
        let group = || Source::Group("sg-lb".into());
        assert_eq!(
            node_rules("sg-lb", node_ports, Some(32000)),
            BTreeSet::from([
                rule("tcp", 30053, group()),
                rule("udp", 30053, group()),
                rule("tcp", 32000, group()),
            ])
        );
        assert_eq!(node_rules("sg-lb", node_ports, None).len(), 2);
    }
}
