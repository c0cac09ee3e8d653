//! The sim's instances: lookups by provider ID (`sim://<id>`) or name.

use std::sync::atomic::Ordering;

use async_trait::async_trait;
use ccm_provider::{Instances, Lookup, NodeRef, Operation, Result};

use super::{PROVIDER_ID_PREFIX, SimCloud, State};

impl SimCloud {
    pub(super) fn lookup(state: &State, node: &NodeRef) -> Result<Lookup> {
        let record = if node.provider_id.is_empty() {
            state.store.instance_named(&node.name)?
        } else {
            match node.provider_id.strip_prefix(PROVIDER_ID_PREFIX) {
                Some(id) => state.store.instance(id)?,
                None => None,
            }
        };
        Ok(match record {
            Some(record) if record.running => Lookup::Running(record.to_instance()),
            Some(record) => Lookup::Shutdown(record.to_instance()),
            None => Lookup::NotFound,
        })
    }
}

#[async_trait]
impl Instances for SimCloud {
    async fn get_instances(&self, nodes: &[NodeRef]) -> Result<Vec<Lookup>> {
        let _call = self.enter(Operation::GetInstances).await?;
        self.looked_up
            .fetch_add(nodes.len() as u64, Ordering::Relaxed);
        let state = self.state();
        nodes
            .iter()
            .map(|node| Self::lookup(&state, node))
            .collect()
    }
}
