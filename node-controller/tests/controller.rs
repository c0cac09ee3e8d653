//! The node controller against the test API server and an in-process
//! gateway on the simulated cloud, over real HTTP and gRPC: upstream's
//! checklists for node initialisation and lifecycle, plus batching, the
//! deletion safeguard, and leader-only writes.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_proto::v1::{
    CreateInstanceRequest, Faults, InstanceId, LookupPurpose, NodeAddress as CloudAddress,
    NodeAddressType, NodeRef, SetInstanceAddressesRequest,
};
use ccm_provider::Operation;
use ccm_runtime::names;
use ccm_testkit::env::{TestController, TestEnv, eventually};
use clap::Parser;
use cloud_gateway::identity::Role;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_test_apiserver::fixtures::node;
use node_controller::args::{Args, Settings};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type Controller = TestController;

async fn start_controller(env: &TestEnv, role: Role, extra: &[&str]) -> Controller {
    let mut flags = vec!["node-controller".to_owned()];
    flags.extend(env.controller_flags(role));
    flags.extend(
        [
            "--node-monitor-period",
            "200ms",
            "--node-status-update-frequency",
            "500ms",
        ]
        .map(String::from),
    );
    flags.extend(extra.iter().map(|s| s.to_string()));
    let settings = Settings::from_args(&Args::try_parse_from(flags).unwrap()).unwrap();
    let stop = CancellationToken::new();
    let running = node_controller::start(settings, stop.clone())
        .await
        .unwrap();
    TestController::new(running, stop)
}

async fn create(nodes: &Api<Node>, n: impl Into<Node>) -> Node {
    let n: Node = n.into();
    let created = nodes.create(&PostParams::default(), &n).await.unwrap();
    // Kubelets write status separately; so does the test.
    if let Some(status) = n.status {
        nodes
            .patch_status(
                &created.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap()
    } else {
        created
    }
}

async fn initialised(nodes: &Api<Node>, name: &str) -> Node {
    eventually(&format!("{name} initialised"), || async {
        let n = nodes.get(name).await.ok()?;
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == names::TAINT_UNINITIALIZED));
        (!tainted).then_some(n)
    })
    .await
}

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninitialized_node_gets_provider_id_labels_addresses_and_loses_taint() {
    let env = TestEnv::start().await;
    let instance = env.create_instance("node-a").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start_controller(&env, Role::Node, &[]).await;
    create(
        &nodes,
        node("node-a")
            .uninitialized()
            .taint(names::TAINT_UNINITIALIZED, None, "NoExecute")
            .taint("dedicated", Some("ccm"), "NoSchedule")
            .address("Hostname", "node-a"),
    )
    .await;
    let n = initialised(&nodes, "node-a").await;
    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(instance.provider_id.as_str())
    );
    assert_eq!(
        taint_keys(&n),
        ["dedicated"],
        "every uninitialized taint goes, others stay"
    );
    // One patch, planned on the controller's cache, did it: no replace of
    // a Node read fresh (the test's own reads share the caller).
    let request = http::Request::get("/debug/requests")
        .body(Vec::new())
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&env.client().await.request_text(request).await.unwrap()).unwrap();
    let writer = report
        .as_object()
        .unwrap()
        .values()
        .map(|caller| &caller["requests"])
        .find(|requests| requests.get("patch nodes").is_some())
        .unwrap_or_else(|| panic!("no caller patched a Node: {report}"));
    assert_eq!(writer["patch nodes"], 1, "{writer}");
    assert!(writer.get("update nodes").is_none(), "{writer}");
    let labels = n.labels();
    for (k, v) in [
        (names::LABEL_INSTANCE_TYPE, instance.instance_type.as_str()),
        (
            names::LABEL_INSTANCE_TYPE_BETA,
            instance.instance_type.as_str(),
        ),
        (names::LABEL_ZONE, instance.zone.as_str()),
        (names::LABEL_ZONE_BETA, instance.zone.as_str()),
        (names::LABEL_REGION, instance.region.as_str()),
        (names::LABEL_REGION_BETA, instance.region.as_str()),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let n = eventually("addresses written", || async {
        let n = nodes.get("node-a").await.ok()?;
        (addresses(&n).len() == 2).then_some(n)
    })
    .await;
    assert_eq!(
        addresses(&n),
        [
            ("Hostname".into(), "node-a".into()),
            ("InternalIP".into(), "10.240.0.1".into())
        ]
    );
    let synced = eventually("a Synced event", || async {
        let e = env.events("Synced").await;
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(synced.len(), 1);
    assert_eq!(synced[0].note.as_deref(), Some("Node synced successfully"));
    assert_eq!(
        synced[0].regarding.as_ref().unwrap().name.as_deref(),
        Some("node-a")
    );
    // The SLO histogram: one node initialised, in well under a minute (its
    // buckets start at 50 ms, so a fast initialisation is not lumped in
    // with everything under a second).
    assert_eq!(
        c.metric("node_controller_taint_removal_delay_seconds_count")
            .await,
        1.0
    );
    assert_eq!(
        c.metric(r#"node_controller_taint_removal_delay_seconds_bucket{le="51.2"}"#)
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_cache_leaves_out_is_never_lost_from_the_node() {
    // The controllers cache Nodes without their images (most of a real
    // Node's size); every write must still keep them.
    let env = TestEnv::start().await;
    env.create_instance("node-a").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    let mut n = node("node-a")
        .uninitialized()
        .address("Hostname", "node-a")
        .build();
    n.status.get_or_insert_with(Default::default).images =
        Some(vec![k8s_openapi::api::core::v1::ContainerImage {
            names: Some(vec!["registry.example.com/app:v1".into()]),
            size_bytes: Some(1000),
        }]);
    create(&nodes, n).await;
    let n = initialised(&nodes, "node-a").await;
    let images = n.status.unwrap().images.unwrap_or_default();
    assert_eq!(images.len(), 1, "images kept through initialisation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_hostname_stays_when_the_cloud_reports_none() {
    let env = TestEnv::start().await;
    env.sim_admin()
        .create_instance(CreateInstanceRequest {
            name: "node-a".into(),
            addresses: vec![CloudAddress {
                r#type: NodeAddressType::InternalIp as i32,
                address: "10.1.1.1".into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(
        &nodes,
        node("node-a")
            .uninitialized()
            .address("Hostname", "kubelet-host"),
    )
    .await;
    initialised(&nodes, "node-a").await;
    let n = eventually("addresses", || async {
        let n = nodes.get("node-a").await.ok()?;
        (addresses(&n).len() == 2).then_some(n)
    })
    .await;
    assert_eq!(
        addresses(&n),
        [
            ("InternalIP".into(), "10.1.1.1".into()),
            ("Hostname".into(), "kubelet-host".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ip_annotation_orders_addresses_and_a_bad_one_keeps_the_taint() {
    let env = TestEnv::start().await;
    for (name, ips) in [
        ("good", ["10.1.1.1", "55.55.55.55"]),
        ("bad", ["10.2.2.2", "66.66.66.66"]),
    ] {
        env.sim_admin()
            .create_instance(CreateInstanceRequest {
                name: name.into(),
                addresses: vec![
                    CloudAddress {
                        r#type: NodeAddressType::InternalIp as i32,
                        address: ips[0].into(),
                    },
                    CloudAddress {
                        r#type: NodeAddressType::ExternalIp as i32,
                        address: ips[1].into(),
                    },
                    CloudAddress {
                        r#type: NodeAddressType::Hostname as i32,
                        address: name.into(),
                    },
                ],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(
        &nodes,
        node("good")
            .uninitialized()
            .annotation(names::ANNOTATION_PROVIDED_NODE_IP, "55.55.55.55"),
    )
    .await;
    create(
        &nodes,
        node("bad")
            .uninitialized()
            .annotation(names::ANNOTATION_PROVIDED_NODE_IP, "10.9.9.9"),
    )
    .await;
    initialised(&nodes, "good").await;
    let n = eventually("addresses", || async {
        let n = nodes.get("good").await.ok()?;
        (addresses(&n).len() == 3).then_some(n)
    })
    .await;
    assert_eq!(
        addresses(&n)[0],
        ("ExternalIP".into(), "55.55.55.55".into()),
        "the node IP comes first"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let bad = nodes.get("bad").await.unwrap();
    assert!(
        taint_keys(&bad).contains(&names::TAINT_UNINITIALIZED.to_owned()),
        "an unmatched node IP keeps the taint"
    );
    assert!(
        bad.spec.unwrap().provider_id.is_none(),
        "and nothing was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_provider_id_is_used_and_never_overwritten() {
    let env = TestEnv::start().await;
    let instance = env.create_instance("cloud-name").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(
        &nodes,
        node("k8s-name")
            .uninitialized()
            .provider_id(&instance.provider_id),
    )
    .await;
    let n = initialised(&nodes, "k8s-name").await;
    assert_eq!(
        n.spec.as_ref().unwrap().provider_id.as_deref(),
        Some(instance.provider_id.as_str())
    );
    assert_eq!(n.labels().get(names::LABEL_ZONE), Some(&instance.zone));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_an_instance_keeps_its_taint_until_the_instance_appears() {
    let env = TestEnv::start_with(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(&nodes, node("early").uninitialized().ready()).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let n = nodes.get("early").await.unwrap();
    assert!(taint_keys(&n).contains(&names::TAINT_UNINITIALIZED.to_owned()));
    env.create_instance("early").await;
    initialised(&nodes, "early").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_labels_are_filtered_and_never_overwrite() {
    let env = TestEnv::start().await;
    let labels: std::collections::HashMap<String, String> = [
        ("kubernetes.io/hijack", "x"),
        ("foo.k8s.io/x", "x"),
        ("team", "cloud"),
        ("rack", "r7"),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    env.sim_admin()
        .create_instance(CreateInstanceRequest {
            name: "node-a".into(),
            labels,
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(&nodes, node("node-a").uninitialized().label("team", "mine")).await;
    let n = initialised(&nodes, "node-a").await;
    let labels: BTreeMap<_, _> = n.labels().clone();
    assert_eq!(labels.get("rack").map(String::as_str), Some("r7"));
    assert_eq!(labels.get("team").map(String::as_str), Some("mine"));
    assert!(!labels.contains_key("kubernetes.io/hijack") && !labels.contains_key("foo.k8s.io/x"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialised_nodes_get_ga_labels_matching_beta_labels_without_cloud_calls() {
    let env = TestEnv::start().await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &[]).await;
    create(
        &nodes,
        node("old")
            .ready()
            .label(names::LABEL_ZONE_BETA, "z1")
            .label(names::LABEL_ZONE, "stale"),
    )
    .await;
    eventually("GA label fixed", || async {
        let n = nodes.get("old").await.ok()?;
        (n.labels().get(names::LABEL_ZONE).map(String::as_str) == Some("z1")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        env.calls(Operation::GetInstances),
        1,
        "only the periodic address sync asked the cloud"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_sync_follows_address_changes_in_one_call_per_batch() {
    let env = TestEnv::start_with(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    for i in 0..6 {
        env.create_instance(&format!("n{i}")).await;
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &["--lookup-batch-size", "3"]).await;
    for i in 0..6 {
        create(&nodes, node(&format!("n{i}")).uninitialized().ready()).await;
    }
    for i in 0..6 {
        initialised(&nodes, &format!("n{i}")).await;
    }
    env.sim_admin()
        .set_instance_addresses(SetInstanceAddressesRequest {
            id: "n3".into(),
            addresses: vec![CloudAddress {
                r#type: NodeAddressType::InternalIp as i32,
                address: "10.99.0.3".into(),
            }],
        })
        .await
        .unwrap();
    let n = eventually("n3's new address", || async {
        let n = nodes.get("n3").await.ok()?;
        addresses(&n)
            .iter()
            .any(|(_, a)| a == "10.99.0.3")
            .then_some(n)
    })
    .await;
    // The kubelet's hostname is kept; the old internal IP is gone.
    assert_eq!(
        addresses(&n),
        [
            ("InternalIP".into(), "10.99.0.3".into()),
            ("Hostname".into(), "n3".into())
        ]
    );
    let before = env.calls(Operation::GetInstances);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let per_pass = (env.calls(Operation::GetInstances) - before) as f64 / 2.0;
    assert!(
        per_pass <= 3.0,
        "6 nodes in batches of 3: about 2 calls a pass, saw {per_pass}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_nodes_cost_no_cloud_calls_in_the_lifecycle_pass() {
    let env = TestEnv::start().await;
    let nodes: Api<Node> = Api::all(env.client().await);
    // The address sync is made rare so only lifecycle passes could call.
    let _c = start_controller(&env, Role::Node, &["--node-status-update-frequency", "1h"]).await;
    for i in 0..5 {
        create(&nodes, node(&format!("n{i}")).ready()).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        env.calls(Operation::GetInstances) <= 1,
        "at most the first address sync"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_ready_node_whose_instance_is_gone_is_deleted_with_an_event() {
    let env = TestEnv::start().await;
    for name in ["gone", "unknown-gone", "alive"] {
        env.create_instance(name).await;
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &["--node-deletion-max-share", "1.0"]).await;
    create(&nodes, node("gone").not_ready()).await;
    create(&nodes, node("unknown-gone")).await;
    create(&nodes, node("alive").not_ready()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["gone", "unknown-gone"] {
        env.sim_admin()
            .terminate_instance(InstanceId { id: name.into() })
            .await
            .unwrap();
    }
    for name in ["gone", "unknown-gone"] {
        eventually(&format!("{name} deleted"), || async {
            nodes.get_opt(name).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    assert!(
        nodes.get_opt("alive").await.unwrap().is_some(),
        "a running instance's node stays"
    );
    let deleting = env.events("DeletingNode").await;
    assert_eq!(deleting.len(), 2);
    assert!(
        deleting[0]
            .note
            .as_deref()
            .unwrap()
            .contains("does not exist in the cloud provider")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_instance_taints_its_node_once_and_ready_removes_it() {
    let env = TestEnv::start_with(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    env.create_instance("n1").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start_controller(&env, Role::Node, &["--node-status-update-frequency", "1h"]).await;
    create(&nodes, node("n1").not_ready()).await;
    env.sim_admin()
        .stop_instance(InstanceId { id: "n1".into() })
        .await
        .unwrap();
    eventually("shutdown taint", || async {
        let n = nodes.get("n1").await.ok()?;
        taint_keys(&n)
            .contains(&names::TAINT_SHUTDOWN.to_owned())
            .then_some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        taint_keys(&nodes.get("n1").await.unwrap()),
        [names::TAINT_SHUTDOWN]
    );
    let text = c.metrics().await;
    assert!(
        text.contains(r#"node_controller_shutdown_taints_total{action="added"} 1"#),
        "the taint is added once over several passes:\n{text}"
    );
    // Running again but still not ready: the taint stays (as upstream).
    env.sim_admin()
        .start_instance(InstanceId { id: "n1".into() })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        taint_keys(&nodes.get("n1").await.unwrap()),
        [names::TAINT_SHUTDOWN]
    );
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap();
    eventually("taint removed", || async {
        let n = nodes.get("n1").await.ok()?;
        taint_keys(&n).is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_errors_never_delete_a_node() {
    let env = TestEnv::start_with(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    let nodes: Api<Node> = Api::all(env.client().await);
    env.sim_admin()
        .set_faults(Faults {
            error_rate: 1.0,
            ..Default::default()
        })
        .await
        .unwrap();
    let _c = start_controller(&env, Role::Node, &["--node-deletion-max-share", "1.0"]).await;
    create(&nodes, node("n1").not_ready()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(nodes.get_opt("n1").await.unwrap().is_some());
    assert!(
        env.calls(Operation::GetInstances) > 0,
        "the controller did ask"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_denied_never_deletes_a_node() {
    let env = TestEnv::start().await;
    let nodes: Api<Node> = Api::all(env.client().await);
    // The route role may not look up instances: every lookup is refused.
    let _c = start_controller(&env, Role::Route, &["--node-deletion-max-share", "1.0"]).await;
    create(&nodes, node("n1").not_ready()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(nodes.get_opt("n1").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_not_found_is_checked_fresh_and_never_deletes_a_live_node() {
    let env = TestEnv::start_with(|s| s.lookups.cache_ttl = Duration::from_secs(600)).await;
    // The gateway learns "n1 does not exist" and caches it...
    let node_client = env.gateway_client(Role::Node);
    let answer = node_client
        .get_instances(
            vec![NodeRef {
                name: "n1".into(),
                provider_id: String::new(),
            }],
            LookupPurpose::Refresh,
            false,
        )
        .await
        .unwrap();
    assert_eq!(answer[0].state(), ccm_proto::v1::InstanceState::NotFound);
    // ...then the instance appears behind the cache's back.
    env.sim()
        .create_instance(ccm_provider_sim::NewInstance {
            name: "n1".into(),
            ..Default::default()
        })
        .unwrap();
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &["--node-deletion-max-share", "1.0"]).await;
    create(&nodes, node("n1").not_ready()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        nodes.get_opt("n1").await.unwrap().is_some(),
        "the fresh read found the instance"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_nodes_gone_at_once_deletes_none_and_warns() {
    let env = TestEnv::start().await;
    let nodes: Api<Node> = Api::all(env.client().await);
    env.create_instance("survivor").await;
    // All four exist before the first pass: three of four look gone.
    for name in ["a", "b", "c"] {
        create(&nodes, node(name).not_ready()).await;
    }
    create(&nodes, node("survivor").not_ready()).await;
    let _c = start_controller(&env, Role::Node, &[]).await;
    let held = eventually("a held-back warning", || async {
        let e = env.events("NodeDeletionHeldBack").await;
        (e.len() >= 3).then_some(e)
    })
    .await;
    assert_eq!(held[0].type_.as_deref(), Some("Warning"));
    for name in ["a", "b", "c", "survivor"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} kept");
    }
    assert!(env.events("DeletingNode").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_nodes_joining_at_once_take_far_fewer_provider_calls() {
    let env = TestEnv::start().await;
    env.sim_admin()
        .set_faults(Faults {
            latency: [(
                "get_instances".to_owned(),
                prost_types::Duration {
                    seconds: 0,
                    nanos: 20_000_000,
                },
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..200 {
        env.create_instance(&format!("n{i:03}")).await;
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(&env, Role::Node, &["--node-status-update-frequency", "1h"]).await;
    futures::future::join_all((0..200).map(|i| {
        let nodes = nodes.clone();
        async move { create(&nodes, node(&format!("n{i:03}")).uninitialized().ready()).await }
    }))
    .await;
    for i in 0..200 {
        initialised(&nodes, &format!("n{i:03}")).await;
    }
    let calls = env.calls(Operation::GetInstances);
    eprintln!("200 nodes initialised with {calls} get_instances provider calls");
    // One call per node would be 200. How many lookups share a batch
    // depends on how registrations and the workers' calls interleave: 13 to
    // 21 calls on an idle machine (29 to 41 with one node per worker, 55
    // once while the whole suite ran on two cores).
    assert!(
        calls <= 60,
        "200 nodes initialised with {calls} provider calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_looks_up_every_waiting_node_in_one_request() {
    let env = TestEnv::start().await;
    for i in 0..250 {
        env.create_instance(&format!("n{i:03}")).await;
    }
    let nodes: Api<Node> = Api::all(env.client().await);
    // Waiting before the controller starts, plus one without an instance.
    futures::future::join_all((0..251).map(|i| {
        let nodes = nodes.clone();
        async move { create(&nodes, node(&format!("n{i:03}")).uninitialized().ready()).await }
    }))
    .await;
    let c = start_controller(
        &env,
        Role::Node,
        &[
            "--concurrent-node-syncs",
            "1",
            "--node-status-update-frequency",
            "1h",
        ],
    )
    .await;
    for i in 0..250 {
        initialised(&nodes, &format!("n{i:03}")).await;
    }
    // One worker, one request for all 251 nodes, which the gateway sends
    // to the cloud in batches of 100. One node at a time took 251 calls.
    assert_eq!(env.calls(Operation::GetInstances), 3);
    // The node without an instance failed alone (its not-found answer is
    // cached, so its retries cost no calls) and keeps its taint.
    eventually("n250's sync failed", || async {
        (c.metric(r#"node_controller_reconcile_errors_total{error="instance_not_found"}"#)
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    let waiting = nodes.get("n250").await.unwrap();
    assert!(taint_keys(&waiting).contains(&names::TAINT_UNINITIALIZED.to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_replicas_only_the_leader_writes() {
    let env = TestEnv::start().await;
    for i in 0..10 {
        env.create_instance(&format!("n{i}")).await;
    }
    let lease = [
        "--leader-elect=true",
        "--leader-elect-lease-duration",
        "3s",
        "--leader-elect-renew-deadline",
        "2s",
        "--leader-elect-retry-period",
        "500ms",
    ];
    let a = start_controller(&env, Role::Node, &lease).await;
    let b = start_controller(&env, Role::Node, &lease).await;
    let nodes: Api<Node> = Api::all(env.client().await);
    for i in 0..10 {
        create(&nodes, node(&format!("n{i}")).uninitialized()).await;
    }
    for i in 0..10 {
        initialised(&nodes, &format!("n{i}")).await;
    }
    let (la, lb) = (&a.running.leadership, &b.running.leadership);
    assert!(la.is_leader() != lb.is_leader(), "exactly one leads");
    let leader = if la.is_leader() {
        la.identity()
    } else {
        lb.identity()
    };
    let synced = eventually("10 Synced events", || async {
        let e = env.events("Synced").await;
        (e.len() == 10).then_some(e)
    })
    .await;
    for e in synced {
        assert_eq!(
            e.reporting_instance.as_deref(),
            Some(leader),
            "written by the leader only"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflicting_writes_are_retried_and_the_node_still_initialises() {
    let env = TestEnv::start().await;
    env.create_instance("busy").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    create(&nodes, node("busy").uninitialized()).await;
    // More conflicts than one sync retries (20): the sync fails, backs off,
    // and a later one succeeds.
    env.api.store().inject_conflicts("nodes", 25);
    let c = start_controller(&env, Role::Node, &["--node-status-update-frequency", "1h"]).await;
    initialised(&nodes, "busy").await;
    let text = c.metrics().await;
    assert!(
        text.contains("node_controller_reconcile_errors_total{error=\"kubernetes\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_ready_once_the_node_cache_has_synced() {
    let env = TestEnv::start().await;
    start_controller(&env, Role::Node, &[])
        .await
        .wait_ready()
        .await;
}

#[test]
fn invalid_flags_exit_non_zero_listing_every_problem() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_node-controller"))
        .args([
            "--concurrent-node-syncs",
            "0",
            "--node-monitor-period",
            "soon",
            "--cluster-name",
            "not ok",
            "--node-deletion-max-share",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "concurrent-node-syncs",
        "node-monitor-period",
        "cluster-name",
        "node-deletion-max-share",
        "gateway-token-file",
    ] {
        assert!(stderr.contains(key), "{key} missing:\n{stderr}");
    }
}

/// The tagging controller needs a provider that tags instances: on the
/// simulated cloud, which does not, the controller stops at start saying
/// so, before it writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_tags_on_a_provider_without_them_stop_the_controller_with_why() {
    let env = TestEnv::start().await;
    let mut flags = vec!["node-controller".to_owned()];
    flags.extend(env.controller_flags(Role::Node));
    flags.extend(["--instance-tags", "team=ml"].map(String::from));
    let settings = Settings::from_args(&Args::try_parse_from(flags).unwrap()).unwrap();
    let stop = CancellationToken::new();
    let running = node_controller::start(settings, stop.clone())
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), running.wait())
        .await
        .expect("the controller stops")
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("--instance-tags needs a cloud provider that tags instances"),
        "{err:#}"
    );
    stop.cancel();
}

/// A kube client acting as the kubelet of `node` (impersonation).
async fn kubelet_client(env: &TestEnv, node: &str) -> kube::Client {
    client_as(env, &format!("system:node:{node}"), &["system:nodes"]).await
}

/// A serving CSR as a kubelet makes it, for `node` with these SANs.
fn serving_csr(
    name: &str,
    signer: &str,
    node: &str,
    ips: &[&str],
    dns: &[&str],
) -> serde_json::Value {
    use rcgen::SanType;
    let pem = csr_pem(node, |p| {
        p.subject_alt_names = ips
            .iter()
            .map(|ip| SanType::IpAddress(ip.parse().unwrap()))
            .chain(
                dns.iter()
                    .map(|d| SanType::DnsName((*d).try_into().unwrap())),
            )
            .collect();
    });
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "signerName": signer,
            "usages": ["digital signature", "server auth"],
            "request": data_encoding::BASE64.encode(pem.as_bytes()),
        }
    })
}

/// Kubelet serving CSRs through the real controller: the honest one is
/// approved, one naming another node's address is denied with why, one of
/// another signer is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_csrs_are_approved_on_the_clouds_word_and_dishonest_ones_denied() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let env = TestEnv::start().await;
    env.create_instance("node-a").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let c = start_controller(
        &env,
        Role::Node,
        &["--approve-kubelet-serving-csrs", "true"],
    )
    .await;
    create(
        &nodes,
        node("node-a")
            .uninitialized()
            .taint(names::TAINT_UNINITIALIZED, None, "NoSchedule")
            .address("Hostname", "node-a"),
    )
    .await;
    initialised(&nodes, "node-a").await;
    let as_kubelet: Api<CertificateSigningRequest> = Api::all(kubelet_client(&env, "node-a").await);
    let serving = "kubernetes.io/kubelet-serving";
    let csrs: Api<CertificateSigningRequest> = Api::all(env.client().await);
    let condition = |name: &'static str| {
        let csrs = csrs.clone();
        async move {
            let c = csrs.get(name).await.ok()?;
            let cond = c.status?.conditions?.into_iter().next()?;
            Some((
                cond.type_,
                cond.reason.unwrap_or_default(),
                cond.message.unwrap_or_default(),
            ))
        }
    };

    // While the cloud cannot answer, an honest CSR waits: no decision.
    let failing = Faults {
        error_rate: 1.0,
        ..Default::default()
    };
    env.sim_admin().set_faults(failing).await.unwrap();
    let early = serving_csr("early", serving, "node-a", &["10.240.0.1"], &["node-a"]);
    let early: CertificateSigningRequest = serde_json::from_value(early).unwrap();
    as_kubelet
        .create(&PostParams::default(), &early)
        .await
        .unwrap();
    let waiting =
        r#"node_controller_serving_csr_decisions_total{decision="waiting",reason="Waiting"}"#;
    eventually("the early CSR waiting", || async {
        (c.metric(waiting).await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(condition("early").await, None, "never decided on a guess");
    env.sim_admin().set_faults(Faults::default()).await.unwrap();
    let early = eventually("the early CSR decided", || condition("early")).await;
    assert_eq!(early.0, "Approved", "{early:?}");

    for csr in [
        serving_csr("honest", serving, "node-a", &["10.240.0.1"], &["node-a"]),
        serving_csr(
            "foreign",
            serving,
            "node-a",
            &["10.240.0.1", "10.240.0.99"],
            &["node-a"],
        ),
        serving_csr(
            "other-signer",
            "example.com/serving",
            "node-a",
            &["10.240.0.99"],
            &[],
        ),
    ] {
        let csr: CertificateSigningRequest = serde_json::from_value(csr).unwrap();
        as_kubelet
            .create(&PostParams::default(), &csr)
            .await
            .unwrap();
    }
    let honest = eventually("the honest CSR decided", || condition("honest")).await;
    assert_eq!(
        (honest.0.as_str(), honest.1.as_str()),
        ("Approved", "CloudVerified"),
        "{honest:?}"
    );
    let foreign = eventually("the foreign CSR decided", || condition("foreign")).await;
    assert_eq!(
        (foreign.0.as_str(), foreign.1.as_str()),
        ("Denied", "ForeignAddress"),
        "{foreign:?}"
    );
    assert!(foreign.2.contains("10.240.0.99"), "{foreign:?}");
    assert_eq!(
        condition("other-signer").await,
        None,
        "another signer's CSR is never touched"
    );
    assert_eq!(
        c.metric(r#"node_controller_serving_csr_decisions_total{decision="approved",reason="CloudVerified"}"#)
            .await,
        2.0
    );
    assert_eq!(
        c.metric(r#"node_controller_serving_csr_decisions_total{decision="denied",reason="ForeignAddress"}"#)
            .await,
        1.0
    );
}

/// A kube client acting as `user` in `groups` (impersonation).
async fn client_as(env: &TestEnv, user: &str, groups: &[&str]) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    kube::Client::try_from(config).unwrap()
}

/// A kubelet serving CSR's PEM for `node` with `params` changed by `change`.
fn csr_pem(node: &str, change: impl FnOnce(&mut rcgen::CertificateParams)) -> String {
    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, format!("system:node:{node}"));
    p.distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    p.subject_alt_names = vec![
        SanType::IpAddress("10.240.0.1".parse().unwrap()),
        SanType::DnsName(node.try_into().unwrap()),
    ];
    change(&mut p);
    p.serialize_request(&KeyPair::generate().unwrap())
        .unwrap()
        .pem()
        .unwrap()
}

/// Every dishonest serving CSR, each breaking one rule, through the real
/// controller: denied with its reason, never approved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dishonest_serving_csr_is_denied_with_its_reason() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use rcgen::{DnType, SanType};
    let env = TestEnv::start().await;
    env.create_instance("node-a").await;
    env.create_instance("node-s").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    let _c = start_controller(
        &env,
        Role::Node,
        &["--approve-kubelet-serving-csrs", "true"],
    )
    .await;
    for name in ["node-a", "node-s"] {
        create(
            &nodes,
            node(name)
                .uninitialized()
                .taint(names::TAINT_UNINITIALIZED, None, "NoSchedule")
                .address("Hostname", name),
        )
        .await;
        initialised(&nodes, name).await;
    }
    // node-s's instance is stopped: it exists but does not run.
    env.sim_admin()
        .stop_instance(InstanceId {
            id: "node-s".into(),
        })
        .await
        .unwrap();

    let honest = || csr_pem("node-a", |_| {});
    let tampered = {
        let pem = honest();
        let block = pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect::<String>();
        let mut der = data_encoding::BASE64.decode(block.as_bytes()).unwrap();
        *der.last_mut().unwrap() ^= 0x01;
        format!(
            "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
            data_encoding::BASE64.encode(&der)
        )
    };
    let node_a = ("system:node:node-a", vec!["system:nodes"]);
    let usages = vec!["digital signature", "server auth"];
    // (name, requester and groups, usages, request, reason)
    type Case<'a> = (
        &'a str,
        (&'a str, Vec<&'a str>),
        Vec<&'a str>,
        String,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "serviceaccount",
            (
                "system:serviceaccount:kube-system:x",
                vec!["system:serviceaccounts"],
            ),
            usages.clone(),
            honest(),
            "RequesterNotANode",
        ),
        (
            "client-auth",
            node_a.clone(),
            vec!["digital signature", "server auth", "client auth"],
            honest(),
            "WrongUsages",
        ),
        (
            "two-blocks",
            node_a.clone(),
            usages.clone(),
            format!("{}{}", honest(), honest()),
            "Unreadable",
        ),
        (
            "bad-signature",
            node_a.clone(),
            usages.clone(),
            tampered,
            "BadSignature",
        ),
        (
            "other-subject",
            node_a.clone(),
            usages.clone(),
            csr_pem("node-s", |_| {}),
            "WrongSubject",
        ),
        (
            "extra-subject",
            node_a.clone(),
            usages.clone(),
            csr_pem("node-a", |p| {
                p.distinguished_name
                    .push(DnType::OrganizationalUnitName, "x")
            }),
            "WrongSubject",
        ),
        (
            "email",
            node_a.clone(),
            usages.clone(),
            csr_pem("node-a", |p| {
                p.subject_alt_names
                    .push(SanType::Rfc822Name("a@b.example".try_into().unwrap()))
            }),
            "ForbiddenName",
        ),
        (
            "uri",
            node_a.clone(),
            usages.clone(),
            csr_pem("node-a", |p| {
                p.subject_alt_names
                    .push(SanType::URI("spiffe://cluster/node-a".try_into().unwrap()))
            }),
            "ForbiddenName",
        ),
        (
            "other-name",
            node_a.clone(),
            usages.clone(),
            csr_pem("node-a", |p| {
                p.subject_alt_names
                    .push(SanType::DnsName("node-s".try_into().unwrap()))
            }),
            "ForeignName",
        ),
        (
            "stopped",
            ("system:node:node-s", vec!["system:nodes"]),
            usages.clone(),
            csr_pem("node-s", |p| {
                p.subject_alt_names = vec![SanType::DnsName("node-s".try_into().unwrap())]
            }),
            "InstanceNotRunning",
        ),
    ];
    for (name, (user, groups), usages, request, _) in &cases {
        let api: Api<CertificateSigningRequest> = Api::all(client_as(&env, user, groups).await);
        let csr = json!({
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "metadata": {"name": name},
            "spec": {
                "signerName": "kubernetes.io/kubelet-serving",
                "usages": usages,
                "request": data_encoding::BASE64.encode(request.as_bytes()),
            }
        });
        let csr: CertificateSigningRequest = serde_json::from_value(csr).unwrap();
        api.create(&PostParams::default(), &csr).await.unwrap();
    }
    let csrs: Api<CertificateSigningRequest> = Api::all(env.client().await);
    for (name, _, _, _, reason) in &cases {
        let (kind, got) = eventually(&format!("{name} decided"), || async {
            let c = csrs.get(name).await.ok()?;
            let cond = c.status?.conditions?.into_iter().next()?;
            Some((cond.type_, cond.reason.unwrap_or_default()))
        })
        .await;
        assert_eq!((kind.as_str(), got.as_str()), ("Denied", *reason), "{name}");
    }
}
