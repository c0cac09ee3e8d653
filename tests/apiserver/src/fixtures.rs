//! Object builders shared by every test: small chainable modifiers, e.g.
//! `node("n1").uninitialized().pod_cidr("10.244.1.0/24").ready()`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
    Taint,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The taint kubelets register with `--cloud-provider=external`.
pub const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// A Node with nothing but a name.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus::default()),
    })
}

/// Builds a [`Node`].
#[derive(Clone, Debug)]
pub struct NodeBuilder(Node);

impl NodeBuilder {
    fn spec(&mut self) -> &mut NodeSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    fn status(&mut self) -> &mut NodeStatus {
        self.0.status.get_or_insert_with(Default::default)
    }

    /// As a kubelet with `--cloud-provider=external` registers it.
    pub fn uninitialized(self) -> Self {
        self.taint(UNINITIALIZED, Some("true"), "NoSchedule")
    }

    pub fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.spec().taints.get_or_insert_with(Vec::new).push(Taint {
            key: key.into(),
            value: value.map(Into::into),
            effect: effect.into(),
            time_added: None,
        });
        self
    }

    pub fn provider_id(mut self, id: &str) -> Self {
        self.spec().provider_id = Some(id.into());
        self
    }

    pub fn pod_cidr(mut self, cidr: &str) -> Self {
        let spec = self.spec();
        spec.pod_cidr.get_or_insert_with(|| cidr.into());
        spec.pod_cidrs
            .get_or_insert_with(Vec::new)
            .push(cidr.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// Adds an address of `kind` (`InternalIP`, `Hostname`, ...).
    pub fn address(mut self, kind: &str, address: &str) -> Self {
        self.status()
            .addresses
            .get_or_insert_with(Vec::new)
            .push(NodeAddress {
                type_: kind.into(),
                address: address.into(),
            });
        self
    }

    fn condition(mut self, kind: &str, status: &str) -> Self {
        let conditions = self.status().conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != kind);
        conditions.push(NodeCondition {
            type_: kind.into(),
            status: status.into(),
            ..Default::default()
        });
        self
    }

    pub fn ready(self) -> Self {
        self.condition("Ready", "True")
    }

    pub fn not_ready(self) -> Self {
        self.condition("Ready", "False")
    }

    pub fn ready_unknown(self) -> Self {
        self.condition("Ready", "Unknown")
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn build(self) -> Node {
        self.0
    }
}

impl From<NodeBuilder> for Node {
    fn from(b: NodeBuilder) -> Node {
        b.0
    }
}

/// A Service of type LoadBalancer with one TCP port.
pub fn load_balancer(namespace: &str, name: &str) -> ServiceBuilder {
    ServiceBuilder(Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

/// Builds a [`Service`].
#[derive(Clone, Debug)]
pub struct ServiceBuilder(Service);

impl ServiceBuilder {
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    pub fn class(mut self, class: &str) -> Self {
        self.0
            .spec
            .get_or_insert_with(Default::default)
            .load_balancer_class = Some(class.into());
        self
    }

    /// `externalTrafficPolicy: Local`: traffic only to nodes with an
    /// endpoint of its own.
    pub fn local(mut self) -> Self {
        self.0
            .spec
            .get_or_insert_with(Default::default)
            .external_traffic_policy = Some("Local".into());
        self
    }

    pub fn build(self) -> Service {
        self.0
    }
}

/// An EndpointSlice of Service `namespace/service` as the endpoint slice
/// controller writes it: one IPv4 endpoint per `(node, ready)`, on port
/// 8080.
pub fn endpoint_slice(
    namespace: &str,
    service: &str,
    name: &str,
    endpoints: &[(&str, bool)],
) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".into(), service.into()),
                (
                    "endpointslice.kubernetes.io/managed-by".into(),
                    "endpointslice-controller.k8s.io".into(),
                ),
            ])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: endpoints
            .iter()
            .enumerate()
            .map(|(i, (node, ready))| Endpoint {
                addresses: vec![format!("10.244.{}.{}", i / 250, i % 250 + 2)],
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    serving: Some(*ready),
                    terminating: Some(false),
                }),
                node_name: Some((*node).into()),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// A Node as a kubelet reports it (v1.32, containerd, Ubuntu), for
/// benchmarks that must hold what a real cluster holds: the labels and
/// annotations kubelets set, four conditions with reasons and messages,
/// capacity and allocatable, node info, daemon endpoints, and 40 images
/// (most of a real Node's size). With `uninitialized`, it carries the
/// taint of `--cloud-provider=external` and no cloud labels yet. About
/// 9 KB of JSON.
pub fn kubelet_node(
    name: &str,
    ip: &str,
    pod_cidr: Option<&str>,
    uninitialized: bool,
) -> serde_json::Value {
    use serde_json::json;
    let at = "2026-01-01T00:00:00Z";
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": at, "lastTransitionTime": at})
    };
    let images: Vec<serde_json::Value> = (0..40)
        .map(|j| {
            json!({"names": [
                format!("registry.example.com/team-{j}/service-{j}@sha256:{:064x}", j * 7919),
                format!("registry.example.com/team-{j}/service-{j}:v1.{j}.0"),
            ], "sizeBytes": 100_000_000 + j})
        })
        .collect();
    let resources = json!({"cpu": "8", "ephemeral-storage": "101430960Ki", "hugepages-1Gi": "0",
                           "hugepages-2Mi": "0", "memory": "32601436Ki", "pods": "110"});
    let mut spec = json!({});
    if let Some(cidr) = pod_cidr {
        spec["podCIDR"] = json!(cidr);
        spec["podCIDRs"] = json!([cidr]);
    }
    if uninitialized {
        spec["taints"] = json!([{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/pool": "general-purpose",
            },
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.example.com\":\"{name}\"}}"),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": spec,
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "allocatable": resources,
            "capacity": resources,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": images,
            "nodeInfo": {"machineID": "0".repeat(32), "systemUUID": "1".repeat(36), "bootID": "2".repeat(36),
                "kernelVersion": "6.8.0-45-generic", "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0", "operatingSystem": "linux", "architecture": "amd64"},
        },
    })
}
