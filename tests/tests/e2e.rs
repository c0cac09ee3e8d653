//! End to end through the real binaries: the sandbox starts the API
//! server, the gateway and two replicas of every controller as processes,
//! registers nodes as kubelets would and creates LoadBalancer Services; it
//! exits 0 only once every node is initialised, every Service has an
//! ingress IP and every pod CIDR has a route.

use std::process::Command;

#[test]
fn the_sandbox_converges_with_real_processes() {
    let bin_dir = ccm_testkit::bin_dir();
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
    let out = Command::new(ccm_testkit::bin_dir().join("sandbox"))
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
    assert!(stdout.contains("load balancer addresses: 2/2"), "{stdout}");
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

mod scenarios {
    //! Scenarios on a sandbox driven from the test: kubelets heartbeat in the
    //! background while the test deletes, terminates and kills.

    use std::time::{Duration, Instant};

    use ccm_proto::Error as GatewayError;
    use ccm_proto::v1::{InstanceId, LookupPurpose, NodeRef};
    use ccm_sandbox::{CloudKind, Handle, Sandbox};
    use ccm_testkit::scenario::{
        LIMIT, finish, start, start_adjusted, start_on, start_with, until,
    };
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::ResourceExt;
    use kube::api::{Api, DeleteParams, PostParams};

    async fn lbs(handle: &Handle) -> usize {
        handle
            .gateway_client("service")
            .unwrap()
            .list_load_balancers()
            .await
            .unwrap()
            .len()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn services_nodes_and_routes_follow_the_cluster_and_the_cloud() {
        let (sandbox, kubelets, _dir) = start(4, 1).await;
        let h = sandbox.handle();
        until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
        let client = sandbox.client().await.unwrap();

        // A deleted Service leaves no load balancer behind.
        Api::<Service>::namespaced(client.clone(), "default")
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        let start = Instant::now();
        while lbs(&h).await > 0 {
            assert!(start.elapsed() < LIMIT, "load balancer not deleted");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }

        // A terminated instance: its node goes NotReady, is deleted, and its
        // route goes away.
        h.gateway_client("admin")
            .unwrap()
            .sim_admin()
            .unwrap()
            .terminate_instance(InstanceId {
                id: "node-3".into(),
            })
            .await
            .unwrap();
        let nodes: Api<Node> = Api::all(client);
        let start = Instant::now();
        while nodes.get_opt("node-3").await.unwrap().is_some() {
            assert!(start.elapsed() < LIMIT, "node-3 not deleted");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        until(&h, "route of node-3 removed", |p| {
            p.routes == 3 && p.nodes == 3
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killing_every_leader_hands_the_work_to_a_standby() {
        let (mut sandbox, kubelets, _dir) = start(2, 1).await;
        let h = sandbox.handle();
        until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
        for lease in [
            "ccm-node-controller",
            "ccm-service-controller",
            "ccm-route-controller",
        ] {
            let leader = sandbox.leader(lease).await.unwrap().expect("a leader");
            sandbox.kill(&leader).await.unwrap();
            let killed_at = Instant::now();
            loop {
                match sandbox.leader(lease).await.unwrap() {
                    Some(now) if now != leader => break,
                    _ => {
                        // Lease 6 s in the sandbox, plus a retry period and the
                        // settle check: about 8 s. The rest is room for a
                        // loaded machine (CI runs this beside the benchmark's
                        // smoke run), where a lease request may time out and
                        // wait for the next retry.
                        assert!(
                            killed_at.elapsed() < Duration::from_secs(20),
                            "{lease}: no takeover"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        }
        // Work continues under the new leaders.
        let client = sandbox.client().await.unwrap();
        Api::<Service>::namespaced(client, "default")
            .create(
                &PostParams::default(),
                &kube_test_apiserver::fixtures::load_balancer("default", "after").build(),
            )
            .await
            .unwrap();
        until(&h, "a second ingress IP", |p| p.ips.len() == 2).await;
        finish(sandbox, kubelets).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_controller_token_reaches_only_its_own_service() {
        let (sandbox, kubelets, _dir) = start(1, 0).await;
        let h = sandbox.handle();
        let node_ref = vec![NodeRef {
            name: "node-0".into(),
            provider_id: String::new(),
        }];
        let denied =
            |r: Result<(), GatewayError>| matches!(r, Err(GatewayError::PermissionDenied { .. }));
        let service = h.gateway_client("service").unwrap();
        let route = h.gateway_client("route").unwrap();
        let node = h.gateway_client("node").unwrap();
        assert!(denied(
            service
                .get_instances(node_ref.clone(), LookupPurpose::Refresh, false)
                .await
                .map(drop)
        ));
        assert!(denied(
            route
                .get_instances(node_ref, LookupPurpose::Refresh, false)
                .await
                .map(drop)
        ));
        assert!(denied(node.list_load_balancers().await.map(drop)));
        assert!(denied(node.list_routes().await.map(drop)));
        assert!(denied(service.list_routes().await.map(drop)));
        assert!(denied(route.list_load_balancers().await.map(drop)));
        let sim = node
            .sim_admin()
            .unwrap()
            .list_instances(ccm_proto::v1::ListInstancesRequest {})
            .await;
        assert_eq!(sim.unwrap_err().code(), tonic::Code::PermissionDenied);
        finish(sandbox, kubelets).await;
    }

    async fn create_services(client: &kube::Client, names: impl IntoIterator<Item = String>) {
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        futures::future::join_all(names.into_iter().map(|name| {
            let services = services.clone();
            async move {
                services
                    .create(
                        &PostParams::default(),
                        &kube_test_apiserver::fixtures::load_balancer("default", &name).build(),
                    )
                    .await
                    .unwrap()
            }
        }))
        .await;
    }

    /// Every LoadBalancer Service has exactly one load balancer and nothing
    /// else exists in the cloud.
    async fn exactly_one_load_balancer_each(h: &Handle, client: &kube::Client) {
        let services = Api::<Service>::namespaced(client.clone(), "default")
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let uids: std::collections::BTreeSet<String> = services
            .iter()
            .filter_map(|s| s.metadata.uid.clone())
            .collect();
        let lbs = h
            .gateway_client("service")
            .unwrap()
            .list_load_balancers()
            .await
            .unwrap();
        let owners: Vec<String> = lbs
            .iter()
            .map(|lb| lb.service.clone().unwrap_or_default().uid)
            .collect();
        let unique: std::collections::BTreeSet<&String> = owners.iter().collect();
        assert_eq!(
            owners.len(),
            unique.len(),
            "a Service has two load balancers"
        );
        assert_eq!(
            unique.len(),
            uids.len(),
            "{} load balancers for {} Services",
            unique.len(),
            uids.len()
        );
        assert!(
            unique.iter().all(|u| uids.contains(*u)),
            "a load balancer leaked"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gateway_killed_mid_work_and_restarted_leaves_exactly_one_load_balancer_per_service()
    {
        let (mut sandbox, kubelets, _dir) = start(2, 0).await;
        let h = sandbox.handle();
        until(&h, "nodes", |p| p.initialised == 2).await;
        let client = sandbox.client().await.unwrap();
        create_services(&client, (0..50).map(|i| format!("s{i:02}"))).await;
        // Some load balancers exist, others are on their way.
        until(&h, "the first ingress", |p| !p.ips.is_empty()).await;
        sandbox.kill("cloud-gateway").await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        sandbox.restart("cloud-gateway").unwrap();
        until(&h, "50 ingress IPs", |p| p.ips.len() == 50).await;
        exactly_one_load_balancer_each(&h, &client).await;
        finish(sandbox, kubelets).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_cloud_faults_during_churn_everything_converges_without_leaks() {
        churn_under_faults(CloudKind::Sim, 100).await;
    }

    /// Each NLB's instance targets, by its Service (`namespace/name`), as
    /// boto3 reads them from moto.
    fn nlb_targets_by_boto3(
        endpoint: &str,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
        let script = r#"
import boto3, json, sys
elb = boto3.client('elbv2', endpoint_url=sys.argv[1], region_name=sys.argv[2],
                   aws_access_key_id='a', aws_secret_access_key='b')
out = {}
for lb in elb.describe_load_balancers()['LoadBalancers']:
    arn = lb['LoadBalancerArn']
    tags = elb.describe_tags(ResourceArns=[arn])['TagDescriptions'][0]['Tags']
    svc = next((t['Value'] for t in tags if t['Key'] == 'kubernetes.io/service-name'), '')
    ids = set()
    try:
        groups = elb.describe_target_groups(LoadBalancerArn=arn)['TargetGroups']
    except elb.exceptions.TargetGroupNotFoundException:
        groups = []  # moto's answer while the load balancer has none yet
    for tg in groups:
        health = elb.describe_target_health(TargetGroupArn=tg['TargetGroupArn'])
        ids.update(d['Target']['Id'] for d in health['TargetHealthDescriptions'])
    out[svc] = sorted(ids)
print(json.dumps(out))
"#;
        serde_json::from_value(ccm_testkit::boto3(script, endpoint, &[])).unwrap()
    }

    /// On AWS through the real binaries, read back with boto3: a Local
    /// Service's NLB targets exactly the instances of the nodes where its
    /// endpoints serve, and follows them when they move (after the grace);
    /// a Cluster Service asking for one node per zone has one per zone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_a_local_nlb_targets_exactly_the_instances_that_serve_it() {
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube_test_apiserver::fixtures::{endpoint_slice, load_balancer};
        let extra = std::collections::BTreeMap::from([(
            "service-controller".to_owned(),
            vec!["--local-endpoints-grace-period=1s".to_owned()],
        )]);
        let (sandbox, kubelets, _dir) = start_with(CloudKind::Aws, 4, 0, extra).await;
        let h = sandbox.handle();
        until(&h, "nodes initialised", |p| p.initialised == 4).await;
        let client = sandbox.client().await.unwrap();
        let nodes = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let instance = |node: &Node| {
            let id = node.spec.as_ref().unwrap().provider_id.clone().unwrap();
            id.rsplit('/').next().unwrap().to_owned()
        };
        let zones: std::collections::BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| n.labels().get("topology.kubernetes.io/zone").cloned())
            .collect();
        let (a, b) = (nodes[0].name_any(), nodes[1].name_any());
        let moto = sandbox.aws.as_ref().unwrap().moto.endpoint.clone();

        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
        let slice = endpoint_slice("default", "local", "local-x1", &[(&a, true), (&b, false)]);
        slices.create(&PostParams::default(), &slice).await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let nlb = |svc: kube_test_apiserver::fixtures::ServiceBuilder| {
            svc.annotation("service.beta.kubernetes.io/aws-load-balancer-type", "nlb")
                .build()
        };
        services
            .create(
                &PostParams::default(),
                &nlb(load_balancer("default", "local").local()),
            )
            .await
            .unwrap();
        services
            .create(
                &PostParams::default(),
                &nlb(load_balancer("default", "one-per-zone")
                    .annotation("cloudgateway.io/load-balancer-subset-size", "1")),
            )
            .await
            .unwrap();

        let targets = |service: &str| {
            let moto = moto.clone();
            let service = service.to_owned();
            async move {
                tokio::task::spawn_blocking(move || nlb_targets_by_boto3(&moto))
                    .await
                    .unwrap()
                    .remove(&service)
                    .unwrap_or_default()
            }
        };
        let only = |node: &Node| std::collections::BTreeSet::from([instance(node)]);
        until_true(
            "the Local NLB targets the serving node's instance",
            async || targets("default/local").await == only(&nodes[0]),
        )
        .await;
        until_true("the other NLB has one instance per zone", async || {
            targets("default/one-per-zone").await.len() == zones.len()
        })
        .await;
        // kubectl ccm says why.
        let kubeconfig = sandbox.kubeconfig.clone();
        let why = tokio::task::spawn_blocking(move || {
            ccm_testkit::kubectl_ccm(&kubeconfig, &["why", "service/local"])
        })
        .await
        .unwrap();
        assert!(
            why.stdout
                .contains("it uses 1 of 4 eligible nodes (externalTrafficPolicy Local"),
            "{why:?}"
        );

        // The endpoint moves to the other node: its instance is added, and
        // the first one's goes once the grace is out.
        let mut moved = endpoint_slice("default", "local", "local-x1", &[(&b, true)]);
        moved.metadata.resource_version = slices
            .get("local-x1")
            .await
            .unwrap()
            .metadata
            .resource_version;
        slices
            .replace("local-x1", &PostParams::default(), &moved)
            .await
            .unwrap();
        until_true("the Local NLB follows its endpoint", async || {
            targets("default/local").await == only(&nodes[1])
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_with_faults_during_churn_no_nlb_target_group_or_security_group_leaks() {
        churn_under_faults(CloudKind::Aws, 20).await;
    }

    /// Creates `count` Services and deletes every other one while the cloud
    /// fails and throttles some of its calls; then checks that
    /// each remaining Service has exactly one load balancer, nothing leaked,
    /// and no node or route was lost.
    async fn churn_under_faults(cloud: CloudKind, count: usize) {
        let (sandbox, kubelets, _dir) = start_on(cloud, 3, 0).await;
        let h = sandbox.handle();
        until(&h, "nodes and routes", |p| {
            p.initialised == 3 && p.routes == 3
        })
        .await;
        match &sandbox.aws {
            // Per request: an ensure is fifteen or more AWS requests, so
            // 1.5% fails about a fifth of them.
            Some(aws) => {
                aws.proxy
                    .fail_at_rate(ccm_sandbox::aws::Fault::ServerError, 0.01);
                aws.proxy
                    .fail_at_rate(ccm_sandbox::aws::Fault::Throttle, 0.005);
            }
            None => {
                let mut faults = ccm_proto::v1::Faults {
                    error_rate: 0.2,
                    throttle_rate: 0.1,
                    ..Default::default()
                };
                faults.throttle_retry_after = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 200_000_000,
                });
                h.gateway_client("admin")
                    .unwrap()
                    .sim_admin()
                    .unwrap()
                    .set_faults(faults)
                    .await
                    .unwrap();
            }
        }
        let client = sandbox.client().await.unwrap();
        create_services(&client, (0..count).map(|i| format!("c{i:03}"))).await;
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        for i in (0..count).step_by(2) {
            services
                .delete(&format!("c{i:03}"), &DeleteParams::default())
                .await
                .unwrap();
        }
        // The deleted ones go (finalizers released), the others get
        // addresses.
        let start = Instant::now();
        loop {
            let listed = services.list(&Default::default()).await.unwrap().items;
            let left = listed.len();
            let p = h.progress().await.unwrap();
            if left == count / 2 && p.ips.len() == count / 2 {
                break;
            }
            // A Service that failed k times in a row waits upstream's
            // backoff, 5 s doubling: six failures in a row (one Service in
            // thousands of runs) are 315 s of waiting.
            if start.elapsed() > Duration::from_secs(330) {
                // What each Service still without an address was told.
                let mut waiting = Vec::new();
                for s in listed.iter().filter(|s| {
                    s.status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|l| l.ingress.as_ref())
                        .is_none_or(|i| i.is_empty())
                }) {
                    let name = s.metadata.name.clone().unwrap_or_default();
                    let notes = event_notes(&client, &name, "SyncLoadBalancerFailed").await;
                    waiting.push(format!("{name}: {notes:?}"));
                }
                panic!("not converged: {left} Services, {p}; waiting: {waiting:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        match &sandbox.aws {
            Some(aws) => aws.proxy.heal(),
            None => h
                .gateway_client("admin")
                .unwrap()
                .sim_admin()
                .unwrap()
                .set_faults(ccm_proto::v1::Faults::default())
                .await
                .map(drop)
                .unwrap(),
        }
        exactly_one_load_balancer_each(&h, &client).await;
        if let Some(aws) = &sandbox.aws {
            // Nothing of a deleted Service is left in the account: one
            // target group and one security group per NLB.
            let elb = ccm_sandbox::aws::elb_client(&aws.moto.endpoint);
            let groups = elb.describe_target_groups().send().await.unwrap();
            assert_eq!(groups.target_groups().len(), count / 2, "{groups:?}");
            let answer = aws.ec2.describe_security_groups().send().await.unwrap();
            let nlb_groups = answer
                .security_groups()
                .iter()
                .filter(|g| g.group_name().is_some_and(|n| n.starts_with("k8s-elb-")))
                .count();
            assert_eq!(nlb_groups, count / 2);
        }
        let p = h.progress().await.unwrap();
        assert_eq!(
            (p.nodes, p.routes),
            (3, 3),
            "no healthy node deleted, no route leaked"
        );
        finish(sandbox, kubelets).await;
    }

    /// Waits until the event `reason` has repeated (the recorder then
    /// patches its series instead of creating a new event).
    async fn until_repeated(client: &kube::Client, reason: &str) {
        let start = Instant::now();
        loop {
            let events = ccm_testkit::env::events(client, reason).await;
            if events.iter().any(|e| e.series.is_some()) {
                return;
            }
            assert!(start.elapsed() < LIMIT, "{reason} never repeated");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The sandbox on the emulated AWS account, converged.
    async fn start_on_aws(
        nodes: usize,
        services: usize,
    ) -> (Sandbox, tokio::task::JoinHandle<()>, tempfile::TempDir) {
        let started = start_with(CloudKind::Aws, nodes, services, Default::default()).await;
        let sandbox = &started.0;
        until(&sandbox.handle(), "convergence on AWS", |p| {
            p.converged(&sandbox.options)
        })
        .await;
        started
    }

    /// The messages of the `reason` events on the Service `name` in
    /// `default`.
    async fn event_notes(client: &kube::Client, name: &str, reason: &str) -> Vec<String> {
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(client.clone(), "default");
        let Ok(list) = events.list(&Default::default()).await else {
            return Vec::new();
        };
        list.items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(name)
            })
            .filter_map(|e| e.message)
            .collect()
    }

    async fn until_true(what: &str, mut check: impl AsyncFnMut() -> bool) {
        let start = Instant::now();
        while !check().await {
            assert!(start.elapsed() < LIMIT, "{what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Least privilege, both ways: every code path of every controller runs
    /// under the chart's RBAC (initialisation, label repair, shutdown taint,
    /// the deletion safeguard, deletion, load balancers with failures and
    /// deletion, routes with failures, leader leases, TokenReview), nothing
    /// is refused, and every (rule, verb, resource) the chart grants was
    /// used by some request.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_chart_grants_exactly_what_the_controllers_use() {
        let (sandbox, kubelets, _dir) = start(4, 1).await;
        let h = sandbox.handle();
        let client = sandbox.client().await.unwrap();
        let mut sim = h.gateway_client("admin").unwrap().sim_admin().unwrap();
        let failing = |ops: &[&str]| ccm_proto::v1::Faults {
            error_rate_by_operation: ops.iter().map(|o| (o.to_string(), 1.0)).collect(),
            ..Default::default()
        };

        // Cloud failures: route and load balancer errors repeat as events.
        sim.set_faults(failing(&["create_route", "ensure_load_balancer"]))
            .await
            .unwrap();
        until_repeated(&client, "FailedToCreateRoute").await;
        until_repeated(&client, "SyncLoadBalancerFailed").await;
        sim.set_faults(ccm_proto::v1::Faults::default())
            .await
            .unwrap();
        until(&h, "convergence", |p| p.converged(&sandbox.options)).await;

        // A node that lost its GA zone label gets it back from the beta one.
        let nodes: Api<Node> = Api::all(client.clone());
        let zone = "topology.kubernetes.io/zone";
        nodes
            .patch(
                "node-0",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {zone: null}}})),
            )
            .await
            .unwrap();
        until_true("zone label restored", async || {
            let n = nodes.get("node-0").await.unwrap();
            n.metadata.labels.unwrap_or_default().contains_key(zone)
        })
        .await;

        // A kubelet that reported no InternalIP: initialisation writes the
        // cloud's addresses into the node's status.
        sim.create_instance(ccm_proto::v1::CreateInstanceRequest {
            name: "node-4".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let bare = kube_test_apiserver::fixtures::node("node-4")
            .uninitialized()
            .address("Hostname", "node-4")
            .ready()
            .build();
        let status = bare.status.clone();
        nodes.create(&PostParams::default(), &bare).await.unwrap();
        nodes
            .patch_status(
                "node-4",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"status": status})),
            )
            .await
            .unwrap();
        until_true("cloud addresses written", async || {
            let n = nodes.get("node-4").await.unwrap();
            n.status
                .and_then(|s| s.addresses)
                .unwrap_or_default()
                .iter()
                .any(|a| a.type_ == "InternalIP")
        })
        .await;

        // A stopped instance: its node gets the shutdown taint.
        sim.stop_instance(InstanceId {
            id: "node-1".into(),
        })
        .await
        .unwrap();
        until_true("shutdown taint", async || {
            let n = nodes.get("node-1").await.unwrap();
            n.spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/shutdown")
        })
        .await;

        // Three of four instances gone at once: the safeguard holds the
        // deletions back, warning on every pass.
        for id in ["node-1", "node-2", "node-3"] {
            sim.terminate_instance(InstanceId { id: id.into() })
                .await
                .unwrap();
        }
        until_repeated(&client, "NodeDeletionHeldBack").await;
        // Two removed by hand: one of two left gone, below the safeguard's
        // minimum, so the controller deletes it.
        for name in ["node-2", "node-3"] {
            nodes.delete(name, &DeleteParams::default()).await.unwrap();
        }
        until_true("node-1 deleted", async || {
            nodes.get_opt("node-1").await.unwrap().is_none()
        })
        .await;

        // An operator asks kubectl ccm, under the viewer roles only.
        for args in [
            &["why", "service/demo"][..],
            &["why", "node/node-0"],
            &["status"],
        ] {
            let kubeconfig = sandbox.kubeconfig.clone();
            let mut args: Vec<&'static str> = args.to_vec();
            args.extend(["--as", "operator"]);
            let answer =
                tokio::task::spawn_blocking(move || ccm_testkit::kubectl_ccm(&kubeconfig, &args))
                    .await
                    .unwrap();
            assert!(matches!(answer.code, Some(0 | 1)), "{answer:?}");
        }
        // And lists the diagnostics API, as the viewer roles allow.
        let kubeconfig = kube::config::Kubeconfig::read_from(&sandbox.kubeconfig).unwrap();
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        config.auth_info.impersonate = Some("operator".into());
        let operator = kube::Client::try_from(config).unwrap();
        for path in [
            "/apis/diagnostics.cloudgateway.io/v1/servicediagnoses",
            "/apis/diagnostics.cloudgateway.io/v1/nodediagnoses",
            "/apis/diagnostics.cloudgateway.io/v1/namespaces/kube-system/components",
        ] {
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            let listed = operator.request_text(request).await;
            assert!(listed.is_ok(), "{path}: {listed:?}");
        }

        // A deleted Service: load balancer, status and finalizer go.
        Api::<Service>::namespaced(client.clone(), "default")
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        until_true("load balancer deleted", async || lbs(&h).await == 0).await;
        until(&h, "routes follow the nodes", |p| p.routes == 1).await;

        let report = sandbox.rbac_report().await.unwrap().expect("RBAC is on");
        kubelets.abort();
        sandbox.stop().await;
        assert_eq!(
            report["denied"],
            serde_json::json!([]),
            "refused: {report:#}"
        );
        assert_eq!(
            report["unused"],
            serde_json::json!([]),
            "the chart grants what no controller used: {report:#}"
        );
        assert!(report["roles"].as_u64().unwrap() >= 7, "{report}");
    }

    /// The controllers, unchanged, against a gateway that is not ours: the
    /// toy gateway in Python (tests/toy-gateway), which knows the contract
    /// only from the protos. The cluster converges and follows its cloud.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_the_python_gateway_the_controllers_converge_a_cluster() {
        let (sandbox, kubelets, _dir) = start_on(CloudKind::Toy, 4, 2).await;
        let h = sandbox.handle();
        until(&h, "convergence on the toy gateway", |p| {
            p.converged(&sandbox.options)
        })
        .await;
        let client = sandbox.client().await.unwrap();
        let nodes: Api<Node> = Api::all(client.clone());

        // Nodes carry what the toy cloud says of their instances.
        let mut names = Vec::new();
        for node in nodes.list(&Default::default()).await.unwrap().items {
            let name = node.metadata.name.clone().unwrap();
            let provider_id = node.spec.as_ref().unwrap().provider_id.clone();
            assert!(
                provider_id
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("toy://toy-1"),
                "{name}: {provider_id:?}"
            );
            let labels = node.metadata.labels.unwrap_or_default();
            let label = |key: &str| labels.get(key).map(String::as_str);
            assert_eq!(label("topology.kubernetes.io/region"), Some("toy-1"));
            assert_eq!(label("node.kubernetes.io/instance-type"), Some("toy.small"));
            assert!(label("topology.kubernetes.io/zone").is_some_and(|z| z.starts_with("toy-1")));
            names.push(name);
        }
        names.sort();
        // Services have addresses from the toy pool, with every node behind.
        let lb_hosts = async || {
            let mut all: Vec<Vec<String>> = h
                .gateway_client("service")
                .unwrap()
                .list_load_balancers()
                .await
                .unwrap()
                .into_iter()
                .map(|lb| lb.hosts)
                .collect();
            all.sort();
            all
        };
        let p = h.progress().await.unwrap();
        assert!(p.ips.iter().all(|ip| ip.starts_with("198.18.")), "{p}");
        until_true("every node behind both load balancers", async || {
            lb_hosts().await == vec![names.clone(), names.clone()]
        })
        .await;
        // Each node's pod CIDR is routed to it.
        let routes = h
            .gateway_client("route")
            .unwrap()
            .list_routes()
            .await
            .unwrap();
        for node in nodes.list(&Default::default()).await.unwrap().items {
            let cidr = node.spec.unwrap().pod_cidr.unwrap();
            let route = routes.iter().find(|r| r.destination_cidr == cidr);
            assert_eq!(
                route.map(|r| (r.target_node.as_str(), r.blackhole)),
                Some((node.metadata.name.as_deref().unwrap(), false)),
                "{routes:?}"
            );
        }

        // The toy cloud's console: a stopped instance taints its node; a
        // terminated one takes its node, route and backends with it.
        let mut console = h.gateway_client("admin").unwrap().sim_admin().unwrap();
        console
            .stop_instance(InstanceId {
                id: "node-1".into(),
            })
            .await
            .unwrap();
        until_true("shutdown taint", async || {
            nodes
                .get("node-1")
                .await
                .unwrap()
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/shutdown")
        })
        .await;
        console
            .terminate_instance(InstanceId {
                id: "node-1".into(),
            })
            .await
            .unwrap();
        until_true("node-1 deleted", async || {
            nodes.get_opt("node-1").await.unwrap().is_none()
        })
        .await;
        until(&h, "route of node-1 removed", |p| {
            p.routes == 3 && p.nodes == 3
        })
        .await;
        names.retain(|n| n != "node-1");
        until_true("node-1 no longer a backend", async || {
            lb_hosts().await == vec![names.clone(), names.clone()]
        })
        .await;

        // A deleted Service takes its load balancer.
        Api::<Service>::namespaced(client, "default")
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        until_true("load balancer deleted", async || lbs(&h).await == 1).await;
        finish(sandbox, kubelets).await;
    }

    /// The tagging controller through the real node controller: each
    /// Node's instance gets the tags and the Node upstream's label; a Node
    /// deleted takes the tags off its instance.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_the_tagging_controller_tags_each_nodes_instance() {
        let args = std::collections::BTreeMap::from([(
            "node-controller".to_owned(),
            vec!["--instance-tags=team=ml,cost-center=42".to_owned()],
        )]);
        let (sandbox, kubelets, _dir) = start_with(CloudKind::Aws, 2, 0, args).await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");
        let nodes: Api<Node> = Api::all(sandbox.client().await.unwrap());
        let tags_of = |id: String| {
            let ec2 = aws.ec2.clone();
            async move { ccm_sandbox::aws::instance_tags(&ec2, &id).await.unwrap() }
        };
        for instance in &aws.seeded.instances {
            until_true("the instance tagged and its Node labelled", async || {
                let tags = tags_of(instance.id.clone()).await;
                let labelled = nodes
                    .get(&instance.name)
                    .await
                    .ok()
                    .and_then(|n| n.metadata.labels)
                    .and_then(|l| l.get("k8s.io/cloud-provider-aws").cloned());
                tags.contains(&"team=ml".to_owned())
                    && tags.contains(&"cost-center=42".to_owned())
                    && labelled.is_some()
            })
            .await;
        }
        // md5("cost-center=42,team=ml"): upstream's checksum of the tags.
        let labels = nodes
            .get(&aws.seeded.instances[0].name)
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap();
        assert_eq!(
            labels["k8s.io/cloud-provider-aws"],
            "b34667e1bd6e920c3a33bbbae36f8328"
        );

        // The Node goes (its instance still runs): the tags go with it.
        let gone = &aws.seeded.instances[1];
        nodes.delete(&gone.name, &Default::default()).await.unwrap();
        until_true("the deleted Node's instance untagged", async || {
            !tags_of(gone.id.clone())
                .await
                .iter()
                .any(|t| t == "team=ml")
        })
        .await;
        assert!(
            tags_of(aws.seeded.instances[0].id.clone())
                .await
                .contains(&"team=ml".to_owned())
        );
        finish(sandbox, kubelets).await;
    }

    /// Kubelet serving certificates through the real processes: every
    /// simulated kubelet's request is approved on the cloud's word, and one
    /// naming another node's address is denied with why, under the chart's
    /// RBAC (approve on the kubelet-serving signer only).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubelet_serving_certificates_are_approved_on_the_clouds_word() {
        use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
        let (sandbox, kubelets, _dir) = start(3, 0).await;
        let h = sandbox.handle();
        until(&h, "every kubelet's serving certificate approved", |p| {
            p.initialised == 3 && p.serving_approved == 3
        })
        .await;
        // node-0's kubelet asks for node-1's address too.
        let client = sandbox.client().await.unwrap();
        let node_1: Node = Api::all(client.clone()).get("node-1").await.unwrap();
        let foreign = node_1
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .unwrap()
            .address;
        let node_0: Node = Api::all(client.clone()).get("node-0").await.unwrap();
        let mut addresses = node_0.status.and_then(|s| s.addresses).unwrap_or_default();
        addresses.push(k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: foreign.clone(),
        });
        let csr = ccm_sandbox::serving_csr("greedy", "node-0", &addresses).unwrap();
        let kubelet = h.kubelet_client("node-0").await.unwrap();
        Api::<CertificateSigningRequest>::all(kubelet)
            .create(&PostParams::default(), &csr)
            .await
            .unwrap();
        let csrs: Api<CertificateSigningRequest> = Api::all(client);
        until_true("the greedy CSR denied", async || {
            let c = csrs.get("greedy").await.unwrap();
            c.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.type_ == "Denied"
                        && c.reason.as_deref() == Some("ForeignAddress")
                        && c.message.as_deref().is_some_and(|m| m.contains(&foreign))
                })
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    /// A kops-style cluster ID (dots, capitals, an underscore) whose
    /// resources carry only the legacy `KubernetesCluster` tag, as clusters
    /// made before Kubernetes 1.6: the real controllers converge on it as
    /// upstream would, and what the gateway makes carries the new tag.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_a_kops_cluster_id_tagged_the_legacy_way_converges() {
        let cluster = "Full-Scale.k8s_Example.internal";
        let nlb_default = std::collections::BTreeMap::from([(
            "cloud-gateway".to_owned(),
            vec!["--aws-default-load-balancer-type=nlb".to_owned()],
        )]);
        let (sandbox, kubelets, _dir) = start_adjusted(CloudKind::Aws, 2, 1, nlb_default, |o| {
            o.cluster = cluster.into();
            o.legacy_cluster_tag = true;
        })
        .await;
        let h = sandbox.handle();
        until(&h, "convergence with a legacy-tagged kops cluster", |p| {
            p.converged(&sandbox.options)
        })
        .await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");

        // Routes went into the legacy-tagged route table.
        let routes = ccm_sandbox::aws::routes(&aws.ec2, &aws.seeded.route_table)
            .await
            .unwrap();
        assert_eq!(routes.len(), 2, "{routes:?}");

        // The load balancer carries the new tag with the dotted ID.
        let services: Api<Service> = Api::namespaced(sandbox.client().await.unwrap(), "default");
        let uid = services.get("demo").await.unwrap().metadata.uid.unwrap();
        let elb = ccm_sandbox::aws::elb_client(&aws.moto.endpoint);
        let nlb = elb
            .describe_load_balancers()
            .names(ccm_provider::load_balancer_name(&uid))
            .send()
            .await
            .unwrap()
            .load_balancers()[0]
            .clone();
        let tags = elb
            .describe_tags()
            .resource_arns(nlb.load_balancer_arn().unwrap())
            .send()
            .await
            .unwrap();
        let key = format!("kubernetes.io/cluster/{cluster}");
        assert!(
            tags.tag_descriptions()[0]
                .tags()
                .iter()
                .any(|t| t.key() == Some(key.as_str()) && t.value() == Some("owned")),
            "{tags:?}"
        );
        // The nodes' legacy-tagged group admits the NLB's own group, once
        // the host pass after the nodes' initialisation ran.
        let own = nlb.security_groups().first().cloned();
        until_true("the nodes' group admits the NLB's", async || {
            let group = aws
                .ec2
                .describe_security_groups()
                .group_ids(&aws.seeded.node_group)
                .send()
                .await
                .unwrap()
                .security_groups()[0]
                .clone();
            group
                .ip_permissions()
                .iter()
                .flat_map(|p| p.user_id_group_pairs())
                .any(|g| g.group_id().map(str::to_owned) == own)
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_nodes_initialise_and_routes_follow_the_instances() {
        let (sandbox, kubelets, _dir) = start_on(CloudKind::Aws, 3, 2).await;
        let h = sandbox.handle();
        until(&h, "convergence on AWS", |p| p.converged(&sandbox.options)).await;
        // Each kubelet's serving certificate (its private IP and DNS name)
        // is approved on EC2's word.
        until(&h, "serving certificates approved on AWS", |p| {
            p.serving_approved == 3
        })
        .await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");
        let client = sandbox.client().await.unwrap();
        let nodes: Api<Node> = Api::all(client);

        // Every node has its instance's provider ID and AWS labels.
        let mut cidr_of = std::collections::BTreeMap::new();
        for instance in &aws.seeded.instances {
            let node = nodes.get(&instance.name).await.unwrap();
            let spec = node.spec.clone().unwrap();
            assert_eq!(
                spec.provider_id.as_deref(),
                Some(instance.provider_id().as_str())
            );
            let labels = node.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get("topology.kubernetes.io/zone"),
                Some(&instance.zone)
            );
            assert_eq!(
                labels
                    .get("topology.kubernetes.io/region")
                    .map(String::as_str),
                Some(ccm_sandbox::aws::REGION)
            );
            assert_eq!(
                labels
                    .get("node.kubernetes.io/instance-type")
                    .map(String::as_str),
                Some("m5.large")
            );
            assert!(
                labels.contains_key("topology.k8s.aws/zone-id"),
                "{labels:?}"
            );
            cidr_of.insert(spec.pod_cidr.unwrap(), instance.id.clone());
        }
        // The cluster's route table sends each pod CIDR to its instance.
        let table = || ccm_sandbox::aws::routes(&aws.ec2, &aws.seeded.route_table);
        let want: Vec<(String, Option<String>)> = cidr_of
            .iter()
            .map(|(cidr, id)| (cidr.clone(), Some(id.clone())))
            .collect();
        let mut have = table().await.unwrap();
        have.sort();
        assert_eq!(have, want);

        // Each Service has its NLB's DNS name as its address, and the NLB
        // sends its port to every instance on the Service's node port.
        let elb = ccm_sandbox::aws::elb_client(&aws.moto.endpoint);
        let services: Api<Service> = Api::namespaced(sandbox.client().await.unwrap(), "default");
        let ids = |instances: &[ccm_sandbox::aws::SeededInstance]| {
            let mut ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
            ids.sort();
            ids
        };
        let mut nlbs = Vec::new();
        for name in ["demo", "demo-1"] {
            let svc = services.get(name).await.unwrap();
            let hostname = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
                .hostname
                .clone()
                .unwrap();
            let uid = svc.metadata.uid.unwrap();
            let nlb_name = ccm_provider::load_balancer_name(&uid);
            let nlb = elb
                .describe_load_balancers()
                .names(&nlb_name)
                .send()
                .await
                .unwrap()
                .load_balancers()[0]
                .clone();
            assert_eq!(nlb.dns_name(), Some(hostname.as_str()));
            let node_port = svc.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
            // Nodes become targets once they have provider IDs, on the
            // (debounced) host pass after their initialisation.
            let want = (ids(&aws.seeded.instances), Some(node_port));
            let start = Instant::now();
            loop {
                let have = nlb_targets(&elb, &nlb).await;
                if have == want {
                    break;
                }
                assert!(start.elapsed() < LIMIT, "{have:?}, not {want:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            nlbs.push(nlb);
        }

        // A Service that selects nodes by label targets only those, and
        // follows a label put on one more node.
        let annotation = "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
        let label = |name: &str| {
            let nodes = nodes.clone();
            let name = name.to_owned();
            async move {
                nodes
                    .patch(
                        &name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(
                            serde_json::json!({"metadata": {"labels": {"ccm-test/edge": "true"}}}),
                        ),
                    )
                    .await
                    .unwrap();
            }
        };
        label(&aws.seeded.instances[0].name).await;
        services
            .create(
                &PostParams::default(),
                &kube_test_apiserver::fixtures::load_balancer("default", "edge")
                    .annotation(annotation, "ccm-test/edge=true")
                    .build(),
            )
            .await
            .unwrap();
        let edge_nlb = || async {
            let uid = services.get("edge").await.ok()?.metadata.uid?;
            let name = ccm_provider::load_balancer_name(&uid);
            let answer = elb
                .describe_load_balancers()
                .names(name)
                .send()
                .await
                .ok()?;
            answer.load_balancers().first().cloned()
        };
        let until_targets = async |want: Vec<String>| {
            let start = Instant::now();
            loop {
                if let Some(nlb) = edge_nlb().await
                    && nlb_targets(&elb, &nlb).await.0 == want
                {
                    return;
                }
                assert!(start.elapsed() < LIMIT, "edge NLB never targeted {want:?}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        };
        until_targets(ids(&aws.seeded.instances[..1])).await;
        label(&aws.seeded.instances[1].name).await;
        until_targets(ids(&aws.seeded.instances[..2])).await;
        services
            .delete("edge", &DeleteParams::default())
            .await
            .unwrap();

        // Terminating an instance through EC2 deletes its Node and its route.
        let gone = &aws.seeded.instances[2];
        aws.ec2
            .terminate_instances()
            .instance_ids(&gone.id)
            .send()
            .await
            .unwrap();
        let start = Instant::now();
        while nodes.get_opt(&gone.name).await.unwrap().is_some() {
            assert!(start.elapsed() < LIMIT, "{} not deleted", gone.name);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let start = Instant::now();
        loop {
            let have = table().await.unwrap();
            if !have
                .iter()
                .any(|(_, id)| id.as_deref() == Some(gone.id.as_str()))
            {
                assert_eq!(have.len(), 2, "{have:?}");
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "route to {} not removed: {have:?}",
                gone.id
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // ... and takes it out of every NLB.
        let left = ids(&aws.seeded.instances[..2]);
        for nlb in &nlbs {
            let start = Instant::now();
            while nlb_targets(&elb, nlb).await.0 != left {
                assert!(start.elapsed() < LIMIT, "{} still a target", gone.id);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }

        // Deleting a Service deletes its NLB and its target groups.
        services
            .delete("demo-1", &DeleteParams::default())
            .await
            .unwrap();
        let start = Instant::now();
        loop {
            let answer = elb.describe_load_balancers().send().await.unwrap();
            let names: Vec<&str> = answer
                .load_balancers()
                .iter()
                .filter_map(|l| l.load_balancer_name())
                .collect();
            if names == [nlbs[0].load_balancer_name().unwrap()] {
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "NLB of demo-1 not deleted: {names:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // Its target groups go after it, in the same delete.
        let start = Instant::now();
        loop {
            let groups = elb.describe_target_groups().send().await.unwrap();
            if groups.target_groups().len() == 1 {
                break;
            }
            assert!(start.elapsed() < LIMIT, "{groups:?}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        finish(sandbox, kubelets).await;
    }

    /// A move from cloud-provider-aws, through the real controllers: a
    /// Service whose NLB upstream made (without a security group, its
    /// default) keeps it, with the same DNS name; the Service gets an
    /// `AdoptedLoadBalancer` event; upstream's target group goes once ours
    /// has the targets; the delete leaves nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_an_nlb_cloud_provider_aws_made_is_adopted_with_an_event() {
        let (sandbox, kubelets, _dir) = start_on_aws(2, 0).await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");
        let client = sandbox.client().await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), "default");

        // The Service as it was: its UID names the NLB upstream made.
        let svc = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "legacy", "annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}},
            "spec": {"type": "ClusterIP", "selector": {"app": "legacy"},
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        }))
        .unwrap();
        let made = services.create(&PostParams::default(), &svc).await.unwrap();
        let lb_name = ccm_provider::load_balancer_name(made.metadata.uid.as_deref().unwrap());
        let elb = ccm_sandbox::aws::elb_client(&aws.moto.endpoint);
        let upstream = ccm_sandbox::aws::UpstreamService {
            namespace: "default",
            name: "legacy",
            lb_name: &lb_name,
            node_port: 30555,
        };
        let (theirs, their_group) = ccm_sandbox::aws::upstream_nlb(
            &aws.ec2,
            &elb,
            &aws.seeded,
            ccm_sandbox::CLUSTER,
            &upstream,
            &[],
        )
        .await
        .unwrap();
        services
            .patch(
                "legacy",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {
                    "type": "LoadBalancer",
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30555}],
                }})),
            )
            .await
            .unwrap();

        let dns = theirs.dns_name().unwrap().to_owned();
        until_true("the Service shows the NLB's DNS name", async || {
            services.get("legacy").await.is_ok_and(|s| {
                s.status
                    .and_then(|st| st.load_balancer)
                    .and_then(|lb| lb.ingress)
                    .is_some_and(|i| i.first().and_then(|i| i.hostname.as_deref()) == Some(&dns))
            })
        })
        .await;
        until_true("an AdoptedLoadBalancer event on the Service", async || {
            event_notes(&client, "legacy", "AdoptedLoadBalancer")
                .await
                .iter()
                .any(|m| m.contains(&lb_name))
        })
        .await;
        let gone = async || {
            elb.describe_target_groups()
                .names(&their_group)
                .send()
                .await
                .map_or(true, |a| a.target_groups().is_empty())
        };
        until_true("upstream's target group replaced", gone).await;
        let nlbs = elb.describe_load_balancers().send().await.unwrap();
        assert_eq!(nlbs.load_balancers().len(), 1, "never a second NLB");

        services
            .delete("legacy", &DeleteParams::default())
            .await
            .unwrap();
        until_true("the NLB deleted with its target groups", async || {
            let nlbs = elb.describe_load_balancers().send().await.unwrap();
            let groups = elb.describe_target_groups().send().await.unwrap();
            nlbs.load_balancers().is_empty() && groups.target_groups().is_empty()
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    /// Real-world manifests (`tests/manifests/aws`), applied as written:
    /// each gets the load balancer cloud-provider-aws
    /// would make, what upstream reads is honoured, and each annotation it
    /// ignores is an `AnnotationHasNoEffect` event on its Service, nothing
    /// refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_real_world_manifests_behave_as_upstream_with_events_for_what_it_ignores() {
        let (sandbox, kubelets, _dir) = start_on_aws(2, 0).await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");
        let client = sandbox.client().await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        // Applied as written (kubectl sends no token over plain HTTP, so
        // the files go through the API as they are).
        let manifests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/aws");
        for file in std::fs::read_dir(&manifests).unwrap() {
            let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
            let svc: Service = serde_norway::from_str(&text).unwrap();
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
        let names = ["ingress-nginx-controller", "api-edge", "legacy-web"];
        for name in names {
            until_true(&format!("{name} has an address"), async || {
                services.get(name).await.is_ok_and(|s| {
                    s.status
                        .and_then(|st| st.load_balancer)
                        .and_then(|lb| lb.ingress)
                        .is_some_and(|i| !i.is_empty())
                })
            })
            .await;
        }
        let said = async |name: &str, reason: &str| event_notes(&client, name, reason).await;
        let ignored = [
            ("api-edge", "nlb-target-type has no effect"),
            ("api-edge", "scheme has no effect"),
            ("api-edge", "proxy-protocol has no effect on an NLB"),
            (
                "legacy-web",
                "eip-allocations has no effect on a Classic ELB",
            ),
        ];
        for (name, text) in ignored {
            until_true(&format!("{name}: {text}"), async || {
                said(name, "AnnotationHasNoEffect")
                    .await
                    .iter()
                    .any(|m| m.contains(text))
            })
            .await;
        }
        // One note says all a Service's ignored annotations, and nothing
        // else of them: no other annotation is said to be ignored, none
        // refused.
        for name in names {
            let notes = said(name, "AnnotationHasNoEffect").await.join("\n");
            let expected = ignored.iter().filter(|(n, _)| *n == name).count();
            assert_eq!(
                notes.matches("has no effect").count(),
                expected,
                "{name}: {notes}"
            );
            assert!(
                said(name, "SyncLoadBalancerFailed").await.is_empty(),
                "{name}"
            );
        }

        // What upstream reads is on the load balancers.
        let elb = ccm_sandbox::aws::elb_client(&aws.moto.endpoint);
        let uid = async |name: &str| {
            let svc = services.get(name).await.unwrap();
            ccm_provider::load_balancer_name(svc.metadata.uid.as_deref().unwrap())
        };
        let nlb_of = async |name: &str| {
            let lb_name = uid(name).await;
            elb.describe_load_balancers()
                .names(lb_name)
                .send()
                .await
                .unwrap()
                .load_balancers()[0]
                .clone()
        };
        let attributes = async |arn: &str| -> std::collections::BTreeMap<String, String> {
            elb.describe_load_balancer_attributes()
                .load_balancer_arn(arn)
                .send()
                .await
                .unwrap()
                .attributes()
                .iter()
                .map(|a| {
                    (
                        a.key().unwrap_or_default().to_owned(),
                        a.value().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        };
        let nginx = nlb_of("ingress-nginx-controller").await;
        let nginx_attributes = attributes(nginx.load_balancer_arn().unwrap()).await;
        assert_eq!(
            nginx_attributes["load_balancing.cross_zone.enabled"],
            "true"
        );
        let edge = nlb_of("api-edge").await;
        let edge_attributes = attributes(edge.load_balancer_arn().unwrap()).await;
        assert_eq!(edge_attributes["access_logs.s3.enabled"], "true");
        assert_eq!(edge_attributes["access_logs.s3.bucket"], "edge-logs");
        let listeners = elb
            .describe_listeners()
            .load_balancer_arn(edge.load_balancer_arn().unwrap())
            .send()
            .await
            .unwrap();
        let group = listeners.listeners()[0].default_actions()[0]
            .target_group_arn()
            .unwrap()
            .to_owned();
        let group_attributes = elb
            .describe_target_group_attributes()
            .target_group_arn(group)
            .send()
            .await
            .unwrap();
        assert!(
            group_attributes
                .attributes()
                .iter()
                .any(|a| a.key() == Some("proxy_protocol_v2.enabled") && a.value() == Some("true")),
            "{group_attributes:?}"
        );
        let classic = ccm_sandbox::aws::classic_elb_client(&aws.moto.endpoint);
        let legacy = uid("legacy-web").await;
        let described = classic
            .describe_load_balancer_attributes()
            .load_balancer_name(&legacy)
            .send()
            .await
            .unwrap();
        let a = described.load_balancer_attributes().unwrap();
        assert_eq!(a.connection_settings().map(|c| c.idle_timeout()), Some(300));
        assert_eq!(a.connection_draining().map(|d| d.enabled()), Some(true));

        for name in names {
            services
                .delete(name, &DeleteParams::default())
                .await
                .unwrap();
        }
        until_true("every load balancer deleted", async || {
            let nlbs = elb.describe_load_balancers().send().await.unwrap();
            let classics = classic.describe_load_balancers().send().await.unwrap();
            nlbs.load_balancers().is_empty() && classics.load_balancer_descriptions().is_empty()
        })
        .await;
        finish(sandbox, kubelets).await;
    }

    /// On AWS with the gateway's defaults, as an operator leaving
    /// cloud-provider-aws runs it: a Service without a type annotation
    /// gets a Classic ELB whose DNS name stays through node churn and a
    /// refused type change, and whose delete leaves nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_aws_a_service_without_a_type_keeps_its_classic_elb_until_deleted() {
        let (sandbox, kubelets, _dir) = start_on_aws(3, 1).await;
        let aws = sandbox.aws.as_ref().expect("the AWS account");
        let client = sandbox.client().await.unwrap();
        let services: Api<Service> = Api::namespaced(client.clone(), "default");
        let classic = ccm_sandbox::aws::classic_elb_client(&aws.moto.endpoint);
        let svc = services.get("demo").await.unwrap();
        let hostname = svc
            .status
            .clone()
            .unwrap()
            .load_balancer
            .unwrap()
            .ingress
            .unwrap()[0]
            .hostname
            .clone()
            .unwrap();
        let name = ccm_provider::load_balancer_name(svc.metadata.uid.as_deref().unwrap());
        let elb = async || {
            let answer = classic
                .describe_load_balancers()
                .load_balancer_names(&name)
                .send()
                .await
                .ok()?;
            answer.load_balancer_descriptions().first().cloned()
        };
        let registered = async || {
            let mut ids: Vec<String> = elb()
                .await
                .map(|e| {
                    e.instances()
                        .iter()
                        .filter_map(|i| i.instance_id().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            ids.sort();
            ids
        };
        assert_eq!(elb().await.unwrap().dns_name(), Some(hostname.as_str()));
        let mut all: Vec<String> = aws.seeded.instances.iter().map(|i| i.id.clone()).collect();
        all.sort();
        until_true("every instance registered", async || {
            registered().await == all
        })
        .await;

        // An instance goes: its Node goes, and it leaves the ELB.
        let gone = &aws.seeded.instances[2];
        aws.ec2
            .terminate_instances()
            .instance_ids(&gone.id)
            .send()
            .await
            .unwrap();
        until_true("instance deregistered", async || {
            !registered().await.contains(&gone.id)
        })
        .await;

        // Asking for an NLB now is refused on the Service, and changes
        // nothing.
        services
            .patch(
                "demo",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                    "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}}})),
            )
            .await
            .unwrap();
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(client.clone(), "default");
        until_true("a Warning event names the type annotation", async || {
            events.list(&Default::default()).await.is_ok_and(|l| {
                l.items.iter().any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.message
                            .as_deref()
                            .is_some_and(|m| m.contains("aws-load-balancer-type"))
                })
            })
        })
        .await;
        let now = services.get("demo").await.unwrap();
        let still = now.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0]
            .hostname
            .clone();
        assert_eq!(still.as_deref(), Some(hostname.as_str()));
        let nlbs = ccm_sandbox::aws::elb_client(&aws.moto.endpoint)
            .describe_load_balancers()
            .send()
            .await
            .unwrap();
        assert!(nlbs.load_balancers().is_empty(), "{nlbs:?}");

        // Delete: the ELB, its group and the nodes' rule go.
        services
            .delete("demo", &DeleteParams::default())
            .await
            .unwrap();
        until_true("Classic ELB deleted", async || elb().await.is_none()).await;
        let group_name = format!("k8s-elb-{name}");
        until_true("its security group deleted", async || {
            let answer = aws.ec2.describe_security_groups().send().await.unwrap();
            !answer
                .security_groups()
                .iter()
                .any(|g| g.group_name() == Some(group_name.as_str()))
        })
        .await;
        let nodes = aws
            .ec2
            .describe_security_groups()
            .group_ids(&aws.seeded.node_group)
            .send()
            .await
            .unwrap();
        let rules = nodes.security_groups()[0].ip_permissions();
        assert!(
            rules.iter().all(|p| p.user_id_group_pairs().is_empty()),
            "the nodes' group still admits a deleted ELB: {rules:?}"
        );
        finish(sandbox, kubelets).await;
    }

    /// The instance targets of an NLB's one target group, sorted, and the
    /// port they are registered on.
    async fn nlb_targets(
        elb: &aws_sdk_elasticloadbalancingv2::Client,
        nlb: &aws_sdk_elasticloadbalancingv2::types::LoadBalancer,
    ) -> (Vec<String>, Option<i32>) {
        // An NLB whose listener is not made yet has no target group: moto
        // answers TargetGroupNotFound then.
        let Ok(groups) = elb
            .describe_target_groups()
            .load_balancer_arn(nlb.load_balancer_arn().unwrap())
            .send()
            .await
        else {
            return (Vec::new(), None);
        };
        let health = elb
            .describe_target_health()
            .target_group_arn(groups.target_groups()[0].target_group_arn().unwrap())
            .send()
            .await
            .unwrap();
        let targets: Vec<_> = health
            .target_health_descriptions()
            .iter()
            .filter_map(|d| d.target())
            .collect();
        let mut ids: Vec<String> = targets
            .iter()
            .filter_map(|t| t.id().map(str::to_owned))
            .collect();
        ids.sort();
        (ids, targets.first().and_then(|t| t.port()))
    }
}
