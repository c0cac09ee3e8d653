//! The service controller's decisions, pure: which Services are ours, what
//! the gateway is asked for, which nodes back a load balancer, and whether
//! anything changed enough to act.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ccm_proto::v1::{
    Host, Ingress as CloudIngress, IpFamily, LoadBalancerSpec, LoadBalancerStatus as CloudStatus,
    NodeAddress as CloudAddress, NodeAddressType, Protocol, ServicePort, ServiceRef,
    SessionAffinity, TrafficPolicy,
};
use ccm_runtime::names;
use ccm_runtime::view::Interner;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node, PortStatus, Service};
use kube::ResourceExt;
use serde_json::{Value, json};

/// Which `spec.loadBalancerClass` values this controller serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassPolicy {
    /// Serve Services without a class (upstream's only case).
    pub default: bool,
    /// Named classes served as well.
    pub named: Vec<String>,
}

fn spec(svc: &Service) -> Option<&k8s_openapi::api::core::v1::ServiceSpec> {
    svc.spec.as_ref()
}

fn is_type_lb(svc: &Service) -> bool {
    spec(svc).and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Whether `svc` keeps its traffic on the node it arrives at
/// (`externalTrafficPolicy: Local`).
pub fn is_local(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
        == Some("Local")
}

/// Whether `svc` should have a load balancer from us.
pub fn wants_load_balancer(svc: &Service, classes: &ClassPolicy) -> bool {
    is_type_lb(svc)
        && match spec(svc).and_then(|s| s.load_balancer_class.as_deref()) {
            None => classes.default,
            Some(class) => classes.named.iter().any(|c| c == class),
        }
}

/// Whether `svc` carries our finalizer.
pub fn has_finalizer(svc: &Service) -> bool {
    svc.finalizers()
        .iter()
        .any(|f| f == names::FINALIZER_LB_CLEANUP)
}

/// Whether a load balancer of `svc` must go: it has our finalizer and is
/// being deleted or no longer of type LoadBalancer.
pub fn needs_cleanup(svc: &Service) -> bool {
    has_finalizer(svc) && (svc.metadata.deletion_timestamp.is_some() || !is_type_lb(svc))
}

/// What the controller keeps of a Service. Of one that is, or was, ours
/// to serve (type LoadBalancer, or carrying our finalizer): all of it but
/// its managed fields, with the digest of its [`fingerprint`]. Of any other
/// only its UID (its key names it), which the orphan check needs: most
/// Services are not load balancers, and a whole one costs kilobytes, a
/// `k8s_openapi` Service alone 1 KB before any string. A Service that
/// becomes a load balancer arrives whole in the watch event that makes it
/// one. Never write a kept Service back.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceView {
    Ours {
        /// [`fingerprint_digest`] of the Service.
        fingerprint: u64,
        service: Box<Service>,
    },
    Other {
        uid: Box<str>,
    },
}

impl ServiceView {
    pub fn of(svc: &Service) -> Self {
        if is_type_lb(svc) || has_finalizer(svc) {
            let mut service = Box::new(svc.clone());
            service.metadata.managed_fields = None;
            Self::Ours {
                fingerprint: fingerprint_digest(svc),
                service,
            }
        } else {
            Self::Other {
                uid: svc.metadata.uid.as_deref().unwrap_or_default().into(),
            }
        }
    }

    /// The whole Service, if it is one this controller keeps whole.
    pub fn service(&self) -> Option<&Service> {
        match self {
            Self::Ours { service, .. } => Some(service),
            Self::Other { .. } => None,
        }
    }

    pub fn uid(&self) -> &str {
        match self {
            Self::Ours { service, .. } => service.metadata.uid.as_deref().unwrap_or_default(),
            Self::Other { uid } => uid,
        }
    }

    /// The digest of what makes its load balancer change; none for a
    /// Service that is not a load balancer.
    pub fn fingerprint(&self) -> Option<u64> {
        match self {
            Self::Ours { fingerprint, .. } => Some(*fingerprint),
            Self::Other { .. } => None,
        }
    }
}

/// [`fingerprint`] as a digest.
pub fn fingerprint_digest(svc: &Service) -> u64 {
    digest(fingerprint(svc).to_string())
}

/// A 64-bit digest of `value`, for remembering what something was without
/// keeping a copy (stable within the process).
pub fn digest(value: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// What of a Service makes its load balancer change (upstream's
/// `needsUpdate` fields), plus deletion. Two Services with the same
/// fingerprint need no new sync. Our own finalizer is left out: adding it
/// must not cause a second ensure.
pub fn fingerprint(svc: &Service) -> Value {
    let s = spec(svc);
    json!({
        "uid": svc.metadata.uid,
        "deleting": svc.metadata.deletion_timestamp.is_some(),
        "annotations": user_annotations(svc),
        "type": s.and_then(|s| s.type_.clone()),
        "class": s.and_then(|s| s.load_balancer_class.clone()),
        "ports": s.and_then(|s| s.ports.as_ref()).map(|ports| ports.iter().map(|p| json!([
            p.name, p.protocol, p.port, p.node_port, p.target_port, p.app_protocol
        ])).collect::<Vec<_>>()),
        "sourceRanges": s.and_then(|s| s.load_balancer_source_ranges.clone()),
        "affinity": s.and_then(|s| s.session_affinity.clone()),
        "affinityConfig": s.and_then(|s| s.session_affinity_config.as_ref()).map(|c| serde_json::to_value(c).unwrap_or_default()),
        "lbIP": s.and_then(|s| s.load_balancer_ip.clone()),
        "externalIPs": s.and_then(|s| s.external_ips.clone()),
        "eTP": s.and_then(|s| s.external_traffic_policy.clone()),
        "hcnp": s.and_then(|s| s.health_check_node_port),
        "families": s.and_then(|s| s.ip_families.as_ref()).map(Vec::len),
    })
}

/// Parses the exclusion label as Go's `strconv.ParseBool`: unparsable
/// values (including "") exclude, as upstream.
fn excluded(value: &str) -> bool {
    !matches!(value, "false" | "0" | "f" | "F" | "FALSE" | "False")
}

/// Whether `node` backs load balancers: not being deleted, not excluded by
/// label, not being removed by the cluster autoscaler. Readiness does not
/// matter (upstream's stable node set).
pub fn backs_load_balancers(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !node
            .labels()
            .get(names::LABEL_EXCLUDE_FROM_LB)
            .is_some_and(|v| excluded(v))
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == names::TAINT_TO_BE_DELETED))
}

/// A label, its key and value shared among the nodes that have it.
pub type Label = (Arc<str>, Arc<str>);

/// What the service controller keeps of a Node (its cache holds only
/// this): whether it backs load balancers, its provider ID and addresses,
/// and, when the provider selects hosts by label, its labels (a Service may
/// select by any), each string shared with every other node that has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub provider_id: String,
    /// See [`backs_load_balancers`].
    pub backs: bool,
    /// Cordoned (`spec.unschedulable`): being drained, most likely to go
    /// soon. Still a host (as upstream), but the last a subset takes.
    pub draining: bool,
    /// Its zone label; empty without one. Shared with every node of the zone.
    pub zone: Arc<str>,
    /// Still tainted `uninitialized`: its zone is not known yet.
    pub initialising: bool,
    /// A digest of its name, the node's half of each Service's ranking of
    /// the nodes ([`crate::subsets`]).
    pub rank: u64,
    /// Sorted by key.
    pub labels: Box<[Label]>,
    pub addresses: Vec<CloudAddress>,
}

impl NodeView {
    /// What load balancers need of `node`: its labels only with
    /// `labels` (a kubelet's dozen labels cost 400 bytes a Node even
    /// shared); `strings` shares them and the zone.
    pub fn of(node: &Node, strings: &Interner, labels: bool) -> Self {
        let name = node.name_any();
        Self {
            rank: {
                let mut h = Fnv::default();
                h.str(&name);
                h.finish()
            },
            draining: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            zone: strings.intern(
                node.labels()
                    .get(names::LABEL_ZONE)
                    .map(String::as_str)
                    .unwrap_or_default(),
            ),
            initialising: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == names::TAINT_UNINITIALIZED)),
            name,
            provider_id: node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default(),
            backs: backs_load_balancers(node),
            labels: if labels {
                node.labels()
                    .iter()
                    .map(|(k, v)| (strings.intern(k), strings.intern(v)))
                    .collect()
            } else {
                Box::default()
            },
            addresses: node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| {
                    a.iter()
                        .map(|a| CloudAddress {
                            r#type: NodeAddressType::from_kubernetes_name(&a.type_) as i32,
                            address: a.address.clone(),
                        })
                        .filter(|a| a.r#type != NodeAddressType::Unspecified as i32)
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The same view without labels, if it has any.
    pub fn without_labels(&self) -> Option<Self> {
        (!self.labels.is_empty()).then(|| Self {
            labels: Box::default(),
            ..self.clone()
        })
    }

    /// What of a node matters to load balancers' host sets: whether it
    /// backs them, its provider ID and its labels (upstream's change test
    /// and the label selection; addresses are not part of it), and what
    /// subsets choose by: its zone and whether it is draining.
    pub fn hosting(&self) -> (bool, &str, &[Label], &str, bool, bool) {
        (
            self.backs,
            &self.provider_id,
            &self.labels,
            &self.zone,
            self.draining,
            self.initialising,
        )
    }

    /// Whether the node has every label of `selector` (`key` or
    /// `key=value` items, [`host_selector`]).
    pub fn selected_by(&self, selector: &[(String, Option<String>)]) -> bool {
        selector.iter().all(|(key, value)| {
            self.labels
                .iter()
                .any(|(k, v)| **k == **key && value.as_deref().is_none_or(|want| **v == *want))
        })
    }
}

/// The Node label keys that `svc`'s host-selecting `annotations` (the
/// provider's, from GetProviderInfo) name: comma-separated `key` or
/// `key=value` items. The provider validates the values.
pub fn host_label_keys(svc: &Service, annotations: &[String]) -> BTreeSet<String> {
    annotations
        .iter()
        .filter_map(|a| svc.annotations().get(a))
        .flat_map(|v| v.split(','))
        .map(|item| item.split('=').next().unwrap_or_default().trim())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The Node labels `svc`'s host-selecting `annotations` ask for: each
/// comma-separated `key` or `key=value` item of each that it carries. A
/// host must have them all (the provider validates the values).
pub fn host_selector(svc: &Service, annotations: &[String]) -> Vec<(String, Option<String>)> {
    annotations
        .iter()
        .filter_map(|a| svc.annotations().get(a))
        .flat_map(|v| v.split(','))
        .filter_map(|item| {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim().to_owned())),
                None => (item.trim(), None),
            };
            (!key.is_empty()).then(|| (key.to_owned(), value))
        })
        .collect()
}

/// The hosts of a load balancer, sorted by name, each with its labels of
/// `label_keys`.
pub fn hosts<'a>(
    nodes: impl IntoIterator<Item = &'a NodeView>,
    label_keys: &BTreeSet<String>,
) -> Vec<Host> {
    let mut out: Vec<Host> = nodes
        .into_iter()
        .filter(|n| n.backs)
        .map(|n| Host {
            labels: n
                .labels
                .iter()
                .filter(|(k, _)| label_keys.contains(&**k))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            name: n.name.clone(),
            provider_id: n.provider_id.clone(),
            addresses: n.addresses.clone(),
            zone: n.zone.to_string(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// A digest of a host set as upstream's `nodesSufficientlyEqual` compares
/// them (the same names with the same provider IDs; and here the same
/// labels, which are only those the Service selects by; not addresses), or
/// with `addresses` too: two sets with the same digest need no update. A load balancer's last host set is
/// remembered by this digest, not by a copy of up to 100,000 hosts.
pub fn hosts_digest(hosts: &[Host], addresses: bool) -> u64 {
    let mut h = Fnv::default();
    let mut sorted: Vec<&Host> = hosts.iter().collect();
    sorted.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    h.u64(sorted.len() as u64);
    for host in sorted {
        h.str(&host.name);
        h.str(&host.provider_id);
        let mut labels: Vec<_> = host.labels.iter().collect();
        labels.sort_unstable();
        h.u64(labels.len() as u64);
        for (k, v) in labels {
            h.str(k);
            h.str(v);
        }
        if addresses {
            h.u64(host.addresses.len() as u64);
            for a in &host.addresses {
                h.u64(a.r#type as u64);
                h.str(&a.address);
            }
        }
    }
    h.finish()
}

/// FNV-1a over bytes fed explicitly (never through `Hash`, whose output
/// Rust may change between releases): a digest that is the same in every
/// process and every release of this controller.
#[derive(Debug)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub(crate) fn u64(&mut self, n: u64) {
        self.bytes(&n.to_le_bytes());
    }

    /// Length first, so two fields never run into each other.
    pub(crate) fn str(&mut self, s: &str) {
        self.u64(s.len() as u64);
        self.bytes(s.as_bytes());
    }

    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// What an ensure asks for, as a digest every process and release agrees
/// on: the spec's protobuf encoding (which leaves out fields at their
/// defaults, so a field a later release adds changes nothing until it is
/// set), its annotations sorted, and the hosts' [`hosts_digest`] with
/// addresses. The service controller records it on the Service
/// ([`names::ANNOTATION_LB_APPLIED`]).
pub fn applied_fingerprint(spec: &LoadBalancerSpec, hosts_full_digest: u64) -> u64 {
    use prost::Message as _;
    let mut bare = spec.clone();
    let annotations: BTreeMap<String, String> =
        std::mem::take(&mut bare.annotations).into_iter().collect();
    let mut h = Fnv::default();
    let encoded = bare.encode_to_vec();
    h.u64(encoded.len() as u64);
    h.bytes(&encoded);
    h.u64(annotations.len() as u64);
    for (k, v) in &annotations {
        h.str(k);
        h.str(v);
    }
    h.u64(hosts_full_digest);
    h.finish()
}

/// The record of what the Service's load balancer was last made as, if
/// the Service carries one.
pub fn recorded_fingerprint(svc: &Service) -> Option<u64> {
    let value = svc.annotations().get(names::ANNOTATION_LB_APPLIED)?;
    u64::from_str_radix(value, 16).ok()
}

/// [`applied_fingerprint`] as the annotation writes it.
pub fn fingerprint_text(fingerprint: u64) -> String {
    format!("{fingerprint:016x}")
}

/// The Service's annotations but the service controller's own record:
/// what the gateway gets and what a change of makes a sync.
fn user_annotations(svc: &Service) -> BTreeMap<String, String> {
    let mut annotations = svc.annotations().clone();
    annotations.remove(names::ANNOTATION_LB_APPLIED);
    annotations
}

fn protocol(p: Option<&str>) -> Protocol {
    match p.unwrap_or("TCP") {
        "UDP" => Protocol::Udp,
        "SCTP" => Protocol::Sctp,
        "TCP" => Protocol::Tcp,
        _ => Protocol::Unspecified,
    }
}

/// The Service reference the gateway keys load balancers by.
pub fn service_ref(svc: &Service) -> ServiceRef {
    ServiceRef {
        namespace: svc.namespace().unwrap_or_default(),
        name: svc.name_any(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
    }
}

/// What the gateway needs to know of `svc`. Source ranges come from the
/// spec field, else the annotation; the gateway validates them.
pub fn lb_spec(svc: &Service) -> LoadBalancerSpec {
    let s = spec(svc).cloned().unwrap_or_default();
    let annotations = user_annotations(svc);
    let source_ranges = match s
        .load_balancer_source_ranges
        .clone()
        .filter(|r| !r.is_empty())
    {
        Some(ranges) => ranges,
        None => annotations
            .get(names::ANNOTATION_LB_SOURCE_RANGES)
            .map(|v| {
                v.split(',')
                    .map(|r| r.trim().to_owned())
                    .filter(|r| !r.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
    };
    LoadBalancerSpec {
        service: Some(service_ref(svc)),
        ports: s
            .ports
            .unwrap_or_default()
            .iter()
            .map(|p| ServicePort {
                name: p.name.clone().unwrap_or_default(),
                protocol: protocol(p.protocol.as_deref()) as i32,
                port: p.port,
                node_port: p.node_port.unwrap_or_default(),
            })
            .collect(),
        load_balancer_class: s.load_balancer_class.unwrap_or_default(),
        load_balancer_ip: s.load_balancer_ip.unwrap_or_default(),
        source_ranges,
        ip_families: s
            .ip_families
            .unwrap_or_default()
            .iter()
            .map(|f| match f.as_str() {
                "IPv6" => IpFamily::Ipv6,
                _ => IpFamily::Ipv4,
            } as i32)
            .collect(),
        external_traffic_policy: match s.external_traffic_policy.as_deref() {
            Some("Local") => TrafficPolicy::Local,
            _ => TrafficPolicy::Cluster,
        } as i32,
        health_check_node_port: s.health_check_node_port.unwrap_or_default(),
        session_affinity: match s.session_affinity.as_deref() {
            Some("ClientIP") => SessionAffinity::ClientIp,
            _ => SessionAffinity::None,
        } as i32,
        annotations: annotations.into_iter().collect(),
    }
}

/// The gateway's status as Kubernetes writes it.
pub fn ingress(status: &CloudStatus) -> Vec<LoadBalancerIngress> {
    status
        .ingress
        .iter()
        .map(|i: &CloudIngress| LoadBalancerIngress {
            ip: (!i.ip.is_empty()).then(|| i.ip.clone()),
            hostname: (!i.hostname.is_empty()).then(|| i.hostname.clone()),
            ip_mode: (!i.ip_mode.is_empty() && !i.ip.is_empty()).then(|| i.ip_mode.clone()),
            ports: (!i.ports.is_empty()).then(|| {
                i.ports
                    .iter()
                    .map(|p| PortStatus {
                        port: p.port,
                        protocol: match Protocol::try_from(p.protocol).unwrap_or(Protocol::Tcp) {
                            Protocol::Udp => "UDP",
                            Protocol::Sctp => "SCTP",
                            _ => "TCP",
                        }
                        .into(),
                        error: (!p.error.is_empty()).then(|| p.error.clone()),
                    })
                    .collect()
            }),
        })
        .collect()
}

/// The Service's current ingress.
pub fn current_ingress(svc: &Service) -> Vec<LoadBalancerIngress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
}

/// The condition type this controller writes on Services.
pub const CONDITION: &str = names::CONDITION_LB_SYNCED;

/// The Service's `LoadBalancerSynced` condition: `(status, reason)`.
pub fn current_condition(svc: &Service) -> Option<(String, String)> {
    let c = svc
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION)?;
    Some((c.status.clone(), c.reason.clone()))
}

/// A message naming every invalid field, for events and the condition.
pub fn describe_violations(violations: &[ccm_proto::FieldViolation]) -> String {
    let parts: BTreeMap<&str, &str> = violations
        .iter()
        .map(|v| (v.field.as_str(), v.description.as_str()))
        .collect();
    parts
        .iter()
        .map(|(f, d)| format!("{f}: {d}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The longest note an Event carries (events.k8s.io/v1).
const MAX_NOTE: usize = 1024;

/// One Event note for what the gateway said has no effect: each on its
/// own line (events of one reason on one Service are one series, so one
/// note holds them all); past an Event's limit, only what each names
/// (the text before its first `:`).
pub fn no_effect_note(notes: &[String]) -> String {
    let whole = notes.join("\n");
    if whole.len() <= MAX_NOTE {
        return whole;
    }
    let mut short = notes
        .iter()
        .map(|n| n.split(':').next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    if short.len() > MAX_NOTE {
        let mut end = MAX_NOTE;
        while !short.is_char_boundary(end) {
            end -= 1;
        }
        short.truncate(end);
    }
    short
}

#[cfg(test)]
mod tests {
    use kube_test_apiserver::fixtures::{load_balancer, node};

    use super::*;

    fn classes() -> ClassPolicy {
        ClassPolicy {
            default: true,
            named: vec!["sim/internal".into()],
        }
    }

    #[test]
    fn only_load_balancers_of_served_classes_are_ours() {
        assert!(wants_load_balancer(
            &load_balancer("d", "a").build(),
            &classes()
        ));
        assert!(wants_load_balancer(
            &load_balancer("d", "a").class("sim/internal").build(),
            &classes()
        ));
        assert!(!wants_load_balancer(
            &load_balancer("d", "a").class("other").build(),
            &classes()
        ));
        let upstream = ClassPolicy {
            default: true,
            named: vec![],
        };
        assert!(!wants_load_balancer(
            &load_balancer("d", "a").class("sim/internal").build(),
            &upstream
        ));
        let mut cluster_ip = load_balancer("d", "a").build();
        cluster_ip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(!wants_load_balancer(&cluster_ip, &classes()));
    }

    #[test]
    fn cleanup_needs_the_finalizer_and_deletion_or_a_type_change() {
        let mut svc = load_balancer("d", "a").build();
        assert!(!needs_cleanup(&svc));
        svc.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        assert!(!needs_cleanup(&svc));
        svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(needs_cleanup(&svc));
        let mut deleting = load_balancer("d", "a").build();
        deleting.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert!(needs_cleanup(&deleting));
    }

    #[test]
    fn fingerprints_change_on_what_matters_only() {
        let svc = load_balancer("d", "a").build();
        let base = fingerprint(&svc);
        let mut labelled = svc.clone();
        labelled.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
        assert_eq!(fingerprint(&labelled), base, "labels do not matter");
        let mut status = svc.clone();
        status.status = Some(Default::default());
        assert_eq!(fingerprint(&status), base, "status does not matter");
        let annotated = load_balancer("d", "a").annotation("k", "v").build();
        assert_ne!(fingerprint(&annotated), base, "any annotation matters");
        let mut ports = svc.clone();
        ports.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 443;
        assert_ne!(fingerprint(&ports), base);
        assert_eq!(fingerprint_digest(&labelled), fingerprint_digest(&svc));
        assert_ne!(fingerprint_digest(&ports), fingerprint_digest(&svc));
    }

    #[test]
    fn the_cache_keeps_load_balancers_whole_and_of_other_services_their_uid() {
        let mut lb = load_balancer("d", "a").annotation("k", "v").build();
        let kept = ServiceView::of(&lb);
        lb.metadata.managed_fields = None;
        assert_eq!(kept.service(), Some(&lb), "a load balancer is kept whole");
        assert_eq!(kept.fingerprint(), Some(fingerprint_digest(&lb)));

        let mut cluster_ip = load_balancer("d", "b").annotation("k", "v").build();
        let spec = cluster_ip.spec.as_mut().unwrap();
        spec.type_ = Some("ClusterIP".into());
        spec.load_balancer_class = Some("example.com/x".into());
        cluster_ip.metadata.uid = Some("u-1".into());
        let other = ServiceView::of(&cluster_ip);
        assert_eq!(other.service(), None);
        assert_eq!(other.uid(), "u-1", "the orphan check needs it");
        assert!(std::mem::size_of::<ServiceView>() <= 24, "a small enum");

        // One that was ours until its type changed keeps everything, so
        // its load balancer can be deleted and the finalizer released.
        let mut leaving = cluster_ip.clone();
        leaving.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        let kept = ServiceView::of(&leaving);
        assert_eq!(kept.service(), Some(&leaving));
        assert!(needs_cleanup(kept.service().unwrap()));
    }

    #[test]
    fn the_exclusion_label_parses_like_go() {
        let label = |v: &str| node("n").label(names::LABEL_EXCLUDE_FROM_LB, v).build();
        for (value, backs) in [
            ("false", true),
            ("0", true),
            ("False", true),
            ("true", false),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(backs_load_balancers(&label(value)), backs, "{value:?}");
        }
        assert!(
            backs_load_balancers(&node("n").not_ready().build()),
            "readiness does not matter"
        );
        assert!(!backs_load_balancers(
            &node("n")
                .taint(names::TAINT_TO_BE_DELETED, None, "NoSchedule")
                .build()
        ));
    }

    fn hosts_equal(a: &[Host], b: &[Host]) -> bool {
        hosts_digest(a, false) == hosts_digest(b, false)
    }

    fn hosts(nodes: &[Node], keys: &BTreeSet<String>) -> Vec<Host> {
        let strings = Interner::default();
        let views: Vec<NodeView> = nodes
            .iter()
            .map(|n| NodeView::of(n, &strings, true))
            .collect();
        super::hosts(&views, keys)
    }

    #[test]
    fn host_sets_compare_names_and_provider_ids() {
        let none = BTreeSet::new();
        let a = hosts(
            &[node("a").provider_id("sim://1").build(), node("b").build()],
            &none,
        );
        let b = hosts(
            &[node("b").build(), node("a").provider_id("sim://1").build()],
            &none,
        );
        assert!(hosts_equal(&a, &b));
        let c = hosts(
            &[node("a").provider_id("sim://2").build(), node("b").build()],
            &none,
        );
        assert!(!hosts_equal(&a, &c));
        assert!(!hosts_equal(&a, &a[..1]));
        // A new address is no host change, but an ensure carries it.
        let moved = hosts(
            &[
                node("a")
                    .provider_id("sim://1")
                    .address("InternalIP", "10.0.0.9")
                    .build(),
                node("b").build(),
            ],
            &none,
        );
        assert!(hosts_equal(&a, &moved));
        assert_ne!(hosts_digest(&a, true), hosts_digest(&moved, true));
    }

    #[test]
    fn hosts_carry_only_the_labels_the_service_selects_by() {
        let annotation = "example.com/target-node-labels".to_owned();
        let svc = load_balancer("d", "web")
            .annotation(&annotation, "lb, zone=a")
            .build();
        let keys = host_label_keys(&svc, std::slice::from_ref(&annotation));
        assert_eq!(keys, BTreeSet::from(["lb".to_owned(), "zone".to_owned()]));
        assert!(host_label_keys(&load_balancer("d", "x").build(), &[annotation]).is_empty());
        let labelled = |zone: &str| {
            node("a")
                .label("zone", zone)
                .label("kubernetes.io/os", "linux")
                .build()
        };
        let a = hosts(&[labelled("a")], &keys);
        assert_eq!(a[0].labels.len(), 1, "{:?}", a[0].labels);
        assert_eq!(a[0].labels["zone"], "a");
        // A selected label that changes is a host change; others are not.
        assert!(!hosts_equal(&a, &hosts(&[labelled("b")], &keys)));
        assert!(hosts_equal(
            &hosts(&[labelled("a")], &BTreeSet::new()),
            &hosts(&[labelled("b")], &BTreeSet::new())
        ));
    }

    #[test]
    fn the_spec_carries_what_providers_need() {
        let svc = load_balancer("d", "web")
            .annotation(
                names::ANNOTATION_LB_SOURCE_RANGES,
                "10.0.0.0/8, 192.168.0.0/16",
            )
            .build();
        let spec = lb_spec(&svc);
        assert_eq!(spec.ports[0].port, 80);
        assert_eq!(spec.ports[0].protocol, Protocol::Tcp as i32);
        assert_eq!(spec.source_ranges, ["10.0.0.0/8", "192.168.0.0/16"]);
        assert_eq!(spec.service.unwrap().name, "web");
    }

    #[test]
    fn what_has_no_effect_fits_one_event_note() {
        let notes = vec![
            "a has no effect: why".to_owned(),
            "b has no effect: why".to_owned(),
        ];
        assert_eq!(
            no_effect_note(&notes),
            "a has no effect: why\nb has no effect: why"
        );
        let long: Vec<String> = (0..40)
            .map(|i| format!("key-{i} has no effect: {}", "because ".repeat(10)))
            .collect();
        let note = no_effect_note(&long);
        assert!(note.len() <= MAX_NOTE, "{}", note.len());
        assert!(
            note.starts_with("key-0 has no effect\nkey-1 has no effect"),
            "{note}"
        );
    }
}
