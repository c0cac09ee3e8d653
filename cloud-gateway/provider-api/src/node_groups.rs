//! Node groups, as Cluster Autoscaler scales them (its `NodeGroup`): a set
//! of like instances whose size the cloud keeps at a target between a
//! minimum and a maximum. The gateway serves them to Cluster Autoscaler's
//! external gRPC client; a provider reports what the cloud has and
//! changes only the target, or deletes named instances.

use std::collections::BTreeMap;

use async_trait::async_trait;

use crate::Result;

/// Node groups, if the provider has them.
#[async_trait]
pub trait NodeGroups: Send + Sync {
    /// Every node group of `cluster` the autoscaler may scale (on AWS, the
    /// Auto Scaling groups carrying Cluster Autoscaler's discovery tags),
    /// with their instances: one consistent read.
    async fn list(&self, cluster: &str) -> Result<Vec<NodeGroup>>;

    /// Sets the group's target size. The gateway has checked it is within
    /// the group's bounds as last listed; the provider refuses one outside
    /// the bounds the cloud holds now (`InvalidArgument`).
    async fn set_target_size(&self, cluster: &str, group: &str, size: u32) -> Result<()>;

    /// Deletes the instances `provider_ids` (each one of the group's, as
    /// last listed) and lowers the target by as many, never below the
    /// group's minimum: an instance of another group, or one that would
    /// take the group below its minimum, is `InvalidArgument` and nothing
    /// is deleted.
    async fn delete_instances(
        &self,
        cluster: &str,
        group: &str,
        provider_ids: &[String],
    ) -> Result<()>;

    /// The Node label that marks nodes with GPUs and names their type (AWS:
    /// `k8s.amazonaws.com/accelerator`, as Cluster Autoscaler's own AWS
    /// provider names it). A local answer: no cloud call.
    fn gpu_label(&self) -> &'static str;

    /// The GPU types the cloud offers, as values of [`Self::gpu_label`].
    fn gpu_types(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One node group.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGroup {
    /// Its id, stable for its life (AWS: the Auto Scaling group's name).
    pub id: String,
    pub min_size: u32,
    pub max_size: u32,
    /// The size the cloud is bringing the group to.
    pub target_size: u32,
    /// What the cloud holds of it now.
    pub instances: Vec<GroupInstance>,
    /// What a new node of the group looks like, for scaling from zero.
    pub template: NodeTemplate,
    /// Options that differ from the autoscaler's defaults for this group.
    pub options: GroupOptions,
}

/// One instance of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupInstance {
    /// Its provider ID, as its Node's `spec.providerID`.
    pub provider_id: String,
    pub state: GroupInstanceState,
    /// Why it could not be made, when it could not.
    pub error: Option<InstanceError>,
}

/// Where an instance of a group is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupInstanceState {
    Running,
    Creating,
    Deleting,
}

/// Why an instance could not be made, as Cluster Autoscaler classes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceError {
    pub class: InstanceErrorClass,
    /// The cloud's own code (AWS: the scaling activity's status).
    pub code: String,
    pub message: String,
}

/// Cluster Autoscaler's `InstanceErrorClass`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceErrorClass {
    /// The cloud has no capacity (or quota) for it: try another group.
    OutOfResources,
    /// Anything else.
    Other,
}

/// What a new node of a group looks like.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTemplate {
    /// The instance type (`node.kubernetes.io/instance-type`).
    pub instance_type: String,
    /// The zones new instances go to; the first is the template's.
    pub zones: Vec<String>,
    /// The region (`topology.kubernetes.io/region`).
    pub region: String,
    /// Capacity: `cpu`, `memory`, `pods`, `nvidia.com/gpu`, and others
    /// the cloud or its tags name, as Kubernetes quantities.
    pub capacity: BTreeMap<String, String>,
    /// Labels the group's nodes carry beyond the well-known ones.
    pub labels: BTreeMap<String, String>,
    /// Taints the group's nodes carry.
    pub taints: Vec<Taint>,
}

/// A Node taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Per-group autoscaling options; `None` keeps the autoscaler's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupOptions {
    pub scale_down_utilization_threshold: Option<f64>,
    pub scale_down_gpu_utilization_threshold: Option<f64>,
    pub scale_down_unneeded_time: Option<std::time::Duration>,
    pub scale_down_unready_time: Option<std::time::Duration>,
    pub max_node_provision_time: Option<std::time::Duration>,
    pub ignore_daemonsets_utilization: Option<bool>,
    pub zero_or_max_node_scaling: Option<bool>,
}
