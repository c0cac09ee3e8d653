//! Version skew, proven through the real binaries: the sandbox starts on
//! the previous release's gateway and controllers
//! (`tools/previous-release/release.toml`, built once by its `build.sh`),
//! settles, and the soak's upgrade run replaces them with this build's one
//! process at a time, in both orders, with churn going and the old and new
//! side by side after each step. Nothing may be lost or repeated: the
//! soak's invariants hold throughout, the objects settled before the
//! upgrade keep their load balancers, addresses, Nodes and routes with no
//! create or delete of theirs in the gateway's audit log, a new leader's
//! first pass (and a new gateway's) writes nothing to the cloud, and
//! everything converges after.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The previous release's binaries, built (or found built) by the script
/// `make test` runs before the tests.
fn previous_release() -> PathBuf {
    let target = ccm_testkit::bin_dir().parent().unwrap().to_path_buf();
    let out = Command::new("bash")
        .arg(root().join("tools/previous-release/build.sh"))
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("run tools/previous-release/build.sh");
    assert!(
        out.status.success(),
        "the previous release could not be built:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn commit_of(binary: &std::path::Path) -> String {
    let out = Command::new(binary).arg("--version").output().unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    // `cloud-gateway 0.1.0 (commit 99fd8af2469b)`
    line.split("commit ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .unwrap_or_else(|| panic!("no commit in {line:?}"))
        .to_owned()
}

fn upgrade(order: &str) {
    let previous = previous_release();
    let release =
        std::fs::read_to_string(root().join("tools/previous-release/release.toml")).unwrap();
    for component in [
        "cloud-gateway",
        "node-controller",
        "service-controller",
        "route-controller",
    ] {
        let old = commit_of(&previous.join(component));
        assert!(
            release.contains(&format!("commit = \"{old}")),
            "{component} of {} is not of the commit release.toml names ({old})",
            previous.display()
        );
        assert_ne!(
            old,
            commit_of(&ccm_testkit::bin_dir().join(component)),
            "the previous release and this build are the same commit"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ccm_testkit::bin_dir().join("soak"))
        .args(["--upgrade-order", order, "--upgrade-from"])
        .arg(&previous)
        .args([
            "--side-by-side",
            "10s",
            "--handover",
            "10s",
            "--warm-up",
            "10s",
            "--window",
            "20s",
            "--nodes",
            "4",
            "--services",
            "3",
            "--churn-every",
            "2s",
            "--sample-every",
            "5s",
            "--seed",
            "48",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .output()
        .expect("run the soak (built with the workspace's binaries)");
    let summary = ccm_testkit::soak_summary(&out);
    assert_eq!(summary["violations"], serde_json::json!([]), "{summary:#}");
    assert!(
        summary["converged_s"].is_number(),
        "did not converge: {summary:#}"
    );
    assert!(out.status.success(), "{summary:#}");
    // Every process was replaced, each component's last one as a handover,
    // and each controller's leader restarted once more.
    let steps = summary["faults"].as_object().unwrap();
    for step in [
        "cloud-gateway replaced (handover)",
        "node-controller-0 replaced",
        "node-controller-1 replaced",
        "service-controller-0 replaced",
        "service-controller-1 replaced",
        "route-controller-0 replaced",
        "route-controller-1 replaced",
    ] {
        assert!(
            steps.keys().any(|k| k.starts_with(step)),
            "no step {step:?}: {summary:#}"
        );
    }
    let count = |suffix: &str| steps.keys().filter(|k| k.ends_with(suffix)).count();
    assert_eq!(count("replaced (handover)"), 4, "{summary:#}");
    assert_eq!(count("restarted (handover)"), 3, "{summary:#}");
    // Churn went on meanwhile, the cloud changing under it.
    let churn = summary["churn"].as_object().unwrap();
    let done: u64 = churn.values().filter_map(Value::as_u64).sum();
    assert!(done >= 3, "{summary:#}");
    assert!(
        [
            "node joins",
            "node terminated",
            "Service created",
            "Service changed",
            "Service deleted"
        ]
        .iter()
        .any(|a| churn.contains_key(*a)),
        "{summary:#}"
    );
}

#[test]
fn the_gateway_upgraded_first_then_each_controller_loses_and_repeats_nothing() {
    upgrade("gateway-first");
}

#[test]
fn the_controllers_upgraded_first_then_the_gateway_loses_and_repeats_nothing() {
    upgrade("controllers-first");
}
