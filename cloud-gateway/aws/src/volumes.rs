//! Volumes: EBS volumes and snapshots, made and tagged as the upstream EBS
//! CSI controller makes them, so that its node plugin runs unchanged
//! beside the gateway (driver `ebs.csi.aws.com`, raw `vol-…` IDs, device
//! names `/dev/xvdaa`…). A volume or snapshot is the cluster's when it
//! carries the cluster tag (`tags.rs`); nothing else is ever answered,
//! attached, detached or deleted. A volume's name is its `CSIVolumeName`
//! tag, looked up before every create, and the create's client token
//! besides.

use std::collections::BTreeMap;
use std::time::SystemTime;

use async_trait::async_trait;
use aws_sdk_ec2::types::{
    Filter, ResourceType, Snapshot as Ec2Snapshot, SnapshotState, Tag, TagSpecification,
    Volume as Ec2Volume, VolumeAttachmentState, VolumeState as Ec2VolumeState, VolumeType,
};
use ccm_provider::volumes::{
    AttachmentState, Snapshot, Volume, VolumeAttachment, VolumeOffer, VolumeSpec, VolumeState,
    ebs_device_names,
};
use ccm_provider::{CloudError, Result, Volumes};

use super::instances::{is_alive, parse_provider_id};
use super::modifications::Target;
use super::{AwsCloud, errors, every_page, tags};

/// The upstream CSI driver's name. Never change it: PersistentVolumes name
/// it, and the node plugin registers under it.
pub const CSI_DRIVER: &str = "ebs.csi.aws.com";

/// The node plugin's zone label, first in a volume's accessible topology.
/// Never change it: PersistentVolumes keep it in their node affinity.
const TOPOLOGY_ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";

/// The well-known zone label, which the node plugin also reports.
const WELL_KNOWN_ZONE_KEY: &str = "topology.kubernetes.io/zone";

/// The tag naming a volume after its CSI name. Never change it: it is how
/// volumes made before (by us or by the upstream controller) are found.
const TAG_VOLUME_NAME: &str = "CSIVolumeName";

/// The tag naming a snapshot after its CSI name. Never change it.
const TAG_SNAPSHOT_NAME: &str = "CSIVolumeSnapshotName";

/// The tag upstream's IAM policy conditions creates and deletes on.
const TAG_DRIVER_CLUSTER: &str = "ebs.csi.aws.com/cluster";

/// The tags of the PVC and PV a volume was made for (upstream's).
const TAG_PVC_NAME: &str = "kubernetes.io/created-for/pvc/name";
const TAG_PVC_NAMESPACE: &str = "kubernetes.io/created-for/pvc/namespace";
const TAG_PV_NAME: &str = "kubernetes.io/created-for/pv/name";

/// EBS's unit of size.
const GIB: i64 = 1 << 30;

/// Volume IDs read in one DescribeVolumes, as values of one filter (EC2
/// takes up to 200 values a filter).
const READS_PER_CALL: usize = 200;

/// The size of a volume asked without one, upstream's default.
const DEFAULT_SIZE_GIB: i64 = 100;

/// The StorageClass parameters the node plugin reads when it formats a
/// volume; the controller passes them through untouched.
const NODE_PARAMETERS: [&str; 7] = [
    "blocksize",
    "inodesize",
    "bytesperinode",
    "numberofinodes",
    "ext4bigalloc",
    "ext4clustersize",
    "ext4encryptionsupport",
];

/// The StorageClass parameters taken here, lowercase (upstream reads them
/// in any case).
const TYPE: &str = "type";
const IOPS: &str = "iops";
const THROUGHPUT: &str = "throughput";
const ENCRYPTED: &str = "encrypted";
const KMS_KEY_ID: &str = "kmskeyid";

/// The volume types, the default (upstream's) first.
const VOLUME_TYPES: [&str; 7] = ["gp3", "gp2", "io1", "io2", "st1", "sc1", "standard"];

/// A field path and what is wrong with it.
type Problem = (String, String);

/// What a volume spec asks of EC2, once checked.
#[derive(Debug, Default, PartialEq, Eq)]
struct Wanted {
    size_gib: i32,
    volume_type: String,
    iops: Option<i32>,
    throughput: Option<i32>,
    encrypted: bool,
    kms_key_id: Option<String>,
}

/// Checks `spec`, reporting every problem at once.
fn check_spec(spec: &VolumeSpec) -> Result<Wanted> {
    let mut problems = Vec::new();
    let size_gib = match round_gib(spec.size_bytes, spec.limit_bytes) {
        Ok(gib) => gib,
        Err(problem) => {
            problems.push(problem);
            0
        }
    };
    // Mutable parameters (a VolumeAttributesClass's) are made with the
    // volume, over the StorageClass's, as upstream does.
    let mut merged = spec.parameters.clone();
    for (key, value) in &spec.mutable_parameters {
        if MUTABLE.contains(&key.to_ascii_lowercase().as_str()) {
            merged.retain(|k, _| !k.eq_ignore_ascii_case(key));
            merged.insert(key.clone(), value.clone());
        } else {
            problems.push((format!("mutable_parameters[\"{key}\"]"), not_mutable()));
        }
    }
    let mut wanted = parameters(&merged, &mut problems);
    wanted.size_gib = size_gib;
    if !spec.source_volume_id.is_empty() {
        problems.push((
            "source_volume_id".to_owned(),
            "copies of volumes are not offered on AWS yet".to_owned(),
        ));
    }
    CloudError::none_of(problems)?;
    Ok(wanted)
}

/// `size_bytes` in whole GiB, rounded up, within `limit_bytes` (0: none).
fn round_gib(size_bytes: i64, limit_bytes: i64) -> std::result::Result<i32, Problem> {
    if size_bytes <= 0 {
        return Err((
            "size_bytes".to_owned(),
            format!("{size_bytes} is not more than 0"),
        ));
    }
    let gib = size_bytes / GIB + i64::from(size_bytes % GIB != 0);
    if limit_bytes > 0 && gib * GIB > limit_bytes {
        return Err((
            "limit_bytes".to_owned(),
            format!(
                "{size_bytes} bytes rounds up to {gib} GiB, EBS's unit, which is more than the limit of {limit_bytes} bytes"
            ),
        ));
    }
    i32::try_from(gib).map_err(|_| {
        (
            "size_bytes".to_owned(),
            format!("{gib} GiB is more than any EBS volume"),
        )
    })
}

/// The volume type, IOPS, throughput and encryption `parameters` ask for;
/// every key not taken here is a problem.
fn parameters(parameters: &BTreeMap<String, String>, problems: &mut Vec<Problem>) -> Wanted {
    let mut wanted = Wanted {
        volume_type: VOLUME_TYPES[0].to_owned(),
        ..Wanted::default()
    };
    for (key, value) in parameters {
        let field = format!("parameters[\"{key}\"]");
        match key.to_ascii_lowercase().as_str() {
            TYPE => {
                if let Some(known) = volume_type(field, value, problems) {
                    wanted.volume_type = known;
                }
            }
            IOPS => wanted.iops = number(field, value, problems),
            THROUGHPUT => wanted.throughput = number(field, value, problems),
            ENCRYPTED => match value.to_ascii_lowercase().as_str() {
                "true" => wanted.encrypted = true,
                "false" => wanted.encrypted = false,
                _ => problems.push((field, format!("{value:?} is not true or false"))),
            },
            KMS_KEY_ID => wanted.kms_key_id = Some(value.clone()),
            _ => problems.push((
                field,
                format!(
                    "not a parameter of EBS volumes: the gateway takes type, iops, throughput, encrypted and kmsKeyId, the node plugin {}",
                    NODE_PARAMETERS.join(", ")
                ),
            )),
        }
    }
    fits(
        &wanted.volume_type,
        wanted.iops,
        wanted.throughput,
        problems,
    );
    if wanted.iops.is_none() && ["io1", "io2"].contains(&wanted.volume_type.as_str()) {
        problems.push((
            "parameters[\"iops\"]".to_owned(),
            format!("volumes of type {} need IOPS", wanted.volume_type),
        ));
    }
    if wanted.kms_key_id.is_some() && !wanted.encrypted {
        problems.push((
            "parameters[\"kmsKeyId\"]".to_owned(),
            "a KMS key is for encrypted volumes only: set encrypted to true".to_owned(),
        ));
    }
    wanted
}

/// An EBS volume type named in `value` (any case), or a problem.
fn volume_type(field: String, value: &str, problems: &mut Vec<Problem>) -> Option<String> {
    let known = VOLUME_TYPES
        .iter()
        .find(|t| **t == value.to_ascii_lowercase());
    if known.is_none() {
        problems.push((
            field,
            format!(
                "{value:?} is not an EBS volume type: one of {}",
                VOLUME_TYPES.join(", ")
            ),
        ));
    }
    known.map(|t| (*t).to_owned())
}

/// A whole number above 0 in `value`, or a problem.
fn number(field: String, value: &str, problems: &mut Vec<Problem>) -> Option<i32> {
    match value.parse::<i32>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            problems.push((field, format!("{value:?} is not a whole number above 0")));
            None
        }
    }
}

/// What a volume of `volume_type` cannot take of `iops` and `throughput`
/// (each a key of `parameters`), as problems.
fn fits(
    volume_type: &str,
    iops: Option<i32>,
    throughput: Option<i32>,
    problems: &mut Vec<Problem>,
) {
    if iops.is_some() && !["gp3", "io1", "io2"].contains(&volume_type) {
        problems.push((
            "parameters[\"iops\"]".to_owned(),
            format!("volumes of type {volume_type} take no IOPS"),
        ));
    }
    if throughput.is_some() && volume_type != "gp3" {
        problems.push((
            "parameters[\"throughput\"]".to_owned(),
            format!("volumes of type {volume_type} take no throughput"),
        ));
    }
}

/// The parameters a volume's modification may change, upstream's.
const MUTABLE: [&str; 3] = [TYPE, IOPS, THROUGHPUT];

fn not_mutable() -> String {
    format!(
        "not a mutable parameter of EBS volumes: one of {}",
        MUTABLE.join(", ")
    )
}

/// What a modification asks of EC2, once checked; `None` keeps a value.
#[derive(Debug, Default, PartialEq, Eq)]
struct Change {
    volume_type: Option<String>,
    iops: Option<i32>,
    throughput: Option<i32>,
}

impl Change {
    /// The change `parameters` ask for; every key not mutable is a problem.
    fn of(parameters: &BTreeMap<String, String>, problems: &mut Vec<Problem>) -> Self {
        let mut change = Self::default();
        for (key, value) in parameters {
            let field = format!("parameters[\"{key}\"]");
            match key.to_ascii_lowercase().as_str() {
                TYPE => change.volume_type = volume_type(field, value, problems),
                IOPS => change.iops = number(field, value, problems),
                THROUGHPUT => change.throughput = number(field, value, problems),
                _ => problems.push((field, not_mutable())),
            }
        }
        change
    }

    /// Whether `volume` has every value asked already.
    fn made_in(&self, volume: &Volume) -> bool {
        let has = |key: &str, wanted: Option<String>| {
            wanted.is_none_or(|w| volume.attributes.get(key) == Some(&w))
        };
        has(TYPE, self.volume_type.clone())
            && has(IOPS, self.iops.map(|n| n.to_string()))
            && has(THROUGHPUT, self.throughput.map(|n| n.to_string()))
    }
}

/// The client token of the `attempt`th create of the volume named `name`
/// (from 1): the SHA-256 in hex of the name, upstream's, then of the name
/// with `-2`, `-3`, …; 64 characters (EC2's longest) each.
fn client_token(name: &str, attempt: u32) -> String {
    let input = match attempt {
        0 | 1 => name.to_owned(),
        n => format!("{name}-{n}"),
    };
    ring::digest::digest(&ring::digest::SHA256, input.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The most client tokens one create tries.
const CLIENT_TOKENS: u32 = 5;

/// Calls `create` with the volume `name`'s client token, and with the next
/// one while EC2 answers that a token was used before with other
/// parameters (`is_mismatch`), as upstream does: a create that failed, or
/// a volume of that name deleted since, spent it. Only called once no
/// volume of that name exists (a live one is found by its tag first), so
/// the token's earlier volume is not one to answer with. Past
/// [`CLIENT_TOKENS`] tokens, the last answer.
async fn with_client_tokens<T, E, Fut>(
    name: &str,
    mut create: impl FnMut(String) -> Fut,
    is_mismatch: impl Fn(&E) -> bool,
) -> std::result::Result<T, E>
where
    Fut: std::future::Future<Output = std::result::Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match create(client_token(name, attempt)).await {
            Err(e) if is_mismatch(&e) && attempt < CLIENT_TOKENS => {
                tracing::info!(
                    volume = name,
                    attempt,
                    "the volume's client token was used before with other parameters; the next one"
                );
                attempt += 1;
            }
            answer => return answer,
        }
    }
}

/// The tags of a new volume: its name, upstream's driver tag, the cluster
/// tag (`owned`) and, when told, the PVC and PV it is for.
fn volume_tags(cluster: &str, spec: &VolumeSpec) -> Vec<(String, String)> {
    let mut out = vec![
        (TAG_VOLUME_NAME.to_owned(), spec.name.clone()),
        (TAG_DRIVER_CLUSTER.to_owned(), "true".to_owned()),
        (tags::cluster_key(cluster), tags::OWNED.to_owned()),
    ];
    if let Some(owner) = &spec.owner {
        for (key, value) in [
            (TAG_PVC_NAME, &owner.pvc_name),
            (TAG_PVC_NAMESPACE, &owner.pvc_namespace),
            (TAG_PV_NAME, &owner.pv_name),
        ] {
            if !value.is_empty() {
                out.push((key.to_owned(), value.clone()));
            }
        }
    }
    out
}

/// The tags of a new snapshot: its name, upstream's driver tag and the
/// cluster tag.
fn snapshot_tags(cluster: &str, name: &str) -> Vec<(String, String)> {
    vec![
        (TAG_SNAPSHOT_NAME.to_owned(), name.to_owned()),
        (TAG_DRIVER_CLUSTER.to_owned(), "true".to_owned()),
        (tags::cluster_key(cluster), tags::OWNED.to_owned()),
    ]
}

fn tag_specification(kind: ResourceType, pairs: Vec<(String, String)>) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(kind)
        .set_tags(Some(
            pairs
                .into_iter()
                .map(|(k, v)| Tag::builder().key(k).value(v).build())
                .collect(),
        ))
        .build()
}

/// The value of the tag `key`, if there is one.
fn tag<'a>(tags: &'a [Tag], key: &str) -> Option<&'a str> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(Tag::value)
}

/// How `existing` differs from the volume `spec` and `wanted` ask for, in
/// words; empty when it fits.
fn differences(existing: &Volume, spec: &VolumeSpec, wanted: &Wanted) -> Vec<String> {
    let mut out = Vec::new();
    let size_gib = existing.size_bytes / GIB;
    if size_gib != i64::from(wanted.size_gib) {
        out.push(format!(
            "its size is {size_gib} GiB, not {} GiB",
            wanted.size_gib
        ));
    }
    if !spec.zones.is_empty() && !spec.zones.contains(&existing.zone) {
        out.push(format!(
            "it is in zone {}, not in one of {}",
            existing.zone,
            spec.zones.join(", ")
        ));
    }
    let had = existing.attributes.get(TYPE).map(String::as_str);
    if had != Some(wanted.volume_type.as_str()) {
        out.push(format!(
            "its type is {}, not {}",
            had.unwrap_or("unknown"),
            wanted.volume_type
        ));
    }
    if existing.source_snapshot_id != spec.source_snapshot_id {
        out.push(format!(
            "it was made from snapshot {:?}, not {:?}",
            existing.source_snapshot_id, spec.source_snapshot_id
        ));
    }
    out
}

/// An EC2 attachment as the trait tells it; `None` once it is detached.
fn attachment(
    instance_id: Option<&str>,
    device: Option<&str>,
    state: Option<&VolumeAttachmentState>,
) -> Option<VolumeAttachment> {
    let state = match state? {
        VolumeAttachmentState::Attaching => AttachmentState::Attaching,
        VolumeAttachmentState::Detaching => AttachmentState::Detaching,
        VolumeAttachmentState::Detached => return None,
        // Attached, busy (attached and in use), and states new to us.
        _ => AttachmentState::Attached,
    };
    Some(VolumeAttachment {
        instance_id: instance_id?.to_owned(),
        device: device.unwrap_or_default().to_owned(),
        state,
    })
}

/// An EC2 volume as the trait tells it; `None` once it is deleted.
fn to_volume(v: &Ec2Volume) -> Option<Volume> {
    let state = match v.state()? {
        Ec2VolumeState::Creating => VolumeState::Creating,
        Ec2VolumeState::Available => VolumeState::Available,
        Ec2VolumeState::InUse => VolumeState::InUse,
        Ec2VolumeState::Deleting => VolumeState::Deleting,
        Ec2VolumeState::Deleted => return None,
        _ => VolumeState::Error,
    };
    let mut attributes = BTreeMap::new();
    if let Some(t) = v.volume_type() {
        attributes.insert(TYPE.to_owned(), t.as_str().to_owned());
    }
    if let Some(iops) = v.iops() {
        attributes.insert(IOPS.to_owned(), iops.to_string());
    }
    if let Some(throughput) = v.throughput() {
        attributes.insert(THROUGHPUT.to_owned(), throughput.to_string());
    }
    attributes.insert(
        ENCRYPTED.to_owned(),
        v.encrypted().unwrap_or_default().to_string(),
    );
    Some(Volume {
        id: v.volume_id()?.to_owned(),
        name: tag(v.tags(), TAG_VOLUME_NAME)
            .unwrap_or_default()
            .to_owned(),
        size_bytes: i64::from(v.size().unwrap_or_default()) * GIB,
        zone: v.availability_zone().unwrap_or_default().to_owned(),
        state,
        attachments: v
            .attachments()
            .iter()
            .filter_map(|a| attachment(a.instance_id(), a.device(), a.state()))
            .collect(),
        source_snapshot_id: v.snapshot_id().unwrap_or_default().to_owned(),
        source_volume_id: v.source_volume_id().unwrap_or_default().to_owned(),
        attributes,
    })
}

/// An EC2 snapshot as the trait tells it.
fn to_snapshot(s: &Ec2Snapshot) -> Option<Snapshot> {
    Some(Snapshot {
        id: s.snapshot_id()?.to_owned(),
        name: tag(s.tags(), TAG_SNAPSHOT_NAME)
            .unwrap_or_default()
            .to_owned(),
        source_volume_id: s.volume_id().unwrap_or_default().to_owned(),
        size_bytes: i64::from(s.volume_size().unwrap_or_default()) * GIB,
        created_at: s
            .start_time()
            .and_then(|t| SystemTime::try_from(*t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        ready_to_use: s.state() == Some(&SnapshotState::Completed),
    })
}

/// What an `AttachVolume` refusal means, as the trait names it.
fn attach_refusal(code: &str, message: &str) -> Option<CloudError> {
    let what = format!("AttachVolume: {code}: {message}");
    Some(match code {
        "VolumeInUse" | "IncorrectState" => CloudError::VolumeInUse(what),
        "InvalidVolume.ZoneMismatch" => CloudError::ZoneMismatch(what),
        "AttachmentLimitExceeded" => CloudError::AttachLimit(what),
        "InvalidVolume.NotFound" | "InvalidInstanceID.NotFound" => CloudError::NotFound(what),
        _ if message.contains("already in use") => CloudError::Conflict(what),
        _ => return None,
    })
}

/// The zone a volume asked without one goes to: one of the region's, the
/// same for the same name (upstream picks one at random).
fn zone_for(name: &str, mut zones: Vec<String>) -> Option<String> {
    zones.sort();
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    let n = usize::from(digest.as_ref()[0]);
    zones.get(n.checked_rem(zones.len())?).cloned()
}

/// The instance ID in `instance_id`, an ID or a provider ID. Anything
/// else names no instance: `NotFound`, as the CSI spec answers a node that
/// does not exist.
fn instance_id(instance_id: &str) -> Result<String> {
    parse_provider_id(instance_id)
        .map_err(|problem| CloudError::NotFound(format!("instance {instance_id:?} ({problem})")))
}

impl AwsCloud {
    /// Every volume matching `filters`, every page.
    async fn describe_volumes(&self, filters: Vec<Filter>) -> Result<Vec<Ec2Volume>> {
        let filters = &filters;
        every_page(|token| async move {
            let page = self
                .ec2
                .describe_volumes()
                .set_filters(Some(filters.clone()))
                .max_results(500)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeVolumes", e))?;
            Ok((
                page.volumes().to_vec(),
                page.next_token().map(str::to_owned),
            ))
        })
        .await
    }

    /// Every snapshot of this account matching `filters`, every page.
    async fn describe_snapshots(&self, filters: Vec<Filter>) -> Result<Vec<Ec2Snapshot>> {
        let filters = &filters;
        every_page(|token| async move {
            let page = self
                .ec2
                .describe_snapshots()
                .owner_ids("self")
                .set_filters(Some(filters.clone()))
                .max_results(1000)
                .set_next_token(token)
                .send()
                .await
                .map_err(|e| errors::cloud_error("DescribeSnapshots", e))?;
            Ok((
                page.snapshots().to_vec(),
                page.next_token().map(str::to_owned),
            ))
        })
        .await
    }

    /// The cluster's volume with `id`, `None` when there is none (or it is
    /// another's).
    async fn cluster_volume(&self, cluster: &str, id: &str) -> Result<Option<Volume>> {
        let found = self
            .describe_volumes(vec![tags::filter("volume-id", [id])])
            .await?;
        Ok(found
            .iter()
            .filter(|v| tags::belongs_to(v.tags(), cluster))
            .find_map(to_volume))
    }

    /// The cluster's snapshot with `id`, `None` when there is none.
    async fn cluster_snapshot(&self, cluster: &str, id: &str) -> Result<Option<Snapshot>> {
        let found = self
            .describe_snapshots(vec![tags::filter("snapshot-id", [id])])
            .await?;
        Ok(found
            .iter()
            .filter(|s| tags::belongs_to(s.tags(), cluster))
            .find_map(to_snapshot))
    }

    /// The region's availability zones (not local or wavelength zones),
    /// read once and then from the cache.
    async fn availability_zones(&self) -> Result<Vec<String>> {
        let cached = |zones: &super::Zones| -> Vec<String> {
            zones
                .types
                .iter()
                .filter(|(_, kind)| kind.as_str() == "availability-zone")
                .map(|(name, _)| name.clone())
                .collect()
        };
        let known = cached(&self.zones.lock().unwrap_or_else(|e| e.into_inner()));
        if !known.is_empty() {
            return Ok(known);
        }
        let ids = self.read_zones().await?;
        let typed = cached(&self.zones.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(if typed.is_empty() {
            ids.into_keys().collect()
        } else {
            typed
        })
    }
}

#[async_trait]
impl Volumes for AwsCloud {
    fn offer(&self) -> VolumeOffer {
        VolumeOffer {
            csi_driver: CSI_DRIVER.to_owned(),
            topology_keys: vec![TOPOLOGY_ZONE_KEY.to_owned(), WELL_KNOWN_ZONE_KEY.to_owned()],
            clones: false,
            snapshots: true,
            modify: true,
            default_size_bytes: DEFAULT_SIZE_GIB * GIB,
            node_parameters: NODE_PARAMETERS.iter().map(|p| (*p).to_owned()).collect(),
            device_names: ebs_device_names(),
            reads_per_call: READS_PER_CALL,
        }
    }

    async fn create(&self, cluster: &str, spec: &VolumeSpec) -> Result<Volume> {
        let wanted = check_spec(spec)?;
        let named = self
            .describe_volumes(vec![
                tags::filter(&format!("tag:{TAG_VOLUME_NAME}"), [spec.name.as_str()]),
                tags::filter("tag-key", [tags::cluster_key(cluster)]),
            ])
            .await?;
        if let Some(existing) = named.iter().find_map(to_volume) {
            let differences = differences(&existing, spec, &wanted);
            if differences.is_empty() {
                return Ok(existing);
            }
            return Err(CloudError::Conflict(format!(
                "volume {} named {:?} exists and does not fit: {}",
                existing.id,
                spec.name,
                differences.join("; ")
            )));
        }
        if !spec.source_snapshot_id.is_empty() {
            let id = &spec.source_snapshot_id;
            let snapshot = self
                .cluster_snapshot(cluster, id)
                .await?
                .ok_or_else(|| CloudError::NotFound(format!("snapshot {id}")))?;
            if i64::from(wanted.size_gib) * GIB < snapshot.size_bytes {
                return Err(CloudError::invalid(
                    "size_bytes",
                    format!(
                        "{} GiB is smaller than its source snapshot {id}, {} GiB",
                        wanted.size_gib,
                        snapshot.size_bytes / GIB
                    ),
                ));
            }
        }
        let zone = match spec.zones.first() {
            Some(zone) => zone.clone(),
            None => zone_for(&spec.name, self.availability_zones().await?).ok_or_else(|| {
                CloudError::NotConfigured(format!(
                    "region {} has no availability zones",
                    self.region
                ))
            })?,
        };
        let made = with_client_tokens(
            &spec.name,
            |token| {
                self.ec2
                    .create_volume()
                    .client_token(token)
                    .availability_zone(&zone)
                    .size(wanted.size_gib)
                    .volume_type(VolumeType::from(wanted.volume_type.as_str()))
                    .set_iops(wanted.iops)
                    .set_throughput(wanted.throughput)
                    .encrypted(wanted.encrypted)
                    .set_kms_key_id(wanted.kms_key_id.clone())
                    .set_snapshot_id(
                        Some(spec.source_snapshot_id.clone()).filter(|s| !s.is_empty()),
                    )
                    .tag_specifications(tag_specification(
                        ResourceType::Volume,
                        volume_tags(cluster, spec),
                    ))
                    .send()
            },
            |e| errors::code(e) == Some("IdempotentParameterMismatch"),
        )
        .await
        .map_err(|e| match errors::code(&e) {
            Some("IdempotentParameterMismatch") => CloudError::Conflict(format!(
                "a volume named {:?} was made before with other parameters \
                 ({CLIENT_TOKENS} client tokens tried)",
                spec.name
            )),
            Some("InvalidSnapshot.NotFound") => {
                CloudError::NotFound(format!("snapshot {}", spec.source_snapshot_id))
            }
            _ => errors::cloud_error("CreateVolume", e),
        })?;
        let volume = Ec2Volume::builder()
            .set_volume_id(made.volume_id().map(str::to_owned))
            .set_size(made.size())
            .set_availability_zone(made.availability_zone().map(str::to_owned))
            .set_state(made.state().cloned())
            .set_snapshot_id(made.snapshot_id().map(str::to_owned))
            .set_volume_type(made.volume_type().cloned())
            .set_iops(made.iops())
            .set_throughput(made.throughput())
            .set_encrypted(made.encrypted())
            .set_tags(Some(made.tags().to_vec()))
            .build();
        let mut volume = to_volume(&volume).ok_or_else(|| {
            CloudError::Internal(format!(
                "CreateVolume answered no volume ID or state for {:?}",
                spec.name
            ))
        })?;
        if volume.name.is_empty() {
            volume.name = spec.name.clone();
        }
        Ok(volume)
    }

    async fn delete(&self, cluster: &str, volume_id: &str) -> Result<()> {
        let Some(volume) = self.cluster_volume(cluster, volume_id).await? else {
            return Ok(());
        };
        if let Some(attached) = volume.attachments.first() {
            return Err(CloudError::VolumeInUse(format!(
                "volume {volume_id} is attached to instance {}",
                attached.instance_id
            )));
        }
        match self.ec2.delete_volume().volume_id(volume_id).send().await {
            Ok(_) => Ok(()),
            Err(e) => match errors::code(&e) {
                Some("InvalidVolume.NotFound") => Ok(()),
                Some("VolumeInUse") => Err(CloudError::VolumeInUse(format!(
                    "volume {volume_id} is attached"
                ))),
                _ => Err(errors::cloud_error("DeleteVolume", e)),
            },
        }
    }

    async fn get(&self, cluster: &str, volume_id: &str) -> Result<Option<Volume>> {
        self.cluster_volume(cluster, volume_id).await
    }

    async fn get_many(&self, cluster: &str, volume_ids: &[String]) -> Result<Vec<Volume>> {
        // By filter, not by `VolumeIds`: one ID gone must not fail the
        // read of the others (`InvalidVolume.NotFound`).
        let mut out = Vec::with_capacity(volume_ids.len());
        for ids in volume_ids.chunks(READS_PER_CALL) {
            let found = self
                .describe_volumes(vec![tags::filter(
                    "volume-id",
                    ids.iter().map(String::as_str),
                )])
                .await?;
            out.extend(
                found
                    .iter()
                    .filter(|v| tags::belongs_to(v.tags(), cluster))
                    .filter_map(to_volume),
            );
        }
        Ok(out)
    }

    async fn list(&self, cluster: &str) -> Result<Vec<Volume>> {
        let found = self
            .describe_volumes(vec![tags::filter("tag-key", [tags::cluster_key(cluster)])])
            .await?;
        Ok(found.iter().filter_map(to_volume).collect())
    }

    async fn devices_in_use(&self, _cluster: &str, instance_id: &str) -> Result<Vec<String>> {
        let id = self::instance_id(instance_id)?;
        let found = self
            .describe_instances(vec![tags::filter("instance-id", [id.as_str()])])
            .await?;
        let instance = found
            .iter()
            .find(|i| is_alive(i) && i.instance_id() == Some(id.as_str()))
            .ok_or_else(|| CloudError::NotFound(format!("instance {instance_id}")))?;
        let mut devices: Vec<String> = instance
            .block_device_mappings()
            .iter()
            .filter_map(|m| m.device_name())
            .chain(instance.root_device_name())
            .map(str::to_owned)
            .collect();
        devices.sort();
        devices.dedup();
        Ok(devices)
    }

    async fn attach(
        &self,
        cluster: &str,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> Result<VolumeAttachment> {
        let id = self::instance_id(instance_id)?;
        let volume = self
            .cluster_volume(cluster, volume_id)
            .await?
            .ok_or_else(|| CloudError::NotFound(format!("volume {volume_id}")))?;
        if let Some(attached) = volume.attachment_to(&id) {
            return Ok(attached.clone());
        }
        if let Some(other) = volume.attachments.first() {
            return Err(CloudError::VolumeInUse(format!(
                "volume {volume_id} is attached to instance {}",
                other.instance_id
            )));
        }
        let answer = self
            .ec2
            .attach_volume()
            .volume_id(volume_id)
            .instance_id(&id)
            .device(device)
            .send()
            .await
            .map_err(|e| {
                errors::code(&e)
                    .and_then(|code| attach_refusal(code, errors::message(&e)))
                    .unwrap_or_else(|| errors::cloud_error("AttachVolume", e))
            })?;
        Ok(attachment(
            Some(&id),
            Some(answer.device().unwrap_or(device)),
            Some(answer.state().unwrap_or(&VolumeAttachmentState::Attaching)),
        )
        .unwrap_or(VolumeAttachment {
            instance_id: id,
            device: device.to_owned(),
            state: AttachmentState::Attaching,
        }))
    }

    async fn detach(&self, cluster: &str, volume_id: &str, instance_id: &str) -> Result<()> {
        // No such instance: nothing is attached to it.
        let Ok(id) = self::instance_id(instance_id) else {
            return Ok(());
        };
        let Some(volume) = self.cluster_volume(cluster, volume_id).await? else {
            return Ok(());
        };
        let detaching = || {
            errors::provisioning(format!(
                "volume {volume_id} is still being detached from instance {id}"
            ))
        };
        match volume.attachment_to(&id).map(|a| a.state) {
            None => return Ok(()),
            Some(AttachmentState::Detaching) => return Err(detaching()),
            Some(_) => {}
        }
        let answer = self
            .ec2
            .detach_volume()
            .volume_id(volume_id)
            .instance_id(&id)
            .send()
            .await;
        match answer {
            Ok(a) if a.state() == Some(&VolumeAttachmentState::Detached) => Ok(()),
            Ok(_) => Err(detaching()),
            Err(e) => match errors::code(&e) {
                Some(
                    "IncorrectState" | "InvalidAttachment.NotFound" | "InvalidVolume.NotFound",
                ) => Ok(()),
                _ => Err(errors::cloud_error("DetachVolume", e)),
            },
        }
    }

    async fn expand(&self, cluster: &str, volume_id: &str, size_bytes: i64) -> Result<i64> {
        let gib = round_gib(size_bytes, 0)
            .map_err(|(field, problem)| CloudError::invalid(field, problem))?;
        let volume = self
            .cluster_volume(cluster, volume_id)
            .await?
            .ok_or_else(|| CloudError::NotFound(format!("volume {volume_id}")))?;
        if volume.size_bytes >= i64::from(gib) * GIB {
            return Ok(volume.size_bytes);
        }
        let resize = Target {
            size_gib: Some(gib),
            ..Target::default()
        };
        let target = self.modifications.ask(&self.ec2, volume_id, resize).await?;
        Ok(i64::from(target.unwrap_or(gib)) * GIB)
    }

    /// Changes a volume's type, IOPS or throughput with one ModifyVolume
    /// (with a resize asked at once, see `modifications`), none when it has
    /// them already (EBS takes one modification at a time, and few a
    /// day).
    async fn modify(
        &self,
        cluster: &str,
        volume_id: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<()> {
        let mut problems = Vec::new();
        let change = Change::of(parameters, &mut problems);
        let fit = |volume_type: &str, problems: &mut Vec<Problem>| {
            fits(volume_type, change.iops, change.throughput, problems)
        };
        if let Some(volume_type) = &change.volume_type {
            fit(volume_type, &mut problems);
        }
        CloudError::none_of(problems)?;
        let volume = self
            .cluster_volume(cluster, volume_id)
            .await?
            .ok_or_else(|| CloudError::NotFound(format!("volume {volume_id}")))?;
        if change.volume_type.is_none() {
            let mut problems = Vec::new();
            let had = volume.attributes.get(TYPE).map(String::as_str);
            fit(had.unwrap_or_default(), &mut problems);
            CloudError::none_of(problems)?;
        }
        if change.made_in(&volume) {
            return Ok(());
        }
        let Change {
            volume_type,
            iops,
            throughput,
        } = change;
        let target = Target {
            size_gib: None,
            volume_type,
            iops,
            throughput,
        };
        self.modifications.ask(&self.ec2, volume_id, target).await?;
        Ok(())
    }

    async fn create_snapshot(
        &self,
        cluster: &str,
        name: &str,
        source_volume_id: &str,
        parameters: &BTreeMap<String, String>,
    ) -> Result<Snapshot> {
        CloudError::none_of(
            parameters
                .keys()
                .map(|key| {
                    (
                        format!("parameters[\"{key}\"]"),
                        "the gateway takes no parameters for EBS snapshots".to_owned(),
                    )
                })
                .collect(),
        )?;
        let named = self
            .describe_snapshots(vec![
                tags::filter(&format!("tag:{TAG_SNAPSHOT_NAME}"), [name]),
                tags::filter("tag-key", [tags::cluster_key(cluster)]),
            ])
            .await?;
        if let Some(existing) = named.iter().find_map(to_snapshot) {
            if existing.source_volume_id != source_volume_id {
                return Err(CloudError::Conflict(format!(
                    "snapshot {} named {name:?} is of volume {}, not {source_volume_id}",
                    existing.id, existing.source_volume_id
                )));
            }
            return Ok(existing);
        }
        if self
            .cluster_volume(cluster, source_volume_id)
            .await?
            .is_none()
        {
            return Err(CloudError::NotFound(format!("volume {source_volume_id}")));
        }
        let made = self
            .ec2
            .create_snapshot()
            .volume_id(source_volume_id)
            .description(format!("Snapshot {name} of volume {source_volume_id}"))
            .tag_specifications(tag_specification(
                ResourceType::Snapshot,
                snapshot_tags(cluster, name),
            ))
            .send()
            .await
            .map_err(|e| match errors::code(&e) {
                Some("InvalidVolume.NotFound") => {
                    CloudError::NotFound(format!("volume {source_volume_id}"))
                }
                _ => errors::cloud_error("CreateSnapshot", e),
            })?;
        let snapshot = Ec2Snapshot::builder()
            .set_snapshot_id(made.snapshot_id().map(str::to_owned))
            .set_volume_id(made.volume_id().map(str::to_owned))
            .set_volume_size(made.volume_size())
            .set_start_time(made.start_time().cloned())
            .set_state(made.state().cloned())
            .build();
        let mut snapshot = to_snapshot(&snapshot).ok_or_else(|| {
            CloudError::Internal(format!("CreateSnapshot answered no ID for {name:?}"))
        })?;
        snapshot.name = name.to_owned();
        Ok(snapshot)
    }

    async fn delete_snapshot(&self, cluster: &str, snapshot_id: &str) -> Result<()> {
        if self.cluster_snapshot(cluster, snapshot_id).await?.is_none() {
            return Ok(());
        }
        match self
            .ec2
            .delete_snapshot()
            .snapshot_id(snapshot_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match errors::code(&e) {
                Some("InvalidSnapshot.NotFound") => Ok(()),
                Some("InvalidSnapshot.InUse") => Err(CloudError::Conflict(format!(
                    "snapshot {snapshot_id} is in use by an image"
                ))),
                _ => Err(errors::cloud_error("DeleteSnapshot", e)),
            },
        }
    }

    async fn list_snapshots(&self, cluster: &str) -> Result<Vec<Snapshot>> {
        let found = self
            .describe_snapshots(vec![tags::filter("tag-key", [tags::cluster_key(cluster)])])
            .await?;
        Ok(found.iter().filter_map(to_snapshot).collect())
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::VolumeAttachment as Ec2Attachment;
    use ccm_provider::volumes::VolumeOwner;

    use super::*;

    fn spec(name: &str, size_bytes: i64) -> VolumeSpec {
        VolumeSpec {
            name: name.to_owned(),
            size_bytes,
            ..VolumeSpec::default()
        }
    }

    fn with(mut spec: VolumeSpec, key: &str, value: &str) -> VolumeSpec {
        spec.parameters.insert(key.to_owned(), value.to_owned());
        spec
    }

    fn invalid_fields(err: CloudError) -> Vec<String> {
        match err {
            CloudError::InvalidArgument(v) => v.into_iter().map(|(f, _)| f).collect(),
            other => panic!("not invalid: {other:?}"),
        }
    }

    #[test]
    fn sizes_round_up_to_whole_gib_within_the_limit() {
        assert_eq!(round_gib(1, 0), Ok(1));
        assert_eq!(round_gib(GIB, 0), Ok(1));
        assert_eq!(round_gib(GIB + 1, 0), Ok(2));
        assert_eq!(round_gib(GIB + 1, 2 * GIB), Ok(2));
        assert!(round_gib(GIB + 1, GIB + 1).is_err());
        assert!(round_gib(0, 0).is_err());
    }

    #[test]
    fn parameters_default_to_gp3_and_are_read_in_any_case() {
        assert_eq!(check_spec(&spec("a", GIB)).unwrap().volume_type, "gp3");
        let s = with(spec("a", GIB), "Type", "IO2");
        let s = with(s, "IOPS", "3000");
        let s = with(s, "encrypted", "true");
        let s = with(s, "kmsKeyId", "arn:aws:kms:key");
        let wanted = check_spec(&s).unwrap();
        assert_eq!(
            wanted,
            Wanted {
                size_gib: 1,
                volume_type: "io2".into(),
                iops: Some(3000),
                throughput: None,
                encrypted: true,
                kms_key_id: Some("arn:aws:kms:key".into()),
            }
        );
    }

    #[test]
    fn every_unknown_or_wrong_parameter_is_named_at_once() {
        let s = with(spec("a", GIB), "color", "blue");
        let s = with(s, "blocksize", "4096");
        let s = with(s, "type", "gp9");
        let s = with(s, "throughput", "fast");
        let mut fields = invalid_fields(check_spec(&s).unwrap_err());
        fields.sort();
        assert_eq!(
            fields,
            [
                "parameters[\"blocksize\"]",
                "parameters[\"color\"]",
                "parameters[\"throughput\"]",
                "parameters[\"type\"]",
            ]
        );
        let s = with(spec("a", GIB), "type", "gp2");
        let s = with(s, "throughput", "200");
        let s = with(s, "kmsKeyId", "k");
        assert_eq!(
            invalid_fields(check_spec(&s).unwrap_err()),
            ["parameters[\"throughput\"]", "parameters[\"kmsKeyId\"]"]
        );
        let s = with(spec("a", GIB), "type", "io1");
        assert_eq!(
            invalid_fields(check_spec(&s).unwrap_err()),
            ["parameters[\"iops\"]"]
        );
    }

    #[test]
    fn mutable_parameters_are_made_with_the_volume_over_the_storage_classs() {
        let mut s = with(spec("a", GIB), "type", "gp2");
        s.mutable_parameters.insert("Type".into(), "gp3".into());
        s.mutable_parameters.insert("iops".into(), "4000".into());
        let wanted = check_spec(&s).unwrap();
        assert_eq!(
            (wanted.volume_type.as_str(), wanted.iops),
            ("gp3", Some(4000))
        );
        // Only type, IOPS and throughput change after; encryption is made once.
        s.mutable_parameters
            .insert("encrypted".into(), "true".into());
        assert_eq!(
            invalid_fields(check_spec(&s).unwrap_err()),
            ["mutable_parameters[\"encrypted\"]"]
        );
    }

    #[test]
    fn a_modification_is_checked_and_made_only_where_the_volume_differs() {
        let asked = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        let mut problems = Vec::new();
        let change = Change::of(
            &asked(&[("TYPE", "GP3"), ("iops", "5000"), ("throughput", "250")]),
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            change,
            Change {
                volume_type: Some("gp3".into()),
                iops: Some(5000),
                throughput: Some(250),
            }
        );
        Change::of(
            &asked(&[("encrypted", "true"), ("iops", "0"), ("type", "gp9")]),
            &mut problems,
        );
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "parameters[\"encrypted\"]",
                "parameters[\"iops\"]",
                "parameters[\"type\"]"
            ]
        );
        let mut volume = Volume::default();
        for (k, v) in [(TYPE, "gp3"), (IOPS, "5000"), (THROUGHPUT, "250")] {
            volume.attributes.insert(k.to_owned(), v.to_owned());
        }
        assert!(change.made_in(&volume));
        assert!(Change::default().made_in(&volume));
        volume.attributes.insert(IOPS.to_owned(), "3000".to_owned());
        assert!(!change.made_in(&volume));
        let mut problems = Vec::new();
        fits("gp2", Some(3000), Some(125), &mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }

    #[test]
    fn the_client_token_is_the_names_sha256_in_hex() {
        let token = client_token("pvc-1", 1);
        assert_eq!(token.len(), 64);
        assert_eq!(
            client_token("", 1),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // The next ones: of the name with -2, -3, …, as long.
        assert_eq!(client_token("pvc-1", 2), client_token("pvc-1-2", 1));
        assert_eq!(client_token("pvc-1", 3).len(), 64);
    }

    #[tokio::test]
    async fn a_client_token_used_before_with_other_parameters_is_followed_by_the_next() {
        let mismatch = |e: &&str| *e == "mismatch";
        let tried = std::sync::Mutex::new(Vec::new());
        // EC2 knows the first two tokens from creates with other parameters.
        let spent = [client_token("pvc-1", 1), client_token("pvc-1", 2)];
        let made = with_client_tokens(
            "pvc-1",
            |token| {
                tried.lock().unwrap().push(token.clone());
                let answer = if spent.contains(&token) {
                    Err("mismatch")
                } else {
                    Ok("vol-1")
                };
                async move { answer }
            },
            mismatch,
        )
        .await;
        assert_eq!(made, Ok("vol-1"));
        assert_eq!(
            *tried.lock().unwrap(),
            [1, 2, 3].map(|n| client_token("pvc-1", n))
        );
        // Another error is answered at once; past the last token, its
        // mismatch is.
        let tries = std::sync::atomic::AtomicU32::new(0);
        let refused: Result<(), &str> = with_client_tokens(
            "pvc-1",
            |_| {
                tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Err("VolumeLimitExceeded") }
            },
            mismatch,
        )
        .await;
        assert_eq!(refused, Err("VolumeLimitExceeded"));
        assert_eq!(tries.load(std::sync::atomic::Ordering::SeqCst), 1);
        let tries = std::sync::atomic::AtomicU32::new(0);
        let spent: Result<(), &str> = with_client_tokens(
            "pvc-1",
            |_| {
                tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Err("mismatch") }
            },
            mismatch,
        )
        .await;
        assert_eq!(spent, Err("mismatch"));
        assert_eq!(
            tries.load(std::sync::atomic::Ordering::SeqCst),
            CLIENT_TOKENS
        );
    }

    #[test]
    fn new_volumes_carry_upstreams_tags_and_the_cluster_tag() {
        let mut s = spec("pvc-1", GIB);
        s.owner = Some(VolumeOwner {
            pvc_namespace: "shop".into(),
            pvc_name: "data".into(),
            pv_name: "pvc-1".into(),
        });
        let tags = volume_tags("kubernetes", &s);
        for pair in [
            ("CSIVolumeName", "pvc-1"),
            ("ebs.csi.aws.com/cluster", "true"),
            ("kubernetes.io/cluster/kubernetes", "owned"),
            ("kubernetes.io/created-for/pvc/name", "data"),
            ("kubernetes.io/created-for/pvc/namespace", "shop"),
            ("kubernetes.io/created-for/pv/name", "pvc-1"),
        ] {
            assert!(
                tags.contains(&(pair.0.to_owned(), pair.1.to_owned())),
                "{pair:?}"
            );
        }
        assert_eq!(volume_tags("kubernetes", &spec("pvc-1", GIB)).len(), 3);
    }

    #[test]
    fn a_volume_of_the_same_name_fits_only_with_the_same_size_type_zone_and_source() {
        let volume = Volume {
            id: "vol-1".into(),
            size_bytes: 2 * GIB,
            zone: "us-east-1a".into(),
            attributes: [(TYPE.to_owned(), "gp3".to_owned())].into(),
            ..Volume::default()
        };
        let fits = |s: &VolumeSpec| differences(&volume, s, &check_spec(s).unwrap()).is_empty();
        assert!(fits(&spec("a", 2 * GIB)));
        assert!(fits(&spec("a", 2 * GIB - 5)));
        assert!(!fits(&spec("a", 3 * GIB)));
        assert!(!fits(&with(spec("a", 2 * GIB), "type", "gp2")));
        let mut elsewhere = spec("a", 2 * GIB);
        elsewhere.zones = vec!["us-east-1b".into()];
        assert!(!fits(&elsewhere));
        elsewhere.zones.push("us-east-1a".into());
        assert!(fits(&elsewhere));
        let mut restored = spec("a", 2 * GIB);
        restored.source_snapshot_id = "snap-1".into();
        assert!(!fits(&restored));
    }

    #[test]
    fn ec2_volumes_read_with_live_attachments_and_attributes() {
        let v = Ec2Volume::builder()
            .volume_id("vol-1")
            .size(5)
            .availability_zone("us-east-1a")
            .state(Ec2VolumeState::InUse)
            .volume_type(VolumeType::Gp3)
            .iops(3000)
            .tags(Tag::builder().key("CSIVolumeName").value("pvc-1").build())
            .attachments(
                Ec2Attachment::builder()
                    .instance_id("i-1")
                    .device("/dev/xvdaa")
                    .state(VolumeAttachmentState::Attached)
                    .build(),
            )
            .attachments(
                Ec2Attachment::builder()
                    .instance_id("i-2")
                    .device("/dev/xvdab")
                    .state(VolumeAttachmentState::Detached)
                    .build(),
            )
            .build();
        let volume = to_volume(&v).unwrap();
        assert_eq!(volume.name, "pvc-1");
        assert_eq!(volume.size_bytes, 5 * GIB);
        assert_eq!(volume.state, VolumeState::InUse);
        assert_eq!(
            volume.attachments,
            [VolumeAttachment {
                instance_id: "i-1".into(),
                device: "/dev/xvdaa".into(),
                state: AttachmentState::Attached,
            }]
        );
        assert_eq!(volume.attributes["type"], "gp3");
        assert_eq!(volume.attributes["iops"], "3000");
        assert_eq!(volume.attributes["encrypted"], "false");
        let creating = Ec2Volume::builder()
            .volume_id("vol-2")
            .state(Ec2VolumeState::Creating)
            .build();
        assert_eq!(to_volume(&creating).unwrap().state, VolumeState::Creating);
        let deleted = Ec2Volume::builder()
            .volume_id("vol-3")
            .state(Ec2VolumeState::Deleted)
            .build();
        assert_eq!(to_volume(&deleted), None);
    }

    #[test]
    fn attach_refusals_map_as_upstream_reads_them() {
        let of = |code: &str, message: &str| attach_refusal(code, message);
        assert!(matches!(
            of("VolumeInUse", "vol-1 is already attached to an instance"),
            Some(CloudError::VolumeInUse(_))
        ));
        assert!(matches!(
            of("IncorrectState", "vol-1 is in-use"),
            Some(CloudError::VolumeInUse(_))
        ));
        assert!(matches!(
            of("InvalidVolume.ZoneMismatch", "not in the same zone"),
            Some(CloudError::ZoneMismatch(_))
        ));
        assert!(matches!(
            of("AttachmentLimitExceeded", "limit"),
            Some(CloudError::AttachLimit(_))
        ));
        for code in ["InvalidVolume.NotFound", "InvalidInstanceID.NotFound"] {
            assert!(
                matches!(of(code, ""), Some(CloudError::NotFound(_))),
                "{code}"
            );
        }
        assert!(matches!(
            of(
                "InvalidParameterValue",
                "Invalid value '/dev/xvdaa' for unixDevice. Attachment point /dev/xvdaa is already in use"
            ),
            Some(CloudError::Conflict(_))
        ));
        assert_eq!(of("InternalError", "oops"), None);
    }

    #[test]
    fn a_volume_without_a_zone_goes_to_one_zone_for_its_name() {
        let zones = || vec!["us-east-1b".to_owned(), "us-east-1a".to_owned()];
        let first = zone_for("pvc-1", zones()).unwrap();
        assert_eq!(zone_for("pvc-1", zones()), Some(first));
        let spread: std::collections::BTreeSet<String> = (0..20)
            .filter_map(|i| zone_for(&format!("pvc-{i}"), zones()))
            .collect();
        assert_eq!(spread.len(), 2);
        assert_eq!(zone_for("pvc-1", Vec::new()), None);
    }

    #[test]
    fn the_offer_is_upstreams_driver_and_node_parameters() {
        let names = ebs_device_names();
        assert_eq!(names.first().map(String::as_str), Some("/dev/xvdaa"));
        assert!(NODE_PARAMETERS.iter().all(|p| *p == p.to_ascii_lowercase()));
        assert_eq!(DEFAULT_SIZE_GIB * GIB, 100 << 30);
    }
}
