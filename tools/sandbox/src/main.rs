//! `sandbox`: the whole system on loopback, as separate processes, on the
//! simulated cloud, on AWS emulated by moto, or with the toy gateway in
//! Python in place of ours. Ctrl-C stops it.

use std::path::PathBuf;
use std::time::Duration;

use ccm_runtime::config_checks::number_within;
use ccm_sandbox::{CloudKind, CsiSidecars, Options, Sandbox};
use clap::Parser;

/// Runs the cloud controller manager locally: API server, gateway on the
/// simulated cloud, and every controller, with simulated kubelets.
#[derive(Parser)]
#[command(name = "sandbox", version = ccm_runtime::version::LONG)]
struct Args {
    /// The cloud: sim (the simulated cloud), aws (the AWS provider against
    /// moto, an AWS API emulator from PyPI, started on loopback) or toy (no
    /// cloud-gateway: tests/toy-gateway, a second implementation of the
    /// contract in Python).
    #[arg(long = "provider", value_enum, default_value = "sim")]
    cloud: CloudKind,
    /// Where state, logs, the kubeconfig and endpoints.json go (cleared at start).
    #[arg(long, default_value = ".sandbox")]
    state_dir: PathBuf,
    /// Nodes (sim instances with simulated kubelets).
    #[arg(long, default_value_t = 3, value_parser = number_within(0usize, 10_000))]
    nodes: usize,
    /// LoadBalancer Services to create.
    #[arg(long, default_value_t = 1, value_parser = number_within(0usize, 10_000))]
    services: usize,
    /// Replicas of each controller (leader election decides who works).
    #[arg(long, default_value_t = 2, value_parser = number_within(1usize, 10))]
    replicas: usize,
    /// Exit 0 once everything converged (for tests), 1 if not within 2 minutes.
    #[arg(long)]
    exit_when_ready: bool,
    /// Enforce the RBAC of these manifests, e.g. the chart rendered by
    /// `python3 helm/check.py render`; refusals show in the API server's log
    /// and at GET /debug/rbac.
    #[arg(long)]
    rbac: Option<PathBuf>,
    /// The cluster's name, as each controller's --cluster-name (upstream's
    /// ClusterID; with --provider aws the seeded resources carry its tag).
    #[arg(long, default_value = ccm_sandbox::CLUSTER, value_parser = cluster_name)]
    cluster_name: String,
    /// With --provider aws: tag the seeded resources only with the legacy
    /// KubernetesCluster=<name> tag, as clusters older than Kubernetes 1.6.
    #[arg(long)]
    legacy_cluster_tag: bool,
    /// Also run this cluster-autoscaler binary (built with its externalgrpc
    /// provider, e.g. ../shared/bin/cluster-autoscaler-v1.30.0) against the
    /// API server and the gateway, with the cloud-config the chart writes
    /// and a node group to scale (on the sim `workers`, from 0 to 5, its
    /// nodes labelled pool=workers); its log is cluster-autoscaler.log.
    #[arg(long, env = ccm_sandbox::autoscaler::ENV)]
    cluster_autoscaler: Option<PathBuf>,
    /// Also run the volume controller (CSI's controller half, its socket
    /// csi_socket in endpoints.json) and a simulated CSI node plugin beside
    /// each sim node's kubelet (the first one's csi_node_socket).
    #[arg(long)]
    volumes: bool,
    /// The sim's zones, comma-separated (the gateway's --sim-zones; three
    /// by default). One zone suits csi-sanity, which asks for volumes
    /// without a zone and publishes them to one node.
    #[arg(long)]
    sim_zones: Option<String>,
    /// With --volumes: also run upstream's external-provisioner (e.g.
    /// ../shared/bin/csi-provisioner-v6.3.0-56) beside the volume
    /// controller; with --csi-attacher, the sandbox plays the rest of the
    /// cluster's part (claims bound, Pods' volumes attached, staged and
    /// published on the node a Pod names), so a Pod's claim goes the whole
    /// way.
    #[arg(long, requires_all = ["volumes", "csi_attacher"])]
    csi_provisioner: Option<PathBuf>,
    /// With --csi-provisioner: upstream's external-attacher (e.g.
    /// ../shared/bin/csi-attacher-v4.12.0-39).
    #[arg(long, requires_all = ["volumes", "csi_provisioner"])]
    csi_attacher: Option<PathBuf>,
    /// With --csi-provisioner: also upstream's external-resizer (built
    /// from kubernetes-csi/external-resizer, see the README): a claim that
    /// asks for more grows its cloud volume, and its filesystem on the node
    /// of a Pod that uses it.
    #[arg(long, requires = "csi_provisioner")]
    csi_resizer: Option<PathBuf>,
    /// With --csi-provisioner: also external-snapshotter's csi-snapshotter
    /// sidecar; with --snapshot-controller, VolumeSnapshots become cloud
    /// snapshots, and claims can be restored from them.
    #[arg(long, requires_all = ["csi_provisioner", "snapshot_controller"])]
    csi_snapshotter: Option<PathBuf>,
    /// With --csi-snapshotter: external-snapshotter's snapshot-controller,
    /// the cluster's part of snapshots (run as the admin).
    #[arg(long, requires = "csi_snapshotter")]
    snapshot_controller: Option<PathBuf>,
}

fn cluster_name(value: &str) -> Result<String, String> {
    if ccm_runtime::names::is_cluster_name(value) {
        Ok(value.to_owned())
    } else {
        Err(ccm_runtime::names::CLUSTER_NAME_RULE.to_owned())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ccm_runtime::telemetry::init(&ccm_runtime::telemetry::Options {
        directives: "warn".into(),
        ..Default::default()
    });
    let bin_dir = std::env::current_exe()?
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default();
    let options = Options {
        cloud: args.cloud,
        state_dir: args.state_dir,
        nodes: args.nodes,
        services: args.services,
        replicas: args.replicas,
        bin_dir,
        components_dir: None,
        rbac: args.rbac.map(|p| p.canonicalize()).transpose()?,
        extra_args: args
            .sim_zones
            .iter()
            .map(|zones| {
                let flags = vec!["--sim-zones".to_owned(), zones.clone()];
                ("cloud-gateway".to_owned(), flags)
            })
            .collect(),
        cluster: args.cluster_name,
        legacy_cluster_tag: args.legacy_cluster_tag,
        gateway_in_clear: false,
        cluster_autoscaler: args.cluster_autoscaler,
        volumes: args.volumes,
        csi_sidecars: args
            .csi_provisioner
            .clone()
            .zip(args.csi_attacher.clone())
            .map(|(provisioner, attacher)| CsiSidecars {
                resizer: args.csi_resizer.clone(),
                snapshotter: args.csi_snapshotter.clone(),
                snapshot_controller: args.snapshot_controller.clone(),
                ..CsiSidecars::new(provisioner, attacher)
            }),
    };
    let sandbox = Sandbox::start(options.clone()).await?;
    println!(
        "sandbox starting in {}",
        sandbox.options.state_dir.display()
    );
    sandbox.populate().await?;
    // The cluster's part of volumes, where the sidecars run.
    let volume_roles = match &options.csi_sidecars {
        Some(_) => Some((sandbox.volume_roles().await?, sandbox.client().await?)),
        None => None,
    };
    let shutdown = ccm_runtime::shutdown::on_signals()?;
    let started = std::time::Instant::now();
    let mut last = String::new();
    let mut announced = false;
    loop {
        let _ = sandbox.heartbeat().await;
        if let Some((roles, client)) = &volume_roles
            && let Err(e) = roles.pass(client).await
        {
            eprintln!("volumes: {e:#}");
        }
        if let Ok(progress) = sandbox.progress().await {
            let line = progress.to_string();
            if line != last {
                println!("{line}");
                last = line;
            }
            if progress.converged(&sandbox.options) && !announced {
                announced = true;
                println!(
                    "\nready. Try:\n  kubectl --kubeconfig {} get nodes,svc -o wide",
                    sandbox.kubeconfig.display()
                );
                println!(
                    "endpoints: {}",
                    sandbox.options.state_dir.join("endpoints.json").display()
                );
                if args.exit_when_ready {
                    break;
                }
                println!("Ctrl-C stops everything.");
            }
        }
        if args.exit_when_ready && started.elapsed() > Duration::from_secs(120) {
            sandbox.stop().await;
            anyhow::bail!("the sandbox did not converge within 2 minutes: {last}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    println!("stopping");
    sandbox.stop().await;
    Ok(())
}
