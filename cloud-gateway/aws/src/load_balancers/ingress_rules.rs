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

/// One ingress rule: IP protocol (`tcp`, `udp`, `icmp`, or `-1` for all
/// traffic), port range (ICMP: type and code; `-1` for all traffic),
/// source, and the description of a CIDR source (AWS ignores it when it
/// matches rules, so only the rules read by [`described_rules`] carry it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Rule {
    pub(super) proto: String,
    pub(super) from: i32,
    pub(super) to: i32,
    pub(super) source: Source,
    pub(super) description: Option<String>,
}

impl Rule {
    /// `proto` on one port from `source`.
    pub(super) fn port(proto: &str, port: i32, source: Source) -> Self {
        Self {
            proto: proto.to_owned(),
            from: port,
            to: port,
            source,
            description: None,
        }
    }

    /// Every protocol and port from `source`: what a Classic ELB's group
    /// gets on the nodes' groups, as upstream opens it.
    pub(super) fn all_traffic(source: Source) -> Self {
        Self {
            proto: ALL_TRAFFIC.to_owned(),
            from: -1,
            to: -1,
            source,
            description: None,
        }
    }

    /// ICMP "fragmentation needed" (type 3, code 4) from `source`, so
    /// path MTU discovery works through the load balancer.
    pub(super) fn mtu_discovery(source: Source) -> Self {
        Self {
            proto: "icmp".to_owned(),
            from: 3,
            to: 4,
            source,
            description: None,
        }
    }

    /// This rule with the description `d` on its source.
    pub(super) fn described(self, d: impl Into<String>) -> Self {
        Self {
            description: Some(d.into()),
            ..self
        }
    }

    /// Whether this is an all-traffic rule.
    pub(super) fn is_all_traffic(&self) -> bool {
        self.proto == ALL_TRAFFIC
    }

    /// Whether a group's rule over `proto`, `from`..`to` is of a shape
    /// this module writes (others are never ours to revoke).
    fn is_ours(proto: &str, from: i32, to: i32) -> bool {
        proto == ALL_TRAFFIC || from == to || (proto == "icmp" && (from, to) == (3, 4))
    }
}

/// The IP protocol of an all-traffic rule.
const ALL_TRAFFIC: &str = "-1";

/// A port traffic reaches, with the IP protocols (`tcp`, `udp`) it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Opening {
    pub(super) port: i32,
    pub(super) protocols: &'static [&'static str],
}

/// The rules of `group` of a shape this module writes: single ports, all
/// traffic, ICMP for path MTU discovery (other port ranges are not ours).
/// Descriptions are left out: these rules are matched as AWS matches them.
pub(super) fn rules_of(group: &SecurityGroup) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for p in group.ip_permissions() {
        let Some(proto) = p.ip_protocol() else {
            continue;
        };
        let (from, to) = (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1));
        if !Rule::is_ours(proto, from, to) {
            continue;
        }
        let rule = |source| Rule {
            proto: proto.to_owned(),
            from,
            to,
            source,
            description: None,
        };
        let cidrs = p.ip_ranges().iter().filter_map(|r| r.cidr_ip());
        out.extend(cidrs.map(|c| rule(Source::Cidr(c.to_owned()))));
        let cidrs6 = p.ipv6_ranges().iter().filter_map(|r| r.cidr_ipv6());
        out.extend(cidrs6.map(|c| rule(Source::Cidr6(c.to_owned()))));
        let groups = p.user_id_group_pairs().iter().filter_map(|g| g.group_id());
        out.extend(groups.map(|g| rule(Source::Group(g.to_owned()))));
    }
    out
}

/// Those of `group`'s rules whose source is the group `source`.
pub(super) fn rules_from(group: &SecurityGroup, source: &str) -> BTreeSet<Rule> {
    rules_of(group)
        .into_iter()
        .filter(|r| r.source == Source::Group(source.to_owned()))
        .collect()
}

/// The CIDR-sourced rules of `group` whose description `keep` accepts,
/// descriptions included: how rules other writers share one group with
/// are told apart (cloud-provider-aws's rules for NLBs without a group).
pub(super) fn described_rules(
    group: &SecurityGroup,
    keep: impl Fn(&str) -> bool,
) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for p in group.ip_permissions() {
        let Some(proto) = p.ip_protocol() else {
            continue;
        };
        let (from, to) = (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1));
        let rule = |source, d: &str| Rule {
            proto: proto.to_owned(),
            from,
            to,
            source,
            description: Some(d.to_owned()),
        };
        for r in p.ip_ranges() {
            if let (Some(c), Some(d)) = (r.cidr_ip(), r.description())
                && keep(d)
            {
                out.insert(rule(Source::Cidr(c.to_owned()), d));
            }
        }
        for r in p.ipv6_ranges() {
            if let (Some(c), Some(d)) = (r.cidr_ipv6(), r.description())
                && keep(d)
            {
                out.insert(rule(Source::Cidr6(c.to_owned()), d));
            }
        }
    }
    out
}

/// The permission that carries one rule.
pub(super) fn permission(rule: &Rule) -> IpPermission {
    let mut b = IpPermission::builder().ip_protocol(&rule.proto);
    if rule.proto != ALL_TRAFFIC {
        b = b.from_port(rule.from).to_port(rule.to);
    }
    let d = rule.description.clone();
    match &rule.source {
        Source::Cidr(c) => b.ip_ranges(IpRange::builder().cidr_ip(c).set_description(d).build()),
        Source::Cidr6(c) => {
            b.ipv6_ranges(Ipv6Range::builder().cidr_ipv6(c).set_description(d).build())
        }
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
                out.insert(Rule::port(proto, opening.port, s.clone()));
            }
        }
    }
    out
}

/// `rules` and, for each IPv4 source among them, ICMP for path MTU
/// discovery (what a Classic ELB's group gets, as upstream makes it).
pub(super) fn with_mtu_discovery(mut rules: BTreeSet<Rule>) -> BTreeSet<Rule> {
    let sources: BTreeSet<Source> = rules
        .iter()
        .filter(|r| matches!(r.source, Source::Cidr(_)))
        .map(|r| r.source.clone())
        .collect();
    rules.extend(sources.into_iter().map(Rule::mtu_discovery));
    rules
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
            out.insert(Rule::port(
                proto,
                opening.port,
                Source::Group(lb_group.to_owned()),
            ));
        }
    }
    if let Some(port) = health_check_port {
        out.insert(Rule::port("tcp", port, Source::Group(lb_group.to_owned())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &[&str] = &["tcp"];
    const TCP_UDP: &[&str] = &["tcp", "udp"];

    fn rule(proto: &str, port: i32, source: Source) -> Rule {
        Rule::port(proto, port, source)
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
    fn ipv4_clients_also_get_icmp_for_path_mtu_discovery() {
        let clients = client_rules(
            &["10.0.0.0/8".to_owned(), "fd00::/8".to_owned()],
            false,
            [Opening {
                port: 80,
                protocols: TCP,
            }],
        );
        let all = with_mtu_discovery(clients);
        assert_eq!(all.len(), 3, "{all:?}");
        let mtu = Rule::mtu_discovery(Source::Cidr("10.0.0.0/8".into()));
        assert!(all.contains(&mtu));
        let p = permission(&mtu);
        assert_eq!(
            (p.ip_protocol(), p.from_port(), p.to_port()),
            (Some("icmp"), Some(3), Some(4))
        );
        let everything = permission(&Rule::all_traffic(Source::Group("sg-elb".into())));
        assert_eq!(
            (everything.ip_protocol(), everything.from_port()),
            (Some("-1"), None)
        );
    }

    #[test]
    fn rules_of_a_group_are_read_back_in_the_shapes_written() {
        let group = SecurityGroup::builder()
            .ip_permissions(permission(&Rule::all_traffic(Source::Group(
                "sg-elb".into(),
            ))))
            .ip_permissions(permission(&Rule::mtu_discovery(Source::Cidr(
                "0.0.0.0/0".into(),
            ))))
            .ip_permissions(permission(&rule(
                "tcp",
                80,
                Source::Cidr("0.0.0.0/0".into()),
            )))
            .ip_permissions(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(1000)
                    .to_port(2000)
                    .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/8").build())
                    .build(),
            )
            .build();
        let read = rules_of(&group);
        assert_eq!(read.len(), 3, "a port range is not ours: {read:?}");
        assert_eq!(rules_from(&group, "sg-elb").len(), 1);
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
