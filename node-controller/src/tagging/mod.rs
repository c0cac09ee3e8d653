//! The tagging controller, as cloud-provider-aws runs it (off by default):
//! with `--instance-tags`, the instance behind every Node carries those
//! tags. A Node whose instance is tagged carries the label
//! `k8s.io/cloud-provider-aws` with a checksum of the tags, upstream's
//! label and checksum, so the Nodes upstream tagged are not tagged again
//! after a switch and a change of the tags tags every instance again. When
//! a Node goes, its instance's tags go too (each only while it still has
//! the value given), unless a Node registered again on it. Instances are
//! tagged in batches through the gateway, at its low priority; only the
//! leader tags. The decisions are `plan`'s (`needs_tags`, `tags_text`);
//! the work is `worker`'s.

pub mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use ccm_runtime::queue::{Backoff, WorkQueue};
use md5::{Digest, Md5};

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
