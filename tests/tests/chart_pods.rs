//! The chart's pod specs, run: for the default values, a values file that
//! turns on every option (volumes too), and the AWS provider (against
//! moto), every container of ours starts from exactly the command, args,
//! environment and mounted files the chart renders (see
//! `ccm_testkit::kubelet`), under the chart's RBAC, and becomes ready; so
//! do upstream's CSI sidecars beside the volume controller, where builds
//! of them are at hand. A container whose flags its binary refuses fails
//! the test with the container's name.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ccm_testkit::kubelet::{self, Node};
use kube_test_apiserver::ApiServer;
use serde_json::Value;

/// The simulated cloud, and ports free on this machine (see [`ports`]).
fn on_the_sim() -> Vec<String> {
    let mut sets = ports();
    sets.push("gateway.provider=sim".into());
    sets
}

/// Ports for every component, free on this machine (the chart's own would
/// collide with other tests).
fn ports() -> Vec<String> {
    [
        "gateway.grpcPort",
        "gateway.adminPort",
        "nodeController.adminPort",
        "serviceController.adminPort",
        "routeController.adminPort",
        "nodeController.diagnosticsPort",
        "serviceController.diagnosticsPort",
        "routeController.diagnosticsPort",
        "volumes.adminPort",
    ]
    .iter()
    .map(|key| format!("{key}={}", ccm_sandbox::ports::free_port().unwrap()))
    .collect()
}

/// Runs every Deployment's container once and waits for each to be ready,
/// the gateway first; then checks what the API server saw.
async fn run(objects: Vec<Value>, secrets: BTreeMap<String, BTreeMap<String, String>>) {
    let controllers = objects
        .iter()
        .filter(|o| {
            o["kind"] == "Deployment"
                && !o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .ends_with("-gateway")
        })
        .count() as u64;
    let api = start_all(&objects, secrets).await.unwrap();
    // Every controller's gateway token was checked with TokenReview, and
    // the chart's RBAC refused nothing any process asked for.
    assert!(controllers >= 2, "{controllers} controllers");
    assert!(
        api.token_reviews() >= controllers,
        "{} token reviews for {controllers} controllers",
        api.token_reviews()
    );
    let report = api.rbac_report().unwrap();
    assert_eq!(
        report["denied"],
        serde_json::json!([]),
        "RBAC refused: {report}"
    );
}

async fn start_all(
    objects: &[Value],
    secrets: BTreeMap<String, BTreeMap<String, String>>,
) -> anyhow::Result<ApiServer> {
    let api = ApiServer::start().await?;
    api.enforce_rbac(objects);
    let dir = tempfile::tempdir()?;
    let node = Node {
        api: &api,
        objects,
        bin_dir: ccm_testkit::bin_dir(),
        root: dir.path().to_path_buf(),
        secrets,
    };
    let mut deployments = kubelet::deployments(objects);
    deployments.sort_by_key(|d| d["metadata"]["name"] != "ccm-gateway");
    let mut running = Vec::new();
    for deployment in deployments {
        let pod = format!(
            "{}-0",
            deployment["metadata"]["name"].as_str().unwrap_or_default()
        );
        let mut container = node.start(deployment, 0, &pod).await?;
        node.ready(deployment, 0, &mut container, Duration::from_secs(60))
            .await?;
        running.push(container);
    }
    drop(running);
    Ok(api)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_pods_run_and_become_ready() {
    let objects = ccm_testkit::chart::render_objects(&[], &on_the_sim()).unwrap();
    run(objects, BTreeMap::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_with_every_option_run_and_become_ready() {
    let values = Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/every-option.yaml");
    let objects = ccm_testkit::chart::render_objects(&[&values], &ports()).unwrap();
    // The options reach the containers.
    let gateway = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "ccm-gateway")
        .unwrap();
    assert_eq!(gateway["spec"]["template"]["spec"]["hostNetwork"], true);
    // The CA of client certificates (mutual TLS), a Secret the operator
    // keeps.
    let dir = tempfile::tempdir().unwrap();
    let clients = ccm_sandbox::pki::Pki::create(dir.path(), "client CA").unwrap();
    let secrets = BTreeMap::from([(
        "ccm-client-ca".to_owned(),
        BTreeMap::from([(
            "ca.crt".to_owned(),
            std::fs::read_to_string(clients.ca_file()).unwrap(),
        )]),
    )]);
    run(objects, secrets).await;
}

/// Cluster Autoscaler as the README installs it: a client with none of our
/// code (`tests/tools/autoscaler_client.py`) reads the cloud-config Secret
/// the chart renders, with the chart's client certificate mounted where
/// that cloud-config says, and calls the chart's gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_calls_the_charts_gateway_with_the_charts_certificate_and_cloud_config()
{
    let mounts = tempfile::tempdir().unwrap();
    let cert_dir = mounts.path().join("tls");
    std::fs::create_dir(&cert_dir).unwrap();
    let mut sets = on_the_sim();
    let grpc_port = sets
        .iter()
        .find_map(|s| s.strip_prefix("gateway.grpcPort="))
        .unwrap()
        .to_owned();
    sets.push("autoscaler.enabled=true".into());
    sets.push(format!("autoscaler.certDir={}", cert_dir.display()));
    let objects = ccm_testkit::chart::render_objects(&[], &sets).unwrap();
    // The two Secrets, as the autoscaler's pod mounts them.
    let secret = |name: &str| -> BTreeMap<String, String> {
        let found = objects
            .iter()
            .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no Secret {name}"));
        serde_json::from_value(found["stringData"].clone()).unwrap()
    };
    for (file, text) in secret("ccm-autoscaler-tls") {
        std::fs::write(cert_dir.join(file), text).unwrap();
    }
    let config = mounts.path().join("cloud-config");
    std::fs::write(
        &config,
        &secret("ccm-autoscaler-cloud-config")["cloud-config"],
    )
    .unwrap();

    let api = ApiServer::start().await.unwrap();
    api.enforce_rbac(&objects);
    let dir = tempfile::tempdir().unwrap();
    let node = Node {
        api: &api,
        objects: &objects,
        bin_dir: ccm_testkit::bin_dir(),
        root: dir.path().to_path_buf(),
        secrets: BTreeMap::new(),
    };
    let gateway = kubelet::deployments(&objects)
        .into_iter()
        .find(|d| d["metadata"]["name"] == "ccm-gateway")
        .unwrap();
    let mut running = node.start(gateway, 0, "ccm-gateway-0").await.unwrap();
    node.ready(gateway, 0, &mut running, Duration::from_secs(60))
        .await
        .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/autoscaler_client.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .arg(&config)
        .args([
            r#"{"rpc": "Refresh"}"#,
            r#"{"rpc": "NodeGroups"}"#,
            r#"{"rpc": "GPULabel"}"#,
        ])
        .env("AUTOSCALER_CONNECT_TO", format!("127.0.0.1:{grpc_port}"))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the autoscaler client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 3, "{answers:?}");
    for answer in &answers {
        assert!(answer.get("ok").is_some(), "refused: {answer}");
    }
    assert_eq!(
        answers[2]["ok"]["label"], "sim.cloudgateway.io/accelerator",
        "{answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aws_pods_run_with_credentials_from_a_secret_and_become_ready() {
    // No route controller: the chart leaves it off on AWS.
    let dir = tempfile::tempdir().unwrap();
    let moto = ccm_sandbox::aws::Moto::start(&dir.path().join("moto"))
        .await
        .unwrap();
    let seeded = ccm_sandbox::aws::seed(&moto.ec2(), "kubernetes", 1)
        .await
        .unwrap();
    let mut sets = ports();
    sets.extend([
        "gateway.provider=aws".into(),
        "gateway.replicas=2".into(),
        "gateway.aws.region=eu-west-1".into(),
        format!("gateway.aws.endpointURL={}", moto.endpoint),
        format!("gateway.aws.vpcID={}", seeded.vpc),
        "gateway.credentials.existingSecret=aws-keys".into(),
    ]);
    let objects = ccm_testkit::chart::render_objects(&[], &sets).unwrap();
    let secret = ccm_sandbox::aws::secret_access_key();
    let credentials = format!(
        "[default]\naws_access_key_id = {}\naws_secret_access_key = {secret}\n",
        ccm_sandbox::aws::ACCESS_KEY_ID
    );
    let secrets = BTreeMap::from([(
        "aws-keys".to_owned(),
        BTreeMap::from([("credentials".to_owned(), credentials)]),
    )]);
    run(objects, secrets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_whose_flags_its_binary_refuses_is_named() {
    let mut sets = on_the_sim();
    sets.push("nodeController.extraArgs=[--concurrent-node-syncs=0]".into());
    let objects = ccm_testkit::chart::render_objects(&[], &sets).unwrap();
    let err = start_all(&objects, BTreeMap::new())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("ccm-node-controller/node-controller"), "{err}");
    assert!(err.contains("concurrent-node-syncs"), "{err}");
}

/// The real external-provisioner and external-attacher (builds of their
/// images' binaries, `ccm_testkit::csi_sidecars`) run as containers of the
/// chart's volume-controller pod, with the args it renders, beside the
/// volume controller on the pod's socket and under the chart's RBAC: each
/// leads by the Lease the chart lets it update, and the provisioner makes
/// the volume of a claim of the chart's StorageClass (placed as the claim's
/// node says). The API server refuses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_sidecars_run_in_the_charts_volume_pod_under_its_rbac() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{Node as KubeNode, PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
    use kube::api::{Api, PostParams};
    use serde_json::json;

    let test = "the_real_sidecars_run_in_the_charts_volume_pod_under_its_rbac";
    let Some((provisioner, attacher)) = ccm_testkit::csi_sidecars(test) else {
        return;
    };
    let mut sets = on_the_sim();
    sets.push("volumes.enabled=true".into());
    let objects = ccm_testkit::chart::render_objects(&[], &sets).unwrap();
    let rendered = |kind: &str| -> Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} rendered"))
            .clone()
    };
    let driver = rendered("CSIDriver")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let api = ApiServer::start().await.unwrap();
    api.enforce_rbac(&objects);
    // What the install creates beside the pods.
    let client = api.client().await.unwrap();
    let post = PostParams::default();
    Api::<CSIDriver>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(rendered("CSIDriver")).unwrap(),
        )
        .await
        .unwrap();
    Api::<StorageClass>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(rendered("StorageClass")).unwrap(),
        )
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let node = Node {
        api: &api,
        objects: &objects,
        bin_dir: ccm_testkit::bin_dir(),
        root: dir.path().to_path_buf(),
        secrets: BTreeMap::new(),
    };
    let deployment = |name: &str| {
        *kubelet::deployments(&objects)
            .iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap()
    };
    let (gateway, volumes) = (
        deployment("ccm-gateway"),
        deployment("ccm-volume-controller"),
    );
    let mut running = vec![node.start(gateway, 0, "ccm-gateway-0").await.unwrap()];
    node.ready(gateway, 0, &mut running[0], Duration::from_secs(60))
        .await
        .unwrap();
    let pod = "ccm-volume-controller-0";
    running.push(node.start(volumes, 0, pod).await.unwrap());
    node.ready(volumes, 0, &mut running[1], Duration::from_secs(60))
        .await
        .unwrap();
    let names = |i: usize| volumes["spec"]["template"]["spec"]["containers"][i]["name"].clone();
    assert_eq!(
        (names(1), names(2)),
        (json!("csi-provisioner"), json!("csi-attacher"))
    );
    running.push(
        node.start_upstream(volumes, 1, pod, &provisioner)
            .await
            .unwrap(),
    );
    running.push(
        node.start_upstream(volumes, 2, pod, &attacher)
            .await
            .unwrap(),
    );

    // Each leads by its own Lease, in the release's namespace.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let sanitized = driver.replace('.', "-");
    for lease in [
        sanitized.clone(),
        format!("external-attacher-leader-{sanitized}"),
    ] {
        until(
            &running,
            &format!("no holder of the Lease {lease}"),
            || async {
                let held = leases.get_opt(&lease).await.ok().flatten()?;
                held.spec?.holder_identity.filter(|h| !h.is_empty())
            },
        )
        .await;
    }

    // A claim of the chart's class, for a Pod scheduled to a node in
    // sim-zone-b: the node as the kubelet registers the node plugin (its
    // CSINode entry and topology label), the claim as the scheduler and
    // the PV controller annotate it.
    let zone_key = "topology.sim.cloudgateway.io/zone";
    Api::<KubeNode>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-0", "labels": {zone_key: "sim-zone-b"}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<CSINode>::all(client.clone())
        .create(
            &post,
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                "metadata": {"name": "node-0"},
                "spec": {"drivers": [{
                    "name": driver, "nodeID": "i-0123456789abcdef0", "topologyKeys": [zone_key],
                }]},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let class = rendered("StorageClass")["metadata"]["name"].clone();
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(
            &post,
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "annotations": {
                    "volume.kubernetes.io/storage-provisioner": driver,
                    "volume.kubernetes.io/selected-node": "node-0",
                }},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": "2Gi"}},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pv_name = format!("pvc-{}", claim.metadata.uid.unwrap());
    let volumes_api: Api<PersistentVolume> = Api::all(client.clone());
    let pv = until(
        &running,
        "the provisioner made no PersistentVolume",
        || async { volumes_api.get_opt(&pv_name).await.ok().flatten() },
    )
    .await;
    let pv = serde_json::to_value(pv).unwrap();
    assert_eq!(pv["spec"]["csi"]["driver"], driver.as_str(), "{pv}");
    assert_eq!(pv["spec"]["csi"]["fsType"], "ext4", "{pv}");
    assert_eq!(pv["spec"]["storageClassName"], class, "{pv}");
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0],
        json!({"key": zone_key, "operator": "In", "values": ["sim-zone-b"]}),
        "{pv}"
    );

    let report = api.rbac_report().unwrap();
    assert_eq!(
        report["denied"],
        json!([]),
        "RBAC refused: {report}\n{}",
        logs(&running)
    );
    drop(running);
}

/// The end of every container's log.
fn logs(running: &[kubelet::Container]) -> String {
    running
        .iter()
        .map(|c| format!("--- {}\n{}", c.name, c.log_tail(30)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `check` answers, failing with the containers' logs after a
/// minute.
async fn until<T, F: std::future::Future<Output = Option<T>>>(
    running: &[kubelet::Container],
    what: &str,
    check: impl Fn() -> F,
) -> T {
    let started = std::time::Instant::now();
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what} within a minute\n{}",
            logs(running)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
