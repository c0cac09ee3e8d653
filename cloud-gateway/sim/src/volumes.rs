//! The sim's block volumes and their snapshots, as EBS has them: IDs like
//! AWS's, sizes in whole GiB, a volume in one zone attached to at most one
//! instance of that zone under a device name free there, snapshots ready
//! at once. Every volume and snapshot belongs to one cluster, and the
//! others never see it.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use ccm_provider::volumes::{
    AttachmentState, Snapshot, Volume, VolumeAttachment, VolumeOffer, VolumeSpec, VolumeState,
    ebs_device_names,
};
use ccm_provider::{CloudError, Operation, Result, Volumes};

use super::store::{InstanceRecord, SnapshotRecord, VolumeRecord};
use super::{COUNTER_SNAPSHOT, COUNTER_VOLUME, PROVIDER_ID_PREFIX, SimCloud, State, now_ms};

/// The CSI driver the sim's volumes belong to. It must never change:
/// PersistentVolumes name it, and a renamed driver orphans them.
pub const CSI_DRIVER: &str = "sim.csi.cloudgateway.io";

/// The Node label that names a node's zone in the topology of the sim's
/// CSI driver, written into every volume's accessible topology. It must
/// never change: PersistentVolumes keep it in their node affinity.
pub const TOPOLOGY_ZONE_KEY: &str = "topology.sim.cloudgateway.io/zone";

/// The well-known zone label, which the driver's topology also reads.
const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// The sim's unit of size: a volume is a whole number of GiB.
const GIB: i64 = 1 << 30;

/// Volumes read in one `get_many`, as EC2's DescribeVolumes filter takes.
const READS_PER_CALL: usize = 200;

/// The largest volume the sim makes, 16 TiB (EBS's largest of most types).
const MAX_SIZE_BYTES: i64 = 16 * 1024 * GIB;

/// The device name of every instance's own root disk.
const ROOT_DEVICE: &str = "/dev/xvda";

/// The one parameter the sim takes: the volume's type.
const TYPE_PARAMETER: &str = "type";

/// The volume types, the default first.
const VOLUME_TYPES: [&str; 2] = ["standard", "fast"];

/// A field path and what is wrong with it, as [`CloudError::none_of`]
/// takes them.
type Problem = (String, String);

/// What a volume spec asks for, once checked.
#[derive(Debug, PartialEq, Eq)]
struct Wanted {
    /// The size rounded up to whole GiB, in bytes.
    size_bytes: i64,
    /// The volume type.
    volume_type: String,
    /// The zones of `spec.zones` the sim has, preferred first.
    zones: Vec<String>,
}

/// Checks `spec` against the sim's rules, reporting every problem at once.
fn check_spec(spec: &VolumeSpec, sim_zones: &[String]) -> Result<Wanted> {
    let mut problems = Vec::new();
    let size_bytes = match round_size(spec.size_bytes, spec.limit_bytes) {
        Ok(size_bytes) => size_bytes,
        Err(problem) => {
            problems.push(problem);
            0
        }
    };
    let zones: Vec<String> = spec
        .zones
        .iter()
        .filter(|zone| sim_zones.contains(zone))
        .cloned()
        .collect();
    if !spec.zones.is_empty() && zones.is_empty() {
        problems.push((
            "zones".to_owned(),
            format!(
                "none of {} is a zone of the sim, which has {}",
                spec.zones.join(", "),
                sim_zones.join(", ")
            ),
        ));
    }
    // Mutable parameters (the type) are made with the volume, over the
    // class's.
    let mut parameters = spec.parameters.clone();
    for (key, value) in &spec.mutable_parameters {
        if key == TYPE_PARAMETER {
            parameters.insert(key.clone(), value.clone());
        } else {
            problems.push((
                format!("mutable_parameters[\"{key}\"]"),
                format!("the sim changes only {TYPE_PARAMETER:?}"),
            ));
        }
    }
    let volume_type = volume_type(&parameters, &mut problems);
    if !spec.source_snapshot_id.is_empty() && !spec.source_volume_id.is_empty() {
        problems.push((
            "source_volume_id".to_owned(),
            "a volume is made from a snapshot or from a volume, not from both".to_owned(),
        ));
    }
    CloudError::none_of(problems)?;
    Ok(Wanted {
        size_bytes,
        volume_type,
        zones,
    })
}

/// `size_bytes` rounded up to whole GiB, within the sim's largest volume
/// and `limit_bytes` (0 for no limit).
fn round_size(size_bytes: i64, limit_bytes: i64) -> std::result::Result<i64, Problem> {
    if size_bytes <= 0 {
        return Err((
            "size_bytes".to_owned(),
            format!("{size_bytes} is not more than 0"),
        ));
    }
    if size_bytes > MAX_SIZE_BYTES {
        return Err((
            "size_bytes".to_owned(),
            format!(
                "{size_bytes} bytes is more than the largest volume of the sim, 16 TiB ({MAX_SIZE_BYTES} bytes)"
            ),
        ));
    }
    let gib = (size_bytes + GIB - 1) / GIB;
    let rounded = gib * GIB;
    if limit_bytes > 0 && rounded > limit_bytes {
        return Err((
            "limit_bytes".to_owned(),
            format!(
                "{size_bytes} bytes rounds up to {gib} GiB ({rounded} bytes), the unit of the sim, which is more than the limit of {limit_bytes} bytes"
            ),
        ));
    }
    Ok(rounded)
}

/// The volume type `parameters` ask for; every parameter the sim does not
/// take is a problem.
fn volume_type(parameters: &BTreeMap<String, String>, problems: &mut Vec<Problem>) -> String {
    let mut volume_type = VOLUME_TYPES[0];
    for (key, value) in parameters {
        let field = format!("parameters[\"{key}\"]");
        if key != TYPE_PARAMETER {
            problems.push((
                field,
                format!("the sim takes no such parameter, only {TYPE_PARAMETER:?}"),
            ));
        } else if let Some(known) = VOLUME_TYPES.iter().find(|t| *t == value) {
            volume_type = known;
        } else {
            problems.push((
                field,
                format!(
                    "{value:?} is not a volume type of the sim, which has {}",
                    VOLUME_TYPES.join(", ")
                ),
            ));
        }
    }
    volume_type.to_owned()
}

/// The problem with making a volume of `size_bytes` from a source of
/// `source_bytes`, if it is smaller.
fn check_not_smaller(size_bytes: i64, source: &str, source_bytes: i64) -> Result<()> {
    if size_bytes < source_bytes {
        return Err(CloudError::invalid(
            "size_bytes",
            format!(
                "{} GiB is smaller than its source {source}, {} GiB",
                size_bytes / GIB,
                source_bytes / GIB
            ),
        ));
    }
    Ok(())
}

/// A volume's source, in words.
fn describe_source(snapshot_id: &str, volume_id: &str) -> String {
    match (snapshot_id.is_empty(), volume_id.is_empty()) {
        (false, _) => format!("snapshot {snapshot_id}"),
        (true, false) => format!("volume {volume_id}"),
        (true, true) => "none".to_owned(),
    }
}

/// How `existing` differs from the volume `spec` asks for, in words; empty
/// when it fits.
fn differences(existing: &VolumeRecord, spec: &VolumeSpec, wanted: &Wanted) -> Vec<String> {
    let mut out = Vec::new();
    if existing.size_bytes != wanted.size_bytes {
        out.push(format!(
            "its size is {} GiB, not {} GiB",
            existing.size_bytes / GIB,
            wanted.size_bytes / GIB
        ));
    }
    if !spec.zones.is_empty() && !spec.zones.contains(&existing.zone) {
        out.push(format!(
            "it is in zone {}, not in one of {}",
            existing.zone,
            spec.zones.join(", ")
        ));
    }
    let had = describe_source(&existing.source_snapshot_id, &existing.source_volume_id);
    let asked = describe_source(&spec.source_snapshot_id, &spec.source_volume_id);
    if had != asked {
        out.push(format!("its source is {had}, not {asked}"));
    }
    let had_type = existing
        .attributes
        .get(TYPE_PARAMETER)
        .map(String::as_str)
        .unwrap_or_default();
    if had_type != wanted.volume_type {
        out.push(format!(
            "its type is {had_type}, not {}",
            wanted.volume_type
        ));
    }
    out
}

/// An attachment as the trait tells it: attached at once, or once the
/// `volume_attach_delay` it was made under has passed.
fn attachment(volume: &VolumeRecord, instance_id: &str, device: &str) -> VolumeAttachment {
    let attaching = volume
        .attaching_until_ms
        .get(instance_id)
        .is_some_and(|until| now_ms() < *until);
    VolumeAttachment {
        instance_id: instance_id.to_owned(),
        device: device.to_owned(),
        state: if attaching {
            AttachmentState::Attaching
        } else {
            AttachmentState::Attached
        },
    }
}

impl VolumeRecord {
    /// The volume as the trait tells it.
    fn to_volume(&self) -> Volume {
        Volume {
            id: self.id.clone(),
            name: self.name.clone(),
            size_bytes: self.size_bytes,
            zone: self.zone.clone(),
            state: if now_ms() < self.creating_until_ms {
                VolumeState::Creating
            } else if self.attachments.is_empty() {
                VolumeState::Available
            } else {
                VolumeState::InUse
            },
            attachments: self
                .attachments
                .iter()
                .map(|(instance, device)| attachment(self, instance, device))
                .collect(),
            source_snapshot_id: self.source_snapshot_id.clone(),
            source_volume_id: self.source_volume_id.clone(),
            attributes: self.attributes.clone(),
        }
    }

    /// The device it is attached under on `instance_id`, if it is.
    fn device_on(&self, instance_id: &str) -> Option<&str> {
        self.attachments
            .iter()
            .find(|(instance, _)| instance == instance_id)
            .map(|(_, device)| device.as_str())
    }
}

impl SnapshotRecord {
    /// The snapshot as the trait tells it: ready as soon as it is taken.
    fn to_snapshot(&self) -> Snapshot {
        Snapshot {
            id: self.id.clone(),
            name: self.name.clone(),
            source_volume_id: self.source_volume_id.clone(),
            size_bytes: self.size_bytes,
            created_at: UNIX_EPOCH + Duration::from_millis(self.created_at_ms),
            ready_to_use: true,
        }
    }
}

impl State {
    /// The cluster's volume with `id`.
    fn volume(&self, cluster: &str, id: &str) -> Option<&VolumeRecord> {
        self.volumes.get(id).filter(|v| v.cluster == cluster)
    }

    /// The cluster's volume with `id`, or `NotFound`.
    fn existing_volume(&self, cluster: &str, id: &str) -> Result<VolumeRecord> {
        self.volume(cluster, id)
            .cloned()
            .ok_or_else(|| CloudError::NotFound(format!("volume {id:?}")))
    }

    /// The cluster's snapshot with `id`.
    fn snapshot(&self, cluster: &str, id: &str) -> Option<&SnapshotRecord> {
        self.snapshots.get(id).filter(|s| s.cluster == cluster)
    }

    /// Every volume attached to `instance_id`, of any cluster (an
    /// instance's devices are its own, whoever attached them), and the
    /// device it is under.
    fn attached_to<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> impl Iterator<Item = (&'a VolumeRecord, &'a str)> + 'a {
        self.volumes
            .values()
            .filter_map(move |v| Some((v, v.device_on(instance_id)?)))
    }

    /// The instance with `instance_id` (its ID, or its provider ID), or
    /// `NotFound`.
    fn instance(&self, instance_id: &str) -> Result<InstanceRecord> {
        let id = instance_id
            .strip_prefix(PROVIDER_ID_PREFIX)
            .unwrap_or(instance_id);
        self.store
            .instance(id)?
            .ok_or_else(|| CloudError::NotFound(format!("instance {instance_id:?}")))
    }

    /// The number a counter gives next.
    fn next(&self, counter: &str) -> u64 {
        self.counters.get(counter).copied().unwrap_or(1)
    }

    /// Removes an instance, and detaches every volume attached to it in
    /// the same write, as a cloud releases a terminated instance's volumes.
    pub(super) fn remove_instance(&mut self, id: &str) -> Result<()> {
        let detached: Vec<VolumeRecord> = self
            .attached_to(id)
            .map(|(volume, _)| {
                let mut volume = volume.clone();
                volume.attachments.retain(|(instance, _)| instance != id);
                volume.attaching_until_ms.remove(id);
                volume
            })
            .collect();
        self.store.delete_instance(id, &detached)?;
        for volume in detached {
            self.volumes.insert(volume.id.clone(), volume);
        }
        Ok(())
    }
}

impl SimCloud {
    /// The zone a new volume goes to (`number` is its counter): its
    /// source's, the first asked for, or the next in turn. Checks that its
    /// source exists in the cluster and is not larger.
    fn zone_for(
        &self,
        state: &State,
        cluster: &str,
        spec: &VolumeSpec,
        wanted: &Wanted,
        number: u64,
    ) -> Result<String> {
        if !spec.source_snapshot_id.is_empty() {
            let id = &spec.source_snapshot_id;
            let snapshot = state
                .snapshot(cluster, id)
                .ok_or_else(|| CloudError::NotFound(format!("snapshot {id:?}")))?;
            check_not_smaller(
                wanted.size_bytes,
                &format!("snapshot {id}"),
                snapshot.size_bytes,
            )?;
        }
        if !spec.source_volume_id.is_empty() {
            let id = &spec.source_volume_id;
            let source = state.existing_volume(cluster, id)?;
            check_not_smaller(
                wanted.size_bytes,
                &format!("volume {id}"),
                source.size_bytes,
            )?;
            if !spec.zones.is_empty() && !spec.zones.contains(&source.zone) {
                return Err(CloudError::invalid(
                    "zones",
                    format!(
                        "a copy of volume {id} is made in its zone {}, which is not one of {}",
                        source.zone,
                        spec.zones.join(", ")
                    ),
                ));
            }
            return Ok(source.zone);
        }
        if let Some(zone) = wanted.zones.first() {
            return Ok(zone.clone());
        }
        let zones = &self.config.zones;
        (number as usize)
            .checked_sub(1)
            .and_then(|n| n.checked_rem(zones.len()))
            .map(|n| zones[n].clone())
            .ok_or_else(|| CloudError::NotConfigured("the sim has no zones".to_owned()))
    }
}

#[async_trait]
impl Volumes for SimCloud {
    fn offer(&self) -> VolumeOffer {
        VolumeOffer {
            csi_driver: CSI_DRIVER.to_owned(),
            topology_keys: vec![TOPOLOGY_ZONE_KEY.to_owned(), WELL_KNOWN_ZONE_KEY.to_owned()],
            clones: true,
            snapshots: true,
            modify: true,
            default_size_bytes: GIB,
            node_parameters: Vec::new(),
            device_names: ebs_device_names(),
            reads_per_call: READS_PER_CALL,
        }
    }

    async fn create(&self, cluster: &str, spec: &VolumeSpec) -> Result<Volume> {
        let _call = self.enter(Operation::CreateVolume).await?;
        let wanted = check_spec(spec, &self.config.zones)?;
        let mut state = self.state();
        if let Some(existing) = state
            .volumes
            .values()
            .find(|v| v.cluster == cluster && v.name == spec.name)
        {
            let differences = differences(existing, spec, &wanted);
            if differences.is_empty() {
                return Ok(existing.to_volume());
            }
            return Err(CloudError::Conflict(format!(
                "volume {} named {:?} exists and does not fit: {}",
                existing.id,
                spec.name,
                differences.join("; ")
            )));
        }
        let number = state.next(COUNTER_VOLUME);
        let zone = self.zone_for(&state, cluster, spec, &wanted, number)?;
        let record = VolumeRecord {
            id: format!("vol-{number:017x}"),
            cluster: cluster.to_owned(),
            name: spec.name.clone(),
            size_bytes: wanted.size_bytes,
            zone,
            attachments: Vec::new(),
            source_snapshot_id: spec.source_snapshot_id.clone(),
            source_volume_id: spec.source_volume_id.clone(),
            attributes: [(TYPE_PARAMETER.to_owned(), wanted.volume_type)].into(),
            created_at_ms: now_ms(),
            attaching_until_ms: BTreeMap::new(),
            creating_until_ms: match self.faults().volume_create_delay {
                d if d.is_zero() => 0,
                d => now_ms() + u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            },
        };
        state
            .store
            .put_volume(&record, &[(COUNTER_VOLUME, number + 1)])?;
        state.counters.insert(COUNTER_VOLUME.to_owned(), number + 1);
        state.volumes.insert(record.id.clone(), record.clone());
        Ok(record.to_volume())
    }

    async fn delete(&self, cluster: &str, volume_id: &str) -> Result<()> {
        let _call = self.enter(Operation::DeleteVolume).await?;
        let mut state = self.state();
        let Some(volume) = state.volume(cluster, volume_id) else {
            return Ok(());
        };
        if !volume.attachments.is_empty() {
            let instances: Vec<&str> = volume
                .attachments
                .iter()
                .map(|(instance, _)| instance.as_str())
                .collect();
            return Err(CloudError::VolumeInUse(format!(
                "volume {volume_id} is attached to instance {}",
                instances.join(", ")
            )));
        }
        state.store.delete_volume(volume_id)?;
        state.volumes.remove(volume_id);
        Ok(())
    }

    async fn get(&self, cluster: &str, volume_id: &str) -> Result<Option<Volume>> {
        let _call = self.enter(Operation::GetVolume).await?;
        Ok(self
            .state()
            .volume(cluster, volume_id)
            .map(VolumeRecord::to_volume))
    }

    async fn get_many(&self, cluster: &str, volume_ids: &[String]) -> Result<Vec<Volume>> {
        if volume_ids.len() > READS_PER_CALL {
            return Err(CloudError::invalid(
                "volume_ids",
                format!("names {}; at most {READS_PER_CALL}", volume_ids.len()),
            ));
        }
        let _call = self.enter(Operation::GetVolume).await?;
        let state = self.state();
        Ok(volume_ids
            .iter()
            .filter_map(|id| state.volume(cluster, id))
            .map(VolumeRecord::to_volume)
            .collect())
    }

    async fn list(&self, cluster: &str) -> Result<Vec<Volume>> {
        let _call = self.enter(Operation::ListVolumes).await?;
        Ok(self
            .state()
            .volumes
            .values()
            .filter(|v| v.cluster == cluster)
            .map(VolumeRecord::to_volume)
            .collect())
    }

    async fn devices_in_use(&self, _cluster: &str, instance_id: &str) -> Result<Vec<String>> {
        let _call = self.enter(Operation::VolumeDevices).await?;
        let state = self.state();
        let instance = state.instance(instance_id)?;
        let mut devices: Vec<String> = state
            .attached_to(&instance.id)
            .map(|(_, device)| device.to_owned())
            .collect();
        devices.sort();
        devices.insert(0, ROOT_DEVICE.to_owned());
        Ok(devices)
    }

    async fn attach(
        &self,
        cluster: &str,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> Result<VolumeAttachment> {
        let _call = self.enter(Operation::AttachVolume).await?;
        let mut state = self.state();
        let mut volume = state.existing_volume(cluster, volume_id)?;
        let instance = state.instance(instance_id)?;
        if !instance.running {
            return Err(CloudError::NotFound(format!(
                "a running instance {instance_id:?} (it is stopped)"
            )));
        }
        if let Some(attached) = volume.device_on(&instance.id) {
            return Ok(attachment(&volume, &instance.id, attached));
        }
        if now_ms() < volume.creating_until_ms {
            return Err(CloudError::Provisioning {
                retry_after: Duration::from_secs(1),
                message: format!("volume {volume_id} is still being made"),
            });
        }
        if let Some((other, _)) = volume.attachments.first() {
            return Err(CloudError::VolumeInUse(format!(
                "volume {volume_id} is attached to instance {other}"
            )));
        }
        if volume.zone != instance.zone {
            return Err(CloudError::ZoneMismatch(format!(
                "volume {volume_id} is in zone {}, instance {} in zone {}",
                volume.zone, instance.id, instance.zone
            )));
        }
        let attached: Vec<(&VolumeRecord, &str)> = state.attached_to(&instance.id).collect();
        if attached.len() >= self.config.volumes_per_instance as usize {
            return Err(CloudError::AttachLimit(format!(
                "instance {} has {} volumes attached, the most it takes",
                instance.id,
                attached.len()
            )));
        }
        if device.is_empty() {
            return Err(CloudError::invalid("device", "names no device"));
        }
        if device == ROOT_DEVICE {
            return Err(CloudError::Conflict(format!(
                "device {device} of instance {} is its own root disk",
                instance.id
            )));
        }
        if let Some((other, _)) = attached.iter().find(|(_, used)| *used == device) {
            return Err(CloudError::Conflict(format!(
                "device {device} of instance {} is in use by volume {}",
                instance.id, other.id
            )));
        }
        volume
            .attachments
            .push((instance.id.clone(), device.to_owned()));
        let delay = self.faults().volume_attach_delay;
        if !delay.is_zero() {
            let until = now_ms() + u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            volume.attaching_until_ms.insert(instance.id.clone(), until);
        }
        state.store.put_volume(&volume, &[])?;
        let answer = attachment(&volume, &instance.id, device);
        state.volumes.insert(volume.id.clone(), volume);
        Ok(answer)
    }

    async fn detach(&self, cluster: &str, volume_id: &str, instance_id: &str) -> Result<()> {
        let _call = self.enter(Operation::DetachVolume).await?;
        let id = instance_id
            .strip_prefix(PROVIDER_ID_PREFIX)
            .unwrap_or(instance_id);
        let mut state = self.state();
        let Some(mut volume) = state.volume(cluster, volume_id).cloned() else {
            return Ok(());
        };
        if volume.device_on(id).is_none() {
            return Ok(());
        }
        volume.attachments.retain(|(instance, _)| instance != id);
        volume.attaching_until_ms.remove(id);
        state.store.put_volume(&volume, &[])?;
        state.volumes.insert(volume.id.clone(), volume);
        Ok(())
    }

    async fn expand(&self, cluster: &str, volume_id: &str, size_bytes: i64) -> Result<i64> {
        let _call = self.enter(Operation::ExpandVolume).await?;
        let rounded = round_size(size_bytes, 0)
            .map_err(|(field, problem)| CloudError::invalid(field, problem))?;
        let mut state = self.state();
        let mut volume = state.existing_volume(cluster, volume_id)?;
        if volume.size_bytes >= rounded {
            return Ok(volume.size_bytes);
        }
        volume.size_bytes = rounded;
        state.store.put_volume(&volume, &[])?;
        state.volumes.insert(volume.id.clone(), volume);
        Ok(rounded)
    }

    /// Changes a volume's type; none when it has it already.
    async fn modify(
        &self,
        cluster: &str,
        volume_id: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<()> {
        let _call = self.enter(Operation::ModifyVolume).await?;
        let mut problems = Vec::new();
        let volume_type = volume_type(parameters, &mut problems);
        CloudError::none_of(problems)?;
        let mut state = self.state();
        let mut volume = state.existing_volume(cluster, volume_id)?;
        if !parameters.contains_key(TYPE_PARAMETER)
            || volume.attributes.get(TYPE_PARAMETER) == Some(&volume_type)
        {
            return Ok(());
        }
        volume
            .attributes
            .insert(TYPE_PARAMETER.to_owned(), volume_type);
        state.store.put_volume(&volume, &[])?;
        state.volumes.insert(volume.id.clone(), volume);
        Ok(())
    }

    async fn create_snapshot(
        &self,
        cluster: &str,
        name: &str,
        source_volume_id: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<Snapshot> {
        let _call = self.enter(Operation::CreateSnapshot).await?;
        CloudError::none_of(
            parameters
                .keys()
                .map(|key| {
                    (
                        format!("parameters[\"{key}\"]"),
                        "the sim takes no parameters for snapshots".to_owned(),
                    )
                })
                .collect(),
        )?;
        let mut state = self.state();
        if let Some(existing) = state
            .snapshots
            .values()
            .find(|s| s.cluster == cluster && s.name == name)
        {
            if existing.source_volume_id != source_volume_id {
                return Err(CloudError::Conflict(format!(
                    "snapshot {} named {name:?} is of volume {}, not {source_volume_id}",
                    existing.id, existing.source_volume_id
                )));
            }
            return Ok(existing.to_snapshot());
        }
        let volume = state.existing_volume(cluster, source_volume_id)?;
        let number = state.next(COUNTER_SNAPSHOT);
        let record = SnapshotRecord {
            id: format!("snap-{number:017x}"),
            cluster: cluster.to_owned(),
            name: name.to_owned(),
            source_volume_id: volume.id,
            size_bytes: volume.size_bytes,
            created_at_ms: now_ms(),
        };
        state
            .store
            .put_snapshot(&record, &[(COUNTER_SNAPSHOT, number + 1)])?;
        state
            .counters
            .insert(COUNTER_SNAPSHOT.to_owned(), number + 1);
        state.snapshots.insert(record.id.clone(), record.clone());
        Ok(record.to_snapshot())
    }

    async fn delete_snapshot(&self, cluster: &str, snapshot_id: &str) -> Result<()> {
        let _call = self.enter(Operation::DeleteSnapshot).await?;
        let mut state = self.state();
        if state.snapshot(cluster, snapshot_id).is_some() {
            state.store.delete_snapshot(snapshot_id)?;
            state.snapshots.remove(snapshot_id);
        }
        Ok(())
    }

    async fn list_snapshots(&self, cluster: &str) -> Result<Vec<Snapshot>> {
        let _call = self.enter(Operation::ListSnapshots).await?;
        Ok(self
            .state()
            .snapshots
            .values()
            .filter(|s| s.cluster == cluster)
            .map(SnapshotRecord::to_snapshot)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::path::Path;

    use super::*;
    use crate::{NewInstance, SimConfig};

    /// Runs a test's body, failing it when it takes more than a few seconds.
    async fn within<F: Future>(body: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), body)
            .await
            .expect("the test finished in time")
    }

    fn open(dir: &Path) -> SimCloud {
        SimCloud::open(dir, SimConfig::default()).unwrap()
    }

    /// A running instance in `zone`; its ID.
    fn instance(sim: &SimCloud, name: &str, zone: &str) -> String {
        sim.create_instance(NewInstance {
            name: name.to_owned(),
            zone: zone.to_owned(),
            ..NewInstance::default()
        })
        .unwrap()
        .id
    }

    /// A spec for a 1 GiB volume named `name`.
    fn volume(name: &str) -> VolumeSpec {
        VolumeSpec {
            name: name.to_owned(),
            size_bytes: GIB,
            ..VolumeSpec::default()
        }
    }

    /// Chainable changes to a volume spec.
    trait SpecExt {
        fn sized(self, size_bytes: i64) -> Self;
        fn in_zones(self, zones: &[&str]) -> Self;
        fn with_parameter(self, key: &str, value: &str) -> Self;
        fn restored_from(self, id: &str) -> Self;
        fn copied_from(self, id: &str) -> Self;
    }

    impl SpecExt for VolumeSpec {
        fn sized(mut self, size_bytes: i64) -> Self {
            self.size_bytes = size_bytes;
            self
        }

        fn in_zones(mut self, zones: &[&str]) -> Self {
            self.zones = zones.iter().map(|z| (*z).to_owned()).collect();
            self
        }

        fn with_parameter(mut self, key: &str, value: &str) -> Self {
            self.parameters.insert(key.to_owned(), value.to_owned());
            self
        }

        fn restored_from(mut self, id: &str) -> Self {
            self.source_snapshot_id = id.to_owned();
            self
        }

        fn copied_from(mut self, id: &str) -> Self {
            self.source_volume_id = id.to_owned();
            self
        }
    }

    /// The fields an `InvalidArgument` names, or the error when it is not one.
    fn invalid_fields(err: CloudError) -> Vec<String> {
        match err {
            CloudError::InvalidArgument(problems) => {
                problems.into_iter().map(|(field, _)| field).collect()
            }
            other => panic!("not an invalid argument: {other}"),
        }
    }

    #[tokio::test]
    async fn creating_again_under_a_name_answers_the_same_volume_or_a_conflict_naming_what_differs()
    {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let made = cloud
                .create("c", &volume("data").sized(GIB + GIB / 2))
                .await
                .unwrap();
            assert_eq!(made.id, "vol-00000000000000001");
            assert_eq!(made.size_bytes, 2 * GIB);
            assert_eq!(made.zone, "sim-zone-a");
            assert_eq!(made.state, VolumeState::Available);
            assert_eq!(
                made.attributes.get("type").map(String::as_str),
                Some("standard")
            );

            let again = cloud
                .create(
                    "c",
                    &volume("data").sized(2 * GIB).in_zones(&["sim-zone-a"]),
                )
                .await
                .unwrap();
            assert_eq!(again, made);

            let err = cloud
                .create(
                    "c",
                    &volume("data")
                        .sized(3 * GIB)
                        .in_zones(&["sim-zone-b"])
                        .with_parameter("type", "fast"),
                )
                .await
                .unwrap_err();
            let CloudError::Conflict(message) = &err else {
                panic!("not a conflict: {err}");
            };
            for said in [
                "2 GiB, not 3 GiB",
                "zone sim-zone-a",
                "type is standard, not fast",
            ] {
                assert!(message.contains(said), "{message:?} does not say {said:?}");
            }
            let err = cloud
                .create("c", &volume("data").sized(2 * GIB).copied_from(&made.id))
                .await
                .unwrap_err();
            assert!(
                err.to_string()
                    .contains("its source is none, not volume vol-"),
                "{err}"
            );
            assert_eq!(cloud.list("c").await.unwrap(), vec![made]);
        })
        .await;
    }

    #[tokio::test]
    async fn new_volumes_are_spread_over_the_zones_unless_zones_are_asked() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let mut zones = Vec::new();
            for name in ["a", "b", "c", "d"] {
                zones.push(cloud.create("c", &volume(name)).await.unwrap().zone);
            }
            assert_eq!(
                zones,
                ["sim-zone-a", "sim-zone-b", "sim-zone-c", "sim-zone-a"]
            );

            let asked = cloud
                .create(
                    "c",
                    &volume("e").in_zones(&["elsewhere", "sim-zone-c", "sim-zone-b"]),
                )
                .await
                .unwrap();
            assert_eq!(asked.zone, "sim-zone-c");

            let err = cloud
                .create("c", &volume("f").in_zones(&["elsewhere"]))
                .await
                .unwrap_err();
            assert!(
                err.to_string()
                    .contains("sim-zone-a, sim-zone-b, sim-zone-c"),
                "{err}"
            );
            assert_eq!(invalid_fields(err), ["zones"]);
        })
        .await;
    }

    #[tokio::test]
    async fn sizes_are_whole_gib_up_to_16_tib_within_the_limit() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let tiny = cloud.create("c", &volume("tiny").sized(1)).await.unwrap();
            assert_eq!(tiny.size_bytes, GIB);
            let largest = cloud
                .create("c", &volume("largest").sized(MAX_SIZE_BYTES))
                .await
                .unwrap();
            assert_eq!(largest.size_bytes, 16 << 40);

            let err = cloud
                .create("c", &volume("huge").sized(MAX_SIZE_BYTES + 1))
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["size_bytes"]);
            let mut limited = volume("limited").sized(GIB + 1);
            limited.limit_bytes = GIB + GIB / 2;
            let err = cloud.create("c", &limited).await.unwrap_err();
            assert!(err.to_string().contains("rounds up to 2 GiB"), "{err}");
            assert_eq!(invalid_fields(err), ["limit_bytes"]);
            limited.limit_bytes = 2 * GIB;
            assert_eq!(
                cloud.create("c", &limited).await.unwrap().size_bytes,
                2 * GIB
            );
        })
        .await;
    }

    #[tokio::test]
    async fn every_parameter_the_sim_does_not_take_is_reported_at_once() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let mut spec = volume("data")
                .with_parameter("type", "slow")
                .with_parameter("iops", "3000")
                .with_parameter("encrypted", "true")
                .in_zones(&["elsewhere"]);
            spec.mutable_parameters
                .insert("iops".to_owned(), "4000".to_owned());
            let err = cloud.create("c", &spec).await.unwrap_err();
            assert!(err.to_string().contains("standard, fast"), "{err}");
            assert_eq!(
                invalid_fields(err),
                [
                    "zones",
                    "mutable_parameters[\"iops\"]",
                    "parameters[\"encrypted\"]",
                    "parameters[\"iops\"]",
                    "parameters[\"type\"]",
                ]
            );
            assert!(cloud.list("c").await.unwrap().is_empty());

            let fast = cloud
                .create("c", &volume("fast").with_parameter("type", "fast"))
                .await
                .unwrap();
            assert_eq!(
                fast.attributes.get("type").map(String::as_str),
                Some("fast")
            );
        })
        .await;
    }

    #[tokio::test]
    async fn attaching_answers_the_attachment_and_again_the_same_device() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-a");
            let data = cloud.create("c", &volume("data")).await.unwrap();
            assert_eq!(
                cloud.devices_in_use("c", &node).await.unwrap(),
                ["/dev/xvda"]
            );

            let attached = cloud
                .attach("c", &data.id, &node, "/dev/xvdaa")
                .await
                .unwrap();
            assert_eq!(attached.instance_id, node);
            assert_eq!(attached.device, "/dev/xvdaa");
            assert_eq!(attached.state, AttachmentState::Attached);
            let again = cloud
                .attach("c", &data.id, &node, "/dev/xvdab")
                .await
                .unwrap();
            assert_eq!(again, attached);

            let now = cloud.get("c", &data.id).await.unwrap().unwrap();
            assert_eq!(now.state, VolumeState::InUse);
            assert_eq!(now.attachments, [attached]);
            assert_eq!(
                cloud.devices_in_use("c", &node).await.unwrap(),
                ["/dev/xvda", "/dev/xvdaa"]
            );

            cloud.detach("c", &data.id, &node).await.unwrap();
            cloud.detach("c", &data.id, &node).await.unwrap();
            let now = cloud.get("c", &data.id).await.unwrap().unwrap();
            assert_eq!(now.state, VolumeState::Available);
            assert!(now.attachments.is_empty());
            assert_eq!(
                cloud.devices_in_use("c", &node).await.unwrap(),
                ["/dev/xvda"]
            );
        })
        .await;
    }

    #[tokio::test]
    async fn a_volume_attached_to_one_instance_is_in_use_for_another_and_for_deleting() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let first = instance(&sim, "node-1", "sim-zone-a");
            let second = instance(&sim, "node-2", "sim-zone-a");
            let data = cloud.create("c", &volume("data")).await.unwrap();
            cloud
                .attach("c", &data.id, &first, "/dev/xvdaa")
                .await
                .unwrap();

            let err = cloud
                .attach("c", &data.id, &second, "/dev/xvdaa")
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::VolumeInUse(_)), "{err}");
            let err = cloud.delete("c", &data.id).await.unwrap_err();
            assert!(matches!(err, CloudError::VolumeInUse(_)), "{err}");
            assert!(err.to_string().contains(&first), "{err}");

            cloud.detach("c", &data.id, &second).await.unwrap();
            assert!(
                cloud
                    .get("c", &data.id)
                    .await
                    .unwrap()
                    .unwrap()
                    .attachment_to(&first)
                    .is_some()
            );
            cloud.detach("c", &data.id, &first).await.unwrap();
            cloud.delete("c", &data.id).await.unwrap();
            assert_eq!(cloud.get("c", &data.id).await.unwrap(), None);
            cloud.delete("c", &data.id).await.unwrap();
            cloud.detach("c", &data.id, &first).await.unwrap();
        })
        .await;
    }

    #[tokio::test]
    async fn a_volume_attaches_only_to_an_instance_of_its_zone() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-b");
            let data = cloud
                .create("c", &volume("data").in_zones(&["sim-zone-a"]))
                .await
                .unwrap();
            let err = cloud
                .attach("c", &data.id, &node, "/dev/xvdaa")
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::ZoneMismatch(_)), "{err}");
            assert_eq!(
                cloud.get("c", &data.id).await.unwrap().unwrap().state,
                VolumeState::Available
            );
        })
        .await;
    }

    #[tokio::test]
    async fn an_instance_takes_at_most_26_volumes() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-a");
            let devices = cloud.offer().device_names;
            for (n, device) in devices.iter().take(26).enumerate() {
                let spec = volume(&format!("data-{n}")).in_zones(&["sim-zone-a"]);
                let made = cloud.create("c", &spec).await.unwrap();
                cloud.attach("c", &made.id, &node, device).await.unwrap();
            }
            let last = cloud
                .create("c", &volume("data-26").in_zones(&["sim-zone-a"]))
                .await
                .unwrap();
            let err = cloud
                .attach("c", &last.id, &node, &devices[26])
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::AttachLimit(_)), "{err}");
            assert_eq!(cloud.devices_in_use("c", &node).await.unwrap().len(), 27);
        })
        .await;
    }

    #[tokio::test]
    async fn a_device_in_use_on_the_instance_is_a_conflict() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-a");
            let spec = |name| volume(name).in_zones(&["sim-zone-a"]);
            let first = cloud.create("c", &spec("first")).await.unwrap();
            let second = cloud.create("other", &spec("second")).await.unwrap();
            cloud
                .attach("c", &first.id, &node, "/dev/xvdaa")
                .await
                .unwrap();
            // Another cluster's volume cannot take the device either: the
            // instance has one set of devices.
            for device in ["/dev/xvdaa", "/dev/xvda"] {
                let err = cloud
                    .attach("other", &second.id, &node, device)
                    .await
                    .unwrap_err();
                assert!(matches!(err, CloudError::Conflict(_)), "{device}: {err}");
            }
            assert_eq!(
                cloud.devices_in_use("other", &node).await.unwrap(),
                ["/dev/xvda", "/dev/xvdaa"]
            );
            cloud
                .attach("other", &second.id, &node, "/dev/xvdab")
                .await
                .unwrap();
        })
        .await;
    }

    #[tokio::test]
    async fn attaching_needs_the_volume_and_a_running_instance() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-a");
            let data = cloud
                .create("c", &volume("data").in_zones(&["sim-zone-a"]))
                .await
                .unwrap();
            let not_found = |result: Result<VolumeAttachment>| {
                let err = result.unwrap_err();
                assert!(matches!(err, CloudError::NotFound(_)), "{err}");
            };
            not_found(
                cloud
                    .attach("c", "vol-0000000000000000f", &node, "/dev/xvdaa")
                    .await,
            );
            not_found(cloud.attach("c", &data.id, "i-999999", "/dev/xvdaa").await);
            let err = cloud.devices_in_use("c", "i-999999").await.unwrap_err();
            assert!(matches!(err, CloudError::NotFound(_)), "{err}");
            sim.set_running(&node, false).unwrap();
            not_found(cloud.attach("c", &data.id, &node, "/dev/xvdaa").await);
            sim.set_running(&node, true).unwrap();
            // The provider ID names the instance as well as its ID.
            let attached = cloud
                .attach("c", &data.id, &format!("sim://{node}"), "/dev/xvdaa")
                .await
                .unwrap();
            assert_eq!(attached.instance_id, node);
        })
        .await;
    }

    #[tokio::test]
    async fn a_terminated_instance_leaves_its_volumes_attached_nowhere() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let node = instance(&sim, "node-1", "sim-zone-a");
            let data = cloud
                .create("c", &volume("data").in_zones(&["sim-zone-a"]))
                .await
                .unwrap();
            cloud
                .attach("c", &data.id, &node, "/dev/xvdaa")
                .await
                .unwrap();
            sim.terminate(&node).unwrap();
            let now = cloud.get("c", &data.id).await.unwrap().unwrap();
            assert_eq!(now.state, VolumeState::Available);
            cloud.detach("c", &data.id, &node).await.unwrap();
            cloud.delete("c", &data.id).await.unwrap();
        })
        .await;
    }

    #[tokio::test]
    async fn a_volumes_type_changes_in_place_and_is_made_with_it() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let type_of = |v: &Volume| v.attributes.get("type").cloned();
            let mut spec = volume("data").with_parameter("type", "standard");
            spec.mutable_parameters
                .insert("type".to_owned(), "fast".to_owned());
            let data = cloud.create("c", &spec).await.unwrap();
            assert_eq!(type_of(&data).as_deref(), Some("fast"));
            let to = |t: &str| [("type".to_owned(), t.to_owned())].into();
            cloud.modify("c", &data.id, &to("standard")).await.unwrap();
            let now = cloud.get("c", &data.id).await.unwrap().unwrap();
            assert_eq!(type_of(&now).as_deref(), Some("standard"));
            let wrong = cloud.modify("c", &data.id, &to("slow")).await.unwrap_err();
            assert_eq!(invalid_fields(wrong), ["parameters[\"type\"]"]);
            let elsewhere = cloud.modify("other", &data.id, &to("fast")).await;
            assert!(
                matches!(elsewhere, Err(CloudError::NotFound(_))),
                "{elsewhere:?}"
            );
        })
        .await;
    }

    #[tokio::test]
    async fn expanding_rounds_up_and_never_shrinks() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let data = cloud.create("c", &volume("data")).await.unwrap();
            assert_eq!(
                cloud.expand("c", &data.id, 2 * GIB + 1).await.unwrap(),
                3 * GIB
            );
            assert_eq!(cloud.expand("c", &data.id, GIB).await.unwrap(), 3 * GIB);
            assert_eq!(
                cloud.get("c", &data.id).await.unwrap().unwrap().size_bytes,
                3 * GIB
            );
            let err = cloud
                .expand("c", &data.id, MAX_SIZE_BYTES + 1)
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["size_bytes"]);
            let err = cloud
                .expand("c", "vol-0000000000000000f", GIB)
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::NotFound(_)), "{err}");
        })
        .await;
    }

    #[tokio::test]
    async fn snapshots_are_made_once_per_name_and_listed_by_id() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let none = BTreeMap::new();
            let data = cloud
                .create("c", &volume("data").sized(2 * GIB))
                .await
                .unwrap();
            let other = cloud.create("c", &volume("other")).await.unwrap();

            let first = cloud
                .create_snapshot("c", "first", &data.id, &none)
                .await
                .unwrap();
            assert_eq!(first.id, "snap-00000000000000001");
            assert_eq!(first.source_volume_id, data.id);
            assert_eq!(first.size_bytes, 2 * GIB);
            assert!(first.ready_to_use);
            let again = cloud
                .create_snapshot("c", "first", &data.id, &none)
                .await
                .unwrap();
            assert_eq!(again, first);
            let err = cloud
                .create_snapshot("c", "first", &other.id, &none)
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::Conflict(_)), "{err}");
            let err = cloud
                .create_snapshot("c", "lost", "vol-0000000000000000f", &none)
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::NotFound(_)), "{err}");
            let parameters = [("tier".to_owned(), "archive".to_owned())].into();
            let err = cloud
                .create_snapshot("c", "tiered", &data.id, &parameters)
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["parameters[\"tier\"]"]);

            let second = cloud
                .create_snapshot("c", "second", &other.id, &none)
                .await
                .unwrap();
            assert_eq!(
                cloud.list_snapshots("c").await.unwrap(),
                [first.clone(), second.clone()]
            );
            cloud.delete_snapshot("c", &first.id).await.unwrap();
            cloud.delete_snapshot("c", &first.id).await.unwrap();
            assert_eq!(cloud.list_snapshots("c").await.unwrap(), [second]);
        })
        .await;
    }

    #[tokio::test]
    async fn a_volume_is_made_from_a_snapshot_or_a_volume_no_smaller() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let none = BTreeMap::new();
            let data = cloud
                .create(
                    "c",
                    &volume("data").sized(2 * GIB).in_zones(&["sim-zone-b"]),
                )
                .await
                .unwrap();
            let taken = cloud
                .create_snapshot("c", "taken", &data.id, &none)
                .await
                .unwrap();

            let restored = cloud
                .create(
                    "c",
                    &volume("restored").sized(2 * GIB).restored_from(&taken.id),
                )
                .await
                .unwrap();
            assert_eq!(restored.source_snapshot_id, taken.id);
            let err = cloud
                .create("c", &volume("small").restored_from(&taken.id))
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["size_bytes"]);
            let err = cloud
                .create("c", &volume("lost").restored_from("snap-0000000000000000f"))
                .await
                .unwrap_err();
            assert!(matches!(err, CloudError::NotFound(_)), "{err}");

            let copy = cloud
                .create("c", &volume("copy").sized(3 * GIB).copied_from(&data.id))
                .await
                .unwrap();
            assert_eq!(
                (copy.zone.as_str(), copy.source_volume_id.as_str()),
                ("sim-zone-b", data.id.as_str())
            );
            let err = cloud
                .create(
                    "c",
                    &volume("elsewhere")
                        .sized(2 * GIB)
                        .copied_from(&data.id)
                        .in_zones(&["sim-zone-a"]),
                )
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["zones"]);
            let err = cloud
                .create("c", &volume("small-copy").copied_from(&data.id))
                .await
                .unwrap_err();
            assert_eq!(invalid_fields(err), ["size_bytes"]);
        })
        .await;
    }

    #[tokio::test]
    async fn another_cluster_sees_nothing_of_a_clusters_volumes_and_snapshots() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            let none = BTreeMap::new();
            let node = instance(&sim, "node-1", "sim-zone-a");
            let data = cloud
                .create("c", &volume("data").in_zones(&["sim-zone-a"]))
                .await
                .unwrap();
            let taken = cloud
                .create_snapshot("c", "taken", &data.id, &none)
                .await
                .unwrap();

            assert_eq!(cloud.get("other", &data.id).await.unwrap(), None);
            assert!(cloud.list("other").await.unwrap().is_empty());
            assert!(cloud.list_snapshots("other").await.unwrap().is_empty());
            cloud.delete("other", &data.id).await.unwrap();
            cloud.delete_snapshot("other", &taken.id).await.unwrap();
            let errors = [
                cloud
                    .attach("other", &data.id, &node, "/dev/xvdaa")
                    .await
                    .unwrap_err(),
                cloud.expand("other", &data.id, 2 * GIB).await.unwrap_err(),
                cloud
                    .create_snapshot("other", "taken", &data.id, &none)
                    .await
                    .unwrap_err(),
                cloud
                    .create("other", &volume("restored").restored_from(&taken.id))
                    .await
                    .unwrap_err(),
                cloud
                    .create("other", &volume("copy").copied_from(&data.id))
                    .await
                    .unwrap_err(),
            ];
            for err in errors {
                assert!(matches!(err, CloudError::NotFound(_)), "{err}");
            }
            cloud.detach("other", &data.id, &node).await.unwrap();

            // The same name in another cluster is another volume.
            let theirs = cloud
                .create("other", &volume("data").sized(5 * GIB))
                .await
                .unwrap();
            assert_ne!(theirs.id, data.id);
            assert_eq!(cloud.list("c").await.unwrap(), [data]);
            assert_eq!(cloud.list_snapshots("c").await.unwrap(), [taken]);
        })
        .await;
    }

    #[tokio::test]
    async fn volumes_attachments_and_snapshots_survive_a_restart() {
        within(async {
            let dir = tempfile::tempdir().unwrap();
            let none = BTreeMap::new();
            let (node, volumes, snapshots) = {
                let sim = open(dir.path());
                let cloud: &dyn Volumes = &sim;
                let node = instance(&sim, "node-1", "sim-zone-a");
                let data = cloud
                    .create("c", &volume("data").in_zones(&["sim-zone-a"]))
                    .await
                    .unwrap();
                cloud
                    .attach("c", &data.id, &node, "/dev/xvdaa")
                    .await
                    .unwrap();
                cloud.expand("c", &data.id, 4 * GIB).await.unwrap();
                cloud
                    .create("c", &volume("spare").with_parameter("type", "fast"))
                    .await
                    .unwrap();
                cloud
                    .create_snapshot("c", "taken", &data.id, &none)
                    .await
                    .unwrap();
                (
                    node,
                    cloud.list("c").await.unwrap(),
                    cloud.list_snapshots("c").await.unwrap(),
                )
            };

            let sim = open(dir.path());
            let cloud: &dyn Volumes = &sim;
            assert_eq!(cloud.list("c").await.unwrap(), volumes);
            assert_eq!(cloud.list_snapshots("c").await.unwrap(), snapshots);
            assert_eq!(
                cloud.devices_in_use("c", &node).await.unwrap(),
                ["/dev/xvda", "/dev/xvdaa"]
            );
            // New IDs go on from where they were.
            let next = cloud.create("c", &volume("next")).await.unwrap();
            assert_eq!(next.id, "vol-00000000000000003");
            let next = cloud
                .create_snapshot("c", "next", &next.id, &none)
                .await
                .unwrap();
            assert_eq!(next.id, "snap-00000000000000002");

            let read = crate::store::Store::read(dir.path()).unwrap();
            assert_eq!(read.volumes.len(), 3);
            assert_eq!(read.volume_snapshots.len(), 2);
        })
        .await;
    }

    #[test]
    fn the_offer_names_the_sims_driver_and_zone_label() {
        let dir = tempfile::tempdir().unwrap();
        let offer = open(dir.path()).offer();
        assert_eq!(offer.csi_driver, "sim.csi.cloudgateway.io");
        assert_eq!(
            offer.topology_keys,
            [
                "topology.sim.cloudgateway.io/zone",
                "topology.kubernetes.io/zone"
            ]
        );
        assert_eq!(offer.default_size_bytes, 1 << 30);
        assert_eq!(
            offer.device_names.first().map(String::as_str),
            Some("/dev/xvdaa")
        );
        assert!(offer.clones && offer.snapshots && offer.modify);
    }
}
