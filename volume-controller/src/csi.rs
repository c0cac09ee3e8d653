//! CSI's Identity and Controller services, as upstream's sidecars call
//! them: each call is checked as the CSI spec says, then forwarded to the
//! gateway's Volumes service, and its answer (or error) told back in CSI's
//! terms. Nothing is kept here but which volumes have a call in flight:
//! a second call for one of them is `ABORTED`, as the spec asks, so the
//! sidecar retries it once the first is done. A resize and a modification
//! of one volume go together ([`Driver::one_change`]).

use std::collections::HashMap;
use std::sync::Arc;

use ccm_proto::csi::controller_server::Controller;
use ccm_proto::csi::identity_server::Identity;
use ccm_proto::csi::{self, controller_service_capability as ccap, plugin_capability as pcap};
use ccm_proto::v1::{self as gw, VolumeOffer};
use ccm_proto::{GatewayClient, reason};
use tonic::{Code, Request, Response, Status};

use crate::metrics::Metrics;
use crate::socket::{Held, OneCallEach};

/// The keys of StorageClass parameters the external-provisioner adds
/// itself (`--extra-create-metadata`) or reads itself: never a provider's.
const SIDECAR_PREFIX: &str = "csi.storage.k8s.io/";
const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";
const PV_NAME: &str = "csi.storage.k8s.io/pv/name";

/// The publish context key the node plugin finds the device by (AWS's EBS
/// node plugin reads this one).
pub const DEVICE_PATH: &str = "devicePath";

/// What both services share.
pub struct Driver {
    pub gateway: GatewayClient,
    pub offer: VolumeOffer,
    pub metrics: Metrics,
    /// Volume names and IDs with a call in flight.
    in_flight: OneCallEach,
}

impl Driver {
    /// Serves `offer`'s volumes through `gateway`.
    pub fn new(gateway: GatewayClient, offer: VolumeOffer, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            gateway,
            offer,
            metrics,
            in_flight: OneCallEach::default(),
        })
    }

    /// Holds `key` until the guard is dropped; `ABORTED` while another
    /// call holds it.
    fn one_call(&self, key: &str) -> Result<Held<'_>, Status> {
        self.in_flight.hold(key)
    }

    /// Holds the volume `volume_id` for one change of `kind` (`expand`,
    /// `modify`); `ABORTED` while another of that kind holds it. A resize
    /// and a modification asked at once (a claim's size and its
    /// VolumeAttributesClass edited together, the resizer's two
    /// controllers each calling) both reach the gateway, which makes them
    /// one cloud modification where the cloud takes one at a time (EBS);
    /// held as one, the second would wait for the first and be made
    /// apart.
    fn one_change(&self, kind: &str, volume_id: &str) -> Result<Held<'_>, Status> {
        self.in_flight.hold(&format!("{kind}/{volume_id}"))
    }

    /// Counts a call's outcome, and times it from `started`.
    fn counted<T>(
        &self,
        method: &'static str,
        started: std::time::Instant,
        result: Result<T, Status>,
    ) -> Result<T, Status> {
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        self.metrics.count(method, code, started.elapsed());
        if let Err(status) = &result {
            tracing::debug!(method, code = ?status.code(), message = status.message(), "CSI call failed");
        }
        result
    }
}

/// A gateway error in CSI's terms: the codes the spec gives each case,
/// the gateway's message kept.
fn csi_status(err: ccm_proto::Error) -> Status {
    use ccm_proto::Error as E;
    let message = err.to_string();
    let code = match err {
        E::NotFound { .. } => Code::NotFound,
        E::Unimplemented { .. } => Code::Unimplemented,
        E::RetryAfter { reason: r, .. } if r == reason::PROVISIONING => Code::Unavailable,
        E::RetryAfter { .. } => Code::ResourceExhausted,
        // The spec's code for a size the plugin cannot make.
        E::InvalidArgument { violations, .. }
            if violations
                .iter()
                .any(|v| v.field == "size_bytes" || v.field == "limit_bytes") =>
        {
            Code::OutOfRange
        }
        E::InvalidArgument { .. } => Code::InvalidArgument,
        E::AlreadyExists { .. } => Code::AlreadyExists,
        E::Unavailable { .. } => Code::Unavailable,
        E::DeadlineExceeded { .. } => Code::DeadlineExceeded,
        E::Other { code, .. } => code,
        // The gateway refused this controller, or the client is broken:
        // the operator's to mend, not the caller's.
        E::Unauthenticated { .. }
        | E::PermissionDenied { .. }
        | E::ImplementedElsewhere { .. }
        | E::Config(_) => Code::Internal,
    };
    Status::new(code, message)
}

/// `INVALID_ARGUMENT` naming `field` when it is empty, as the CSI spec
/// answers a missing required field.
pub fn required(field: &str, value: &str) -> Result<(), Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!("{field} is required")))
    } else {
        Ok(())
    }
}

/// Why a capability cannot be served, if it cannot: a block device or a
/// filesystem, on one node at a time (a cloud disk attaches to one
/// instance), read-only or not. The node plugin beside a kubelet serves
/// the same.
pub fn unsupported(capability: &csi::VolumeCapability) -> Option<String> {
    use csi::volume_capability::access_mode::Mode;
    if capability.access_type.is_none() {
        return Some("a volume capability needs an access type: block or mount".into());
    }
    let mode = capability
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown));
    match mode {
        Some(
            Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter,
        ) => None,
        None => Some("a volume capability needs an access mode".into()),
        Some(other) => Some(format!(
            "access mode {} is not served: a volume attaches to one node at a time",
            other.as_str_name()
        )),
    }
}

fn capabilities(list: &[csi::VolumeCapability]) -> Result<(), Status> {
    if list.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    match list.iter().find_map(unsupported) {
        Some(why) => Err(Status::invalid_argument(why)),
        None => Ok(()),
    }
}

fn is_block(capability: Option<&csi::VolumeCapability>) -> bool {
    matches!(
        capability.and_then(|c| c.access_type.as_ref()),
        Some(csi::volume_capability::AccessType::Block(_))
    )
}

/// The zones a topology requirement allows, preferred first, under any
/// of the provider's zone keys.
fn zones(requirement: Option<&csi::TopologyRequirement>, keys: &[String]) -> Vec<String> {
    let Some(requirement) = requirement else {
        return Vec::new();
    };
    let mut zones: Vec<String> = Vec::new();
    for topology in requirement.preferred.iter().chain(&requirement.requisite) {
        let zone = keys.iter().find_map(|k| topology.segments.get(k));
        if let Some(zone) = zone
            && !zones.contains(zone)
        {
            zones.push(zone.clone());
        }
    }
    zones
}

fn snapshot_to_csi(s: gw::Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: s.size_bytes,
        snapshot_id: s.id,
        source_volume_id: s.source_volume_id,
        creation_time: s.created_at,
        ready_to_use: s.ready_to_use,
        group_snapshot_id: String::new(),
    }
}

/// The Identity service.
pub struct IdentityService(pub Arc<Driver>);

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.offer.csi_driver.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        let service = |t: pcap::service::Type| csi::PluginCapability {
            r#type: Some(pcap::Type::Service(pcap::Service { r#type: t as i32 })),
        };
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(pcap::service::Type::ControllerService),
                service(pcap::service::Type::VolumeAccessibilityConstraints),
                csi::PluginCapability {
                    r#type: Some(pcap::Type::VolumeExpansion(pcap::VolumeExpansion {
                        r#type: pcap::volume_expansion::Type::Online as i32,
                    })),
                },
            ],
        }))
    }

    /// Ready while the gateway answers.
    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = self
            .0
            .gateway
            .provider_info()
            .await
            .is_ok_and(|i| i.volumes);
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}

/// The Controller service.
pub struct ControllerService(pub Arc<Driver>);

impl ControllerService {
    async fn create(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, Status> {
        let d = &self.0;
        required("name", &req.name)?;
        capabilities(&req.volume_capabilities)?;
        let range = req.capacity_range.unwrap_or_default();
        let (owner, parameters, context) =
            split_parameters(req.parameters, &d.offer.node_parameters);
        let (source_snapshot_id, source_volume_id) = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            Some(csi::volume_content_source::Type::Snapshot(s)) => {
                (s.snapshot_id.clone(), String::new())
            }
            Some(csi::volume_content_source::Type::Volume(v)) => {
                (String::new(), v.volume_id.clone())
            }
            None => (String::new(), String::new()),
        };
        let _one = d.one_call(&req.name)?;
        let answer = d
            .gateway
            .create_volume(gw::CreateVolumeRequest {
                name: req.name,
                size_bytes: range.required_bytes,
                limit_bytes: range.limit_bytes,
                zones: zones(
                    req.accessibility_requirements.as_ref(),
                    &d.offer.topology_keys,
                ),
                parameters,
                owner: Some(owner).filter(|o| o != &gw::VolumeOwner::default()),
                source_snapshot_id,
                source_volume_id,
                mutable_parameters: req.mutable_parameters,
                ..Default::default()
            })
            .await
            .map_err(csi_status)?;
        let volume = answer
            .volume
            .ok_or_else(|| Status::internal("the gateway answered no volume"))?;
        let accessible_topology = d
            .offer
            .topology_keys
            .first()
            .filter(|_| !volume.zone.is_empty())
            .map(|key| csi::Topology {
                segments: HashMap::from([(key.clone(), volume.zone.clone())]),
            })
            .into_iter()
            .collect();
        Ok(csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                capacity_bytes: volume.size_bytes,
                volume_id: volume.id,
                volume_context: context,
                content_source: req.volume_content_source,
                accessible_topology,
            }),
        })
    }

    async fn publish(
        &self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<csi::ControllerPublishVolumeResponse, Status> {
        let d = &self.0;
        required("volume_id", &req.volume_id)?;
        required("node_id", &req.node_id)?;
        let capability = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
        if let Some(why) = unsupported(capability) {
            return Err(Status::invalid_argument(why));
        }
        let _one = d.one_call(&req.volume_id)?;
        let attached = d
            .gateway
            .attach_volume(gw::AttachVolumeRequest {
                volume_id: req.volume_id,
                instance_id: req.node_id,
                ..Default::default()
            })
            .await
            .map_err(csi_status)?;
        Ok(csi::ControllerPublishVolumeResponse {
            publish_context: HashMap::from([(DEVICE_PATH.to_owned(), attached.device)]),
        })
    }

    /// Detaches from `node_id`, or from every instance when it is empty.
    async fn unpublish(&self, req: csi::ControllerUnpublishVolumeRequest) -> Result<(), Status> {
        let d = &self.0;
        required("volume_id", &req.volume_id)?;
        let _one = d.one_call(&req.volume_id)?;
        let instances = if req.node_id.is_empty() {
            match d
                .gateway
                .get_volume(gw::GetVolumeRequest {
                    volume_id: req.volume_id.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(answer) => answer
                    .volume
                    .map(|v| v.attachments.into_iter().map(|a| a.instance_id).collect())
                    .unwrap_or_default(),
                Err(ccm_proto::Error::NotFound { .. }) => Vec::new(),
                Err(e) => return Err(csi_status(e)),
            }
        } else {
            vec![req.node_id]
        };
        for instance_id in instances {
            d.gateway
                .detach_volume(gw::DetachVolumeRequest {
                    volume_id: req.volume_id.clone(),
                    instance_id,
                    ..Default::default()
                })
                .await
                .map_err(csi_status)?;
        }
        Ok(())
    }

    async fn validate(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
        required("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is required"));
        }
        self.0
            .gateway
            .get_volume(gw::GetVolumeRequest {
                volume_id: req.volume_id,
                ..Default::default()
            })
            .await
            .map_err(csi_status)?;
        Ok(match req.volume_capabilities.iter().find_map(unsupported) {
            Some(why) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
            None => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        })
    }

    async fn expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        let d = &self.0;
        required("volume_id", &req.volume_id)?;
        let range = req
            .capacity_range
            .ok_or_else(|| Status::invalid_argument("capacity_range is required"))?;
        let _one = d.one_change("expand", &req.volume_id)?;
        let answer = d
            .gateway
            .expand_volume(gw::ExpandVolumeRequest {
                volume_id: req.volume_id,
                size_bytes: range.required_bytes,
                limit_bytes: range.limit_bytes,
                ..Default::default()
            })
            .await
            .map_err(csi_status)?;
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: answer.size_bytes,
            // A filesystem grows on the node; a raw block device needs
            // nothing more.
            node_expansion_required: !is_block(req.volume_capability.as_ref()),
        })
    }

    async fn snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, Status> {
        let d = &self.0;
        self.snapshots_served()?;
        required("name", &req.name)?;
        required("source_volume_id", &req.source_volume_id)?;
        let _one = d.one_call(&req.name)?;
        let answer = d
            .gateway
            .create_snapshot(gw::CreateSnapshotRequest {
                name: req.name,
                source_volume_id: req.source_volume_id,
                parameters: req
                    .parameters
                    .into_iter()
                    .filter(|(k, _)| !k.starts_with(SIDECAR_PREFIX))
                    .collect(),
                ..Default::default()
            })
            .await
            .map_err(csi_status)?;
        Ok(csi::CreateSnapshotResponse {
            snapshot: answer.snapshot.map(snapshot_to_csi),
        })
    }

    async fn snapshots(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        self.snapshots_served()?;
        let max_entries = u32::try_from(req.max_entries)
            .map_err(|_| Status::invalid_argument("max_entries is negative"))?;
        let answer = self
            .0
            .gateway
            .list_snapshots(gw::ListSnapshotsRequest {
                snapshot_id: req.snapshot_id,
                source_volume_id: req.source_volume_id,
                max_entries,
                starting_token: req.starting_token,
                ..Default::default()
            })
            .await
            .map_err(|e| match e {
                // The spec's code for a token the plugin did not hand out.
                ccm_proto::Error::InvalidArgument {
                    violations,
                    message,
                } if violations.iter().any(|v| v.field == "starting_token") => {
                    Status::aborted(message)
                }
                e => csi_status(e),
            })?;
        Ok(csi::ListSnapshotsResponse {
            entries: answer
                .snapshots
                .into_iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(snapshot_to_csi(s)),
                })
                .collect(),
            next_token: answer.next_token,
        })
    }

    fn snapshots_served(&self) -> Result<(), Status> {
        if self.0.offer.snapshots {
            Ok(())
        } else {
            Err(Status::unimplemented("the cloud provider has no snapshots"))
        }
    }
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.create(request.into_inner()).await;
        self.0
            .counted("CreateVolume", started, result)
            .map(Response::new)
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let req = request.into_inner();
        let result = async {
            required("volume_id", &req.volume_id)?;
            let _one = self.0.one_call(&req.volume_id)?;
            match self
                .0
                .gateway
                .delete_volume(gw::DeleteVolumeRequest {
                    volume_id: req.volume_id.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(_) | Err(ccm_proto::Error::NotFound { .. }) => Ok(csi::DeleteVolumeResponse {}),
                Err(e) => Err(csi_status(e)),
            }
        }
        .await;
        self.0
            .counted("DeleteVolume", started, result)
            .map(Response::new)
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.publish(request.into_inner()).await;
        self.0
            .counted("ControllerPublishVolume", started, result)
            .map(Response::new)
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.unpublish(request.into_inner()).await;
        self.0
            .counted("ControllerUnpublishVolume", started, result)
            .map(|()| Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.validate(request.into_inner()).await;
        self.0
            .counted("ValidateVolumeCapabilities", started, result)
            .map(Response::new)
    }

    async fn list_volumes(
        &self,
        _request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Err(Status::unimplemented("ListVolumes is not served"))
    }

    async fn get_capacity(
        &self,
        _request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        Err(Status::unimplemented("GetCapacity is not served"))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use ccap::rpc::Type as T;
        let offer = &self.0.offer;
        let served = [
            (T::CreateDeleteVolume, true),
            (T::PublishUnpublishVolume, true),
            (T::ExpandVolume, true),
            (T::CloneVolume, offer.clones),
            (T::CreateDeleteSnapshot, offer.snapshots),
            (T::ListSnapshots, offer.snapshots),
            (T::ModifyVolume, offer.modify),
        ];
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: served
                .into_iter()
                .filter(|(_, on)| *on)
                .map(|(t, _)| csi::ControllerServiceCapability {
                    r#type: Some(ccap::Type::Rpc(ccap::Rpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.snapshot(request.into_inner()).await;
        self.0
            .counted("CreateSnapshot", started, result)
            .map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        let started = std::time::Instant::now();
        let req = request.into_inner();
        let result = async {
            self.snapshots_served()?;
            required("snapshot_id", &req.snapshot_id)?;
            let _one = self.0.one_call(&req.snapshot_id)?;
            match self
                .0
                .gateway
                .delete_snapshot(gw::DeleteSnapshotRequest {
                    snapshot_id: req.snapshot_id.clone(),
                    ..Default::default()
                })
                .await
            {
                Ok(_) | Err(ccm_proto::Error::NotFound { .. }) => {
                    Ok(csi::DeleteSnapshotResponse {})
                }
                Err(e) => Err(csi_status(e)),
            }
        }
        .await;
        self.0
            .counted("DeleteSnapshot", started, result)
            .map(Response::new)
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.snapshots(request.into_inner()).await;
        self.0
            .counted("ListSnapshots", started, result)
            .map(Response::new)
    }

    async fn get_snapshot(
        &self,
        _request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        Err(Status::unimplemented("GetSnapshot is not served"))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.expand(request.into_inner()).await;
        self.0
            .counted("ControllerExpandVolume", started, result)
            .map(Response::new)
    }

    async fn controller_get_volume(
        &self,
        _request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        Err(Status::unimplemented("ControllerGetVolume is not served"))
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let started = std::time::Instant::now();
        let req = request.into_inner();
        let result = async {
            if !self.0.offer.modify {
                return Err(Status::unimplemented(
                    "the cloud provider cannot modify volumes",
                ));
            }
            required("volume_id", &req.volume_id)?;
            let _one = self.0.one_change("modify", &req.volume_id)?;
            self.0
                .gateway
                .modify_volume(gw::ModifyVolumeRequest {
                    volume_id: req.volume_id.clone(),
                    parameters: req.mutable_parameters.clone(),
                    ..Default::default()
                })
                .await
                .map_err(csi_status)?;
            Ok(csi::ControllerModifyVolumeResponse {})
        }
        .await;
        self.0
            .counted("ControllerModifyVolume", started, result)
            .map(Response::new)
    }
}

/// A StorageClass's parameters, split: the claim and volume names the
/// provisioner adds, what the gateway takes, and what the node plugin
/// reads when it formats the volume (`node_parameters`, named in any case
/// as upstream's drivers take them, and passed on in the volume's context
/// under the offer's lowercase name, where upstream's node plugin reads
/// them). The provisioner's own `csi.storage.k8s.io/` keys are dropped.
fn split_parameters(
    given: HashMap<String, String>,
    node_parameters: &[String],
) -> (
    gw::VolumeOwner,
    HashMap<String, String>,
    HashMap<String, String>,
) {
    let mut owner = gw::VolumeOwner::default();
    let mut parameters = HashMap::new();
    let mut context = HashMap::new();
    for (key, value) in given {
        match key.as_str() {
            PVC_NAME => owner.pvc_name = value,
            PVC_NAMESPACE => owner.pvc_namespace = value,
            PV_NAME => owner.pv_name = value,
            k if k.starts_with(SIDECAR_PREFIX) => {}
            k => match node_parameters.iter().find(|n| n.eq_ignore_ascii_case(k)) {
                Some(name) => {
                    context.insert(name.clone(), value);
                }
                None => {
                    parameters.insert(key, value);
                }
            },
        }
    }
    (owner, parameters, context)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};

    fn capability(mode: Mode) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }
    }

    #[test]
    fn one_node_at_a_time_is_served_and_many_nodes_are_not() {
        assert_eq!(unsupported(&capability(Mode::SingleNodeWriter)), None);
        assert_eq!(unsupported(&capability(Mode::SingleNodeReaderOnly)), None);
        let why = unsupported(&capability(Mode::MultiNodeMultiWriter)).unwrap();
        assert!(why.contains("MULTI_NODE_MULTI_WRITER"), "{why}");
        let no_type = csi::VolumeCapability {
            access_type: None,
            ..capability(Mode::SingleNodeWriter)
        };
        assert!(unsupported(&no_type).unwrap().contains("access type"));
    }

    #[test]
    fn zones_come_preferred_first_under_any_zone_key() {
        let keys = vec![
            "topology.sim.cloudgateway.io/zone".to_owned(),
            "topology.kubernetes.io/zone".to_owned(),
        ];
        let topology = |k: &str, z: &str| csi::Topology {
            segments: HashMap::from([(k.to_owned(), z.to_owned())]),
        };
        let requirement = csi::TopologyRequirement {
            requisite: vec![topology(&keys[1], "a"), topology(&keys[0], "b")],
            preferred: vec![topology(&keys[0], "b"), topology("other", "c")],
        };
        assert_eq!(zones(Some(&requirement), &keys), ["b", "a"]);
        assert!(zones(None, &keys).is_empty());
    }

    #[test]
    fn gateway_errors_keep_the_codes_csi_gives_them() {
        let other = |code| ccm_proto::Error::Other {
            code,
            message: "m".into(),
        };
        assert_eq!(
            csi_status(other(Code::FailedPrecondition)).code(),
            Code::FailedPrecondition
        );
        assert_eq!(
            csi_status(other(Code::ResourceExhausted)).code(),
            Code::ResourceExhausted
        );
        let size = ccm_proto::Error::InvalidArgument {
            violations: vec![ccm_proto::FieldViolation {
                field: "limit_bytes".into(),
                description: "too small".into(),
            }],
            message: "m".into(),
        };
        assert_eq!(csi_status(size).code(), Code::OutOfRange);
        let refused = ccm_proto::Error::Unauthenticated {
            message: "m".into(),
        };
        assert_eq!(csi_status(refused).code(), Code::Internal);
    }

    #[test]
    fn node_parameters_are_taken_in_any_case_and_passed_on_lowercase() {
        let given = HashMap::from(
            [
                ("blockSize", "4096"),
                ("INODESIZE", "512"),
                ("type", "gp3"),
                (PVC_NAME, "data"),
                ("csi.storage.k8s.io/fstype", "ext4"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
        let node = ["blocksize".to_owned(), "inodesize".to_owned()];
        let (owner, parameters, context) = split_parameters(given, &node);
        assert_eq!(owner.pvc_name, "data");
        assert_eq!(
            parameters,
            HashMap::from([("type".to_owned(), "gp3".to_owned())])
        );
        assert_eq!(
            context,
            HashMap::from([
                ("blocksize".to_owned(), "4096".to_owned()),
                ("inodesize".to_owned(), "512".to_owned()),
            ])
        );
    }
}
