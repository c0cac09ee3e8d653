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
use gateway_conformance::externalgrpc::{v1_30, v1_35};
use harness::TestGateway;
use prost::Message;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds the caller's bearer token to each call.
type Auth = Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
type Client = CloudProviderClient<InterceptedService<Channel, Auth>>;

async fn client(gw: &TestGateway, role: Role) -> Client {
    let (channel, auth) = authorized(gw, role).await;
    CloudProviderClient::with_interceptor(channel, auth())
}

/// The gateway's channel, and interceptors adding `role`'s bearer token.
async fn authorized(gw: &TestGateway, role: Role) -> (Channel, impl Fn() -> Auth) {
    let token = std::fs::read_to_string(gw.token_file(role)).unwrap();
    let bearer: tonic::metadata::MetadataValue<_> =
        format!("Bearer {}", token.trim()).parse().unwrap();
    let channel = Channel::from_shared(gw.address())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let auth = move || -> Auth {
        let bearer = bearer.clone();
        Box::new(move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", bearer.clone());
            Ok(r)
        })
    };
    (channel, auth)
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
        options: BTreeMap::new(),
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

/// Upstream's own clients of both wire formats (generated from its files
/// by the conformance suite), on the gateway's channel with `role`'s token.
async fn upstream_clients(
    gw: &TestGateway,
    role: Role,
) -> (
    v1_35::cloud_provider_client::CloudProviderClient<InterceptedService<Channel, Auth>>,
    v1_30::cloud_provider_client::CloudProviderClient<InterceptedService<Channel, Auth>>,
) {
    let (channel, auth) = authorized(gw, role).await;
    (
        v1_35::cloud_provider_client::CloudProviderClient::with_interceptor(
            channel.clone(),
            auth(),
        ),
        v1_30::cloud_provider_client::CloudProviderClient::with_interceptor(channel, auth()),
    )
}

#[tokio::test]
async fn every_release_reads_the_template_and_the_options_of_its_wire_format() {
    let gw = TestGateway::start(|_| {}).await;
    gw.sim().create_node_group(group("gpus", 0, 4, 0)).unwrap();
    gw.sim()
        .create_node_group(NodeGroupRecord {
            options: BTreeMap::from([
                ("scaledownunneededtime".to_owned(), "5m".to_owned()),
                ("scaledownutilizationthreshold".to_owned(), "0.3".to_owned()),
            ]),
            ..group("tuned", 0, 4, 0)
        })
        .unwrap();
    let (mut new, mut old) = upstream_clients(&gw, Role::Autoscaler).await;

    // The template: bytes for 1.35 on, an embedded Node before; one Node.
    let bytes = new
        .node_group_template_node_info(v1_35::NodeGroupTemplateNodeInfoRequest {
            id: "gpus".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .node_bytes;
    let embedded = old
        .node_group_template_node_info(v1_30::NodeGroupTemplateNodeInfoRequest {
            id: "gpus".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .node_info
        .expect("a client before 1.35 reads the template from field 1");
    let template = k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).unwrap();
    assert_eq!(template, embedded);
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

    // A group with no options of its own: each release keeps its defaults
    // whole (an answer would zero what its proto does not carry).
    let err = new
        .node_group_get_options(v1_35::NodeGroupAutoscalingOptionsRequest {
            id: "gpus".into(),
            defaults: Some(Default::default()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    let err = old
        .node_group_get_options(v1_30::NodeGroupAutoscalingOptionsRequest {
            id: "gpus".into(),
            defaults: Some(Default::default()),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err}");

    // A group with some: its own where it sets them, the caller's defaults
    // elsewhere, every duration in the caller's form.
    let secs = |seconds| prost_types::Duration { seconds, nanos: 0 };
    let answer = new
        .node_group_get_options(v1_35::NodeGroupAutoscalingOptionsRequest {
            id: "tuned".into(),
            defaults: Some(v1_35::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.5,
                scale_down_unneeded_duration: Some(secs(600)),
                scale_down_unready_duration: Some(secs(1200)),
                max_node_provision_duration: Some(secs(900)),
                ignore_daemon_sets_utilization: true,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .node_group_autoscaling_options
        .unwrap();
    assert_eq!(answer.scale_down_utilization_threshold, 0.3);
    assert_eq!(answer.scale_down_unneeded_duration, Some(secs(300)));
    assert_eq!(answer.scale_down_unready_duration, Some(secs(1200)));
    assert_eq!(answer.max_node_provision_duration, Some(secs(900)));
    assert!(answer.ignore_daemon_sets_utilization);
    let nanos = |s: i64| k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
        duration: Some(s * 1_000_000_000),
    };
    let answer = old
        .node_group_get_options(v1_30::NodeGroupAutoscalingOptionsRequest {
            id: "tuned".into(),
            defaults: Some(v1_30::NodeGroupAutoscalingOptions {
                scale_down_utilization_threshold: 0.5,
                scale_down_gpu_utilization_threshold: 0.5,
                scale_down_unneeded_time: Some(nanos(600)),
                scale_down_unready_time: Some(nanos(1200)),
                max_node_provision_time: Some(nanos(900)),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .node_group_autoscaling_options
        .unwrap();
    assert_eq!(answer.scale_down_utilization_threshold, 0.3);
    assert_eq!(answer.scale_down_unneeded_time, Some(nanos(300)));
    assert_eq!(answer.scale_down_unready_time, Some(nanos(1200)));
    assert_eq!(answer.max_node_provision_time, Some(nanos(900)));
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
    // Upstream AWS provider's code for a launch the cloud cannot fulfil.
    assert_eq!(failed[0].error_code, "placeholder-cannot-be-fulfilled");
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
