//! Cluster Autoscaler's external gRPC cloud provider, served by the gateway
//! over the sim's node groups: what a stock autoscaler asks, with
//! upstream's meaning, from one snapshot that a Refresh renews at most once
//! per interval; changes at once, within the groups' bounds.

mod harness;

use std::collections::BTreeMap;

use ccm_proto::externalgrpc as ca;
use ccm_proto::externalgrpc::cloud_provider_client::CloudProviderClient;
use ccm_provider::Operation;
use ccm_provider_sim::store::NodeGroupRecord;
use cloud_gateway::identity::Role;
use harness::TestGateway;
use prost::Message;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds the caller's bearer token to each call.
type Auth = Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
type Client = CloudProviderClient<InterceptedService<Channel, Auth>>;

async fn client(gw: &TestGateway, role: Role) -> Client {
    let token = std::fs::read_to_string(gw.token_file(role)).unwrap();
    let bearer: tonic::metadata::MetadataValue<_> =
        format!("Bearer {}", token.trim()).parse().unwrap();
    let channel = Channel::from_shared(gw.address())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let auth: Auth = Box::new(move |mut r: tonic::Request<()>| {
        r.metadata_mut().insert("authorization", bearer.clone());
        Ok(r)
    });
    CloudProviderClient::with_interceptor(channel, auth)
}

fn group(id: &str, min: u32, max: u32, target: u32) -> NodeGroupRecord {
    NodeGroupRecord {
        cluster: "kubernetes".into(),
        id: id.into(),
        min_size: min,
        max_size: max,
        target_size: target,
        instance_type: "sim.gpu-8".into(),
        zones: vec!["sim-zone-a".into()],
        labels: BTreeMap::from([("team".into(), "ml".into())]),
        taints: vec![("gpu".into(), String::new(), "NoSchedule".into())],
        failed: Vec::new(),
        next_failed: 0,
    }
}

fn node(provider_id: &str) -> ca::ExternalGrpcNode {
    ca::ExternalGrpcNode {
        provider_id: provider_id.into(),
        name: provider_id.rsplit('/').next().unwrap_or_default().into(),
        ..Default::default()
    }
}

async fn instances(c: &mut Client, id: &str) -> Vec<ca::Instance> {
    c.node_group_nodes(ca::NodeGroupNodesRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .instances
}

#[tokio::test]
async fn a_stock_autoscalers_loop_is_answered_from_one_snapshot() {
    let gw = TestGateway::start(|_| {}).await;
    gw.sim().create_node_group(group("gpus", 1, 5, 2)).unwrap();
    gw.sim().create_node_group(group("spare", 0, 3, 0)).unwrap();
    let unmanaged = gw.create_instance("control-plane-0").await;
    let mut c = client(&gw, Role::Autoscaler).await;

    let groups = c
        .node_groups(ca::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    let ids: Vec<(&str, i32, i32)> = groups
        .iter()
        .map(|g| (g.id.as_str(), g.min_size, g.max_size))
        .collect();
    assert_eq!(ids, [("gpus", 1, 5), ("spare", 0, 3)]);
    let members = instances(&mut c, "gpus").await;
    assert_eq!(members.len(), 2);
    // New instances take the sim's time to be made.
    assert!(
        members
            .iter()
            .all(|i| i.status.as_ref().unwrap().instance_state
                == ca::instance_status::InstanceState::InstanceCreating as i32)
    );

    // A loop: Refresh, then every node looked up, sizes and members read.
    let before = gw.sim().stats(true).0;
    assert!(before.contains_key(&Operation::ListNodeGroups));
    for _ in 0..3 {
        c.refresh(ca::RefreshRequest {}).await.unwrap();
        for member in &members {
            let answer = c
                .node_group_for_node(ca::NodeGroupForNodeRequest {
                    node: Some(node(&member.id)),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(answer.node_group.unwrap().id, "gpus");
        }
        // A node of no group: the empty id, never an error.
        let answer = c
            .node_group_for_node(ca::NodeGroupForNodeRequest {
                node: Some(node(&format!("sim://{}", unmanaged.id))),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.node_group.unwrap().id, "");
        let target = c
            .node_group_target_size(ca::NodeGroupTargetSizeRequest { id: "gpus".into() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(target.target_size, 2);
    }
    let (after, _) = gw.sim().stats(false);
    assert_eq!(
        after.get(&Operation::ListNodeGroups),
        None,
        "three loops within the refresh interval list nothing again: {after:?}"
    );

    // Unknown groups are NOT_FOUND; pricing is not offered.
    let err = c
        .node_group_target_size(ca::NodeGroupTargetSizeRequest { id: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let err = c
        .pricing_node_price(ca::PricingNodePriceRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let label = c
        .gpu_label(ca::GpuLabelRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(label.label, ccm_provider_sim::GPU_LABEL);
}

#[tokio::test]
async fn scaling_changes_the_cloud_at_once_within_the_groups_bounds() {
    let gw = TestGateway::start(|_| {}).await;
    gw.sim().create_node_group(group("gpus", 1, 4, 1)).unwrap();
    let mut c = client(&gw, Role::Autoscaler).await;

    c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
        id: "gpus".into(),
        delta: 2,
    })
    .await
    .unwrap();
    // Read back at once, with no Refresh: the gateway wrote it down.
    let target = c
        .node_group_target_size(ca::NodeGroupTargetSizeRequest { id: "gpus".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(target.target_size, 3);
    let err = c
        .node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: "gpus".into(),
            delta: 2,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("max 4"), "{err}");

    // The cloud made them; after a Refresh the autoscaler sees them.
    c.refresh(ca::RefreshRequest {}).await.unwrap();
    let members = instances(&mut c, "gpus").await;
    assert_eq!(members.len(), 3);

    // Lowering the target may not remove a made instance.
    let err = c
        .node_group_decrease_target_size(ca::NodeGroupDecreaseTargetSizeRequest {
            id: "gpus".into(),
            delta: -1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("existing"), "{err}");

    // Deleting named nodes: only the group's own, never below the minimum.
    let err = c
        .node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
            id: "gpus".into(),
            nodes: vec![node("sim://i-999999")],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let two: Vec<_> = members[..2].iter().map(|m| node(&m.id)).collect();
    c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: "gpus".into(),
        nodes: two,
    })
    .await
    .unwrap();
    let left: Vec<_> = gw
        .sim()
        .list_instances()
        .unwrap()
        .into_iter()
        .filter(|i| i.group.as_deref() == Some("gpus"))
        .collect();
    assert_eq!(left.len(), 1);
    let err = c
        .node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
            id: "gpus".into(),
            nodes: vec![node(&format!("sim://{}", left[0].id))],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("min"), "{err}");
}

#[tokio::test]
async fn the_template_and_the_options_describe_the_group() {
    let gw = TestGateway::start(|_| {}).await;
    gw.sim().create_node_group(group("gpus", 0, 4, 0)).unwrap();
    let mut c = client(&gw, Role::Autoscaler).await;
    let bytes = c
        .node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest { id: "gpus".into() })
        .await
        .unwrap()
        .into_inner()
        .node_bytes;
    let template = k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).unwrap();
    let labels = template.metadata.unwrap().labels;
    assert_eq!(labels["node.kubernetes.io/instance-type"], "sim.gpu-8");
    assert_eq!(labels["topology.kubernetes.io/zone"], "sim-zone-a");
    assert_eq!(labels["team"], "ml");
    let status = template.status.unwrap();
    assert_eq!(status.capacity["cpu"].string.as_deref(), Some("8"));
    assert_eq!(
        status.capacity["nvidia.com/gpu"].string.as_deref(),
        Some("1")
    );
    let defaults = ca::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        ..Default::default()
    };
    let options = c
        .node_group_get_options(ca::NodeGroupAutoscalingOptionsRequest {
            id: "gpus".into(),
            defaults: Some(defaults),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(options.node_group_autoscaling_options, Some(defaults));
}

#[tokio::test]
async fn only_the_autoscaler_and_admins_reach_the_service() {
    let gw = TestGateway::start(|_| {}).await;
    let mut node = client(&gw, Role::Node).await;
    let err = node
        .node_groups(ca::NodeGroupsRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err}");
    let mut admin = client(&gw, Role::Admin).await;
    admin.node_groups(ca::NodeGroupsRequest {}).await.unwrap();
}

/// A zone out of capacity: the launch fails as an Auto Scaling group's
/// does, a placeholder with an out-of-resources error that counts in the
/// target until the autoscaler decreases it (never a running instance),
/// and launches succeed again once the zone has capacity.
#[tokio::test]
async fn a_launch_without_capacity_is_an_out_of_resources_placeholder() {
    let gw = TestGateway::start(|_| {}).await;
    gw.sim().create_node_group(group("gpus", 0, 5, 1)).unwrap();
    gw.sim().set_faults(ccm_provider_sim::FaultSettings {
        capacity_exhausted_zones: ["sim-zone-a".to_owned()].into(),
        ..Default::default()
    });
    let mut c = client(&gw, Role::Autoscaler).await;
    c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
        id: "gpus".into(),
        delta: 1,
    })
    .await
    .unwrap();
    c.refresh(ca::RefreshRequest {}).await.unwrap();
    let members = instances(&mut c, "gpus").await;
    let failed: Vec<_> = members
        .iter()
        .filter_map(|i| i.status.as_ref()?.error_info.as_ref())
        .collect();
    assert_eq!(members.len(), 2, "{members:?}");
    assert_eq!(failed.len(), 1, "{members:?}");
    // Upstream's cloudprovider.OutOfResourcesErrorClass.
    assert_eq!(failed[0].instance_error_class, 1);
    assert_eq!(failed[0].error_code, "InsufficientInstanceCapacity");
    // The running instance may not go this way; the failed launch may.
    let refused = c
        .node_group_decrease_target_size(ca::NodeGroupDecreaseTargetSizeRequest {
            id: "gpus".into(),
            delta: -2,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    c.node_group_decrease_target_size(ca::NodeGroupDecreaseTargetSizeRequest {
        id: "gpus".into(),
        delta: -1,
    })
    .await
    .unwrap();
    c.refresh(ca::RefreshRequest {}).await.unwrap();
    let members = instances(&mut c, "gpus").await;
    assert_eq!(members.len(), 1, "{members:?}");
    assert!(members[0].status.as_ref().unwrap().error_info.is_none());
    // Capacity back: the next launch succeeds.
    gw.sim().set_faults(Default::default());
    c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
        id: "gpus".into(),
        delta: 1,
    })
    .await
    .unwrap();
    c.refresh(ca::RefreshRequest {}).await.unwrap();
    let members = instances(&mut c, "gpus").await;
    assert_eq!(members.len(), 2);
    assert!(
        members
            .iter()
            .all(|i| i.status.as_ref().unwrap().error_info.is_none())
    );
}
