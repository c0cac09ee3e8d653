//! The service controller against the test API server and an in-process
//! gateway on the simulated cloud: upstream's load balancer checklist,
//! invalid annotations, retry-after, debounced host updates, orphans, and
//! leader-only writes.

use std::time::{Duration, Instant};

use ccm_proto::v1::{Faults, LoadBalancerSpec, Protocol, ServicePort, ServiceRef};
use ccm_provider::Operation;
use ccm_runtime::names;
use ccm_testkit::env::{TestController, TestEnv, eventually};
use clap::Parser;
use cloud_gateway::identity::Role;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_test_apiserver::fixtures::{load_balancer, node};
use serde_json::json;
use service_controller::args::{Args, Settings};
use tokio_util::sync::CancellationToken;

type Controller = TestController;

async fn start(env: &TestEnv, extra: &[&str]) -> Controller {
    let mut flags = vec!["service-controller".to_owned()];
    flags.extend(env.controller_flags(Role::Service));
    flags.extend(["--node-sync-debounce", "300ms"].map(String::from));
    flags.extend(extra.iter().map(|s| s.to_string()));
    let settings = Settings::from_args(&Args::try_parse_from(flags).unwrap()).unwrap();
    let stop = CancellationToken::new();
    let running = service_controller::start(settings, stop.clone())
        .await
        .unwrap();
    TestController::new(running, stop)
}

async fn ingress_ip(services: &Api<Service>, name: &str) -> String {
    eventually(&format!("{name} gets an ingress IP"), || async {
        let s = services.get(name).await.ok()?;
        s.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await
}

async fn lb_count(env: &TestEnv) -> usize {
    env.gateway_client(Role::Service)
        .list_load_balancers()
        .await
        .unwrap()
        .len()
}

async fn add_nodes(env: &TestEnv, names: impl IntoIterator<Item = String>) {
    let nodes: Api<Node> = Api::all(env.client().await);
    futures::future::join_all(names.into_iter().map(|n| {
        let nodes = nodes.clone();
        async move {
            nodes
                .create(&PostParams::default(), &node(&n).ready().build())
                .await
                .unwrap()
        }
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_gets_an_ingress_and_loses_it_on_type_change() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["n1".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    let ip = ingress_ip(&services, "web").await;
    assert!(ip.starts_with("203.0.113."), "{ip}");
    let svc = services.get("web").await.unwrap();
    assert!(
        svc.finalizers()
            .contains(&names::FINALIZER_LB_CLEANUP.to_owned())
    );
    assert_eq!(lb_count(&env).await, 1);
    for reason in ["EnsuringLoadBalancer", "EnsuredLoadBalancer"] {
        assert!(!env.events(reason).await.is_empty(), "{reason}");
    }
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    eventually(
        "load balancer removed, status cleared, finalizer gone",
        || async {
            let s = services.get("web").await.ok()?;
            let cleared = s
                .status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .is_none_or(Vec::is_empty);
            (lb_count(&env).await == 0 && cleared && s.finalizers().is_empty()).then_some(())
        },
    )
    .await;
    assert!(!env.events("DeletedLoadBalancer").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_service_deletes_its_load_balancer_before_the_service_goes() {
    let env = TestEnv::start().await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("service gone", || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(lb_count(&env).await, 0, "no load balancer leaked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_ip_and_foreign_class_services_cost_no_cloud_calls() {
    let env = TestEnv::start().await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    let mut plain = load_balancer("default", "plain").build();
    plain.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
    services
        .create(&PostParams::default(), &plain)
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "theirs")
                .class("example.com/other")
                .build(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.calls(Operation::EnsureLoadBalancer), 0);
    assert!(
        services
            .get("theirs")
            .await
            .unwrap()
            .finalizers()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_classes_are_served_when_asked_for() {
    let env = TestEnv::start().await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(
        &env,
        &[
            "--load-balancer-class",
            "sim.cloudgateway.io/lb",
            "--ignore-default-class",
        ],
    )
    .await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "named")
                .class("sim.cloudgateway.io/lb")
                .build(),
        )
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "default-class").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "named").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        lb_count(&env).await,
        1,
        "the class-less Service is not ours here"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_annotation_is_an_event_and_a_condition_and_never_a_cloud_write() {
    let env = TestEnv::start().await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    let svc = load_balancer("default", "web")
        .annotation("sim.cloudgateway.io/algorithm", "fastest")
        .build();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let s = eventually("a False condition", || async {
        let s = services.get("web").await.ok()?;
        let c = s
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == "LoadBalancerSynced")?
            .clone();
        (c.status == "False").then_some(c)
    })
    .await;
    assert_eq!(s.reason, "InvalidConfiguration");
    assert!(
        s.message.contains("sim.cloudgateway.io/algorithm")
            && s.message.contains("least-connections"),
        "{}",
        s.message
    );
    let warnings = env.events("SyncLoadBalancerFailed").await;
    assert!(
        warnings
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning"))
    );
    assert_eq!(lb_count(&env).await, 0, "nothing created in the cloud");
    // Fixed by the user: the load balancer comes and the condition clears.
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"sim.cloudgateway.io/algorithm": "source-ip"}}})))
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    eventually("condition True", || async {
        let s = services.get("web").await.ok()?;
        let c = s
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "LoadBalancerSynced")?;
        (c.status == "True").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_provisioning_is_retried_after_the_delay_the_cloud_gives() {
    let env = TestEnv::start().await;
    env.sim_admin()
        .set_faults(Faults {
            lb_provisioning_delay: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    let created = Instant::now();
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    // An exponential backoff would wait 5 s before the second try.
    assert!(
        created.elapsed() < Duration::from_secs(4),
        "took {:?}",
        created.elapsed()
    );
    assert_eq!(lb_count(&env).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_still_provisioning_are_read_together_not_ensured_again() {
    let env = TestEnv::start().await;
    env.sim_admin()
        .set_faults(Faults {
            lb_provisioning_delay: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    let names: Vec<String> = (0..20).map(|i| format!("web-{i}")).collect();
    for name in &names {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", name).build(),
            )
            .await
            .unwrap();
    }
    for name in &names {
        ingress_ip(&services, name).await;
    }
    // One ensure each; the cloud's "provisioning" answers are followed up
    // by status reads, which the gateway answers with shared listings.
    assert_eq!(env.calls(Operation::EnsureLoadBalancer), 20);
    let reads = env.calls(Operation::GetLoadBalancer) + env.calls(Operation::ListLoadBalancers);
    assert!(reads < 20, "{reads} status reads for 20 load balancers");
    assert_eq!(lb_count(&env).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_joining_cause_about_one_host_update_per_load_balancer() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["base".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    // Every node backs every load balancer (no subsets): each sees all 50.
    let c = start(
        &env,
        &[
            "--node-sync-debounce",
            "1s",
            "--load-balancer-subset-size",
            "0",
        ],
    )
    .await;
    for i in 0..20 {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", &format!("s{i}")).build(),
            )
            .await
            .unwrap();
    }
    for i in 0..20 {
        ingress_ip(&services, &format!("s{i}")).await;
    }
    let before = env.calls(Operation::UpdateLoadBalancerHosts);
    add_nodes(&env, (0..50).map(|i| format!("new-{i}"))).await;
    eventually("every load balancer has 51 hosts", || async {
        let lbs = env
            .gateway_client(Role::Service)
            .list_load_balancers()
            .await
            .ok()?;
        lbs.iter().all(|lb| lb.hosts.len() == 51).then_some(())
    })
    .await;
    let updates = env.calls(Operation::UpdateLoadBalancerHosts) - before;
    assert!(c.metric("service_controller_host_updates_total").await >= 20.0);
    // Each host pass updates a load balancer at most once, and the
    // debounce gathers the 50 joins into a few passes (one, unless
    // writing them outlasts its window), never one per node.
    // (A pass is counted as it ends, just after its updates.)
    let passes = eventually("at most one update per load balancer a pass", || async {
        let passes = c
            .metric("service_controller_host_sync_delay_seconds_count")
            .await as u64;
        (updates <= 20 * passes).then_some(passes)
    })
    .await;
    eprintln!("20 load balancers, 50 nodes joining: {updates} host updates in {passes} passes");
    assert!(passes < 25, "{passes} host passes for 50 nodes joining");
    // The SLO histograms: the node changes reached every load balancer in
    // timed host passes (a change may ride in a pass another change woke,
    // so no pass time is certain); the 20 Services got their ingress, and
    // their keys went through the queue.
    eventually("a host pass timed", || async {
        (c.metric("service_controller_host_sync_delay_seconds_count")
            .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(
        c.metric("service_controller_time_to_ingress_seconds_count")
            .await,
        20.0
    );
    assert_eq!(
        c.metric("service_controller_change_to_ingress_seconds_count")
            .await,
        20.0
    );
    assert!(
        c.metric("service_controller_queue_wait_seconds_count")
            .await
            >= 20.0
    );
    assert_eq!(c.metric("service_controller_queue_depth").await, 0.0);
    assert_eq!(
        c.metric(r#"ccm_controller_leader{lease="ccm-service-controller"}"#)
            .await,
        1.0
    );
}

/// A Service's first ensure and a host pass, in a fixed order: the
/// ensure chooses its hosts and is held in the cloud; a node joins, and its
/// host pass sends the load balancer's new hosts while the ensure is still
/// on its way. The update must not be lost behind the ensure, nor undone
/// by it: the load balancer ends with both nodes. (The other order, a pass
/// looking before the ensure has remembered its hosts, is
/// `context::tests`'.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_while_the_first_ensure_is_in_the_cloud_reaches_the_load_balancer() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["first".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let c = start(&env, &["--load-balancer-subset-size", "0"]).await;
    c.wait_ready().await;
    let held = |seconds| Faults {
        latency: [(
            "ensure_load_balancer".to_owned(),
            prost_types::Duration { seconds, nanos: 0 },
        )]
        .into(),
        ..Default::default()
    };
    env.sim_admin().set_faults(held(3)).await.unwrap();
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    // The sim counts a call as it comes in: the ensure has its hosts.
    eventually("the first ensure reaches the cloud", || async {
        (env.calls(Operation::EnsureLoadBalancer) >= 1).then_some(())
    })
    .await;
    add_nodes(&env, ["second".to_owned()]).await;
    eventually("the node's host pass sends an update", || async {
        (c.metric("service_controller_host_updates_total").await >= 1.0).then_some(())
    })
    .await;
    let web = services.get("web").await.unwrap();
    assert!(
        web.status
            .and_then(|s| s.load_balancer?.ingress)
            .is_none_or(|i| i.is_empty()),
        "the ensure was to be still in the cloud when the update was sent"
    );
    env.sim_admin().set_faults(held(0)).await.unwrap();
    ingress_ip(&services, "web").await;
    eventually("the load balancer has both nodes", || async {
        let lbs = env
            .gateway_client(Role::Service)
            .list_load_balancers()
            .await
            .ok()?;
        (lbs.len() == 1 && lbs[0].hosts.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_host_update_falls_back_to_a_full_ensure() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["n1".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    env.sim_admin()
        .set_faults(Faults {
            error_rate_by_operation: [("update_load_balancer_hosts".to_owned(), 1.0)].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ensures = env.calls(Operation::EnsureLoadBalancer);
    add_nodes(&env, ["n2".to_owned()]).await;
    eventually("hosts updated through ensure", || async {
        let lbs = env
            .gateway_client(Role::Service)
            .list_load_balancers()
            .await
            .ok()?;
        (lbs.first()?.hosts.len() == 2).then_some(())
    })
    .await;
    assert!(env.calls(Operation::EnsureLoadBalancer) > ensures);
    assert!(!env.events("UpdateLoadBalancerFailed").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_and_autoscaler_tainted_nodes_leave_the_load_balancer() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["a".to_owned(), "b".to_owned(), "c".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    let nodes: Api<Node> = Api::all(env.client().await);
    nodes
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {names::LABEL_EXCLUDE_FROM_LB: "true"}}})),
        )
        .await
        .unwrap();
    nodes.patch("b", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": names::TAINT_TO_BE_DELETED, "effect": "NoSchedule"}]}}))).await.unwrap();
    eventually("only c backs the load balancer", || async {
        let lbs = env
            .gateway_client(Role::Service)
            .list_load_balancers()
            .await
            .ok()?;
        (lbs.first()?.hosts == ["c"]).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reported_and_deleted_only_when_enabled() {
    let env = TestEnv::start().await;
    let orphan = LoadBalancerSpec {
        service: Some(ServiceRef {
            namespace: "default".into(),
            name: "gone".into(),
            uid: "0000aaaa-1111-2222-3333-444455556666".into(),
        }),
        ports: vec![ServicePort {
            name: String::new(),
            protocol: Protocol::Tcp as i32,
            port: 80,
            node_port: 30080,
        }],
        ..Default::default()
    };
    env.gateway_client(Role::Service)
        .ensure_load_balancer(orphan, vec![])
        .await
        .unwrap();
    let reporter = start(&env, &["--orphan-check-period", "200ms"]).await;
    eventually("orphan reported", || async {
        (reporter
            .metric("service_controller_orphaned_load_balancers")
            .await
            == 1.0)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(lb_count(&env).await, 1, "only reported by default");
    drop(reporter);
    let deleter = start(
        &env,
        &[
            "--orphan-check-period",
            "200ms",
            "--delete-orphaned-load-balancers",
            "--orphan-grace-period",
            "300ms",
        ],
    )
    .await;
    eventually("orphan deleted", || async {
        (lb_count(&env).await == 0).then_some(())
    })
    .await;
    // The count goes up once the delete has answered, a moment after the
    // load balancer is gone.
    eventually("the deletion counted", || async {
        (deleter
            .metric("service_controller_orphans_deleted_total")
            .await
            == 1.0)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_status_is_not_written_again() {
    let env = TestEnv::start().await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let _c = start(&env, &[]).await;
    services
        .create(
            &PostParams::default(),
            &load_balancer("default", "web").build(),
        )
        .await
        .unwrap();
    ingress_ip(&services, "web").await;
    let recorded = |svc: &Service| {
        svc.annotations()
            .get(ccm_runtime::names::ANNOTATION_LB_APPLIED)
            .cloned()
    };
    let first = eventually("the load balancer recorded", || async {
        recorded(&services.get("web").await.unwrap())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = services.get("web").await.unwrap().resource_version();
    // A label change does not sync; an annotation change does: the load
    // balancer is ensured again and the record follows, but the ingress
    // is the same, so the status is not written, and once recorded
    // nothing more is.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"note": "x"}}})),
        )
        .await
        .unwrap();
    let after_patch = services.get("web").await.unwrap().resource_version();
    assert_ne!(before, after_patch);
    eventually("the new spec recorded", || async {
        let svc = services.get("web").await.unwrap();
        (recorded(&svc).is_some() && recorded(&svc) != Some(first.clone())).then_some(())
    })
    .await;
    let settled = services.get("web").await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = services.get("web").await.unwrap();
    assert_eq!(now.resource_version(), settled.resource_version());
    assert_eq!(now.status, settled.status);
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
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    for i in 0..3 {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", &format!("s{i}")).build(),
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        ingress_ip(&services, &format!("s{i}")).await;
    }
    let (leader, standby) = if a.running.leadership.is_leader() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(leader.metric("service_controller_syncs_total").await >= 3.0);
    assert_eq!(standby.metric("service_controller_syncs_total").await, 0.0);
    let ensured = env.events("EnsuredLoadBalancer").await;
    let identity = leader.running.leadership.identity().to_owned();
    assert!(
        ensured
            .iter()
            .all(|e| e.reporting_instance.as_deref() == Some(identity.as_str()))
    );
}

#[test]
fn invalid_flags_exit_non_zero_listing_every_problem() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_service-controller"))
        .args([
            "--concurrent-service-syncs",
            "0",
            "--ignore-default-class",
            "--node-sync-debounce",
            "later",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    for key in [
        "concurrent-service-syncs",
        "ignore-default-class",
        "node-sync-debounce",
        "gateway-token-file",
    ] {
        assert!(stderr.contains(key), "{key} missing:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_reports_ready_once_the_caches_have_synced() {
    let env = TestEnv::start().await;
    start(&env, &[]).await.wait_ready().await;
}

/// A new leader (a restart, an upgrade, another replica) writes nothing to
/// the cloud for a Service whose record matches what it would ask and whose
/// load balancer the cloud confirms; a record that does not match, or a
/// load balancer the cloud no longer has, is ensured as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_ensures_only_what_the_services_record_and_the_cloud_do_not_confirm() {
    let env = TestEnv::start().await;
    add_nodes(&env, ["n1".to_owned(), "n2".to_owned()]).await;
    let services: Api<Service> = Api::namespaced(env.client().await, "default");
    let first = start(&env, &[]).await;
    for name in ["settled", "tampered", "gone"] {
        services
            .create(
                &PostParams::default(),
                &load_balancer("default", name).build(),
            )
            .await
            .unwrap();
    }
    let record = |svc: &Service| svc.annotations().get(names::ANNOTATION_LB_APPLIED).cloned();
    let mut recorded = std::collections::BTreeMap::new();
    for name in ["settled", "tampered", "gone"] {
        ingress_ip(&services, name).await;
        let value = eventually(&format!("{name} recorded"), || async {
            record(&services.get(name).await.unwrap())
        })
        .await;
        recorded.insert(name, value);
    }
    drop(first);
    // While nobody leads: one record no longer matches, and one load
    // balancer is deleted behind the controller's back.
    services
        .patch(
            "tampered",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                names::ANNOTATION_LB_APPLIED: "0000000000000000",
            }}})),
        )
        .await
        .unwrap();
    let gone = services.get("gone").await.unwrap();
    env.gateway_client(Role::Service)
        .delete_load_balancer(ServiceRef {
            namespace: "default".into(),
            name: "gone".into(),
            uid: gone.metadata.uid.clone().unwrap(),
        })
        .await
        .unwrap();
    assert_eq!(lb_count(&env).await, 2);
    let ensures = env.calls(Operation::EnsureLoadBalancer);
    let second = start(&env, &[]).await;
    eventually("the deleted load balancer made again", || async {
        (lb_count(&env).await == 3).then_some(())
    })
    .await;
    eventually("the tampered record mended", || async {
        (record(&services.get("tampered").await.unwrap()).as_ref() == recorded.get("tampered"))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        env.calls(Operation::EnsureLoadBalancer) - ensures,
        2,
        "only the tampered and the deleted Services are ensured"
    );
    assert_eq!(
        second
            .metric("service_controller_ensures_skipped_total")
            .await,
        1.0
    );
    assert_eq!(
        record(&services.get("settled").await.unwrap()).as_ref(),
        recorded.get("settled")
    );
}
