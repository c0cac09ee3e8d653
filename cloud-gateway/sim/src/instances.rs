//! The sim's instances: lookups by provider ID (`sim://<id>`) or name.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use ccm_provider::{Instances, Lookup, NodeRef, Operation, Result};

use super::{PROVIDER_ID_PREFIX, SimCloud, State};

impl SimCloud {
    pub(super) fn lookup(state: &State, node: &NodeRef) -> Lookup {
        let id = if node.provider_id.is_empty() {
            state.by_name.get(&node.name).cloned()
        } else {
            node.provider_id
                .strip_prefix(PROVIDER_ID_PREFIX)
                .map(str::to_owned)
        };
        match id.and_then(|id| state.instances.get(&id)) {
            Some(record) if record.running => Lookup::Running(record.to_instance()),
            Some(record) => Lookup::Shutdown(record.to_instance()),
            None => Lookup::NotFound,
        }
    }
}

#[async_trait]
impl Instances for SimCloud {
    async fn get_instances(&self, nodes: &[NodeRef]) -> Result<Vec<Lookup>> {
        let _call = self.enter(Operation::GetInstances).await?;
        self.looked_up
            .fetch_add(nodes.len() as u64, Ordering::Relaxed);
        let state = self.state();
        Ok(nodes
            .iter()
            .map(|node| Self::lookup(&state, node))
            .collect())
    }
}
