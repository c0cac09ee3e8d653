//! Which release a process is, as RELEASING.md defines one: one version
//! for the workspace and the chart, and every binary naming it with the
//! commit it was built from.

use std::process::Command;

use ccm_testkit::bin_dir;

/// The binaries a release ships, and the tools people run beside them.
const BINARIES: &[&str] = &[
    "cloud-gateway",
    "node-controller",
    "service-controller",
    "route-controller",
    "kubectl-ccm",
    "gateway-conformance",
    "kube-test-apiserver",
    "sandbox",
    "simctl",
];

fn workspace_version() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    // `version = "x.y.z"` under `[workspace.package]`.
    let package = manifest.split("[workspace.package]").nth(1).unwrap();
    let line = package.lines().find(|l| l.starts_with("version")).unwrap();
    line.split('"').nth(1).unwrap().to_owned()
}

#[test]
fn every_binary_names_the_release_and_the_commit_it_was_built_from() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8(head.stdout).unwrap().trim().to_owned();
    let version = workspace_version();
    for binary in BINARIES {
        let out = Command::new(bin_dir().join(binary))
            .arg("--version")
            .output()
            .unwrap();
        assert!(out.status.success(), "{binary} --version");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.trim_end()
                .ends_with(&format!("{version} (commit {head})")),
            "{binary}: {text}"
        );
    }
}

#[test]
fn the_chart_is_the_same_release() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let chart =
        std::fs::read_to_string(root.join("helm/cloud-controller-manager/Chart.yaml")).unwrap();
    let chart: serde_json::Value = serde_norway::from_str(&chart).unwrap();
    let version = workspace_version();
    assert_eq!(chart["version"], version.as_str());
    assert_eq!(chart["appVersion"], version.as_str());
}
