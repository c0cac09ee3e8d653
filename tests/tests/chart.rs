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
        "gateway.provider=sim",
        "--set",
        "routeController.enabled=false",
        "--set",
        "nodeController.replicas=3",
    ])
    .unwrap();
    let docs = kube_test_apiserver::documents(&out).unwrap();
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
    // Everything in the release's namespace, but the bindings that let
    // the controllers read how kube-apiserver's front proxy is recognised,
    // which live where that ConfigMap and its reader Role are.
    let elsewhere: Vec<_> = docs
        .iter()
        .filter(|d| !d["metadata"]["namespace"].is_null() && d["metadata"]["namespace"] != "cloud")
        .collect();
    assert!(
        elsewhere.iter().all(|d| d["kind"] == "RoleBinding"
            && d["metadata"]["namespace"] == "kube-system"
            && d["roleRef"]["name"] == "extension-apiserver-authentication-reader"),
        "{elsewhere:?}"
    );
}

/// Installed as it comes on a real cluster, a default sim would know none
/// of its machines: nodes would keep the uninitialized taint and the node
/// controller would delete every NotReady Node. So the chart renders
/// nothing until `gateway.provider` names a provider it has.
#[test]
fn the_chart_renders_nothing_without_a_known_provider() {
    let missing = ccm_testkit::chart::run(&["render"])
        .unwrap_err()
        .to_string();
    let (_, why) = missing.split_once("failed:").unwrap();
    for part in [
        "gateway.provider is required",
        "aws",
        "sim (the simulated cloud",
        "throwaway cluster",
    ] {
        assert!(why.contains(part), "{part} missing from {why}");
    }
    let unknown = ccm_testkit::chart::run(&["render", "--set", "gateway.provider=cloudy"])
        .unwrap_err()
        .to_string();
    let (_, why) = unknown.split_once("failed:").unwrap();
    for part in ["provider", "aws", "sim"] {
        assert!(why.contains(part), "{part} missing from {why}");
    }
}

/// Every PromQL query of the rendered dashboard and alert rules.
fn monitoring_queries() -> Vec<String> {
    let docs = ccm_testkit::chart::render_objects(
        &[],
        &[
            "gateway.provider=sim".into(),
            "grafanaDashboard.enabled=true".into(),
            "prometheusRule.enabled=true".into(),
            "volumes.enabled=true".into(),
        ],
    )
    .unwrap();
    let mut queries = Vec::new();
    for d in &docs {
        if d["kind"] == "ConfigMap" && d["metadata"]["name"] == "ccm-dashboard" {
            let dashboard: serde_json::Value =
                serde_json::from_str(d["data"]["cloud-controller-manager.json"].as_str().unwrap())
                    .unwrap();
            for panel in dashboard["panels"].as_array().unwrap() {
                for target in panel["targets"].as_array().into_iter().flatten() {
                    queries.push(target["expr"].as_str().unwrap().to_owned());
                }
            }
        }
        if d["kind"] == "PrometheusRule" {
            for group in d["spec"]["groups"].as_array().unwrap() {
                for rule in group["rules"].as_array().unwrap() {
                    queries.push(rule["expr"].as_str().unwrap().to_owned());
                }
            }
        }
    }
    queries
}

/// The names of our metrics a query uses (PromQL functions, labels and
/// keywords never start with our prefixes).
fn metric_names(query: &str) -> Vec<String> {
    const OURS: [&str; 6] = [
        "node_controller_",
        "service_controller_",
        "route_controller_",
        "volume_controller_",
        "cloud_gateway_",
        "ccm_",
    ];
    query
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| OURS.iter().any(|p| t.starts_with(p)))
        .map(str::to_owned)
        .collect()
}

/// The metric families a `/metrics` body declares (`# TYPE name kind`).
fn declared(body: &str) -> std::collections::BTreeSet<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Whether `name` as a query names it (a family, or one of its series:
/// `_total` of a counter, `_bucket`/`_sum`/`_count` of a histogram) is
/// among `families`.
fn exported(name: &str, families: &std::collections::BTreeSet<String>) -> bool {
    families.contains(name)
        || ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| {
                name.strip_suffix(suffix)
                    .is_some_and(|f| families.contains(f))
            })
}

/// The dashboard and the alerts use only metrics the binaries export, and
/// export from the start, before any sample: a panel or an alert on a
/// missing name would stay empty, or never fire, without anyone noticing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_alerts_use_only_metrics_the_binaries_export() {
    let queries = monitoring_queries();
    assert!(queries.len() >= 25, "{} queries", queries.len());
    for q in &queries {
        assert!(!metric_names(q).is_empty(), "{q} names none of our metrics");
    }

    let dir = tempfile::tempdir().unwrap();
    // The volume controller too, as the chart runs it with volumes on.
    let sandbox = ccm_sandbox::Sandbox::start(ccm_sandbox::Options {
        volumes: true,
        ..ccm_sandbox::Options::new(dir.path().join("state"), ccm_testkit::bin_dir())
    })
    .await
    .unwrap();
    // Scraped before the processes did any work: nothing is observed yet.
    let mut families = std::collections::BTreeSet::new();
    for (name, url) in &sandbox.endpoints {
        if !name.ends_with("admin") {
            continue;
        }
        let addr: std::net::SocketAddr = url.trim_start_matches("https://").parse().unwrap();
        let body = ccm_testkit::env::eventually(&format!("{name} /metrics"), || async {
            let token = Some(kube_test_apiserver::ADMIN_TOKEN);
            match ccm_sandbox::admin::admin_get(addr, "/metrics", token).await {
                Ok((200, body)) => Some(body),
                _ => None,
            }
        })
        .await;
        families.extend(declared(&body));
    }
    sandbox.stop().await;
    let mut missing: Vec<String> = queries
        .iter()
        .flat_map(|q| metric_names(q))
        .filter(|name| !exported(name, &families))
        .collect();
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "the chart's monitoring names metrics no binary exports: {missing:?}\nexported: {families:?}"
    );
}
