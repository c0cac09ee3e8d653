//! Request checks. Every problem of a request is collected, so one
//! `INVALID_ARGUMENT` names every field at fault; nothing reaches the cloud
//! before the request passed.

use std::net::IpAddr;

use ccm_proto::v1::{
    Host, IpFamily, LoadBalancerSpec, NodeAddress, NodeAddressType, NodeRef, Protocol, Route,
    ServiceRef, SessionAffinity, TrafficPolicy,
};
use ccm_runtime::names::{is_dns_label, is_dns_subdomain};
use ipnet::IpNet;

use crate::provider::{CloudError, Instances, Provider};

/// The most nodes in one GetInstances call.
pub const MAX_NODES: usize = 1000;
/// The most hosts behind one load balancer.
pub const MAX_HOSTS: usize = 10_000;
const MAX_PORTS: usize = 100;
const MAX_ADDRESSES: usize = 32;
const MAX_SOURCE_RANGES: usize = 200;
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// What the provider accepts as provider IDs: its scheme, and its own
/// check of the rest.
#[derive(Clone, Copy)]
pub struct ProviderIds<'a> {
    /// The provider's name, the scheme of its provider IDs.
    pub name: &'a str,
    /// The provider's instances, which check the rest of a provider ID.
    pub instances: Option<&'a dyn Instances>,
}

impl<'a> ProviderIds<'a> {
    /// The provider IDs `provider` accepts.
    pub fn of(provider: &'a dyn Provider) -> Self {
        Self {
            name: provider.name(),
            instances: provider.instances(),
        }
    }

    fn check(&self, provider_id: &str) -> Result<(), String> {
        self.instances
            .map_or(Ok(()), |i| i.check_provider_id(provider_id))
    }
}

/// Problems found in one request.
#[derive(Debug, Default)]
pub struct Violations(Vec<(String, String)>);

impl Violations {
    /// Records a problem with `field`.
    pub fn add(&mut self, field: impl Into<String>, problem: impl Into<String>) {
        self.0.push((field.into(), problem.into()));
    }

    /// `Ok` if nothing was found, else `INVALID_ARGUMENT` with every problem.
    pub fn finish(self) -> Result<(), CloudError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(CloudError::InvalidArgument(self.0))
        }
    }

    /// The cluster name: a DNS label, as it goes into cloud tags.
    pub fn cluster_name(&mut self, value: &str) {
        if !is_dns_label(value) {
            self.add(
                "cluster_name",
                format!("{value:?} is not a DNS label (1-63 of a-z, 0-9 and -)"),
            );
        }
    }

    /// A Kubernetes object name that must be a DNS subdomain (Nodes).
    pub fn name(&mut self, field: &str, value: &str) {
        if !is_dns_subdomain(value) {
            self.add(
                field,
                format!("{value:?} is not a DNS subdomain (1-253 of a-z, 0-9, - and .)"),
            );
        }
    }

    /// Node addresses: a known kind, and an IP for the IP kinds.
    pub fn addresses(&mut self, field: &str, addresses: &[NodeAddress]) {
        if addresses.len() > MAX_ADDRESSES {
            self.add(field, format!("at most {MAX_ADDRESSES} addresses"));
            return;
        }
        for (i, a) in addresses.iter().enumerate() {
            match NodeAddressType::try_from(a.r#type) {
                Ok(NodeAddressType::InternalIp | NodeAddressType::ExternalIp) => {
                    if a.address.parse::<IpAddr>().is_err() {
                        self.add(
                            format!("{field}[{i}].address"),
                            format!("{:?} is not an IP address", a.address),
                        );
                    }
                }
                Ok(NodeAddressType::Unspecified) | Err(_) => {
                    self.add(
                        format!("{field}[{i}].type"),
                        "must be set to a known address type",
                    );
                }
                Ok(_) => {
                    if a.address.is_empty() || a.address.len() > 253 {
                        self.add(format!("{field}[{i}].address"), "must be 1-253 characters");
                    }
                }
            }
        }
    }

    /// A provider ID: of this provider (`<provider>://...`), at most 1024
    /// characters, and of the form the provider's `check` accepts.
    pub fn provider_id(&mut self, field: &str, value: &str, provider: &ProviderIds<'_>) {
        let scheme = format!("{}://", provider.name);
        if !value.starts_with(&scheme) || value.len() > 1024 || value.len() == scheme.len() {
            // A provider ID of another cloud is not ours to judge: it
            // must never read as "not found".
            self.add(
                field,
                format!("{value:?} is not a provider ID of this cloud ({scheme}...)"),
            );
        } else if let Err(problem) = provider.check(value) {
            self.add(field, problem);
        }
    }

    /// The nodes of a GetInstances call.
    pub fn nodes(&mut self, nodes: &[NodeRef], provider: &ProviderIds<'_>) {
        if nodes.is_empty() || nodes.len() > MAX_NODES {
            self.add(
                "nodes",
                format!("must name 1 to {MAX_NODES} nodes, not {}", nodes.len()),
            );
            return;
        }
        for (i, node) in nodes.iter().enumerate() {
            if node.provider_id.is_empty() {
                if node.name.is_empty() {
                    self.add(format!("nodes[{i}]"), "needs a name or a provider_id");
                } else {
                    self.name(&format!("nodes[{i}].name"), &node.name);
                }
            } else {
                self.provider_id(
                    &format!("nodes[{i}].provider_id"),
                    &node.provider_id,
                    provider,
                );
            }
        }
    }

    /// A Service reference.
    pub fn service(&mut self, field: &str, service: Option<&ServiceRef>) {
        let Some(s) = service else {
            self.add(field, "is required");
            return;
        };
        if !is_dns_label(&s.namespace) {
            self.add(
                format!("{field}.namespace"),
                format!("{:?} is not a DNS label", s.namespace),
            );
        }
        if !is_dns_label(&s.name) {
            self.add(
                format!("{field}.name"),
                format!("{:?} is not a DNS label", s.name),
            );
        }
        if s.uid.is_empty()
            || s.uid.len() > 128
            || !s
                .uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            self.add(format!("{field}.uid"), format!("{:?} is not a UID", s.uid));
        }
    }

    /// A load balancer spec.
    pub fn spec(&mut self, spec: Option<&LoadBalancerSpec>) {
        let Some(spec) = spec else {
            self.add("spec", "is required");
            return;
        };
        self.service("spec.service", spec.service.as_ref());
        if spec.ports.is_empty() || spec.ports.len() > MAX_PORTS {
            self.add("spec.ports", format!("must have 1 to {MAX_PORTS} ports"));
        }
        for (i, p) in spec.ports.iter().enumerate() {
            if !(1..=65535).contains(&p.port) {
                self.add(
                    format!("spec.ports[{i}].port"),
                    format!("{} is not a port (1-65535)", p.port),
                );
            }
            if !(0..=65535).contains(&p.node_port) {
                self.add(
                    format!("spec.ports[{i}].node_port"),
                    format!("{} is not a port (0-65535)", p.node_port),
                );
            }
            if !matches!(
                Protocol::try_from(p.protocol),
                Ok(Protocol::Tcp | Protocol::Udp | Protocol::Sctp)
            ) {
                self.add(
                    format!("spec.ports[{i}].protocol"),
                    "must be TCP, UDP or SCTP",
                );
            }
        }
        if !spec.load_balancer_ip.is_empty() && spec.load_balancer_ip.parse::<IpAddr>().is_err() {
            self.add(
                "spec.load_balancer_ip",
                format!("{:?} is not an IP address", spec.load_balancer_ip),
            );
        }
        if spec.source_ranges.len() > MAX_SOURCE_RANGES {
            self.add(
                "spec.source_ranges",
                format!("at most {MAX_SOURCE_RANGES} ranges"),
            );
        }
        for (i, range) in spec.source_ranges.iter().enumerate() {
            self.cidr(&format!("spec.source_ranges[{i}]"), range);
        }
        if spec.ip_families.len() > 2
            || spec
                .ip_families
                .iter()
                .any(|f| IpFamily::try_from(*f).is_err())
        {
            self.add("spec.ip_families", "at most two known families");
        }
        if TrafficPolicy::try_from(spec.external_traffic_policy).is_err() {
            self.add("spec.external_traffic_policy", "unknown policy");
        }
        if SessionAffinity::try_from(spec.session_affinity).is_err() {
            self.add("spec.session_affinity", "unknown affinity");
        }
        if !(0..=65535).contains(&spec.health_check_node_port) {
            self.add("spec.health_check_node_port", "is not a port (0-65535)");
        }
        let size: usize = spec
            .annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if size > MAX_ANNOTATIONS_BYTES {
            self.add(
                "spec.annotations",
                format!("larger than {MAX_ANNOTATIONS_BYTES} bytes"),
            );
        }
    }

    /// Load balancer hosts.
    pub fn hosts(&mut self, hosts: &[Host]) {
        if hosts.len() > MAX_HOSTS {
            self.add(
                "hosts",
                format!("at most {MAX_HOSTS} hosts, not {}", hosts.len()),
            );
            return;
        }
        for (i, host) in hosts.iter().enumerate() {
            self.name(&format!("hosts[{i}].name"), &host.name);
        }
    }

    /// A CIDR; returns it parsed.
    pub fn cidr(&mut self, field: &str, value: &str) -> Option<IpNet> {
        match value.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                self.add(
                    field,
                    format!("{value:?} is not a CIDR such as 10.244.0.0/24"),
                );
                None
            }
        }
    }

    /// A route to create or delete. `create` requires a target node.
    pub fn route(&mut self, route: Option<&Route>, create: bool, provider: &ProviderIds<'_>) {
        let Some(route) = route else {
            self.add("route", "is required");
            return;
        };
        if create || !route.target_node.is_empty() {
            self.name("route.target_node", &route.target_node);
        }
        if !route.target_provider_id.is_empty() {
            self.provider_id(
                "route.target_provider_id",
                &route.target_provider_id,
                provider,
            );
        }
        if create || route.name.is_empty() {
            self.cidr("route.destination_cidr", &route.destination_cidr);
        }
        if route.name.len() > 255 {
            self.add("route.name", "at most 255 characters");
        }
        self.addresses("route.target_node_addresses", &route.target_node_addresses);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIM: ProviderIds<'static> = ProviderIds {
        name: "sim",
        instances: None,
    };

    fn problems(f: impl FnOnce(&mut Violations)) -> Vec<String> {
        let mut v = Violations::default();
        f(&mut v);
        v.0.into_iter().map(|(field, _)| field).collect()
    }

    #[test]
    fn names_follow_kubernetes_rules() {
        assert!(problems(|v| v.cluster_name("kubernetes")).is_empty());
        assert_eq!(problems(|v| v.cluster_name("")), ["cluster_name"]);
        assert_eq!(problems(|v| v.cluster_name("Has_Caps")), ["cluster_name"]);
        assert_eq!(
            problems(|v| v.cluster_name(&"x".repeat(64))),
            ["cluster_name"]
        );
        assert!(problems(|v| v.name("n", "node-1.example")).is_empty());
        assert_eq!(problems(|v| v.name("n", "-bad")), ["n"]);
    }

    #[test]
    fn foreign_or_empty_provider_ids_are_invalid_not_missing() {
        let nodes = vec![
            NodeRef {
                name: String::new(),
                provider_id: "aws:///i-1".into(),
            },
            NodeRef {
                name: String::new(),
                provider_id: "sim://".into(),
            },
            NodeRef::default(),
            NodeRef {
                name: "ok".into(),
                provider_id: "sim://i-1".into(),
            },
        ];
        assert_eq!(
            problems(|v| v.nodes(&nodes, &SIM)),
            ["nodes[0].provider_id", "nodes[1].provider_id", "nodes[2]"]
        );
        assert_eq!(problems(|v| v.nodes(&[], &SIM)), ["nodes"]);
    }

    #[test]
    fn a_bad_spec_names_every_field() {
        let spec = LoadBalancerSpec {
            service: Some(ServiceRef {
                namespace: "default".into(),
                name: "web".into(),
                uid: String::new(),
            }),
            ports: vec![ccm_proto::v1::ServicePort {
                name: String::new(),
                protocol: 0,
                port: 70000,
                node_port: -1,
            }],
            load_balancer_ip: "nope".into(),
            source_ranges: vec!["10.0.0.0/33".into()],
            ..Default::default()
        };
        assert_eq!(
            problems(|v| v.spec(Some(&spec))),
            [
                "spec.service.uid",
                "spec.ports[0].port",
                "spec.ports[0].node_port",
                "spec.ports[0].protocol",
                "spec.load_balancer_ip",
                "spec.source_ranges[0]",
            ]
        );
    }
}
