//! The Helm chart through a real Helm engine: lint, renders with defaults,
//! with each component off and with the options, the values schema refusing
//! bad values, and every manifest valid against the Kubernetes schemas (all
//! in helm/check.py). Least privilege is proven in e2e.rs, where the API
//! server enforces the rendered RBAC.

#[test]
fn the_chart_lints_renders_refuses_bad_values_and_validates() {
    let out = ccm_testkit::chart::run(&["check"]).unwrap();
    assert!(out.contains("chart checks passed"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
}

#[test]
fn a_person_can_render_the_chart_with_their_values() {
    let out = ccm_testkit::chart::run(&[
        "render",
        "--release",
        "edge",
        "--namespace",
        "cloud",
        "--set",
        "routeController.enabled=false",
        "--set",
        "nodeController.replicas=3",
    ])
    .unwrap();
    let docs = ccm_testkit::apiserver::documents(&out).unwrap();
    let deployments: Vec<(&str, i64)> = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap(),
                d["spec"]["replicas"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        deployments,
        [
            ("edge-node-controller", 3),
            ("edge-service-controller", 2),
            ("edge-gateway", 1)
        ]
    );
    assert!(
        docs.iter()
            .all(|d| d["metadata"]["namespace"].is_null() || d["metadata"]["namespace"] == "cloud")
    );
}
