//! The gateway's gRPC API over real loopback connections, through the typed
//! client every controller uses.

mod harness;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_proto::v1::{AttachmentState, VolumeState};
use ccm_proto::v1::{
    Faults, GetStatsRequest, Host, InstanceId, InstanceState, LookupPurpose, NodeRef, Route,
};
use ccm_proto::{Error, RetryPolicy, reason};
use ccm_provider::{
    self as provider, CloudError, Instances, LoadBalancers, Lookup, Operation, Provider, Routes,
};
use cloud_gateway::identity::Role;
use harness::{TestGateway, host, service, spec, timed, uid};

fn by_name(name: &str) -> NodeRef {
    NodeRef {
        name: name.into(),
        provider_id: String::new(),
    }
}

fn duration(d: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

#[tokio::test]
async fn provider_info_names_the_sim_and_its_capabilities() {
    let gw = TestGateway::start(|s| s.lookups.max_batch = 250).await;
    let info = timed(gw.client(Role::Node).provider_info()).await.unwrap();
    assert_eq!(info.name, "sim");
    assert!(info.instances && info.load_balancers && info.routes);
    // How many instances one of its cloud calls looks up (--max-batch).
    assert_eq!(info.instance_batch, 250);
}

#[tokio::test]
async fn instance_lookups_report_running_shutdown_and_confirmed_not_found() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    let created = gw.create_instance("node-a").await;
    let node = gw.client(Role::Node);
    let lookup = |nodes: Vec<NodeRef>| node.get_instances(nodes, LookupPurpose::Initialize, false);

    let results = timed(lookup(vec![
        by_name("node-a"),
        NodeRef {
            name: "renamed".into(),
            provider_id: created.provider_id.clone(),
        },
        by_name("ghost"),
    ]))
    .await
    .unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0].state(), InstanceState::Running);
    let instance = results[0].instance.as_ref().unwrap();
    assert_eq!(instance.provider_id, created.provider_id);
    assert_eq!(instance.region, "sim-region-1");
    assert!(!instance.zone.is_empty() && !instance.instance_type.is_empty());
    assert_eq!(instance.addresses.len(), 2);
    assert_eq!(
        results[1].state(),
        InstanceState::Running,
        "provider ID wins over the name"
    );
    assert_eq!(results[2].state(), InstanceState::NotFound);
    assert!(results[2].instance.is_none());

    gw.admin()
        .stop_instance(InstanceId {
            id: "node-a".into(),
        })
        .await
        .unwrap();
    let results = timed(lookup(vec![by_name("node-a")])).await.unwrap();
    assert_eq!(results[0].state(), InstanceState::Shutdown);
    assert!(
        results[0].instance.is_some(),
        "a stopped instance still exists"
    );

    gw.admin()
        .terminate_instance(InstanceId {
            id: created.id.clone(),
        })
        .await
        .unwrap();
    let results = timed(lookup(vec![by_name("node-a")])).await.unwrap();
    assert_eq!(results[0].state(), InstanceState::NotFound);
}

#[tokio::test]
async fn cached_answers_say_so_and_fresh_reads_go_to_the_cloud() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::from_secs(60)).await;
    gw.create_instance("node-a").await;
    let node = gw.client(Role::Node);
    let first = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false)
        .await
        .unwrap();
    assert!(!first[0].cached);
    let second = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false)
        .await
        .unwrap();
    assert!(second[0].cached);
    assert_eq!(gw.calls(Operation::GetInstances), 1);

    // The instance vanishes behind the cache's back (not through SimAdmin).
    gw.sim().terminate("node-a").unwrap();
    let cached = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Lifecycle, false)
        .await
        .unwrap();
    assert_eq!(
        (cached[0].state(), cached[0].cached),
        (InstanceState::Running, true)
    );
    let fresh = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Lifecycle, true)
        .await
        .unwrap();
    assert_eq!(
        (fresh[0].state(), fresh[0].cached),
        (InstanceState::NotFound, false)
    );
    assert_eq!(gw.calls(Operation::GetInstances), 2);
}

#[tokio::test]
async fn an_instance_read_all_the_time_is_refreshed_before_its_cache_entry_expires() {
    // A 1 s lifetime: reads from 0.8 s on also fetch the instance again.
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::from_secs(1)).await;
    gw.create_instance("node-a").await;
    let node = gw.client(Role::Node);
    let read = || node.get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false);
    assert!(!read().await.unwrap()[0].cached);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(read().await.unwrap()[0].cached, "young: a plain hit");
    assert_eq!(gw.calls(Operation::GetInstances), 1);
    // The instance stops behind the cache's back; a read near expiry is
    // answered from the cache at once and fetches the instance again.
    gw.sim().set_running("node-a", false).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let near = read().await.unwrap();
    assert_eq!(
        (near[0].state(), near[0].cached),
        (InstanceState::Running, true)
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while gw.calls(Operation::GetInstances) < 2 {
        assert!(std::time::Instant::now() < deadline, "no refresh");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the first answer's lifetime: the refreshed one, from the cache.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = read().await.unwrap();
    assert_eq!(
        (after[0].state(), after[0].cached),
        (InstanceState::Shutdown, true)
    );
    assert_eq!(gw.calls(Operation::GetInstances), 2);
}

#[tokio::test]
async fn entries_past_half_their_life_ride_in_a_call_made_anyway() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::from_secs(2)).await;
    for name in ["old", "new"] {
        gw.create_instance(name).await;
    }
    let node = gw.client(Role::Node);
    let read = |names: &[&str]| {
        node.get_instances(
            names.iter().map(|n| by_name(n)).collect(),
            LookupPurpose::Refresh,
            false,
        )
    };
    read(&["old"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // "old" is past half its life; "new" is a miss whose call has room.
    let answers = read(&["old", "new"]).await.unwrap();
    assert_eq!(
        answers.iter().map(|a| a.cached).collect::<Vec<_>>(),
        [true, false]
    );
    assert_eq!(gw.calls(Operation::GetInstances), 2, "no call of its own");
    // "old" was fetched again with "new": both live past the first
    // answer's lifetime, without another call.
    gw.sim().set_running("old", false).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let later = read(&["old", "new"]).await.unwrap();
    assert_eq!(
        later.iter().map(|a| a.cached).collect::<Vec<_>>(),
        [true, true]
    );
    assert_eq!(later[0].state(), InstanceState::Running);
    assert_eq!(gw.calls(Operation::GetInstances), 2);
}

#[tokio::test]
async fn writes_through_the_gateway_invalidate_the_cached_instance() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::from_secs(60)).await;
    gw.create_instance("node-a").await;
    let node = gw.client(Role::Node);
    node.get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false)
        .await
        .unwrap();
    gw.admin()
        .stop_instance(InstanceId {
            id: "node-a".into(),
        })
        .await
        .unwrap();
    let after = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false)
        .await
        .unwrap();
    assert_eq!(
        (after[0].state(), after[0].cached),
        (InstanceState::Shutdown, false)
    );
}

#[tokio::test]
async fn hundred_concurrent_lookups_of_one_instance_make_one_provider_call() {
    let gw = TestGateway::start(|s| {
        // No cache: the merging seen here is coalescing alone.
        s.lookups.cache_ttl = Duration::ZERO;
    })
    .await;
    gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            latency: [(
                "get_instances".to_owned(),
                duration(Duration::from_millis(300)).unwrap(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let node = gw.client(Role::Node);
    let lookups = (0..100).map(|_| {
        let node = node.clone();
        tokio::spawn(async move {
            node.get_instances(vec![by_name("node-a")], LookupPurpose::Initialize, false)
                .await
        })
    });
    for result in timed(futures::future::join_all(lookups)).await {
        assert_eq!(result.unwrap().unwrap()[0].state(), InstanceState::Running);
    }
    assert_eq!(gw.calls(Operation::GetInstances), 1);
}

#[tokio::test]
async fn hundred_concurrent_lookups_of_different_instances_are_batched() {
    const MAX_BATCH: usize = 25;
    let gw = TestGateway::start(|s| {
        s.lookups.cache_ttl = Duration::ZERO;
        s.lookups.max_batch = MAX_BATCH;
        // Wide enough that 100 calls arriving on a busy machine share it.
        s.lookups.batch_window = Duration::from_millis(300);
    })
    .await;
    for i in 0..100 {
        gw.create_instance(&format!("node-{i}")).await;
    }
    let node = gw.client(Role::Node);
    let lookups = (0..100).map(|i| {
        let node = node.clone();
        tokio::spawn(async move {
            node.get_instances(
                vec![by_name(&format!("node-{i}"))],
                LookupPurpose::Initialize,
                false,
            )
            .await
        })
    });
    for (i, result) in timed(futures::future::join_all(lookups))
        .await
        .into_iter()
        .enumerate()
    {
        let results = result.unwrap().unwrap();
        assert_eq!(results[0].state(), InstanceState::Running, "node-{i}");
        assert_eq!(results[0].node.as_ref().unwrap().name, format!("node-{i}"));
    }
    let calls = gw.calls(Operation::GetInstances);
    assert!(
        calls <= 100_u64.div_ceil(MAX_BATCH as u64),
        "{calls} provider calls"
    );
    let stats = gw
        .admin()
        .get_stats(GetStatsRequest { reset: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.instances_looked_up, 100);
}

#[tokio::test]
async fn load_balancer_lifecycle_create_update_list_delete() {
    let gw = TestGateway::start(|_| {}).await;
    let lbs = gw.client(Role::Service);
    let svc = service(&uid(1));

    let got = timed(lbs.get_load_balancer(svc.clone())).await.unwrap();
    assert!(!got.exists);

    let status = timed(lbs.ensure_load_balancer(spec(&uid(1)), vec![host("node-a")]))
        .await
        .unwrap();
    assert_eq!(status.ingress.len(), 1);
    let ip = status.ingress[0].ip.clone();
    assert!(ip.starts_with("203.0.113."), "{ip}");
    assert_eq!(status.ingress[0].ip_mode, "VIP");

    // Ensuring again is idempotent: same load balancer, same address.
    let again = lbs
        .ensure_load_balancer(spec(&uid(1)), vec![host("node-a")])
        .await
        .unwrap();
    assert_eq!(again, status);

    lbs.update_load_balancer_hosts(spec(&uid(1)), vec![host("node-a"), host("node-b")])
        .await
        .unwrap();
    let listed = lbs.list_load_balancers().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, provider::load_balancer_name(&uid(1)));
    assert_eq!(listed[0].service.as_ref().unwrap().uid, uid(1));
    assert_eq!(listed[0].hosts, ["node-a", "node-b"]);

    let got = lbs.get_load_balancer(svc.clone()).await.unwrap();
    assert!(got.exists);
    assert_eq!(got.status.unwrap().ingress[0].ip, ip);

    lbs.delete_load_balancer(svc.clone()).await.unwrap();
    lbs.delete_load_balancer(svc.clone())
        .await
        .expect("deleting again succeeds");
    assert!(!lbs.get_load_balancer(svc).await.unwrap().exists);
    assert!(lbs.list_load_balancers().await.unwrap().is_empty());
}

#[tokio::test]
async fn clusters_sharing_a_cloud_never_see_each_others_resources() {
    let gw = TestGateway::start(|_| {}).await;
    let blue = gw.client_with(Role::Service, RetryPolicy::default(), "blue");
    let green = gw.client_with(Role::Service, RetryPolicy::default(), "green");
    blue.ensure_load_balancer(spec(&uid(1)), vec![])
        .await
        .unwrap();
    assert_eq!(blue.list_load_balancers().await.unwrap().len(), 1);
    assert!(green.list_load_balancers().await.unwrap().is_empty());
    assert!(
        !green
            .get_load_balancer(service(&uid(1)))
            .await
            .unwrap()
            .exists
    );
    green.delete_load_balancer(service(&uid(1))).await.unwrap();
    assert_eq!(
        blue.list_load_balancers().await.unwrap().len(),
        1,
        "green's delete left blue's alone"
    );

    let blue_routes = gw.client_with(Role::Route, RetryPolicy::default(), "blue");
    let green_routes = gw.client_with(Role::Route, RetryPolicy::default(), "green");
    blue_routes
        .create_route("uid-1", route("node-a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert!(green_routes.list_routes().await.unwrap().is_empty());
}

#[tokio::test]
async fn slow_provisioning_answers_retry_after_until_ready() {
    let gw = TestGateway::start(|_| {}).await;
    gw.admin()
        .set_faults(Faults {
            lb_provisioning_delay: duration(Duration::from_millis(800)),
            ..Default::default()
        })
        .await
        .unwrap();
    let lbs = gw.client(Role::Service);
    let err = lbs
        .ensure_load_balancer(spec(&uid(2)), vec![])
        .await
        .unwrap_err();
    let Error::RetryAfter { delay, reason, .. } = err else {
        panic!("expected RetryAfter, got {err:?}");
    };
    assert_eq!(reason, reason::PROVISIONING);
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_millis(800),
        "{delay:?}"
    );
    // While provisioning, the load balancer exists without an address.
    let got = lbs.get_load_balancer(service(&uid(2))).await.unwrap();
    assert!(got.exists);
    assert!(got.status.unwrap_or_default().ingress.is_empty());

    tokio::time::sleep(delay).await;
    let status = lbs
        .ensure_load_balancer(spec(&uid(2)), vec![])
        .await
        .unwrap();
    assert_eq!(status.ingress.len(), 1);
    assert_eq!(
        lbs.list_load_balancers().await.unwrap().len(),
        1,
        "no second load balancer"
    );
}

#[tokio::test]
async fn invalid_annotations_are_refused_naming_the_field_and_nothing_is_created() {
    let gw = TestGateway::start(|_| {}).await;
    let lbs = gw.client(Role::Service);
    let mut bad = spec(&uid(3));
    bad.annotations
        .insert("sim.cloudgateway.io/algorithm".into(), "fastest".into());
    let err = lbs.ensure_load_balancer(bad, vec![]).await.unwrap_err();
    let Error::InvalidArgument { violations, .. } = err else {
        panic!("expected InvalidArgument, got {err:?}");
    };
    assert_eq!(violations.len(), 1);
    assert!(
        violations[0]
            .field
            .contains("sim.cloudgateway.io/algorithm")
    );
    assert!(violations[0].description.contains("least-connections"));
    assert!(lbs.list_load_balancers().await.unwrap().is_empty());
}

#[tokio::test]
async fn internal_load_balancers_and_requested_addresses_come_from_the_right_pool() {
    let gw = TestGateway::start(|_| {}).await;
    let lbs = gw.client(Role::Service);
    let mut internal = spec(&uid(4));
    internal.annotations.insert(
        "sim.cloudgateway.io/load-balancer-type".into(),
        "internal".into(),
    );
    let status = lbs.ensure_load_balancer(internal, vec![]).await.unwrap();
    assert!(status.ingress[0].ip.starts_with("10.255.0."), "{status:?}");

    let mut pinned = spec(&uid(5));
    pinned.load_balancer_ip = "203.0.113.77".into();
    let status = lbs.ensure_load_balancer(pinned, vec![]).await.unwrap();
    assert_eq!(status.ingress[0].ip, "203.0.113.77");

    let mut taken = spec(&uid(6));
    taken.load_balancer_ip = "203.0.113.77".into();
    let err = lbs.ensure_load_balancer(taken, vec![]).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");

    let mut outside = spec(&uid(7));
    outside.load_balancer_ip = "198.51.100.1".into();
    let err = lbs.ensure_load_balancer(outside, vec![]).await.unwrap_err();
    let Error::InvalidArgument { violations, .. } = err else {
        panic!("expected InvalidArgument, got {err:?}");
    };
    assert_eq!(violations[0].field, "spec.load_balancer_ip");
}

#[tokio::test]
async fn an_exhausted_pool_is_a_clear_error_and_deleting_frees_an_address() {
    let gw = TestGateway::start(|s| s.sim.lb_pool = vec!["192.0.2.0/30".parse().unwrap()]).await;
    let lbs = gw.client(Role::Service);
    lbs.ensure_load_balancer(spec(&uid(1)), vec![])
        .await
        .unwrap();
    lbs.ensure_load_balancer(spec(&uid(2)), vec![])
        .await
        .unwrap();
    let err = lbs
        .ensure_load_balancer(spec(&uid(3)), vec![])
        .await
        .unwrap_err();
    match &err {
        Error::Other { code, message } => {
            assert_eq!(*code, tonic::Code::ResourceExhausted);
            assert!(message.contains("192.0.2.0/30"), "{message}");
        }
        other => panic!("expected ResourceExhausted, got {other:?}"),
    }
    lbs.delete_load_balancer(service(&uid(1))).await.unwrap();
    lbs.ensure_load_balancer(spec(&uid(3)), vec![])
        .await
        .unwrap();
}

fn route(node: &str, cidr: &str) -> Route {
    Route {
        target_node: node.into(),
        destination_cidr: cidr.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn routes_are_created_idempotently_listed_and_deleted() {
    let gw = TestGateway::start(|_| {}).await;
    gw.create_instance("node-a").await;
    let routes = gw.client(Role::Route);
    let created = routes
        .create_route("uid-a", route("node-a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert!(!created.name.is_empty());
    let again = routes
        .create_route("uid-a", route("node-a", "10.244.1.0/24"))
        .await
        .unwrap();
    assert_eq!(again.name, created.name, "no duplicate route");
    let conflict = routes
        .create_route("uid-b", route("node-b", "10.244.1.0/24"))
        .await
        .unwrap_err();
    assert!(
        matches!(conflict, Error::AlreadyExists { .. }),
        "{conflict:?}"
    );

    routes
        .create_route("uid-gone", route("node-gone", "10.244.9.0/24"))
        .await
        .unwrap();
    let listed = routes.list_routes().await.unwrap();
    assert_eq!(listed.len(), 2);
    let gone = listed
        .iter()
        .find(|r| r.target_node == "node-gone")
        .unwrap();
    assert!(
        gone.blackhole,
        "a route to a vanished instance is a blackhole"
    );
    assert!(
        !listed
            .iter()
            .find(|r| r.target_node == "node-a")
            .unwrap()
            .blackhole
    );

    routes.delete_route(created.clone()).await.unwrap();
    routes
        .delete_route(created)
        .await
        .expect("deleting again succeeds");
    assert_eq!(routes.list_routes().await.unwrap().len(), 1);
}

#[tokio::test]
async fn callers_need_a_known_token_and_the_right_role() {
    let gw = TestGateway::start(|_| {}).await;
    let route_role = gw.client(Role::Route);
    let err = route_role
        .get_instances(vec![by_name("x")], LookupPurpose::Refresh, false)
        .await
        .unwrap_err();
    let Error::PermissionDenied { reason, .. } = err else {
        panic!("expected PermissionDenied, got {err:?}");
    };
    assert_eq!(reason, reason::ROLE_NOT_ALLOWED);
    for (role, allowed) in [
        (Role::Node, false),
        (Role::Service, true),
        (Role::Admin, true),
    ] {
        let result = gw.client(role).list_load_balancers().await;
        assert_eq!(result.is_ok(), allowed, "{role:?}: {result:?}");
    }
    let err = gw
        .client(Role::Service)
        .sim_admin()
        .unwrap()
        .get_faults(ccm_proto::v1::GetFaultsRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);

    let stranger = ccm_proto::GatewayClient::new(ccm_proto::ClientConfig::new(
        gw.address(),
        "kubernetes",
        ccm_proto::TokenSource::Static("not-a-token-of-this-gateway".into()),
    ))
    .unwrap();
    let err = stranger.provider_info().await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
}

#[tokio::test]
async fn cloud_failures_are_unavailable_and_retried_never_not_found() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            error_rate: 1.0,
            ..Default::default()
        })
        .await
        .unwrap();
    let node = gw.client(Role::Node);
    let err = timed(node.get_instances(vec![by_name("node-a")], LookupPurpose::Lifecycle, true))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let attempts = RetryPolicy::default().max_attempts as u64;
    assert_eq!(
        gw.calls(Operation::GetInstances),
        attempts,
        "retried, then gave up"
    );
}

#[tokio::test]
async fn cloud_throttling_is_a_retry_delay_and_slows_the_budget() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            throttle_rate: 1.0,
            throttle_retry_after: duration(Duration::from_millis(300)),
            ..Default::default()
        })
        .await
        .unwrap();
    let node = gw.client_with(Role::Node, RetryPolicy::none(), "kubernetes");
    let err = node
        .get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false)
        .await
        .unwrap_err();
    let Error::RetryAfter { delay, reason, .. } = err else {
        panic!("expected RetryAfter, got {err:?}");
    };
    assert_eq!(reason, reason::CLOUD_THROTTLED);
    assert_eq!(delay, Duration::from_millis(300));
}

/// A gateway whose budget lets one lookup reach the cloud every 250 ms (no
/// cache, no batching), instances `node-0` to `node-<instances - 1>`, and
/// a node controller's client; the budget's one token of burst is spent.
async fn with_a_tiny_budget(
    instances: usize,
    coalesce: bool,
) -> (TestGateway, ccm_proto::GatewayClient) {
    let gw = TestGateway::start(|s| {
        s.budget.rate = 4.0;
        s.budget.burst = 1.0;
        s.budget.max_wait = Duration::from_secs(3);
        s.lookups.cache_ttl = Duration::ZERO;
        s.lookups.batch_window = Duration::ZERO;
        s.lookups.max_batch = 1;
        s.lookups.coalesce = coalesce;
    })
    .await;
    for i in 0..instances {
        gw.create_instance(&format!("node-{i}")).await;
    }
    let node = gw.client_with(Role::Node, RetryPolicy::none(), "kubernetes");
    node.get_instances(vec![by_name("node-0")], LookupPurpose::Refresh, false)
        .await
        .unwrap();
    (gw, node)
}

#[tokio::test]
async fn with_a_tiny_budget_high_priority_goes_first_and_overflow_gets_a_retry_delay() {
    // Without coalescing every call needs its own slot of the budget.
    let (_gw, node) = with_a_tiny_budget(6, false).await;
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let spawn = |name: String, purpose: LookupPurpose| {
        let (node, finished) = (node.clone(), finished.clone());
        tokio::spawn(async move {
            let result = node
                .get_instances(vec![by_name(&name)], purpose, false)
                .await;
            finished.lock().unwrap().push(purpose);
            result
        })
    };
    let mut tasks = Vec::new();
    for i in 1..=3 {
        tasks.push(spawn(format!("node-{i}"), LookupPurpose::Refresh));
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    for i in 4..=5 {
        tasks.push(spawn(format!("node-{i}"), LookupPurpose::Initialize));
    }
    for task in timed(futures::future::join_all(tasks)).await {
        task.unwrap().unwrap();
    }
    let order = finished.lock().unwrap().clone();
    assert_eq!(
        &order[..2],
        &[LookupPurpose::Initialize, LookupPurpose::Initialize],
        "high priority overtook the waiting refreshes: {order:?}"
    );

    // Far more low-priority calls than fit in max_wait: the overflow is
    // refused at once with a delay, not queued forever.
    let flood: Vec<_> = (0..30)
        .map(|i| spawn(format!("node-{}", i % 6), LookupPurpose::Refresh))
        .collect();
    let results = timed(futures::future::join_all(flood)).await;
    let refused: Vec<_> = results
        .into_iter()
        .filter_map(|r| r.unwrap().err())
        .collect();
    assert!(!refused.is_empty(), "some calls must be refused");
    for err in refused {
        let Error::RetryAfter { delay, reason, .. } = err else {
            panic!("expected RetryAfter, got {err:?}");
        };
        assert_eq!(reason, reason::BUDGET_EXHAUSTED);
        assert!(delay > Duration::ZERO);
    }
}

#[tokio::test]
async fn an_urgent_lookup_joining_a_queued_refresh_of_the_same_node_does_not_wait_behind_other_refreshes()
 {
    let (_gw, node) = with_a_tiny_budget(5, true).await;
    let start = tokio::time::Instant::now();
    let spawn = |name: &str, purpose: LookupPurpose| {
        let (node, name) = (node.clone(), name.to_owned());
        tokio::spawn(async move {
            node.get_instances(vec![by_name(&name)], purpose, false)
                .await
                .unwrap();
            start.elapsed()
        })
    };
    // The address sync's refreshes queue for the budget, one call each...
    let refreshes: Vec<_> = (1..=3)
        .map(|i| spawn(&format!("node-{i}"), LookupPurpose::Refresh))
        .collect();
    tokio::time::sleep(Duration::from_millis(60)).await;
    // ...then the lifecycle check of node-3 joins node-3's queued refresh,
    // and node-4's starts a lookup of its own.
    let urgent = [
        spawn("node-3", LookupPurpose::Lifecycle),
        spawn("node-4", LookupPurpose::Lifecycle),
    ];
    let urgent: Vec<Duration> = timed(futures::future::join_all(urgent))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let refreshes: Vec<Duration> = timed(futures::future::join_all(refreshes))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let other_refreshes = refreshes[0].min(refreshes[1]);
    assert!(
        urgent.iter().all(|done| *done < other_refreshes),
        "both lifecycle checks answered before the refreshes of node-1 and node-2: \
         lifecycle {urgent:?}, refreshes {refreshes:?}"
    );
}

#[tokio::test]
async fn state_survives_a_restart_and_addresses_are_not_reissued() {
    let gw = TestGateway::start(|s| s.sim.lb_pool = vec!["192.0.2.0/29".parse().unwrap()]).await;
    gw.create_instance("node-a").await;
    let lbs = gw.client(Role::Service);
    let mut ips = HashSet::new();
    for n in 1..=3 {
        let status = lbs
            .ensure_load_balancer(spec(&uid(n)), vec![host("node-a")])
            .await
            .unwrap();
        assert!(ips.insert(status.ingress[0].ip.clone()));
    }
    gw.client(Role::Route)
        .create_route("uid-a", route("node-a", "10.244.1.0/24"))
        .await
        .unwrap();
    let dir = gw.stop().await;

    let gw = harness::TestGateway::start_in(dir.clone(), |s| {
        s.sim.lb_pool = vec!["192.0.2.0/29".parse().unwrap()]
    })
    .await;
    let instances = gw
        .admin()
        .list_instances(ccm_proto::v1::ListInstancesRequest {})
        .await
        .unwrap()
        .into_inner()
        .instances;
    assert_eq!(instances.len(), 1);
    assert_eq!(instances[0].name, "node-a");
    let lbs = gw.client(Role::Service);
    let listed = lbs.list_load_balancers().await.unwrap();
    assert_eq!(listed.len(), 3);
    for lb in &listed {
        assert!(ips.contains(&lb.status.as_ref().unwrap().ingress[0].ip));
    }
    // Ensuring an existing one keeps its address.
    let again = lbs
        .ensure_load_balancer(spec(&uid(1)), vec![])
        .await
        .unwrap();
    assert!(ips.contains(&again.ingress[0].ip));
    // New ones get the remaining addresses, never one in use.
    for n in 4..=6 {
        let status = lbs
            .ensure_load_balancer(spec(&uid(n)), vec![])
            .await
            .unwrap();
        assert!(
            ips.insert(status.ingress[0].ip.clone()),
            "{} reissued",
            status.ingress[0].ip
        );
    }
    assert_eq!(gw.client(Role::Route).list_routes().await.unwrap().len(), 1);
    // Instance numbering continues rather than reusing IDs.
    let next = gw.create_instance("node-b").await;
    assert_ne!(next.id, instances[0].id);
    gw.stop().await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// A provider with instances only, whose lookups fail with a cloud
/// permission error, and whose load balancers are handled elsewhere.
struct PartialCloud;

#[async_trait]
impl Provider for PartialCloud {
    fn name(&self) -> &str {
        "partial"
    }
    fn instances(&self) -> Option<&dyn Instances> {
        Some(self)
    }
    fn load_balancers(&self) -> Option<&dyn LoadBalancers> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }
    async fn check(&self) -> provider::Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Instances for PartialCloud {
    async fn get_instances(&self, _nodes: &[provider::NodeRef]) -> provider::Result<Vec<Lookup>> {
        Err(CloudError::PermissionDenied(
            "ec2:DescribeInstances is not allowed".into(),
        ))
    }
}

#[async_trait]
impl LoadBalancers for PartialCloud {
    async fn get(
        &self,
        _: &str,
        _: &provider::ServiceRef,
    ) -> provider::Result<Option<provider::LoadBalancerStatus>> {
        Ok(None)
    }
    async fn ensure(
        &self,
        _: &str,
        _: &provider::LoadBalancerSpec,
        _: &[provider::Host],
    ) -> provider::Result<provider::LoadBalancerStatus> {
        Err(CloudError::ImplementedElsewhere(
            "served by another controller".into(),
        ))
    }
    async fn update_hosts(
        &self,
        _: &str,
        _: &provider::LoadBalancerSpec,
        _: &[provider::Host],
    ) -> provider::Result<()> {
        Ok(())
    }
    async fn delete(&self, _: &str, _: &provider::ServiceRef) -> provider::Result<()> {
        Ok(())
    }
    async fn list(&self, _: &str) -> provider::Result<Vec<provider::LoadBalancer>> {
        Ok(vec![])
    }
}

#[tokio::test]
async fn provider_errors_keep_their_meaning_across_the_wire() {
    let gw = TestGateway::start_with_provider(Arc::new(PartialCloud)).await;
    let info = gw.client(Role::Node).provider_info().await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.instances, info.routes),
        ("partial", true, false)
    );

    let err = gw
        .client(Role::Node)
        .get_instances(
            vec![NodeRef {
                name: String::new(),
                provider_id: "partial://i-1".into(),
            }],
            LookupPurpose::Lifecycle,
            true,
        )
        .await
        .unwrap_err();
    let Error::PermissionDenied { reason, .. } = err else {
        panic!("a permission error must never read as not found: {err:?}");
    };
    assert_eq!(reason, reason::CLOUD_PERMISSION_DENIED);

    let err = gw.client(Role::Route).list_routes().await.unwrap_err();
    assert!(matches!(err, Error::Unimplemented { .. }), "{err:?}");

    let err = gw
        .client(Role::Service)
        .ensure_load_balancer(spec(&uid(1)), vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ImplementedElsewhere { .. }), "{err:?}");

    // No SimAdmin on a real provider.
    let err = gw
        .client(Role::Admin)
        .sim_admin()
        .unwrap()
        .get_faults(ccm_proto::v1::GetFaultsRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
}

#[tokio::test]
async fn unknown_sim_instances_are_not_found() {
    let gw = TestGateway::start(|_| {}).await;
    let err = gw
        .admin()
        .stop_instance(InstanceId {
            id: "i-999999".into(),
        })
        .await
        .unwrap_err();
    let err = Error::from_status(err);
    let Error::NotFound { reason, .. } = err else {
        panic!("expected NotFound, got {err:?}");
    };
    assert_eq!(reason, reason::NOT_FOUND);
}

#[tokio::test]
async fn a_call_past_its_deadline_is_deadline_exceeded() {
    let gw = TestGateway::start(|s| s.lookups.cache_ttl = Duration::ZERO).await;
    gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            latency: [("*".to_owned(), duration(Duration::from_secs(2)).unwrap())].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut config = ccm_proto::ClientConfig::new(
        gw.address(),
        "kubernetes",
        ccm_proto::TokenSource::File(gw.token_file(Role::Node)),
    );
    config.timeout = Duration::from_millis(200);
    config.retry = RetryPolicy::none();
    let node = ccm_proto::GatewayClient::new(config).unwrap();
    let err = timed(node.get_instances(vec![by_name("node-a")], LookupPurpose::Refresh, false))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err:?}");
}

#[tokio::test]
async fn updating_hosts_of_a_missing_load_balancer_is_not_found() {
    let gw = TestGateway::start(|_| {}).await;
    let err = gw
        .client(Role::Service)
        .update_load_balancer_hosts(spec(&uid(9)), vec![host("node-a")])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn hosts_past_the_clouds_quota_are_refused_naming_it_before_any_write() {
    let gw = TestGateway::start(|s| {
        s.sim.lb_hosts_per_zone = 2;
        s.sim.lb_hosts_per_load_balancer = 5;
    })
    .await;
    let info = timed(gw.client(Role::Node).provider_info()).await.unwrap();
    let [limits] = &info.host_limits[..] else {
        panic!("{:?}", info.host_limits);
    };
    assert_eq!((limits.per_zone, limits.per_load_balancer), (2, 5));
    let lbs = gw.client_with(Role::Service, RetryPolicy::none(), "kubernetes");
    let in_zone = |name: &str, zone: &str| Host {
        zone: zone.into(),
        ..host(name)
    };
    let three_in_a = vec![
        in_zone("a1", "sim-zone-a"),
        in_zone("a2", "sim-zone-a"),
        in_zone("a3", "sim-zone-a"),
    ];
    let err = timed(lbs.ensure_load_balancer(spec(&uid(1)), three_in_a))
        .await
        .unwrap_err();
    let Error::InvalidArgument { violations, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(violations[0].field, "hosts");
    assert!(
        violations[0]
            .description
            .contains("3 hosts in zone sim-zone-a exceed the sim quota of 2 hosts per zone"),
        "{err:?}"
    );
    let six: Vec<Host> = ["a", "b", "c"]
        .iter()
        .flat_map(|z| [1, 2].map(|i| in_zone(&format!("{z}{i}"), &format!("sim-zone-{z}"))))
        .collect();
    let err = timed(lbs.ensure_load_balancer(spec(&uid(1)), six.clone()))
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("6 hosts exceed the sim quota of 5 hosts per load balancer"),
        "{err:?}"
    );
    assert!(timed(lbs.list_load_balancers()).await.unwrap().is_empty());
    // Within the quota, made; a host update past it is refused the same.
    timed(lbs.ensure_load_balancer(spec(&uid(1)), six[..5].to_vec()))
        .await
        .unwrap();
    let err = timed(lbs.update_load_balancer_hosts(spec(&uid(1)), six.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    let listed = timed(lbs.list_load_balancers()).await.unwrap();
    assert_eq!(listed[0].hosts.len(), 5);
}

#[tokio::test]
async fn a_huge_invalid_request_is_invalid_argument_with_a_short_error() {
    let gw = TestGateway::start(|_| {}).await;
    let client = gw.client_with(Role::Node, RetryPolicy::none(), "kubernetes");
    let nodes: Vec<NodeRef> = (0..1000).map(|_| by_name(&"N".repeat(1000))).collect();
    let err = timed(client.get_instances(nodes, LookupPurpose::Initialize, true))
        .await
        .unwrap_err();
    let Error::InvalidArgument {
        violations,
        message,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!(violations.len(), 21, "{violations:?}");
    assert!(message.len() < 4096, "{} bytes", message.len());
    // A cluster name of 10 KB is named, not repeated.
    let long = gw.client_with(Role::Node, RetryPolicy::none(), &"c".repeat(10_000));
    let err = timed(long.get_instances(vec![by_name("n")], LookupPurpose::Initialize, true))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidArgument { violations, .. } if violations[0].field == "cluster_name"),
        "{err:?}"
    );
}

/// A volume made on a new instance's zone, `name`, whose attaches the sim
/// takes `attach_delay` to finish; with a Volume-role client.
async fn volume_attaching_slowly(
    gw: &TestGateway,
    name: &str,
    attach_delay: Duration,
) -> (
    ccm_proto::GatewayClient,
    ccm_proto::v1::SimInstance,
    ccm_proto::v1::Volume,
) {
    let instance = gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            volume_attach_delay: duration(attach_delay),
            ..Default::default()
        })
        .await
        .unwrap();
    let volumes = gw.client(Role::Volume);
    let volume = volumes
        .create_volume(ccm_proto::v1::CreateVolumeRequest {
            name: name.into(),
            zones: vec![instance.zone.clone()],
            ..Default::default()
        })
        .await
        .unwrap()
        .volume
        .unwrap();
    (volumes, instance, volume)
}

#[tokio::test]
async fn an_attach_past_the_wait_answers_retry_after_and_asked_again_the_same_device() {
    use ccm_proto::v1::{AttachVolumeRequest, GetVolumeRequest};
    let gw = TestGateway::start(|_| {}).await;
    // Longer than the gateway waits in one call (5 s), shorter than two.
    let (volumes, instance, volume) =
        volume_attaching_slowly(&gw, "pvc-slow", Duration::from_secs(7)).await;
    let attach = || {
        volumes.attach_volume(AttachVolumeRequest {
            volume_id: volume.id.clone(),
            instance_id: instance.id.clone(),
            ..Default::default()
        })
    };
    let err = attach().await.unwrap_err();
    let Error::RetryAfter { reason, .. } = &err else {
        panic!("expected RetryAfter, got {err:?}");
    };
    assert_eq!(reason, reason::PROVISIONING);
    let seen = volumes
        .get_volume(GetVolumeRequest {
            volume_id: volume.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .volume
        .unwrap();
    assert_eq!(seen.attachments.len(), 1, "{seen:?}");
    // Asked again: the same attachment, waited for until attached.
    let device = attach().await.unwrap().device;
    assert_eq!(
        device, seen.attachments[0].device,
        "one attachment, one device"
    );
}

#[tokio::test]
async fn an_attachment_stuck_attaching_is_detached_and_made_again_under_another_device() {
    use ccm_proto::v1::{AttachVolumeRequest, GetVolumeRequest};
    // Stuck after 3 s here (90 s by default, upstream's).
    let gw = TestGateway::start(|s| s.volume_attach_stuck_after = Duration::from_secs(3)).await;
    // An attach the cloud never finishes, as when the instance's system
    // already holds the device name.
    let (volumes, instance, volume) =
        volume_attaching_slowly(&gw, "pvc-stuck", Duration::from_secs(3600)).await;
    let attach = || {
        volumes.attach_volume(AttachVolumeRequest {
            volume_id: volume.id.clone(),
            instance_id: instance.id.clone(),
            ..Default::default()
        })
    };
    let read = || async {
        volumes
            .get_volume(GetVolumeRequest {
                volume_id: volume.id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .volume
            .unwrap()
    };
    // The first call waits its 5 s and answers PROVISIONING, still
    // attaching; past 3 s the attachment counts as stuck.
    let err = attach().await.unwrap_err();
    assert!(
        matches!(&err, Error::RetryAfter { reason, .. } if reason == reason::PROVISIONING),
        "{err:?}"
    );
    let stuck = read().await.attachments;
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0].state(), AttachmentState::Attaching);
    // Asked again: detached, and asked to ask again.
    let err = attach().await.unwrap_err();
    assert!(
        matches!(&err, Error::RetryAfter { reason, message, .. }
            if reason == reason::PROVISIONING && message.contains("stuck attaching")),
        "{err:?}"
    );
    assert!(read().await.attachments.is_empty());
    // The cloud attaches at once again: the next attach is under another
    // device name, not the one that got stuck.
    gw.admin().set_faults(Faults::default()).await.unwrap();
    let device = attach().await.unwrap().device;
    assert_ne!(device, stuck[0].device);
    let attached = read().await.attachments;
    assert_eq!(attached.len(), 1, "{attached:?}");
    assert_eq!(attached[0].state(), AttachmentState::Attached);
    assert_eq!(attached[0].device, device);
}

#[tokio::test]
async fn volumes_the_cloud_makes_in_seconds_are_waited_for_with_their_reads_gathered() {
    use ccm_proto::v1::{AttachVolumeRequest, CreateVolumeRequest, GetVolumeRequest};
    let gw = TestGateway::start(|_| {}).await;
    let instance = gw.create_instance("node-a").await;
    gw.admin()
        .set_faults(Faults {
            volume_create_delay: duration(Duration::from_secs(2)),
            volume_attach_delay: duration(Duration::from_secs(2)),
            ..Default::default()
        })
        .await
        .unwrap();
    let volumes = gw.client(Role::Volume);
    let creates = (0..20).map(|i| {
        volumes.create_volume(CreateVolumeRequest {
            name: format!("pvc-{i}"),
            zones: vec![instance.zone.clone()],
            ..Default::default()
        })
    });
    let made: Vec<String> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|r| r.unwrap().volume.unwrap())
        .inspect(|v| assert_eq!(v.state(), VolumeState::Available, "{v:?}"))
        .map(|v| v.id)
        .collect();
    let attaches = made.iter().map(|id| {
        volumes.attach_volume(AttachVolumeRequest {
            volume_id: id.clone(),
            instance_id: instance.id.clone(),
            ..Default::default()
        })
    });
    for attached in futures::future::join_all(attaches).await {
        attached.unwrap();
    }
    for id in &made {
        let volume = volumes
            .get_volume(GetVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .volume
            .unwrap();
        assert_eq!(
            volume.attachments[0].state(),
            AttachmentState::Attached,
            "{volume:?}"
        );
    }
    let stats = gw
        .admin()
        .get_stats(GetStatsRequest { reset: false })
        .await
        .unwrap()
        .into_inner();
    // 20 creates and 20 attaches, each waited for by reading once a
    // second: one read a second between them (and one before each
    // attach, gathered too), not one a waiter; the 20 reads just above
    // are one call each.
    let reads = stats.calls["get_volume"] - 20;
    assert!(reads <= 12, "{reads} gathered reads: {:?}", stats.calls);
    assert_eq!(stats.calls["create_volume"], 20, "{:?}", stats.calls);
    assert_eq!(stats.calls["attach_volume"], 20, "{:?}", stats.calls);
}

#[tokio::test]
async fn attaches_to_one_instance_read_its_devices_from_the_cloud_once() {
    use ccm_proto::v1::{AttachVolumeRequest, CreateVolumeRequest};
    let gw = TestGateway::start(|_| {}).await;
    let instance = gw.create_instance("node-a").await;
    let volumes = gw.client(Role::Volume);
    let mut made = Vec::new();
    for i in 0..5 {
        made.push(
            volumes
                .create_volume(CreateVolumeRequest {
                    name: format!("pvc-{i}"),
                    zones: vec![instance.zone.clone()],
                    ..Default::default()
                })
                .await
                .unwrap()
                .volume
                .unwrap()
                .id,
        );
    }
    let attaches = made.iter().map(|id| {
        volumes.attach_volume(AttachVolumeRequest {
            volume_id: id.clone(),
            instance_id: instance.id.clone(),
            ..Default::default()
        })
    });
    let devices: HashSet<String> = futures::future::join_all(attaches)
        .await
        .into_iter()
        .map(|a| a.unwrap().device)
        .collect();
    assert_eq!(devices.len(), 5, "{devices:?}");
    let stats = gw
        .admin()
        .get_stats(GetStatsRequest { reset: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.calls["volume_devices"], 1, "{:?}", stats.calls);
    assert_eq!(stats.calls["attach_volume"], 5, "{:?}", stats.calls);
}
