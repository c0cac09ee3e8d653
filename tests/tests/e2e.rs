//! End to end through the real binaries: the sandbox starts the API
//! server, the gateway and two replicas of every controller as processes,
//! registers nodes as kubelets would and creates LoadBalancer Services; it
//! exits 0 only once every node is initialised, every Service has an
//! ingress IP and every pod CIDR has a route.

use std::path::Path;
use std::process::Command;

#[test]
fn the_sandbox_converges_with_real_processes() {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_sandbox"))
        .parent()
        .unwrap()
        .to_path_buf();
    for binary in [
        "cloud-gateway",
        "node-controller",
        "service-controller",
        "route-controller",
    ] {
        assert!(
            bin_dir.join(binary).is_file(),
            "{binary} is not built next to the sandbox: run the workspace's tests (make test) or cargo build --bins"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox"))
        .args([
            "--nodes",
            "4",
            "--services",
            "2",
            "--replicas",
            "2",
            "--exit-when-ready",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sandbox failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("nodes initialised: 4/4"), "{stdout}");
    assert!(stdout.contains("load balancer IPs: 2/2"), "{stdout}");
    assert!(stdout.contains("routes: 4"), "{stdout}");
    let endpoints: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("state/endpoints.json")).unwrap(),
    )
    .unwrap();
    for key in [
        "kube_api",
        "gateway",
        "admin_token_file",
        "node-controller-0_admin",
        "route-controller-1_admin",
    ] {
        assert!(
            endpoints.get(key).is_some(),
            "{key} missing from endpoints.json"
        );
    }
}
