//! The Helm chart, rendered by a real Helm engine through `helm/check.py`
//! (Python, helm-python-sdk; `make test` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

/// `helm/check.py` of this workspace.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/check.py")
}

/// Runs `helm/check.py` with `args`, returning its stdout.
pub fn run(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .output()
        .context("run python3 helm/check.py (python3 with tests/requirements.txt installed)")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "helm/check.py {} failed:\n{stdout}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Renders the chart as the sandbox plays it (release `ccm` in
/// `kube-system`) with `sets` (`dotted.key=value`) into `path`.
pub fn render_to(path: &Path, sets: &[&str]) -> anyhow::Result<()> {
    let mut args = vec!["render", "--release", ccm_sandbox::RELEASE];
    args.extend(["--namespace", ccm_sandbox::NAMESPACE]);
    for set in sets {
        args.extend(["--set", set]);
    }
    std::fs::write(path, run(&args)?)?;
    Ok(())
}

/// Renders the chart (release `ccm` in `kube-system`) with the values files
/// `values` and `sets` on top, and returns its objects.
pub fn render_objects(values: &[&Path], sets: &[String]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut args: Vec<String> = vec![
        "render".into(),
        "--release".into(),
        ccm_sandbox::RELEASE.into(),
        "--namespace".into(),
        ccm_sandbox::NAMESPACE.into(),
    ];
    for file in values {
        args.extend(["--values".into(), file.display().to_string()]);
    }
    for set in sets {
        args.extend(["--set".into(), set.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kube_test_apiserver::documents(&run(&args)?).map_err(anyhow::Error::msg)
}
