//! The test kit: what the workspace's tests share beside the Kubernetes API
//! test server (crate `kube-test-apiserver`) and the sandbox (crate
//! `ccm-sandbox`): a gateway and a controller in-process ([`env`](mod@env)),
//! simulated kubelets ([`kubelet`]), a trace collector ([`otlp`]) and the
//! Helm chart rendered ([`chart`]). The end-to-end tests are this crate's
//! `tests/`.

pub mod chart;
pub mod env;
pub mod kubelet;
pub mod otlp;

use std::path::PathBuf;

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
