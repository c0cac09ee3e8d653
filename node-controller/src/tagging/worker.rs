//! The tagging controller's two workers: one tags the instances of queued
//! Nodes, the other untags those of deleted ones (see the parent module).

use std::collections::HashSet;
use std::sync::Arc;

use ccm_proto::v1::{NodeRef, TagResult};
use kube::api::{Patch, PatchParams};

use super::{LABEL, NEW_NODE_GRACE, Tagging};
use crate::context::Context;
use crate::metrics::ActionLabels;
use crate::plan::{NodeView, node_ref};

/// Tags the instances of queued Nodes, a batch at a time, while leading.
pub async fn tag_worker(ctx: Arc<Context>) {
    let Some(t) = &ctx.tagging else { return };
    while let Some(names) = t.tag.next_batch(ctx.settings.batch_size).await {
        let nodes: Vec<Arc<NodeView>> = names
            .iter()
            .filter_map(|n| ctx.store.get(n))
            .filter(|n| t.needs_tags(n))
            .collect();
        if !nodes.is_empty() && ctx.leadership.is_leader() {
            tag(&ctx, t, &nodes).await;
        }
        for name in &names {
            t.tag.done(name);
        }
    }
}

async fn tag(ctx: &Context, t: &Tagging, nodes: &[Arc<NodeView>]) {
    let refs: Vec<NodeRef> = nodes.iter().map(|n| node_ref(n)).collect();
    let tags = t.tags.clone().into_iter().collect();
    let results = match ctx.gateway.tag_instances(refs, tags, false).await {
        Ok(results) => results,
        Err(e) => {
            for node in nodes {
                let retry_in = t.tag.add_failed(node.name.clone());
                tracing::warn!(node = %node.name.clone(), error = %e, ?retry_in, "instance tags not set");
            }
            count(ctx, "failed", nodes.len());
            return;
        }
    };
    for (node, result) in nodes.iter().zip(results) {
        let name = node.name.clone();
        match result {
            TagResult::Done => match label(ctx, &name, &t.checksum).await {
                Ok(()) => {
                    t.tag.forget(&name);
                    count(ctx, "tagged", 1);
                    tracing::info!(node = %name, tags = ?t.tags, "instance tagged");
                }
                Err(e) => {
                    let retry_in = t.tag.add_failed(name.clone());
                    tracing::warn!(node = %name, error = %e, ?retry_in, "tagged, but the Node's label not written");
                }
            },
            TagResult::NotFound if is_new(node) => {
                t.tag.add_failed(name);
            }
            TagResult::NotFound => {
                t.settle(node);
                t.tag.forget(&name);
                count(ctx, "not_found", 1);
                tracing::info!(node = %name, "no instance to tag");
            }
            _ => {
                t.settle(node);
                t.tag.forget(&name);
                count(ctx, "not_taggable", 1);
            }
        }
    }
}

/// Takes the tags off the instances of deleted Nodes, a batch at a time.
pub async fn untag_worker(ctx: Arc<Context>) {
    let Some(t) = &ctx.tagging else { return };
    while let Some(ids) = t.untag.next_batch(ctx.settings.batch_size).await {
        // A Node deleted and registered again on the same instance keeps
        // its tags: only instances no Node has any more lose them.
        let held: HashSet<String> = ctx
            .store
            .state()
            .iter()
            .map(|n| node_ref(n).provider_id)
            .collect();
        let gone: Vec<String> = ids
            .iter()
            .filter(|id| !held.contains(*id))
            .cloned()
            .collect();
        if !gone.is_empty() && ctx.leadership.is_leader() {
            untag(&ctx, t, &gone).await;
        }
        for id in &ids {
            t.untag.done(id);
        }
    }
}

async fn untag(ctx: &Context, t: &Tagging, ids: &[String]) {
    let refs = ids
        .iter()
        .map(|id| NodeRef {
            name: String::new(),
            provider_id: id.clone(),
        })
        .collect();
    let tags = t.tags.clone().into_iter().collect();
    match ctx.gateway.tag_instances(refs, tags, true).await {
        Ok(_) => {
            for id in ids {
                t.untag.forget(id);
            }
            count(ctx, "untagged", ids.len());
        }
        Err(e) => {
            for id in ids {
                let retry_in = t.untag.add_failed(id.clone());
                tracing::warn!(provider_id = %id, error = %e, ?retry_in, "instance tags not removed");
            }
            count(ctx, "failed", ids.len());
        }
    }
}

/// Labels the Node with the tags' checksum.
async fn label(ctx: &Context, name: &str, checksum: &str) -> crate::error::Result<()> {
    ctx.ensure_leader()?;
    let patch = serde_json::json!({"metadata": {"labels": {LABEL: checksum}}});
    let manager = ccm_runtime::names::MANAGER_NODE_CONTROLLER;
    ctx.nodes
        .patch(name, &PatchParams::apply(manager), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn is_new(node: &NodeView) -> bool {
    node.created.is_none_or(|created| {
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(created);
        age.as_secs() < NEW_NODE_GRACE.as_secs() as i64
    })
}

fn count(ctx: &Context, action: &'static str, n: usize) {
    ctx.metrics
        .instance_tags
        .get_or_create(&ActionLabels { action })
        .inc_by(n as u64);
}
