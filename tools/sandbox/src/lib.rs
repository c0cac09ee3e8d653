//! The local sandbox: the whole system as separate processes on loopback
//! (the Kubernetes API test server, the gateway on the simulated cloud, and
//! each controller with its replicas), with simulated kubelets that
//! register a Node per sim instance and keep it Ready while the instance
//! runs. The README's run command starts it; end-to-end tests drive it.
//!
//! Beside it, what starts the parts it runs and that tests and the
//! benchmarks start on their own too: a gateway process ([`gateway`]), the
//! toy gateway in Python ([`toy`]), moto for AWS ([`aws`]), and a GET on
//! their admin endpoints ([`admin`]).

pub mod admin;
pub mod autoscaler;
pub mod aws;
pub mod csi_node;
pub mod gateway;
pub mod pki;
pub mod ports;
pub mod toy;
pub mod volume_roles;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use ccm_proto::v1::{CreateInstanceRequest, InstanceState, ListInstancesRequest};
use ccm_proto::{ClientConfig, GatewayClient, TokenSource};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::aws::{Moto, Seeded};
use crate::ports::free_port;
use kube_test_apiserver::fixtures::{self, node};
use kube_test_apiserver::{TokenEntry, TokenUser};

/// The cloud the sandbox runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CloudKind {
    /// The simulated cloud inside the gateway.
    #[default]
    Sim,
    /// AWS, emulated by moto on loopback: the gateway's AWS provider, its
    /// SDK and credential chain, against EC2's API.
    Aws,
    /// Not our gateway at all: the toy gateway in Python
    /// (tests/toy-gateway), a second implementation of the contract with
    /// its own in-memory cloud, which the controllers use unchanged.
    Toy,
}

/// The cluster name the sandbox's controllers use (the controllers'
/// default).
pub const CLUSTER: &str = "kubernetes";

/// What to start.
#[derive(Clone, Debug)]
pub struct Options {
    /// The cloud behind the gateway.
    pub cloud: CloudKind,
    pub state_dir: PathBuf,
    pub nodes: usize,
    pub services: usize,
    pub replicas: usize,
    /// Where the binaries are (the directory of the running executable).
    pub bin_dir: PathBuf,
    /// Where the components' binaries (the gateway and the controllers)
    /// come from, if not `bin_dir`: another release's, for the version
    /// skew run, which then [`Sandbox::replace`]s them one at a time.
    pub components_dir: Option<PathBuf>,
    /// Manifests whose RBAC the API server enforces (the chart, rendered
    /// with release `ccm` in `kube-system`); without it every identity may
    /// do anything.
    pub rbac: Option<PathBuf>,
    /// More flags per binary (`cloud-gateway`, `node-controller`, ...),
    /// after the sandbox's own, so they win.
    pub extra_args: BTreeMap<String, Vec<String>>,
    /// The cluster's name (upstream's ClusterID), as every controller is
    /// given it and, on AWS, as the seeded resources are tagged.
    pub cluster: String,
    /// On AWS: tag the seeded resources only with the legacy
    /// `KubernetesCluster=<cluster>` tag, as clusters made before
    /// Kubernetes 1.6 are.
    pub legacy_cluster_tag: bool,
    /// Serve the gateway's gRPC in clear on loopback, not over TLS: only
    /// to measure what TLS costs.
    pub gateway_in_clear: bool,
    /// A `cluster-autoscaler` binary (built with the `externalgrpc`
    /// provider) to run against the API server and the gateway, with a
    /// node group to scale (see [`autoscaler`]).
    pub cluster_autoscaler: Option<PathBuf>,
    /// Run the volume controller (its CSI socket is `csi_socket` in
    /// `endpoints.json`) and a simulated CSI node plugin beside each
    /// instance's kubelet, the sim's or moto's (the first one's is
    /// `csi_node_socket`).
    pub volumes: bool,
    /// With `volumes`: upstream's external-provisioner and
    /// external-attacher to run beside the volume controller, on its
    /// socket and with its ServiceAccount, as the chart runs them (see
    /// [`volume_roles`] for the rest of the cluster's part).
    pub csi_sidecars: Option<CsiSidecars>,
}

/// The binaries of upstream's CSI sidecars the sandbox runs.
#[derive(Clone, Debug)]
pub struct CsiSidecars {
    pub provisioner: PathBuf,
    pub attacher: PathBuf,
    /// external-resizer: expands a volume when its claim asks for more
    /// (the kubelet's part, growing the filesystem, is played in
    /// [`volume_roles`]).
    pub resizer: Option<PathBuf>,
    /// external-snapshotter's csi-snapshotter sidecar: takes and deletes
    /// the snapshots of VolumeSnapshotContents.
    pub snapshotter: Option<PathBuf>,
    /// external-snapshotter's snapshot-controller, which the cluster runs
    /// once (not beside the driver): it makes a VolumeSnapshot's content
    /// for the sidecar and binds the two. Run with the admin's kubeconfig,
    /// as its own RBAC is the cluster's, not the chart's.
    pub snapshot_controller: Option<PathBuf>,
}

impl CsiSidecars {
    /// The provisioner and the attacher, nothing else.
    pub fn new(provisioner: PathBuf, attacher: PathBuf) -> Self {
        Self {
            provisioner,
            attacher,
            resizer: None,
            snapshotter: None,
            snapshot_controller: None,
        }
    }
}

impl Options {
    /// One replica of each controller on the sim, with no Nodes, Services,
    /// RBAC or extra flags: set what differs with `..Options::new(..)`.
    pub fn new(state_dir: PathBuf, bin_dir: PathBuf) -> Self {
        Self {
            cloud: CloudKind::Sim,
            state_dir,
            nodes: 0,
            services: 0,
            replicas: 1,
            bin_dir,
            components_dir: None,
            rbac: None,
            extra_args: BTreeMap::new(),
            cluster: CLUSTER.to_owned(),
            legacy_cluster_tag: false,
            gateway_in_clear: false,
            cluster_autoscaler: None,
            volumes: false,
            csi_sidecars: None,
        }
    }
}

/// The release name and namespace the sandbox plays: its identities are the
/// chart's ServiceAccounts `ccm-<component>` in `kube-system`.
pub const RELEASE: &str = "ccm";
pub const NAMESPACE: &str = "kube-system";
/// The audience of the controllers' gateway tokens, as in the chart.
pub const GATEWAY_AUDIENCE: &str = "cloud-gateway";
/// The audience of the tokens the diagnostics API shows its peers' admin
/// ports, as in the chart.
pub use ccm_runtime::admin::access::PEER_AUDIENCE;
/// The identity of Cluster Autoscaler's client certificate (its one URI
/// SAN, a SPIFFE ID of the ServiceAccount it would run as), which the
/// gateway maps to the `autoscaler` role.
pub const AUTOSCALER_ID: &str = "spiffe://cluster.local/ns/kube-system/sa/cluster-autoscaler";
/// The identity of the volume controller's client certificate, which the
/// gateway maps to the role `volume`.
pub const VOLUME_CONTROLLER_ID: &str =
    "spiffe://cluster.local/ns/kube-system/sa/ccm-volume-controller";
/// The process name (and log) of the toy gateway.
const TOY_GATEWAY: &str = "toy-gateway";
/// The components, each with its gateway role.
const COMPONENTS: [(&str, &str); 5] = [
    ("cloud-gateway", "admin"),
    ("node-controller", "node"),
    ("service-controller", "service"),
    ("route-controller", "route"),
    ("volume-controller", "volume"),
];
/// The environment the chart gives every component (helm/.../gateway.yaml,
/// controllers.yaml): one malloc arena (ARCHITECTURE.md, "Allocator").
pub const PROCESS_ENV: &[(&str, &str)] = &[("MALLOC_ARENA_MAX", "1")];

/// The chart's ServiceAccount of a component (binary name).
pub fn service_account(binary: &str) -> String {
    let component = if binary == "cloud-gateway" {
        "gateway"
    } else {
        binary
    };
    format!("{RELEASE}-{component}")
}

/// The labels the chart gives a component's objects.
/// A process registered as the chart's Pod, with its ports.
struct PodPorts {
    name: String,
    /// The binary (`cloud-gateway`, `node-controller`, ...).
    component: &'static str,
    admin: u16,
    grpc: Option<u16>,
    /// The diagnostics API's port (the controllers').
    diagnostics: Option<u16>,
}

fn chart_labels(component: &str) -> serde_json::Value {
    json!({
        "app.kubernetes.io/name": "cloud-controller-manager",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    })
}

/// A token shaped as the ServiceAccount tokens a cluster mints (a JWT
/// whose payload names its audience, which is how the admin ports tell
/// whom to review it for), known to the API server as a static token; its
/// signature part is random.
fn audience_token(audience: &str) -> String {
    let part = |json: serde_json::Value| {
        data_encoding::BASE64URL_NOPAD.encode(json.to_string().as_bytes())
    };
    format!(
        "{}.{}.{}",
        part(json!({"alg": "none"})),
        part(json!({"aud": [audience], "jti": uuid::Uuid::new_v4().to_string()})),
        random_token()
    )
}

fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A running sandbox; its processes stop when it is dropped.
pub struct Sandbox {
    pub options: Options,
    pub kubeconfig: PathBuf,
    pub gateway: String,
    /// The CA bundle the gateway's certificate is verified against (none
    /// for the toy gateway, which serves on loopback in clear).
    pub gateway_ca: Option<PathBuf>,
    pub endpoints: BTreeMap<String, String>,
    /// The emulated AWS account, on the AWS cloud.
    pub aws: Option<AwsAccount>,
    children: Vec<Process>,
    /// Stops the simulated CSI node plugins.
    node_plugins: tokio_util::sync::CancellationToken,
}

/// The AWS account the sandbox emulates: moto, and what was seeded in it.
pub struct AwsAccount {
    pub moto: Moto,
    /// The proxy the gateway reaches moto through, for injected faults.
    pub proxy: aws::FaultProxy,
    pub seeded: Seeded,
    /// An EC2 client for it, as a person with the AWS CLI would have.
    pub ec2: aws_sdk_ec2::Client,
}

/// One process of the sandbox and how to start it again.
struct Process {
    name: String,
    binary: String,
    /// The directory its binary comes from.
    bin_dir: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Child,
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

async fn wait_for_file(path: &Path) -> anyhow::Result<()> {
    for _ in 0..400 {
        if path.is_file() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{} did not appear", path.display())
}

impl Sandbox {
    /// The directory `binary` is started from.
    fn bin_dir_of(&self, binary: &str) -> &Path {
        match &self.options.components_dir {
            Some(dir) if COMPONENTS.iter().any(|(component, _)| *component == binary) => dir,
            _ => &self.options.bin_dir,
        }
    }

    fn launch(
        &self,
        name: &str,
        bin_dir: &Path,
        binary: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.options.state_dir.join(format!("{name}.log")))?;
        let path = bin_dir.join(binary);
        let mut command = if binary == TOY_GATEWAY {
            let mut command = Command::new(crate::toy::python());
            command.arg(crate::toy::script());
            command
        } else {
            Command::new(&path)
        };
        if COMPONENTS.iter().any(|(component, _)| *component == binary) {
            command.envs(PROCESS_ENV.iter().copied());
        }
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            // The leader election identity starts with it, so a lease
            // holder names its process.
            .env("POD_NAME", name)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "start {} (build it first: cargo build --bins)",
                    path.display()
                )
            })
    }

    fn spawn(
        &mut self,
        name: &str,
        binary: &str,
        args: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<()> {
        let bin_dir = self.bin_dir_of(binary).to_path_buf();
        let child = self.launch(name, &bin_dir, binary, args, env)?;
        self.children.push(Process {
            name: name.into(),
            binary: binary.into(),
            bin_dir,
            args: args.to_vec(),
            env: env.to_vec(),
            child,
        });
        Ok(())
    }

    fn extra_args(&self, binary: &str) -> Vec<String> {
        self.options
            .extra_args
            .get(binary)
            .cloned()
            .unwrap_or_default()
    }

    /// The process id of a running process, e.g. `node-controller-0`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.iter().find(|p| p.name == name)?.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`...) to a running process.
    pub fn signal(&self, name: &str, signal: &str) -> anyhow::Result<()> {
        let pid = self.pid(name).context("no such running process")?;
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
        Ok(())
    }

    /// Whether a process has exited (its status, once it has).
    pub fn exited(&mut self, name: &str) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let p = self
            .children
            .iter_mut()
            .find(|p| p.name == name)
            .context("no such process")?;
        Ok(p.child.try_wait()?)
    }

    /// The last `lines` lines of a process's log (`name` as in
    /// [`Self::processes`]), for an error to carry.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.options.state_dir.join(format!("{name}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The names of every process, in the order started.
    pub fn processes(&self) -> Vec<String> {
        self.children.iter().map(|p| p.name.clone()).collect()
    }

    /// Kills a process at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self, name: &str) -> anyhow::Result<()> {
        let p = self
            .children
            .iter_mut()
            .find(|p| p.name == name)
            .context("no such process")?;
        p.child.kill().await?;
        Ok(())
    }

    /// Starts a killed process again with the same arguments.
    pub fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        self.restart_with(name, &[])
    }

    /// Starts a killed process again with the same arguments and, this
    /// once, `extra` ones after them.
    pub fn restart_with(&mut self, name: &str, extra: &[String]) -> anyhow::Result<()> {
        let i = self
            .children
            .iter()
            .position(|p| p.name == name)
            .context("no such process")?;
        let p = &self.children[i];
        let (bin_dir, binary, mut args, env) = (
            p.bin_dir.clone(),
            p.binary.clone(),
            p.args.clone(),
            p.env.clone(),
        );
        args.extend_from_slice(extra);
        self.children[i].child = self.launch(name, &bin_dir, &binary, &args, &env)?;
        Ok(())
    }

    /// The directory a process's binary comes from.
    pub fn bin_dir(&self, name: &str) -> Option<&Path> {
        Some(&self.children.iter().find(|p| p.name == name)?.bin_dir)
    }

    /// Replaces a process as a rolling update replaces a pod: stops it
    /// (SIGTERM, so a leader hands its lease over; SIGKILL after 15 s)
    /// and starts `bin_dir`'s binary in its place, with the same
    /// arguments, ports and state.
    pub async fn replace(&mut self, name: &str, bin_dir: &Path) -> anyhow::Result<()> {
        self.signal(name, "TERM")?;
        let p = self
            .children
            .iter_mut()
            .find(|p| p.name == name)
            .context("no such process")?;
        if tokio::time::timeout(Duration::from_secs(15), p.child.wait())
            .await
            .is_err()
        {
            tracing::warn!(process = %name, "did not stop in time; killing");
            p.child.kill().await?;
        }
        p.bin_dir = bin_dir.to_path_buf();
        self.restart(name)
    }

    /// The identity holding `lease` (`<process>_<unique suffix>`), if any:
    /// a process started again holds it under another.
    pub async fn lease_holder(&self, lease: &str) -> anyhow::Result<Option<String>> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client().await?, "kube-system");
        Ok(leases
            .get_opt(lease)
            .await?
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// The process holding `lease` (e.g. "ccm-node-controller"), if any.
    pub async fn leader(&self, lease: &str) -> anyhow::Result<Option<String>> {
        let holder = self.lease_holder(lease).await?.unwrap_or_default();
        Ok(self
            .children
            .iter()
            .map(|p| p.name.clone())
            .find(|name| holder.starts_with(&format!("{name}_"))))
    }

    /// Starts everything fresh in `options.state_dir`: the cloud and the
    /// cluster always start together, so they never disagree.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        if options.state_dir.exists() {
            std::fs::remove_dir_all(&options.state_dir)
                .with_context(|| format!("clear {}", options.state_dir.display()))?;
        }
        std::fs::create_dir_all(&options.state_dir)?;
        let state = options.state_dir.canonicalize()?;
        let kubeconfig = state.join("kubeconfig");
        let mut sandbox = Sandbox {
            options: Options {
                state_dir: state.clone(),
                ..options
            },
            kubeconfig: kubeconfig.clone(),
            gateway: String::new(),
            gateway_ca: None,
            endpoints: BTreeMap::new(),
            aws: None,
            children: Vec::new(),
            node_plugins: tokio_util::sync::CancellationToken::new(),
        };
        let api_port = free_port()?;
        let api_url = format!("https://{}", addr(api_port));
        // Made here and loaded by the API server from its state
        // directory: the kubeconfigs below trust its CA before it starts.
        let pki =
            kube_test_apiserver::ClusterPki::load_or_generate(Some(&state.join("apiserver")))?;
        let tokens = sandbox.identities(&api_url, &pki.ca_pem)?;
        // The volume controller's client certificate, where the gateway
        // knows it by one (below).
        let mut volume_cert: Option<pki::Issued> = None;
        // On disk, so the API server killed and started again (the soak,
        // the outage tests) has every object it had.
        let mut api_args = vec![
            "--listen".into(),
            addr(api_port).to_string(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--tokens".into(),
            tokens.display().to_string(),
            "--state-dir".into(),
            state.join("apiserver").display().to_string(),
        ];
        if let Some(policy) = &sandbox.options.rbac {
            api_args.extend(["--rbac".into(), policy.display().to_string()]);
        }
        sandbox.spawn("kube-test-apiserver", "kube-test-apiserver", &api_args, &[])?;
        let (grpc, admin) = (free_port()?, free_port()?);
        let gateway_dir = state.join("gateway");
        // Each process as the chart's Pod: name, component, admin and gRPC
        // ports.
        let mut pods: Vec<PodPorts> = Vec::new();
        // The volume controller's role only where it runs: a gateway of a
        // release before volumes (the skew run's) knows no such role.
        let roles: Vec<String> = COMPONENTS[1..]
            .iter()
            .filter(|(binary, _)| *binary != "volume-controller" || sandbox.options.volumes)
            .map(|(binary, role)| format!("{NAMESPACE}/{}={role}", service_account(binary)))
            .collect();
        // Its own CA, as the chart makes one: everything reaches the
        // gateway over TLS, as in a cluster, and the API server reaches the
        // controllers' diagnostics API by it.
        let pki = pki::Pki::create(&state.join("pki"), "ccm sandbox CA")?;
        let diagnostics = pki.serving(
            "diagnostics",
            &["localhost", "127.0.0.1", pki::DIAGNOSTICS_NAME],
        )?;
        // The gateway's certificate serves its admin port even when its
        // gRPC is in clear.
        let gateway_cert =
            pki.serving("gateway", &["localhost", "127.0.0.1", pki::GATEWAY_NAME])?;
        let serving = if sandbox.options.gateway_in_clear {
            sandbox.gateway = format!("http://{}", addr(grpc));
            None
        } else {
            let serving = gateway_cert.clone();
            sandbox.gateway_ca = Some(pki.ca_file());
            sandbox.gateway = format!("https://{}", addr(grpc));
            sandbox.endpoints.insert(
                "gateway_ca_file".into(),
                pki.ca_file().display().to_string(),
            );
            Some(serving)
        };
        if sandbox.options.cloud == CloudKind::Toy {
            // Its tokens are the files the controllers send, taken as they
            // are: it does no TokenReview.
            let serving = serving.context("the toy gateway serves over TLS only here")?;
            sandbox.spawn(
                TOY_GATEWAY,
                TOY_GATEWAY,
                &crate::toy::args(&addr(grpc).to_string(), &state.join("tokens"), &serving),
                &[],
            )?;
        } else {
            let (cloud_args, cloud_env) = sandbox.cloud().await?;
            let transport: Vec<String> = match &serving {
                None => vec!["--insecure-plaintext".into(), "true".into()],
                Some(serving) => {
                    let mut transport = vec![
                        "--tls-cert".into(),
                        serving.cert.display().to_string(),
                        "--tls-key".into(),
                        serving.key.display().to_string(),
                    ];
                    // Cluster Autoscaler's identity: a client certificate
                    // of a CA for clients only (the serving CA above
                    // signs no identity), and the cloud-config its
                    // `--cloud-provider=externalgrpc` reads, whose
                    // `cacert` verifies the gateway. Not for another
                    // release's gateway (the skew run), which may not
                    // know the role.
                    if sandbox.options.components_dir.is_some() {
                        transport
                    } else {
                        let clients =
                            pki::Pki::create(&state.join("client-pki"), "ccm sandbox client CA")?;
                        let autoscaler =
                            clients.client_naming("autoscaler", &[AUTOSCALER_ID], None, false)?;
                        // The volume controller is known by a client
                        // certificate too (mutual TLS), where the other
                        // controllers show their tokens: both ways are
                        // run.
                        volume_cert = Some(clients.client_naming(
                            "volume-controller",
                            &[VOLUME_CONTROLLER_ID],
                            None,
                            false,
                        )?);
                        let config = state.join("autoscaler-cloud-config.yaml");
                        std::fs::write(
                            &config,
                            format!(
                                "address: \"{}\"\ncert: \"{}\"\nkey: \"{}\"\ncacert: \"{}\"\ngrpc_timeout: \"30s\"\n",
                                addr(grpc),
                                autoscaler.cert.display(),
                                autoscaler.key.display(),
                                pki.ca_file().display()
                            ),
                        )?;
                        sandbox.endpoints.insert(
                            "autoscaler_cloud_config".into(),
                            config.display().to_string(),
                        );
                        transport.extend([
                            "--tls-client-ca".into(),
                            clients.ca_file().display().to_string(),
                            "--client-cert-roles".into(),
                            format!("{AUTOSCALER_ID}=autoscaler,{VOLUME_CONTROLLER_ID}=volume"),
                        ]);
                        transport
                    }
                }
            };
            sandbox.spawn(
                "cloud-gateway",
                "cloud-gateway",
                &transport
                    .into_iter()
                    .chain([
                        "--listen".into(),
                        addr(grpc).to_string(),
                        "--admin-listen".into(),
                        addr(admin).to_string(),
                        "--state-dir".into(),
                        gateway_dir.display().to_string(),
                        "--kubeconfig".into(),
                        state.join("kubeconfig-cloud-gateway").display().to_string(),
                        "--service-account-roles".into(),
                        roles.join(","),
                        "--token-audience".into(),
                        GATEWAY_AUDIENCE.into(),
                        "--tokens-file".into(),
                        state.join("gateway-tokens.yaml").display().to_string(),
                        "--admin-tls-cert".into(),
                        gateway_cert.cert.display().to_string(),
                        "--admin-tls-key".into(),
                        gateway_cert.key.display().to_string(),
                    ])
                    .chain(cloud_args)
                    .chain(sandbox.extra_args("cloud-gateway"))
                    .collect::<Vec<_>>(),
                &cloud_env,
            )?;
            sandbox
                .endpoints
                .insert("gateway_admin".into(), format!("https://{}", addr(admin)));
            pods.push(PodPorts {
                name: "cloud-gateway".to_owned(),
                component: "gateway",
                admin,
                grpc: Some(grpc),
                diagnostics: None,
            });
        }
        sandbox.endpoints.insert("kube_api".into(), api_url.clone());
        sandbox
            .endpoints
            .insert("kubeconfig".into(), kubeconfig.display().to_string());
        sandbox
            .endpoints
            .insert("gateway".into(), sandbox.gateway.clone());
        sandbox.endpoints.insert(
            "admin_token_file".into(),
            state.join("tokens/admin.token").display().to_string(),
        );
        wait_for_file(&kubeconfig).await?;
        let mut controllers = vec![
            ("node-controller", "node", vec![]),
            ("service-controller", "service", vec![]),
            (
                "route-controller",
                "route",
                vec!["--cluster-cidr".to_owned(), "10.244.0.0/16".to_owned()],
            ),
        ];
        if sandbox.options.volumes {
            controllers.push(("volume-controller", "volume", vec![]));
            sandbox.endpoints.insert(
                "csi_socket".into(),
                csi_socket(&state, "volume-controller-0")
                    .display()
                    .to_string(),
            );
            // The first Node's: `node-0` on the sim, its instance's
            // private DNS name on AWS.
            let first = match &sandbox.aws {
                Some(aws) => aws.seeded.instances.first().map(|i| i.name.clone()),
                None => Some("node-0".to_owned()).filter(|_| sandbox.options.nodes > 0),
            };
            if let Some(first) = first.filter(|_| sandbox.options.cloud != CloudKind::Toy) {
                sandbox.endpoints.insert(
                    "csi_node_socket".into(),
                    node_plugin_socket(&state, &first).display().to_string(),
                );
            }
        }
        for (binary, role, extra) in controllers {
            for replica in 0..sandbox.options.replicas {
                let (admin, diagnostics_port) = (free_port()?, free_port()?);
                let name = format!("{binary}-{replica}");
                let mut args = vec![
                    "--kubeconfig".to_owned(),
                    state
                        .join(format!("kubeconfig-{binary}"))
                        .display()
                        .to_string(),
                    "--gateway-address".into(),
                    sandbox.gateway.clone(),
                    "--admin-listen".into(),
                    addr(admin).to_string(),
                    "--leader-elect-lease-duration".into(),
                    "6s".into(),
                    "--leader-elect-renew-deadline".into(),
                    "4s".into(),
                    "--leader-elect-retry-period".into(),
                    "1s".into(),
                    "--cluster-name".into(),
                    sandbox.options.cluster.clone(),
                    "--diagnostics-listen".into(),
                    addr(diagnostics_port).to_string(),
                    "--diagnostics-tls-cert".into(),
                    diagnostics.cert.display().to_string(),
                    "--diagnostics-tls-key".into(),
                    diagnostics.key.display().to_string(),
                    "--release-name".into(),
                    RELEASE.into(),
                    // The admin port serves the diagnostics certificate, which
                    // the other replicas' diagnostics API verifies by the CA.
                    "--admin-tls-cert".into(),
                    diagnostics.cert.display().to_string(),
                    "--admin-tls-key".into(),
                    diagnostics.key.display().to_string(),
                    "--diagnostics-peer-ca-file".into(),
                    pki.ca_file().display().to_string(),
                ];
                // The token shown to the peers, in the environment: a
                // previous release's controller (the skew run) ignores it
                // where it would refuse an unknown flag.
                let mut env = vec![(
                    "CCM_DIAGNOSTICS_PEER_TOKEN_FILE".to_owned(),
                    state
                        .join(format!("tokens/{binary}-peer.token"))
                        .display()
                        .to_string(),
                )];
                if let Some(ca) = &sandbox.gateway_ca {
                    args.extend(["--gateway-ca-file".into(), ca.display().to_string()]);
                }
                if binary == "node-controller" {
                    // The kubelets below ask for serving certificates.
                    args.extend(["--approve-kubelet-serving-csrs".into(), "true".into()]);
                }
                let mut diagnostics_port = Some(diagnostics_port);
                // Known to the gateway by its role's token, or the volume
                // controller by its certificate instead, where it has one.
                match &volume_cert {
                    Some(cert) if binary == "volume-controller" => args.extend([
                        "--gateway-client-cert-file".into(),
                        cert.cert.display().to_string(),
                        "--gateway-client-key-file".into(),
                        cert.key.display().to_string(),
                    ]),
                    _ => args.extend([
                        "--gateway-token-file".into(),
                        state
                            .join(format!("tokens/{role}.token"))
                            .display()
                            .to_string(),
                    ]),
                }
                if binary == "volume-controller" {
                    // The socket the sidecars of its pod would share; and,
                    // as the chart runs it, no diagnostics API.
                    let socket = csi_socket(&state, &name);
                    args.extend([
                        "--csi-address".into(),
                        format!("unix://{}", socket.display()),
                    ]);
                    without_diagnostics(&mut args);
                    env.clear();
                    diagnostics_port = None;
                }
                args.extend(extra.iter().cloned());
                args.extend(sandbox.extra_args(binary));
                sandbox.spawn(&name, binary, &args, &env)?;
                sandbox
                    .endpoints
                    .insert(format!("{name}_admin"), format!("https://{}", addr(admin)));
                pods.push(PodPorts {
                    name,
                    component: binary,
                    admin,
                    grpc: None,
                    diagnostics: diagnostics_port,
                });
            }
        }
        sandbox.register_pods(&pods).await?;
        sandbox.register_diagnostics(&pods, &pki.ca_file()).await?;
        if let Some(binary) = sandbox.options.cluster_autoscaler.clone() {
            sandbox.start_autoscaler(&binary).await?;
        }
        if let Some(sidecars) = sandbox.options.csi_sidecars.clone() {
            sandbox.start_csi_sidecars(&sidecars)?;
        }
        std::fs::write(
            state.join("endpoints.json"),
            serde_json::to_string_pretty(&sandbox.endpoints)?,
        )?;
        Ok(sandbox)
    }

    /// Registers each process as the chart's Pod would be (in the chart's
    /// namespace, with its labels, named ports and the loopback address as
    /// its IP), and the gateway as its Service with endpoints, so what
    /// reaches them through the API server (`pods/proxy`,
    /// `services/proxy`, `kubectl ccm`) works as in a cluster. A Lease
    /// holder's identity starts with its Pod's name.
    async fn register_pods(&self, pods: &[PodPorts]) -> anyhow::Result<()> {
        let client = self.client().await?;
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
        for PodPorts {
            name,
            component,
            admin,
            grpc,
            diagnostics,
        } in pods
        {
            let component = component.trim_start_matches("cloud-");
            let mut ports =
                vec![json!({"name": "admin", "containerPort": admin, "protocol": "TCP"})];
            if let Some(grpc) = grpc {
                ports.push(json!({"name": "grpc", "containerPort": grpc, "protocol": "TCP"}));
            }
            if let Some(port) = diagnostics {
                ports
                    .push(json!({"name": "diagnostics", "containerPort": port, "protocol": "TCP"}));
            }
            let pod = json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": chart_labels(component)},
                "spec": {
                    "serviceAccountName": service_account(if component == "gateway" { "cloud-gateway" } else { component }),
                    "containers": [{"name": component, "image": "cloud-controller-manager:sandbox", "ports": ports}],
                },
            });
            api.create(&PostParams::default(), &serde_json::from_value(pod)?)
                .await
                .with_context(|| format!("register pod {name}"))?;
            let status = json!({"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
                .with_context(|| format!("set the status of pod {name}"))?;
        }
        let Some(PodPorts {
            admin,
            grpc: Some(grpc),
            ..
        }) = pods.iter().find(|p| p.component == "gateway")
        else {
            return Ok(());
        };
        let gateway = format!("{RELEASE}-gateway");
        let service = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": gateway, "namespace": NAMESPACE, "labels": chart_labels("gateway")},
            "spec": {
                "selector": chart_labels("gateway"),
                "ports": [
                    {"name": "grpc", "port": grpc, "targetPort": "grpc", "protocol": "TCP"},
                    {"name": "admin", "port": admin, "targetPort": "admin", "protocol": "TCP"},
                ],
            },
        });
        Api::<Service>::namespaced(client.clone(), NAMESPACE)
            .create(&PostParams::default(), &serde_json::from_value(service)?)
            .await
            .context("register the gateway's Service")?;
        let endpoints = json!({
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": gateway, "namespace": NAMESPACE, "labels": chart_labels("gateway")},
            "subsets": [{
                "addresses": [{"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": "cloud-gateway"}}],
                "ports": [
                    {"name": "grpc", "port": grpc, "protocol": "TCP"},
                    {"name": "admin", "port": admin, "protocol": "TCP"},
                ],
            }],
        });
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client, NAMESPACE)
            .create(&PostParams::default(), &serde_json::from_value(endpoints)?)
            .await
            .context("register the gateway's endpoints")?;
        Ok(())
    }

    /// Registers the diagnostics API as the chart does: a Service
    /// `<release>-diagnostics` whose endpoints are every controller
    /// replica's `diagnostics` port, and the APIService that has the API
    /// server aggregate `diagnostics.cloudgateway.io/v1` to it, trusting
    /// the sandbox's CA.
    async fn register_diagnostics(&self, pods: &[PodPorts], ca: &Path) -> anyhow::Result<()> {
        let client = self.client().await?;
        let name = format!("{RELEASE}-diagnostics");
        let labels = chart_labels("diagnostics");
        let service = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "selector": {"app.kubernetes.io/instance": RELEASE, "cloudgateway.io/diagnostics": "true"},
                "ports": [{"name": "https", "port": 443, "targetPort": "diagnostics", "protocol": "TCP"}],
            },
        });
        Api::<Service>::namespaced(client.clone(), NAMESPACE)
            .create(&PostParams::default(), &serde_json::from_value(service)?)
            .await
            .context("register the diagnostics Service")?;
        // Each replica listens on a port of its own, so each is a subset.
        let subsets: Vec<serde_json::Value> = pods
            .iter()
            .filter_map(|p| {
                let port = p.diagnostics?;
                Some(json!({
                    "addresses": [{"ip": "127.0.0.1", "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": p.name}}],
                    "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                }))
            })
            .collect();
        let endpoints = json!({
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": chart_labels("diagnostics")},
            "subsets": subsets,
        });
        Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(client.clone(), NAMESPACE)
            .create(&PostParams::default(), &serde_json::from_value(endpoints)?)
            .await
            .context("register the diagnostics endpoints")?;
        let ca_bundle = data_encoding::BASE64.encode(&std::fs::read(ca)?);
        let api_service = json!({
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": "v1.diagnostics.cloudgateway.io", "labels": chart_labels("diagnostics")},
            "spec": {
                "group": "diagnostics.cloudgateway.io",
                "version": "v1",
                "service": {"namespace": NAMESPACE, "name": name, "port": 443},
                "caBundle": ca_bundle,
                "groupPriorityMinimum": 1000,
                "versionPriority": 15,
            },
        });
        let resource = kube::api::ApiResource {
            group: "apiregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "apiregistration.k8s.io/v1".into(),
            kind: "APIService".into(),
            plural: "apiservices".into(),
        };
        Api::<kube::api::DynamicObject>::all_with(client, &resource)
            .create(
                &PostParams::default(),
                &serde_json::from_value(api_service)?,
            )
            .await
            .context("register the diagnostics APIService")?;
        Ok(())
    }

    /// Sets up the cloud: nothing for the sim; for AWS, moto with a
    /// seeded account (a VPC, tagged subnets and route table, one instance
    /// per node). Returns the gateway's flags and environment for it.
    async fn cloud(&mut self) -> anyhow::Result<(Vec<String>, Vec<(String, String)>)> {
        if self.options.cloud == CloudKind::Sim {
            return Ok((vec!["--provider".into(), "sim".into()], Vec::new()));
        }
        let state = self.options.state_dir.clone();
        let moto = Moto::start(&state.join("moto")).await?;
        let ec2 = moto.ec2();
        let tag = if self.options.legacy_cluster_tag {
            aws::ClusterTag::Legacy
        } else {
            aws::ClusterTag::Current
        };
        let seeded = aws::seed_tagged(&ec2, &self.options.cluster, self.options.nodes, tag).await?;
        // The gateway reaches moto through a proxy that tests can make fail.
        let proxy = aws::FaultProxy::start(&moto.endpoint).await?;
        let args = [
            "--provider",
            "aws",
            "--aws-endpoint-url",
            &proxy.endpoint,
            "--aws-vpc-id",
            &seeded.vpc,
        ]
        .map(String::from)
        .to_vec();
        // Dummy credentials through the SDK's standard chain, as a pod
        // gets them from its mounted Secret.
        let env = aws::credentials_env(&aws::secret_access_key(), &state);
        for (key, value) in [
            ("aws_endpoint", moto.endpoint.clone()),
            ("aws_region", aws::REGION.to_owned()),
            ("aws_vpc", seeded.vpc.clone()),
            ("aws_route_table", seeded.route_table.clone()),
        ] {
            self.endpoints.insert(key.into(), value);
        }
        self.aws = Some(AwsAccount {
            moto,
            proxy,
            seeded,
            ec2,
        });
        Ok((args, env))
    }

    /// Makes the identities a cluster would give the chart's pods: per
    /// component a ServiceAccount token for the API (in
    /// `kubeconfig-<binary>`) and, for controllers, a token bound to the
    /// gateway's audience (in `tokens/<role>.token`), which the gateway
    /// checks with TokenReview as in a cluster. The admin's gateway token is
    /// a static one. Returns the API server's tokens file.
    fn identities(&self, api_url: &str, ca_pem: &str) -> anyhow::Result<PathBuf> {
        let state = &self.options.state_dir;
        std::fs::create_dir_all(state.join("tokens"))?;
        let mut entries = Vec::new();
        // Every file below holds a credential: its owner's alone, as the
        // kubelet mounts a pod's.
        let private = ccm_runtime::files::write_private;
        for (binary, role) in COMPONENTS {
            let account = service_account(binary);
            let api_token = random_token();
            private(
                &state.join(format!("kubeconfig-{binary}")),
                kube_test_apiserver::kubeconfig(api_url, ca_pem, &account, &api_token).as_bytes(),
            )?;
            entries.push(TokenEntry {
                token: api_token,
                user: TokenUser::service_account(NAMESPACE, &account, &[]),
            });
            let gateway_token = random_token();
            private(
                &state.join(format!("tokens/{role}.token")),
                gateway_token.as_bytes(),
            )?;
            if role == "admin" {
                private(
                    &state.join("gateway-tokens.yaml"),
                    format!(
                        "tokens:\n  - {{token: {gateway_token}, role: admin, name: sandbox-admin}}\n"
                    )
                    .as_bytes(),
                )?;
            } else {
                entries.push(TokenEntry {
                    token: gateway_token,
                    user: TokenUser::service_account(NAMESPACE, &account, &[GATEWAY_AUDIENCE]),
                });
                // The token the diagnostics API shows its peers, as the
                // chart's projected volume gives it.
                let peer_token = audience_token(PEER_AUDIENCE);
                private(
                    &state.join(format!("tokens/{binary}-peer.token")),
                    peer_token.as_bytes(),
                )?;
                entries.push(TokenEntry {
                    token: peer_token,
                    user: TokenUser::service_account(NAMESPACE, &account, &[PEER_AUDIENCE]),
                });
            }
        }
        // Cluster Autoscaler's own ServiceAccount, as upstream's chart
        // makes it.
        let api_token = random_token();
        private(
            &state.join(format!("kubeconfig-{}", autoscaler::NAME)),
            kube_test_apiserver::kubeconfig(api_url, ca_pem, autoscaler::NAME, &api_token)
                .as_bytes(),
        )?;
        entries.push(TokenEntry {
            token: api_token,
            user: TokenUser::service_account(NAMESPACE, autoscaler::NAME, &[]),
        });
        let path = state.join("apiserver-tokens.yaml");
        private(&path, serde_norway::to_string(&entries)?.as_bytes())?;
        Ok(path)
    }

    /// What the API server's RBAC refused and which grants went unused
    /// (`GET /debug/rbac`); `None` without `options.rbac`.
    pub async fn rbac_report(&self) -> anyhow::Result<Option<serde_json::Value>> {
        if self.options.rbac.is_none() {
            return Ok(None);
        }
        let client = self.client().await?;
        let request = http::Request::get("/debug/rbac").body(Vec::new())?;
        Ok(Some(client.request::<serde_json::Value>(request).await?))
    }

    /// A kube client for the sandbox's API server.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        ccm_runtime::kube::client(Some(&self.kubeconfig)).await
    }

    /// A gateway client with the admin token.
    pub fn admin(&self) -> anyhow::Result<GatewayClient> {
        let token = PathBuf::from(&self.endpoints["admin_token_file"]);
        let mut config = ClientConfig::new(
            self.gateway.clone(),
            &self.options.cluster,
            TokenSource::File(token),
        );
        config.tls_ca = self.gateway_ca.clone();
        Ok(GatewayClient::new(config)?)
    }

    /// The instances of the nodes, `(name, internal IP)`: created through
    /// SimAdmin on the sim, seeded at start on AWS (named by their private
    /// DNS names, as kubelets name their Nodes there).
    async fn instances(&self) -> anyhow::Result<Vec<(String, String)>> {
        if let Some(aws) = &self.aws {
            return Ok(aws
                .seeded
                .instances
                .iter()
                .map(|i| (i.name.clone(), i.private_ip.clone()))
                .collect());
        }
        let mut admin = self.admin()?.sim_admin()?;
        let mut out = Vec::new();
        for i in 0..self.options.nodes {
            let name = format!("node-{i}");
            // The gateway may still be starting.
            let instance = loop {
                match admin
                    .create_instance(CreateInstanceRequest {
                        name: name.clone(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(i) => break i.into_inner(),
                    Err(e) if e.code() == tonic::Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => anyhow::bail!("create instance {name}: {e}"),
                }
            };
            out.push((name, internal_ip(&instance)));
        }
        Ok(out)
    }

    /// Creates the instances and registers their Nodes as kubelets with
    /// `--cloud-provider=external` do, and the demo Services; with
    /// volumes, starts a simulated CSI node plugin beside each kubelet.
    pub async fn populate(&self) -> anyhow::Result<()> {
        let client = self.client().await?;
        let instances = self.instances().await?;
        let plugins = if self.options.volumes && self.options.cloud != CloudKind::Toy {
            self.start_node_plugins().await?
        } else {
            Vec::new()
        };
        for (i, (name, ip)) in instances.into_iter().enumerate() {
            register_node(
                &client,
                &name,
                &Kubelet::at(&ip, &format!("10.244.{i}.0/24")),
            )
            .await?;
        }
        for (node, socket) in plugins {
            register_plugin(&client, &node, &socket).await?;
        }
        let services: Api<Service> = Api::namespaced(client, "default");
        for i in 0..self.options.services {
            let name = if i == 0 {
                "demo".to_owned()
            } else {
                format!("demo-{i}")
            };
            services
                .create(
                    &PostParams::default(),
                    &fixtures::load_balancer("default", &name).build(),
                )
                .await?;
        }
        Ok(())
    }

    /// Starts upstream's sidecars as the volume controller's pod runs
    /// them: on the first replica's socket, under its ServiceAccount, one
    /// replica each (their own leader election off); their logs beside the
    /// others. The snapshot-controller, a cluster component, runs as the
    /// admin.
    fn start_csi_sidecars(&mut self, sidecars: &CsiSidecars) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.options.volumes,
            "the CSI sidecars need the volume controller (--volumes)"
        );
        let state = self.options.state_dir.clone();
        let kubeconfig = state.join("kubeconfig-volume-controller");
        let socket = csi_socket(&state, "volume-controller-0");
        // No VolumeGroupSnapshot CRDs here, and no group controller in the
        // driver: the gate off, as in v8.6.0 (the chart's release), where
        // it is off by default; in later commits it is on, and both
        // snapshot components look for the CRDs for 30 seconds before going
        // on without.
        let no_groups = "--feature-gates=CSIVolumeGroupSnapshot=false";
        let on_socket = |extra: &[&str]| {
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--csi-address={}", socket.display()),
                "--leader-election=false".to_owned(),
            ];
            args.extend(extra.iter().map(|a| (*a).to_owned()));
            args
        };
        let mut run = vec![
            (
                "csi-provisioner",
                &sidecars.provisioner,
                on_socket(&["--extra-create-metadata"]),
            ),
            ("csi-attacher", &sidecars.attacher, on_socket(&[])),
        ];
        if let Some(resizer) = &sidecars.resizer {
            run.push(("csi-resizer", resizer, on_socket(&[])));
        }
        if let Some(snapshotter) = &sidecars.snapshotter {
            run.push((
                "csi-snapshotter",
                snapshotter,
                on_socket(&["--extra-create-metadata", no_groups]),
            ));
        }
        if let Some(controller) = &sidecars.snapshot_controller {
            let admin = format!("--kubeconfig={}", self.kubeconfig.display());
            let args = vec![admin, "--leader-election=false".into(), no_groups.into()];
            run.push(("snapshot-controller", controller, args));
        }
        for (name, binary, mut args) in run {
            anyhow::ensure!(binary.is_file(), "no {name} binary at {}", binary.display());
            args.extend(self.extra_args(name));
            let binary = binary.canonicalize()?.display().to_string();
            self.spawn(name, &binary, &args, &[])?;
            self.endpoints.insert(
                format!("{}_log", name.replace('-', "_")),
                state.join(format!("{name}.log")).display().to_string(),
            );
        }
        Ok(())
    }

    /// The cluster's part of volumes, played here (see [`volume_roles`]):
    /// for the gateway's CSI driver, on every node with a simulated plugin.
    pub async fn volume_roles(&self) -> anyhow::Result<volume_roles::VolumeRoles> {
        let driver = self
            .admin()?
            .provider_info()
            .await?
            .volume_offer
            .context("the gateway offers no volumes")?
            .csi_driver;
        let state = &self.options.state_dir;
        let mut plugins = BTreeMap::new();
        let sockets = state.join("csi-node");
        for entry in
            std::fs::read_dir(&sockets).with_context(|| format!("read {}", sockets.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "sock")
                && let Some(node) = path.file_stem().and_then(|n| n.to_str())
            {
                plugins.insert(node.to_owned(), path.clone());
            }
        }
        Ok(volume_roles::VolumeRoles {
            driver,
            plugins,
            kubelet_dir: state.join("kubelet"),
        })
    }

    /// A simulated CSI node plugin for each instance (the sim's, or those
    /// seeded in moto), on `csi-node/<name>.sock` under the state
    /// directory, as the cloud's node plugin runs beside each kubelet; each
    /// Node's name and its plugin's socket.
    async fn start_node_plugins(&self) -> anyhow::Result<Vec<(String, PathBuf)>> {
        let admin = self.admin()?;
        let offer = admin
            .provider_info()
            .await?
            .volume_offer
            .context("the gateway offers no volumes")?;
        // (Node name, instance ID, zone.)
        let instances: Vec<(String, String, String)> = match &self.aws {
            Some(aws) => aws
                .seeded
                .instances
                .iter()
                .map(|i| (i.name.clone(), i.id.clone(), i.zone.clone()))
                .collect(),
            None => admin
                .sim_admin()?
                .list_instances(ListInstancesRequest::default())
                .await?
                .into_inner()
                .instances
                .into_iter()
                .map(|i| (i.name, i.id, i.zone))
                .collect(),
        };
        let state = &self.options.state_dir;
        let mut plugins = Vec::new();
        for (name, instance_id, zone) in instances {
            let plugin = csi_node::NodePlugin {
                driver: offer.csi_driver.clone(),
                instance_id,
                zone,
                topology_key: offer.topology_keys.first().cloned().unwrap_or_default(),
                max_volumes: SIM_VOLUMES_PER_INSTANCE,
                state_dir: state.join("csi-node").join(&name),
                gateway: admin.clone(),
            };
            let socket = node_plugin_socket(state, &name);
            csi_node::serve(plugin, socket.clone(), self.node_plugins.clone()).await?;
            plugins.push((name, socket));
        }
        Ok(plugins)
    }

    /// A cloneable handle for the simulated kubelets and progress, usable
    /// while the sandbox itself is being changed.
    pub fn handle(&self) -> Handle {
        Handle {
            kubeconfig: self.kubeconfig.clone(),
            gateway: self.gateway.clone(),
            gateway_ca: self.gateway_ca.clone(),
            tokens: PathBuf::from(&self.endpoints["admin_token_file"])
                .parent()
                .map(PathBuf::from)
                .unwrap_or_default(),
            aws: self
                .aws
                .as_ref()
                .map(|a| (a.moto.endpoint.clone(), a.seeded.vpc.clone())),
            cluster: self.options.cluster.clone(),
        }
    }

    /// One round of simulated kubelets (see [`Handle::heartbeat`]).
    pub async fn heartbeat(&self) -> anyhow::Result<()> {
        self.handle().heartbeat().await
    }

    /// See [`Handle::progress`].
    pub async fn progress(&self) -> anyhow::Result<Progress> {
        self.handle().progress().await
    }

    /// Stops every process (SIGTERM, then kill).
    pub async fn stop(mut self) {
        self.node_plugins.cancel();
        for p in &self.children {
            if let Some(pid) = p.child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
        for p in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(10), p.child.wait())
                .await
                .is_err()
            {
                tracing::warn!(process = %p.name, "did not stop in time; killing");
                let _ = p.child.kill().await;
            }
        }
    }
}

/// Takes the diagnostics API's flags (each with its value) out of a
/// controller's `args`.
fn without_diagnostics(args: &mut Vec<String>) {
    const FLAGS: [&str; 5] = [
        "--diagnostics-listen",
        "--diagnostics-tls-cert",
        "--diagnostics-tls-key",
        "--release-name",
        "--diagnostics-peer-ca-file",
    ];
    let mut kept = Vec::with_capacity(args.len());
    let mut pairs = std::mem::take(args).into_iter();
    while let Some(flag) = pairs.next() {
        let value = pairs.next();
        if !FLAGS.contains(&flag.as_str()) {
            kept.push(flag);
            kept.extend(value);
        }
    }
    *args = kept;
}

/// The most volumes a sim instance takes: the gateway's
/// `--sim-volumes-per-instance` by default, which the sandbox keeps.
const SIM_VOLUMES_PER_INSTANCE: i64 = 26;

/// The CSI socket of the volume controller replica `name`.
fn csi_socket(state: &Path, name: &str) -> PathBuf {
    state.join("csi").join(format!("{name}.sock"))
}

/// The simulated CSI node plugin's socket of the instance `name`.
fn node_plugin_socket(state: &Path, name: &str) -> PathBuf {
    state.join("csi-node").join(format!("{name}.sock"))
}

/// What the simulated kubelets and progress reports need.
#[derive(Clone, Debug)]
pub struct Handle {
    pub kubeconfig: PathBuf,
    pub gateway: String,
    /// The CA bundle the gateway's certificate is verified against.
    pub gateway_ca: Option<PathBuf>,
    /// The directory of the gateway's per-role token files.
    pub tokens: PathBuf,
    /// On AWS, the EC2 endpoint and the cluster's VPC.
    pub aws: Option<(String, String)>,
    /// The cluster's name.
    pub cluster: String,
}

impl Handle {
    /// A gateway client with `role`'s token.
    pub fn gateway_client(&self, role: &str) -> anyhow::Result<GatewayClient> {
        Ok(GatewayClient::new(self.client_config(role))?)
    }

    /// How a client with `role`'s token reaches the gateway.
    pub fn client_config(&self, role: &str) -> ClientConfig {
        let mut config = ClientConfig::new(
            self.gateway.clone(),
            &self.cluster,
            TokenSource::File(self.tokens.join(format!("{role}.token"))),
        );
        config.tls_ca = self.gateway_ca.clone();
        config
    }

    /// One round of simulated kubelets: Ready while the instance runs,
    /// Unknown (no heartbeat) once it stopped or is gone; on the sim, a
    /// node group's new instance registers its Node once it is made, as
    /// its kubelet would (so Cluster Autoscaler's scale-ups end in Nodes).
    pub async fn heartbeat(&self) -> anyhow::Result<()> {
        let client = ccm_runtime::kube::client(Some(&self.kubeconfig)).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let mut grown = Vec::new();
        let running: BTreeMap<String, bool> = match &self.aws {
            Some((endpoint, vpc)) => aws::instance_states(&aws::ec2_client(endpoint), vpc)
                .await?
                .into_iter()
                .map(|(name, state)| {
                    let up = matches!(
                        state,
                        aws_sdk_ec2::types::InstanceStateName::Running
                            | aws_sdk_ec2::types::InstanceStateName::Pending
                    );
                    (name, up)
                })
                .collect(),
            None => self
                .gateway_client("admin")?
                .sim_admin()?
                .list_instances(ListInstancesRequest {})
                .await?
                .into_inner()
                .instances
                .into_iter()
                .map(|i| {
                    let up = i.state == InstanceState::Running as i32;
                    if up && !i.node_group.is_empty() && !i.creating {
                        grown.push((i.name.clone(), i.clone()));
                    }
                    (i.name, up)
                })
                .collect(),
        };
        let mut all = nodes.list(&Default::default()).await?.items;
        let known: std::collections::BTreeSet<String> =
            all.iter().filter_map(|n| n.metadata.name.clone()).collect();
        let mut taken: std::collections::BTreeSet<String> = all
            .iter()
            .filter_map(|n| n.spec.as_ref()?.pod_cidr.clone())
            .collect();
        for (name, instance) in grown.into_iter().filter(|(n, _)| !known.contains(n)) {
            let Some(cidr) = (0..=255)
                .map(|i| format!("10.244.{i}.0/24"))
                .find(|c| !taken.contains(c))
            else {
                anyhow::bail!("no pod CIDR left for {name}");
            };
            register_node(&client, &name, &Kubelet::of(&instance, &cidr)).await?;
            taken.insert(cidr);
            all.push(nodes.get(&name).await?);
        }
        let now = seconds(k8s_openapi::jiff::Timestamp::now());
        for n in &all {
            let name = n.metadata.name.clone().unwrap_or_default();
            let status = if running.get(&name).copied().unwrap_or(false) {
                "True"
            } else {
                "Unknown"
            };
            // As a kubelet's status updates: the heartbeat every time, the
            // transition when the status changes.
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
            let since = ready
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.as_ref())
                .map_or_else(|| now.clone(), |t| seconds(t.0));
            let patch = json!({"status": {"conditions": [{
                "type": "Ready", "status": status, "reason": "SimulatedKubelet",
                "lastHeartbeatTime": now, "lastTransitionTime": since,
            }]}});
            let _ = nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await;
        }
        self.request_serving_certificates(&all).await
    }

    /// As kubelets with `serverTLSBootstrap` do once their node is
    /// initialised: each asks (as itself) for a serving certificate for its
    /// addresses and hostname, with an ECDSA key; once per node.
    async fn request_serving_certificates(&self, nodes: &[Node]) -> anyhow::Result<()> {
        let admin = ccm_runtime::kube::client(Some(&self.kubeconfig)).await?;
        let csrs: Api<CertificateSigningRequest> = Api::all(admin);
        let asked: std::collections::BTreeSet<String> = csrs
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let csr_name = format!("serving-{name}");
            let initialised = !node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == fixtures::UNINITIALIZED));
            if !initialised || asked.contains(&csr_name) {
                continue;
            }
            let addresses = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default();
            let csr = serving_csr(&csr_name, &name, &addresses)?;
            let as_kubelet: Api<CertificateSigningRequest> =
                Api::all(self.kubelet_client(&name).await?);
            if let Err(e) = as_kubelet.create(&Default::default(), &csr).await {
                tracing::debug!(node = %name, error = %e, "serving CSR not created");
            }
        }
        Ok(())
    }

    /// A kube client acting as the kubelet of `node` (impersonation).
    pub async fn kubelet_client(&self, node: &str) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        config.auth_info.impersonate = Some(format!("system:node:{node}"));
        config.auth_info.impersonate_groups = Some(vec!["system:nodes".into()]);
        Ok(kube::Client::try_from(config)?)
    }

    /// What a person wants to see: nodes initialised, load balancer addresses,
    /// routes.
    pub async fn progress(&self) -> anyhow::Result<Progress> {
        let client = ccm_runtime::kube::client(Some(&self.kubeconfig)).await?;
        let nodes = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await?
            .items;
        let initialised = nodes.iter().filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == fixtures::UNINITIALIZED))
        });
        let serving_approved = Api::<CertificateSigningRequest>::all(client.clone())
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Approved"))
            })
            .count();
        // Load balancers only: the gateway's own Service is none.
        let services: Vec<Service> = Api::<Service>::all(client)
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
            .collect();
        let ips: Vec<String> = services
            .iter()
            .filter_map(|s| {
                s.status
                    .as_ref()?
                    .load_balancer
                    .as_ref()?
                    .ingress
                    .as_ref()?
                    .first()
                    .and_then(|i| i.ip.clone().or_else(|| i.hostname.clone()))
            })
            .collect();
        let routes = self
            .gateway_client("route")?
            .list_routes()
            .await
            .map(|r| r.len())
            .unwrap_or(0);
        Ok(Progress {
            nodes: nodes.len(),
            initialised: initialised.count(),
            services: services.len(),
            ips,
            routes,
            serving_approved,
        })
    }
}

/// A sim instance's internal IP (empty if it has none).
pub fn internal_ip(instance: &ccm_proto::v1::SimInstance) -> String {
    instance
        .addresses
        .iter()
        .find(|a| a.r#type == ccm_proto::v1::NodeAddressType::InternalIp as i32)
        .map(|a| a.address.clone())
        .unwrap_or_default()
}

/// A process's resident memory now and at its peak, in MiB (`VmRSS`,
/// `VmHWM`; Linux).
pub fn resident_mib(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// A time as the API writes one: RFC 3339, whole seconds.
fn seconds(t: k8s_openapi::jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// What a simulated kubelet registers its Node with besides its name: its
/// address and pod CIDR, its flags (`--node-labels`,
/// `--register-with-taints`) and what it reads off its machine.
#[derive(Clone, Debug, Default)]
pub struct Kubelet {
    /// Its internal IP.
    pub ip: String,
    pub pod_cidr: String,
    /// `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`: `(key, value, effect)`.
    pub taints: Vec<(String, String, String)>,
    /// Capacity (cpu, memory, pods, GPUs), all of it allocatable.
    pub capacity: BTreeMap<String, String>,
}

impl Kubelet {
    /// The kubelet of a sim instance: a node group's launches it with the
    /// group's labels and taints.
    pub fn of(instance: &ccm_proto::v1::SimInstance, pod_cidr: &str) -> Self {
        Self {
            ip: internal_ip(instance),
            pod_cidr: pod_cidr.to_owned(),
            labels: if instance.node_group.is_empty() {
                BTreeMap::new()
            } else {
                instance.labels.clone().into_iter().collect()
            },
            taints: instance
                .taints
                .iter()
                .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                .collect(),
            capacity: instance.capacity.clone().into_iter().collect(),
        }
    }

    /// A kubelet with only an address and a pod CIDR.
    pub fn at(ip: &str, pod_cidr: &str) -> Self {
        Self {
            ip: ip.to_owned(),
            pod_cidr: pod_cidr.to_owned(),
            ..Self::default()
        }
    }
}

/// Registers the Node `name` as its kubelet would with
/// `--cloud-provider=external`: tainted uninitialised beside the taints it
/// is told to register, labelled as told, Ready (since now), with its
/// hostname, internal IP, pod CIDR and capacity.
pub async fn register_node(
    client: &kube::Client,
    name: &str,
    kubelet: &Kubelet,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut n = node(name)
        .uninitialized()
        .pod_cidr(&kubelet.pod_cidr)
        .address("Hostname", name)
        .address("InternalIP", &kubelet.ip)
        .ready();
    for (key, value) in &kubelet.labels {
        n = n.label(key, value);
    }
    for (key, value, effect) in &kubelet.taints {
        n = n.taint(key, Some(value.as_str()).filter(|v| !v.is_empty()), effect);
    }
    let n = n.build();
    let mut status = serde_json::to_value(&n.status)?;
    if !kubelet.capacity.is_empty() {
        status["capacity"] = json!(kubelet.capacity);
        status["allocatable"] = json!(kubelet.capacity);
    }
    let now = seconds(k8s_openapi::jiff::Timestamp::now());
    for condition in status["conditions"].as_array_mut().into_iter().flatten() {
        condition["lastHeartbeatTime"] = json!(now);
        condition["lastTransitionTime"] = json!(now);
    }
    loop {
        match nodes.create(&PostParams::default(), &n).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    Ok(())
}

/// Registers the CSI node plugin on `socket` as the kubelet does once
/// node-driver-registrar announces it: asks it `NodeGetInfo`, then writes
/// the Node's CSINode entry (its node ID, topology keys and volume limit)
/// and labels the Node with its topology, which the external-provisioner
/// reads to place volumes.
pub async fn register_plugin(
    client: &kube::Client,
    node: &str,
    socket: &Path,
) -> anyhow::Result<()> {
    use ccm_proto::csi;
    let channel = csi_node::channel(socket).await?;
    let driver = csi::identity_client::IdentityClient::new(channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner()
        .name;
    let info = csi::node_client::NodeClient::new(channel)
        .node_get_info(csi::NodeGetInfoRequest {})
        .await?
        .into_inner();
    let topology = info
        .accessible_topology
        .map(|t| t.segments)
        .unwrap_or_default();
    let csi_node = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{
            "name": driver,
            "nodeID": info.node_id,
            "topologyKeys": topology.keys().collect::<Vec<_>>(),
            "allocatable": {"count": info.max_volumes_per_node},
        }]},
    });
    let csi_nodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(client.clone());
    match csi_nodes
        .create(&PostParams::default(), &serde_json::from_value(csi_node)?)
        .await
    {
        Ok(_) => {}
        // Registered before this sandbox's run, on the same state.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => {
            return Err(e).with_context(|| format!("register {driver}'s CSINode entry of {node}"));
        }
    }
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": topology}})),
        )
        .await
        .with_context(|| format!("label {node} with {driver}'s topology"))?;
    Ok(())
}

/// A kubelet serving CSR for `node`: its IP addresses and names as SANs,
/// subject `system:node:<node>` in `system:nodes`, an ECDSA P-256 key.
pub fn serving_csr(
    name: &str,
    node: &str,
    addresses: &[k8s_openapi::api::core::v1::NodeAddress],
) -> anyhow::Result<CertificateSigningRequest> {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    p.distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    for a in addresses {
        let san = match a.type_.as_str() {
            "InternalIP" | "ExternalIP" => a.address.parse().ok().map(SanType::IpAddress),
            _ => a.address.as_str().try_into().ok().map(SanType::DnsName),
        };
        if let Some(san) = san.filter(|s| !p.subject_alt_names.contains(s)) {
            p.subject_alt_names.push(san);
        }
    }
    let pem = p.serialize_request(&KeyPair::generate()?)?.pem()?;
    Ok(serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "server auth"],
            "request": data_encoding::BASE64.encode(pem.as_bytes()),
        }
    }))?)
}

/// The sandbox's state as a person sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub nodes: usize,
    pub initialised: usize,
    pub services: usize,
    /// Each Service's load balancer address: an IP, or a DNS name (AWS).
    pub ips: Vec<String>,
    pub routes: usize,
    /// Kubelet serving certificate requests approved.
    pub serving_approved: usize,
}

impl Progress {
    /// Whether everything the sandbox asked for is in place.
    pub fn converged(&self, options: &Options) -> bool {
        self.initialised == options.nodes
            && self.ips.len() == options.services
            && self.routes == options.nodes
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nodes initialised: {}/{}   load balancer addresses: {}/{} [{}]   routes: {}   serving certificates approved: {}",
            self.initialised,
            self.nodes,
            self.ips.len(),
            self.services,
            self.ips.join(", "),
            self.routes,
            self.serving_approved
        )
    }
}
