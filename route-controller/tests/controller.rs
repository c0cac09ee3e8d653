//! The route controller against the test API server and an in-process
//! gateway on the simulated cloud: upstream's route checklist, watch-based
//! triggering, bounded concurrency at scale, and leader-only writes.

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_proto::RetryPolicy;
use ccm_proto::v1::{Faults, Route};
use ccm_provider::Operation;
use ccm_testkit::env::{TestController, TestEnv, eventually};
use clap::Parser;
use cloud_gateway::identity::Role;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_test_apiserver::fixtures::node;
use route_controller::args::{Args, Settings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type Controller = TestController;

async fn start(env: &TestEnv, extra: &[&str]) -> Controller {
    let mut flags = vec!["route-controller".to_owned()];
    flags.extend(env.controller_flags(Role::Route));
    flags.extend(
        [
            "--cluster-cidr",
            "10.0.0.0/8,fd00:10::/56",
            "--min-route-reconcile-interval",
            "100ms",
            "--route-reconciliation-period",
            "1h",
        ]
        .map(String::from),
    );
    flags.extend(extra.iter().map(|s| s.to_string()));
    let settings = Settings::from_args(&Args::try_parse_from(flags).unwrap()).unwrap();
    let stop = CancellationToken::new();
    let running = route_controller::start(settings, stop.clone())
        .await
        .unwrap();
    TestController::new(running, stop)
}

async fn routes(env: &TestEnv) -> Vec<Route> {
    env.gateway_client(Role::Route).list_routes().await.unwrap()
}

async fn routes_of(env: &TestEnv, node: &str) -> Vec<String> {
    let mut cidrs: Vec<_> = routes(env)
        .await
        .into_iter()
        .filter(|r| r.target_node == node)
        .map(|r| r.destination_cidr)
        .collect();
    cidrs.sort();
    cidrs
}

fn network_condition(n: &Node) -> Option<(String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NetworkUnavailable")?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

async fn condition_becomes(nodes: &Api<Node>, name: &str, status: &str, reason: &str) -> Node {
    eventually(
        &format!("{name}: NetworkUnavailable={status}/{reason}"),
        || async {
            let n = nodes.get(name).await.ok()?;
            (network_condition(&n) == Some((status.into(), reason.into()))).then_some(n)
        },
    )
    .await
}

async fn create(nodes: &Api<Node>, n: impl Into<Node>) -> Node {
    nodes
        .create(&PostParams::default(), &n.into())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_gets_a_route_per_pod_cidr_named_after_its_uid() {
    let env = TestEnv::start().await;
    for name in ["a", "dual"] {
        env.create_instance(name).await;
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start(&env, &[]).await;
    let a = create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    create(
        &nodes,
        node("dual")
            .pod_cidr("10.244.2.0/24")
            .pod_cidr("fd00:10::200/120"),
    )
    .await;
    eventually("routes", || async {
        (routes(&env).await.len() == 3).then_some(())
    })
    .await;
    assert_eq!(routes_of(&env, "a").await, ["10.244.1.0/24"]);
    assert_eq!(
        routes_of(&env, "dual").await,
        ["10.244.2.0/24", "fd00:10::200/120"]
    );
    let route = routes(&env)
        .await
        .into_iter()
        .find(|r| r.target_node == "a")
        .unwrap();
    assert!(
        route.name.contains(&a.metadata.uid.unwrap()),
        "the name hint is the node's UID: {}",
        route.name
    );
    condition_becomes(&nodes, "a", "False", "RouteCreated").await;
    condition_becomes(&nodes, "dual", "False", "RouteCreated").await;
    // Each route's delay from its pod CIDR seen to the route made.
    assert_eq!(
        c.metric("route_controller_route_creation_delay_seconds_count")
            .await,
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_of_unknown_nodes_go_only_inside_the_cluster_cidr() {
    let env = TestEnv::start().await;
    let routes_client = env.gateway_client(Role::Route);
    for (node, cidr) in [
        ("ghost", "10.9.0.0/24"),
        ("other-network", "192.168.5.0/24"),
    ] {
        routes_client
            .create_route(
                "uid",
                Route {
                    target_node: node.into(),
                    destination_cidr: cidr.into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let _c = start(&env, &[]).await;
    eventually("the ghost route deleted", || async {
        let left: Vec<_> = routes(&env)
            .await
            .into_iter()
            .map(|r| r.destination_cidr)
            .collect();
        (left == ["192.168.5.0/24"]).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_node_with_a_new_pod_cidr_gets_its_route_replaced_and_a_deleted_node_loses_it()
{
    let env = TestEnv::start().await;
    env.create_instance("a").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start(&env, &[]).await;
    create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    eventually("first route", || async {
        (routes_of(&env, "a").await == ["10.244.1.0/24"]).then_some(())
    })
    .await;
    // Pod CIDRs are immutable: a new CIDR comes with a re-registered node.
    nodes.delete("a", &DeleteParams::default()).await.unwrap();
    create(&nodes, node("a").pod_cidr("10.244.7.0/24")).await;
    eventually("route replaced", || async {
        (routes_of(&env, "a").await == ["10.244.7.0/24"]).then_some(())
    })
    .await;
    nodes.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("route removed", || async {
        routes(&env).await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_creates_leave_no_route_created_with_an_event_and_are_retried() {
    let env = TestEnv::start().await;
    env.create_instance("a").await;
    env.sim_admin()
        .set_faults(Faults {
            error_rate_by_operation: [("create_route".to_owned(), 1.0)].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start(&env, &[]).await;
    create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    condition_becomes(&nodes, "a", "True", "NoRouteCreated").await;
    let failed = eventually("FailedToCreateRoute", || async {
        env.events("FailedToCreateRoute").await.into_iter().next()
    })
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(failed.note.unwrap().contains("10.244.1.0/24"));
    env.sim_admin().set_faults(Faults::default()).await.unwrap();
    condition_becomes(&nodes, "a", "False", "RouteCreated").await;
    assert_eq!(routes_of(&env, "a").await, ["10.244.1.0/24"]);
    assert!(
        c.metric("route_controller_reconcile_errors_total{error=\"create_failed\"}")
            .await
            >= 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_condition_is_written_only_when_status_or_reason_differ() {
    let env = TestEnv::start().await;
    env.create_instance("a").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let created = create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    // A CNI already reported the network up with its own reason.
    nodes
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp"}
            ]}})),
        )
        .await
        .unwrap();
    let _ = created;
    let _c = start(&env, &["--route-reconciliation-period", "300ms"]).await;
    let n = condition_becomes(&nodes, "a", "False", "RouteCreated").await;
    // Several resyncs later, nothing was written again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        nodes.get("a").await.unwrap().resource_version(),
        n.resource_version()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_node_changes_that_matter_trigger_a_reconcile() {
    let env = TestEnv::start().await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start(&env, &[]).await;
    create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    eventually("route", || async {
        (routes(&env).await.len() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = c.metric("route_controller_route_syncs_total").await;
    nodes
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        c.metric("route_controller_route_syncs_total").await,
        before,
        "a label change does not reconcile"
    );
    nodes
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}}),
            ),
        )
        .await
        .unwrap();
    eventually("an address change reconciles", || async {
        (c.metric("route_controller_route_syncs_total").await > before).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_nodes_get_their_routes_with_bounded_concurrency_and_no_duplicates() {
    let env = TestEnv::start().await;
    env.sim_admin()
        .set_faults(Faults {
            latency: [(
                "create_route".to_owned(),
                prost_types::Duration {
                    seconds: 0,
                    nanos: 5_000_000,
                },
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    futures::future::join_all((0..500).map(|i| {
        let nodes = nodes.clone();
        async move {
            create(
                &nodes,
                node(&format!("n{i:03}")).pod_cidr(&format!(
                    "10.{}.{}.0/24",
                    100 + i / 256,
                    i % 256
                )),
            )
            .await
        }
    }))
    .await;
    let _c = start(&env, &["--concurrent-route-operations", "8"]).await;
    let all = eventually("500 routes", || async {
        let r = routes(&env).await;
        (r.len() >= 500).then_some(r)
    })
    .await;
    let unique: BTreeSet<_> = all.iter().map(|r| r.destination_cidr.clone()).collect();
    assert_eq!(
        (all.len(), unique.len()),
        (500, 500),
        "one route per CIDR, no duplicates"
    );
    let max = env
        .sim()
        .max_in_flight()
        .get(&Operation::CreateRoute)
        .copied()
        .unwrap_or(0);
    assert!(
        (2..=8).contains(&max),
        "create_route calls in flight at most: {max}"
    );
    assert_eq!(
        env.calls(Operation::CreateRoute),
        500,
        "each route created once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_routes_in_range_are_left_alone() {
    let env = TestEnv::start().await;
    let green = ccm_proto::GatewayClient::new({
        let mut c = ccm_proto::ClientConfig::new(
            env.gateway_url(),
            "green",
            ccm_proto::TokenSource::File(env.token_file(Role::Route)),
        );
        c.retry = RetryPolicy::default();
        c
    })
    .unwrap();
    green
        .create_route(
            "uid",
            Route {
                target_node: "theirs".into(),
                destination_cidr: "10.244.5.0/24".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start(&env, &["--cluster-name", "blue"]).await;
    create(&nodes, node("a").pod_cidr("10.244.1.0/24")).await;
    let blue = ccm_proto::GatewayClient::new(ccm_proto::ClientConfig::new(
        env.gateway_url(),
        "blue",
        ccm_proto::TokenSource::File(env.token_file(Role::Route)),
    ))
    .unwrap();
    eventually("blue's route", || async {
        (blue.list_routes().await.ok()?.len() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        green.list_routes().await.unwrap().len(),
        1,
        "green's route survives"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_writes() {
    let env = TestEnv::start().await;
    let lease = [
        "--leader-elect=true",
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "500ms",
    ];
    let a = start(&env, &lease).await;
    let b = start(&env, &lease).await;
    let nodes: Api<Node> = Api::all(env.client().await);
    for i in 0..5 {
        create(
            &nodes,
            node(&format!("n{i}")).pod_cidr(&format!("10.244.{i}.0/24")),
        )
        .await;
    }
    eventually("5 routes", || async {
        (routes(&env).await.len() == 5).then_some(())
    })
    .await;
    let (leader, standby) = if a.running.leadership.is_leader() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(!standby.running.leadership.is_leader());
    // The cloud can hold all five routes a moment before the leader has
    // counted the answers to its concurrent creates.
    eventually("the leader counts 5 creates", || async {
        (leader.metric("route_controller_routes_created_total").await == 5.0).then_some(())
    })
    .await;
    assert_eq!(
        standby
            .metric("route_controller_routes_created_total")
            .await,
        0.0
    );
    assert_eq!(
        standby.metric("route_controller_route_syncs_total").await,
        0.0
    );
}

#[test]
fn a_bad_cluster_cidr_exits_non_zero_with_a_clear_message() {
    for (cidr, expected) in [
        ("", "is required"),
        ("10.0.0.0/8,10.1.0.0/16", "one IPv4 and one IPv6"),
        ("nope", "is not a CIDR"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_route-controller"))
            .args(["--cluster-cidr", cidr, "--gateway-token-file", "/dev/null"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{cidr}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("cluster-cidr") && stderr.contains(expected),
            "{cidr}: {stderr}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_ready_once_the_caches_have_synced() {
    let env = TestEnv::start().await;
    start(&env, &[]).await.wait_ready().await;
}
