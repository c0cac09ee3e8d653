//! The benchmark harness at smoke size: every scenario runs for both
//! profiles on the real binaries and the report has every row. Correctness
//! only; timings on shared CI machines prove nothing, so none is asserted
//! (BENCHMARKS.md holds the measured figures).

use std::process::Command;

#[test]
fn the_benchmark_harness_runs_every_scenario_for_both_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("BENCHMARKS.md");
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--smoke")
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .arg("--out")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&report).unwrap();
    for scenario in [
        "| 1. ", "| 2. ", "| 3. ", "| 4. ", "| 5. ", "| 6. ", "| 7. ", "| 8. ",
    ] {
        assert!(text.contains(scenario), "{scenario} missing:\n{text}");
    }
    // Both profiles measured where the scenario compares them.
    let compared = text
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("×"))
        .count();
    assert!(compared >= 7, "{text}");
    // Our profile batches: fewer provider lookups than one per node.
    let calls = text
        .lines()
        .find(|l| l.contains("provider lookup calls"))
        .unwrap();
    let cells: Vec<&str> = calls.split('|').map(str::trim).collect();
    let ours: f64 = cells[3].split(' ').next().unwrap().parse().unwrap();
    let upstream: f64 = cells[4].split(' ').next().unwrap().parse().unwrap();
    assert_eq!(
        upstream, 20.0,
        "the upstream profile looks up each node once"
    );
    assert!(ours < upstream, "{calls}");
    // The charts of the same run, beside the report and linked from it.
    for plot in ["join-nodes.svg", "join-calls.svg", "latency.svg"] {
        assert!(
            text.contains(&format!("](benchmarks/{plot})")),
            "{plot} not linked:\n{text}"
        );
        let svg = std::fs::read_to_string(dir.path().join("benchmarks").join(plot)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{plot}: {svg}"
        );
    }
    let joining = std::fs::read_to_string(dir.path().join("benchmarks/join-nodes.svg")).unwrap();
    assert_eq!(
        joining.matches("<polyline").count(),
        2,
        "ours and the upstream profile"
    );
}
