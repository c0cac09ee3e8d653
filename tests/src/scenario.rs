//! Scenarios on a sandbox driven from a test: the real binaries under the
//! chart's RBAC, simulated kubelets heartbeating in the background while
//! the test deletes, terminates, kills and breaks things.

use std::time::{Duration, Instant};

use ccm_sandbox::{CloudKind, Handle, Options, Progress, Sandbox};

/// How long a scenario waits for what it expects.
pub const LIMIT: Duration = Duration::from_secs(90);

/// A sandbox on the sim with `nodes` and `services`, kubelets running.
pub async fn start(
    nodes: usize,
    services: usize,
) -> (Sandbox, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    start_on(CloudKind::Sim, nodes, services).await
}

/// A sandbox on `cloud`; on AWS its Services get NLBs (the scenarios
/// written for them), see `start_on_aws_with_defaults` for upstream's
/// default.
pub async fn start_on(
    cloud: CloudKind,
    nodes: usize,
    services: usize,
) -> (Sandbox, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    let mut extra_args = std::collections::BTreeMap::new();
    if cloud == CloudKind::Aws {
        extra_args.insert(
            "cloud-gateway".to_owned(),
            vec!["--aws-default-load-balancer-type=nlb".to_owned()],
        );
    }
    start_with(cloud, nodes, services, extra_args).await
}

/// [`start_on`] with more flags per binary.
pub async fn start_with(
    cloud: CloudKind,
    nodes: usize,
    services: usize,
    extra_args: std::collections::BTreeMap<String, Vec<String>>,
) -> (Sandbox, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    start_adjusted(cloud, nodes, services, extra_args, |_| {}).await
}

/// [`start_with`], with the sandbox's options adjusted by `adjust`.
pub async fn start_adjusted(
    cloud: CloudKind,
    nodes: usize,
    services: usize,
    extra_args: std::collections::BTreeMap<String, Vec<String>>,
    adjust: impl FnOnce(&mut Options),
) -> (Sandbox, tokio::task::JoinHandle<()>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = crate::bin_dir();
    // Every scenario runs under the chart's RBAC: each process has its
    // ServiceAccount's identity and may do only what the chart grants.
    let policy = dir.path().join("chart.yaml");
    let mut options = Options {
        cloud,
        nodes,
        services,
        replicas: 2,
        rbac: Some(policy.clone()),
        extra_args,
        ..Options::new(dir.path().join("state"), bin_dir)
    };
    adjust(&mut options);
    // The sandbox's kubelets ask for serving certificates.
    // An operator bound to the viewer roles runs kubectl ccm.
    // Rendered for the sim on every cloud: the grants are the same on
    // AWS, where the chart leaves out the route controller the sandbox
    // runs. With a real Cluster Autoscaler, as the README installs it.
    let mut sets = vec![
        "gateway.provider=sim",
        "nodeController.approveKubeletServingCSRs=true",
        "viewer.subjects=[{kind: User, name: operator}]",
    ];
    if options.cluster_autoscaler.is_some() {
        sets.push("autoscaler.enabled=true");
    }
    if options.volumes {
        sets.push("volumes.enabled=true");
    }
    crate::chart::render_to(&policy, &sets).unwrap();
    let sandbox = Sandbox::start(options).await.unwrap();
    sandbox.populate().await.unwrap();
    let handle = sandbox.handle();
    let kubelets = tokio::spawn(async move {
        loop {
            let _ = handle.heartbeat().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    (sandbox, kubelets, dir)
}

/// Stops the sandbox, failing the scenario if RBAC refused anything.
pub async fn finish(sandbox: Sandbox, kubelets: tokio::task::JoinHandle<()>) {
    kubelets.abort();
    let report = sandbox.rbac_report().await.unwrap().expect("RBAC is on");
    sandbox.stop().await;
    assert_eq!(
        report["denied"],
        serde_json::json!([]),
        "requests the chart's RBAC refused"
    );
}

/// Waits until `check` holds of the sandbox's progress, failing the
/// scenario after [`LIMIT`].
pub async fn until(handle: &Handle, what: &str, check: impl Fn(&Progress) -> bool) -> Progress {
    let start = Instant::now();
    loop {
        if let Ok(p) = handle.progress().await {
            if check(&p) {
                return p;
            }
            assert!(start.elapsed() < LIMIT, "{what}: stuck at {p}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
