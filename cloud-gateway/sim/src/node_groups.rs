//! The sim's node groups, as an Auto Scaling group behaves: the cloud
//! keeps a group's instances at its target, making new ones (each takes
//! [`NEW_INSTANCE_TIME`] to be made, and its name is `<group>-<number>`)
//! and removing the youngest first when the target drops. Deleting named
//! instances follows Cluster Autoscaler's AWS provider on an Auto Scaling
//! group: failed launches (placeholders) bring the target down to the
//! instances the group holds, then each named instance goes with the
//! target one lower, until the one that would take the group below its
//! minimum, which is refused (those before it stay deleted, as AWS
//! terminates them one call at a time). A failed launch carries upstream's
//! `placeholder-cannot-be-fulfilled`, as the AWS provider reports one.
//! Groups live in the state database with everything else.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use ccm_provider::node_groups::{
    GroupInstance, GroupInstanceState, GroupOptions, InstanceError, InstanceErrorClass, NodeGroup,
    NodeGroups, NodeTemplate, Taint, UNFULFILLABLE,
};
use ccm_provider::{CloudError, Operation, Result};

use crate::store::{FailedLaunch, InstanceRecord, NodeGroupRecord};
use crate::{NewInstance, PROVIDER_ID_PREFIX, SimCloud, State, now_ms};

/// How long a node group's new instance takes to be made.
pub const NEW_INSTANCE_TIME: Duration = Duration::from_secs(3);

/// The label that marks the sim's GPU nodes and names their type.
pub const GPU_LABEL: &str = "sim.cloudgateway.io/accelerator";

fn invalid(field: &str, problem: String) -> CloudError {
    CloudError::InvalidArgument(vec![(field.to_owned(), problem)])
}

/// What an instance type offers: `sim.<family>-<cpus>` has that many CPUs
/// and 4 GiB of memory each; `gpu` families one GPU.
pub fn capacity(instance_type: &str) -> std::collections::BTreeMap<String, String> {
    let cpus: u32 = instance_type
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let mut out = std::collections::BTreeMap::from([
        ("cpu".to_owned(), cpus.to_string()),
        ("memory".to_owned(), format!("{}Gi", cpus * 4)),
        ("pods".to_owned(), "110".to_owned()),
    ]);
    if instance_type.contains("gpu") {
        out.insert("nvidia.com/gpu".to_owned(), "1".to_owned());
    }
    out
}

impl SimCloud {
    /// Creates a node group and its first instances (`target_size` of
    /// them).
    pub fn create_node_group(&self, mut group: NodeGroupRecord) -> Result<NodeGroupRecord> {
        let mut problems = Vec::new();
        if group.id.is_empty() {
            problems.push(("id".to_owned(), "must not be empty".to_owned()));
        }
        if !(group.min_size <= group.target_size && group.target_size <= group.max_size) {
            problems.push((
                "target_size".to_owned(),
                format!(
                    "must be within min {} and max {}, not {}",
                    group.min_size, group.max_size, group.target_size
                ),
            ));
        }
        if let Some(zone) = group.zones.iter().find(|z| !self.config.zones.contains(z)) {
            problems.push((
                "zones".to_owned(),
                format!("{zone:?} is not a zone of the sim"),
            ));
        }
        if !problems.is_empty() {
            return Err(CloudError::InvalidArgument(problems));
        }
        if group.zones.is_empty() {
            group.zones = self.config.zones.clone();
        }
        if group.instance_type.is_empty() {
            group.instance_type = self.config.default_instance_type.clone();
        }
        let mut state = self.state();
        if state
            .store
            .node_groups()?
            .iter()
            .any(|g| g.cluster == group.cluster && g.id == group.id)
        {
            return Err(CloudError::Conflict(format!(
                "node group {:?} exists",
                group.id
            )));
        }
        state.store.put_node_group(&group)?;
        self.converge(&mut state, &mut group, &mut Vec::new())?;
        Ok(group)
    }

    /// Every node group, of every cluster, each with its instances' names.
    pub fn node_groups(&self) -> Result<Vec<(NodeGroupRecord, Vec<String>)>> {
        let mut state = self.state();
        let mut by_group = Self::members_by_group(&state)?;
        let mut out = Vec::new();
        for mut group in state.store.node_groups()? {
            let mut members = by_group.remove(&group.id).unwrap_or_default();
            self.converge(&mut state, &mut group, &mut members)?;
            out.push((group, members.into_iter().map(|i| i.name).collect()));
        }
        Ok(out)
    }

    /// Every node group as stored, of every cluster: a read, which makes
    /// or removes no instance.
    pub fn node_group_records(&self) -> Result<Vec<NodeGroupRecord>> {
        self.state().store.node_groups()
    }

    /// The cluster's group `id`.
    fn group_record(state: &State, cluster: &str, id: &str) -> Result<NodeGroupRecord> {
        state
            .store
            .node_groups()?
            .into_iter()
            .find(|g| g.cluster == cluster && g.id == id)
            .ok_or_else(|| CloudError::NotFound(format!("node group {id:?}")))
    }

    fn members(state: &State, group: &NodeGroupRecord) -> Result<Vec<InstanceRecord>> {
        Ok(state
            .store
            .instances()?
            .into_iter()
            .filter(|i| i.group.as_deref() == Some(&group.id))
            .collect())
    }

    /// Every group's instances, from one read of the instances, so that
    /// listing the groups costs one pass however many there are.
    fn members_by_group(state: &State) -> Result<HashMap<String, Vec<InstanceRecord>>> {
        let mut out: HashMap<String, Vec<InstanceRecord>> = HashMap::new();
        for instance in state.store.instances()? {
            if let Some(group) = instance.group.clone() {
                out.entry(group).or_default().push(instance);
            }
        }
        Ok(out)
    }

    /// Makes or removes instances until the group holds its target, as an
    /// Auto Scaling group does: a new instance goes to the next of the
    /// group's zones that has capacity; with none, the launch fails and
    /// its placeholder counts in the target until its zone has capacity
    /// again. Failed launches go first when the target falls, then the
    /// youngest instances. `members` are the group's instances, and are
    /// left as they are afterwards.
    fn converge(
        &self,
        state: &mut State,
        group: &mut NodeGroupRecord,
        members: &mut Vec<InstanceRecord>,
    ) -> Result<()> {
        let exhausted = self.faults().capacity_exhausted_zones;
        let before = (group.failed.clone(), group.next_failed);
        group.failed.retain(|f| exhausted.contains(&f.zone));
        let target = group.target_size as usize;
        while members.len() + group.failed.len() < target {
            let n = state
                .counters
                .get(crate::COUNTER_INSTANCE)
                .copied()
                .unwrap_or(1);
            let first = n as usize % group.zones.len();
            let zone = (0..group.zones.len())
                .map(|k| &group.zones[(first + k) % group.zones.len()])
                .find(|z| !exhausted.contains(*z))
                .cloned();
            let Some(zone) = zone else {
                group.failed.push(FailedLaunch {
                    id: format!("{}-failed-{}", group.id, group.next_failed),
                    zone: group.zones[first].clone(),
                });
                group.next_failed += 1;
                continue;
            };
            let created = self.create_instance_in(
                state,
                NewInstance {
                    name: format!("{}-{n}", group.id),
                    instance_type: group.instance_type.clone(),
                    zone,
                    addresses: Vec::new(),
                    labels: group.labels.clone(),
                },
                Some((&group.id, now_ms() + NEW_INSTANCE_TIME.as_millis() as u64)),
            )?;
            members.push(created);
        }
        // The youngest (highest number) go first.
        members.sort_by(|a, b| a.id.cmp(&b.id));
        while members.len() + group.failed.len() > target {
            if group.failed.pop().is_some() {
                continue;
            }
            let gone = members.pop().expect("more than the target");
            state.remove_instance(&gone.id)?;
        }
        if (group.failed.clone(), group.next_failed) != before {
            state.store.put_node_group(group)?;
        }
        Ok(())
    }

    fn to_group(&self, group: &NodeGroupRecord, members: &[InstanceRecord]) -> NodeGroup {
        let now = now_ms();
        let instances = members
            .iter()
            .map(|i| GroupInstance {
                provider_id: i.provider_id(),
                state: if i.ready_at_ms.is_some_and(|at| at > now) {
                    GroupInstanceState::Creating
                } else {
                    GroupInstanceState::Running
                },
                error: None,
            })
            .chain(group.failed.iter().map(|f| GroupInstance {
                provider_id: format!("{PROVIDER_ID_PREFIX}{}", f.id),
                state: GroupInstanceState::Creating,
                error: Some(InstanceError {
                    class: InstanceErrorClass::OutOfResources,
                    code: UNFULFILLABLE.to_owned(),
                    message: format!(
                        "the sim cannot provision any more instances for this node group: zone {} has no capacity for {}",
                        f.zone, group.instance_type
                    ),
                }),
            }))
            .collect();
        NodeGroup {
            id: group.id.clone(),
            min_size: group.min_size,
            max_size: group.max_size,
            target_size: group.target_size,
            instances,
            template: Ok(NodeTemplate {
                instance_type: group.instance_type.clone(),
                zones: group.zones.clone(),
                region: self.config.region.clone(),
                capacity: capacity(&group.instance_type),
                labels: group.labels.clone(),
                taints: group
                    .taints
                    .iter()
                    .map(|(key, value, effect)| Taint {
                        key: key.clone(),
                        value: value.clone(),
                        effect: effect.clone(),
                    })
                    .collect(),
            }),
            options: {
                // Checked when the group was made.
                let mut options = GroupOptions::default();
                for (name, value) in &group.options {
                    let _ = options.set(name, value);
                }
                options
            },
        }
    }
}

#[async_trait]
impl NodeGroups for SimCloud {
    async fn list(&self, cluster: &str) -> Result<Vec<NodeGroup>> {
        let _call = self.enter(Operation::ListNodeGroups).await?;
        let mut state = self.state();
        let mut by_group = Self::members_by_group(&state)?;
        let mut out = Vec::new();
        for mut group in state.store.node_groups()? {
            if group.cluster == cluster {
                let mut members = by_group.remove(&group.id).unwrap_or_default();
                // Failed launches are tried again as zones get capacity.
                self.converge(&mut state, &mut group, &mut members)?;
                out.push(self.to_group(&group, &members));
            }
        }
        Ok(out)
    }

    async fn set_target_size(&self, cluster: &str, group: &str, size: u32) -> Result<()> {
        let _call = self.enter(Operation::SetNodeGroupSize).await?;
        let mut state = self.state();
        let mut record = Self::group_record(&state, cluster, group)?;
        if !(record.min_size..=record.max_size).contains(&size) {
            return Err(invalid(
                "size",
                format!(
                    "{size} is outside node group {group:?}'s bounds {}..={}",
                    record.min_size, record.max_size
                ),
            ));
        }
        record.target_size = size;
        state.store.put_node_group(&record)?;
        let mut members = Self::members(&state, &record)?;
        self.converge(&mut state, &mut record, &mut members)
    }

    async fn delete_instances(
        &self,
        cluster: &str,
        group: &str,
        provider_ids: &[String],
    ) -> Result<()> {
        let _call = self.enter(Operation::DeleteGroupInstances).await?;
        let mut state = self.state();
        let mut record = Self::group_record(&state, cluster, group)?;
        let members = Self::members(&state, &record)?;
        let failed_prefix = format!("{group}-failed-");
        let (mut doomed, mut placeholders) = (Vec::new(), false);
        for id in provider_ids {
            let bare = id.strip_prefix(PROVIDER_ID_PREFIX).unwrap_or(id);
            if bare.starts_with(&failed_prefix) {
                placeholders = true;
                continue;
            }
            match members.iter().find(|m| m.id == bare) {
                Some(m) if !doomed.contains(&m.id) => doomed.push(m.id.clone()),
                Some(_) => {}
                None => {
                    return Err(invalid(
                        "provider_ids",
                        format!("{id:?} is not an instance of node group {group:?}"),
                    ));
                }
            }
        }
        // Placeholders: the target comes down to the instances the group
        // holds, which may not be below its minimum.
        if placeholders {
            let held = u32::try_from(members.len()).unwrap_or(u32::MAX);
            if held < record.min_size {
                return Err(invalid(
                    "provider_ids",
                    format!(
                        "a target of {held} would take node group {group:?} below its minimum {}",
                        record.min_size
                    ),
                ));
            }
            record.failed.clear();
            record.target_size = held;
        }
        let mut refused = None;
        for id in doomed {
            if record.target_size <= record.min_size {
                refused = Some(id);
                break;
            }
            state.remove_instance(&id)?;
            record.target_size -= 1;
        }
        state.store.put_node_group(&record)?;
        match refused {
            Some(id) => Err(invalid(
                "provider_ids",
                format!(
                    "deleting {id:?} would take node group {group:?} below its minimum {}",
                    record.min_size
                ),
            )),
            None => Ok(()),
        }
    }

    fn gpu_label(&self) -> &'static str {
        GPU_LABEL
    }

    fn gpu_types(&self) -> Vec<String> {
        vec!["sim.gpu-8".to_owned()]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{FaultSettings, SimConfig};

    fn group(min: u32, target: u32) -> NodeGroupRecord {
        NodeGroupRecord {
            cluster: "c".into(),
            id: "g".into(),
            min_size: min,
            max_size: 10,
            target_size: target,
            instance_type: "sim.standard-2".into(),
            zones: vec!["sim-zone-a".into()],
            labels: BTreeMap::new(),
            taints: Vec::new(),
            failed: Vec::new(),
            next_failed: 0,
            options: BTreeMap::new(),
        }
    }

    /// The group's instances' provider IDs, its failed launches' last.
    async fn members(sim: &SimCloud) -> (u32, Vec<String>) {
        let listed = sim.list("c").await.unwrap().remove(0);
        let ids = listed
            .instances
            .into_iter()
            .map(|i| i.provider_id)
            .collect();
        (listed.target_size, ids)
    }

    #[tokio::test]
    async fn deleting_goes_one_instance_at_a_time_until_the_minimum() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimCloud::open(dir.path(), SimConfig::default()).unwrap();
        sim.create_node_group(group(1, 3)).unwrap();
        let (_, ids) = members(&sim).await;
        let err = sim.delete_instances("c", "g", &ids).await.unwrap_err();
        // The first two went, as AWS terminates them; the last is refused.
        assert!(err.to_string().contains("below its minimum 1"), "{err}");
        assert_eq!(members(&sim).await, (1, ids[2..].to_vec()));
        // Another group's instance: refused before anything is deleted.
        let err = sim
            .delete_instances("c", "g", &["sim://i-999".to_owned()])
            .await
            .unwrap_err();
        assert!(matches!(err, CloudError::InvalidArgument(_)), "{err}");
        assert_eq!(members(&sim).await.1.len(), 1);
    }

    #[tokio::test]
    async fn deleting_a_failed_launch_lowers_the_target_to_the_instances_held() {
        let dir = tempfile::tempdir().unwrap();
        let sim = SimCloud::open(dir.path(), SimConfig::default()).unwrap();
        sim.create_node_group(group(0, 1)).unwrap();
        sim.set_faults(FaultSettings {
            capacity_exhausted_zones: ["sim-zone-a".to_owned()].into(),
            ..FaultSettings::default()
        });
        sim.set_target_size("c", "g", 3).await.unwrap();
        let listed = sim.list("c").await.unwrap().remove(0);
        let failed: Vec<_> = listed
            .instances
            .iter()
            .filter_map(|i| Some((i.provider_id.clone(), i.error.clone()?)))
            .collect();
        assert_eq!(failed.len(), 2, "{listed:?}");
        assert_eq!(failed[0].1.code, UNFULFILLABLE);
        assert_eq!(failed[0].1.class, InstanceErrorClass::OutOfResources);
        // One named, both gone: the target is the one instance made.
        sim.delete_instances("c", "g", &[failed[0].0.clone()])
            .await
            .unwrap();
        let (target, ids) = members(&sim).await;
        assert_eq!((target, ids.len()), (1, 1));
    }
}
