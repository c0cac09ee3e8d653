//! `Volumes`: a cluster's block volumes and snapshots, through the budget.
//! The gateway is their one owner where one is needed: a volume's name is
//! made one call at a time (so two creates of one name make one volume),
//! and each instance's device names are picked one attach at a time, from
//! what the cloud says is in use, so two attaches to one instance never
//! get one name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use ccm_proto::v1::volumes_server::Volumes;
use ccm_proto::v1::{self as wire};
use ccm_provider::volumes::{
    AttachmentState, Snapshot, Volume, VolumeAttachment, VolumeOwner, VolumeSpec, VolumeState,
};
use ccm_provider::{CloudError, Operation};
use ccm_runtime::config_checks::quote;
use tonic::{Request, Response, Status};

use super::status::answer;
use super::validate::Violations;
use crate::cloud::budget::Priority;
use crate::cloud::instance_lookups::LookupConfig;
use crate::cloud::one_at_a_time::OneAtATime;
use crate::cloud::volume_reads::VolumeReads;
use crate::cloud::{Audit, Cloud};
use crate::identity::Caller;

use crate::limits::{
    MAX_VOLUME_ID as MAX_ID, MAX_VOLUME_PARAMETER_KEY as MAX_PARAMETER_KEY,
    MAX_VOLUME_PARAMETER_VALUE as MAX_PARAMETER_VALUE, MAX_VOLUME_PARAMETERS as MAX_PARAMETERS,
    MAX_VOLUME_ZONES as MAX_ZONES,
};

/// How soon to ask again about a volume or attachment the cloud is still
/// making: the caller, once the gateway stops waiting, and the gateway
/// itself while it waits.
const STILL_MAKING: Duration = Duration::from_secs(1);

/// How long a create or attach waits for the cloud to finish before it
/// answers `PROVISIONING`: well inside the callers' deadlines (the
/// gateway client's 10 s, the external-provisioner's 10 s and the
/// external-attacher's 15 s `--timeout`), and long enough for most
/// volumes and attachments, which a cloud makes in seconds.
const WAIT_AT_MOST: Duration = Duration::from_secs(5);

/// How long until the gateway's next tick of [`STILL_MAKING`]: when
/// every waiter reads.
fn next_tick() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let period = STILL_MAKING.as_nanos();
    let into = START.get_or_init(Instant::now).elapsed().as_nanos() % period;
    Duration::from_nanos(u64::try_from(period - into).unwrap_or(0))
}

/// The Volumes service.
pub struct VolumesService {
    cloud: Arc<Cloud>,
    /// Volume names being made.
    names: OneAtATime,
    /// Instances whose device names are being picked.
    instances: OneAtATime,
    /// The device names known in use on each instance.
    devices: Devices,
    /// Reads of volumes, gathered.
    reads: Arc<VolumeReads>,
    /// The provider's device names, in the order they are handed out
    /// (its offer is fixed; read once).
    device_names: Vec<String>,
    /// Volumes made lately, by cluster and name: the spec and the ID.
    made: Recent<(String, String), (VolumeSpec, String)>,
    /// Attachments made lately.
    attached: Recent<AttachmentKey, ()>,
    /// Attachments seen still attaching, by cluster, volume ID and
    /// instance ID: since when, and under which device name.
    attaching: std::sync::Mutex<HashMap<AttachmentKey, (Instant, String)>>,
    /// How long an attachment may stay attaching before it is detached.
    stuck_after: Duration,
    /// Device names an attachment got stuck under, by instance: not
    /// handed out there again while this gateway runs, as upstream's
    /// device allocator marks them.
    stuck_names: std::sync::Mutex<HashMap<String, BTreeSet<String>>>,
}

/// An attachment: cluster, volume ID, instance ID.
type AttachmentKey = (String, String, String);

/// How long the gateway remembers a volume or attachment it made. A
/// caller that gave up waiting (its deadline passed while the budget was
/// busy) asks again: the answer is then read, in a gathered read, rather
/// than made again, which would cost another write against the budget.
const MADE_MEMORY: Duration = Duration::from_secs(120);

/// What was made lately, for [`MADE_MEMORY`].
struct Recent<K, V>(std::sync::Mutex<HashMap<K, (Instant, V)>>);

impl<K: std::hash::Hash + Eq, V: Clone> Recent<K, V> {
    fn new() -> Self {
        Self(std::sync::Mutex::new(HashMap::new()))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, (Instant, V)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, key: &K) -> Option<V> {
        self.map()
            .get(key)
            .filter(|(at, _)| at.elapsed() < MADE_MEMORY)
            .map(|(_, v)| v.clone())
    }

    /// Remembers `key`, forgetting what is past its time.
    fn remember(&self, key: K, value: V) {
        let mut map = self.map();
        map.retain(|_, (at, _)| at.elapsed() < MADE_MEMORY);
        map.insert(key, (Instant::now(), value));
    }

    fn forget(&self, key: &K) {
        self.map().remove(key);
    }
}

/// How long the gateway trusts what it knows of an instance's device
/// names: the cloud's answer, and the names it handed out since. Attaches
/// to one instance in a burst (a node's Pods scheduled together) then ask
/// the cloud once; a name used behind the gateway's back is found by the
/// cloud refusing it, and read afresh.
const DEVICE_MEMORY: Duration = Duration::from_secs(30);

/// The device names known in use, by instance: one allocator per
/// instance, owned by the gateway.
#[derive(Debug, Default)]
struct Devices {
    known: std::sync::Mutex<HashMap<String, (std::time::Instant, BTreeSet<String>)>>,
    /// [`DEVICE_MEMORY`], or zero to ask the cloud before every attach.
    memory: Duration,
}

impl Devices {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (std::time::Instant, BTreeSet<String>)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known in use on `instance`, if it is remembered still.
    fn remembered(&self, instance: &str) -> Option<BTreeSet<String>> {
        let map = self.map();
        let (read_at, used) = map.get(instance)?;
        (read_at.elapsed() < self.memory).then(|| used.clone())
    }

    /// Remembers the cloud's answer for `instance`, forgetting answers past
    /// their time, so the map holds only instances attached to lately.
    fn remember(&self, instance: &str, used: &[String]) {
        let mut map = self.map();
        map.retain(|_, (read_at, _)| read_at.elapsed() < self.memory);
        map.insert(
            instance.to_owned(),
            (std::time::Instant::now(), used.iter().cloned().collect()),
        );
    }

    /// Notes a name handed out on `instance`.
    fn taken(&self, instance: &str, device: &str) {
        if let Some((_, used)) = self.map().get_mut(instance) {
            used.insert(device.to_owned());
        }
    }

    /// Forgets what is known of `instance`.
    fn forget(&self, instance: &str) {
        self.map().remove(instance);
    }
}

impl VolumesService {
    /// Serves volumes of `cloud`. Without a cache (`lookups.cache_ttl`
    /// zero, the upstream profile) each attach reads its instance's
    /// devices afresh.
    pub fn new(cloud: Arc<Cloud>, lookups: LookupConfig, stuck_after: Duration) -> Self {
        Self {
            devices: Devices {
                known: Default::default(),
                memory: if lookups.cache_ttl.is_zero() {
                    Duration::ZERO
                } else {
                    DEVICE_MEMORY
                },
            },
            reads: VolumeReads::new(cloud.clone(), lookups),
            device_names: cloud
                .volume_offer()
                .map(|o| o.device_names)
                .unwrap_or_default(),
            made: Recent::new(),
            attached: Recent::new(),
            attaching: Default::default(),
            stuck_after,
            stuck_names: Default::default(),
            cloud,
            names: OneAtATime::default(),
            instances: OneAtATime::default(),
        }
    }

    /// A device name free on `instance_id`: the first of the provider's
    /// names neither the cloud said is in use nor this gateway handed out
    /// since. The cloud is asked once per instance while its answer is
    /// remembered ([`DEVICE_MEMORY`]), or when `fresh`. Called with the
    /// instance's turn held.
    async fn free_device(
        &self,
        cluster: &str,
        instance_id: &str,
        fresh: bool,
    ) -> Result<String, CloudError> {
        let used = match self.devices.remembered(instance_id).filter(|_| !fresh) {
            Some(used) => used,
            None => {
                let used = self
                    .cloud
                    .volumes()?
                    .call(Operation::VolumeDevices, Priority::Normal, None, |v| {
                        v.devices_in_use(cluster, instance_id)
                    })
                    .await?;
                self.devices.remember(instance_id, &used);
                used.into_iter().collect()
            }
        };
        let stuck = self
            .stuck_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(instance_id)
            .cloned()
            .unwrap_or_default();
        self.device_names
            .iter()
            .find(|d| !used.contains(*d) && !stuck.contains(*d))
            .cloned()
            .ok_or_else(|| {
                CloudError::AttachLimit(format!(
                    "instance {instance_id} has no device name left ({} in use)",
                    used.len()
                ))
            })
    }

    /// Whether the attachment `key` (seen attaching under `device`) has
    /// been attaching longer than `stuck_after` since this gateway first
    /// saw it so; notes when it first did.
    fn stuck(&self, key: &AttachmentKey, device: &str) -> bool {
        let mut attaching = self.attaching.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Forget attachments first seen long ago: their caller gave up,
        // or they finished through another gateway.
        attaching.retain(|_, (since, _)| now.duration_since(*since) < 10 * self.stuck_after);
        let (since, seen) = attaching
            .entry(key.clone())
            .or_insert_with(|| (now, device.to_owned()));
        if seen != device {
            *since = now;
            device.clone_into(seen);
        }
        now.duration_since(*since) >= self.stuck_after
    }

    /// Detaches the attachment `key`, stuck attaching under `device` (a
    /// name the instance's system holds, as upstream explains its 90 s
    /// rule), so that the caller's next attach starts over under another
    /// name: `device` is not handed out on that instance again. The answer
    /// for the caller: `PROVISIONING`, to ask again.
    async fn detach_stuck(&self, caller: &str, key: &AttachmentKey, device: &str) -> CloudError {
        let (cluster, volume_id, instance_id) = key;
        tracing::warn!(
            volume = %volume_id,
            instance = %instance_id,
            device,
            after = ?self.stuck_after,
            "attachment stuck attaching; detaching it to attach again under another device name"
        );
        self.stuck_names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(instance_id.clone())
            .or_default()
            .insert(device.to_owned());
        self.attached.forget(key);
        let resource = format!("volume/{volume_id}-x-{instance_id}");
        let detached = self
            .mutate(Operation::DetachVolume, caller, cluster, &resource, |v| {
                v.detach(cluster, volume_id, instance_id)
            })
            .await;
        let done = match detached {
            Ok(()) => "detached",
            Err(CloudError::Provisioning { .. }) => "being detached",
            // Still stuck: the next attach asks again at once.
            Err(e) => return e,
        };
        self.attaching
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        CloudError::Provisioning {
            retry_after: STILL_MAKING,
            message: format!(
                "volume {volume_id} was stuck attaching to instance {instance_id} as {device} \
                 for {:?}; {done}, to be attached again under another device name",
                self.stuck_after
            ),
        }
    }

    async fn get(&self, cluster: &str, volume_id: &str) -> Result<Option<Volume>, CloudError> {
        self.reads.get(cluster, volume_id).await
    }

    /// Reads the volume every [`STILL_MAKING`] until `done` holds of it,
    /// for at most [`WAIT_AT_MOST`] from `since`; then `PROVISIONING`,
    /// for the caller to ask again. Every waiter reads on the same ticks,
    /// so the reads of all fall in one batch: a thousand waiters cost
    /// about a read a second.
    async fn wait_until(
        &self,
        since: Instant,
        cluster: &str,
        volume_id: &str,
        done: impl Fn(&Volume) -> bool,
        still: impl FnOnce() -> String,
    ) -> Result<Volume, CloudError> {
        loop {
            let tick = next_tick();
            if since.elapsed() + tick > WAIT_AT_MOST {
                return Err(CloudError::Provisioning {
                    retry_after: STILL_MAKING,
                    message: still(),
                });
            }
            tokio::time::sleep(tick).await;
            let volume = self
                .get(cluster, volume_id)
                .await?
                .ok_or_else(|| CloudError::NotFound(format!("volume {volume_id}")))?;
            if done(&volume) {
                return Ok(volume);
            }
        }
    }

    /// Runs a call that changes the cloud, audit-logged.
    async fn mutate<'a, T, F>(
        &'a self,
        op: Operation,
        caller: &str,
        cluster: &str,
        resource: &str,
        call: impl FnOnce(&'a (dyn ccm_provider::Volumes + 'a)) -> F,
    ) -> Result<T, CloudError>
    where
        F: Future<Output = Result<T, CloudError>>,
    {
        self.cloud
            .volumes()?
            .call(
                op,
                Priority::Normal,
                Some(Audit {
                    caller,
                    cluster,
                    resource,
                }),
                call,
            )
            .await
    }
}

/// An ID or name: 1 to 128 printable ASCII characters.
fn id(v: &mut Violations, field: &str, value: &str) {
    let len = value.chars().count();
    if !(1..=MAX_ID).contains(&len) || !value.chars().all(|c| c.is_ascii_graphic()) {
        v.add(
            field,
            format!(
                "{} is not 1 to {MAX_ID} printable ASCII characters without spaces",
                quote(value)
            ),
        );
    }
}

/// An optional ID: empty, or as [`id`].
fn optional_id(v: &mut Violations, field: &str, value: &str) {
    if !value.is_empty() {
        id(v, field, value);
    }
}

/// A provider's parameters: at most 32, keys of 1 to 317 characters,
/// values of at most 1024.
fn parameters(v: &mut Violations, field: &str, parameters: &HashMap<String, String>) {
    if parameters.len() > MAX_PARAMETERS {
        v.add(
            field,
            format!(
                "holds {} entries; at most {MAX_PARAMETERS}",
                parameters.len()
            ),
        );
        return;
    }
    let mut keys: Vec<&String> = parameters.keys().collect();
    keys.sort();
    for key in keys {
        if !(1..=MAX_PARAMETER_KEY).contains(&key.chars().count()) {
            v.add(
                field,
                format!(
                    "key {} is not 1 to {MAX_PARAMETER_KEY} characters",
                    quote(key)
                ),
            );
        }
        if parameters[key].chars().count() > MAX_PARAMETER_VALUE {
            v.add(
                format!("{field}[{}]", quote(key)),
                format!("is longer than {MAX_PARAMETER_VALUE} characters"),
            );
        }
    }
}

/// Sizes: neither negative, the limit (when set) not below the size.
fn sizes(v: &mut Violations, size: i64, limit: i64) {
    if size < 0 {
        v.add("size_bytes", format!("{size} is negative"));
    }
    if limit < 0 {
        v.add("limit_bytes", format!("{limit} is negative"));
    }
    if limit > 0 && size > limit {
        v.add(
            "limit_bytes",
            format!("{limit} is below size_bytes ({size})"),
        );
    }
}

fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

/// The entries of `all` (ordered by ID) after `starting_token`, at most
/// `max` (0: all), and the token of the next page.
fn page<T>(
    all: Vec<T>,
    id: impl Fn(&T) -> &str,
    starting_token: &str,
    max: u32,
) -> (Vec<T>, String) {
    let mut rest: Vec<T> = all
        .into_iter()
        .filter(|x| starting_token.is_empty() || id(x) > starting_token)
        .collect();
    let max = max as usize;
    if max == 0 || rest.len() <= max {
        return (rest, String::new());
    }
    rest.truncate(max);
    let next = rest.last().map(|x| id(x).to_owned()).unwrap_or_default();
    (rest, next)
}

fn volume_to_wire(volume: Volume) -> wire::Volume {
    wire::Volume {
        id: volume.id,
        name: volume.name,
        size_bytes: volume.size_bytes,
        zone: volume.zone,
        state: match volume.state {
            VolumeState::Creating => wire::VolumeState::Creating,
            VolumeState::Available => wire::VolumeState::Available,
            VolumeState::InUse => wire::VolumeState::InUse,
            VolumeState::Deleting => wire::VolumeState::Deleting,
            VolumeState::Error => wire::VolumeState::Error,
        } as i32,
        attachments: volume
            .attachments
            .into_iter()
            .map(|a| wire::VolumeAttachment {
                instance_id: a.instance_id,
                device: a.device,
                state: attachment_state_to_wire(a.state) as i32,
            })
            .collect(),
        source_snapshot_id: volume.source_snapshot_id,
        source_volume_id: volume.source_volume_id,
        attributes: volume.attributes.into_iter().collect(),
    }
}

fn attachment_state_to_wire(state: AttachmentState) -> wire::AttachmentState {
    match state {
        AttachmentState::Attaching => wire::AttachmentState::Attaching,
        AttachmentState::Attached => wire::AttachmentState::Attached,
        AttachmentState::Detaching => wire::AttachmentState::Detaching,
    }
}

fn snapshot_to_wire(snapshot: Snapshot) -> wire::Snapshot {
    let since_epoch = snapshot
        .created_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    wire::Snapshot {
        id: snapshot.id,
        name: snapshot.name,
        source_volume_id: snapshot.source_volume_id,
        size_bytes: snapshot.size_bytes,
        created_at: Some(prost_types::Timestamp {
            seconds: i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0),
        }),
        ready_to_use: snapshot.ready_to_use,
    }
}

/// A volume the cloud still makes is asked about again; one it failed to
/// make can only be deleted.
fn made(volume: Volume) -> Result<Volume, CloudError> {
    match volume.state {
        VolumeState::Creating => Err(CloudError::Provisioning {
            retry_after: STILL_MAKING,
            message: format!("volume {} is still being made", volume.id),
        }),
        VolumeState::Error => Err(CloudError::Unavailable(format!(
            "the cloud failed to make volume {} ({}); delete it and create it again",
            volume.id, volume.name
        ))),
        _ => Ok(volume),
    }
}

#[tonic::async_trait]
impl Volumes for VolumesService {
    async fn create_volume(
        &self,
        request: Request<wire::CreateVolumeRequest>,
    ) -> Result<Response<wire::CreateVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "name", &req.name);
            sizes(&mut v, req.size_bytes, req.limit_bytes);
            if req.zones.len() > MAX_ZONES {
                v.add(
                    "zones",
                    format!("names {} zones; at most {MAX_ZONES}", req.zones.len()),
                );
            }
            for (i, zone) in req.zones.iter().enumerate() {
                id(&mut v, &format!("zones[{i}]"), zone);
            }
            parameters(&mut v, "parameters", &req.parameters);
            parameters(&mut v, "mutable_parameters", &req.mutable_parameters);
            optional_id(&mut v, "source_snapshot_id", &req.source_snapshot_id);
            optional_id(&mut v, "source_volume_id", &req.source_volume_id);
            if !req.source_snapshot_id.is_empty() && !req.source_volume_id.is_empty() {
                v.add(
                    "source_volume_id",
                    "at most one source: a snapshot or a volume",
                );
            }
            if let Some(owner) = &req.owner {
                for (field, value) in [
                    ("owner.pvc_namespace", &owner.pvc_namespace),
                    ("owner.pvc_name", &owner.pvc_name),
                    ("owner.pv_name", &owner.pv_name),
                ] {
                    if value.chars().count() > 253 {
                        v.add(field, "is longer than 253 characters");
                    }
                }
            }
            let offer = self.cloud.volume_offer();
            if let Some(offer) = &offer {
                if !offer.clones && !req.source_volume_id.is_empty() {
                    v.add("source_volume_id", "this provider cannot copy volumes");
                }
                if !offer.snapshots && !req.source_snapshot_id.is_empty() {
                    v.add("source_snapshot_id", "this provider has no snapshots");
                }
            }
            v.finish()?;
            let default_size = offer.map_or(0, |o| o.default_size_bytes);
            let spec = VolumeSpec {
                size_bytes: if req.size_bytes == 0 {
                    default_size
                } else {
                    req.size_bytes
                },
                name: req.name,
                limit_bytes: req.limit_bytes,
                zones: req.zones,
                parameters: sorted(req.parameters),
                owner: req.owner.map(|o| VolumeOwner {
                    pvc_namespace: o.pvc_namespace,
                    pvc_name: o.pvc_name,
                    pv_name: o.pv_name,
                }),
                source_snapshot_id: req.source_snapshot_id,
                source_volume_id: req.source_volume_id,
                mutable_parameters: sorted(req.mutable_parameters),
            };
            let since = Instant::now();
            let name = self.names.hold(&spec.name).await;
            let key = (req.cluster_name.clone(), spec.name.clone());
            // Made lately under this name and spec: read, not made again.
            let known = match self.made.get(&key).filter(|(made, _)| *made == spec) {
                Some((_, id)) => self
                    .get(&req.cluster_name, &id)
                    .await?
                    .filter(|v| v.state != VolumeState::Deleting),
                None => None,
            };
            let mut volume = match known {
                Some(volume) => volume,
                None => {
                    let resource = format!("volume/{}", spec.name);
                    let volume = self
                        .mutate(
                            Operation::CreateVolume,
                            &caller,
                            &req.cluster_name,
                            &resource,
                            |v| v.create(&req.cluster_name, &spec),
                        )
                        .await?;
                    self.made.remember(key, (spec, volume.id.clone()));
                    volume
                }
            };
            drop(name);
            if volume.state == VolumeState::Creating {
                let id = volume.id.clone();
                volume = self
                    .wait_until(
                        since,
                        &req.cluster_name,
                        &id,
                        |v| v.state != VolumeState::Creating,
                        || format!("volume {id} is still being made"),
                    )
                    .await?;
            }
            Ok(Response::new(wire::CreateVolumeResponse {
                volume: Some(volume_to_wire(made(volume)?)),
            }))
        })
        .await
    }

    async fn delete_volume(
        &self,
        request: Request<wire::DeleteVolumeRequest>,
    ) -> Result<Response<wire::DeleteVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            v.finish()?;
            let resource = format!("volume/{}", req.volume_id);
            self.mutate(
                Operation::DeleteVolume,
                &caller,
                &req.cluster_name,
                &resource,
                |v| v.delete(&req.cluster_name, &req.volume_id),
            )
            .await?;
            Ok(Response::new(wire::DeleteVolumeResponse {}))
        })
        .await
    }

    async fn get_volume(
        &self,
        request: Request<wire::GetVolumeRequest>,
    ) -> Result<Response<wire::GetVolumeResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            v.finish()?;
            let volume = self
                .get(&req.cluster_name, &req.volume_id)
                .await?
                .ok_or_else(|| CloudError::NotFound(format!("volume {}", req.volume_id)))?;
            Ok(Response::new(wire::GetVolumeResponse {
                volume: Some(volume_to_wire(volume)),
            }))
        })
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<wire::ListVolumesRequest>,
    ) -> Result<Response<wire::ListVolumesResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            optional_id(&mut v, "starting_token", &req.starting_token);
            v.finish()?;
            let mut all = self
                .cloud
                .volumes()?
                .call(Operation::ListVolumes, Priority::Normal, None, |v| {
                    v.list(&req.cluster_name)
                })
                .await?;
            all.sort_by(|a, b| a.id.cmp(&b.id));
            let (volumes, next_token) = page(all, |v| &v.id, &req.starting_token, req.max_entries);
            Ok(Response::new(wire::ListVolumesResponse {
                volumes: volumes.into_iter().map(volume_to_wire).collect(),
                next_token,
            }))
        })
        .await
    }

    async fn attach_volume(
        &self,
        request: Request<wire::AttachVolumeRequest>,
    ) -> Result<Response<wire::AttachVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            id(&mut v, "instance_id", &req.instance_id);
            v.finish()?;
            let cluster = req.cluster_name.as_str();
            let since = Instant::now();
            let key = (
                req.cluster_name.clone(),
                req.volume_id.clone(),
                req.instance_id.clone(),
            );
            // Attached lately: read, not attached again.
            let known = match self.attached.get(&key) {
                Some(()) => self
                    .get(cluster, &req.volume_id)
                    .await?
                    .and_then(|v| v.attachment_to(&req.instance_id).cloned()),
                None => None,
            };
            // One attach at a time per instance: the device picked below
            // stays free until the cloud has it.
            let instance = match known {
                Some(_) => None,
                None => Some(self.instances.hold(&req.instance_id).await),
            };
            // Otherwise no read of the volume first: the provider answers
            // an attachment to this instance that exists already, and
            // refuses a volume attached elsewhere, from its own read.
            let resource = format!("volume/{}->{}", req.volume_id, req.instance_id);
            let attachment = match known {
                Some(known) => known,
                None => {
                    let mut fresh = false;
                    loop {
                        let device = self.free_device(cluster, &req.instance_id, fresh).await?;
                        let attached = self
                            .mutate(Operation::AttachVolume, &caller, cluster, &resource, |v| {
                                v.attach(cluster, &req.volume_id, &req.instance_id, &device)
                            })
                            .await;
                        match attached {
                            Ok(attached) => {
                                self.devices.taken(&req.instance_id, &attached.device);
                                self.attached.remember(key.clone(), ());
                                break attached;
                            }
                            // A name the cloud had in use that the
                            // gateway did not know of (attached by hand):
                            // read the instance afresh, once.
                            Err(CloudError::Conflict(_)) if !fresh => {
                                self.devices.forget(&req.instance_id);
                                fresh = true;
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
            };
            // The cloud has the device now: the next attach to the
            // instance need not wait for this one to finish.
            drop(instance);
            if attachment.state == AttachmentState::Attaching
                && self.stuck(&key, &attachment.device)
            {
                return Err(self.detach_stuck(&caller, &key, &attachment.device).await);
            }
            if attachment.state != AttachmentState::Attached {
                let device = attachment.device.clone();
                self.wait_until(
                    since,
                    cluster,
                    &req.volume_id,
                    |v| {
                        v.attachment_to(&req.instance_id)
                            .is_some_and(|a| a.state == AttachmentState::Attached)
                    },
                    || {
                        format!(
                            "volume {} is still being attached to instance {} as {device}",
                            req.volume_id, req.instance_id
                        )
                    },
                )
                .await?;
            }
            self.attaching
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key);
            Ok(Response::new(wire::AttachVolumeResponse {
                device: attachment.device,
            }))
        })
        .await
    }

    async fn detach_volume(
        &self,
        request: Request<wire::DetachVolumeRequest>,
    ) -> Result<Response<wire::DetachVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            id(&mut v, "instance_id", &req.instance_id);
            v.finish()?;
            let since = Instant::now();
            let cluster = req.cluster_name.as_str();
            self.attached.forget(&(
                req.cluster_name.clone(),
                req.volume_id.clone(),
                req.instance_id.clone(),
            ));
            let resource = format!("volume/{}-x-{}", req.volume_id, req.instance_id);
            let detached = self
                .mutate(Operation::DetachVolume, &caller, cluster, &resource, |v| {
                    v.detach(cluster, &req.volume_id, &req.instance_id)
                })
                .await;
            match detached {
                // Still detaching: waited for as an attach is, until the
                // volume is attached there no more (by ID, or by the
                // provider ID that ends with it).
                Err(CloudError::Provisioning { .. }) => {
                    let here = |a: &VolumeAttachment| {
                        req.instance_id == a.instance_id
                            || req
                                .instance_id
                                .strip_suffix(a.instance_id.as_str())
                                .is_some_and(|p| p.ends_with('/'))
                    };
                    let gone = self
                        .wait_until(
                            since,
                            cluster,
                            &req.volume_id,
                            |v| !v.attachments.iter().any(here),
                            || {
                                format!(
                                    "volume {} is still being detached from instance {}",
                                    req.volume_id, req.instance_id
                                )
                            },
                        )
                        .await;
                    match gone {
                        Ok(_) | Err(CloudError::NotFound(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                other => other?,
            }
            Ok(Response::new(wire::DetachVolumeResponse {}))
        })
        .await
    }

    async fn expand_volume(
        &self,
        request: Request<wire::ExpandVolumeRequest>,
    ) -> Result<Response<wire::ExpandVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            if req.size_bytes <= 0 {
                v.add("size_bytes", format!("{} is not above 0", req.size_bytes));
            }
            sizes(&mut v, req.size_bytes, req.limit_bytes);
            v.finish()?;
            let cluster = req.cluster_name.as_str();
            let volume = self
                .get(cluster, &req.volume_id)
                .await?
                .ok_or_else(|| CloudError::NotFound(format!("volume {}", req.volume_id)))?;
            if volume.size_bytes >= req.size_bytes {
                return Ok(Response::new(wire::ExpandVolumeResponse {
                    size_bytes: volume.size_bytes,
                }));
            }
            let resource = format!("volume/{}", req.volume_id);
            let size_bytes = self
                .mutate(Operation::ExpandVolume, &caller, cluster, &resource, |v| {
                    v.expand(cluster, &req.volume_id, req.size_bytes)
                })
                .await?;
            if req.limit_bytes > 0 && size_bytes > req.limit_bytes {
                return Err(CloudError::invalid(
                    "limit_bytes",
                    format!(
                        "the volume is now {size_bytes} bytes, above the limit of {}",
                        req.limit_bytes
                    ),
                ));
            }
            Ok(Response::new(wire::ExpandVolumeResponse { size_bytes }))
        })
        .await
    }

    async fn modify_volume(
        &self,
        request: Request<wire::ModifyVolumeRequest>,
    ) -> Result<Response<wire::ModifyVolumeResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "volume_id", &req.volume_id);
            parameters(&mut v, "parameters", &req.parameters);
            v.finish()?;
            if req.parameters.is_empty() {
                // Nothing to change, but a volume that is not there is
                // NOT_FOUND, as CSI asks: a read, not a write.
                self.get(&req.cluster_name, &req.volume_id)
                    .await?
                    .ok_or_else(|| CloudError::NotFound(format!("volume {}", req.volume_id)))?;
                return Ok(Response::new(wire::ModifyVolumeResponse {}));
            }
            let cluster = req.cluster_name.as_str();
            let parameters = sorted(req.parameters);
            let resource = format!("volume/{}", req.volume_id);
            self.mutate(Operation::ModifyVolume, &caller, cluster, &resource, |v| {
                v.modify(cluster, &req.volume_id, &parameters)
            })
            .await?;
            Ok(Response::new(wire::ModifyVolumeResponse {}))
        })
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<wire::CreateSnapshotRequest>,
    ) -> Result<Response<wire::CreateSnapshotResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "name", &req.name);
            id(&mut v, "source_volume_id", &req.source_volume_id);
            parameters(&mut v, "parameters", &req.parameters);
            v.finish()?;
            let cluster = req.cluster_name.as_str();
            let parameters = sorted(req.parameters);
            let _name = self.names.hold(&format!("snapshot/{}", req.name)).await;
            let resource = format!("snapshot/{}", req.name);
            let snapshot = self
                .mutate(
                    Operation::CreateSnapshot,
                    &caller,
                    cluster,
                    &resource,
                    |v| v.create_snapshot(cluster, &req.name, &req.source_volume_id, &parameters),
                )
                .await?;
            Ok(Response::new(wire::CreateSnapshotResponse {
                snapshot: Some(snapshot_to_wire(snapshot)),
            }))
        })
        .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<wire::DeleteSnapshotRequest>,
    ) -> Result<Response<wire::DeleteSnapshotResponse>, Status> {
        answer(async move {
            let caller = Caller::name_of(&request);
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            id(&mut v, "snapshot_id", &req.snapshot_id);
            v.finish()?;
            let cluster = req.cluster_name.as_str();
            let resource = format!("snapshot/{}", req.snapshot_id);
            self.mutate(
                Operation::DeleteSnapshot,
                &caller,
                cluster,
                &resource,
                |v| v.delete_snapshot(cluster, &req.snapshot_id),
            )
            .await?;
            Ok(Response::new(wire::DeleteSnapshotResponse {}))
        })
        .await
    }

    async fn list_snapshots(
        &self,
        request: Request<wire::ListSnapshotsRequest>,
    ) -> Result<Response<wire::ListSnapshotsResponse>, Status> {
        answer(async move {
            let req = request.into_inner();
            let mut v = Violations::default();
            v.cluster_name(&req.cluster_name);
            optional_id(&mut v, "snapshot_id", &req.snapshot_id);
            optional_id(&mut v, "source_volume_id", &req.source_volume_id);
            optional_id(&mut v, "starting_token", &req.starting_token);
            v.finish()?;
            let mut all = self
                .cloud
                .volumes()?
                .call(Operation::ListSnapshots, Priority::Normal, None, |v| {
                    v.list_snapshots(&req.cluster_name)
                })
                .await?;
            all.retain(|s| {
                (req.snapshot_id.is_empty() || s.id == req.snapshot_id)
                    && (req.source_volume_id.is_empty()
                        || s.source_volume_id == req.source_volume_id)
            });
            all.sort_by(|a, b| a.id.cmp(&b.id));
            let (snapshots, next_token) =
                page(all, |s| &s.id, &req.starting_token, req.max_entries);
            Ok(Response::new(wire::ListSnapshotsResponse {
                snapshots: snapshots.into_iter().map(snapshot_to_wire).collect(),
                next_token,
            }))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_go_on_after_the_last_id_handed_out() {
        let ids: Vec<String> = (1..=5).map(|i| format!("vol-{i}")).collect();
        let (first, next) = page(ids.clone(), |s| s, "", 2);
        assert_eq!(first, ["vol-1", "vol-2"]);
        assert_eq!(next, "vol-2");
        let (second, next) = page(ids.clone(), |s| s, &next, 2);
        assert_eq!(second, ["vol-3", "vol-4"]);
        let (last, next) = page(ids.clone(), |s| s, &next, 2);
        assert_eq!(last, ["vol-5"]);
        assert_eq!(next, "", "the last page has no next token");
        let (all, next) = page(ids, |s| s, "", 0);
        assert_eq!((all.len(), next.as_str()), (5, ""));
    }

    #[test]
    fn a_bad_create_names_every_field() {
        let mut v = Violations::default();
        id(&mut v, "name", "");
        id(&mut v, "source_volume_id", "has space");
        sizes(&mut v, -1, 0);
        sizes(&mut v, 10, 5);
        let many: HashMap<String, String> =
            (0..40).map(|i| (format!("k{i}"), String::new())).collect();
        parameters(&mut v, "parameters", &many);
        let Err(CloudError::InvalidArgument(problems)) = v.finish() else {
            panic!("no error");
        };
        let fields: Vec<&str> = problems.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "source_volume_id",
                "size_bytes",
                "limit_bytes",
                "parameters"
            ]
        );
    }
}
