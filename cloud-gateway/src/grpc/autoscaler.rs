//! Cluster Autoscaler's external gRPC cloud provider
//! (`clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider`), with
//! upstream's meaning for every RPC, over the provider's node groups. Reads
//! come from one snapshot ([`NodeGroupSnapshots`]) that `Refresh` renews at
//! most once per interval; changes go to the cloud at once, at high
//! priority, under the shared budget and the audit log, and are written
//! into the snapshot. Pricing is `UNIMPLEMENTED`, which the autoscaler
//! takes as "no pricing". An unmanaged node's group is the empty id, never
//! an error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_proto::externalgrpc as ca;
use ccm_proto::externalgrpc::cloud_provider_server::CloudProvider;
use ccm_provider::node_groups::{GroupInstanceState, InstanceErrorClass, NodeGroup};
use ccm_provider::{CloudError, Operation};
use tonic::{Request, Response, Status};

use super::status::answer;
use crate::cloud::budget::Priority;
use crate::cloud::node_group_snapshots::NodeGroupSnapshots;
use crate::cloud::{Audit, Cloud};
use crate::identity::Caller;

/// Cluster Autoscaler's `OutOfResourcesErrorClass`.
const OUT_OF_RESOURCES: i32 = 1;
/// Cluster Autoscaler's `OtherErrorClass`.
const OTHER_ERROR: i32 = 99;

/// The CloudProvider service.
pub struct AutoscalerService {
    cloud: Arc<Cloud>,
    snapshots: Arc<NodeGroupSnapshots>,
}

impl AutoscalerService {
    /// Serves `cloud`'s node groups of the cluster `snapshots` is for.
    pub fn new(cloud: Arc<Cloud>, snapshots: Arc<NodeGroupSnapshots>) -> Self {
        Self { cloud, snapshots }
    }

    /// The group `id` as last listed; `NotFound` for an unknown one.
    async fn group(&self, id: &str) -> Result<NodeGroup, CloudError> {
        if id.is_empty() {
            return Err(invalid("id", "a node group id is required"));
        }
        let snapshot = self.snapshots.get(&self.cloud).await?;
        snapshot
            .group(id)
            .cloned()
            .ok_or_else(|| CloudError::NotFound(format!("node group {id:?}")))
    }

    /// Sets `group`'s target to `size` in the cloud, then in the snapshot.
    async fn set_target(&self, caller: &str, group: &str, size: u32) -> Result<(), CloudError> {
        let resource = format!("node_group/{group}");
        self.cloud
            .node_groups()?
            .call(
                Operation::SetNodeGroupSize,
                Priority::High,
                Some(Audit {
                    caller,
                    cluster: self.snapshots.cluster(),
                    resource: &resource,
                }),
                |g| g.set_target_size(self.snapshots.cluster(), group, size),
            )
            .await?;
        self.snapshots.amend(group, |g| g.target_size = size);
        Ok(())
    }
}

fn invalid(field: &str, problem: impl Into<String>) -> CloudError {
    CloudError::InvalidArgument(vec![(field.to_owned(), problem.into())])
}

fn wire_group(g: &NodeGroup) -> ca::NodeGroup {
    ca::NodeGroup {
        id: g.id.clone(),
        min_size: i32::try_from(g.min_size).unwrap_or(i32::MAX),
        max_size: i32::try_from(g.max_size).unwrap_or(i32::MAX),
        debug: format!(
            "{} (min {}, max {}, target {}, {} instances)",
            g.id,
            g.min_size,
            g.max_size,
            g.target_size,
            g.instances.len()
        ),
    }
}

/// A duration in both wire forms: `google.protobuf.Duration` (1.35 on) and
/// `metav1.Duration` (before 1.35).
fn durations(d: Duration) -> (Option<prost_types::Duration>, Option<ca::LegacyDuration>) {
    (
        Some(prost_types::Duration {
            seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
        }),
        Some(ca::LegacyDuration {
            duration: i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        }),
    )
}

/// A duration the client sent in either wire form (each release fills
/// only its own); zero when it sent neither.
fn either(modern: Option<&prost_types::Duration>, legacy: Option<&ca::LegacyDuration>) -> Duration {
    let from_modern = modern.map(|d| {
        Duration::new(
            u64::try_from(d.seconds).unwrap_or(0),
            u32::try_from(d.nanos).unwrap_or(0),
        )
    });
    let from_legacy = legacy.map(|d| Duration::from_nanos(u64::try_from(d.duration).unwrap_or(0)));
    from_modern.or(from_legacy).unwrap_or_default()
}

/// The options of a group that sets some of its own: the group's where it
/// sets them, else the client's defaults, each duration in both wire forms
/// (a client before 1.35 dereferences its three without a check).
fn options(
    o: &ccm_provider::node_groups::GroupOptions,
    defaults: &ca::NodeGroupAutoscalingOptions,
) -> ca::NodeGroupAutoscalingOptions {
    let (unneeded, unneeded_legacy) = durations(o.scale_down_unneeded_time.unwrap_or_else(|| {
        either(
            defaults.scale_down_unneeded_duration.as_ref(),
            defaults.scale_down_unneeded_time.as_ref(),
        )
    }));
    let (unready, unready_legacy) = durations(o.scale_down_unready_time.unwrap_or_else(|| {
        either(
            defaults.scale_down_unready_duration.as_ref(),
            defaults.scale_down_unready_time.as_ref(),
        )
    }));
    let (provision, provision_legacy) = durations(o.max_node_provision_time.unwrap_or_else(|| {
        either(
            defaults.max_node_provision_duration.as_ref(),
            defaults.max_node_provision_time.as_ref(),
        )
    }));
    ca::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: o
            .scale_down_utilization_threshold
            .unwrap_or(defaults.scale_down_utilization_threshold),
        scale_down_gpu_utilization_threshold: o
            .scale_down_gpu_utilization_threshold
            .unwrap_or(defaults.scale_down_gpu_utilization_threshold),
        ignore_daemon_sets_utilization: o
            .ignore_daemonsets_utilization
            .unwrap_or(defaults.ignore_daemon_sets_utilization),
        zero_or_max_node_scaling: o
            .zero_or_max_node_scaling
            .unwrap_or(defaults.zero_or_max_node_scaling),
        scale_down_unneeded_duration: unneeded,
        scale_down_unneeded_time: unneeded_legacy,
        scale_down_unready_duration: unready,
        scale_down_unready_time: unready_legacy,
        max_node_provision_duration: provision,
        max_node_provision_time: provision_legacy,
    }
}

#[tonic::async_trait]
impl CloudProvider for AutoscalerService {
    async fn node_groups(
        &self,
        _request: Request<ca::NodeGroupsRequest>,
    ) -> Result<Response<ca::NodeGroupsResponse>, Status> {
        answer(async move {
            let snapshot = self.snapshots.get(&self.cloud).await?;
            Ok(Response::new(ca::NodeGroupsResponse {
                node_groups: snapshot.groups.iter().map(wire_group).collect(),
            }))
        })
        .await
    }

    async fn node_group_for_node(
        &self,
        request: Request<ca::NodeGroupForNodeRequest>,
    ) -> Result<Response<ca::NodeGroupForNodeResponse>, Status> {
        answer(async move {
            let node = request.into_inner().node.unwrap_or_default();
            let snapshot = self.snapshots.get(&self.cloud).await?;
            // Not ours (no provider ID yet, another cloud's, an instance
            // of no group): the empty id, which the autoscaler leaves be.
            let group = snapshot
                .group_of(&node.provider_id)
                .map_or_else(ca::NodeGroup::default, wire_group);
            Ok(Response::new(ca::NodeGroupForNodeResponse {
                node_group: Some(group),
            }))
        })
        .await
    }

    async fn pricing_node_price(
        &self,
        _request: Request<ca::PricingNodePriceRequest>,
    ) -> Result<Response<ca::PricingNodePriceResponse>, Status> {
        Err(Status::unimplemented("pricing is not offered"))
    }

    async fn pricing_pod_price(
        &self,
        _request: Request<ca::PricingPodPriceRequest>,
    ) -> Result<Response<ca::PricingPodPriceResponse>, Status> {
        Err(Status::unimplemented("pricing is not offered"))
    }

    async fn gpu_label(
        &self,
        _request: Request<ca::GpuLabelRequest>,
    ) -> Result<Response<ca::GpuLabelResponse>, Status> {
        answer(async move {
            let (label, _) = self
                .cloud
                .gpus()
                .ok_or(CloudError::NotImplemented("node groups"))?;
            Ok(Response::new(ca::GpuLabelResponse {
                label: label.to_owned(),
            }))
        })
        .await
    }

    async fn get_available_gpu_types(
        &self,
        _request: Request<ca::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<ca::GetAvailableGpuTypesResponse>, Status> {
        answer(async move {
            let (_, types) = self
                .cloud
                .gpus()
                .ok_or(CloudError::NotImplemented("node groups"))?;
            let gpu_types: HashMap<String, prost_types::Any> = types
                .into_iter()
                .map(|t| (t, prost_types::Any::default()))
                .collect();
            Ok(Response::new(ca::GetAvailableGpuTypesResponse {
                gpu_types,
            }))
        })
        .await
    }

    async fn cleanup(
        &self,
        _request: Request<ca::CleanupRequest>,
    ) -> Result<Response<ca::CleanupResponse>, Status> {
        // The snapshot is the gateway's, shared with other callers.
        Ok(Response::new(ca::CleanupResponse {}))
    }

    async fn refresh(
        &self,
        _request: Request<ca::RefreshRequest>,
    ) -> Result<Response<ca::RefreshResponse>, Status> {
        answer(async move {
            self.snapshots.refresh(&self.cloud).await?;
            Ok(Response::new(ca::RefreshResponse {}))
        })
        .await
    }

    async fn node_group_target_size(
        &self,
        request: Request<ca::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<ca::NodeGroupTargetSizeResponse>, Status> {
        answer(async move {
            let group = self.group(&request.into_inner().id).await?;
            Ok(Response::new(ca::NodeGroupTargetSizeResponse {
                target_size: i32::try_from(group.target_size).unwrap_or(i32::MAX),
            }))
        })
        .await
    }

    async fn node_group_increase_size(
        &self,
        request: Request<ca::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<ca::NodeGroupIncreaseSizeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let delta = u32::try_from(req.delta)
                .ok()
                .filter(|d| *d > 0)
                .ok_or_else(|| invalid("delta", format!("must be positive, not {}", req.delta)))?;
            let group = self.group(&req.id).await?;
            let size = group.target_size.saturating_add(delta);
            if size > group.max_size {
                return Err(invalid(
                    "delta",
                    format!(
                        "size increase too large: desired {size}, max {}",
                        group.max_size
                    ),
                ));
            }
            self.set_target(&caller, &group.id, size).await?;
            Ok(Response::new(ca::NodeGroupIncreaseSizeResponse {}))
        })
        .await
    }

    async fn node_group_delete_nodes(
        &self,
        request: Request<ca::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<ca::NodeGroupDeleteNodesResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let group = self.group(&req.id).await?;
            let mut ids = Vec::new();
            for (i, node) in req.nodes.iter().enumerate() {
                if !group.instances.iter().any(|n| n.provider_id == node.provider_id) {
                    return Err(invalid(
                        &format!("nodes[{i}].providerID"),
                        format!(
                            "{:?} (node {:?}) is not an instance of node group {:?}",
                            node.provider_id, node.name, group.id
                        ),
                    ));
                }
                if !ids.contains(&node.provider_id) {
                    ids.push(node.provider_id.clone());
                }
            }
            // Upstream's AWS provider refuses only a group already at its
            // minimum; the autoscaler itself never asks for more than the
            // group can lose, and the cloud refuses an instance past it.
            if group.target_size <= group.min_size {
                return Err(CloudError::InvalidArgument(vec![(
                    "nodes".into(),
                    format!(
                        "min size reached, nodes will not be deleted: node group {:?} is at its minimum {}",
                        group.id, group.min_size
                    ),
                )]));
            }
            // Instances already on their way out lower nothing again (the
            // cloud skips them, as upstream's provider does).
            let leaving = group
                .instances
                .iter()
                .filter(|n| ids.contains(&n.provider_id) && n.state != GroupInstanceState::Deleting)
                .count();
            let count = u32::try_from(leaving).unwrap_or(u32::MAX);
            let resource = format!("node_group/{}", group.id);
            self.cloud
                .node_groups()?
                .call(
                    Operation::DeleteGroupInstances,
                    Priority::High,
                    Some(Audit {
                        caller: &caller,
                        cluster: self.snapshots.cluster(),
                        resource: &resource,
                    }),
                    |g| g.delete_instances(self.snapshots.cluster(), &group.id, &ids),
                )
                .await?;
            self.snapshots.amend(&group.id, |g| {
                g.target_size = g.target_size.saturating_sub(count);
                for n in g.instances.iter_mut().filter(|n| ids.contains(&n.provider_id)) {
                    n.state = GroupInstanceState::Deleting;
                }
            });
            Ok(Response::new(ca::NodeGroupDeleteNodesResponse {}))
        })
        .await
    }

    async fn node_group_decrease_target_size(
        &self,
        request: Request<ca::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<ca::NodeGroupDecreaseTargetSizeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let by = req
                .delta
                .checked_neg()
                .and_then(|d| u32::try_from(d).ok())
                .filter(|d| *d > 0)
                .ok_or_else(|| invalid("delta", format!("must be negative, not {}", req.delta)))?;
            let group = self.group(&req.id).await?;
            let size = group.target_size.saturating_sub(by);
            // Only instances not yet made may go this way (launches that
            // failed among them): a running one is deleted by name
            // (NodeGroupDeleteNodes) or not at all.
            let existing = group
                .instances
                .iter()
                .filter(|n| n.state != GroupInstanceState::Deleting && n.error.is_none())
                .count();
            if (size as usize) < existing {
                return Err(invalid(
                    "delta",
                    format!(
                        "attempt to delete existing nodes: target {} delta {} existing {existing}",
                        group.target_size, req.delta
                    ),
                ));
            }
            if size < group.min_size {
                return Err(invalid(
                    "delta",
                    format!(
                        "target {size} would be below the minimum {}",
                        group.min_size
                    ),
                ));
            }
            self.set_target(&caller, &group.id, size).await?;
            Ok(Response::new(ca::NodeGroupDecreaseTargetSizeResponse {}))
        })
        .await
    }

    async fn node_group_nodes(
        &self,
        request: Request<ca::NodeGroupNodesRequest>,
    ) -> Result<Response<ca::NodeGroupNodesResponse>, Status> {
        answer(async move {
            let group = self.group(&request.into_inner().id).await?;
            let instances = group
                .instances
                .iter()
                .map(|n| ca::Instance {
                    id: n.provider_id.clone(),
                    status: Some(ca::InstanceStatus {
                        instance_state: match n.state {
                            GroupInstanceState::Running => {
                                ca::instance_status::InstanceState::InstanceRunning
                            }
                            GroupInstanceState::Creating => {
                                ca::instance_status::InstanceState::InstanceCreating
                            }
                            GroupInstanceState::Deleting => {
                                ca::instance_status::InstanceState::InstanceDeleting
                            }
                        } as i32,
                        error_info: n.error.as_ref().map(|e| ca::InstanceErrorInfo {
                            error_code: e.code.clone(),
                            error_message: e.message.clone(),
                            instance_error_class: match e.class {
                                InstanceErrorClass::OutOfResources => OUT_OF_RESOURCES,
                                InstanceErrorClass::Other => OTHER_ERROR,
                            },
                        }),
                    }),
                })
                .collect();
            Ok(Response::new(ca::NodeGroupNodesResponse { instances }))
        })
        .await
    }

    async fn node_group_template_node_info(
        &self,
        request: Request<ca::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<ca::NodeGroupTemplateNodeInfoResponse>, Status> {
        answer(async move {
            let group = self.group(&request.into_inner().id).await?;
            // A group whose template the cloud could not read is listed
            // and scaled; only scaling it from zero waits for the cloud.
            let template = group.template.as_ref().map_err(Clone::clone)?;
            let node = super::node_template::encode(&group.id, template);
            // One answer for every release: the same bytes as an embedded
            // message (before 1.35) and as bytes (1.35 on).
            Ok(Response::new(ca::NodeGroupTemplateNodeInfoResponse {
                node_info: node.clone(),
                node_bytes: node,
            }))
        })
        .await
    }

    async fn node_group_get_options(
        &self,
        request: Request<ca::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<ca::NodeGroupAutoscalingOptionsResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let group = self.group(&req.id).await?;
            // Either release rebuilds its options from the answer's fields
            // alone, zeroing what the proto does not carry (1.35's
            // MaxNodeStartupTime among them); told "unimplemented", it keeps
            // its own defaults whole. So only a group that sets an option
            // of its own gets an answer.
            if !group.options.any() {
                return Err(CloudError::NotImplemented(
                    "per-group options (this group sets none)",
                ));
            }
            Ok(Response::new(ca::NodeGroupAutoscalingOptionsResponse {
                node_group_autoscaling_options: Some(options(
                    &group.options,
                    &req.defaults.unwrap_or_default(),
                )),
            }))
        })
        .await
    }
}
