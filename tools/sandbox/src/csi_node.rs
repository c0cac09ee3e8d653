//! A simulated CSI node plugin: the half of a cloud's CSI driver that runs
//! on every node (as AWS's EBS node plugin does), serving CSI's Identity
//! and Node services to the kubelet on a unix socket, for one sim instance.
//!
//! It mounts nothing. A staged volume is a record under the node's state
//! directory (`staged/<volume>`), a published one a directory (or, for a
//! block volume, a file) at its target path and a record beside it
//! (`published/<volume>`). What a real plugin learns from its machine,
//! whether the device is there, this one asks the gateway: staging checks
//! that the volume is attached to this instance under the device the
//! controller published it with. A second call for a volume while one is
//! in flight is `ABORTED`, as the CSI spec asks.
//!
//! The records are small files, read and written inside the handlers: they
//! block for a moment only, which a simulator can afford.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use ccm_proto::GatewayClient;
use ccm_proto::csi::identity_server::{Identity, IdentityServer};
use ccm_proto::csi::node_server::{Node, NodeServer};
use ccm_proto::csi::{self, node_service_capability as ncap, plugin_capability as pcap};
use ccm_proto::v1 as gw;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use volume_controller::csi::{DEVICE_PATH, required};
use volume_controller::socket::{Held, OneCallEach};

/// The longest volume ID taken, in bytes (CSI's limit on its strings).
const MAX_ID_BYTES: usize = 128;

/// What one simulated node plugin serves for.
#[derive(Clone, Debug)]
pub struct NodePlugin {
    /// The CSI driver name (the gateway's VolumeOffer.csi_driver, e.g.
    /// "sim.csi.cloudgateway.io").
    pub driver: String,
    /// The sim instance's ID, e.g. "i-000001": NodeGetInfo's node_id.
    pub instance_id: String,
    /// Its zone.
    pub zone: String,
    /// The topology key its zone is named under (e.g.
    /// "topology.sim.cloudgateway.io/zone"); empty for no topology.
    pub topology_key: String,
    /// The most volumes it takes (NodeGetInfo's max_volumes_per_node).
    pub max_volumes: i64,
    /// Where its "devices" live: a staged volume is a record here (the
    /// node's state).
    pub state_dir: PathBuf,
    /// A gateway client (admin role) to check that a volume really is
    /// attached to this instance under the device it is staged with.
    pub gateway: GatewayClient,
}

/// Serves `plugin` on the unix socket `socket` (replacing a stale socket
/// file, mode 0660) until `shutdown`. The socket is bound when this
/// returns; the task serves, and removes the socket once it stops.
pub async fn serve(
    plugin: NodePlugin,
    socket: PathBuf,
    shutdown: CancellationToken,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let service = Arc::new(NodeService::new(plugin)?);
    let listener = volume_controller::socket::bind(&socket)?;
    tracing::info!(
        socket = %socket.display(),
        instance = service.plugin.instance_id,
        "serving the simulated CSI node plugin"
    );
    Ok(tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(IdentityServer::from_arc(service.clone()))
            .add_service(NodeServer::from_arc(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown.cancelled())
            .await;
        let _ = std::fs::remove_file(&socket);
        served.context("serve the simulated CSI node plugin")
    }))
}

/// Connects to one unix socket, whatever the URI says.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tonic::codegen::Service<http::Uri> for UnixConnector {
    type Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>;
    type Error = io::Error;
    type Future = std::pin::Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok(hyper_util::rt::TokioIo::new(stream))
        })
    }
}

/// A gRPC channel to the unix socket at `path`, as the kubelet and CSI's
/// sidecars reach a driver.
pub async fn channel(path: &Path) -> anyhow::Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(UnixConnector(path.to_path_buf()))
        .await?)
}

/// Both services of one plugin: what it serves for, its records, and the
/// volumes with a call in flight.
struct NodeService {
    plugin: NodePlugin,
    records: Records,
    in_flight: OneCallEach,
}

impl NodeService {
    /// A plugin keeping its records under its state directory, which is
    /// made if missing.
    fn new(plugin: NodePlugin) -> anyhow::Result<Self> {
        let records = Records::new(&plugin.state_dir)?;
        Ok(Self {
            plugin,
            records,
            in_flight: OneCallEach::default(),
        })
    }

    /// Holds `volume_id` until the guard is dropped; `ABORTED` while
    /// another call holds it.
    fn one_call(&self, volume_id: &str) -> Result<Held<'_>, Status> {
        self.in_flight.hold(volume_id)
    }

    /// The volume as the cloud has it now.
    async fn volume(&self, volume_id: &str) -> Result<gw::Volume, Status> {
        self.plugin
            .gateway
            .get_volume(gw::GetVolumeRequest {
                volume_id: volume_id.to_owned(),
                ..Default::default()
            })
            .await
            .map_err(gateway_status)?
            .volume
            .ok_or_else(|| Status::internal(format!("the gateway answered no volume {volume_id}")))
    }
}

/// What the node has staged and published, one JSON file per volume:
/// `staged/<volume>` and `published/<volume>` under the state directory.
struct Records {
    staged: PathBuf,
    published: PathBuf,
}

/// A volume staged on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Staged {
    /// The device it is attached under (the publish context's devicePath).
    device: String,
    /// The staging target path.
    path: String,
    /// Whether it is staged as a block device rather than a filesystem.
    block: bool,
    /// Whether the plugin made the directory at `path`, and so removes it.
    created: bool,
}

/// One path a volume is published at.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    path: String,
    readonly: bool,
    /// Whether the plugin made the file or directory at `path`, and so
    /// removes it.
    created: bool,
}

impl Staged {
    fn to_json(&self) -> Value {
        json!({
            "device": self.device,
            "path": self.path,
            "block": self.block,
            "created": self.created,
        })
    }

    fn from_json(value: &Value) -> Option<Self> {
        Some(Self {
            device: value["device"].as_str()?.to_owned(),
            path: value["path"].as_str()?.to_owned(),
            block: value["block"].as_bool()?,
            created: value["created"].as_bool()?,
        })
    }
}

impl Target {
    fn to_json(&self) -> Value {
        json!({"path": self.path, "readonly": self.readonly, "created": self.created})
    }

    fn from_json(value: &Value) -> Option<Self> {
        Some(Self {
            path: value["path"].as_str()?.to_owned(),
            readonly: value["readonly"].as_bool()?,
            created: value["created"].as_bool()?,
        })
    }
}

impl Records {
    /// The records under `state_dir`, their directories made if missing.
    fn new(state_dir: &Path) -> anyhow::Result<Self> {
        let records = Self {
            staged: state_dir.join("staged"),
            published: state_dir.join("published"),
        };
        for dir in [&records.staged, &records.published] {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        Ok(records)
    }

    /// The volume's staging, if it is staged.
    fn staged(&self, volume_id: &str) -> io::Result<Option<Staged>> {
        read(&self.staged.join(file_name(volume_id)))?
            .map(|v| Staged::from_json(&v).ok_or_else(|| malformed("staged", volume_id)))
            .transpose()
    }

    fn stage(&self, volume_id: &str, staged: &Staged) -> io::Result<()> {
        write(&self.staged.join(file_name(volume_id)), &staged.to_json())
    }

    fn unstage(&self, volume_id: &str) -> io::Result<()> {
        remove_file(&self.staged.join(file_name(volume_id)))
    }

    /// Where the volume is published; empty when nowhere.
    fn published(&self, volume_id: &str) -> io::Result<Vec<Target>> {
        let Some(value) = read(&self.published.join(file_name(volume_id)))? else {
            return Ok(Vec::new());
        };
        value["targets"]
            .as_array()
            .and_then(|targets| targets.iter().map(Target::from_json).collect())
            .ok_or_else(|| malformed("published", volume_id))
    }

    /// Records where the volume is published; nowhere removes the record.
    fn publish(&self, volume_id: &str, targets: &[Target]) -> io::Result<()> {
        let path = self.published.join(file_name(volume_id));
        if targets.is_empty() {
            return remove_file(&path);
        }
        let targets: Vec<Value> = targets.iter().map(Target::to_json).collect();
        write(&path, &json!({ "targets": targets }))
    }
}

/// A record's file name for a volume ID: the ID itself when it is made of
/// letters, digits, `-` and `_` (as the cloud's are), else `=` and its
/// base32hex, so that no ID names a path outside the records' directory.
fn file_name(volume_id: &str) -> String {
    let plain = !volume_id.is_empty()
        && volume_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        volume_id.to_owned()
    } else {
        format!(
            "={}",
            data_encoding::BASE32HEX_NOPAD.encode(volume_id.as_bytes())
        )
    }
}

fn read(path: &Path) -> io::Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes a record whole or not at all: a temporary file renamed over it.
fn write(path: &Path, value: &Value) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, value.to_string())?;
    std::fs::rename(&temporary, path)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes what the plugin made at `path`. A directory goes with what is
/// in it: the simulated volume's data was in there, as it is on the volume
/// once a real plugin unmounts it, and leaves an empty mount point.
fn remove_made(path: &Path) -> io::Result<()> {
    let removed = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match removed {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn malformed(kind: &str, volume_id: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the {kind} record of volume {volume_id} is malformed"),
    )
}

/// A failure of the node's own records.
fn io_status(what: &str, err: io::Error) -> Status {
    Status::internal(format!("{what}: {err}"))
}

/// A gateway error in CSI's terms, the gateway's message kept: `NOT_FOUND`
/// for a volume the cloud does not have, `UNAVAILABLE` for what asking
/// again may mend, `INTERNAL` for the rest (the plugin's own setup, such
/// as a role the gateway refuses).
fn gateway_status(err: ccm_proto::Error) -> Status {
    use ccm_proto::Error as E;
    let message = err.to_string();
    match err {
        E::NotFound { .. } => Status::not_found(message),
        E::RetryAfter { .. } | E::Unavailable { .. } | E::DeadlineExceeded { .. } => {
            Status::unavailable(message)
        }
        _ => Status::internal(message),
    }
}

/// A volume ID is required, and no longer than CSI allows.
fn volume_id(value: &str) -> Result<(), Status> {
    required("volume_id", value)?;
    if value.len() > MAX_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "volume_id is longer than {MAX_ID_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Whether a capability asks for a block device (rather than a
/// filesystem). It is required, needs an access type, and an access mode of
/// one node: a cloud disk attaches to one instance at a time.
fn access(capability: Option<&csi::VolumeCapability>) -> Result<bool, Status> {
    use csi::volume_capability::AccessType;
    let capability =
        capability.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    if let Some(why) = volume_controller::csi::unsupported(capability) {
        return Err(Status::invalid_argument(why));
    }
    Ok(matches!(capability.access_type, Some(AccessType::Block(_))))
}

/// Whether the cloud has `volume` attached to `instance_id` under
/// `device`: `FAILED_PRECONDITION` otherwise, as a real plugin fails when
/// it finds no such device.
fn attached_here(volume: &gw::Volume, instance_id: &str, device: &str) -> Result<(), Status> {
    let not_attached = |why: String| {
        Status::failed_precondition(format!(
            "volume {} is not attached to this node ({instance_id}): {why}",
            volume.id
        ))
    };
    let Some(attachment) = volume
        .attachments
        .iter()
        .find(|a| a.instance_id == instance_id)
    else {
        return Err(not_attached(
            "the cloud has it attached elsewhere or nowhere".into(),
        ));
    };
    let state =
        gw::AttachmentState::try_from(attachment.state).unwrap_or(gw::AttachmentState::Unspecified);
    if state != gw::AttachmentState::Attached {
        return Err(not_attached(format!(
            "its attachment is {}",
            state.as_str_name()
        )));
    }
    if attachment.device != device {
        return Err(not_attached(format!(
            "no device {device}: the cloud has it under {}",
            attachment.device
        )));
    }
    Ok(())
}

/// Whether a volume may be staged at `path` given its staging so far:
/// again where it is staged, with the same access type (staging is
/// idempotent), and nowhere else until it is unstaged.
fn may_stage(existing: Option<&Staged>, path: &str, block: bool) -> Result<(), Status> {
    match existing {
        None => Ok(()),
        Some(s) if s.path != path => Err(Status::failed_precondition(format!(
            "the volume is staged at {}; unstage it first",
            s.path
        ))),
        Some(s) if s.block != block => Err(Status::already_exists(format!(
            "the volume is staged at {path} as a {}",
            if s.block {
                "block device"
            } else {
                "filesystem"
            }
        ))),
        Some(_) => Ok(()),
    }
}

/// Whether a volume may be published from the staging path `staging`,
/// given its staging: it must be staged there, with the same access type.
fn may_publish(staged: Option<&Staged>, staging: &str, block: bool) -> Result<(), Status> {
    match staged {
        None => Err(Status::failed_precondition(
            "the volume is not staged on this node",
        )),
        Some(s) if s.path != staging => Err(Status::failed_precondition(format!(
            "the volume is staged at {}, not at {staging}",
            s.path
        ))),
        Some(s) if s.block != block => Err(Status::failed_precondition(format!(
            "the volume is staged as a {}",
            if s.block {
                "block device"
            } else {
                "filesystem"
            }
        ))),
        Some(_) => Ok(()),
    }
}

#[tonic::async_trait]
impl Identity for NodeService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.plugin.driver.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: HashMap::new(),
        }))
    }

    /// Volume accessibility constraints when it names its zone: no
    /// controller service, which the volume controller serves.
    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        // The driver's capabilities, the same on every side of it, as a
        // cloud's node plugin tells them (AWS's EBS driver answers these
        // in node mode too): its controller service is the volume
        // controller's.
        let mut capabilities = vec![csi::PluginCapability {
            r#type: Some(pcap::Type::Service(pcap::Service {
                r#type: pcap::service::Type::ControllerService as i32,
            })),
        }];
        if !self.plugin.topology_key.is_empty() {
            capabilities.push(csi::PluginCapability {
                r#type: Some(pcap::Type::Service(pcap::Service {
                    r#type: pcap::service::Type::VolumeAccessibilityConstraints as i32,
                })),
            });
        }
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    /// Always ready: it needs nothing but its state directory, made at the
    /// start.
    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for NodeService {
    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("staging_target_path", &req.staging_target_path)?;
        let block = access(req.volume_capability.as_ref())?;
        let device = req
            .publish_context
            .get(DEVICE_PATH)
            .filter(|d| !d.is_empty())
            .ok_or_else(|| {
                Status::invalid_argument(format!("publish_context[{DEVICE_PATH:?}] is required"))
            })?;
        let _held = self.one_call(&req.volume_id)?;
        let existing = self
            .records
            .staged(&req.volume_id)
            .map_err(|e| io_status("read the staging record", e))?;
        may_stage(existing.as_ref(), &req.staging_target_path, block)?;
        let volume = self.volume(&req.volume_id).await?;
        attached_here(&volume, &self.plugin.instance_id, device)?;
        let path = Path::new(&req.staging_target_path);
        let made = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => false,
            Ok(_) => {
                return Err(Status::failed_precondition(format!(
                    "staging_target_path {} is not a directory",
                    path.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path)
                    .map_err(|e| io_status("create staging_target_path", e))?;
                true
            }
            Err(e) => return Err(io_status("read staging_target_path", e)),
        };
        let staged = Staged {
            device: device.clone(),
            path: req.staging_target_path.clone(),
            block,
            created: made || existing.is_some_and(|s| s.created),
        };
        self.records
            .stage(&req.volume_id, &staged)
            .map_err(|e| io_status("write the staging record", e))?;
        tracing::debug!(device, path = %path.display(), "staged");
        Ok(Response::new(csi::NodeStageVolumeResponse {}))
    }

    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("staging_target_path", &req.staging_target_path)?;
        let _held = self.one_call(&req.volume_id)?;
        let staged = self
            .records
            .staged(&req.volume_id)
            .map_err(|e| io_status("read the staging record", e))?;
        // Not staged here: nothing to do, as the spec asks.
        if let Some(staged) = staged.filter(|s| s.path == req.staging_target_path) {
            if staged.created {
                remove_made(Path::new(&staged.path))
                    .map_err(|e| io_status("remove staging_target_path", e))?;
            }
            self.records
                .unstage(&req.volume_id)
                .map_err(|e| io_status("remove the staging record", e))?;
            tracing::debug!(path = staged.path, "unstaged");
        }
        Ok(Response::new(csi::NodeUnstageVolumeResponse {}))
    }

    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("target_path", &req.target_path)?;
        let block = access(req.volume_capability.as_ref())?;
        // Required because the plugin stages (STAGE_UNSTAGE_VOLUME).
        required("staging_target_path", &req.staging_target_path)?;
        let _held = self.one_call(&req.volume_id)?;
        let staged = self
            .records
            .staged(&req.volume_id)
            .map_err(|e| io_status("read the staging record", e))?;
        may_publish(staged.as_ref(), &req.staging_target_path, block)?;
        let mut targets = self
            .records
            .published(&req.volume_id)
            .map_err(|e| io_status("read the publishing record", e))?;
        let known = targets.iter().position(|t| t.path == req.target_path);
        if let Some(t) = known.map(|i| &targets[i])
            && t.readonly != req.readonly
        {
            return Err(Status::already_exists(format!(
                "the volume is published at {} {}",
                t.path,
                if t.readonly {
                    "read-only"
                } else {
                    "read-write"
                }
            )));
        }
        let path = Path::new(&req.target_path);
        let made = match std::fs::symlink_metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                make_target(path, block).map_err(|e| io_status("create target_path", e))?;
                true
            }
            Err(e) => return Err(io_status("read target_path", e)),
        };
        match known {
            Some(i) => targets[i].created |= made,
            None => targets.push(Target {
                path: req.target_path.clone(),
                readonly: req.readonly,
                created: made,
            }),
        }
        self.records
            .publish(&req.volume_id, &targets)
            .map_err(|e| io_status("write the publishing record", e))?;
        tracing::debug!(path = %path.display(), "published");
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("target_path", &req.target_path)?;
        let _held = self.one_call(&req.volume_id)?;
        let mut targets = self
            .records
            .published(&req.volume_id)
            .map_err(|e| io_status("read the publishing record", e))?;
        // Not published there: nothing to do, as the spec asks.
        if let Some(i) = targets.iter().position(|t| t.path == req.target_path) {
            if targets[i].created {
                remove_made(Path::new(&req.target_path))
                    .map_err(|e| io_status("remove target_path", e))?;
            }
            targets.remove(i);
            self.records
                .publish(&req.volume_id, &targets)
                .map_err(|e| io_status("write the publishing record", e))?;
            tracing::debug!(path = req.target_path, "unpublished");
        }
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    /// The volume's size as its total, all of it available: nothing is
    /// written to a simulated volume.
    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("volume_path", &req.volume_path)?;
        let _held = self.one_call(&req.volume_id)?;
        if std::fs::symlink_metadata(&req.volume_path).is_err() {
            return Err(Status::not_found(format!(
                "volume_path {} does not exist",
                req.volume_path
            )));
        }
        let staged_there = self
            .records
            .staged(&req.volume_id)
            .map_err(|e| io_status("read the staging record", e))?
            .is_some_and(|s| s.path == req.volume_path);
        let published_there = self
            .records
            .published(&req.volume_id)
            .map_err(|e| io_status("read the publishing record", e))?
            .iter()
            .any(|t| t.path == req.volume_path);
        if !staged_there && !published_there {
            return Err(Status::not_found(format!(
                "volume {} is neither staged nor published at {}",
                req.volume_id, req.volume_path
            )));
        }
        let size = self.volume(&req.volume_id).await?.size_bytes;
        Ok(Response::new(csi::NodeGetVolumeStatsResponse {
            usage: vec![csi::VolumeUsage {
                available: size,
                total: size,
                used: 0,
                unit: csi::volume_usage::Unit::Bytes as i32,
            }],
            volume_condition: None,
        }))
    }

    /// The volume's size as the cloud has it: the filesystem a real plugin
    /// grows takes the whole device, which the controller has grown.
    #[tracing::instrument(
        skip_all,
        fields(node = %self.plugin.instance_id, volume = %request.get_ref().volume_id)
    )]
    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        volume_id(&req.volume_id)?;
        required("volume_path", &req.volume_path)?;
        let _held = self.one_call(&req.volume_id)?;
        let size = self.volume(&req.volume_id).await?.size_bytes;
        Ok(Response::new(csi::NodeExpandVolumeResponse {
            capacity_bytes: size,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: ncap::rpc::Type| csi::NodeServiceCapability {
            r#type: Some(ncap::Type::Rpc(ncap::Rpc { r#type: t as i32 })),
        };
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(ncap::rpc::Type::StageUnstageVolume),
                rpc(ncap::rpc::Type::ExpandVolume),
                rpc(ncap::rpc::Type::GetVolumeStats),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let p = &self.plugin;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: p.instance_id.clone(),
            max_volumes_per_node: p.max_volumes,
            accessible_topology: (!p.topology_key.is_empty()).then(|| csi::Topology {
                segments: HashMap::from([(p.topology_key.clone(), p.zone.clone())]),
            }),
        }))
    }
}

/// Makes a target path as a real plugin's mount would need it: a directory
/// for a filesystem, a file for a block device.
fn make_target(path: &Path, block: bool) -> io::Result<()> {
    if !block {
        return std::fs::create_dir_all(path);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::File::create_new(path).map(drop)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ccm_proto::csi::identity_client::IdentityClient;
    use ccm_proto::csi::node_client::NodeClient;
    use ccm_proto::{ClientConfig, RetryPolicy, TokenSource};
    use tonic::Code;

    use super::*;

    /// Fails the test when `f` does not finish within ten seconds.
    async fn within<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("timed out")
    }

    /// A directory of its own for one test, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("csi-node-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A plugin whose gateway is nowhere: a call to it fails at once.
    fn plugin(state_dir: PathBuf) -> NodePlugin {
        let config = ClientConfig {
            timeout: Duration::from_secs(2),
            retry: RetryPolicy::none(),
            ..ClientConfig::new("http://127.0.0.1:1", "kubernetes", TokenSource::None)
        };
        NodePlugin {
            driver: "sim.csi.cloudgateway.io".into(),
            instance_id: "i-000001".into(),
            zone: "sim-1a".into(),
            topology_key: "topology.sim.cloudgateway.io/zone".into(),
            max_volumes: 26,
            state_dir,
            gateway: GatewayClient::new(config).unwrap(),
        }
    }

    fn mount() -> Option<csi::VolumeCapability> {
        use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
        Some(csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        })
    }

    fn staged(path: &Path) -> Staged {
        Staged {
            device: "/dev/xvdba".into(),
            path: path.display().to_string(),
            block: false,
            created: false,
        }
    }

    /// The code of a failed call, or OK.
    fn code<T>(result: Result<Response<T>, Status>) -> Code {
        result.err().map_or(Code::Ok, |s| s.code())
    }

    #[test]
    fn volume_ids_of_the_cloud_are_their_own_file_names_and_others_are_encoded() {
        assert_eq!(file_name("vol-0a1b2c3d"), "vol-0a1b2c3d");
        for id in ["..", ".", "a/../../etc", "vol 1", "é"] {
            let name = file_name(id);
            assert!(name.starts_with('='), "{id}: {name}");
            assert!(!name.contains(['/', '.']), "{id}: {name}");
        }
        assert_ne!(file_name("a/b"), file_name("a_b"));
        assert!(file_name(&"/".repeat(MAX_ID_BYTES)).len() < 255);
    }

    #[test]
    fn only_one_node_access_modes_with_an_access_type_are_served() {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
        let capability = |access_type, mode: Option<Mode>| csi::VolumeCapability {
            access_type,
            access_mode: mode.map(|m| AccessMode { mode: m as i32 }),
        };
        let block = Some(AccessType::Block(BlockVolume {}));
        assert!(!access(mount().as_ref()).unwrap());
        let single_writer = capability(block.clone(), Some(Mode::SingleNodeSingleWriter));
        assert!(access(Some(&single_writer)).unwrap());
        for wrong in [
            None,
            Some(capability(None, Some(Mode::SingleNodeWriter))),
            Some(capability(block.clone(), None)),
            Some(capability(block, Some(Mode::MultiNodeMultiWriter))),
        ] {
            let err = access(wrong.as_ref()).unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{wrong:?}");
        }
    }

    #[test]
    fn a_volume_is_staged_only_where_the_cloud_attached_it_under_that_device() {
        use gw::AttachmentState::{Attached, Attaching};
        let volume = |instance: &str, device: &str, state: gw::AttachmentState| gw::Volume {
            id: "vol-1".into(),
            attachments: vec![gw::VolumeAttachment {
                instance_id: instance.into(),
                device: device.into(),
                state: state as i32,
            }],
            ..Default::default()
        };
        let cases = [
            (volume("i-000001", "/dev/xvdba", Attached), Code::Ok),
            (
                volume("i-000002", "/dev/xvdba", Attached),
                Code::FailedPrecondition,
            ),
            (
                volume("i-000001", "/dev/xvdbb", Attached),
                Code::FailedPrecondition,
            ),
            (
                volume("i-000001", "/dev/xvdba", Attaching),
                Code::FailedPrecondition,
            ),
            (gw::Volume::default(), Code::FailedPrecondition),
        ];
        for (v, want) in cases {
            let got = attached_here(&v, "i-000001", "/dev/xvdba").err();
            assert_eq!(got.map_or(Code::Ok, |s| s.code()), want, "{v:?}");
        }
    }

    #[test]
    fn staging_again_is_allowed_only_where_and_as_the_volume_is_staged() {
        let at = |path: &str, block| Staged {
            device: "/dev/xvdba".into(),
            path: path.into(),
            block,
            created: false,
        };
        let cases = [
            (None, Code::Ok),
            (Some(at("/stage", false)), Code::Ok),
            (Some(at("/other", false)), Code::FailedPrecondition),
            (Some(at("/stage", true)), Code::AlreadyExists),
        ];
        for (existing, want) in cases {
            let got = may_stage(existing.as_ref(), "/stage", false).err();
            assert_eq!(got.map_or(Code::Ok, |s| s.code()), want, "{existing:?}");
        }
        let cases = [
            (None, Code::FailedPrecondition),
            (Some(at("/stage", false)), Code::Ok),
            (Some(at("/other", false)), Code::FailedPrecondition),
            (Some(at("/stage", true)), Code::FailedPrecondition),
        ];
        for (existing, want) in cases {
            let got = may_publish(existing.as_ref(), "/stage", false).err();
            assert_eq!(got.map_or(Code::Ok, |s| s.code()), want, "{existing:?}");
        }
    }

    /// `base` with one field cleared.
    fn without<T: Clone>(base: &T, clear: impl Fn(&mut T)) -> T {
        let mut request = base.clone();
        clear(&mut request);
        request
    }

    #[tokio::test]
    async fn calls_missing_a_required_field_are_invalid_arguments() {
        let scratch = Scratch::new();
        let svc = NodeService::new(plugin(scratch.0.clone())).unwrap();
        let invalid = Code::InvalidArgument;
        within(async {
            let stage = csi::NodeStageVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: "/stage".into(),
                volume_capability: mount(),
                publish_context: HashMap::from([(DEVICE_PATH.into(), "/dev/xvdba".into())]),
                ..Default::default()
            };
            for (field, req) in [
                ("volume_id", without(&stage, |r| r.volume_id.clear())),
                (
                    "staging_target_path",
                    without(&stage, |r| r.staging_target_path.clear()),
                ),
                (
                    "volume_capability",
                    without(&stage, |r| r.volume_capability = None),
                ),
                (DEVICE_PATH, without(&stage, |r| r.publish_context.clear())),
            ] {
                let err = svc.node_stage_volume(Request::new(req)).await.unwrap_err();
                assert_eq!(err.code(), invalid, "{field}");
                assert!(err.message().contains(field), "{field}: {}", err.message());
            }

            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: "/stage".into(),
            };
            for req in [
                without(&unstage, |r| r.volume_id.clear()),
                without(&unstage, |r| r.staging_target_path.clear()),
            ] {
                assert_eq!(
                    code(svc.node_unstage_volume(Request::new(req)).await),
                    invalid
                );
            }

            let publish = csi::NodePublishVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: "/stage".into(),
                target_path: "/target".into(),
                volume_capability: mount(),
                ..Default::default()
            };
            for req in [
                without(&publish, |r| r.volume_id.clear()),
                without(&publish, |r| r.target_path.clear()),
                without(&publish, |r| r.volume_capability = None),
                without(&publish, |r| r.staging_target_path.clear()),
            ] {
                assert_eq!(
                    code(svc.node_publish_volume(Request::new(req)).await),
                    invalid
                );
            }

            let unpublish = csi::NodeUnpublishVolumeRequest {
                volume_id: "vol-1".into(),
                target_path: "/target".into(),
            };
            for req in [
                without(&unpublish, |r| r.volume_id.clear()),
                without(&unpublish, |r| r.target_path.clear()),
            ] {
                assert_eq!(
                    code(svc.node_unpublish_volume(Request::new(req)).await),
                    invalid
                );
            }

            let stats = csi::NodeGetVolumeStatsRequest {
                volume_id: "vol-1".into(),
                volume_path: "/target".into(),
                ..Default::default()
            };
            for req in [
                without(&stats, |r| r.volume_id.clear()),
                without(&stats, |r| r.volume_path.clear()),
            ] {
                assert_eq!(
                    code(svc.node_get_volume_stats(Request::new(req)).await),
                    invalid
                );
            }

            let expand = csi::NodeExpandVolumeRequest {
                volume_id: "vol-1".into(),
                volume_path: "/target".into(),
                ..Default::default()
            };
            for req in [
                without(&expand, |r| r.volume_id.clear()),
                without(&expand, |r| r.volume_path.clear()),
            ] {
                assert_eq!(
                    code(svc.node_expand_volume(Request::new(req)).await),
                    invalid
                );
            }
            let long_id = without(&expand, |r| r.volume_id = "v".repeat(MAX_ID_BYTES + 1));
            assert_eq!(
                code(svc.node_expand_volume(Request::new(long_id)).await),
                invalid
            );
        })
        .await;
    }

    #[tokio::test]
    async fn a_gateway_that_does_not_answer_makes_staging_unavailable() {
        let scratch = Scratch::new();
        let svc = NodeService::new(plugin(scratch.0.join("state"))).unwrap();
        let req = csi::NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: scratch.0.join("stage").display().to_string(),
            volume_capability: mount(),
            publish_context: HashMap::from([(DEVICE_PATH.to_owned(), "/dev/xvdba".to_owned())]),
            ..Default::default()
        };
        let result = within(svc.node_stage_volume(Request::new(req))).await;
        assert_eq!(code(result), Code::Unavailable);
        assert_eq!(svc.records.staged("vol-1").unwrap(), None);
    }

    #[tokio::test]
    async fn a_second_call_for_a_volume_in_flight_is_aborted() {
        let scratch = Scratch::new();
        let svc = NodeService::new(plugin(scratch.0.clone())).unwrap();
        let held = svc.one_call("vol-1").unwrap();
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: "/stage".into(),
        };
        let result = within(svc.node_unstage_volume(Request::new(req.clone()))).await;
        assert_eq!(code(result), Code::Aborted);
        drop(held);
        let result = within(svc.node_unstage_volume(Request::new(req))).await;
        assert_eq!(code(result), Code::Ok);
    }

    #[tokio::test]
    async fn publishing_needs_the_staging_and_unpublishing_removes_the_target_it_made() {
        let scratch = Scratch::new();
        let svc = NodeService::new(plugin(scratch.0.join("state"))).unwrap();
        let stage = scratch.0.join("stage");
        let target = scratch.0.join("pod").join("target");
        let publish = csi::NodePublishVolumeRequest {
            volume_id: "vol-1".into(),
            staging_target_path: stage.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: mount(),
            ..Default::default()
        };
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: target.display().to_string(),
        };
        let stats = |path: &Path| csi::NodeGetVolumeStatsRequest {
            volume_id: "vol-1".into(),
            volume_path: path.display().to_string(),
            ..Default::default()
        };
        within(async {
            let result = svc.node_publish_volume(Request::new(publish.clone())).await;
            assert_eq!(code(result), Code::FailedPrecondition);

            // As NodeStageVolume records it once the gateway agrees.
            std::fs::create_dir_all(&stage).unwrap();
            svc.records.stage("vol-1", &staged(&stage)).unwrap();
            for _ in 0..2 {
                let result = svc.node_publish_volume(Request::new(publish.clone())).await;
                assert_eq!(code(result), Code::Ok);
                assert!(target.is_dir());
            }
            assert_eq!(svc.records.published("vol-1").unwrap().len(), 1);
            let readonly = csi::NodePublishVolumeRequest {
                readonly: true,
                ..publish.clone()
            };
            let result = svc.node_publish_volume(Request::new(readonly)).await;
            assert_eq!(code(result), Code::AlreadyExists);

            let result = svc
                .node_get_volume_stats(Request::new(stats(&scratch.0)))
                .await;
            assert_eq!(code(result), Code::NotFound);
            let result = svc
                .node_get_volume_stats(Request::new(stats(Path::new("some/path"))))
                .await;
            assert_eq!(code(result), Code::NotFound);
            // Known here: only the volume's size is left to ask the gateway.
            let result = svc
                .node_get_volume_stats(Request::new(stats(&target)))
                .await;
            assert_eq!(code(result), Code::Unavailable);

            for _ in 0..2 {
                let result = svc
                    .node_unpublish_volume(Request::new(unpublish.clone()))
                    .await;
                assert_eq!(code(result), Code::Ok);
                assert!(!target.exists());
            }
            assert!(svc.records.published("vol-1").unwrap().is_empty());

            let unstage = csi::NodeUnstageVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: stage.display().to_string(),
            };
            for _ in 0..2 {
                let result = svc.node_unstage_volume(Request::new(unstage.clone())).await;
                assert_eq!(code(result), Code::Ok);
            }
            assert_eq!(svc.records.staged("vol-1").unwrap(), None);
            // The kubelet made the staging directory; it stays.
            assert!(stage.is_dir());
        })
        .await;
    }

    #[tokio::test]
    async fn the_socket_answers_node_get_info_and_goes_at_shutdown() {
        use std::os::unix::fs::PermissionsExt as _;
        let scratch = Scratch::new();
        let socket = scratch.0.join("csi-node").join("node-0.sock");
        // A socket a previous run left is replaced.
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let shutdown = CancellationToken::new();
        let task = serve(
            plugin(scratch.0.join("state")),
            socket.clone(),
            shutdown.clone(),
        )
        .await
        .unwrap();
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);

        within(async {
            let channel = tonic::transport::Endpoint::try_from("http://[::]:50051")
                .unwrap()
                .connect_with_connector(UnixConnector(socket.clone()))
                .await
                .unwrap();
            let info = NodeClient::new(channel.clone())
                .node_get_info(csi::NodeGetInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(info.node_id, "i-000001");
            assert_eq!(info.max_volumes_per_node, 26);
            let segments = info.accessible_topology.unwrap().segments;
            assert_eq!(segments["topology.sim.cloudgateway.io/zone"], "sim-1a");
            let plugin = IdentityClient::new(channel)
                .get_plugin_info(csi::GetPluginInfoRequest {})
                .await
                .unwrap()
                .into_inner();
            assert_eq!(plugin.name, "sim.csi.cloudgateway.io");
            assert_eq!(plugin.vendor_version, env!("CARGO_PKG_VERSION"));

            shutdown.cancel();
            task.await.unwrap().unwrap();
            assert!(!socket.exists());
        })
        .await;
    }
}
