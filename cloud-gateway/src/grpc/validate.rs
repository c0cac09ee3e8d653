//! Request checks. Every problem of a request is collected, so one
//! `INVALID_ARGUMENT` names every field at fault; nothing reaches the cloud
//! before the request passed.

use std::net::IpAddr;

use ccm_proto::v1::{
    Host, IpFamily, LoadBalancerSpec, NodeAddress, NodeAddressType, NodeRef, Protocol, Route,
    ServiceRef, SessionAffinity, TrafficPolicy,
};
use ccm_runtime::config_checks::quote;
use ccm_runtime::names::{CLUSTER_NAME_RULE, is_cluster_name, is_dns_label, is_dns_subdomain};
use ipnet::IpNet;

use ccm_provider::CloudError;

use crate::cloud::Cloud;
use crate::limits::*;

/// The most problems one error names; the rest are counted. Error details
/// travel in a trailer, and a default gRPC client refuses trailers past a
/// few kilobytes.
const MAX_REPORTED: usize = 20;

/// What the provider accepts as provider IDs: its scheme, and its own
/// check of the rest.
#[derive(Clone, Copy)]
pub struct ProviderIds<'a> {
    /// The provider's name, the scheme of its provider IDs.
    pub name: &'a str,
    /// The cloud whose provider checks the rest of a provider ID.
    pub cloud: Option<&'a Cloud>,
}

impl<'a> ProviderIds<'a> {
    /// The provider IDs `cloud`'s provider accepts.
    pub fn of(cloud: &'a Cloud) -> Self {
        Self {
            name: cloud.name(),
            cloud: Some(cloud),
        }
    }

    fn check(&self, provider_id: &str) -> Result<(), String> {
        self.cloud
            .map_or(Ok(()), |c| c.check_provider_id(provider_id))
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

    /// `Ok` if nothing was found, else `INVALID_ARGUMENT` with the problems
    /// (the first 20, and how many more there were).
    pub fn finish(mut self) -> Result<(), CloudError> {
        if self.0.is_empty() {
            return Ok(());
        }
        if self.0.len() > MAX_REPORTED {
            let more = self.0.len() - MAX_REPORTED;
            self.0.truncate(MAX_REPORTED);
            self.0
                .push(("...".into(), format!("and {more} more problems like these")));
        }
        Err(CloudError::InvalidArgument(self.0))
    }

    /// The cluster name: a cloud cluster ID that fits a tag key.
    pub fn cluster_name(&mut self, value: &str) {
        if !is_cluster_name(value) {
            self.add(
                "cluster_name",
                format!(
                    "{} is not a cluster name ({CLUSTER_NAME_RULE})",
                    quote(value)
                ),
            );
        }
    }

    /// A Kubernetes object name that must be a DNS subdomain (Nodes).
    pub fn name(&mut self, field: &str, value: &str) {
        if !is_dns_subdomain(value) {
            self.add(
                field,
                format!(
                    "{} is not a DNS subdomain (1-253 of a-z, 0-9, - and .)",
                    quote(value)
                ),
            );
        }
    }

    /// Node addresses, at most `max`: a known kind, and an IP for the IP
    /// kinds.
    pub fn addresses(&mut self, field: &str, addresses: &[NodeAddress], max: usize) {
        if addresses.len() > max {
            self.add(field, format!("at most {max} addresses"));
            return;
        }
        for (i, a) in addresses.iter().enumerate() {
            match NodeAddressType::try_from(a.r#type) {
                Ok(NodeAddressType::InternalIp | NodeAddressType::ExternalIp) => {
                    if a.address.parse::<IpAddr>().is_err() {
                        self.add(
                            format!("{field}[{i}].address"),
                            format!("{} is not an IP address", quote(&a.address)),
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
                    if a.address.is_empty() || a.address.len() > MAX_NAME {
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
        let ours = (value.starts_with(&scheme) && value.len() > scheme.len())
            || provider
                .cloud
                .is_some_and(|c| c.accepts_bare_provider_id(value));
        if !ours || value.len() > MAX_PROVIDER_ID {
            // A provider ID of another cloud is not ours to judge: it
            // must never read as "not found".
            self.add(
                field,
                format!(
                    "{} is not a provider ID of this cloud ({scheme}...)",
                    quote(value)
                ),
            );
        } else if let Err(problem) = provider.check(value) {
            self.add(field, problem);
        }
    }

    /// Whether a call names 1 to [`MAX_NODES`] nodes; says so if not.
    fn node_count(&mut self, nodes: &[NodeRef]) -> bool {
        let ok = (1..=MAX_NODES).contains(&nodes.len());
        if !ok {
            self.add(
                "nodes",
                format!("must name 1 to {MAX_NODES} nodes, not {}", nodes.len()),
            );
        }
        ok
    }

    /// The nodes of a GetInstances call.
    pub fn nodes(&mut self, nodes: &[NodeRef], provider: &ProviderIds<'_>) {
        if !self.node_count(nodes) {
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
                if !node.name.is_empty() {
                    self.name(&format!("nodes[{i}].name"), &node.name);
                }
            }
        }
    }

    /// The nodes of a TagInstances call: 1 to [`MAX_NODES`], each by a
    /// provider ID of at most [`MAX_PROVIDER_ID`] bytes. Its form is the
    /// provider's to judge, node by node: one it cannot tag is answered
    /// `NOT_TAGGABLE` and never fails the others.
    pub fn tagged_nodes(&mut self, nodes: &[NodeRef]) {
        if !self.node_count(nodes) {
            return;
        }
        for (i, node) in nodes.iter().enumerate() {
            if node.provider_id.is_empty() || node.provider_id.len() > MAX_PROVIDER_ID {
                self.add(
                    format!("nodes[{i}].provider_id"),
                    format!("must be 1 to {MAX_PROVIDER_ID} bytes to tag"),
                );
            }
        }
    }

    /// The tags of a TagInstances call: 1 to [`MAX_TAGS`], keys of 1 to
    /// [`MAX_TAG_KEY`] characters, values of up to [`MAX_TAG_VALUE`]. What
    /// a cloud reserves (AWS's `aws:`) is the provider's to refuse.
    pub fn tags(&mut self, tags: &std::collections::HashMap<String, String>) {
        if tags.is_empty() || tags.len() > MAX_TAGS {
            self.add(
                "tags",
                format!("must hold 1 to {MAX_TAGS} tags, not {}", tags.len()),
            );
            return;
        }
        let mut keys: Vec<&String> = tags.keys().collect();
        keys.sort();
        for key in keys {
            let value = &tags[key];
            let len = key.chars().count();
            if !(1..=MAX_TAG_KEY).contains(&len) {
                self.add(
                    "tags",
                    format!("key {} is not 1 to {MAX_TAG_KEY} characters", quote(key)),
                );
            }
            if value.chars().count() > MAX_TAG_VALUE {
                self.add(
                    format!("tags[{}]", quote(key)),
                    format!("is longer than {MAX_TAG_VALUE} characters"),
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
                format!("{} is not a DNS label", quote(&s.namespace)),
            );
        }
        if !is_dns_label(&s.name) {
            self.add(
                format!("{field}.name"),
                format!("{} is not a DNS label", quote(&s.name)),
            );
        }
        if s.uid.is_empty()
            || s.uid.len() > MAX_UID
            || !s
                .uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            self.add(
                format!("{field}.uid"),
                format!("{} is not a UID", quote(&s.uid)),
            );
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
            if !p.name.is_empty() && !is_dns_label(&p.name) {
                self.add(
                    format!("spec.ports[{i}].name"),
                    format!("{} is not a DNS label", quote(&p.name)),
                );
            }
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
                format!("{} is not an IP address", quote(&spec.load_balancer_ip)),
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
        if spec.load_balancer_class.len() > MAX_CLASS {
            self.add(
                "spec.load_balancer_class",
                format!("at most {MAX_CLASS} characters"),
            );
        }
        let size: usize = spec
            .annotations
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if size > MAX_ANNOTATIONS_BYTES
            || spec.annotations.len() > MAX_ANNOTATIONS
            || spec
                .annotations
                .keys()
                .any(|k| k.len() > MAX_ANNOTATION_KEY)
        {
            self.add(
                "spec.annotations",
                format!(
                    "at most {MAX_ANNOTATIONS} annotations of {MAX_ANNOTATIONS_BYTES} bytes in all, keys of at most {MAX_ANNOTATION_KEY}"
                ),
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
            if host.provider_id.len() > MAX_PROVIDER_ID {
                self.add(
                    format!("hosts[{i}].provider_id"),
                    format!("at most {MAX_PROVIDER_ID} characters"),
                );
            }
            self.addresses(
                &format!("hosts[{i}].addresses"),
                &host.addresses,
                MAX_HOST_ADDRESSES,
            );
            let bytes: usize = host.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
            // Kubernetes' own limits on a label's key and value.
            let oversized = host
                .labels
                .iter()
                .any(|(k, v)| k.len() > MAX_ANNOTATION_KEY || v.len() > 63);
            if host.labels.len() > MAX_HOST_LABELS || bytes > MAX_HOST_LABEL_BYTES || oversized {
                self.add(
                    format!("hosts[{i}].labels"),
                    format!(
                        "at most {MAX_HOST_LABELS} labels of {MAX_HOST_LABEL_BYTES} bytes in all, keys of at most {MAX_ANNOTATION_KEY} and values of at most 63 bytes"
                    ),
                );
            }
            // A label value: the zone label's.
            if host.zone.len() > 63 {
                self.add(format!("hosts[{i}].zone"), "at most 63 bytes".to_owned());
            }
        }
    }

    /// A CIDR; returns it parsed.
    pub fn cidr(&mut self, field: &str, value: &str) -> Option<IpNet> {
        match value.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(_) => {
                self.add(
                    field,
                    format!("{} is not a CIDR such as 10.244.0.0/24", quote(value)),
                );
                None
            }
        }
    }

    /// A route's name hint.
    pub fn name_hint(&mut self, value: &str) {
        if value.len() > MAX_NAME_HINT {
            self.add("name_hint", format!("at most {MAX_NAME_HINT} characters"));
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
        if route.name.len() > MAX_ROUTE_NAME {
            self.add("route.name", format!("at most {MAX_ROUTE_NAME} characters"));
        }
        self.addresses(
            "route.target_node_addresses",
            &route.target_node_addresses,
            MAX_ADDRESSES,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIM: ProviderIds<'static> = ProviderIds {
        name: "sim",
        cloud: None,
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
        assert!(problems(|v| v.cluster_name("Full-Scale.k8s_local")).is_empty());
        assert_eq!(problems(|v| v.cluster_name("has space")), ["cluster_name"]);
        assert_eq!(problems(|v| v.cluster_name("a/b")), ["cluster_name"]);
        assert_eq!(
            problems(|v| v.cluster_name(&"x".repeat(107))),
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

    fn provider() -> ProviderIds<'static> {
        SIM
    }

    #[test]
    fn the_largest_valid_requests_fit_their_limits_closely() {
        use ccm_proto::v1::{EnsureLoadBalancerRequest, GetInstancesRequest};
        use prost::Message;
        let nodes: Vec<NodeRef> = (0..MAX_NODES)
            .map(|i| NodeRef {
                name: format!(
                    "{i:0>63}.{}.{}.{}",
                    "a".repeat(63),
                    "a".repeat(63),
                    "a".repeat(61)
                ),
                provider_id: format!("sim://{}", "1".repeat(MAX_PROVIDER_ID - 6)),
            })
            .collect();
        let mut v = Violations::default();
        v.nodes(&nodes, &provider());
        assert!(v.0.is_empty(), "{:?}", &v.0[..1]);
        let request = GetInstancesRequest {
            cluster_name: "c".repeat(ccm_runtime::names::MAX_CLUSTER_NAME),
            nodes,
            fresh: true,
            purpose: 3,
            queue_drained: true,
        };
        let limit = max_request_bytes("/cloudgateway.v1.Instances/GetInstances").unwrap();
        assert!(request.encoded_len() <= limit);
        assert!(
            request.encoded_len() * 100 >= limit * 99,
            "{} of {limit}",
            request.encoded_len()
        );

        let mut spec = largest_spec_without_annotations();
        spec.service = Some(ServiceRef {
            namespace: "n".repeat(63),
            name: "s".repeat(63),
            uid: "u".repeat(MAX_UID),
        });
        spec.source_ranges =
            vec!["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128".into(); MAX_SOURCE_RANGES];
        spec.load_balancer_ip = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".into();
        for p in &mut spec.ports {
            p.name = "p".repeat(63);
            p.protocol = Protocol::Tcp as i32;
        }
        let per = MAX_ANNOTATIONS_BYTES / MAX_ANNOTATIONS;
        spec.annotations = (0..MAX_ANNOTATIONS)
            .map(|i| (format!("{i:0>8}"), "v".repeat(per - 8)))
            .collect();
        let host = Host {
            name: format!(
                "{}.{}.{}.{}",
                "h".repeat(63),
                "h".repeat(63),
                "h".repeat(63),
                "h".repeat(61)
            ),
            provider_id: "sim://".to_owned() + &"1".repeat(MAX_PROVIDER_ID - 6),
            addresses: vec![
                NodeAddress {
                    r#type: NodeAddressType::Hostname as i32,
                    address: "a".repeat(MAX_NAME),
                };
                MAX_HOST_ADDRESSES
            ],
            labels: (0..MAX_HOST_LABELS)
                .map(|i| {
                    (
                        format!("k{i:02}"),
                        "v".repeat(MAX_HOST_LABEL_BYTES / MAX_HOST_LABELS - 3),
                    )
                })
                .collect(),
            zone: "z".repeat(63),
        };
        let mut v = Violations::default();
        v.spec(Some(&spec));
        v.hosts(std::slice::from_ref(&host));
        assert!(v.0.is_empty(), "{:?}", v.0);
        let request = EnsureLoadBalancerRequest {
            cluster_name: "c".repeat(ccm_runtime::names::MAX_CLUSTER_NAME),
            spec: Some(spec),
            hosts: vec![host; MAX_HOSTS],
        };
        let limit = max_request_bytes("/cloudgateway.v1.LoadBalancers/EnsureLoadBalancer").unwrap();
        assert!(request.encoded_len() <= limit);
        assert!(
            request.encoded_len() * 100 >= limit * 99,
            "{} of {limit}",
            request.encoded_len()
        );
        assert_eq!(max_request_bytes("/grpc.health.v1.Health/Check"), None);
        // A request of the cluster's name alone fits with the longest name
        // (a kops cluster ID, up to 106 characters).
        let request = ccm_proto::v1::ListRoutesRequest {
            cluster_name: "c".repeat(ccm_runtime::names::MAX_CLUSTER_NAME),
        };
        for method in ["Routes/ListRoutes", "LoadBalancers/ListLoadBalancers"] {
            let limit = max_request_bytes(&format!("/cloudgateway.v1.{method}")).unwrap();
            assert!(request.encoded_len() <= limit, "{method}");
        }
    }

    #[test]
    fn errors_name_at_most_twenty_problems_and_never_repeat_a_whole_value() {
        let nodes: Vec<NodeRef> = (0..1000)
            .map(|_| NodeRef {
                name: "N".repeat(1024),
                provider_id: String::new(),
            })
            .collect();
        let mut v = Violations::default();
        v.cluster_name(&"X".repeat(10_000));
        v.nodes(&nodes, &provider());
        let Err(CloudError::InvalidArgument(problems)) = v.finish() else {
            panic!("invalid")
        };
        assert_eq!(problems.len(), 21);
        assert!(problems[20].1.contains("981 more"), "{:?}", problems[20]);
        let size: usize = problems.iter().map(|(f, d)| f.len() + d.len()).sum();
        assert!(size < 4096, "{size} bytes of problems");
    }
}
