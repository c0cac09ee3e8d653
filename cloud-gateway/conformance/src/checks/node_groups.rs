//! Cluster Autoscaler's external gRPC cloud provider
//! (`clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider`), for a
//! gateway that offers node groups: the answers upstream's client relies on,
//! asked with the admin's token (the autoscaler itself comes in with a
//! client certificate, which the suite does not hold).

use ccm_proto::externalgrpc as ca;
use ccm_proto::externalgrpc::cloud_provider_client::CloudProviderClient;
use ccm_proto::v1::NodeRef;
use tonic::Code;

use crate::checks::fixtures::lookup;
use crate::context::{Context, no_node};
use crate::outcome::{Outcome, fail};

type Client = CloudProviderClient<ccm_proto::AuthorizedChannel>;

/// A client with the admin's token, or the skip of a run without one.
fn client(cx: &Context) -> Result<Result<Client, Outcome>, String> {
    let Ok(admin) = cx.client("admin") else {
        return Ok(Err(Outcome::Skip(
            "no admin token: the node group checks call as admin".into(),
        )));
    };
    let channel = admin.authorized_channel().map_err(|e| e.to_string())?;
    Ok(Ok(CloudProviderClient::new(channel)))
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
/// is UNIMPLEMENTED, which upstream's client reads as "not offered".
pub(crate) async fn pricing_unimplemented(cx: &Context) -> Result<Outcome, String> {
    let mut c = match client(cx)? {
        Ok(c) => c,
        Err(skip) => return Ok(skip),
    };
    match c
        .pricing_node_price(ca::PricingNodePriceRequest::default())
        .await
    {
        Err(s) if s.code() == Code::Unimplemented => Ok(Outcome::Pass),
        other => fail(format!("expected UNIMPLEMENTED, got {other:?}")),
    }
}
