//! The resources the test server serves, with what discovery says of them
//! and how strategic merge patches treat their lists.

/// How a strategic merge patch treats a list field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// The patch's list replaces the object's.
    Replace,
    /// Elements are merged by the named key.
    MergeByKey(&'static str),
    /// A set of scalars: the patch's values are added.
    MergePrimitive,
}

/// One served resource.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group; empty for core.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether it has a `status` subresource.
    pub has_status: bool,
    pub short_names: &'static [&'static str],
    /// Only `create` is served (reviews).
    pub create_only: bool,
    /// Subresources besides `status` (a CSR's `approval`, a pod's
    /// `proxy`).
    pub subresources: &'static [&'static str],
    /// The categories discovery lists it in (`kubectl get all`).
    pub categories: &'static [&'static str],
    /// Served, in a real cluster, from a CustomResourceDefinition rather
    /// than built into kube-apiserver: k8s-openapi has no type for it, so
    /// it is kept as JSON as written (no field is checked or dropped, see
    /// `schema`), never decoded from protobuf (415, see `protobuf`), and
    /// patched with JSON patches, merge patches and server-side apply but
    /// not strategic merge patches (415), as kube-apiserver serves custom
    /// resources.
    pub custom: bool,
}

impl Resource {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `nodes` or `leases.coordination.k8s.io`, as errors name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// What discovery says of the subresource `sub`: its kind and verbs,
    /// as kube-apiserver lists them.
    pub fn subresource_discovery(&self, sub: &str) -> (String, &'static [&'static str]) {
        match sub {
            "proxy" => (
                format!("{}ProxyOptions", self.kind),
                &["create", "delete", "get", "patch", "update"],
            ),
            "token" => ("TokenRequest".to_owned(), &["create"]),
            "eviction" => ("Eviction".to_owned(), &["create"]),
            _ => (self.kind.to_owned(), &["get", "patch", "update"]),
        }
    }
}

const fn resource(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    has_status: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        has_status,
        short_names,
        create_only: false,
        subresources: &[],
        categories: &[],
        custom: false,
    }
}

/// A custom resource (see [`Resource::custom`]).
const fn custom(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    has_status: bool,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        custom: true,
        ..resource(
            group,
            plural,
            singular,
            kind,
            namespaced,
            has_status,
            short_names,
        )
    }
}

/// A review: `create` only, answered rather than stored.
const fn review(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Resource {
    Resource {
        create_only: true,
        ..resource(group, plural, singular, kind, namespaced, false, &[])
    }
}

/// kube-apiserver's `all` category: pods, replicationcontrollers,
/// services, daemonsets, deployments, replicasets, statefulsets,
/// horizontalpodautoscalers, cronjobs and jobs. Of those this server
/// serves all but the last three.
const ALL: &[&str] = &["all"];

/// A workload (`all`, with a status), as Cluster Autoscaler lists them to
/// tell which pods a controller will recreate elsewhere.
const fn workload(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    short_names: &'static [&'static str],
) -> Resource {
    Resource {
        categories: ALL,
        ..resource(group, plural, singular, kind, true, true, short_names)
    }
}

const RBAC: &str = "rbac.authorization.k8s.io";
const STORAGE: &str = "storage.k8s.io";
/// The CSI snapshot API: external-snapshotter's CustomResourceDefinitions
/// (`client/config/crd`), which its snapshot-controller and csi-snapshotter
/// sidecar read and write.
const SNAPSHOT: &str = "snapshot.storage.k8s.io";

/// Every served resource.
pub static RESOURCES: &[Resource] = &[
    resource("", "nodes", "node", "Node", false, true, &["no"]),
    // Services and pods forward HTTP to their backends through `proxy`
    // (see `proxy`).
    Resource {
        subresources: &["proxy"],
        categories: ALL,
        ..resource("", "services", "service", "Service", true, true, &["svc"])
    },
    resource("", "events", "event", "Event", true, false, &["ev"]),
    // Pods: empty unless a test creates some; `kubectl describe node`
    // lists them. `eviction` deletes one as far as its disruption budgets
    // allow (see `evictions`).
    Resource {
        subresources: &["eviction", "proxy"],
        categories: ALL,
        ..resource("", "pods", "pod", "Pod", true, true, &["po"])
    },
    // Who workloads are; `token` mints their tokens (see `tokens`).
    Resource {
        subresources: &["token"],
        ..resource(
            "",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            false,
            &["sa"],
        )
    },
    // Where `services/proxy` finds a Service's backends.
    resource(
        "",
        "endpoints",
        "endpoints",
        "Endpoints",
        true,
        false,
        &["ep"],
    ),
    // The front-proxy ConfigMap (`kube-system/extension-apiserver-authentication`,
    // see `front_proxy`) and whatever tests keep in others.
    resource(
        "",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        false,
        &["cm"],
    ),
    resource(
        "",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        true,
        &["ns"],
    ),
    resource(
        "events.k8s.io",
        "events",
        "event",
        "Event",
        true,
        false,
        &["ev"],
    ),
    // What the endpoint slice controller would write: tests write them
    // as it does, labelled with their Service's name.
    resource(
        "discovery.k8s.io",
        "endpointslices",
        "endpointslice",
        "EndpointSlice",
        true,
        false,
        &[],
    ),
    // What Cluster Autoscaler watches besides nodes and pods: the
    // workloads that own pods, disruption budgets, and what volume
    // scheduling reads. Stored as written; no controller acts on them.
    workload(
        "",
        "replicationcontrollers",
        "replicationcontroller",
        "ReplicationController",
        &["rc"],
    ),
    workload(
        "apps",
        "deployments",
        "deployment",
        "Deployment",
        &["deploy"],
    ),
    workload("apps", "replicasets", "replicaset", "ReplicaSet", &["rs"]),
    workload(
        "apps",
        "statefulsets",
        "statefulset",
        "StatefulSet",
        &["sts"],
    ),
    workload("apps", "daemonsets", "daemonset", "DaemonSet", &["ds"]),
    workload("batch", "jobs", "job", "Job", &[]),
    resource(
        "policy",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        true,
        &["pdb"],
    ),
    resource(
        "",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        true,
        &["pv"],
    ),
    resource(
        "",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        true,
        &["pvc"],
    ),
    resource(
        STORAGE,
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        false,
        &["sc"],
    ),
    resource(
        STORAGE,
        "csidrivers",
        "csidriver",
        "CSIDriver",
        false,
        false,
        &[],
    ),
    resource(STORAGE, "csinodes", "csinode", "CSINode", false, false, &[]),
    resource(
        STORAGE,
        "csistoragecapacities",
        "csistoragecapacity",
        "CSIStorageCapacity",
        true,
        false,
        &[],
    ),
    resource(
        STORAGE,
        "volumeattachments",
        "volumeattachment",
        "VolumeAttachment",
        false,
        true,
        &[],
    ),
    // What a claim's `volumeAttributesClassName` names: the parameters
    // external-resizer's modify controller hands the driver
    // (ControllerModifyVolume). storage.k8s.io/v1 since Kubernetes 1.34,
    // which the resizer looks for in discovery; the k8s-openapi types this
    // server checks objects with (1.32's) have it only as v1beta1, so it
    // is kept as written (see `schema`).
    resource(
        STORAGE,
        "volumeattributesclasses",
        "volumeattributesclass",
        "VolumeAttributesClass",
        false,
        false,
        &["vac"],
    ),
    // Access rules, enforced as soon as they are written once RBAC is on
    // (see `rbac`).
    resource(
        RBAC,
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        false,
        &[],
    ),
    resource(
        RBAC,
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        false,
        &[],
    ),
    resource(RBAC, "roles", "role", "Role", true, false, &[]),
    resource(
        RBAC,
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        false,
        &[],
    ),
    resource(
        "coordination.k8s.io",
        "leases",
        "lease",
        "Lease",
        true,
        false,
        &[],
    ),
    // Kubelet serving certificates: the requester fields come from the
    // caller, and `approval` sets only the approval conditions.
    Resource {
        subresources: &["approval"],
        ..resource(
            "certificates.k8s.io",
            "certificatesigningrequests",
            "certificatesigningrequest",
            "CertificateSigningRequest",
            false,
            true,
            &["csr"],
        )
    },
    review(
        "authentication.k8s.io",
        "tokenreviews",
        "tokenreview",
        "TokenReview",
        false,
    ),
    // Questions to the authorizer (`kubectl auth can-i`): see `reviews`.
    review(
        "authorization.k8s.io",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        "LocalSubjectAccessReview",
        true,
    ),
    review(
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
        false,
    ),
    review(
        "authorization.k8s.io",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        "SelfSubjectRulesReview",
        false,
    ),
    review(
        "authorization.k8s.io",
        "subjectaccessreviews",
        "subjectaccessreview",
        "SubjectAccessReview",
        false,
    ),
    // The API groups this server serves and those it forwards to other
    // servers (see `aggregation`).
    resource(
        "apiregistration.k8s.io",
        "apiservices",
        "apiservice",
        "APIService",
        false,
        true,
        &[],
    ),
    // CSI snapshots, as external-snapshotter's CRDs define them (names,
    // scope, short names, the status subresource). Stored as written; no
    // controller acts on them. Last, as kube-aggregator lists the groups
    // of CRDs after the built-in ones.
    custom(
        SNAPSHOT,
        "volumesnapshots",
        "volumesnapshot",
        "VolumeSnapshot",
        true,
        true,
        &["vs"],
    ),
    custom(
        SNAPSHOT,
        "volumesnapshotcontents",
        "volumesnapshotcontent",
        "VolumeSnapshotContent",
        false,
        true,
        &["vsc", "vscs"],
    ),
    custom(
        SNAPSHOT,
        "volumesnapshotclasses",
        "volumesnapshotclass",
        "VolumeSnapshotClass",
        false,
        false,
        &["vsclass", "vsclasses"],
    ),
];

/// The resource at `group`/`version`/`plural`.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The API groups served (besides core), in discovery order.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

/// The strategic-merge list strategy of the field at `path` in `kind`, as
/// the Kubernetes API types declare it.
pub fn list_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    match (kind, path) {
        (_, ["metadata", "finalizers"]) => ListStrategy::MergePrimitive,
        (_, ["metadata", "ownerReferences"]) => ListStrategy::MergeByKey("uid"),
        (_, ["status", "conditions"]) => ListStrategy::MergeByKey("type"),
        ("Node", ["status", "addresses"]) => ListStrategy::MergeByKey("type"),
        ("Node", ["spec", "podCIDRs"]) => ListStrategy::MergePrimitive,
        ("Node", ["status", "images"]) => ListStrategy::Replace,
        ("Service", ["spec", "ports"]) => ListStrategy::MergeByKey("port"),
        _ => ListStrategy::Replace,
    }
}
