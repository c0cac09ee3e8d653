//! The serving CSR approver's worker: decides the queued CSRs while
//! leading (see the parent module).

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_proto::v1::{InstanceState, LookupPurpose, NodeRef};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use super::{ServingCsrs, is_pending};
use crate::context::Context;
use crate::csr::{self, Denial, Request};
use crate::metrics::CsrLabels;
use crate::plan::{NodeView, node_ref};

/// Decides the queued CSRs, a batch at a time, while leading.
pub async fn worker(ctx: Arc<Context>) {
    let Some(c) = &ctx.csrs else { return };
    while let Some(names) = c.queue.next_batch(ctx.settings.batch_size).await {
        if ctx.leadership.is_leader() {
            let pending: Vec<Arc<CertificateSigningRequest>> = names
                .iter()
                .filter_map(|n| c.store.get(&ObjectRef::new(n)))
                .filter(|csr| is_pending(csr))
                .collect();
            decide(&ctx, c, &pending).await;
        }
        for name in &names {
            c.queue.done(name);
        }
    }
}

/// What became of one CSR.
enum Outcome {
    Approve(String),
    Deny(Denial),
    Wait(String),
}

async fn decide(ctx: &Context, c: &ServingCsrs, pending: &[Arc<CertificateSigningRequest>]) {
    // Each on its own first; those that pass need their node's instance.
    let mut outcomes: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut asking: Vec<(String, Request, Arc<NodeView>)> = Vec::new();
    for req in pending {
        let name = req.name_any();
        let spec = &req.spec;
        let groups = spec.groups.clone().unwrap_or_default();
        let usages = spec.usages.clone().unwrap_or_default();
        let examined = csr::examine(csr::Spec {
            username: spec.username.as_deref().unwrap_or_default(),
            groups: &groups,
            usages: &usages,
            request: &spec.request.0,
        });
        match examined {
            Err(denial) => {
                outcomes.insert(name, Outcome::Deny(denial));
            }
            Ok(request) => match ctx.store.get(&request.node) {
                Some(node) => asking.push((name, request, node)),
                None => {
                    let why = format!("node {} is not registered (yet)", request.node);
                    outcomes.insert(name, Outcome::Wait(why));
                }
            },
        }
    }
    if !asking.is_empty() {
        let refs: Vec<NodeRef> = asking.iter().map(|(_, _, n)| node_ref(n)).collect();
        // A fresh answer: the cache must never approve a certificate.
        match ctx
            .lookup(refs, LookupPurpose::Initialize, true, false)
            .await
        {
            Ok(results) => {
                for ((name, request, node), result) in asking.into_iter().zip(results) {
                    let state =
                        InstanceState::try_from(result.state).unwrap_or(InstanceState::Unspecified);
                    let provider_id = node_ref(&node).provider_id;
                    let outcome = match state {
                        InstanceState::Unspecified => {
                            Outcome::Wait("the cloud gave no state".into())
                        }
                        _ => match csr::against_instance(
                            &request,
                            &provider_id,
                            state,
                            result.instance.as_ref(),
                        ) {
                            Ok(()) => Outcome::Approve(format!(
                                "node {}'s instance {provider_id} has every address and name asked for",
                                request.node
                            )),
                            Err(denial) => Outcome::Deny(denial),
                        },
                    };
                    outcomes.insert(name, outcome);
                }
            }
            Err(e) => {
                for (name, _, _) in asking {
                    outcomes.insert(
                        name,
                        Outcome::Wait(format!("the cloud did not answer: {e}")),
                    );
                }
            }
        }
    }
    for req in pending {
        let name = req.name_any();
        let Some(outcome) = outcomes.remove(&name) else {
            continue;
        };
        settle(ctx, c, req, outcome).await;
    }
}

async fn settle(ctx: &Context, c: &ServingCsrs, req: &CertificateSigningRequest, outcome: Outcome) {
    let name = req.name_any();
    let (kind, reason, message) = match &outcome {
        Outcome::Wait(why) => {
            let retry_in = c.queue.add_failed(name.clone());
            count(ctx, "waiting", "Waiting");
            tracing::info!(csr = %name, ?retry_in, "kubelet serving CSR waits: {why}");
            return;
        }
        Outcome::Approve(why) => ("Approved", "CloudVerified", why.clone()),
        Outcome::Deny(d) => ("Denied", d.reason, d.message.clone()),
    };
    match write_decision(ctx, c, req, kind, reason, &message).await {
        Ok(()) => {
            c.queue.forget(&name);
            let decision = if kind == "Approved" {
                "approved"
            } else {
                "denied"
            };
            count(ctx, decision, reason);
            tracing::info!(csr = %name, decision, reason, "kubelet serving CSR {decision}: {message}");
            let event = Event {
                type_: if kind == "Approved" {
                    EventType::Normal
                } else {
                    EventType::Warning
                },
                reason: format!("CertificateSigningRequest{kind}"),
                note: Some(message),
                action: kind.to_owned(),
                secondary: None,
            };
            // One decision per request: no series to keep for it.
            let reference = req.object_ref(&());
            let _ = ccm_runtime::controller::publish_once(
                &ctx.client,
                &ctx.reporter,
                &event,
                &reference,
            )
            .await;
        }
        Err(e) => {
            let retry_in = c.queue.add_failed(name.clone());
            tracing::warn!(csr = %name, error = %e, ?retry_in, "kubelet serving CSR decision not written");
        }
    }
}

/// Writes the decision through the `approval` subresource, against the
/// version read (a CSR changed meanwhile is judged again).
async fn write_decision(
    ctx: &Context,
    c: &ServingCsrs,
    req: &CertificateSigningRequest,
    kind: &str,
    reason: &str,
    message: &str,
) -> crate::error::Result<()> {
    ctx.ensure_leader()?;
    let mut updated = req.clone();
    let status = updated.status.get_or_insert_with(Default::default);
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: kind.to_owned(),
            status: "True".to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    c.api
        .replace_subresource::<CertificateSigningRequest>(
            "approval",
            &req.name_any(),
            &PostParams::default(),
            &updated,
        )
        .await?;
    Ok(())
}

fn count(ctx: &Context, decision: &'static str, reason: &'static str) {
    ctx.metrics
        .serving_csrs
        .get_or_create(&CsrLabels { decision, reason })
        .inc();
}
