//! Cluster Autoscaler's external gRPC cloud provider
//! (`clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider`), for a
//! gateway that offers node groups: the answers upstream's client relies on,
//! asked with upstream's own clients of both wire formats (see
//! `externalgrpc`) and the admin's token (the autoscaler itself comes in
//! with a client certificate, which the suite does not hold).

use ccm_proto::v1::NodeRef;
use prost::Message;
use tonic::Code;

use crate::checks::fixtures::lookup;
use crate::context::{Context, no_node};
use crate::externalgrpc::v1_30 as old;
use crate::externalgrpc::v1_35 as ca;
use crate::outcome::{Outcome, fail};

type Client = ca::cloud_provider_client::CloudProviderClient<ccm_proto::AuthorizedChannel>;
type OldClient = old::cloud_provider_client::CloudProviderClient<ccm_proto::AuthorizedChannel>;

/// A client with the admin's token, or the skip of a run without one.
fn client(cx: &Context) -> Result<Result<Client, Outcome>, String> {
    let Ok(admin) = cx.client("admin") else {
        return Ok(Err(Outcome::Skip(
            "no admin token: the node group checks call as admin".into(),
        )));
    };
    let channel = admin.authorized_channel().map_err(|e| e.to_string())?;
    Ok(Ok(Client::new(channel)))
}

/// The client of a release before 1.35, beside [`client`]'s.
fn old_client(cx: &Context) -> Result<OldClient, String> {
    let channel = cx
        .client("admin")?
        .authorized_channel()
        .map_err(|e| e.to_string())?;
    Ok(OldClient::new(channel))
}

/// A node the autoscaler does not manage (the run's node, in no group)
/// belongs to the empty id: an answer, never an error.
pub(crate) async fn unmanaged_node(cx: &Context) -> Result<Outcome, String> {
    let Some(name) = &cx.node else {
        return Ok(no_node());
    };
    let found = lookup(
        &cx.client("node")?,
        NodeRef {
            name: name.clone(),
            provider_id: String::new(),
        },
    )
    .await?;
    let provider_id = found
        .instance
        .map(|i| i.provider_id)
        .ok_or_else(|| format!("node {name:?} has no instance"))?;
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    c.refresh(ca::RefreshRequest {})
        .await
        .map_err(|e| format!("Refresh: {e}"))?;
    let answer = c
        .node_group_for_node(ca::NodeGroupForNodeRequest {
            node: Some(ca::ExternalGrpcNode {
                provider_id: provider_id.clone(),
                name: name.clone(),
                ..Default::default()
            }),
        })
        .await;
    match answer {
        Ok(r)
            if r.get_ref()
                .node_group
                .as_ref()
                .is_none_or(|g| g.id.is_empty()) =>
        {
            Ok(Outcome::Pass)
        }
        other => fail(format!(
            "expected the empty id for {provider_id:?}, got {other:?}"
        )),
    }
}

/// A group the gateway does not have is NOT_FOUND.
pub(crate) async fn unknown_group(cx: &Context) -> Result<Outcome, String> {
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let id = format!("conformance-missing-{}", fastrand::u32(..));
    match c
        .node_group_target_size(ca::NodeGroupTargetSizeRequest { id })
        .await
    {
        Err(s) if s.code() == Code::NotFound => Ok(Outcome::Pass),
        other => fail(format!("expected NOT_FOUND, got {other:?}")),
    }
}

/// A change that cannot be right for any group (no id, a delta of the
/// wrong sign) is INVALID_ARGUMENT, and changes nothing.
pub(crate) async fn invalid_change(cx: &Context) -> Result<Outcome, String> {
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let up = c
        .node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: String::new(),
            delta: 0,
        })
        .await;
    if !matches!(&up, Err(s) if s.code() == Code::InvalidArgument) {
        return fail(format!(
            "IncreaseSize by 0: expected INVALID_ARGUMENT, got {up:?}"
        ));
    }
    let down = c
        .node_group_decrease_target_size(ca::NodeGroupDecreaseTargetSizeRequest {
            id: String::new(),
            delta: 1,
        })
        .await;
    match down {
        Err(s) if s.code() == Code::InvalidArgument => Ok(Outcome::Pass),
        other => fail(format!(
            "DecreaseTargetSize by +1: expected INVALID_ARGUMENT, got {other:?}"
        )),
    }
}

/// Pricing, which the contract leaves to the autoscaler's own estimates,
/// is UNIMPLEMENTED, which upstream's client reads as "not offered", in
/// either wire format.
pub(crate) async fn pricing_unimplemented(cx: &Context) -> Result<Outcome, String> {
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let answer = c
        .pricing_node_price(ca::PricingNodePriceRequest::default())
        .await;
    if !matches!(&answer, Err(s) if s.code() == Code::Unimplemented) {
        return fail(format!("1.35 on: expected UNIMPLEMENTED, got {answer:?}"));
    }
    match old_client(cx)?
        .pricing_pod_price(old::PricingPodPriceRequest::default())
        .await
    {
        Err(s) if s.code() == Code::Unimplemented => Ok(Outcome::Pass),
        other => fail(format!(
            "before 1.35: expected UNIMPLEMENTED, got {other:?}"
        )),
    }
}

/// The defaults a release sends with GetOptions, chosen so that a
/// gateway that echoes them is seen doing so.
const UNNEEDED_SECS: i64 = 601;
const UNREADY_SECS: i64 = 1_201;
const PROVISION_SECS: i64 = 901;

/// Both wire formats, always: every group's template is the same `v1.Node`
/// as an embedded message (before 1.35) and as bytes (1.35 on), or the
/// same error to both; its options are UNIMPLEMENTED to both (the group
/// sets none of its own: the client keeps its defaults whole), or answer
/// both with all three durations set and alike. A client before 1.35
/// dereferences those durations unchecked.
pub(crate) async fn both_wire_formats(cx: &Context) -> Result<Outcome, String> {
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    let mut o = old_client(cx)?;
    c.refresh(ca::RefreshRequest {})
        .await
        .map_err(|e| format!("Refresh: {e}"))?;
    let ids = |groups: Vec<String>| {
        let mut groups = groups;
        groups.sort();
        groups
    };
    let new_ids = ids(c
        .node_groups(ca::NodeGroupsRequest {})
        .await
        .map_err(|e| format!("NodeGroups: {e}"))?
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect());
    let old_ids = ids(o
        .node_groups(old::NodeGroupsRequest {})
        .await
        .map_err(|e| format!("NodeGroups before 1.35: {e}"))?
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect());
    if new_ids != old_ids {
        return fail(format!(
            "the two wire formats list other groups: {new_ids:?} and {old_ids:?}"
        ));
    }
    if new_ids.is_empty() {
        return Ok(Outcome::Skip("the gateway lists no node group".into()));
    }
    for id in new_ids.iter().take(5) {
        let new = c
            .node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
            .await;
        let old = o
            .node_group_template_node_info(old::NodeGroupTemplateNodeInfoRequest { id: id.clone() })
            .await;
        match (new, old) {
            (Ok(new), Ok(old)) => {
                let Some(embedded) = old.into_inner().node_info else {
                    return fail(format!(
                        "group {id:?}: no template for a client before 1.35 (field 1, nodeInfo)"
                    ));
                };
                let bytes = new.into_inner().node_bytes;
                if bytes.is_empty() || bytes != embedded.encode_to_vec() {
                    return fail(format!(
                        "group {id:?}: the template as bytes (1.35 on) is not the embedded one"
                    ));
                }
            }
            (Err(a), Err(b)) if a.code() == b.code() => {}
            (new, old) => {
                return fail(format!(
                    "group {id:?}: templates differ by wire format: {new:?} and {old:?}"
                ));
            }
        }
        let duration = |seconds: i64| prost_types::Duration { seconds, nanos: 0 };
        let legacy = |seconds: i64| k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
            duration: Some(seconds * 1_000_000_000),
        };
        let new = c
            .node_group_get_options(ca::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: Some(ca::NodeGroupAutoscalingOptions {
                    scale_down_utilization_threshold: 0.5,
                    scale_down_unneeded_duration: Some(duration(UNNEEDED_SECS)),
                    scale_down_unready_duration: Some(duration(UNREADY_SECS)),
                    max_node_provision_duration: Some(duration(PROVISION_SECS)),
                    ..Default::default()
                }),
            })
            .await;
        let old = o
            .node_group_get_options(old::NodeGroupAutoscalingOptionsRequest {
                id: id.clone(),
                defaults: Some(old::NodeGroupAutoscalingOptions {
                    scale_down_utilization_threshold: 0.5,
                    scale_down_unneeded_time: Some(legacy(UNNEEDED_SECS)),
                    scale_down_unready_time: Some(legacy(UNREADY_SECS)),
                    max_node_provision_time: Some(legacy(PROVISION_SECS)),
                    ..Default::default()
                }),
            })
            .await;
        match (new, old) {
            (Err(a), Err(b))
                if a.code() == Code::Unimplemented && b.code() == Code::Unimplemented => {}
            (Ok(new), Ok(old)) => {
                let new = new.into_inner().node_group_autoscaling_options;
                let old = old.into_inner().node_group_autoscaling_options;
                let (Some(new), Some(old)) = (new, old) else {
                    return fail(format!("group {id:?}: options answered empty"));
                };
                let seconds = |d: Option<prost_types::Duration>| d.map(|d| d.seconds);
                let legacy_seconds =
                    |d: Option<k8s_pb::apimachinery::pkg::apis::meta::v1::Duration>| {
                        d.and_then(|d| d.duration).map(|n| n / 1_000_000_000)
                    };
                let from_new = [
                    seconds(new.scale_down_unneeded_duration),
                    seconds(new.scale_down_unready_duration),
                    seconds(new.max_node_provision_duration),
                ];
                let from_old = [
                    legacy_seconds(old.scale_down_unneeded_time),
                    legacy_seconds(old.scale_down_unready_time),
                    legacy_seconds(old.max_node_provision_time),
                ];
                if from_old.contains(&None) || from_new.contains(&None) {
                    return fail(format!(
                        "group {id:?}: options without every duration: {from_new:?} (1.35 on), {from_old:?} (before)"
                    ));
                }
                if from_new != from_old {
                    return fail(format!(
                        "group {id:?}: the wire formats answer other options: {from_new:?} and {from_old:?}"
                    ));
                }
            }
            (new, old) => {
                return fail(format!(
                    "group {id:?}: options differ by wire format: {new:?} and {old:?}"
                ));
            }
        }
    }
    Ok(Outcome::Pass)
}
