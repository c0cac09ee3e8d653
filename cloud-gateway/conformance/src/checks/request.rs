//! Requests the gateway must refuse or cut short whatever the provider: a
//! malformed cluster name, bytes that are no message, a call past its
//! deadline.

use std::time::Duration;

use bytes::Bytes;
use ccm_proto::Error;
use ccm_proto::v1::{GetInstancesRequest, LookupPurpose, NodeRef};
use prost::Message as _;
use tonic::Code;

use crate::context::{Context, no_node};
use crate::outcome::{Outcome, fail};
use crate::wire::{GET_INSTANCES, call_with_deadline, raw_unary};

pub(crate) async fn malformed_cluster(cx: &Context) -> Result<Outcome, String> {
    let c = cx.target.client("node", "not a cluster/name")?;
    match c
        .get_instances(
            vec![NodeRef {
                name: "n".into(),
                provider_id: String::new(),
            }],
            LookupPurpose::Initialize,
            true,
        )
        .await
    {
        Err(Error::InvalidArgument { violations, .. })
            if violations.iter().any(|v| v.field == "cluster_name") =>
        {
            Ok(Outcome::Pass)
        }
        other => fail(format!(
            "expected INVALID_ARGUMENT naming cluster_name, got {other:?}"
        )),
    }
}

pub(crate) async fn undecodable(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("node")?;
    // Field 1 (cluster_name) claims 16 bytes; one follows.
    let garbage = Bytes::from_static(b"\x0a\x10a");
    match raw_unary(&c, GET_INSTANCES, garbage).await {
        Err(status) if status.code() == Code::InvalidArgument => {}
        other => {
            return fail(format!(
                "expected INVALID_ARGUMENT, got {:?}",
                other.map_err(|s| s.code())
            ));
        }
    }
    match c.provider_info().await {
        Ok(_) => Ok(Outcome::Pass),
        Err(e) => fail(format!("the gateway no longer answers: {e}")),
    }
}

pub(crate) async fn deadline(cx: &Context) -> Result<Outcome, String> {
    let hook = match &cx.hook {
        Ok(hook) => hook,
        Err(why) => return Ok(Outcome::Skip(why.clone())),
    };
    let Some(name) = &cx.node else {
        return Ok(no_node());
    };
    let before = hook
        .faults(|f| {
            f.latency.insert(
                "get_instances".into(),
                prost_types::Duration {
                    seconds: 3,
                    nanos: 0,
                },
            );
        })
        .await?;
    let token = cx
        .target
        .tokens
        .get("node")
        .ok_or("no token for the node role")?;
    let request = GetInstancesRequest {
        cluster_name: cx.target.cluster.clone(),
        nodes: vec![NodeRef {
            name: name.clone(),
            provider_id: String::new(),
        }],
        fresh: true,
        purpose: LookupPurpose::Lifecycle as i32,
        ..Default::default()
    };
    let deadline = Duration::from_millis(500);
    let answer = call_with_deadline(
        &cx.target.address,
        cx.target.tls_ca.as_deref(),
        token,
        GET_INSTANCES,
        &request.encode_to_vec(),
        deadline,
    )
    .await;
    hook.set_faults(before).await?;
    match answer? {
        (Code::DeadlineExceeded, waited) if waited < deadline * 4 => Ok(Outcome::Pass),
        (code, waited) => fail(format!(
            "expected DEADLINE_EXCEEDED at the deadline of {deadline:?} (the call takes 3 s), got {code:?} after {waited:?}"
        )),
    }
}
