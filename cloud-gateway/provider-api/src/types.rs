//! What crosses the provider traits: plain Rust values, already checked by
//! the gateway. A reference that the contract requires is there (no
//! `Option` to unwrap), and every enum holds only values a provider can
//! act on.

use std::collections::HashMap;

/// The kind of a node address (Kubernetes `NodeAddressType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressType {
    /// The node's hostname.
    Hostname,
    /// An address inside the cluster's network.
    InternalIp,
    /// An address reachable from outside.
    ExternalIp,
    /// A DNS name inside the cluster's network.
    InternalDns,
    /// A DNS name reachable from outside.
    ExternalDns,
}

impl AddressType {
    /// Every kind, in the contract's order.
    pub const ALL: [AddressType; 5] = [
        Self::Hostname,
        Self::InternalIp,
        Self::ExternalIp,
        Self::InternalDns,
        Self::ExternalDns,
    ];

    /// The name Kubernetes gives it (`InternalIP`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hostname => "Hostname",
            Self::InternalIp => "InternalIP",
            Self::ExternalIp => "ExternalIP",
            Self::InternalDns => "InternalDNS",
            Self::ExternalDns => "ExternalDNS",
        }
    }
}

/// One address of a node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeAddress {
    /// What kind of address it is.
    pub kind: AddressType,
    /// The address or name.
    pub address: String,
}

impl NodeAddress {
    /// An address of `kind`.
    pub fn new(kind: AddressType, address: impl Into<String>) -> Self {
        Self {
            kind,
            address: address.into(),
        }
    }
}

/// A node to look up: by provider ID when it has one, else by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeRef {
    /// The Node's name.
    pub name: String,
    /// The Node's `spec.providerID`; empty before initialisation.
    pub provider_id: String,
}

/// What the cloud knows of an instance.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    /// `<provider>://...`, the Node's `spec.providerID`.
    pub provider_id: String,
    /// The instance type (`node.kubernetes.io/instance-type`).
    pub instance_type: String,
    /// The zone (`topology.kubernetes.io/zone`).
    pub zone: String,
    /// The region (`topology.kubernetes.io/region`).
    pub region: String,
    /// The node's addresses, as the cloud reports them.
    pub addresses: Vec<NodeAddress>,
    /// Labels the provider adds to the Node.
    pub additional_labels: HashMap<String, String>,
}

/// What became of one node's instance when tagged or untagged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TagOutcome {
    /// The instance has the tags (or, removing, no longer has them).
    Done,
    /// The cloud confirmed there is no such instance.
    NotFound,
    /// The node is no instance that can carry tags.
    NotTaggable,
}

/// What the cloud says about one looked-up node.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// The instance exists and runs.
    Running(Instance),
    /// The instance exists but is shut down.
    Shutdown(Instance),
    /// The cloud confirmed there is no such instance.
    NotFound,
}

/// The Service a load balancer is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The Service's UID, from which the load balancer's name is derived.
    pub uid: String,
}

/// A port's transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// The name Kubernetes gives it (`TCP`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServicePort {
    /// The port's name; may be empty for a single port.
    pub name: String,
    /// Its protocol.
    pub protocol: Protocol,
    /// The port the load balancer listens on.
    pub port: i32,
    /// The node port traffic goes to.
    pub node_port: i32,
}

/// An IP family a Service asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// A Service's `externalTrafficPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrafficPolicy {
    /// Any node forwards (the default).
    #[default]
    Cluster,
    /// Only nodes with a ready endpoint serve; health checked on
    /// `health_check_node_port`.
    Local,
}

/// A Service's `sessionAffinity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SessionAffinity {
    /// None (the default).
    #[default]
    None,
    /// By client IP.
    ClientIp,
}

/// Everything about a Service that its load balancer depends on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadBalancerSpec {
    /// The Service.
    pub service: ServiceRef,
    /// Its ports, at least one.
    pub ports: Vec<ServicePort>,
    /// `spec.loadBalancerClass`; empty for none.
    pub load_balancer_class: String,
    /// `spec.loadBalancerIP`; empty for none.
    pub load_balancer_ip: String,
    /// `spec.loadBalancerSourceRanges`, as CIDRs.
    pub source_ranges: Vec<String>,
    /// `spec.ipFamilies`, in order; empty when the Service names none.
    pub ip_families: Vec<IpFamily>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`; 0 for none.
    pub health_check_node_port: i32,
    /// `spec.sessionAffinity`.
    pub session_affinity: SessionAffinity,
    /// The Service's annotations.
    pub annotations: HashMap<String, String>,
}

/// A node behind a load balancer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Host {
    /// The Node's name.
    pub name: String,
    /// The Node's provider ID.
    pub provider_id: String,
    /// The Node's addresses.
    pub addresses: Vec<NodeAddress>,
    /// The Node's labels that the Service's annotations select by (see
    /// `LoadBalancers::host_label_annotations`); empty otherwise.
    pub labels: HashMap<String, String>,
    /// The Node's zone label; empty when it has none.
    pub zone: String,
}

/// One port's state on a load balancer ingress point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortStatus {
    /// The port.
    pub port: i32,
    /// Its protocol.
    pub protocol: Protocol,
    /// A problem with it, empty when none.
    pub error: String,
}

/// One ingress point of a load balancer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ingress {
    /// An IP address, or empty.
    pub ip: String,
    /// A DNS name, or empty.
    pub hostname: String,
    /// `VIP` or `Proxy`, or empty.
    pub ip_mode: String,
    /// Per-port state, when the cloud reports it.
    pub ports: Vec<PortStatus>,
}

/// A load balancer's status; no ingress while it is being provisioned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadBalancerStatus {
    /// Where traffic reaches it.
    pub ingress: Vec<Ingress>,
    /// Set by the ensure that took over a load balancer another controller
    /// made (e.g. the cloud's own controller manager): what it was and
    /// what changed, for the Service's events. `None` otherwise.
    pub adopted: Option<String>,
    /// What the Service asks that changes nothing on its load balancer
    /// (an annotation the provider accepts and ignores there, as the
    /// cloud's own controller does), each with why and what would: for
    /// Normal events.
    pub no_effect: Vec<String>,
}

/// A load balancer as listed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadBalancer {
    /// Its name in the cloud.
    pub name: String,
    /// The Service it serves, as its tags say.
    pub service: ServiceRef,
    /// Its status.
    pub status: LoadBalancerStatus,
    /// The names of the nodes behind it, where the provider reports them.
    pub hosts: Vec<String>,
}

/// A cloud route sending a pod CIDR to its node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// The route's name in the cloud (from the name hint at creation).
    pub name: String,
    /// The Node's name.
    pub target_node: String,
    /// The Node's addresses, for clouds that route to an address.
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR.
    pub destination_cidr: String,
    /// The route's target is gone: it drops traffic.
    pub blackhole: bool,
    /// Whether `target_node_addresses` were given.
    pub enable_node_addresses: bool,
    /// The Node's provider ID, when known.
    pub target_provider_id: String,
}

/// The load balancer name upstream derives from a Service UID: "a" and the
/// UID without dashes, cut to 32 characters. Two Services whose UIDs
/// share their first 31 hex digits share it: see [`load_balancer_names`].
pub fn load_balancer_name(service_uid: &str) -> String {
    let mut name: String = std::iter::once('a')
        .chain(service_uid.chars().filter(|c| *c != '-'))
        .collect();
    name.truncate(32);
    name
}

/// The name a Service's load balancer gets when upstream's
/// ([`load_balancer_name`]) is held by another Service's: upstream's cut
/// to 23 characters, `-`, and 8 hex digits of the FNV-1a hash of the
/// whole UID (32 characters, as a cloud's name limit allows). Never change
/// it: it is how such a load balancer is found again.
pub fn own_load_balancer_name(service_uid: &str) -> String {
    let mut name = load_balancer_name(service_uid);
    name.truncate(23);
    // FNV-1a, 64 bits, folded to 32: stable across releases and platforms.
    let hash = service_uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{name}-{:08x}", (hash ^ (hash >> 32)) as u32)
}

/// The names a Service's load balancer may have, in the order a provider
/// tries them: upstream's first (so one cloud-provider-aws made is found
/// in place), then [`own_load_balancer_name`], used only while upstream's
/// is held by another Service's load balancer. A provider finds a
/// Service's load balancer under either name, by its tags, and never
/// takes one whose tags name another Service.
pub fn load_balancer_names(service_uid: &str) -> [String; 2] {
    [
        load_balancer_name(service_uid),
        own_load_balancer_name(service_uid),
    ]
}

impl LoadBalancer {
    /// Whether this load balancer is `service`'s: its UID, or, for one
    /// listed without a UID (cloud-provider-aws made it and no ensure of
    /// ours tagged it yet), the Service's namespace and name under the
    /// name upstream gives the Service's load balancer.
    pub fn serves(&self, service: &ServiceRef) -> bool {
        if !self.service.uid.is_empty() {
            return self.service.uid == service.uid;
        }
        self.service.namespace == service.namespace
            && self.service.name == service.name
            && self.name == load_balancer_name(&service.uid)
    }
}
