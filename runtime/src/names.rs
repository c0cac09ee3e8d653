//! Kubernetes well-known names, in one place. Those marked "never change"
//! are shared with Kubernetes itself or with running clusters: changing one
//! breaks nodes, Services or upgrades.

/// Taint kubelets set with `--cloud-provider=external` until a cloud
/// controller initialises the node. Never change.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint for nodes whose instance is shut down. Never change.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Taint the cluster autoscaler puts on nodes it is removing. Never change.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// Taint for nodes that are not ready. Never change.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The IP a kubelet was told to use (`--node-ip`). Never change.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";
/// Service annotation with client CIDRs allowed to reach a load balancer.
/// Never change.
pub const ANNOTATION_LB_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Label cloud-provider-aws's tagging controller puts on a Node whose
/// instance has the tags, their checksum as value. Never change: Nodes
/// upstream tagged carry it.
pub const LABEL_INSTANCE_TAGS: &str = "k8s.io/cloud-provider-aws";

/// Label: the node's zone. Never change.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Label: the node's region. Never change.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Label: the node's instance type. Never change.
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Deprecated zone label, still written as upstream does. Never change.
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// Deprecated region label, still written as upstream does. Never change.
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// Deprecated instance type label, still written as upstream does. Never change.
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// Label that keeps a node out of load balancer backends. Never change.
pub const LABEL_EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Finalizer on Services whose load balancer must be cleaned up. Never change.
pub const FINALIZER_LB_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// Annotation on a Service: what the service controller last made its load
/// balancer as (a digest of the spec and hosts asked for), or absent while a
/// write is under way. A new leader whose ensure would ask for exactly this,
/// and whose load balancer the cloud confirms, writes nothing. Never change.
pub const ANNOTATION_LB_APPLIED: &str = "cloudgateway.io/load-balancer-applied";

/// Annotation on a Service: which eligible nodes back its load balancer,
/// `subset` (the default: a stable subset per zone, or with
/// `externalTrafficPolicy: Local` the nodes that serve its endpoints) or
/// `all` (every one, as upstream, up to the cloud's quota).
pub const ANNOTATION_LB_BACKENDS: &str = "cloudgateway.io/load-balancer-backends";
/// Annotation on a Service: how many nodes per zone its subset holds, in
/// place of the service controller's `--load-balancer-subset-size`.
pub const ANNOTATION_LB_SUBSET_SIZE: &str = "cloudgateway.io/load-balancer-subset-size";

/// The Service condition the service controller writes: whether the load
/// balancer matches the Service. `kubectl ccm` reads it: never change.
pub const CONDITION_LB_SYNCED: &str = "LoadBalancerSynced";
/// Its reason when an annotation (or other Service field) is refused.
pub const REASON_INVALID_CONFIGURATION: &str = "InvalidConfiguration";

/// Namespace of the leader election leases.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// Lease of the node controller. Changing it lets two versions lead at
/// once during an upgrade: never change.
pub const LEASE_NODE_CONTROLLER: &str = "ccm-node-controller";
/// Lease of the service controller. Never change.
pub const LEASE_SERVICE_CONTROLLER: &str = "ccm-service-controller";
/// Lease of the route controller. Never change.
pub const LEASE_ROUTE_CONTROLLER: &str = "ccm-route-controller";

/// Field manager of the node controller's writes.
pub const MANAGER_NODE_CONTROLLER: &str = "ccm-node-controller";
/// Field manager of the service controller's writes.
pub const MANAGER_SERVICE_CONTROLLER: &str = "ccm-service-controller";
/// Field manager of the route controller's writes.
pub const MANAGER_ROUTE_CONTROLLER: &str = "ccm-route-controller";

/// Whether `s` is an RFC 1123 DNS label (namespaces, Service names).
pub fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The longest cluster name: what fits a cloud tag key after
/// `kubernetes.io/cluster/` (AWS's keys take 128 characters).
pub const MAX_CLUSTER_NAME: usize = 106;

/// What a cluster name may hold, as a message says it.
pub const CLUSTER_NAME_RULE: &str =
    "1-106 of letters, digits and . _ - : = + @, starting with a letter or digit";

/// Whether `s` is a cluster name: the cluster IDs cloud providers know
/// (kops' `prod.k8s.local`, capitals, underscores), every one a valid tag
/// key after `kubernetes.io/cluster/`; no spaces or `/`.
pub fn is_cluster_name(s: &str) -> bool {
    (1..=MAX_CLUSTER_NAME).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:=+@".contains(&b))
        && s.as_bytes()[0].is_ascii_alphanumeric()
}

/// Whether `s` is an RFC 1123 DNS subdomain (most object names).
pub fn is_dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len()) && s.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_names_take_cloud_cluster_ids_and_fit_a_tag_key() {
        for ok in [
            "kubernetes",
            "full-scale.k8s.local",
            "Prod_EU1",
            "team:a=b+c@d",
            &"x".repeat(106),
        ] {
            assert!(is_cluster_name(ok), "{ok}");
        }
        for bad in ["", "-a", ".a", "a b", "a/b", "é", &"x".repeat(107)] {
            assert!(!is_cluster_name(bad), "{bad}");
        }
    }
}
