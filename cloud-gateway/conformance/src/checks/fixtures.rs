//! What several checks make or look up: a Service and its load balancer
//! spec, and the instance and backend host of a node.

use ccm_proto::GatewayClient;
use ccm_proto::v1::{
    Host, InstanceResult, LoadBalancerSpec, LookupPurpose, NodeRef, Protocol, ServicePort,
    ServiceRef,
};

use crate::target::Target;

/// A fresh Service uid, so that no two checks or runs share a resource.
pub(crate) fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The Service with `uid`, named after it.
pub(crate) fn service(uid: &str) -> ServiceRef {
    ServiceRef {
        namespace: "conformance".into(),
        name: format!("svc-{}", &uid[..8]),
        uid: uid.into(),
    }
}

/// A valid spec for the Service with `uid`: one TCP port.
pub(crate) fn spec(uid: &str) -> LoadBalancerSpec {
    spec_named(uid, "http", 80, 30080)
}

/// A valid spec for the Service with `uid`: one TCP port `name`, `port`
/// to `node_port`.
pub(crate) fn spec_named(uid: &str, name: &str, port: i32, node_port: i32) -> LoadBalancerSpec {
    LoadBalancerSpec {
        service: Some(service(uid)),
        ports: vec![ServicePort {
            name: name.into(),
            protocol: Protocol::Tcp as i32,
            port,
            node_port,
        }],
        ..Default::default()
    }
}

/// The one answer for `node`, fresh from the cloud.
pub(crate) async fn lookup(
    client: &GatewayClient,
    node: NodeRef,
) -> Result<InstanceResult, String> {
    let mut answers = client
        .get_instances(vec![node.clone()], LookupPurpose::Lifecycle, true)
        .await
        .map_err(|e| format!("look up {node:?}: {e}"))?;
    match answers.len() {
        1 => Ok(answers.remove(0)),
        n => Err(format!("{n} answers for one node")),
    }
}

/// The backend host a Service would get for the node `name`.
pub(crate) async fn host(target: &Target, name: &str) -> Result<Host, String> {
    let answer = lookup(
        &target.client("node", &target.cluster)?,
        NodeRef {
            name: name.to_owned(),
            provider_id: String::new(),
        },
    )
    .await?;
    let instance = answer
        .instance
        .ok_or_else(|| format!("node {name} has no instance ({:?})", answer.state))?;
    Ok(Host {
        name: name.to_owned(),
        provider_id: instance.provider_id,
        addresses: instance.addresses,
        labels: Default::default(),
        zone: instance.zone,
    })
}
