//! What Cluster Autoscaler reads, from memory: one snapshot of the node
//! groups and their instances, renewed by a `Refresh` at most once per
//! interval however many callers ask (several autoscaler replicas, each
//! asking every loop), one renewal at a time. Node lookups by provider ID
//! are a map. A change the gateway made is written into the snapshot at
//! once, so the next read sees the target it just set, and the next
//! `Refresh` lists again whatever the snapshot's age, to see what the
//! cloud made of it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider::node_groups::NodeGroup;
use ccm_provider::{Operation, Result};

use super::Cloud;
use super::budget::Priority;

/// The node groups as last listed.
#[derive(Debug)]
pub struct Snapshot {
    pub groups: Vec<NodeGroup>,
    /// Group index by group id.
    by_id: HashMap<String, usize>,
    /// Group index by instance provider ID.
    by_instance: HashMap<String, usize>,
    taken: Instant,
    /// The gateway changed the cloud since it was taken.
    stale: bool,
}

impl Snapshot {
    fn new(groups: Vec<NodeGroup>) -> Self {
        let by_id = groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.id.clone(), i))
            .collect();
        let by_instance = groups
            .iter()
            .enumerate()
            .flat_map(|(i, g)| g.instances.iter().map(move |n| (n.provider_id.clone(), i)))
            .collect();
        Self {
            groups,
            by_id,
            by_instance,
            taken: Instant::now(),
            stale: false,
        }
    }

    /// The group `id`.
    pub fn group(&self, id: &str) -> Option<&NodeGroup> {
        self.by_id.get(id).map(|&i| &self.groups[i])
    }

    /// The group whose instance `provider_id` is.
    pub fn group_of(&self, provider_id: &str) -> Option<&NodeGroup> {
        self.by_instance.get(provider_id).map(|&i| &self.groups[i])
    }
}

/// The snapshots of one cluster's node groups.
pub struct NodeGroupSnapshots {
    cluster: String,
    /// How old a snapshot must be before a `Refresh` renews it.
    min_age: Duration,
    current: Mutex<Option<Arc<Snapshot>>>,
    /// Held while a renewal runs: callers wait for it rather than list
    /// again.
    renewing: tokio::sync::Mutex<()>,
}

impl NodeGroupSnapshots {
    /// Snapshots of `cluster`'s groups, renewed at most every `min_age`.
    pub fn new(cluster: String, min_age: Duration) -> Self {
        Self {
            cluster,
            min_age,
            current: Mutex::new(None),
            renewing: tokio::sync::Mutex::new(()),
        }
    }

    /// The cluster whose groups these are.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    fn current(&self) -> Option<Arc<Snapshot>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The snapshot, listing the groups first when there is none yet.
    pub async fn get(&self, cloud: &Cloud) -> Result<Arc<Snapshot>> {
        match self.current() {
            Some(snapshot) => Ok(snapshot),
            None => self.renew(cloud, |_| false).await,
        }
    }

    /// Renews the snapshot unless it is younger than the interval and the
    /// gateway changed nothing since (a `Refresh`); concurrent callers
    /// share one listing.
    pub async fn refresh(&self, cloud: &Cloud) -> Result<Arc<Snapshot>> {
        let min_age = self.min_age;
        self.renew(cloud, |s| !s.stale && s.taken.elapsed() < min_age)
            .await
    }

    async fn renew(
        &self,
        cloud: &Cloud,
        fresh: impl Fn(&Arc<Snapshot>) -> bool,
    ) -> Result<Arc<Snapshot>> {
        if let Some(snapshot) = self.current().filter(&fresh) {
            return Ok(snapshot);
        }
        let _renewing = self.renewing.lock().await;
        // Renewed by another caller while this one waited.
        if let Some(snapshot) = self.current().filter(&fresh) {
            return Ok(snapshot);
        }
        let groups = cloud
            .node_groups()?
            .call(Operation::ListNodeGroups, Priority::Normal, None, |g| {
                g.list(&self.cluster)
            })
            .await?;
        let snapshot = Arc::new(Snapshot::new(groups));
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
        Ok(snapshot)
    }

    /// Writes a change the gateway made into the snapshot: `change` gets
    /// the group `id`, and the lookups are rebuilt.
    pub fn amend(&self, id: &str, change: impl FnOnce(&mut NodeGroup)) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let Some(old) = current.as_ref() else {
            return;
        };
        let mut groups = old.groups.clone();
        if let Some(group) = groups.iter_mut().find(|g| g.id == id) {
            change(group);
        }
        let taken = old.taken;
        let mut snapshot = Snapshot::new(groups);
        snapshot.taken = taken;
        snapshot.stale = true;
        *current = Some(Arc::new(snapshot));
    }
}
