//! The tagging controller, as cloud-provider-aws runs it (off by default):
//! with `--instance-tags`, the instance behind every Node carries those
//! tags. A Node whose instance is tagged carries the label
//! `k8s.io/cloud-provider-aws` with a checksum of the tags, upstream's
//! label and checksum, so the Nodes upstream tagged are not tagged again
//! after a switch and a change of the tags tags every instance again. When
//! a Node goes, its instance's tags go too (each only while it still has
//! the value given), unless a Node registered again on it. Instances are
//! tagged in batches through the gateway, at its low priority; only the
//! leader tags. The decisions are `plan`'s (`needs_tags`, `tags_text`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_proto::v1::{NodeRef, TagResult};
use ccm_runtime::queue::{Backoff, WorkQueue};
use kube::api::{Patch, PatchParams};
use md5::{Digest, Md5};

use crate::context::{Context, node_ref};
use crate::metrics::ActionLabels;
use crate::plan::{self, NodeView};

/// The label of a Node whose instance has the tags: their checksum.
pub use ccm_runtime::names::LABEL_INSTANCE_TAGS as LABEL;

/// How long a new Node's instance may be missing (EC2 is eventually
/// consistent) before it is given up on, as upstream waits.
const NEW_NODE_GRACE: Duration = Duration::from_secs(300);

/// Failed batches retry after 5 s, doubling up to 5 minutes, as upstream's.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(5),
    max: Duration::from_secs(300),
};

/// The tags to give, their checksum, and the work waiting.
pub struct Tagging {
    pub tags: BTreeMap<String, String>,
    pub checksum: String,
    /// Nodes (by name) whose instance needs the tags.
    pub tag: WorkQueue<String>,
    /// Provider IDs of deleted Nodes whose instance loses them.
    pub untag: WorkQueue<String>,
    /// Nodes (name to provider ID) whose instance cannot carry the tags
    /// (none, or not taggable): not asked about again while they keep that
    /// provider ID, however often the Node is written.
    settled: Mutex<HashMap<String, String>>,
}

impl Tagging {
    /// Tagging with `tags`; `None` when there are none (the default: off).
    pub fn new(tags: &BTreeMap<String, String>) -> Option<Self> {
        (!tags.is_empty()).then(|| Self {
            tags: tags.clone(),
            checksum: checksum(tags),
            tag: WorkQueue::new(BACKOFF),
            untag: WorkQueue::new(BACKOFF),
            settled: Mutex::default(),
        })
    }

    /// Whether `node`'s instance is still to be tagged.
    pub fn needs_tags(&self, node: &NodeView) -> bool {
        let settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        plan::needs_tags(
            &node.provider_id,
            node.label(LABEL),
            &self.checksum,
            settled.get(&node.name),
        )
    }

    /// Remembers that `node`'s instance cannot carry the tags.
    fn settle(&self, node: &NodeView) {
        let mut settled = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        settled.insert(node.name.clone(), node.provider_id.clone());
    }

    /// Forgets the Node `name`, which went.
    pub fn forget(&self, name: &str) {
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        self.tag.forget(&name.to_owned());
    }
}

/// Upstream's checksum of the tags: the MD5 of [`plan::tags_text`], in hex.
pub fn checksum(tags: &BTreeMap<String, String>) -> String {
    Md5::digest(plan::tags_text(tags).as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_is_upstreams() {
        let tags: BTreeMap<String, String> = [("cost-center", "42"), ("team", "ml")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // md5 -s "cost-center=42,team=ml"
        assert_eq!(checksum(&tags), "b34667e1bd6e920c3a33bbbae36f8328");
    }
}
