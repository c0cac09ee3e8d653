//! The nodes' rules of an NLB without a security group, as
//! cloud-provider-aws writes them (its default: AWS cannot give an NLB a
//! group after creation, so such an NLB keeps working this way): the
//! clients' CIDRs on the node ports, the NLB's subnets on the health check
//! ports, and ICMP for path MTU discovery, each told apart from the other
//! rules of the nodes' groups by the description of its source. No cloud
//! calls here.

use std::collections::BTreeSet;

use super::ingress_rules::{Opening, Rule, Source, client_rules};

/// The description of a client rule, `=` and the NLB's name after it.
const CLIENT: &str = "kubernetes.io/rule/nlb/client";
/// The description of a health check rule, `=` and the NLB's name after it.
const HEALTH: &str = "kubernetes.io/rule/nlb/health";
/// The description of an ICMP rule for path MTU discovery, one per CIDR
/// whichever NLBs it serves.
pub(super) const MTU: &str = "kubernetes.io/rule/nlb/mtu";

/// Whether `description` marks a client or health check rule of the NLB
/// `lb_name`.
pub(super) fn is_of(description: &str, lb_name: &str) -> bool {
    description
        .strip_prefix(CLIENT)
        .or_else(|| description.strip_prefix(HEALTH))
        .and_then(|rest| rest.strip_prefix('='))
        == Some(lb_name)
}

/// Whether `description` marks a client rule of any NLB.
pub(super) fn is_client(description: &str) -> bool {
    description.starts_with(CLIENT)
}

/// What the nodes admit for one NLB without a group: its clients on the
/// node ports, and the health check ports.
pub(super) struct CidrAccess {
    clients: BTreeSet<Rule>,
    health_ports: BTreeSet<i32>,
}

impl CidrAccess {
    /// The access for the Service's source ranges (everyone when none, over
    /// IPv6 too when `dualstack`) on the node ports `node`, checked on
    /// `health_check_port`, or on the node ports themselves when `None`.
    pub(super) fn new(
        source_ranges: &[String],
        dualstack: bool,
        node: impl IntoIterator<Item = Opening> + Clone,
        health_check_port: Option<i32>,
    ) -> Self {
        let health_ports = match health_check_port {
            Some(p) => BTreeSet::from([p]),
            None => node.clone().into_iter().map(|o| o.port).collect(),
        };
        Self {
            clients: client_rules(source_ranges, dualstack, node),
            health_ports,
        }
    }

    /// Whether health check rules are needed besides the client rules:
    /// not when the clients are everyone over IPv4, on TCP only, on the
    /// ports the checks go to (upstream leaves them out then).
    pub(super) fn needs_health_rules(&self) -> bool {
        let everyone_on_tcp = self
            .clients
            .iter()
            .all(|r| r.proto == "tcp" && r.source == Source::Cidr("0.0.0.0/0".into()));
        let client_ports: BTreeSet<i32> = self.clients.iter().map(|r| r.from).collect();
        !(everyone_on_tcp && client_ports == self.health_ports)
    }

    /// The rules of the NLB `lb_name`, health checks coming from
    /// `subnet_cidrs` (the NLB's subnets; unread when not needed).
    pub(super) fn rules(&self, lb_name: &str, subnet_cidrs: &[String]) -> BTreeSet<Rule> {
        let client = format!("{CLIENT}={lb_name}");
        let mut out: BTreeSet<Rule> = self
            .clients
            .iter()
            .map(|r| r.clone().described(&client))
            .collect();
        if self.needs_health_rules() {
            let health = format!("{HEALTH}={lb_name}");
            for port in &self.health_ports {
                for cidr in subnet_cidrs {
                    let source = Source::Cidr(cidr.clone());
                    out.insert(Rule::port("tcp", *port, source).described(&health));
                }
            }
        }
        out
    }
}

/// ICMP for path MTU discovery from each IPv4 CIDR of `clients` (the
/// client rules of every NLB in one group), one rule a CIDR.
pub(super) fn mtu_rules<'a>(clients: impl IntoIterator<Item = &'a Rule>) -> BTreeSet<Rule> {
    clients
        .into_iter()
        .filter(|r| matches!(r.source, Source::Cidr(_)))
        .map(|r| Rule::mtu_discovery(r.source.clone()).described(MTU))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LB: &str = "a1234abcd12ab34cd56ef1234567890";

    fn web() -> [Opening; 1] {
        [Opening {
            port: 30080,
            protocols: &["tcp"],
        }]
    }

    #[test]
    fn everyone_on_the_traffic_port_needs_no_health_rules() {
        let access = CidrAccess::new(&[], false, web(), None);
        assert!(!access.needs_health_rules());
        let rules = access.rules(LB, &["10.0.1.0/24".into()]);
        let client = Rule::port("tcp", 30080, Source::Cidr("0.0.0.0/0".into()))
            .described(format!("kubernetes.io/rule/nlb/client={LB}"));
        assert_eq!(rules, BTreeSet::from([client]));
    }

    #[test]
    fn source_ranges_or_a_health_check_port_add_health_rules_from_the_subnets() {
        let ranges = ["203.0.113.0/24".to_owned()];
        let access = CidrAccess::new(&ranges, false, web(), None);
        let rules = access.rules(LB, &["10.0.1.0/24".into(), "10.0.2.0/24".into()]);
        let health: Vec<&Rule> = rules
            .iter()
            .filter(|r| {
                r.description
                    .as_deref()
                    .is_some_and(|d| d.starts_with(HEALTH))
            })
            .collect();
        assert_eq!(health.len(), 2, "{rules:?}");
        assert!(health.iter().all(|r| r.from == 30080));
        let local = CidrAccess::new(&[], false, web(), Some(32000));
        assert!(local.needs_health_rules());
        assert!(
            local
                .rules(LB, &["10.0.1.0/24".into()])
                .iter()
                .any(|r| r.from == 32000)
        );
        let udp = CidrAccess::new(
            &[],
            false,
            [Opening {
                port: 30053,
                protocols: &["udp"],
            }],
            None,
        );
        assert!(
            udp.needs_health_rules(),
            "UDP clients need TCP health rules"
        );
    }

    #[test]
    fn descriptions_name_the_nlb_exactly() {
        assert!(is_of(&format!("{CLIENT}={LB}"), LB));
        assert!(is_of(&format!("{HEALTH}={LB}"), LB));
        assert!(!is_of(&format!("{CLIENT}={LB}x"), LB));
        assert!(!is_of(MTU, LB));
        assert!(is_client(&format!("{CLIENT}=other")));
        assert!(!is_client(MTU));
    }

    #[test]
    fn each_ipv4_client_cidr_gets_one_mtu_rule() {
        let ranges = ["203.0.113.0/24".to_owned(), "2001:db8::/32".to_owned()];
        let a = CidrAccess::new(&ranges, true, web(), None).rules(LB, &[]);
        let b = CidrAccess::new(&ranges, true, web(), None).rules("other", &[]);
        let mtu = mtu_rules(a.iter().chain(&b));
        assert_eq!(
            mtu,
            BTreeSet::from([
                Rule::mtu_discovery(Source::Cidr("203.0.113.0/24".into())).described(MTU)
            ])
        );
    }
}
