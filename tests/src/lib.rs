//! The test kit: what the workspace's tests share beside the Kubernetes API
//! test server (crate `kube-test-apiserver`) and the sandbox (crate
//! `ccm-sandbox`): a gateway and a controller in-process ([`env`](mod@env)),
//! simulated kubelets ([`kubelet`]), a trace collector ([`otlp`]), the
//! Helm chart rendered ([`chart`]) and sandboxes driven from a test
//! ([`scenario`]). The end-to-end tests are this crate's
//! `tests/`.

pub mod chart;
pub mod env;
pub mod kubelet;
pub mod otlp;
pub mod scenario;

use std::path::{Path, PathBuf};

/// The directory of the workspace's binaries, from a test: tests run from
/// `<target>/<profile>/deps`, and `cargo nextest run --workspace` (or
/// `cargo test --workspace`) builds every binary of the workspace into
/// `<target>/<profile>` before any test runs.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe.parent().expect("a test lives in a directory");
    let dir = if dir.ends_with("deps") {
        dir.parent().expect("deps lives in the profile's directory")
    } else {
        dir
    };
    dir.to_path_buf()
}

/// The stock `cluster-autoscaler` binary the tests run (built with its
/// `externalgrpc` provider): `CLUSTER_AUTOSCALER`, else the 1.30.0 build in
/// `../shared/bin` beside the repository. `None`, with a message naming the
/// variable, where neither is there: the test that needs it then says it
/// was skipped and passes.
pub fn cluster_autoscaler(test: &str) -> Option<PathBuf> {
    shared_binary(
        test,
        ccm_sandbox::autoscaler::ENV,
        "cluster-autoscaler-v1.30.0",
        "a cluster-autoscaler binary built with its externalgrpc provider",
    )
}

/// The CSI project's conformance suite, `csi-sanity`: `CSI_SANITY`, else
/// the v5.4.0-36 build in `../shared/bin`; `None` as
/// [`cluster_autoscaler`].
pub fn csi_sanity(test: &str) -> Option<PathBuf> {
    shared_binary(test, "CSI_SANITY", "csi-sanity-v5.4.0-36", "csi-sanity")
}

/// Kubernetes CSI's external-provisioner and external-attacher sidecars:
/// `CSI_PROVISIONER` and `CSI_ATTACHER`, else the builds in
/// `../shared/bin`; `None` as [`cluster_autoscaler`] where either is
/// missing.
pub fn csi_sidecars(test: &str) -> Option<(PathBuf, PathBuf)> {
    Some((
        shared_binary(
            test,
            "CSI_PROVISIONER",
            "csi-provisioner-v6.3.0-56",
            "external-provisioner",
        )?,
        shared_binary(
            test,
            "CSI_ATTACHER",
            "csi-attacher-v4.12.0-39",
            "external-attacher",
        )?,
    ))
}

/// Kubernetes CSI's external-resizer, and external-snapshotter's
/// csi-snapshotter sidecar and snapshot-controller: `CSI_RESIZER`,
/// `CSI_SNAPSHOTTER` and `SNAPSHOT_CONTROLLER`, else builds of the same
/// names in `../shared/bin` (the README says how to build them); `None` as
/// [`cluster_autoscaler`] where any is missing.
pub fn csi_more_sidecars(test: &str) -> Option<(PathBuf, PathBuf, PathBuf)> {
    Some((
        shared_binary(
            test,
            "CSI_RESIZER",
            "csi-resizer-v2.1.0-41",
            "external-resizer",
        )?,
        shared_binary(
            test,
            "CSI_SNAPSHOTTER",
            "csi-snapshotter-v8.6.0-56",
            "external-snapshotter's csi-snapshotter",
        )?,
        shared_binary(
            test,
            "SNAPSHOT_CONTROLLER",
            "snapshot-controller-v8.6.0-56",
            "external-snapshotter's snapshot-controller",
        )?,
    ))
}

/// A third-party binary a test runs: the file `env` names, else `file` in
/// `../shared/bin` beside the repository, else `None` with a message.
fn shared_binary(test: &str, env: &str, file: &str, what: &str) -> Option<PathBuf> {
    let from_env = std::env::var_os(env).map(PathBuf::from);
    let shared = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/bin")
        .join(file);
    let found = from_env.or_else(|| shared.is_file().then_some(shared));
    if found.is_none() {
        eprintln!("SKIPPED {test}: no {what}: set {env} to one (e.g. ../shared/bin/{file})");
    }
    found
}

/// Runs the Python `script` with boto3 against moto at `endpoint` (its
/// `sys.argv[1]`; the sandbox's region is `sys.argv[2]`, `args` follow),
/// and reads what it printed as JSON: an independent client's view of the
/// emulated account.
pub fn boto3(script: &str, endpoint: &str, args: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new("python3")
        .args(["-c", script, endpoint, ccm_sandbox::aws::REGION])
        .args(args)
        .output()
        .expect("run python3 with boto3");
    assert!(
        out.status.success(),
        "boto3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("boto3's script prints JSON")
}

/// How many modifications EC2 (moto at `endpoint`) has made of the EBS
/// volume `id`, as boto3 reads them (`describe_volumes_modifications`).
pub fn ebs_modifications(endpoint: &str, id: &str) -> u64 {
    let script = "import boto3, json, sys\n\
        ec2 = boto3.client('ec2', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        m = ec2.describe_volumes_modifications(VolumeIds=[sys.argv[3]])['VolumesModifications']\n\
        print(json.dumps(len(m)))\n";
    boto3(script, endpoint, &[id]).as_u64().expect("a count")
}

/// What `kubectl ccm` answered: its exit code, stdout and stderr.
#[derive(Debug)]
pub struct PluginAnswer {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl PluginAnswer {
    /// The `-o json` answer.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Runs `kubectl ccm <args>` as an operator would: kubectl from `PATH`
/// finds the plugin (`kubectl-ccm`, built beside the tests) on `PATH`;
/// `--kubeconfig` names the cluster.
pub fn kubectl_ccm(kubeconfig: &std::path::Path, args: &[&str]) -> PluginAnswer {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![bin_dir()];
    dirs.extend(std::env::split_paths(&path));
    let out = std::process::Command::new("kubectl")
        .arg("ccm")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("PATH", std::env::join_paths(dirs).expect("a PATH"))
        .output()
        .expect("run kubectl (it is on PATH on a machine set up by .ci/run)");
    PluginAnswer {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The summary the soak (and its upgrade run) prints last on stderr, as
/// JSON; the test fails with everything the soak said when there is none.
pub fn soak_summary(out: &std::process::Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    stderr
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary; the soak said:\n{stderr}"))
}
