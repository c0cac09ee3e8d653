//! The node controller's decisions, as pure functions on plain data: what
//! initialising a node changes, which addresses a node should have, which
//! labels need reconciling, and what the lifecycle pass does with a node.
//! No I/O here; `reconcile` reads state, calls these, and writes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ccm_proto::v1::{Instance, NodeAddressType};
use std::sync::Arc;

use ccm_runtime::names;
use ccm_runtime::view::Interner;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};

/// A taint's key and effect, or a label's key and value, shared among the
/// nodes that have it.
pub type Pair = (Arc<str>, Arc<str>);

/// What the node controller keeps of a Node (its cache holds only this)
/// and its decisions read: its identity, provider ID, labels, the
/// kubelet's `--node-ip`, taints, addresses and readiness.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub uid: String,
    pub provider_id: String,
    /// Sorted by key.
    pub labels: Box<[Pair]>,
    /// `alpha.kubernetes.io/provided-node-ip`, the kubelet's `--node-ip`.
    pub provided_node_ip: Option<String>,
    /// Each taint's key and effect.
    pub taints: Box<[Pair]>,
    pub addresses: Vec<NodeAddress>,
    pub readiness: Readiness,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
    /// The resourceVersion this view was made from, when it is a number
    /// (0 otherwise): the precondition of a write planned on the view.
    pub resource_version: u64,
}

impl NodeView {
    /// What the node controller needs of `node`, its shared strings from
    /// `strings`.
    pub fn of(node: &Node, strings: &Interner) -> Self {
        let spec = node.spec.as_ref();
        let status = node.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            provider_id: spec.and_then(|s| s.provider_id.clone()).unwrap_or_default(),
            labels: node
                .metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (strings.intern(k), strings.intern(v)))
                .collect(),
            provided_node_ip: node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_PROVIDED_NODE_IP))
                .cloned(),
            taints: spec
                .and_then(|s| s.taints.as_ref())
                .iter()
                .flat_map(|t| t.iter())
                .map(|t| (strings.intern(&t.key), strings.intern(&t.effect)))
                .collect(),
            addresses: status.and_then(|s| s.addresses.clone()).unwrap_or_default(),
            readiness: match ready.map(|c| c.status.as_str()) {
                Some("True") => Readiness::Ready,
                Some("False") => Readiness::NotReady,
                _ => Readiness::Unknown,
            },
            created: node.metadata.creation_timestamp.as_ref().map(|t| t.0),
            resource_version: node
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.labels[i].1)
    }

    /// A reference to the Node, for its events.
    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        ccm_runtime::view::node_reference(&self.name, &self.uid)
    }
}

/// Whether the node still waits for initialisation.
pub fn is_uninitialized(node: &NodeView) -> bool {
    node.taints
        .iter()
        .any(|(key, _)| &**key == names::TAINT_UNINITIALIZED)
}

/// The cloud's addresses as Kubernetes writes them.
pub fn cloud_addresses(instance: &Instance) -> Vec<NodeAddress> {
    instance
        .addresses
        .iter()
        .filter(|a| !NodeAddressType::kubernetes_name_of(a.r#type).is_empty())
        .map(|a| NodeAddress {
            type_: NodeAddressType::kubernetes_name_of(a.r#type).into(),
            address: a.address.clone(),
        })
        .collect()
}

/// Parses `alpha.kubernetes.io/provided-node-ip`: one IP, or an IPv4 and an
/// IPv6 separated by a comma; strictly, with no trimming.
pub fn parse_node_ips(annotation: &str) -> Result<Vec<IpAddr>, String> {
    let parts: Vec<&str> = annotation.split(',').collect();
    let ips = parts
        .iter()
        .map(|p| {
            p.parse::<IpAddr>()
                .map_err(|_| format!("{p:?} is not an IP address"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] => {
            if a.is_ipv4() == b.is_ipv4() {
                Err(format!(
                    "{annotation:?} must be one IPv4 and one IPv6 address"
                ))
            } else if a.is_unspecified() || b.is_unspecified() {
                Err(format!(
                    "{annotation:?}: an unspecified address is not allowed in a pair"
                ))
            } else {
                Ok(ips)
            }
        }
        _ => Err(format!("{annotation:?} has more than two addresses")),
    }
}

/// Orders and filters the cloud's addresses by the node IPs: addresses
/// matching a node IP first (in node IP order), other addresses of a
/// matched kind dropped, other kinds kept.
pub fn filter_by_node_ips(
    node_ips: &[IpAddr],
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, String> {
    let mut out = Vec::new();
    let mut claimed: Vec<&str> = Vec::new();
    for ip in node_ips {
        let matching: Vec<&NodeAddress> = cloud
            .iter()
            .filter(|a| a.address.parse::<IpAddr>().ok() == Some(*ip))
            .collect();
        if matching.is_empty() {
            return Err(format!(
                "failed to get node address from cloud provider that matches ip: {ip}"
            ));
        }
        for a in matching {
            claimed.push(&a.type_);
            out.push(a.clone());
        }
    }
    out.extend(
        cloud
            .iter()
            .filter(|a| !claimed.contains(&a.type_.as_str()))
            .cloned(),
    );
    Ok(out)
}

/// Upstream's change test: a different length, or a (kind, address) pair
/// that differs from the last old address of that kind.
pub fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old.len() != new.len() {
        return true;
    }
    let by_kind: BTreeMap<&str, &str> = old
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| by_kind.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

/// The addresses `node` should have given the cloud's, or `None` when
/// nothing should be written (no cloud addresses, or no change).
pub fn desired_addresses(
    node: &NodeView,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, String> {
    if cloud.is_empty() {
        return Ok(None);
    }
    let current = &node.addresses;
    let mut wanted = cloud.to_vec();
    if !wanted.iter().any(|a| a.type_ == "Hostname") {
        wanted.extend(current.iter().filter(|a| a.type_ == "Hostname").cloned());
    }
    if let Some(node_ip) = &node.provided_node_ip {
        let ips = parse_node_ips(node_ip)?;
        wanted = filter_by_node_ips(&ips, &wanted)?;
    }
    Ok(addresses_changed(current, &wanted).then_some(wanted))
}

/// Keys provider labels may not use: the Kubernetes namespaces.
fn reserved_label(key: &str) -> bool {
    let prefix = key.split_once('/').map(|(p, _)| p).unwrap_or_default();
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")))
}

/// What initialising a node changes in its spec and metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Init {
    /// The provider ID to set (only when the node has none).
    pub provider_id: Option<String>,
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
    /// Provider labels dropped because they are in a Kubernetes namespace.
    pub discarded_labels: Vec<String>,
    /// Addresses to write to status, if they change.
    pub addresses: Option<Vec<NodeAddress>>,
}

/// Plans the initialisation of `node` from the cloud's `instance`. Errors
/// keep the node tainted (and are retried).
pub fn initialize(node: &NodeView, instance: &Instance) -> Result<Init, String> {
    let mut init = Init::default();
    if instance.provider_id.is_empty() && node.provider_id.is_empty() {
        return Err(format!(
            "cloud provider does not set node provider ID for node {}",
            node.name
        ));
    }
    if node.provider_id.is_empty() {
        init.provider_id = Some(instance.provider_id.clone());
    }
    init.addresses = desired_addresses(node, &cloud_addresses(instance)).map_err(|e| {
        format!(
            "provided node ip for node {:?} is not valid: {e}",
            node.name
        )
    })?;
    let pairs = [
        (
            &instance.instance_type,
            names::LABEL_INSTANCE_TYPE_BETA,
            names::LABEL_INSTANCE_TYPE,
        ),
        (&instance.zone, names::LABEL_ZONE_BETA, names::LABEL_ZONE),
        (
            &instance.region,
            names::LABEL_REGION_BETA,
            names::LABEL_REGION,
        ),
    ];
    for (value, beta, ga) in pairs {
        if !value.is_empty() {
            init.labels.insert(beta.into(), value.clone());
            init.labels.insert(ga.into(), value.clone());
        }
    }
    let mut extra: Vec<_> = instance.additional_labels.iter().collect();
    extra.sort();
    for (key, value) in extra {
        if reserved_label(key) {
            init.discarded_labels.push(key.clone());
        } else if node.label(key).is_none() && !init.labels.contains_key(key) {
            init.labels.insert(key.clone(), value.clone());
        }
    }
    Ok(init)
}

/// Applies `init` to a node: provider ID, labels, and the removal of every
/// uninitialized taint.
pub fn apply_init(node: &mut Node, init: &Init) {
    let spec = node.spec.get_or_insert_with(Default::default);
    if let Some(id) = &init.provider_id
        && spec.provider_id.as_deref().unwrap_or_default().is_empty()
    {
        spec.provider_id = Some(id.clone());
    }
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != names::TAINT_UNINITIALIZED);
    }
    let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in &init.labels {
        labels.insert(k.clone(), v.clone());
    }
}

/// The initialisation `init` as one JSON patch (RFC 6902) of the Node that
/// `node` was made from: it first tests the view's resourceVersion, so it
/// applies to that Node only and does to it what [`apply_init`] does. `None`
/// when the view's resourceVersion is not known.
pub fn init_patch(node: &NodeView, init: &Init) -> Option<serde_json::Value> {
    if node.resource_version == 0 {
        return None;
    }
    let mut ops = vec![serde_json::json!({
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": node.resource_version.to_string(),
    })];
    // The last first, so the indices before it still hold.
    for (i, (key, _)) in node.taints.iter().enumerate().rev() {
        if &**key == names::TAINT_UNINITIALIZED {
            ops.push(serde_json::json!({"op": "remove", "path": format!("/spec/taints/{i}")}));
        }
    }
    if let Some(id) = init
        .provider_id
        .as_ref()
        .filter(|_| node.provider_id.is_empty())
    {
        ops.push(serde_json::json!({"op": "add", "path": "/spec/providerID", "value": id}));
    }
    if node.labels.is_empty() {
        if !init.labels.is_empty() {
            ops.push(
                serde_json::json!({"op": "add", "path": "/metadata/labels", "value": init.labels}),
            );
        }
    } else {
        for (key, value) in &init.labels {
            // A JSON pointer writes `~` as `~0` and `/` as `~1`.
            let key = key.replace('~', "~0").replace('/', "~1");
            ops.push(serde_json::json!({"op": "add", "path": format!("/metadata/labels/{key}"), "value": value}));
        }
    }
    Some(serde_json::Value::Array(ops))
}

/// Labels to set on an initialised node so each GA topology label follows
/// its beta label (upstream's reconciliation; a node with only GA labels is
/// left alone).
pub fn reconcile_labels(node: &NodeView) -> BTreeMap<String, String> {
    let pairs = [
        (names::LABEL_ZONE_BETA, names::LABEL_ZONE),
        (names::LABEL_REGION_BETA, names::LABEL_REGION),
        (names::LABEL_INSTANCE_TYPE_BETA, names::LABEL_INSTANCE_TYPE),
    ];
    pairs
        .into_iter()
        .filter_map(|(beta, ga)| {
            let value = node.label(beta)?;
            (node.label(ga) != Some(value)).then(|| (ga.to_owned(), value.to_owned()))
        })
        .collect()
}

/// The `Ready` condition of a node, `Unknown` when absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady,
    Unknown,
}

/// Whether the node carries the shutdown taint.
pub fn has_shutdown_taint(node: &NodeView) -> bool {
    node.taints
        .iter()
        .any(|(key, effect)| &**key == names::TAINT_SHUTDOWN && &**effect == "NoSchedule")
}

/// What the lifecycle pass does with a node, before asking the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Triage {
    /// Ready and untainted: nothing, and no cloud call.
    Healthy,
    /// Ready again: remove the shutdown taint.
    RemoveShutdownTaint,
    /// Not ready: ask the cloud whether the instance exists or is shut down.
    AskCloud,
}

pub fn triage(node: &NodeView) -> Triage {
    match (node.readiness, has_shutdown_taint(node)) {
        (Readiness::Ready, true) => Triage::RemoveShutdownTaint,
        (Readiness::Ready, false) => Triage::Healthy,
        _ => Triage::AskCloud,
    }
}

/// What the cloud's answer means for a not-ready node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The instance is gone (a fresh, confirmed answer): delete the Node.
    Delete,
    /// The instance is shut down: taint the node, if not yet.
    TaintShutdown,
    /// Running, or the answer was not fresh: do nothing.
    Keep,
}

/// Decides from a lookup. A "not found" from the cache never deletes: the
/// caller must ask again with a fresh read.
pub fn verdict(node: &NodeView, state: ccm_proto::v1::InstanceState, cached: bool) -> Verdict {
    use ccm_proto::v1::InstanceState;
    match state {
        InstanceState::NotFound if !cached => Verdict::Delete,
        InstanceState::Shutdown if !has_shutdown_taint(node) => Verdict::TaintShutdown,
        _ => Verdict::Keep,
    }
}

/// Whether deleting `candidates` of `total` nodes in one pass is too many
/// to trust: more than `max_share` of the cluster, when it has at least
/// `min_nodes` nodes. A cloud outage or a bad credential can make every
/// instance look gone; deleting the whole cluster's Nodes is never right.
pub fn hold_deletions(candidates: usize, total: usize, max_share: f64, min_nodes: usize) -> bool {
    total >= min_nodes && candidates as f64 > max_share * total as f64
}

/// The shutdown taint to add.
pub fn shutdown_taint() -> Taint {
    Taint {
        key: names::TAINT_SHUTDOWN.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    }
}

/// Whether a Node's instance is still to be tagged: it has a provider ID,
/// its tagging label is not `checksum`, and it was not found untaggable
/// under this provider ID (`settled`).
pub fn needs_tags(
    provider_id: &str,
    label: Option<&str>,
    checksum: &str,
    settled: Option<&String>,
) -> bool {
    !provider_id.is_empty()
        && label.is_none_or(|l| l != checksum)
        && settled.is_none_or(|s| s != provider_id)
}

/// The text upstream's tagging checksum is taken of: the `key=value`
/// strings sorted (not the keys: `a.b=2` comes before `a=1`), joined by
/// commas.
pub fn tags_text(tags: &BTreeMap<String, String>) -> String {
    let mut pairs: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(",")
}

/// How a node is named to the gateway.
pub fn node_ref(node: &NodeView) -> ccm_proto::v1::NodeRef {
    ccm_proto::v1::NodeRef {
        name: node.name.clone(),
        provider_id: node.provider_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use ccm_proto::v1::{InstanceState, NodeAddress as CloudAddress};
    use kube_test_apiserver::fixtures::node;

    use super::*;

    // The decisions as the tests give them Nodes: through their views.
    fn view(node: &Node) -> NodeView {
        NodeView::of(node, &Interner::default())
    }

    fn desired_addresses(
        node: &Node,
        cloud: &[NodeAddress],
    ) -> Result<Option<Vec<NodeAddress>>, String> {
        super::desired_addresses(&view(node), cloud)
    }

    fn initialize(node: &Node, instance: &Instance) -> Result<Init, String> {
        super::initialize(&view(node), instance)
    }

    fn is_uninitialized(node: &Node) -> bool {
        super::is_uninitialized(&view(node))
    }

    fn reconcile_labels(node: &Node) -> BTreeMap<String, String> {
        super::reconcile_labels(&view(node))
    }

    fn triage(node: &Node) -> Triage {
        super::triage(&view(node))
    }

    fn verdict(node: &Node, state: InstanceState, cached: bool) -> Verdict {
        super::verdict(&view(node), state, cached)
    }

    fn addr(kind: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: kind.into(),
            address: address.into(),
        }
    }

    fn cloud_addr(kind: NodeAddressType, address: &str) -> CloudAddress {
        CloudAddress {
            r#type: kind as i32,
            address: address.into(),
        }
    }

    fn instance() -> Instance {
        Instance {
            provider_id: "sim://i-000001".into(),
            instance_type: "sim.standard-2".into(),
            zone: "zone-a".into(),
            region: "region-1".into(),
            addresses: vec![
                cloud_addr(NodeAddressType::InternalIp, "10.0.0.1"),
                cloud_addr(NodeAddressType::ExternalIp, "203.0.113.9"),
            ],
            additional_labels: Default::default(),
        }
    }

    #[test]
    fn node_ip_annotations_parse_strictly() {
        let cases = [
            ("10.1.1.1", true),
            ("10.1.1.1,fc01:1234::5678", true),
            ("10.1.1.1,10.2.2.2", false),
            ("10.1.1.1, fc01::1", false),
            ("0.0.0.0,fc01::1", false),
            ("banana", false),
            ("1.1.1.1,::1,2.2.2.2", false),
        ];
        for (input, ok) in cases {
            assert_eq!(parse_node_ips(input).is_ok(), ok, "{input}");
        }
    }

    #[test]
    fn node_ips_order_and_filter_addresses_as_upstream() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cloud = vec![
            addr("InternalIP", "10.1.1.1"),
            addr("InternalIP", "10.2.2.2"),
            addr("InternalIP", "10.3.3.3"),
            addr("ExternalIP", "55.55.55.55"),
            addr("Hostname", "h"),
        ];
        assert_eq!(
            filter_by_node_ips(&[ip("10.1.1.1")], &cloud).unwrap(),
            [
                addr("InternalIP", "10.1.1.1"),
                addr("ExternalIP", "55.55.55.55"),
                addr("Hostname", "h")
            ]
        );
        let cloud2 = vec![
            addr("InternalIP", "10.1.1.1"),
            addr("ExternalIP", "55.55.55.55"),
            addr("Hostname", "h"),
        ];
        assert_eq!(
            filter_by_node_ips(&[ip("55.55.55.55")], &cloud2).unwrap(),
            [
                addr("ExternalIP", "55.55.55.55"),
                addr("InternalIP", "10.1.1.1"),
                addr("Hostname", "h")
            ]
        );
        let dual = [ip("10.1.1.1"), ip("fc01:1234::5678")];
        assert!(filter_by_node_ips(&dual, &cloud2).is_err());
        let cloud3 = vec![
            addr("InternalIP", "fc01:1234:0:0:0:0:0:5678"),
            addr("InternalIP", "10.1.1.1"),
            addr("Hostname", "h"),
        ];
        assert_eq!(
            filter_by_node_ips(&dual, &cloud3).unwrap(),
            [
                addr("InternalIP", "10.1.1.1"),
                addr("InternalIP", "fc01:1234:0:0:0:0:0:5678"),
                addr("Hostname", "h")
            ]
        );
    }

    #[test]
    fn address_changes_follow_upstream_detection() {
        let a = [addr("InternalIP", "10.0.0.1"), addr("Hostname", "n")];
        let reordered = [addr("Hostname", "n"), addr("InternalIP", "10.0.0.1")];
        assert!(!addresses_changed(&a, &reordered));
        assert!(addresses_changed(
            &a,
            &[addr("InternalIP", "10.0.0.2"), addr("Hostname", "n")]
        ));
        assert!(addresses_changed(&a, &a[..1]));
    }

    #[test]
    fn the_kubelet_hostname_is_kept_when_the_cloud_has_none() {
        let n = node("n1").address("Hostname", "n1.local").build();
        let wanted = desired_addresses(&n, &[addr("InternalIP", "10.0.0.1")])
            .unwrap()
            .unwrap();
        assert_eq!(
            wanted,
            [addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1.local")]
        );
        assert_eq!(
            desired_addresses(&n, &[]).unwrap(),
            None,
            "addresses are never cleared"
        );
    }

    #[test]
    fn initialising_sets_provider_id_labels_and_keeps_existing_provider_id() {
        let n = node("n1").uninitialized().build();
        let init = initialize(&n, &instance()).unwrap();
        assert_eq!(init.provider_id.as_deref(), Some("sim://i-000001"));
        for (k, v) in [
            ("node.kubernetes.io/instance-type", "sim.standard-2"),
            ("beta.kubernetes.io/instance-type", "sim.standard-2"),
            ("topology.kubernetes.io/zone", "zone-a"),
            ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
            ("topology.kubernetes.io/region", "region-1"),
            ("failure-domain.beta.kubernetes.io/region", "region-1"),
        ] {
            assert_eq!(init.labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        let with_id = node("n1")
            .uninitialized()
            .provider_id("sim://other")
            .build();
        assert_eq!(initialize(&with_id, &instance()).unwrap().provider_id, None);
        let mut no_id = instance();
        no_id.provider_id.clear();
        assert!(initialize(&n, &no_id).is_err(), "a provider ID is required");
        assert!(
            initialize(&with_id, &no_id).is_ok(),
            "unless the node has one"
        );
    }

    #[test]
    fn provider_labels_never_enter_kubernetes_namespaces_or_overwrite() {
        let n = node("n1").uninitialized().label("team", "mine").build();
        let mut i = instance();
        for (k, v) in [
            ("topology.kubernetes.io/x", "1"),
            ("kubernetes.io/x", "1"),
            ("k8s.io/x", "1"),
            ("foo.k8s.io/x", "1"),
            ("k8snio/bar", "kept"),
            ("app.k8snio/bar", "kept"),
            ("team", "theirs"),
            ("new", "added"),
        ] {
            i.additional_labels.insert(k.into(), v.into());
        }
        let init = initialize(&n, &i).unwrap();
        let mut discarded = init.discarded_labels.clone();
        discarded.sort();
        assert_eq!(
            discarded,
            [
                "foo.k8s.io/x",
                "k8s.io/x",
                "kubernetes.io/x",
                "topology.kubernetes.io/x"
            ]
        );
        assert_eq!(
            init.labels.get("k8snio/bar").map(String::as_str),
            Some("kept")
        );
        assert_eq!(
            init.labels.get("app.k8snio/bar").map(String::as_str),
            Some("kept")
        );
        assert_eq!(init.labels.get("new").map(String::as_str), Some("added"));
        assert!(
            !init.labels.contains_key("team"),
            "existing labels are never overwritten"
        );
    }

    #[test]
    fn applying_removes_every_uninitialized_taint_and_keeps_others() {
        let mut n = node("n1")
            .uninitialized()
            .taint(names::TAINT_UNINITIALIZED, None, "NoExecute")
            .taint("dedicated", Some("x"), "NoSchedule")
            .build();
        let init = initialize(&n, &instance()).unwrap();
        apply_init(&mut n, &init);
        let seen = view(&n);
        let left: Vec<_> = seen.taints.iter().map(|(key, _)| &**key).collect();
        assert_eq!(left, ["dedicated"]);
        assert!(!is_uninitialized(&n));
        assert_eq!(seen.provider_id, "sim://i-000001");
    }

    #[test]
    fn the_one_write_patch_does_what_applying_does_to_the_node_it_was_planned_on() {
        let mut cloud = instance();
        cloud.additional_labels = [
            ("example.com/pool".to_owned(), "a~b".to_owned()),
            ("odd~key".to_owned(), "1".to_owned()),
        ]
        .into();
        let nodes = [
            node("labelled")
                .uninitialized()
                .label("example.com/pool", "kept")
                .build(),
            node("several-taints")
                .taint("dedicated", Some("x"), "NoSchedule")
                .uninitialized()
                .taint("other", None, "NoExecute")
                .taint(names::TAINT_UNINITIALIZED, None, "NoExecute")
                .build(),
            node("with-id")
                .uninitialized()
                .provider_id("sim://i-000001")
                .build(),
        ];
        let mut unlabelled = node("unlabelled").uninitialized().build();
        unlabelled.metadata.labels = None;
        for mut n in nodes.into_iter().chain([unlabelled]) {
            n.metadata.resource_version = Some("42".into());
            let init = initialize(&n, &cloud).unwrap();
            let patch: json_patch::Patch =
                serde_json::from_value(init_patch(&view(&n), &init).unwrap()).unwrap();
            let mut patched = serde_json::to_value(&n).unwrap();
            json_patch::patch(&mut patched, &patch).unwrap();
            let mut applied = n.clone();
            apply_init(&mut applied, &init);
            assert_eq!(
                patched,
                serde_json::to_value(&applied).unwrap(),
                "{:?}",
                n.metadata.name
            );
            // Changed since the view was made: the patch does not apply.
            let mut changed = serde_json::to_value(&n).unwrap();
            changed["metadata"]["resourceVersion"] = "43".into();
            assert!(json_patch::patch(&mut changed, &patch).is_err());
        }
        let mut unknown = node("unknown").uninitialized().build();
        unknown.metadata.resource_version = Some("not-a-number".into());
        let init = initialize(&unknown, &cloud).unwrap();
        assert_eq!(init_patch(&view(&unknown), &init), None);
    }

    #[test]
    fn an_invalid_or_unmatched_node_ip_keeps_the_node_tainted() {
        let bad = node("n1")
            .uninitialized()
            .annotation(names::ANNOTATION_PROVIDED_NODE_IP, "10.9.9.9")
            .build();
        assert!(initialize(&bad, &instance()).is_err());
        let garbage = node("n1")
            .uninitialized()
            .annotation(names::ANNOTATION_PROVIDED_NODE_IP, "x")
            .build();
        assert!(initialize(&garbage, &instance()).is_err());
        let good = node("n1")
            .uninitialized()
            .annotation(names::ANNOTATION_PROVIDED_NODE_IP, "10.0.0.1")
            .build();
        assert!(initialize(&good, &instance()).is_ok());
    }

    #[test]
    fn ga_labels_follow_beta_labels() {
        let n = node("n1")
            .label(names::LABEL_ZONE_BETA, "a")
            .label(names::LABEL_ZONE, "b")
            .label(names::LABEL_REGION_BETA, "r")
            .label(names::LABEL_INSTANCE_TYPE, "only-ga")
            .build();
        let set = reconcile_labels(&n);
        assert_eq!(set.get(names::LABEL_ZONE).map(String::as_str), Some("a"));
        assert_eq!(set.get(names::LABEL_REGION).map(String::as_str), Some("r"));
        assert!(
            !set.contains_key(names::LABEL_INSTANCE_TYPE),
            "GA-only nodes are left alone"
        );
    }

    #[test]
    fn lifecycle_triage_and_verdicts() {
        assert_eq!(triage(&node("n").ready().build()), Triage::Healthy);
        assert_eq!(
            triage(&node("n").build()),
            Triage::AskCloud,
            "no Ready condition is Unknown"
        );
        assert_eq!(triage(&node("n").not_ready().build()), Triage::AskCloud);
        let tainted = node("n")
            .ready()
            .taint(names::TAINT_SHUTDOWN, None, "NoSchedule")
            .build();
        assert_eq!(triage(&tainted), Triage::RemoveShutdownTaint);

        let n = node("n").not_ready().build();
        assert_eq!(verdict(&n, InstanceState::NotFound, false), Verdict::Delete);
        assert_eq!(
            verdict(&n, InstanceState::NotFound, true),
            Verdict::Keep,
            "never on a cached answer"
        );
        assert_eq!(
            verdict(&n, InstanceState::Shutdown, false),
            Verdict::TaintShutdown
        );
        let already = node("n")
            .not_ready()
            .taint(names::TAINT_SHUTDOWN, None, "NoSchedule")
            .build();
        assert_eq!(
            verdict(&already, InstanceState::Shutdown, false),
            Verdict::Keep
        );
        assert_eq!(verdict(&n, InstanceState::Running, false), Verdict::Keep);
    }

    #[test]
    fn mass_deletions_are_held_back() {
        assert!(!hold_deletions(1, 10, 0.5, 3));
        assert!(!hold_deletions(5, 10, 0.5, 3), "exactly half is allowed");
        assert!(hold_deletions(6, 10, 0.5, 3));
        assert!(!hold_deletions(2, 2, 0.5, 3), "tiny clusters are exempt");
        assert!(hold_deletions(3, 3, 0.5, 3));
    }

    #[test]
    fn a_node_is_tagged_once_per_set_of_tags_and_never_when_untaggable() {
        let sum = "b34667e1bd6e920c3a33bbbae36f8328".to_owned();
        let other = "0".repeat(32);
        let id = "aws:///z/i-1".to_owned();
        // (provider ID, label, settled under) -> needs tags
        let cases = [
            ("", None, None, false),
            (id.as_str(), None, None, true),
            (id.as_str(), Some(&sum), None, false),
            (id.as_str(), Some(&other), None, true),
            (id.as_str(), None, Some(&id), false),
            (id.as_str(), None, Some(&"aws:///z/i-2".to_owned()), true),
        ];
        for (provider_id, label, settled, want) in cases {
            assert_eq!(
                needs_tags(provider_id, label.map(String::as_str), &sum, settled),
                want,
                "{provider_id:?} {label:?} {settled:?}"
            );
        }
        let tags: BTreeMap<String, String> = [("a", "1"), ("a.b", "2"), ("team", "")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(tags_text(&tags), "a.b=2,a=1,team=");
    }
}
