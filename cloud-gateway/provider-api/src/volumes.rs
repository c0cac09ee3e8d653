//! Block volumes and their snapshots (the cloud side of a CSI controller):
//! what a provider implements to back the gateway's `Volumes` service.
//!
//! The gateway has checked every request before a provider sees it, and
//! owns what must have one owner: it serialises the calls for one volume
//! name and for one instance, and it picks the device name of every
//! attachment ([`Volumes::devices_in_use`] then [`Volumes::attach`]), so
//! two attaches to one instance never get one name. A provider answers as
//! its cloud does, and, like the cloud, refuses what breaks its rules:
//! another zone, an instance at its limit, a volume attached elsewhere.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;

use crate::{CloudError, Result};

/// What a provider's volumes are: the CSI driver they belong to and what
/// it can do beyond create, delete, attach, detach and expand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeOffer {
    /// The CSI driver name (the cloud's own node plugin's).
    pub csi_driver: String,
    /// The Node label keys that name a zone in the node plugin's topology,
    /// the first one written into a volume's accessible topology.
    pub topology_keys: Vec<String>,
    /// Whether a volume can be made as a copy of another.
    pub clones: bool,
    /// Whether snapshots are served.
    pub snapshots: bool,
    /// Whether [`Volumes::modify`] is served.
    pub modify: bool,
    /// The size of a volume asked without one, in bytes.
    pub default_size_bytes: i64,
    /// StorageClass parameters the node plugin reads, never the provider's.
    pub node_parameters: Vec<String>,
    /// Device names a volume may be attached under, in the order the
    /// gateway hands them out.
    pub device_names: Vec<String>,
    /// The most volumes [`Volumes::get_many`] reads in one call to the
    /// cloud; 0 or 1 where it reads one at a time (each read is then one
    /// call against the budget).
    pub reads_per_call: usize,
}

/// Where a volume is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeState {
    /// The cloud is still making it.
    #[default]
    Creating,
    /// Made, and attached nowhere.
    Available,
    /// Attached (or attaching, or detaching) somewhere.
    InUse,
    /// Being deleted.
    Deleting,
    /// The cloud failed to make it; it can only be deleted.
    Error,
}

/// Where an attachment is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachmentState {
    #[default]
    Attaching,
    Attached,
    Detaching,
}

/// A volume attached (or attaching, or detaching) to an instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeAttachment {
    /// The instance, by the cloud's ID.
    pub instance_id: String,
    /// The device name it is attached under.
    pub device: String,
    pub state: AttachmentState,
}

/// A volume as the cloud has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Volume {
    /// The cloud's ID.
    pub id: String,
    /// The name it was created under, the key of idempotency.
    pub name: String,
    /// Its size in bytes, rounded up to the cloud's unit.
    pub size_bytes: i64,
    pub zone: String,
    pub state: VolumeState,
    pub attachments: Vec<VolumeAttachment>,
    pub source_snapshot_id: String,
    pub source_volume_id: String,
    /// What the provider tells of it beyond the above (AWS: type, iops).
    pub attributes: BTreeMap<String, String>,
}

impl Volume {
    /// Where it is attached to `instance_id`, if it is.
    pub fn attachment_to(&self, instance_id: &str) -> Option<&VolumeAttachment> {
        self.attachments
            .iter()
            .find(|a| a.instance_id == instance_id)
    }
}

/// Who a volume was made for, as the external-provisioner tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeOwner {
    pub pvc_namespace: String,
    pub pvc_name: String,
    pub pv_name: String,
}

/// A volume to make, checked by the gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeSpec {
    /// The key of idempotency.
    pub name: String,
    /// The smallest size wanted, in bytes, more than 0 (the gateway put
    /// the default in).
    pub size_bytes: i64,
    /// The largest size accepted, in bytes; 0 for no limit.
    pub limit_bytes: i64,
    /// The zones it may be made in, preferred first; empty for any.
    pub zones: Vec<String>,
    /// The provider's own parameters.
    pub parameters: BTreeMap<String, String>,
    pub owner: Option<VolumeOwner>,
    pub source_snapshot_id: String,
    pub source_volume_id: String,
    pub mutable_parameters: BTreeMap<String, String>,
}

/// A snapshot as the cloud has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    /// The size of its volume when it was taken.
    pub size_bytes: i64,
    pub created_at: SystemTime,
    pub ready_to_use: bool,
}

/// A cloud's volumes. Every method is idempotent, and everything named is
/// the cluster's own: a provider never answers or changes a volume or
/// snapshot whose tags name another cluster (it is `NotFound` to this one).
#[async_trait]
pub trait Volumes: Send + Sync {
    /// What the volumes are.
    fn offer(&self) -> VolumeOffer;

    /// Makes a volume, or answers the one made before under the same name
    /// when it fits `spec` (`Conflict` when it does not). A source that
    /// does not exist is `NotFound`. `Provisioning` while the cloud still
    /// makes it.
    async fn create(&self, cluster: &str, spec: &VolumeSpec) -> Result<Volume>;

    /// Deletes a volume; `Ok` when it is gone already. One still attached
    /// is [`CloudError::VolumeInUse`].
    async fn delete(&self, cluster: &str, volume_id: &str) -> Result<()>;

    /// One volume, `None` when there is none.
    async fn get(&self, cluster: &str, volume_id: &str) -> Result<Option<Volume>>;

    /// The volumes of `volume_ids` that exist, in any order: one call to
    /// the cloud where it reads many volumes at once (the gateway gathers
    /// the reads of many waiters into one, at most
    /// [`VolumeOffer::reads_per_call`] IDs). The default reads them one
    /// by one, for a cloud that cannot.
    async fn get_many(&self, cluster: &str, volume_ids: &[String]) -> Result<Vec<Volume>> {
        let mut out = Vec::with_capacity(volume_ids.len());
        for id in volume_ids {
            out.extend(self.get(cluster, id).await?);
        }
        Ok(out)
    }

    /// Every volume of the cluster.
    async fn list(&self, cluster: &str) -> Result<Vec<Volume>>;

    /// The device names in use on an instance (any volume's, and its own
    /// disks'); `NotFound` when there is no such instance.
    async fn devices_in_use(&self, cluster: &str, instance_id: &str) -> Result<Vec<String>>;

    /// Attaches a volume to an instance under `device`, which the gateway
    /// picked from what [`Self::devices_in_use`] left free; answers the
    /// attachment (the one that exists, whatever `device`, when the volume
    /// is attached to the instance already: the gateway does not read the
    /// volume first). `Provisioning` while the cloud still makes the
    /// volume.
    /// Refuses as the cloud does: [`CloudError::VolumeInUse`],
    /// [`CloudError::ZoneMismatch`], [`CloudError::AttachLimit`],
    /// `NotFound` for a volume or instance that does not exist.
    async fn attach(
        &self,
        cluster: &str,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> Result<VolumeAttachment>;

    /// Detaches a volume from an instance; `Ok` when it is not attached
    /// there or either is gone. `Provisioning` while the cloud still
    /// detaches it.
    async fn detach(&self, cluster: &str, volume_id: &str, instance_id: &str) -> Result<()>;

    /// Grows a volume to at least `size_bytes` (the gateway checked that
    /// it is not smaller); answers its size now.
    async fn expand(&self, cluster: &str, volume_id: &str, size_bytes: i64) -> Result<i64>;

    /// Changes a volume's mutable parameters.
    async fn modify(
        &self,
        _cluster: &str,
        _volume_id: &str,
        _parameters: &BTreeMap<String, String>,
    ) -> Result<()> {
        Err(CloudError::NotImplemented("volume modification"))
    }

    /// Snapshots a volume, or answers the snapshot made before under the
    /// same name (`Conflict` when that one is of another volume).
    async fn create_snapshot(
        &self,
        _cluster: &str,
        _name: &str,
        _source_volume_id: &str,
        _parameters: &BTreeMap<String, String>,
    ) -> Result<Snapshot> {
        Err(CloudError::NotImplemented("snapshots"))
    }

    /// Deletes a snapshot; `Ok` when it is gone already.
    async fn delete_snapshot(&self, _cluster: &str, _snapshot_id: &str) -> Result<()> {
        Err(CloudError::NotImplemented("snapshots"))
    }

    /// Every snapshot of the cluster.
    async fn list_snapshots(&self, _cluster: &str) -> Result<Vec<Snapshot>> {
        Err(CloudError::NotImplemented("snapshots"))
    }
}

/// Device names as AWS's EBS CSI driver hands them out: `/dev/xvdaa` to
/// `/dev/xvdzz`, 676 in all.
pub fn ebs_device_names() -> Vec<String> {
    let letters = b'a'..=b'z';
    letters
        .clone()
        .flat_map(|a| {
            letters
                .clone()
                .map(move |b| format!("/dev/xvd{}{}", a as char, b as char))
        })
        .collect()
}
