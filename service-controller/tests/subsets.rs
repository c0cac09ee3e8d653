//! Each load balancer's nodes: a stable subset per zone, within the
//! cloud's quota (the sim's, set small), spread over the nodes, moved only
//! where a node joins or leaves the subset, with excluded and draining
//! nodes off; per-Service annotations, and invalid ones refused; Local
//! Services on exactly the nodes that serve their endpoints, a node that
//! stopped serving kept for the grace period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ccm_runtime::host_limits::Allowed;
use ccm_runtime::names;
use ccm_testkit::env::{TestController, TestEnv, eventually};
use clap::Parser;
use cloud_gateway::identity::Role;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_test_apiserver::fixtures::{endpoint_slice, load_balancer, node};
use serde_json::json;
use service_controller::args::{Args, Settings};
use service_controller::plan::NodeView;
use service_controller::subsets;
use tokio_util::sync::CancellationToken;

const ZONES: [&str; 3] = ["sim-zone-a", "sim-zone-b", "sim-zone-c"];

async fn start(env: &TestEnv) -> TestController {
    start_with(env, &[]).await
}

async fn start_with(env: &TestEnv, extra: &[&str]) -> TestController {
    let mut flags = vec!["service-controller".to_owned()];
    flags.extend(env.controller_flags(Role::Service));
    flags.extend(["--node-sync-debounce", "200ms"].map(String::from));
    flags.extend(extra.iter().map(|f| f.to_string()));
    let settings = Settings::from_args(&Args::try_parse_from(flags).unwrap()).unwrap();
    let stop = CancellationToken::new();
    let running = service_controller::start(settings, stop.clone())
        .await
        .unwrap();
    TestController::new(running, stop)
}

fn zone_of(node: &str) -> &str {
    ZONES
        .iter()
        .find(|z| node.starts_with(*z))
        .expect("a zone's node")
}

async fn add_node(nodes: &Api<Node>, name: &str) {
    let zone = zone_of(name);
    nodes
        .create(
            &PostParams::default(),
            &node(name).ready().label(names::LABEL_ZONE, zone).build(),
        )
        .await
        .unwrap();
}

/// A sim whose load balancers take at most `quota` hosts a zone, with
/// `per_zone` Nodes in each of its zones; its Node, Service and
/// EndpointSlice APIs.
async fn cluster(
    quota: u32,
    per_zone: usize,
) -> (TestEnv, Api<Node>, Api<Service>, Api<EndpointSlice>) {
    let env = TestEnv::start_with(|s| s.sim.lb_hosts_per_zone = quota).await;
    let client = env.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for zone in ZONES {
        for i in 0..per_zone {
            add_node(&nodes, &format!("{zone}-{i}")).await;
        }
    }
    let services = Api::namespaced(client.clone(), "default");
    let slices = Api::namespaced(client, "default");
    (env, nodes, services, slices)
}

/// Each Service's load balancer hosts, by Service name.
async fn hosts(env: &TestEnv) -> BTreeMap<String, BTreeSet<String>> {
    env.gateway_client(Role::Service)
        .list_load_balancers()
        .await
        .unwrap()
        .into_iter()
        .map(|lb| {
            (
                lb.service.unwrap_or_default().name,
                lb.hosts.into_iter().collect(),
            )
        })
        .collect()
}

fn per_zone(hosts: &BTreeSet<String>) -> BTreeMap<&str, usize> {
    let mut out = BTreeMap::new();
    for h in hosts {
        *out.entry(zone_of(h)).or_default() += 1;
    }
    out
}

/// Waits until the host sets stop changing (two reads a pass apart agree).
async fn settled(env: &TestEnv) -> BTreeMap<String, BTreeSet<String>> {
    let mut last = hosts(env).await;
    loop {
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = hosts(env).await;
        if now == last {
            return now;
        }
        last = now;
    }
}

/// The Services whose hosts differ between `a` and `b`.
fn changed(
    a: &BTreeMap<String, BTreeSet<String>>,
    b: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    a.keys()
        .filter(|k| a.get(*k) != b.get(*k))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_load_balancer_holds_a_stable_subset_within_the_quota() {
    let (env, nodes, services, _) = cluster(3, 6).await;
    let _c = start(&env).await;
    let count = 16;
    for i in 0..count {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", &format!("web-{i}")).build(),
            )
            .await
            .unwrap();
    }

    // The controller's subset (25 per zone) is past the sim's quota of 3
    // per zone: each takes 3 of each zone's 6.
    eventually("every load balancer has 3 nodes of each zone", || async {
        let hosts = hosts(&env).await;
        (hosts.len() == count
            && hosts
                .values()
                .all(|h| per_zone(h).values().copied().eq([3, 3, 3])))
        .then_some(())
    })
    .await;
    let before = settled(&env).await;
    let used: BTreeSet<&String> = before.values().flatten().collect();
    assert!(used.len() > 12, "16 Services use only {used:?}");

    // A node joining changes only the Services whose subset it enters.
    add_node(&nodes, "sim-zone-a-new").await;
    eventually("the new node serves some Service", || async {
        let now = hosts(&env).await;
        now.values()
            .any(|h| h.contains("sim-zone-a-new"))
            .then_some(())
    })
    .await;
    let after = settled(&env).await;
    for name in changed(&before, &after) {
        let (old, new) = (&before[&name], &after[&name]);
        assert!(new.contains("sim-zone-a-new"), "{name}: {old:?} -> {new:?}");
        assert_eq!(old.difference(new).count(), 1, "{name}: {old:?} -> {new:?}");
        assert_eq!(per_zone(new)["sim-zone-a"], 3);
    }
    assert!(
        changed(&before, &after).len() < count,
        "every Service moved"
    );

    // A node leaving the load balancers (the exclusion label) changes
    // only the Services that held it.
    let leaving = after
        .values()
        .flatten()
        .find(|n| n.starts_with("sim-zone-b"))
        .unwrap()
        .clone();
    nodes
        .patch(
            &leaving,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {names::LABEL_EXCLUDE_FROM_LB: ""}}})),
        )
        .await
        .unwrap();
    eventually("the excluded node serves no Service", || async {
        let now = hosts(&env).await;
        now.values().all(|h| !h.contains(&leaving)).then_some(())
    })
    .await;
    let excluded = settled(&env).await;
    for name in changed(&after, &excluded) {
        assert!(
            after[&name].contains(&leaving),
            "{name} did not hold {leaving}"
        );
        assert_eq!(per_zone(&excluded[&name])["sim-zone-b"], 3);
    }

    // A cordoned node is moved off while its zone has others.
    let draining = excluded
        .values()
        .flatten()
        .find(|n| n.starts_with("sim-zone-c"))
        .unwrap()
        .clone();
    nodes
        .patch(
            &draining,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    eventually("the draining node serves no Service", || async {
        let now = hosts(&env).await;
        (now.values().all(|h| !h.contains(&draining))
            && now
                .values()
                .all(|h| per_zone(h).get("sim-zone-c") == Some(&3)))
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_set_the_subset_or_ask_for_every_node_and_bad_ones_are_refused() {
    let (env, _, services, _) = cluster(4, 5).await;
    let _c = start(&env).await;
    let annotated = [
        ("one", names::ANNOTATION_LB_SUBSET_SIZE, "1"),
        ("every", names::ANNOTATION_LB_BACKENDS, "all"),
        ("bad", names::ANNOTATION_LB_SUBSET_SIZE, "zero"),
    ];
    for (name, key, value) in annotated {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", name)
                    .annotation(key, value)
                    .build(),
            )
            .await
            .unwrap();
    }
    eventually(
        "one node per zone, and every node up to the quota",
        || async {
            let hosts = hosts(&env).await;
            let one = per_zone(hosts.get("one")?)
                .into_values()
                .collect::<Vec<_>>();
            let every = per_zone(hosts.get("every")?)
                .into_values()
                .collect::<Vec<_>>();
            (one == [1, 1, 1] && every == [4, 4, 4]).then_some(())
        },
    )
    .await;
    let refused = eventually("the bad annotation is refused", || async {
        let svc = services.get("bad").await.ok()?;
        let condition = svc
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == names::CONDITION_LB_SYNCED)?;
        (condition.reason == names::REASON_INVALID_CONFIGURATION).then_some(condition.message)
    })
    .await;
    assert!(
        refused.contains(names::ANNOTATION_LB_SUBSET_SIZE) && refused.contains("\"zero\""),
        "{refused}"
    );
    let warned = env.events("SyncLoadBalancerFailed").await;
    assert!(
        warned
            .iter()
            .any(|e| e.note.as_deref().is_some_and(|n| n.contains("zero"))),
        "{warned:?}"
    );
    assert!(
        !hosts(&env).await.contains_key("bad"),
        "no load balancer for it"
    );
}

/// Sets `name`'s endpoints (as its one EndpointSlice), creating it the
/// first time; when the write was done.
async fn set_endpoints(slices: &Api<EndpointSlice>, name: &str, endpoints: &[(&str, bool)]) {
    let slice_name = format!("{name}-abcde");
    let mut slice = endpoint_slice("default", name, &slice_name, endpoints);
    match slices.get_opt(&slice_name).await.unwrap() {
        None => drop(slices.create(&PostParams::default(), &slice).await.unwrap()),
        Some(old) => {
            slice.metadata.resource_version = old.metadata.resource_version;
            slices
                .replace(&slice_name, &PostParams::default(), &slice)
                .await
                .unwrap();
        }
    }
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_services_use_exactly_the_nodes_that_serve_them_and_keep_a_leaving_one_for_the_grace()
{
    const GRACE: Duration = Duration::from_secs(3);
    let (env, nodes, services, slices) = cluster(3, 4).await;
    // Endpoints before the controller starts: its first ensure uses them.
    set_endpoints(
        &slices,
        "local",
        &[
            ("sim-zone-a-0", true),
            ("sim-zone-b-1", true),
            ("sim-zone-c-2", false),
        ],
    )
    .await;
    for (name, local) in [("local", true), ("cluster", false), ("no-pods", true)] {
        let svc = load_balancer("default", name);
        let svc = if local { svc.local() } else { svc };
        services
            .create(&PostParams::default(), &svc.build())
            .await
            .unwrap();
    }
    let _c = start_with(&env, &["--local-endpoints-grace-period", "3s"]).await;

    eventually(
        "the Local Service is on the nodes with a ready endpoint",
        || async {
            let hosts = hosts(&env).await;
            (hosts.get("local")? == &set(&["sim-zone-a-0", "sim-zone-b-1"])).then_some(())
        },
    )
    .await;
    let before = settled(&env).await;
    // Without a serving endpoint, a Local Service keeps a subset (its
    // health checks fail every node, as upstream's would), never nothing.
    assert_eq!(
        per_zone(&before["no-pods"])
            .into_values()
            .collect::<Vec<_>>(),
        [3, 3, 3]
    );

    // A rolling update: the pod on a-0 goes, one starts on c-0. The new
    // node is added at once; a-0 stays until its grace is out.
    let moved = std::time::Instant::now();
    set_endpoints(
        &slices,
        "local",
        &[("sim-zone-b-1", true), ("sim-zone-c-0", true)],
    )
    .await;
    eventually("the new node is added", || async {
        let hosts = hosts(&env).await;
        hosts.get("local")?.contains("sim-zone-c-0").then_some(())
    })
    .await;
    assert!(
        hosts(&env).await["local"].contains("sim-zone-a-0") || moved.elapsed() >= GRACE,
        "a-0 left before its grace was out"
    );
    eventually(
        "the node that stopped serving leaves after the grace",
        || async {
            let hosts = hosts(&env).await;
            (hosts.get("local")? == &set(&["sim-zone-b-1", "sim-zone-c-0"])).then_some(())
        },
    )
    .await;
    assert!(moved.elapsed() >= GRACE, "left after {:?}", moved.elapsed());
    let after = settled(&env).await;
    assert_eq!(
        changed(&before, &after),
        ["local"],
        "only the Local Service whose endpoints moved changed"
    );

    // Its endpoints on an excluded node do not make it a target, and a
    // Service whose only serving node is excluded keeps a subset.
    nodes
        .patch(
            "sim-zone-c-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {names::LABEL_EXCLUDE_FROM_LB: ""}}})),
        )
        .await
        .unwrap();
    eventually("the excluded node is no target", || async {
        let hosts = hosts(&env).await;
        (hosts.get("local")? == &set(&["sim-zone-b-1"])).then_some(())
    })
    .await;
    let excluded = settled(&env).await;
    set_endpoints(&slices, "no-pods", &[("sim-zone-c-0", true)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kept = settled(&env).await;
    assert_eq!(kept["no-pods"], excluded["no-pods"], "a subset, as before");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_that_becomes_local_is_backed_at_once_by_the_nodes_that_serve_it() {
    let (env, _, services, slices) = cluster(3, 4).await;
    // A Cluster Service's slices: the controller keeps no node of them.
    set_endpoints(
        &slices,
        "web",
        &[("sim-zone-a-0", true), ("sim-zone-b-1", true)],
    )
    .await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    let _c = start(&env).await;
    eventually("the Cluster Service has its subset", || async {
        let hosts = hosts(&env).await;
        (per_zone(hosts.get("web")?)
            .into_values()
            .collect::<Vec<_>>()
            == [3, 3, 3])
        .then_some(())
    })
    .await;
    let subset = settled(&env).await["web"].clone();

    let policy = |p: &str| Patch::Merge(json!({"spec": {"externalTrafficPolicy": p}}));
    services
        .patch("web", &PatchParams::default(), &policy("Local"))
        .await
        .unwrap();
    eventually(
        "once Local, it is on the nodes its slices had before",
        || async {
            let hosts = hosts(&env).await;
            (hosts.get("web")? == &set(&["sim-zone-a-0", "sim-zone-b-1"])).then_some(())
        },
    )
    .await;
    services
        .patch("web", &PatchParams::default(), &policy("Cluster"))
        .await
        .unwrap();
    eventually("Cluster again, it is back on its subset", || async {
        (hosts(&env).await.get("web")? == &subset).then_some(())
    })
    .await;

    // Slices seen before their Service: a new Local Service reads them.
    set_endpoints(&slices, "late", &[("sim-zone-c-3", true)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "late").local().build(),
        )
        .await
        .unwrap();
    eventually("a new Local Service is on the node serving it", || async {
        (hosts(&env).await.get("late")? == &set(&["sim-zone-c-3"])).then_some(())
    })
    .await;
}

/// Each load balancer's hosts as a pass over every node chooses them now
/// ([`subsets::choose_serving`], which the service controller ran for
/// every Service after each node change before it kept its membership),
/// from the API's Nodes and Services; `serving`: the nodes each Local
/// Service's slice names.
async fn chosen_by_a_full_pass(
    nodes: &Api<Node>,
    services: &Api<Service>,
    quota: u32,
    serving: &BTreeMap<String, BTreeSet<String>>,
) -> BTreeMap<String, BTreeSet<String>> {
    let strings = ccm_runtime::view::Interner::default();
    let mut views: Vec<NodeView> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| NodeView::of(n, &strings, false))
        .filter(|n| n.backs)
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    // The sim's total per load balancer does not bind a few nodes.
    let allowed = Allowed {
        per_zone: Some(quota),
        total: None,
    };
    let mut out = BTreeMap::new();
    for svc in services.list(&Default::default()).await.unwrap().items {
        let selection = subsets::selection(&svc, 25).unwrap();
        let on: Option<BTreeSet<&str>> = serving
            .get(&svc.name_any())
            .map(|s| s.iter().map(String::as_str).collect());
        let (chosen, _) = subsets::choose_serving(
            || views.iter(),
            |name| {
                let i = subsets::position(&views, name).ok()?;
                Some(&views[i])
            },
            subsets::seed(&svc),
            selection,
            allowed,
            on.as_ref(),
        );
        out.insert(
            svc.name_any(),
            chosen.into_iter().map(|n| n.name.clone()).collect(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_joining_leaving_and_changing_move_load_balancers_exactly_as_a_full_pass_would() {
    let (env, nodes, services, slices) = cluster(3, 4).await;
    set_endpoints(
        &slices,
        "local",
        &[("sim-zone-a-0", true), ("sim-zone-b-1", true)],
    )
    .await;
    let serving = BTreeMap::from([("local".to_owned(), set(&["sim-zone-a-0", "sim-zone-b-1"]))]);
    let _c = start(&env).await;
    for i in 0..4 {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", &format!("web-{i}")).build(),
            )
            .await
            .unwrap();
    }
    let one = load_balancer("default", "one")
        .annotation(names::ANNOTATION_LB_SUBSET_SIZE, "1")
        .build();
    let local = load_balancer("default", "local").local().build();
    for svc in [one, local] {
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    let patch = |name: &str, body: serde_json::Value| {
        let nodes = nodes.clone();
        let name = name.to_owned();
        async move {
            nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
        }
    };
    let agree = |what: &'static str| {
        let (env, nodes, services, serving) = (&env, &nodes, &services, &serving);
        async move {
            eventually(what, || async {
                let want = chosen_by_a_full_pass(nodes, services, 3, serving).await;
                (want.len() == 6 && hosts(env).await == want).then_some(())
            })
            .await
        }
    };
    agree("every load balancer on its full pass's hosts").await;

    // Each burst lands within one debounce window or across two.
    for name in ["sim-zone-a-new", "sim-zone-b-new", "sim-zone-c-new"] {
        add_node(&nodes, name).await;
    }
    agree("after three nodes joined").await;
    nodes
        .delete("sim-zone-a-1", &Default::default())
        .await
        .unwrap();
    nodes
        .delete("sim-zone-b-new", &Default::default())
        .await
        .unwrap();
    agree("after two nodes left").await;
    patch(
        "sim-zone-c-0",
        json!({"metadata": {"labels": {names::LABEL_EXCLUDE_FROM_LB: "true"}}}),
    )
    .await;
    patch("sim-zone-c-1", json!({"spec": {"unschedulable": true}})).await;
    agree("after one node was excluded and one cordoned").await;
    patch(
        "sim-zone-c-0",
        json!({"metadata": {"labels": {names::LABEL_EXCLUDE_FROM_LB: null}}}),
    )
    .await;
    patch("sim-zone-c-1", json!({"spec": {"unschedulable": false}})).await;
    patch(
        "sim-zone-b-2",
        json!({"spec": {"taints": [{"key": names::TAINT_TO_BE_DELETED, "effect": "NoSchedule"}]}}),
    )
    .await;
    agree("after both came back and the autoscaler took one").await;
    // A node serving the Local Service goes: it keeps the other.
    nodes
        .delete("sim-zone-a-0", &Default::default())
        .await
        .unwrap();
    add_node(&nodes, "sim-zone-a-later").await;
    agree("after a serving node left and another joined").await;
}
