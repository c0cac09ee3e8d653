//! The chaos soak at smoke size, through its real binary: two minutes of
//! churn (made-up Services whose UIDs collide with real ones' in the load
//! balancer name among it), cloud faults and every process (the API
//! server and the gateway included) killed or frozen in turn, with the
//! invariants checked all along; then convergence with nothing leaked.

use std::process::Command;

#[test]
fn two_minutes_of_chaos_break_no_invariant_and_the_system_converges() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ccm_testkit::bin_dir().join("soak"))
        .args([
            "--duration",
            "120s",
            "--warm-up",
            "20s",
            "--window",
            "40s",
            "--nodes",
            "4",
            "--services",
            "3",
            "--chaos-every-min",
            "5s",
            "--chaos-every-max",
            "9s",
            "--freeze-min",
            "5s",
            "--freeze-max",
            "12s",
            "--dead-min",
            "1s",
            "--dead-max",
            "4s",
            "--churn-every",
            "2s",
            "--cloud-fault-every",
            "25s",
            "--cloud-fault-for",
            "10s",
            "--sample-every",
            "2s",
            "--seed",
            "32",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .output()
        .expect("run the soak (built with the workspace's binaries)");
    let report = String::from_utf8_lossy(&out.stdout);
    let summary = ccm_testkit::soak_summary(&out);
    assert_eq!(summary["violations"], serde_json::json!([]), "{summary:#}");
    assert!(
        summary["converged_s"].is_number(),
        "did not converge: {summary:#}"
    );
    assert_eq!(summary["passed"], true, "{summary:#}");
    assert!(out.status.success(), "{summary:#}");
    // Every process was hit, each with one fault or another.
    let faults = summary["faults"].as_object().unwrap();
    for component in [
        "kube-test-apiserver",
        "cloud-gateway",
        "node-controller",
        "service-controller",
        "route-controller",
    ] {
        assert!(
            faults.keys().any(|k| k.ends_with(&format!(" {component}"))),
            "{component} never killed or frozen: {summary:#}"
        );
    }
    assert!(
        faults
            .keys()
            .any(|k| !k.starts_with("kill") && !k.starts_with("freeze")),
        "no cloud fault window: {summary:#}"
    );
    let churn = summary["churn"].as_object().unwrap();
    for action in ["node joins", "Service created", "greedy certificate asked"] {
        assert!(churn.contains_key(action), "no {action}: {summary:#}");
    }
    // A few rounds of another tool asking for a load balancer for a
    // made-up Service whose UID collides with a real one's in the name,
    // answered or refused, and deleted again.
    let times = |action: &str| churn.get(action).and_then(|n| n.as_u64()).unwrap_or(0);
    assert!(
        times("colliding Service ensured") + times("colliding Service refused") >= 2,
        "fewer than two collision rounds: {summary:#}"
    );
    assert!(
        times("colliding Service deleted") >= 2,
        "fewer than two made-up load balancers deleted: {summary:#}"
    );
    assert!(
        report.contains("| invariant violations | 0 | 0 | yes |"),
        "{report}"
    );
}
