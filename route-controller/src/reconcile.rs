//! One reconcile: list the cloud's routes, plan against the cached nodes,
//! delete then create with bounded concurrency, and write each node's
//! `NetworkUnavailable` condition where it changed.

use std::collections::HashMap;
use std::time::Instant;

use ccm_proto::v1::{NodeAddress as CloudAddress, NodeAddressType, Route};
use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use serde_json::json;

use crate::context::Context;
use crate::error::{Result, RouteError};
use crate::metrics::ErrorLabels;
use crate::plan::{self, Create, NodeInfo};

const FIELD_MANAGER: &str = ccm_runtime::names::MANAGER_ROUTE_CONTROLLER;

/// Reconciles every route of the cluster once.
#[tracing::instrument(skip(ctx))]
pub async fn reconcile(ctx: &Context) -> Result<()> {
    let routes = ctx.gateway.list_routes().await?;
    let nodes: HashMap<String, std::sync::Arc<NodeInfo>> = ctx
        .store
        .state()
        .into_iter()
        .map(|n| (n.name.clone(), n))
        .collect();
    // The cached views themselves: no copy of every node per reconcile.
    let infos: Vec<&NodeInfo> = nodes.values().map(|n| n.as_ref()).collect();
    let plan = plan::plan(&infos, &routes, &ctx.settings.cluster_cidrs);
    ctx.ensure_leader()?;
    {
        // Remember when each missing route was first found missing; forget
        // those no longer wanted.
        let now = Instant::now();
        let mut missing = ctx.missing_since.lock().unwrap_or_else(|e| e.into_inner());
        missing.retain(|cidr, _| plan.create.iter().any(|c| &c.cidr == cidr));
        for create in &plan.create {
            missing.entry(create.cidr.clone()).or_insert(now);
        }
    }

    // Deletes first: a CIDR that moved between nodes must be free before
    // its new route is created.
    futures::stream::iter(plan.delete)
        .for_each_concurrent(ctx.settings.concurrency, |route| async move {
            delete(ctx, route).await;
        })
        .await;
    let failures: Vec<String> = futures::stream::iter(plan.create)
        .map(|create| async { create_route(ctx, &nodes, create).await })
        .buffer_unordered(ctx.settings.concurrency)
        .filter_map(|failed| async move { failed })
        .collect()
        .await;

    for (name, cidrs) in &plan.nodes {
        let Some(node) = nodes.get(name) else {
            continue;
        };
        let failed = failures.iter().filter(|f| *f == name).count();
        let (status, reason, message) = plan::condition(*cidrs, failed);
        let current = node.network.as_ref().map(|(s, r)| (s.as_str(), r.as_str()));
        if plan::condition_changed(current, (status, reason))
            && let Err(e) = write_condition(ctx, name, status, reason, message).await
        {
            tracing::warn!(node = %name, error = %e, "could not write the NetworkUnavailable condition");
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(RouteError::CreateFailed(failures.len()).into())
    }
}

async fn delete(ctx: &Context, route: Route) {
    if ctx.ensure_leader().is_err() {
        return;
    }
    let description = format!("{} -> {}", route.destination_cidr, route.target_node);
    match ctx.gateway.delete_route(route).await {
        Ok(()) => {
            ctx.metrics.routes_deleted.inc();
            tracing::info!(route = %description, "deleted route");
        }
        Err(e) => {
            ctx.metrics
                .route_errors
                .get_or_create(&ErrorLabels {
                    error: e.metric_label(),
                })
                .inc();
            tracing::warn!(route = %description, error = %e, "could not delete route");
        }
    }
}

/// Creates one route; returns the node's name if it failed.
async fn create_route(
    ctx: &Context,
    nodes: &HashMap<String, std::sync::Arc<NodeInfo>>,
    create: Create,
) -> Option<String> {
    if ctx.ensure_leader().is_err() {
        return Some(create.node);
    }
    let started = Instant::now();
    let route = Route {
        target_node: create.node.clone(),
        target_provider_id: create.provider_id.clone(),
        destination_cidr: create.cidr.clone(),
        target_node_addresses: create
            .addresses
            .iter()
            .map(|(kind, address)| CloudAddress {
                r#type: NodeAddressType::from_kubernetes_name(kind) as i32,
                address: address.clone(),
            })
            .filter(|a| a.r#type != NodeAddressType::Unspecified as i32)
            .collect(),
        ..Default::default()
    };
    match ctx.gateway.create_route(create.uid.clone(), route).await {
        Ok(_) => {
            ctx.metrics.routes_created.inc();
            let since = ctx
                .missing_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&create.cidr);
            if let Some(since) = since {
                ctx.metrics
                    .route_creation_delay
                    .observe(since.elapsed().as_secs_f64());
            }
            tracing::info!(node = %create.node, cidr = %create.cidr, "created route");
            None
        }
        Err(e) => {
            ctx.metrics
                .route_errors
                .get_or_create(&ErrorLabels {
                    error: e.metric_label(),
                })
                .inc();
            tracing::warn!(node = %create.node, cidr = %create.cidr, error = %e, "could not create route");
            if let Some(node) = nodes.get(&create.node) {
                let event = Event {
                    type_: EventType::Warning,
                    reason: "FailedToCreateRoute".into(),
                    note: Some(format!(
                        "Could not create route {} {} for node {} after {:?}: {e}",
                        create.uid,
                        create.cidr,
                        create.node,
                        started.elapsed()
                    )),
                    action: "CreateRoute".into(),
                    secondary: None,
                };
                if let Err(e) = ctx.recorder.publish(&event, &node.object_ref()).await {
                    tracing::warn!(error = %e, "could not publish event");
                }
            }
            Some(create.node)
        }
    }
}

/// Writes the node's `NetworkUnavailable` condition; conditions merge by
/// type, so the others are left alone.
async fn write_condition(
    ctx: &Context,
    name: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> Result<()> {
    ctx.ensure_leader()?;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }]}});
    ctx.nodes
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Strategic(patch),
        )
        .await?;
    Ok(())
}
