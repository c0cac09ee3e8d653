//! How large a valid request can be: the limits the request checks
//! ([`crate::grpc::validate`]) enforce, and from them the largest encoded
//! request of each method, which the request limits layer holds every
//! request to before reading it and the settings check against.

use ccm_proto::v1::{
    Host, IpFamily, LoadBalancerSpec, NodeAddress, NodeAddressType, NodeRef, Protocol, ServiceRef,
    SessionAffinity, TrafficPolicy,
};

/// The most nodes in one GetInstances or TagInstances call.
pub const MAX_NODES: usize = 1000;
/// The most tags in one TagInstances call (EC2 allows 50 per resource).
pub const MAX_TAGS: usize = 50;
/// The longest tag key, in characters.
pub const MAX_TAG_KEY: usize = 128;
/// The longest tag value, in characters.
pub const MAX_TAG_VALUE: usize = 256;
/// The most hosts behind one load balancer.
pub const MAX_HOSTS: usize = 10_000;
/// The longest provider ID (Azure's are the longest known, near 300).
pub const MAX_PROVIDER_ID: usize = 1024;
/// The longest Kubernetes object name (a DNS subdomain).
pub const MAX_NAME: usize = 253;
pub const MAX_PORTS: usize = 100;
/// The most addresses of a route's target node.
pub const MAX_ADDRESSES: usize = 32;
/// The most addresses of one load balancer host.
pub const MAX_HOST_ADDRESSES: usize = 8;
/// Node labels per host, and their bytes (keys and values) in all.
pub const MAX_HOST_LABELS: usize = 16;
pub const MAX_HOST_LABEL_BYTES: usize = 1024;
pub const MAX_SOURCE_RANGES: usize = 200;
/// Kubernetes' own limit on a Service's annotations, keys and values.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
pub const MAX_ANNOTATIONS: usize = 1024;
/// An annotation key: a DNS subdomain prefix, a slash, a 63-byte name.
pub const MAX_ANNOTATION_KEY: usize = 317;
pub const MAX_UID: usize = 128;
pub const MAX_CLASS: usize = 317;
pub const MAX_ROUTE_NAME: usize = 255;
pub const MAX_NAME_HINT: usize = 128;
/// A volume's or snapshot's name or ID, and an instance's ID in a volume
/// call: CSI's limit, in printable ASCII.
pub const MAX_VOLUME_ID: usize = 128;
/// The most zones one volume create names.
pub const MAX_VOLUME_ZONES: usize = 16;
/// A volume request's provider parameters (a StorageClass's): the most
/// entries, and their keys' and values' lengths in characters.
pub const MAX_VOLUME_PARAMETERS: usize = 32;
pub const MAX_VOLUME_PARAMETER_KEY: usize = 317;
pub const MAX_VOLUME_PARAMETER_VALUE: usize = 1024;

/// The encoded size of a length-delimited field of `len` bytes.
fn field(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

fn maxed(len: usize) -> String {
    "x".repeat(len)
}

fn largest_service() -> ServiceRef {
    ServiceRef {
        namespace: maxed(63),
        name: maxed(63),
        uid: maxed(MAX_UID),
    }
}

fn largest_address() -> NodeAddress {
    NodeAddress {
        r#type: NodeAddressType::ExternalDns as i32,
        address: maxed(MAX_NAME),
    }
}

/// The largest valid spec without its annotations, whose encoding
/// [`max_request_bytes`] bounds apart.
pub(crate) fn largest_spec_without_annotations() -> LoadBalancerSpec {
    // The longest textual CIDR: an IPv4-mapped IPv6 address and /128.
    let cidr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128".to_owned();
    LoadBalancerSpec {
        service: Some(largest_service()),
        ports: vec![
            ccm_proto::v1::ServicePort {
                name: maxed(63),
                protocol: Protocol::Sctp as i32,
                port: 65535,
                node_port: 65535,
            };
            MAX_PORTS
        ],
        load_balancer_class: maxed(MAX_CLASS),
        load_balancer_ip: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255".into(),
        source_ranges: vec![cidr; MAX_SOURCE_RANGES],
        ip_families: vec![IpFamily::Ipv6 as i32; 2],
        external_traffic_policy: TrafficPolicy::Local as i32,
        health_check_node_port: 65535,
        session_affinity: SessionAffinity::ClientIp as i32,
        annotations: Default::default(),
    }
}

fn largest_host() -> Host {
    Host {
        name: maxed(MAX_NAME),
        provider_id: maxed(MAX_PROVIDER_ID),
        addresses: vec![largest_address(); MAX_HOST_ADDRESSES],
        // Bounded apart in `max_request_bytes`.
        labels: Default::default(),
        zone: maxed(63),
    }
}

/// The largest encoded size of any valid request to any method.
pub fn largest_request_bytes() -> usize {
    max_request_bytes("/cloudgateway.v1.LoadBalancers/EnsureLoadBalancer").unwrap_or_default()
}

/// Cluster Autoscaler's external gRPC service (see `grpc::autoscaler`).
const AUTOSCALER_PATH: &str = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/";

/// Its requests carry Nodes with their labels and annotations (up to
/// 256 KiB of annotations each in Kubernetes), several at once when it
/// deletes nodes: tonic's default ceiling, 4 MiB.
pub const AUTOSCALER_MAX_REQUEST: usize = 4 * 1024 * 1024;

/// The largest encoded size of any valid request to the gRPC method at
/// `path`, from the limits the checks above enforce (the autoscaler's,
/// tonic's default); `None` for a path that is not a method of
/// `cloudgateway.v1` or the autoscaler's. The gateway refuses a larger
/// request before reading it.
pub fn max_request_bytes(path: &str) -> Option<usize> {
    if path.starts_with(AUTOSCALER_PATH) {
        return Some(AUTOSCALER_MAX_REQUEST);
    }
    let method = path.strip_prefix("/cloudgateway.v1.")?;
    let p = &*PARTS;
    Some(match method {
        "Provider/GetProviderInfo" => 0,
        // cluster, nodes, fresh, purpose, queue_drained
        "Instances/GetInstances" => p.cluster + MAX_NODES * p.node + 2 + 2 + 2,
        // cluster, nodes, tags (each entry: its framing, and UTF-8 at up
        // to four bytes a character), remove
        "Instances/TagInstances" => {
            p.cluster
                + MAX_NODES * p.node
                + MAX_TAGS * (1 + 2 + 1 + 2 + 4 * MAX_TAG_KEY + 1 + 2 + 4 * MAX_TAG_VALUE)
                + 2
        }
        "LoadBalancers/GetLoadBalancer" | "LoadBalancers/DeleteLoadBalancer" => {
            p.cluster + p.service
        }
        "LoadBalancers/EnsureLoadBalancer" | "LoadBalancers/UpdateLoadBalancerHosts" => {
            p.cluster + p.spec + p.hosts
        }
        "LoadBalancers/ListLoadBalancers" | "Routes/ListRoutes" => p.cluster,
        "Routes/CreateRoute" => p.cluster + field(MAX_NAME_HINT) + p.route,
        "Routes/DeleteRoute" => p.cluster + p.route,
        // cluster, name, two sizes, zones, parameters, mutable parameters,
        // owner, two sources
        "Volumes/CreateVolume" => {
            p.cluster
                + 3 * field(MAX_VOLUME_ID)
                + 2 * 11
                + MAX_VOLUME_ZONES * field(MAX_VOLUME_ID)
                + 2 * p.volume_parameters
                + field(3 * field(4 * MAX_NAME))
        }
        "Volumes/DeleteVolume" | "Volumes/GetVolume" | "Volumes/DeleteSnapshot" => {
            p.cluster + field(MAX_VOLUME_ID)
        }
        "Volumes/ListVolumes" => p.cluster + 6 + field(MAX_VOLUME_ID),
        "Volumes/AttachVolume" | "Volumes/DetachVolume" => p.cluster + 2 * field(MAX_VOLUME_ID),
        "Volumes/ExpandVolume" => p.cluster + field(MAX_VOLUME_ID) + 2 * 11,
        "Volumes/ModifyVolume" => p.cluster + field(MAX_VOLUME_ID) + p.volume_parameters,
        "Volumes/CreateSnapshot" => p.cluster + 2 * field(MAX_VOLUME_ID) + p.volume_parameters,
        "Volumes/ListSnapshots" => p.cluster + 3 * field(MAX_VOLUME_ID) + 6,
        // Admin only: instances, faults and stats are small.
        other if other.starts_with("SimAdmin/") => 64 * 1024,
        _ => return None,
    })
}

/// The largest encoded fields requests are made of, each with its tag and
/// length. Worked out once: it builds the largest valid messages, which
/// every call paid for when it was worked out per call (a fifth of a cache
/// hit's time at low rates, benchmark scenario 6).
struct Parts {
    cluster: usize,
    node: usize,
    service: usize,
    spec: usize,
    hosts: usize,
    route: usize,
    /// One request's provider parameters.
    volume_parameters: usize,
}

static PARTS: std::sync::LazyLock<Parts> = std::sync::LazyLock::new(|| {
    use ccm_proto::v1::Route;
    use prost::Message;
    // A map entry's own framing: its tag and length, and its key's and
    // value's (lengths below 2 MiB take at most three bytes).
    let annotations = MAX_ANNOTATIONS_BYTES + MAX_ANNOTATIONS * (1 + 3 + 1 + 2 + 1 + 3);
    // Host labels: an entry's tag and length (below 16 KiB: two bytes), its
    // key's (at most 317 bytes: two) and its value's (at most 63: one).
    let labels = MAX_HOST_LABEL_BYTES + MAX_HOST_LABELS * (1 + 2 + 1 + 2 + 1 + 1);
    let route = Route {
        name: maxed(MAX_ROUTE_NAME),
        target_node: maxed(MAX_NAME),
        target_node_addresses: vec![largest_address(); MAX_ADDRESSES],
        destination_cidr: maxed(49),
        blackhole: true,
        enable_node_addresses: true,
        target_provider_id: maxed(MAX_PROVIDER_ID),
    };
    let node = NodeRef {
        name: maxed(MAX_NAME),
        provider_id: maxed(MAX_PROVIDER_ID),
    };
    Parts {
        cluster: field(ccm_runtime::names::MAX_CLUSTER_NAME),
        node: field(node.encoded_len()),
        service: field(largest_service().encoded_len()),
        spec: field(largest_spec_without_annotations().encoded_len() + annotations),
        hosts: MAX_HOSTS * field(largest_host().encoded_len() + labels),
        route: field(route.encoded_len()),
        // Each entry: its framing, and UTF-8 at up to four bytes a
        // character.
        volume_parameters: MAX_VOLUME_PARAMETERS
            * (1 + 3
                + 1
                + 2
                + 4 * MAX_VOLUME_PARAMETER_KEY
                + 1
                + 2
                + 4 * MAX_VOLUME_PARAMETER_VALUE),
    }
});
