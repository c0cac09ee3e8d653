//! The names of the cloud operations.

use std::fmt;
use std::str::FromStr;

/// Every cloud operation the gateway performs. The name is the metric
/// label, the audit log's `operation`, and the key of sim latency faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    /// A batch of instance lookups.
    GetInstances,
    /// Tag or untag a batch of instances.
    TagInstances,
    /// Read one load balancer.
    GetLoadBalancer,
    /// Create or update a load balancer.
    EnsureLoadBalancer,
    /// Replace a load balancer's hosts.
    UpdateLoadBalancerHosts,
    /// Delete a load balancer.
    DeleteLoadBalancer,
    /// List a cluster's load balancers.
    ListLoadBalancers,
    /// List a cluster's routes.
    ListRoutes,
    /// Create a route.
    CreateRoute,
    /// Delete a route.
    DeleteRoute,
    /// List the node groups and their instances.
    ListNodeGroups,
    /// Set a node group's target size.
    SetNodeGroupSize,
    /// Delete named instances of a node group.
    DeleteGroupInstances,
    /// Read the cloud's limits on load balancer hosts.
    LoadBalancerLimits,
    /// The provider's readiness check (`Provider::check`).
    Check,
    /// Create a volume.
    CreateVolume,
    /// Delete a volume.
    DeleteVolume,
    /// Read one volume.
    GetVolume,
    /// List a cluster's volumes.
    ListVolumes,
    /// Read the device names in use on an instance.
    VolumeDevices,
    /// Attach a volume to an instance.
    AttachVolume,
    /// Detach a volume from an instance.
    DetachVolume,
    /// Grow a volume.
    ExpandVolume,
    /// Change a volume's parameters.
    ModifyVolume,
    /// Snapshot a volume.
    CreateSnapshot,
    /// Delete a snapshot.
    DeleteSnapshot,
    /// List a cluster's snapshots.
    ListSnapshots,
}

impl Operation {
    /// Every operation, for listing accepted values.
    pub const ALL: [Operation; 27] = [
        Self::GetInstances,
        Self::TagInstances,
        Self::GetLoadBalancer,
        Self::EnsureLoadBalancer,
        Self::UpdateLoadBalancerHosts,
        Self::DeleteLoadBalancer,
        Self::ListLoadBalancers,
        Self::ListRoutes,
        Self::CreateRoute,
        Self::DeleteRoute,
        Self::ListNodeGroups,
        Self::SetNodeGroupSize,
        Self::DeleteGroupInstances,
        Self::LoadBalancerLimits,
        Self::Check,
        Self::CreateVolume,
        Self::DeleteVolume,
        Self::GetVolume,
        Self::ListVolumes,
        Self::VolumeDevices,
        Self::AttachVolume,
        Self::DetachVolume,
        Self::ExpandVolume,
        Self::ModifyVolume,
        Self::CreateSnapshot,
        Self::DeleteSnapshot,
        Self::ListSnapshots,
    ];

    /// The operation's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::GetInstances => "get_instances",
            Self::TagInstances => "tag_instances",
            Self::GetLoadBalancer => "get_load_balancer",
            Self::EnsureLoadBalancer => "ensure_load_balancer",
            Self::UpdateLoadBalancerHosts => "update_load_balancer_hosts",
            Self::DeleteLoadBalancer => "delete_load_balancer",
            Self::ListLoadBalancers => "list_load_balancers",
            Self::ListRoutes => "list_routes",
            Self::CreateRoute => "create_route",
            Self::DeleteRoute => "delete_route",
            Self::ListNodeGroups => "list_node_groups",
            Self::SetNodeGroupSize => "set_node_group_size",
            Self::DeleteGroupInstances => "delete_group_instances",
            Self::LoadBalancerLimits => "load_balancer_limits",
            Self::Check => "check",
            Self::CreateVolume => "create_volume",
            Self::DeleteVolume => "delete_volume",
            Self::GetVolume => "get_volume",
            Self::ListVolumes => "list_volumes",
            Self::VolumeDevices => "volume_devices",
            Self::AttachVolume => "attach_volume",
            Self::DetachVolume => "detach_volume",
            Self::ExpandVolume => "expand_volume",
            Self::ModifyVolume => "modify_volume",
            Self::CreateSnapshot => "create_snapshot",
            Self::DeleteSnapshot => "delete_snapshot",
            Self::ListSnapshots => "list_snapshots",
        }
    }

    /// Whether the operation changes the cloud (and is audit-logged).
    pub fn is_mutating(self) -> bool {
        matches!(
            self,
            Self::TagInstances
                | Self::EnsureLoadBalancer
                | Self::UpdateLoadBalancerHosts
                | Self::DeleteLoadBalancer
                | Self::CreateRoute
                | Self::DeleteRoute
                | Self::SetNodeGroupSize
                | Self::DeleteGroupInstances
                | Self::CreateVolume
                | Self::DeleteVolume
                | Self::AttachVolume
                | Self::DetachVolume
                | Self::ExpandVolume
                | Self::ModifyVolume
                | Self::CreateSnapshot
                | Self::DeleteSnapshot
        )
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Operation {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|op| op.as_str()).collect();
                format!("unknown operation {s:?}; accepted: {}", names.join(", "))
            })
    }
}
