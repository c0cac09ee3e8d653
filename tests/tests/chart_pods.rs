//! The chart's pod specs, run: for the default values, a values file that
//! turns on every option, and the AWS provider (against moto), every
//! container starts from exactly the command, args, environment and
//! mounted files the chart renders (see `ccm_testkit::kubelet`), under the
//! chart's RBAC, and becomes ready. A container whose flags its binary
//! refuses fails the test with the container's name.

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
