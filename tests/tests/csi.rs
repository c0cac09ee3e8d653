//! Volumes through the one door, end to end on the sandbox: the volume
//! controller serves CSI on a unix socket with no cloud credentials, the
//! gateway does the cloud's side on the sim, and the CSI project's own
//! conformance suite (csi-sanity) and a caller playing the sidecars judge
//! it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ccm_proto::csi::controller_client::ControllerClient;
use ccm_proto::csi::node_client::NodeClient;
use ccm_proto::csi::{self, volume_capability};
use ccm_sandbox::CloudKind;
use ccm_testkit::scenario;

/// Waits until a CSI socket answers `GetPluginInfo`.
async fn serving(socket: &Path) -> tonic::transport::Channel {
    let start = Instant::now();
    loop {
        if let Ok(channel) = ccm_sandbox::csi_node::channel(socket).await {
            let mut identity = csi::identity_client::IdentityClient::new(channel.clone());
            if identity
                .get_plugin_info(csi::GetPluginInfoRequest {})
                .await
                .is_ok()
            {
                return channel;
            }
        }
        assert!(
            start.elapsed() < scenario::LIMIT,
            "{} never answered",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `text` without its terminal colour codes (ginkgo colours its summary
/// whatever it is told).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn mount_capability() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_passes_and_two_attaches_at_once_get_two_devices() {
    let sanity =
        ccm_testkit::csi_sanity("csi_sanity_passes_and_two_attaches_at_once_get_two_devices");
    // One zone: csi-sanity asks for no zone and publishes to the one node.
    let extra = [(
        "cloud-gateway".to_owned(),
        vec!["--sim-zones".to_owned(), "sim-zone-a".to_owned()],
    )];
    let (sandbox, kubelets, dir) =
        scenario::start_adjusted(CloudKind::Sim, 1, 0, extra.into(), |o| {
            o.volumes = true;
            o.replicas = 1;
        })
        .await;
    let controller_socket = PathBuf::from(&sandbox.endpoints["csi_socket"]);
    let node_socket = PathBuf::from(&sandbox.endpoints["csi_node_socket"]);
    let controller = serving(&controller_socket).await;
    let node = serving(&node_socket).await;

    // As the external-attacher does for two Pods scheduled to one node at
    // once: two volumes published to one instance concurrently.
    let info = NodeClient::new(node)
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let topology = info.accessible_topology.clone().unwrap();
    let mut volumes = Vec::new();
    for name in ["pvc-one", "pvc-two"] {
        let created = ControllerClient::new(controller.clone())
            .create_volume(csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![mount_capability()],
                accessibility_requirements: Some(csi::TopologyRequirement {
                    requisite: vec![topology.clone()],
                    preferred: vec![topology.clone()],
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(created.accessible_topology, vec![topology.clone()]);
        volumes.push(created.volume_id);
    }
    let publish = |volume_id: String| {
        let (channel, node_id) = (controller.clone(), info.node_id.clone());
        async move {
            ControllerClient::new(channel)
                .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                    volume_id,
                    node_id,
                    volume_capability: Some(mount_capability()),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .publish_context["devicePath"]
                .clone()
        }
    };
    let (first, second) = tokio::join!(publish(volumes[0].clone()), publish(volumes[1].clone()));
    assert_ne!(first, second, "two volumes attached under one device name");
    // Read back from the cloud, not from the controller's answers.
    let admin = sandbox.admin().unwrap();
    let mut devices = HashMap::new();
    for id in &volumes {
        let volume = admin
            .get_volume(ccm_proto::v1::GetVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .volume
            .unwrap();
        assert_eq!(volume.attachments.len(), 1, "{volume:?}");
        assert_eq!(volume.attachments[0].instance_id, info.node_id);
        devices.insert(volume.attachments[0].device.clone(), id.clone());
    }
    assert_eq!(devices.len(), 2, "{devices:?}");
    assert!(devices.contains_key(&first) && devices.contains_key(&second));
    for id in volumes {
        let mut c = ControllerClient::new(controller.clone());
        c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: info.node_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    }

    if let Some(sanity) = sanity {
        let passed = run_sanity(&sanity, &node_socket, &controller_socket, dir.path()).await;
        // The controller's and the node plugin's tests, snapshots and
        // expansion among them; fewer means a capability went missing.
        assert!(passed >= 79, "csi-sanity passed only {passed} specs");
    }
    scenario::finish(sandbox, kubelets).await;
}

/// Runs csi-sanity against the node plugin at `node` and the controller
/// at `controller`, working under `dir`; fails the test unless it passes,
/// and answers how many specs passed.
async fn run_sanity(sanity: &Path, node: &Path, controller: &Path, dir: &Path) -> u32 {
    let work = dir.join("sanity");
    std::fs::create_dir_all(&work).unwrap();
    let out = tokio::process::Command::new(sanity)
        .arg(format!("--csi.endpoint={}", node.display()))
        .arg(format!("--csi.controllerendpoint={}", controller.display()))
        .arg(format!(
            "--csi.stagingdir={}",
            work.join("staging").display()
        ))
        .arg(format!("--csi.mountdir={}", work.join("mount").display()))
        .arg(format!("--csi.testvolumesize={}", 1u64 << 30))
        .arg(format!("--csi.testvolumeexpandsize={}", 2u64 << 30))
        .arg(format!(
            "--csi.junitfile={}",
            work.join("junit.xml").display()
        ))
        .output()
        .await
        .unwrap();
    let text = without_colours(&format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ));
    let tail: String = text
        .lines()
        .rev()
        .take(80)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(out.status.success(), "csi-sanity failed:\n{tail}");
    // "SUCCESS! -- 71 Passed | 0 Failed | 1 Pending | 24 Skipped"
    text.lines()
        .find_map(|l| l.trim().strip_prefix("SUCCESS! -- "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary:\n{tail}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_passes_on_aws_against_moto() {
    let Some(sanity) = ccm_testkit::csi_sanity("csi_sanity_passes_on_aws_against_moto") else {
        return;
    };
    let (sandbox, kubelets, dir) =
        scenario::start_adjusted(CloudKind::Aws, 1, 0, Default::default(), |o| {
            o.volumes = true;
            o.replicas = 1;
        })
        .await;
    let controller_socket = PathBuf::from(&sandbox.endpoints["csi_socket"]);
    let node_socket = PathBuf::from(&sandbox.endpoints["csi_node_socket"]);
    serving(&controller_socket).await;
    serving(&node_socket).await;
    let passed = run_sanity(&sanity, &node_socket, &controller_socket, dir.path()).await;
    // EBS through the SDK against EC2's API: the sim's specs but the two
    // of cloning, which the AWS provider does not offer (77 of 79).
    assert!(
        passed >= 77,
        "csi-sanity passed only {passed} specs on moto"
    );
    scenario::finish(sandbox, kubelets).await;
}

/// The cloud's volume `id`, as the admin reads it from the gateway.
async fn volume_of(
    admin: ccm_proto::GatewayClient,
    id: String,
) -> Result<ccm_proto::v1::GetVolumeResponse, ccm_proto::Error> {
    admin
        .get_volume(ccm_proto::v1::GetVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
}

/// The EBS volume `id` as boto3 reads it from moto at `endpoint`: its
/// size in GiB, type, IOPS, snapshot, tags, and attachments as
/// `[instance, device]`; `None` when EC2 has no such volume.
fn ebs_volume(endpoint: &str, id: &str) -> Option<serde_json::Value> {
    let script = "import boto3, json, sys\n\
        ec2 = boto3.client('ec2', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        out = [{'size': v['Size'], 'type': v['VolumeType'], 'iops': v.get('Iops'),\n\
            'snapshot': v.get('SnapshotId', ''),\n\
            'tags': {t['Key']: t['Value'] for t in v.get('Tags', [])},\n\
            'attachments': [[a['InstanceId'], a['Device']] for a in v['Attachments']]}\n\
            for v in ec2.describe_volumes()['Volumes'] if v['VolumeId'] == sys.argv[3]]\n\
        print(json.dumps(out[0] if out else None))\n";
    let found = ccm_testkit::boto3(script, endpoint, &[id]);
    (!found.is_null()).then_some(found)
}

/// Waits until `check` answers something, failing after the scenario's
/// limit with `what`.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(start.elapsed() < scenario::LIMIT, "{what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_provisioner_and_attacher_make_attach_detach_and_delete_a_cloud_volume() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
    use serde_json::json;

    let test = "the_real_provisioner_and_attacher_make_attach_detach_and_delete_a_cloud_volume";
    let Some((provisioner, attacher)) = ccm_testkit::csi_sidecars(test) else {
        return;
    };
    // Under the chart's RBAC (volumes on). The sidecars share the volume
    // controller's pod, and so its ServiceAccount: they may do what the
    // chart grants it. This test plays the cluster's part itself.
    let (sandbox, kubelets, _dir) =
        scenario::start_adjusted(CloudKind::Sim, 1, 0, Default::default(), |o| {
            o.volumes = true;
            o.replicas = 1;
            o.csi_sidecars = Some(ccm_sandbox::CsiSidecars::new(provisioner, attacher));
        })
        .await;
    serving(&PathBuf::from(&sandbox.endpoints["csi_socket"])).await;
    let client = sandbox.client().await.unwrap();
    let admin = sandbox.admin().unwrap();
    let driver = admin
        .provider_info()
        .await
        .unwrap()
        .volume_offer
        .unwrap()
        .csi_driver;
    let classes: Api<StorageClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "sim"},
                "provisioner": driver,
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // The claim as the PV controller hands it to the external provisioner:
    // annotated with the class's provisioner.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "annotations": {
                    "volume.kubernetes.io/storage-provisioner": driver,
                }},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "sim",
                    "resources": {"requests": {"storage": "2Gi"}},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = format!("pvc-{}", claim.metadata.uid.unwrap());
    let pv = until("the provisioner made no PersistentVolume", || async {
        volumes.get_opt(&pv_name).await.ok().flatten()
    })
    .await;
    let spec = pv.spec.unwrap();
    assert_eq!(spec.claim_ref.unwrap().name.as_deref(), Some("data"));
    let handle = spec.csi.unwrap().volume_handle;
    // The cloud has the volume, of the size asked, in the node's zone.
    let get = |id: String| volume_of(admin.clone(), id);
    let volume = get(handle.clone()).await.unwrap().volume.unwrap();
    assert_eq!(volume.size_bytes, 2 << 30);
    let affinity = serde_json::to_string(&spec.node_affinity).unwrap();
    assert!(affinity.contains(&volume.zone), "{affinity}");

    // As the attach-detach controller does for a Pod on node-0.
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    attachments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": "data-on-node-0"},
                "spec": {
                    "attacher": driver,
                    "nodeName": "node-0",
                    "source": {"persistentVolumeName": pv_name},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let status = until("the attacher did not attach", || async {
        let va = attachments.get("data-on-node-0").await.ok()?;
        va.status.filter(|s| s.attached)
    })
    .await;
    let device = status.attachment_metadata.unwrap()["devicePath"].clone();
    let attached = get(handle.clone())
        .await
        .unwrap()
        .volume
        .unwrap()
        .attachments;
    assert_eq!(attached.len(), 1, "{attached:?}");
    assert_eq!(attached[0].device, device);

    attachments
        .delete("data-on-node-0", &DeleteParams::default())
        .await
        .unwrap();
    until("the attacher did not detach", || async {
        let gone = attachments.get_opt("data-on-node-0").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    let volume = get(handle.clone()).await.unwrap().volume.unwrap();
    assert!(volume.attachments.is_empty(), "{volume:?}");

    // The claim goes; the PV controller marks its volume Released, and the
    // provisioner deletes it from the cloud and the cluster.
    claims
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    volumes
        .patch_status(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Released"}})),
        )
        .await
        .unwrap();
    until("the provisioner did not delete the volume", || async {
        matches!(
            get(handle.clone()).await,
            Err(ccm_proto::Error::NotFound { .. })
        )
        .then_some(())
    })
    .await;
    until("the PersistentVolume stayed", || async {
        volumes
            .get_opt(&pv_name)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    scenario::finish(sandbox, kubelets).await;
}

/// The cluster's part of volumes (the PV and attach-detach controllers,
/// the kubelet's volume manager and its expansions), played every 300 ms
/// as the sandbox plays it, until the task is aborted.
async fn play_volume_roles(
    sandbox: &ccm_sandbox::Sandbox,
) -> (
    ccm_sandbox::volume_roles::VolumeRoles,
    tokio::task::JoinHandle<()>,
) {
    let roles = sandbox.volume_roles().await.unwrap();
    let client = sandbox.client().await.unwrap();
    let playing = tokio::spawn({
        let roles = roles.clone();
        async move {
            loop {
                if let Err(e) = roles.pass(&client).await {
                    eprintln!("volumes: {e:#}");
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    (roles, playing)
}

/// kubectl, as a user runs it, against the sandbox: stdout, trimmed; the
/// test fails with stderr when kubectl does.
async fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl (it is on PATH on a machine set up by .ci/run)");
    let mut input = child.stdin.take().unwrap();
    input
        .write_all(stdin.unwrap_or_default().as_bytes())
        .await
        .unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_claim_goes_the_whole_way_and_back_with_the_real_sidecars() {
    let test = "a_pods_claim_goes_the_whole_way_and_back_with_the_real_sidecars";
    whole_way(test, CloudKind::Sim).await;
}

/// As [`a_pods_claim_goes_the_whole_way_and_back_with_the_real_sidecars`],
/// on AWS: EBS volumes in moto, read back with boto3 (upstream's tags, the
/// attachment under the device the VolumeAttachment names, gone at the
/// end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_claim_goes_the_whole_way_and_back_on_aws_with_the_real_sidecars() {
    let test = "a_pods_claim_goes_the_whole_way_and_back_on_aws_with_the_real_sidecars";
    whole_way(test, CloudKind::Aws).await;
}

/// A Pod's claim provisioned, bound, attached, staged and published on
/// `cloud`, with upstream's provisioner and attacher, then back.
async fn whole_way(test: &str, cloud: CloudKind) {
    use serde_json::json;

    let Some((provisioner, attacher)) = ccm_testkit::csi_sidecars(test) else {
        return;
    };
    // Under the chart's RBAC (volumes on), the sidecars run by the sandbox
    // as by `sandbox --volumes --csi-provisioner … --csi-attacher …`.
    let (sandbox, kubelets, dir) = scenario::start_adjusted(cloud, 1, 0, Default::default(), |o| {
        o.volumes = true;
        o.replicas = 1;
        o.csi_sidecars = Some(ccm_sandbox::CsiSidecars::new(provisioner, attacher));
    })
    .await;
    serving(&PathBuf::from(&sandbox.endpoints["csi_socket"])).await;
    let (roles, playing) = play_volume_roles(&sandbox).await;
    let kubeconfig = sandbox.kubeconfig.clone();
    let k = |args: &'static [&'static str]| kubectl(&kubeconfig, args, None);
    // moto's endpoint, and the first node's name (an instance's private
    // DNS name on AWS).
    let (moto, node) = match &sandbox.aws {
        Some(aws) => (
            Some(aws.moto.endpoint.clone()),
            aws.seeded.instances[0].name.clone(),
        ),
        None => (None, "node-0".to_owned()),
    };
    // On AWS, a StorageClass as upstream's documentation writes one: the
    // node plugin's formatting parameter in upstream's camel case.
    let parameters = match moto {
        Some(_) => "{type: gp3, blockSize: \"4096\"}",
        None => "{}",
    };
    let manifest = format!(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: cloud}}
provisioner: {}
parameters: {parameters}
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cloud
  resources: {{requests: {{storage: 3Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: app, namespace: default}}
spec:
  nodeName: {node}
  containers: [{{name: app, image: registry.k8s.io/pause:3.10}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: data}}}}]
",
        roles.driver
    );
    kubectl(&kubeconfig, &["apply", "-f", "-"], Some(&manifest)).await;
    k(&[
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        "pod/app",
        "--timeout=120s",
    ])
    .await;
    let claim = k(&[
        "get",
        "pvc",
        "data",
        "-o",
        "jsonpath={.status.phase} {.spec.volumeName}",
    ])
    .await;
    let (phase, pv) = claim.split_once(' ').unwrap();
    assert_eq!(phase, "Bound", "{claim}");
    let pv = pv.to_owned();
    let handle = kubectl(
        &kubeconfig,
        &["get", "pv", &pv, "-o", "jsonpath={.spec.csi.volumeHandle}"],
        None,
    )
    .await;

    // The cloud has it, of the size claimed, attached to the node's
    // instance under the device the attachment reports.
    let admin = sandbox.admin().unwrap();
    let get = |id: String| volume_of(admin.clone(), id);
    let volume = get(handle.clone()).await.unwrap().volume.unwrap();
    assert_eq!(volume.size_bytes, 3 << 30);
    assert_eq!(volume.attachments.len(), 1, "{volume:?}");
    let attachment = ccm_sandbox::volume_roles::attachment_name(&handle, &roles.driver, &node);
    let device = kubectl(
        &kubeconfig,
        &[
            "get",
            "volumeattachment",
            &attachment,
            "-o",
            "jsonpath={.status.attachmentMetadata.devicePath}",
        ],
        None,
    )
    .await;
    assert_eq!(volume.attachments[0].device, device);
    let provider_id = kubectl(
        &kubeconfig,
        &["get", "node", &node, "-o", "jsonpath={.spec.providerID}"],
        None,
    )
    .await;
    assert!(
        provider_id.ends_with(&volume.attachments[0].instance_id),
        "{provider_id} is not {:?}",
        volume.attachments[0]
    );
    // EC2 itself, as boto3 reads it: upstream's tags, the one attachment.
    if let Some(moto) = &moto {
        // The PV is what upstream's node plugin, run unchanged, reads: its
        // driver, a raw EBS ID, its zone key first in the node affinity,
        // and the formatting parameter under the key it looks up.
        let written = kubectl(
            &kubeconfig,
            &[
                "get",
                "pv",
                &pv,
                "-o",
                "jsonpath={.spec.csi.driver} {.spec.csi.volumeAttributes.blocksize} \
                 {.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].key}",
            ],
            None,
        )
        .await;
        let written: Vec<&str> = written.split_whitespace().collect();
        assert_eq!(
            written,
            ["ebs.csi.aws.com", "4096", "topology.ebs.csi.aws.com/zone"]
        );
        assert!(handle.starts_with("vol-"), "{handle}");
        let ec2 = ebs_volume(moto, &handle).unwrap_or_else(|| panic!("no EBS volume {handle}"));
        assert_eq!(ec2["size"], 3, "{ec2}");
        assert_eq!(ec2["type"], "gp3", "{ec2}");
        assert_eq!(ec2["tags"]["CSIVolumeName"], pv.as_str(), "{ec2}");
        assert_eq!(
            ec2["tags"]["kubernetes.io/created-for/pvc/name"], "data",
            "{ec2}"
        );
        let instance = &volume.attachments[0].instance_id;
        assert_eq!(ec2["attachments"], json!([[instance, device]]), "{ec2}");
    }
    // Staged and published by the node's plugin at the kubelet's paths.
    let uid = k(&["get", "pod", "app", "-o", "jsonpath={.metadata.uid}"]).await;
    let kubelet = dir.path().join("state/kubelet").join(&node);
    let target = kubelet
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~csi")
        .join(&pv)
        .join("mount");
    assert!(target.is_dir(), "{} is not published", target.display());
    // kubectl prints the columns a real API server serves.
    let printed = k(&["get", "pod,pvc,pv,volumeattachments", "--no-headers"]).await;
    let rows: Vec<Vec<&str>> = printed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.iter()
            .any(|r| r.starts_with(&["pod/app", "1/1", "Running"])),
        "{printed}"
    );
    let claim = "persistentvolumeclaim/data";
    let pv_row = format!("persistentvolume/{pv}");
    assert!(
        rows.iter()
            .any(|r| r.starts_with(&[claim, "Bound", &pv, "3Gi", "RWO", "cloud"])),
        "{printed}"
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with(&[&pv_row, "3Gi", "RWO", "Delete", "Bound"])),
        "{printed}"
    );
    assert!(
        rows.iter()
            .any(|r| r.len() > 4 && r[2] == pv && r[4] == "true"),
        "{printed}"
    );

    // The Pod goes: its volume is unpublished, unstaged and detached; the
    // claim stays bound.
    k(&["delete", "pod", "app", "--wait=true"]).await;
    until("the attachment stayed", || async {
        let left = k(&["get", "volumeattachments", "-o", "name"]).await;
        left.is_empty().then_some(())
    })
    .await;
    let volume = get(handle.clone()).await.unwrap().volume.unwrap();
    assert!(volume.attachments.is_empty(), "{volume:?}");
    if let Some(moto) = &moto {
        let ec2 = ebs_volume(moto, &handle).unwrap();
        assert_eq!(ec2["attachments"], json!([]), "{ec2}");
    }
    assert!(!target.exists(), "{} stayed", target.display());
    assert_eq!(
        k(&["get", "pvc", "data", "-o", "jsonpath={.status.phase}"]).await,
        "Bound"
    );

    // The claim goes: its volume goes from the cloud and the cluster.
    k(&["delete", "pvc", "data"]).await;
    until("the cloud volume stayed", || async {
        matches!(
            get(handle.clone()).await,
            Err(ccm_proto::Error::NotFound { .. })
        )
        .then_some(())
    })
    .await;
    until("the PersistentVolume stayed", || async {
        k(&["get", "pv", "-o", "name"])
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    if let Some(moto) = &moto {
        assert_eq!(ebs_volume(moto, &handle), None);
    }
    playing.abort();
    scenario::finish(sandbox, kubelets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_grows_changes_class_and_is_restored_from_a_snapshot_with_the_real_sidecars() {
    let test = "a_claim_grows_changes_class_and_is_restored_from_a_snapshot_with_the_real_sidecars";
    grow_change_and_restore(test, CloudKind::Sim).await;
}

/// As [`a_claim_grows_changes_class_and_is_restored_from_a_snapshot_with_the_real_sidecars`],
/// on AWS: EBS volumes and snapshots in moto, the class's change a type
/// and IOPS, EBS's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_aws_a_claim_grows_changes_class_and_is_restored_from_a_snapshot_with_the_real_sidecars()
{
    let test =
        "on_aws_a_claim_grows_changes_class_and_is_restored_from_a_snapshot_with_the_real_sidecars";
    grow_change_and_restore(test, CloudKind::Aws).await;
}

/// With all four of upstream's sidecars and the snapshot-controller on
/// `cloud`: a claim grows, changes its VolumeAttributesClass, is
/// snapshotted and restored, and everything goes.
async fn grow_change_and_restore(test: &str, cloud: CloudKind) {
    let Some((provisioner, attacher)) = ccm_testkit::csi_sidecars(test) else {
        return;
    };
    let Some((resizer, snapshotter, snapshot_controller)) = ccm_testkit::csi_more_sidecars(test)
    else {
        return;
    };
    // Under the chart's RBAC (volumes on), all four sidecars on the
    // volume controller's socket, and the cluster's snapshot-controller,
    // as `sandbox --volumes --csi-provisioner … --csi-attacher …
    // --csi-resizer … --csi-snapshotter … --snapshot-controller …` runs
    // them.
    let (sandbox, kubelets, _dir) =
        scenario::start_adjusted(cloud, 1, 0, Default::default(), |o| {
            o.volumes = true;
            o.replicas = 1;
            o.csi_sidecars = Some(ccm_sandbox::CsiSidecars {
                resizer: Some(resizer),
                snapshotter: Some(snapshotter),
                snapshot_controller: Some(snapshot_controller),
                ..ccm_sandbox::CsiSidecars::new(provisioner, attacher)
            });
        })
        .await;
    serving(&PathBuf::from(&sandbox.endpoints["csi_socket"])).await;
    let (roles, playing) = play_volume_roles(&sandbox).await;
    let kubeconfig = sandbox.kubeconfig.clone();
    let k = |args: Vec<String>| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&kubeconfig, &args, None).await
        }
    };
    let args = |text: &str| text.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let apply = |manifest: String| {
        let kubeconfig = kubeconfig.clone();
        async move { kubectl(&kubeconfig, &["apply", "-f", "-"], Some(&manifest)).await }
    };
    // The claim `data` patched (its size, its class), as a user would.
    let patch_claim = |patch: &str| {
        k(["patch", "pvc", "data", "-p", patch]
            .map(str::to_owned)
            .to_vec())
    };
    // A VolumeAttributesClass of the driver's.
    let attributes_class = |name: &str, parameters: &str| {
        format!(
            "apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata: {{name: {name}}}
driverName: {}
parameters: {parameters}
",
            roles.driver
        )
    };
    // The first node (an instance's private DNS name on AWS), and a change
    // of class the cloud makes in place: its type (EBS: with IOPS).
    let (node, class, changed) = match &sandbox.aws {
        Some(aws) => (
            aws.seeded.instances[0].name.clone(),
            "{type: io2, iops: \"6000\"}",
            "io2",
        ),
        None => ("node-0".to_owned(), "{type: fast}", "fast"),
    };
    let pod = |name: &str, claim: &str| {
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  nodeName: {node}
  containers: [{{name: app, image: registry.k8s.io/pause:3.10}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]
"
        )
    };
    apply(format!(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: cloud}}
provisioner: {driver}
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {{name: cloud}}
driver: {driver}
deletionPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cloud
  resources: {{requests: {{storage: 3Gi}}}}
---
{}",
        pod("app", "data"),
        driver = roles.driver
    ))
    .await;
    k(args(
        "wait --for=jsonpath={.status.phase}=Running pod/app --timeout=120s",
    ))
    .await;
    let pv = k(args("get pvc data -o jsonpath={.spec.volumeName}")).await;
    let handle = k(vec![
        "get".into(),
        "pv".into(),
        pv.clone(),
        "-o".into(),
        "jsonpath={.spec.csi.volumeHandle}".into(),
    ])
    .await;
    let admin = sandbox.admin().unwrap();
    let get = |id: String| volume_of(admin.clone(), id);
    assert_eq!(
        get(handle.clone())
            .await
            .unwrap()
            .volume
            .unwrap()
            .size_bytes,
        3 << 30
    );

    // The claim asks for more: the resizer grows the cloud volume and the
    // volume, the node's plugin the filesystem (the kubelet's part), and
    // the claim reads its new capacity.
    patch_claim(r#"{"spec":{"resources":{"requests":{"storage":"5Gi"}}}}"#).await;
    k(args(
        "wait --for=jsonpath={.status.capacity.storage}=5Gi pvc/data --timeout=120s",
    ))
    .await;
    assert_eq!(
        get(handle.clone())
            .await
            .unwrap()
            .volume
            .unwrap()
            .size_bytes,
        5 << 30
    );
    assert_eq!(
        k(vec![
            "get".into(),
            "pv".into(),
            pv.clone(),
            "-o".into(),
            "jsonpath={.spec.capacity.storage}".into(),
        ])
        .await,
        "5Gi"
    );
    let conditions = k(args("get pvc data -o jsonpath={.status.conditions}")).await;
    assert!(!conditions.contains("Resiz"), "{conditions}");

    // The claim names a VolumeAttributesClass: the resizer's modify
    // controller changes the cloud volume's type in place.
    apply(attributes_class("fast", class)).await;
    patch_claim(r#"{"spec":{"volumeAttributesClassName":"fast"}}"#).await;
    k(args(
        "wait --for=jsonpath={.status.currentVolumeAttributesClassName}=fast pvc/data --timeout=120s",
    ))
    .await;
    let volume = get(handle.clone()).await.unwrap().volume.unwrap();
    assert_eq!(volume.attributes["type"], changed, "{volume:?}");
    assert_eq!(volume.size_bytes, 5 << 30);
    // EC2 itself, as boto3 reads it.
    let moto = sandbox.aws.as_ref().map(|aws| aws.moto.endpoint.clone());
    if let Some(moto) = &moto {
        let ec2 = ebs_volume(moto, &handle).unwrap();
        assert_eq!(
            (&ec2["size"], &ec2["type"], &ec2["iops"]),
            (&5.into(), &"io2".into(), &6000.into()),
            "{ec2}"
        );
    }

    // A VolumeSnapshot of it: the snapshot-controller makes its content,
    // the snapshotter the cloud's snapshot.
    apply(
        "apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: backup, namespace: default}
spec:
  volumeSnapshotClassName: cloud
  source: {persistentVolumeClaimName: data}
"
        .to_owned(),
    )
    .await;
    k(args(
        "wait --for=jsonpath={.status.readyToUse}=true volumesnapshot/backup --timeout=120s",
    ))
    .await;
    let content = k(args(
        "get volumesnapshot backup -o jsonpath={.status.boundVolumeSnapshotContentName}",
    ))
    .await;
    let snapshot_id = k(vec![
        "get".into(),
        "volumesnapshotcontent".into(),
        content.clone(),
        "-o".into(),
        "jsonpath={.status.snapshotHandle}".into(),
    ])
    .await;
    let snapshots = |id: String| {
        let admin = admin.clone();
        async move {
            admin
                .list_snapshots(ccm_proto::v1::ListSnapshotsRequest {
                    snapshot_id: id,
                    ..Default::default()
                })
                .await
                .unwrap()
                .snapshots
        }
    };
    let taken = snapshots(snapshot_id.clone()).await;
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].source_volume_id, handle);
    assert_eq!(taken[0].size_bytes, 5 << 30);

    // A claim restored from it, used by a second Pod: the provisioner
    // makes its cloud volume from the snapshot.
    apply(format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: restored, namespace: default}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cloud
  resources: {{requests: {{storage: 5Gi}}}}
  dataSource: {{apiGroup: snapshot.storage.k8s.io, kind: VolumeSnapshot, name: backup}}
---
{}",
        pod("restore", "restored")
    ))
    .await;
    k(args(
        "wait --for=jsonpath={.status.phase}=Running pod/restore --timeout=120s",
    ))
    .await;
    let restored_pv = k(args("get pvc restored -o jsonpath={.spec.volumeName}")).await;
    let restored = k(vec![
        "get".into(),
        "pv".into(),
        restored_pv,
        "-o".into(),
        "jsonpath={.spec.csi.volumeHandle}".into(),
    ])
    .await;
    let volume = get(restored.clone()).await.unwrap().volume.unwrap();
    assert_eq!(volume.source_snapshot_id, snapshot_id, "{volume:?}");
    if let Some(moto) = &moto {
        let ec2 = ebs_volume(moto, &restored).unwrap();
        assert_eq!(ec2["snapshot"], snapshot_id.as_str(), "{ec2}");
    }
    assert_eq!(volume.size_bytes, 5 << 30);
    assert_eq!(volume.attachments.len(), 1, "{volume:?}");

    // On AWS, size and class edited at once: the resizer's two
    // controllers ask each on its own, and EBS, which makes one
    // modification of a volume at a time, gets one ModifyVolume for both.
    if let Some(moto) = &moto {
        let before = ccm_testkit::ebs_modifications(moto, &handle);
        apply(attributes_class("faster", "{type: io2, iops: \"7000\"}")).await;
        patch_claim(
            r#"{"spec":{"resources":{"requests":{"storage":"8Gi"}},"volumeAttributesClassName":"faster"}}"#,
        )
        .await;
        k(args(
            "wait --for=jsonpath={.status.currentVolumeAttributesClassName}=faster pvc/data --timeout=120s",
        ))
        .await;
        k(args(
            "wait --for=jsonpath={.status.capacity.storage}=8Gi pvc/data --timeout=120s",
        ))
        .await;
        let ec2 = ebs_volume(moto, &handle).unwrap();
        assert_eq!(
            (&ec2["size"], &ec2["iops"]),
            (&8.into(), &7000.into()),
            "{ec2}"
        );
        assert_eq!(ccm_testkit::ebs_modifications(moto, &handle), before + 1);
    }

    // The VolumeSnapshot goes: its content and the cloud's snapshot go.
    k(args("delete volumesnapshot backup")).await;
    until("the cloud snapshot stayed", || async {
        snapshots(snapshot_id.clone())
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    until("the VolumeSnapshotContent stayed", || async {
        k(args("get volumesnapshotcontents -o name"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;

    // Pods and claims go: both cloud volumes go.
    k(args("delete pod app restore --wait=true")).await;
    k(args("delete pvc data restored")).await;
    for id in [handle, restored] {
        until("a cloud volume stayed", || async {
            matches!(
                get(id.clone()).await,
                Err(ccm_proto::Error::NotFound { .. })
            )
            .then_some(())
        })
        .await;
        if let Some(moto) = &moto {
            assert_eq!(ebs_volume(moto, &id), None);
        }
    }
    playing.abort();
    // The chart's grants were enough for all four sidecars.
    let report = sandbox.rbac_report().await.unwrap().expect("RBAC is on");
    assert_eq!(
        report["denied"],
        serde_json::json!([]),
        "refused: {report:#}"
    );
    scenario::finish(sandbox, kubelets).await;
}
