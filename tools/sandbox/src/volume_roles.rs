//! What kube-controller-manager, the scheduler and the kubelet do with CSI
//! volumes, played in the sandbox, where none of them runs. With upstream's
//! external-provisioner and external-attacher beside the volume controller
//! (`sandbox --volumes --csi-provisioner PATH --csi-attacher PATH`), a
//! Pod's claim goes the whole way: provisioned, bound, attached to the
//! Pod's node, staged and published by the node's plugin, and back.
//!
//! Each [`VolumeRoles::pass`] lists what it needs once and acts on what it
//! read, as level-triggered controllers do:
//! - the PV controller's part: a claim of a class whose provisioner is the
//!   gateway's CSI driver is handed to the provisioner (annotated
//!   `volume.kubernetes.io/storage-provisioner`; for a class that waits for
//!   its first consumer, also `volume.kubernetes.io/selected-node` once a
//!   Pod that names a node uses it, the scheduler's part); a volume the
//!   provisioner made for a claim is bound to it; a volume whose claim is
//!   gone (read again to be sure) is Released, which the provisioner then
//!   deletes;
//! - the attach-detach controller's: a VolumeAttachment for each volume a
//!   Pod on a node uses, named as kube-controller-manager names it; one no
//!   Pod uses and nothing on the node holds is deleted, and the attacher
//!   detaches it;
//! - the kubelet's volume manager: once attached, the volume is staged and
//!   published through the node's plugin at the kubelet's paths (under
//!   `kubelet/<node>/` in the state directory, each with the kubelet's
//!   `vol_data.json`), and the Pod is marked Running; once the Pod is gone,
//!   its volumes are unpublished and, with no Pod left using them on that
//!   node, unstaged;
//! - the kubelet's volume expansion: a claim the resizer left waiting for
//!   the node (`FileSystemResizePending`) has its filesystem grown through
//!   the plugin of the node of a Pod that has it published, and its
//!   capacity then reads as its volume's.
//!
//! There is no scheduler: a Pod names its node (`spec.nodeName`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use ccm_proto::csi::{self, node_client::NodeClient, volume_capability};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

use crate::csi_node;

/// The claim annotations the PV controller and the scheduler write.
const PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const BETA_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// The kubelet's record beside each staging and publishing path.
const VOL_DATA: &str = "vol_data.json";

/// The sandbox's cluster-side volume roles for one CSI driver.
#[derive(Clone, Debug)]
pub struct VolumeRoles {
    /// The gateway's CSI driver (its VolumeOffer.csi_driver).
    pub driver: String,
    /// Each simulated node's plugin socket, by Node name.
    pub plugins: BTreeMap<String, PathBuf>,
    /// The kubelets' directories: `<node>/pods/…` and `<node>/plugins/…`.
    pub kubelet_dir: PathBuf,
}

/// Everything one pass reads.
struct Cluster {
    classes: Vec<StorageClass>,
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    pods: Vec<Pod>,
    attachments: Vec<VolumeAttachment>,
}

/// One of the driver's volumes that a Pod on a simulated node uses.
#[derive(Clone, Debug)]
struct Use {
    pod_uid: String,
    node: String,
    pv: String,
    handle: String,
    read_only: bool,
    block: bool,
    fs_type: String,
    access_mode: volume_capability::access_mode::Mode,
    volume_context: BTreeMap<String, String>,
}

impl VolumeRoles {
    /// One round of every role; a step that fails is logged and retried
    /// on the next pass, as the controllers retry.
    pub async fn pass(&self, client: &kube::Client) -> anyhow::Result<()> {
        let cluster = Cluster::read(client).await?;
        self.hand_over(client, &cluster).await?;
        self.bind(client, &cluster).await?;
        let uses = self.uses(&cluster);
        self.attach(client, &cluster, &uses).await?;
        self.mount(client, &cluster, &uses).await?;
        self.grow(client, &cluster, &uses).await?;
        let held = self.unmount(&cluster).await?;
        self.detach(client, &cluster, &uses, &held).await
    }

    /// The PV controller hands a claim of one of the driver's classes to
    /// the provisioner; for a class that waits for its first consumer, once
    /// a Pod on a node uses it (the scheduler names the node).
    async fn hand_over(&self, client: &kube::Client, cluster: &Cluster) -> anyhow::Result<()> {
        let classes: BTreeMap<&str, bool> = cluster
            .classes
            .iter()
            .filter(|c| c.provisioner == self.driver)
            .filter_map(|c| {
                let waits = c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
                Some((c.metadata.name.as_deref()?, waits))
            })
            .collect();
        for claim in &cluster.claims {
            let Some(spec) = &claim.spec else { continue };
            let Some(&waits) = spec
                .storage_class_name
                .as_deref()
                .and_then(|c| classes.get(c))
            else {
                continue;
            };
            let annotations = claim.metadata.annotations.clone().unwrap_or_default();
            if annotations.contains_key(PROVISIONER)
                || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
            {
                continue;
            }
            let (ns, name) = names(&claim.metadata);
            let mut add = Map::new();
            add.insert(PROVISIONER.into(), json!(self.driver));
            add.insert(BETA_PROVISIONER.into(), json!(self.driver));
            if waits {
                let node = cluster
                    .pods
                    .iter()
                    .filter(|p| p.metadata.namespace.as_deref() == Some(ns))
                    .filter(|p| claims_of(p).any(|c| c == name))
                    .find_map(|p| p.spec.as_ref()?.node_name.as_deref());
                let Some(node) = node else { continue };
                add.insert(SELECTED_NODE.into(), json!(node));
            }
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": add}})),
                )
                .await
                .with_context(|| format!("hand the claim {ns}/{name} to the provisioner"))?;
        }
        Ok(())
    }

    /// The PV controller binds each volume the provisioner made to its
    /// claim, and marks one whose claim is gone Released.
    async fn bind(&self, client: &kube::Client, cluster: &Cluster) -> anyhow::Result<()> {
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        for pv in &cluster.volumes {
            let Some(spec) = &pv.spec else { continue };
            if spec.csi.as_ref().map(|c| c.driver.as_str()) != Some(self.driver.as_str()) {
                continue;
            }
            let Some(claim_ref) = &spec.claim_ref else {
                continue;
            };
            let phase = pv
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("Pending");
            if matches!(phase, "Released" | "Failed") {
                continue;
            }
            let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
            let ns = claim_ref.namespace.as_deref().unwrap_or("default");
            let name = claim_ref.name.as_deref().unwrap_or_default();
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
            let claim = cluster
                .claims
                .iter()
                .find(|c| names(&c.metadata) == (ns, name));
            let ours = claim.filter(|c| claim_ref.uid.is_none() || c.metadata.uid == claim_ref.uid);
            let Some(claim) = ours else {
                // Gone from the list: read again, and release only on a
                // definite answer.
                let now = claims.get_opt(name).await?;
                let gone =
                    now.is_none_or(|c| claim_ref.uid.is_some() && c.metadata.uid != claim_ref.uid);
                if gone {
                    volumes
                        .patch_status(
                            pv_name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"phase": "Released"}})),
                        )
                        .await
                        .with_context(|| format!("release the volume {pv_name}"))?;
                }
                continue;
            };
            let claim_spec = claim.spec.clone().unwrap_or_default();
            let bound_to = claim_spec.volume_name.as_deref().unwrap_or_default();
            if !bound_to.is_empty() && bound_to != pv_name {
                continue;
            }
            if bound_to.is_empty() {
                claims
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({
                            "metadata": {"annotations": {
                                BIND_COMPLETED: "yes",
                                BOUND_BY_CONTROLLER: "yes",
                            }},
                            "spec": {"volumeName": pv_name},
                        })),
                    )
                    .await
                    .with_context(|| format!("bind the claim {ns}/{name} to {pv_name}"))?;
            }
            let claim_phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
            if claim_phase != Some("Bound") {
                claims
                    .patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {
                            "phase": "Bound",
                            "accessModes": spec.access_modes,
                            "capacity": spec.capacity,
                        }})),
                    )
                    .await
                    .with_context(|| format!("mark the claim {ns}/{name} bound"))?;
            }
            if phase != "Bound" {
                volumes
                    .patch_status(
                        pv_name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
                    )
                    .await
                    .with_context(|| format!("mark the volume {pv_name} bound"))?;
            }
        }
        Ok(())
    }

    /// The driver's bound volumes that running Pods on simulated nodes use.
    fn uses(&self, cluster: &Cluster) -> Vec<Use> {
        use volume_capability::access_mode::Mode;
        let mut out = Vec::new();
        for pod in cluster.pods.iter().filter(|p| is_live(p)) {
            let Some(spec) = &pod.spec else { continue };
            let Some(node) = spec.node_name.as_deref() else {
                continue;
            };
            if !self.plugins.contains_key(node) {
                continue;
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            for volume in spec.volumes.iter().flatten() {
                let Some(source) = &volume.persistent_volume_claim else {
                    continue;
                };
                let Some(pv_name) = cluster
                    .claims
                    .iter()
                    .find(|c| names(&c.metadata) == (ns, source.claim_name.as_str()))
                    .and_then(|c| c.spec.as_ref()?.volume_name.as_deref())
                    .filter(|v| !v.is_empty())
                else {
                    continue;
                };
                let Some(pv) = cluster
                    .volumes
                    .iter()
                    .find(|v| v.metadata.name.as_deref() == Some(pv_name))
                else {
                    continue;
                };
                let Some(pv_spec) = &pv.spec else { continue };
                let Some(csi) = pv_spec.csi.as_ref().filter(|c| c.driver == self.driver) else {
                    continue;
                };
                let access_mode = match pv_spec
                    .access_modes
                    .iter()
                    .flatten()
                    .next()
                    .map(String::as_str)
                {
                    Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
                    Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
                    Some("ReadWriteOncePod") => Mode::SingleNodeSingleWriter,
                    _ => Mode::SingleNodeWriter,
                };
                out.push(Use {
                    pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                    node: node.to_owned(),
                    pv: pv_name.to_owned(),
                    handle: csi.volume_handle.clone(),
                    read_only: source.read_only.unwrap_or(false) || csi.read_only.unwrap_or(false),
                    block: pv_spec.volume_mode.as_deref() == Some("Block"),
                    fs_type: csi.fs_type.clone().unwrap_or_default(),
                    access_mode,
                    volume_context: csi.volume_attributes.clone().unwrap_or_default(),
                });
            }
        }
        out
    }

    /// The attach-detach controller: a VolumeAttachment for each volume
    /// a Pod on a node uses.
    async fn attach(
        &self,
        client: &kube::Client,
        cluster: &Cluster,
        uses: &[Use],
    ) -> anyhow::Result<()> {
        let api: Api<VolumeAttachment> = Api::all(client.clone());
        let have: BTreeSet<&str> = cluster
            .attachments
            .iter()
            .filter_map(|a| a.metadata.name.as_deref())
            .collect();
        let mut made = BTreeSet::new();
        for u in uses {
            let name = attachment_name(&u.handle, &self.driver, &u.node);
            if have.contains(name.as_str()) || !made.insert(name.clone()) {
                continue;
            }
            let attachment = json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": name},
                "spec": {
                    "attacher": self.driver,
                    "nodeName": u.node,
                    "source": {"persistentVolumeName": u.pv},
                },
            });
            match api
                .create(&PostParams::default(), &serde_json::from_value(attachment)?)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("create the attachment {name}")),
            }
        }
        Ok(())
    }

    /// The kubelet: each attached volume of a Pod staged and published
    /// through its node's plugin, then the Pod Running.
    async fn mount(
        &self,
        client: &kube::Client,
        cluster: &Cluster,
        uses: &[Use],
    ) -> anyhow::Result<()> {
        // Pods whose every use of the driver's volumes is published.
        let mut ready: BTreeMap<&str, bool> = BTreeMap::new();
        for u in uses {
            let name = attachment_name(&u.handle, &self.driver, &u.node);
            let attached = cluster
                .attachments
                .iter()
                .find(|a| a.metadata.name.as_deref() == Some(name.as_str()))
                .and_then(|a| a.status.as_ref())
                .filter(|s| s.attached);
            let target = self.target(u);
            let published = match attached {
                _ if exists(&target) => true,
                None => false,
                Some(status) => {
                    let context = status.attachment_metadata.clone().unwrap_or_default();
                    match self.publish(u, &context).await {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!(pod = %u.pod_uid, volume = %u.pv, error = %format!("{e:#}"), "could not mount");
                            false
                        }
                    }
                }
            };
            *ready.entry(u.pod_uid.as_str()).or_insert(true) &= published;
        }
        for pod in &cluster.pods {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if ready.get(uid) != Some(&true) {
                continue;
            }
            // Only a Pod whose every claim is the driver's.
            if claims_of(pod).count() != uses.iter().filter(|u| u.pod_uid == uid).count() {
                continue;
            }
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                continue;
            }
            let (ns, name) = names(&pod.metadata);
            let now = k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            let condition =
                |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now});
            // Every container running and ready, as the kubelet reports
            // them (`kubectl get pod` counts them).
            let containers: Vec<Value> = pod
                .spec
                .iter()
                .flat_map(|s| &s.containers)
                .map(|c| {
                    json!({
                        "name": c.name,
                        "image": c.image,
                        "imageID": "",
                        "ready": true,
                        "started": true,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": now}},
                    })
                })
                .collect();
            Api::<Pod>::namespaced(client.clone(), ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "phase": "Running",
                        "startTime": now,
                        "containerStatuses": containers,
                        "conditions": [
                            condition("PodScheduled"),
                            condition("Initialized"),
                            condition("ContainersReady"),
                            condition("Ready"),
                        ],
                    }})),
                )
                .await
                .with_context(|| format!("mark the Pod {ns}/{name} running"))?;
        }
        Ok(())
    }

    /// The kubelet's part of an expansion: for each claim whose volume the
    /// controller grew and left to the node (`FileSystemResizePending`, or
    /// `NodeResizePending` in its resize status), NodeExpandVolume on the
    /// node of a Pod that has it published, then the claim's capacity is its
    /// volume's, the resize conditions and status gone.
    async fn grow(
        &self,
        client: &kube::Client,
        cluster: &Cluster,
        uses: &[Use],
    ) -> anyhow::Result<()> {
        for claim in &cluster.claims {
            let Some(status) = &claim.status else {
                continue;
            };
            let pending = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "FileSystemResizePending" && c.status == "True")
                || status
                    .allocated_resource_statuses
                    .as_ref()
                    .and_then(|s| s.get("storage"))
                    .is_some_and(|s| s == "NodeResizePending");
            if !pending {
                continue;
            }
            let Some(pv_name) = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) else {
                continue;
            };
            let Some(u) = uses
                .iter()
                .find(|u| u.pv == pv_name && exists(&self.target(u)))
            else {
                continue;
            };
            let Some(size) = cluster
                .volumes
                .iter()
                .find(|v| v.metadata.name.as_deref() == Some(pv_name))
                .and_then(|v| v.spec.as_ref()?.capacity.as_ref()?.get("storage").cloned())
            else {
                continue;
            };
            let required = storage_bytes(&size.0)
                .with_context(|| format!("the volume {pv_name}'s capacity {}", size.0))?;
            let socket = self
                .plugins
                .get(&u.node)
                .with_context(|| format!("no plugin on {}", u.node))?;
            let mut plugin = NodeClient::new(csi_node::channel(socket).await?);
            plugin
                .node_expand_volume(csi::NodeExpandVolumeRequest {
                    volume_id: u.handle.clone(),
                    volume_path: self.target(u).display().to_string(),
                    staging_target_path: self
                        .staging(&u.node, &u.handle)
                        .join("globalmount")
                        .display()
                        .to_string(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: required,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(capability(u)),
                    ..Default::default()
                })
                .await
                .with_context(|| format!("NodeExpandVolume of {pv_name} on {}", u.node))?;
            // The kubelet drops both resize conditions: the resizer keeps
            // `Resizing` beside `FileSystemResizePending`.
            let conditions: Vec<_> = status
                .conditions
                .iter()
                .flatten()
                .filter(|c| !matches!(c.type_.as_str(), "Resizing" | "FileSystemResizePending"))
                .collect();
            let (ns, name) = names(&claim.metadata);
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "capacity": {"storage": size},
                        "conditions": conditions,
                        "allocatedResourceStatuses": {"storage": null},
                    }})),
                )
                .await
                .with_context(|| format!("mark the claim {ns}/{name} grown"))?;
        }
        Ok(())
    }

    /// Stages (where it is not yet) and publishes one use, writing the
    /// kubelet's records first, so that a Pod gone mid-way is still
    /// cleaned up.
    async fn publish(&self, u: &Use, context: &BTreeMap<String, String>) -> anyhow::Result<()> {
        let socket = self
            .plugins
            .get(&u.node)
            .with_context(|| format!("no plugin on {}", u.node))?;
        let mut plugin = NodeClient::new(csi_node::channel(socket).await?);
        let capability = capability(u);
        let staging = self.staging(&u.node, &u.handle);
        let target = self.target(u);
        let record = json!({
            "volumeHandle": u.handle,
            "driverName": self.driver,
            "nodeName": u.node,
            "specVolID": u.pv,
            "stagingPath": staging.join("globalmount"),
            "targetPath": target,
        });
        write_record(&staging, &record)?;
        write_record(target.parent().context("a target has a parent")?, &record)?;
        plugin
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: u.handle.clone(),
                publish_context: context.clone().into_iter().collect(),
                staging_target_path: staging.join("globalmount").display().to_string(),
                volume_capability: Some(capability.clone()),
                volume_context: u.volume_context.clone().into_iter().collect(),
                ..Default::default()
            })
            .await
            .context("NodeStageVolume")?;
        plugin
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: u.handle.clone(),
                publish_context: context.clone().into_iter().collect(),
                staging_target_path: staging.join("globalmount").display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability),
                readonly: u.read_only,
                volume_context: u.volume_context.clone().into_iter().collect(),
                ..Default::default()
            })
            .await
            .context("NodePublishVolume")?;
        Ok(())
    }

    /// The kubelet, for Pods gone: each of their volumes unpublished, and
    /// unstaged where no live Pod on the node uses it. Answers the
    /// `(node, volume)` pairs still held on some node.
    async fn unmount(&self, cluster: &Cluster) -> anyhow::Result<BTreeSet<(String, String)>> {
        let live: BTreeSet<(&str, &str)> = cluster
            .pods
            .iter()
            .filter(|p| is_live(p))
            .filter_map(|p| {
                Some((
                    p.spec.as_ref()?.node_name.as_deref()?,
                    p.metadata.uid.as_deref()?,
                ))
            })
            .collect();
        let mut held = BTreeSet::new();
        for (node, socket) in &self.plugins {
            let mut plugin = None;
            for (dir, record) in records(&self.kubelet_dir.join(node).join("pods"), 4)? {
                let (Some(handle), Some(pv), Some(uid)) = (
                    record["volumeHandle"].as_str(),
                    record["specVolID"].as_str(),
                    pod_uid_of(&dir),
                ) else {
                    continue;
                };
                if live.contains(&(node.as_str(), uid)) {
                    held.insert((node.clone(), pv.to_owned()));
                    continue;
                }
                let target = record["targetPath"].as_str().unwrap_or_default().to_owned();
                let client = plugin_client(&mut plugin, socket).await?;
                let unpublished = client
                    .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                        volume_id: handle.to_owned(),
                        target_path: target,
                    })
                    .await;
                match unpublished {
                    Ok(_) => remove(&dir),
                    Err(e) => {
                        tracing::warn!(%node, volume = pv, error = %e, "could not unpublish");
                        held.insert((node.clone(), pv.to_owned()));
                    }
                }
            }
            let staged = self.kubelet_dir.join(node).join(staging_root(&self.driver));
            for (dir, record) in records(&staged, 1)? {
                let (Some(handle), Some(pv)) = (
                    record["volumeHandle"].as_str(),
                    record["specVolID"].as_str(),
                ) else {
                    continue;
                };
                if held.contains(&(node.clone(), pv.to_owned())) {
                    continue;
                }
                let client = plugin_client(&mut plugin, socket).await?;
                let unstaged = client
                    .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                        volume_id: handle.to_owned(),
                        staging_target_path: dir.join("globalmount").display().to_string(),
                    })
                    .await;
                match unstaged {
                    Ok(_) => remove(&dir),
                    Err(e) => {
                        tracing::warn!(%node, volume = pv, error = %e, "could not unstage");
                        held.insert((node.clone(), pv.to_owned()));
                    }
                }
            }
        }
        Ok(held)
    }

    /// The attach-detach controller: an attachment that no Pod uses and
    /// nothing on its node holds is deleted; the attacher detaches it.
    async fn detach(
        &self,
        client: &kube::Client,
        cluster: &Cluster,
        uses: &[Use],
        held: &BTreeSet<(String, String)>,
    ) -> anyhow::Result<()> {
        let api: Api<VolumeAttachment> = Api::all(client.clone());
        let needed: BTreeSet<String> = uses
            .iter()
            .map(|u| attachment_name(&u.handle, &self.driver, &u.node))
            .collect();
        for attachment in &cluster.attachments {
            let spec = &attachment.spec;
            let name = attachment.metadata.name.as_deref().unwrap_or_default();
            let pv = spec
                .source
                .persistent_volume_name
                .clone()
                .unwrap_or_default();
            // Only what this role made: the driver's, on a simulated node,
            // under kube-controller-manager's name.
            let volume_handle = cluster
                .volumes
                .iter()
                .find(|v| v.metadata.name.as_deref() == Some(pv.as_str()))
                .and_then(|v| Some(v.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()));
            let ours = spec.attacher == self.driver
                && self.plugins.contains_key(&spec.node_name)
                && volume_handle
                    .is_some_and(|h| attachment_name(&h, &self.driver, &spec.node_name) == name);
            if !ours
                || needed.contains(name)
                || held.contains(&(spec.node_name.clone(), pv))
                || attachment.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("delete the attachment {name}")),
            }
        }
        Ok(())
    }

    /// Where the kubelet stages a volume: `plugins/kubernetes.io/csi/
    /// <driver>/<sha256 of the handle>/` on its node (the plugin is given
    /// `globalmount` in it).
    fn staging(&self, node: &str, handle: &str) -> PathBuf {
        self.kubelet_dir
            .join(node)
            .join(staging_root(&self.driver))
            .join(sha256_hex(handle))
    }

    /// Where the kubelet publishes a Pod's volume.
    fn target(&self, u: &Use) -> PathBuf {
        let pod = self.kubelet_dir.join(&u.node).join("pods").join(&u.pod_uid);
        if u.block {
            pod.join("volumeDevices/kubernetes.io~csi")
                .join(&u.pv)
                .join("dev")
        } else {
            pod.join("volumes/kubernetes.io~csi")
                .join(&u.pv)
                .join("mount")
        }
    }
}

impl Cluster {
    async fn read(client: &kube::Client) -> anyhow::Result<Self> {
        let all = ListParams::default();
        Ok(Self {
            classes: Api::<StorageClass>::all(client.clone())
                .list(&all)
                .await?
                .items,
            claims: Api::<PersistentVolumeClaim>::all(client.clone())
                .list(&all)
                .await?
                .items,
            volumes: Api::<PersistentVolume>::all(client.clone())
                .list(&all)
                .await?
                .items,
            pods: Api::<Pod>::all(client.clone()).list(&all).await?.items,
            attachments: Api::<VolumeAttachment>::all(client.clone())
                .list(&all)
                .await?
                .items,
        })
    }
}

/// The name kube-controller-manager gives the attachment of a CSI volume
/// to a node: `csi-` and the SHA-256, in hex, of the volume handle, the
/// driver and the node name.
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{handle}{driver}{node}")))
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The bytes of a storage quantity: digits and an optional suffix, binary
/// (`Ki` to `Pi`) or decimal (`k` to `P`), as volumes' sizes are written.
fn storage_bytes(quantity: &str) -> anyhow::Result<i64> {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (digits, suffix) = quantity.split_at(split);
    let scale: i64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => anyhow::bail!("not a whole number of bytes with a known suffix"),
    };
    digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .context("not a whole number of bytes within 2^63")
}

/// The kubelet's directory of a driver's staged volumes, under its node's.
fn staging_root(driver: &str) -> PathBuf {
    Path::new("plugins/kubernetes.io/csi").join(driver)
}

/// An object's namespace (`default` where it has none) and name.
fn names(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
    )
}

/// The claims a Pod's volumes name.
fn claims_of(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.as_str()))
}

/// A Pod not finished and not being deleted.
fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

fn capability(u: &Use) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: u.access_mode as i32,
        }),
        access_type: Some(if u.block {
            volume_capability::AccessType::Block(volume_capability::BlockVolume {})
        } else {
            volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type: u.fs_type.clone(),
                ..Default::default()
            })
        }),
    }
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Writes the kubelet's `vol_data.json` in `dir`, making it.
fn write_record(dir: &Path, record: &Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::write(dir.join(VOL_DATA), record.to_string())
        .with_context(|| format!("write {}", dir.join(VOL_DATA).display()))
}

/// Every `vol_data.json` exactly `depth` directories below `root`, with
/// its directory; none where `root` does not exist.
fn records(root: &Path, depth: usize) -> anyhow::Result<Vec<(PathBuf, Value)>> {
    let mut dirs = vec![root.to_path_buf()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in dirs {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("read {}", dir.display())),
            };
            for entry in entries {
                let path = entry?.path();
                if path.is_dir() {
                    next.push(path);
                }
            }
        }
        dirs = next;
    }
    Ok(dirs
        .into_iter()
        .filter_map(|dir| {
            let text = std::fs::read_to_string(dir.join(VOL_DATA)).ok()?;
            Some((dir, serde_json::from_str(&text).ok()?))
        })
        .collect())
}

/// The Pod UID in a publishing directory's path:
/// `pods/<uid>/volumes/kubernetes.io~csi/<pv>`.
fn pod_uid_of(dir: &Path) -> Option<&str> {
    dir.parent()?.parent()?.parent()?.file_name()?.to_str()
}

/// Removes what the kubelet made for a volume once the plugin let it go.
fn remove(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "could not remove");
    }
}

/// The node's plugin client, connected on first use.
async fn plugin_client<'a>(
    plugin: &'a mut Option<NodeClient<tonic::transport::Channel>>,
    socket: &Path,
) -> anyhow::Result<&'a mut NodeClient<tonic::transport::Channel>> {
    if plugin.is_none() {
        *plugin = Some(NodeClient::new(csi_node::channel(socket).await?));
    }
    plugin.as_mut().context("the plugin's client was just made")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_are_named_as_kube_controller_manager_names_them() {
        let name = attachment_name("vol-1", "ebs.csi.aws.com", "node-0");
        assert_eq!(name.len(), "csi-".len() + 64);
        assert_eq!(
            name,
            format!("csi-{}", sha256_hex("vol-1ebs.csi.aws.comnode-0"))
        );
        assert_ne!(name, attachment_name("vol-1", "ebs.csi.aws.com", "node-1"));
    }

    #[test]
    fn storage_quantities_read_as_bytes() {
        assert_eq!(super::storage_bytes("5Gi").unwrap(), 5 << 30);
        assert_eq!(super::storage_bytes("2G").unwrap(), 2_000_000_000);
        assert_eq!(super::storage_bytes("1048576").unwrap(), 1 << 20);
        for bad in ["", "1.5Gi", "5Xi", "Gi", "99999999999Pi"] {
            assert!(super::storage_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_kubelets_records_are_found_at_their_depth() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let volume = pods.join("uid-1/volumes/kubernetes.io~csi/pv-1");
        write_record(&volume, &json!({"specVolID": "pv-1"})).unwrap();
        std::fs::create_dir_all(pods.join("uid-2/volumes/kubernetes.io~csi/pv-2")).unwrap();
        let found = records(&pods, 4).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, volume);
        assert_eq!(pod_uid_of(&found[0].0), Some("uid-1"));
        assert!(records(&dir.path().join("none"), 4).unwrap().is_empty());
    }
}
