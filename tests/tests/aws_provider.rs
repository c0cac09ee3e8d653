//! The gateway's AWS provider over real gRPC, against moto (an AWS API
//! emulator) started by each test, through a proxy that injects AWS's
//! failures and counts the actions the gateway sends. The gateway is the
//! real binary with dummy credentials in its environment, as in a pod.

use std::path::Path;
use std::time::Duration;

use ccm_proto::v1::{InstanceState, LookupPurpose, NodeAddressType, NodeRef, Route};
use ccm_proto::{Error, reason};
use ccm_sandbox::aws::{self, Fault, FaultProxy, Moto, Seeded};
use ccm_sandbox::gateway::GatewayProcess;

const CLUSTER: &str = "kubernetes";
const TIMEOUT: Duration = Duration::from_secs(90);

struct Env {
    dir: tempfile::TempDir,
    _moto: Moto,
    proxy: FaultProxy,
    ec2: aws_sdk_ec2::Client,
    seeded: Seeded,
    gateway: GatewayProcess,
    secret: String,
    /// The actions the gateway sent before it was ready.
    startup: std::collections::BTreeMap<String, usize>,
}

/// moto with one cluster seeded, and the gateway on it through the proxy.
async fn env(instances: usize, args: &[&str]) -> Env {
    env_with(instances, args, |_| {}).await
}

/// [`env`], with `before` setting up the proxy before the gateway starts.
async fn env_with(instances: usize, args: &[&str], before: impl FnOnce(&FaultProxy)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto")).await.unwrap();
    let ec2 = moto.ec2();
    let seeded = aws::seed(&ec2, CLUSTER, instances).await.unwrap();
    let proxy = FaultProxy::start(&moto.endpoint).await.unwrap();
    before(&proxy);
    let secret = aws::secret_access_key();
    let mut all: Vec<String> = [
        "--provider",
        "aws",
        "--aws-endpoint-url",
        &proxy.endpoint,
        "--aws-vpc-id",
        &seeded.vpc,
        "--cache-ttl",
        "0s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.extend(args.iter().map(|s| s.to_string()));
    let gateway = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &dir.path().join("gateway"),
        &all,
        &aws::credentials_env(&secret, dir.path()),
    )
    .await
    .unwrap();
    assert!(
        gateway.wait_ready(TIMEOUT).await,
        "gateway not ready:\n{}",
        gateway.log_text()
    );
    let startup = proxy.take_actions();
    Env {
        dir,
        _moto: moto,
        proxy,
        ec2,
        seeded,
        gateway,
        secret,
        startup,
    }
}

fn by_name(name: &str) -> NodeRef {
    NodeRef {
        name: name.into(),
        provider_id: String::new(),
    }
}

fn by_id(provider_id: &str) -> NodeRef {
    NodeRef {
        name: "ignored".into(),
        provider_id: provider_id.into(),
    }
}

fn addresses(instance: &ccm_proto::v1::Instance) -> Vec<(String, String)> {
    instance
        .addresses
        .iter()
        .map(|a| {
            (
                NodeAddressType::kubernetes_name_of(a.r#type).to_owned(),
                a.address.clone(),
            )
        })
        .collect()
}

async fn timed<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(TIMEOUT, f)
        .await
        .expect("test step timed out")
}

#[tokio::test]
async fn instances_are_found_by_private_dns_name_and_provider_id_with_aws_metadata() {
    let env = env(3, &["--aws-node-ip-families", "ipv4,ipv6"]).await;
    let node = env.gateway.client("node", CLUSTER);
    let names: Vec<NodeRef> = env
        .seeded
        .instances
        .iter()
        .map(|i| by_name(&i.name))
        .collect();
    let results = timed(node.get_instances(names, LookupPurpose::Initialize, true))
        .await
        .unwrap();
    // One batch, one request per kind of key.
    assert_eq!(env.proxy.take_actions().get("DescribeInstances"), Some(&1));
    for (seeded, result) in env.seeded.instances.iter().zip(&results) {
        assert_eq!(result.state, InstanceState::Running as i32, "{result:?}");
        let instance = result.instance.as_ref().unwrap();
        assert_eq!(instance.provider_id, seeded.provider_id());
        assert!(instance.provider_id.starts_with("aws:///eu-west-1"));
        assert_eq!(instance.instance_type, "m5.large");
        assert_eq!(instance.zone, seeded.zone);
        assert_eq!(instance.region, aws::REGION);
        assert!(
            instance
                .additional_labels
                .get("topology.k8s.aws/zone-id")
                .is_some_and(|z| z.starts_with("euw1-az")),
            "{instance:?}"
        );
        let addresses = addresses(instance);
        assert_eq!(
            addresses[0],
            ("InternalIP".to_owned(), seeded.private_ip.clone()),
            "the primary private address comes first: {addresses:?}"
        );
        for kind in ["InternalDNS", "Hostname"] {
            assert!(
                addresses.contains(&(kind.to_owned(), seeded.name.clone())),
                "{kind} missing: {addresses:?}"
            );
        }
        assert!(
            addresses
                .iter()
                .any(|(k, a)| k == "InternalIP" && a.contains(':')),
            "the IPv6 address is an InternalIP: {addresses:?}"
        );
    }
    // The same instances by provider ID (also the bare instance ID some
    // kubelets were given, which upstream takes), and by a resource name.
    let first = &env.seeded.instances[0];
    let results = timed(node.get_instances(
        vec![
            by_id(&first.provider_id()),
            by_id(&first.id),
            by_name(&first.id),
        ],
        LookupPurpose::Refresh,
        true,
    ))
    .await
    .unwrap();
    for result in &results {
        assert_eq!(
            result.instance.as_ref().unwrap().provider_id,
            first.provider_id()
        );
    }
}

#[tokio::test]
async fn a_batch_answers_not_found_for_exactly_the_missing_and_terminated_instances() {
    let env = env(4, &[]).await;
    let [live, stopped, terminated, other] = &env.seeded.instances[..] else {
        unreachable!()
    };
    env.ec2
        .stop_instances()
        .instance_ids(&stopped.id)
        .send()
        .await
        .unwrap();
    env.ec2
        .terminate_instances()
        .instance_ids(&terminated.id)
        .send()
        .await
        .unwrap();
    env.proxy.take_actions();
    let node = env.gateway.client("node", CLUSTER);
    let results = timed(node.get_instances(
        vec![
            by_id(&live.provider_id()),
            by_id("aws:///eu-west-1a/i-0123456789abcdef0"),
            by_id(&stopped.provider_id()),
            by_id(&terminated.provider_id()),
            by_name(&other.name),
            by_name("ip-10-0-9-9.eu-west-1.compute.internal"),
            by_name(&terminated.name),
        ],
        LookupPurpose::Lifecycle,
        true,
    ))
    .await
    .unwrap();
    let states: Vec<InstanceState> = results
        .iter()
        .map(|r| InstanceState::try_from(r.state).unwrap())
        .collect();
    assert_eq!(
        states,
        [
            InstanceState::Running,
            InstanceState::NotFound,
            InstanceState::Shutdown,
            InstanceState::NotFound,
            InstanceState::Running,
            InstanceState::NotFound,
            InstanceState::NotFound,
        ]
    );
    assert!(results.iter().all(|r| !r.cached));
    // IPv4 addresses only by default, as upstream gives them.
    let live_addresses = addresses(results[0].instance.as_ref().unwrap());
    assert!(
        !live_addresses.iter().any(|(_, a)| a.contains(':')),
        "{live_addresses:?}"
    );
    // IDs in one request, names in another: never one per node; and one
    // for the network topology of the instance type seen first. All are
    // charged to the budget and counted.
    let actions = env.proxy.take_actions();
    assert_eq!(actions.get("DescribeInstances"), Some(&2));
    assert_eq!(actions.get("DescribeInstanceTopology"), Some(&1));
    assert_eq!(
        env.gateway
            .metric("cloud_gateway_cloud_api_requests_total{operation=\"get_instances\"}")
            .await,
        3.0
    );
}

#[tokio::test]
async fn instances_get_network_topology_labels_asked_once_in_a_batch() {
    let env = env(2, &[]).await;
    let [a, b] = &env.seeded.instances[..] else {
        unreachable!()
    };
    env.proxy
        .set_topology(&a.id, &["nn-spine", "nn-mid", "nn-leaf"]);
    let node = env.gateway.client("node", CLUSTER);
    let layers = |instance: &ccm_proto::v1::Instance| {
        let mut l: Vec<(String, String)> = instance
            .additional_labels
            .iter()
            .filter(|(k, _)| k.starts_with("topology.k8s.aws/network-node-layer-"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        l.sort();
        l
    };
    let lookup = |nodes: Vec<NodeRef>| {
        let node = node.clone();
        async move {
            timed(node.get_instances(nodes, LookupPurpose::Initialize, true))
                .await
                .map(|r| {
                    r.into_iter()
                        .map(|r| r.instance.unwrap_or_default())
                        .collect::<Vec<_>>()
                })
        }
    };
    env.proxy.take_actions();
    let found = lookup(vec![by_name(&a.name), by_name(&b.name)])
        .await
        .unwrap();
    assert_eq!(
        layers(&found[0]),
        [
            (
                "topology.k8s.aws/network-node-layer-1".into(),
                "nn-spine".into()
            ),
            (
                "topology.k8s.aws/network-node-layer-2".into(),
                "nn-mid".into()
            ),
            (
                "topology.k8s.aws/network-node-layer-3".into(),
                "nn-leaf".into()
            ),
        ]
    );
    assert!(layers(&found[1]).is_empty());
    assert_eq!(
        env.proxy.take_actions().get("DescribeInstanceTopology"),
        Some(&1)
    );
    // Known now: the instance's layers, and that its type has none else.
    let again = lookup(vec![by_id(&a.provider_id()), by_id(&b.provider_id())])
        .await
        .unwrap();
    assert_eq!(layers(&again[0]).len(), 3);
    assert_eq!(
        env.proxy.take_actions().get("DescribeInstanceTopology"),
        None
    );

    // A type AWS reports topology for waits for its answer: no Node of it
    // starts without its labels.
    let (_, subnet) = &env.seeded.subnets[0];
    let p4 = env
        .ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(aws_sdk_ec2::types::InstanceType::P4d24xlarge)
        .subnet_id(subnet)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap()
        .instances()[0]
        .instance_id()
        .unwrap()
        .to_owned();
    let p4_id = format!("aws:///{}/{p4}", env.seeded.subnets[0].0);
    env.proxy.set_topology(&p4, &["nn-x"]);
    env.proxy
        .fail(Some("DescribeInstanceTopology"), Fault::ServerError, 1000);
    let err = lookup(vec![by_id(&p4_id)]).await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { .. } | Error::RetryAfter { .. }),
        "{err:?}"
    );
    env.proxy.heal();
    let found = lookup(vec![by_id(&p4_id)]).await.unwrap();
    assert_eq!(
        layers(&found[0]),
        [(
            "topology.k8s.aws/network-node-layer-1".into(),
            "nn-x".into()
        )]
    );
}

#[tokio::test]
async fn fargate_nodes_are_their_pods_network_interfaces() {
    let env = env(1, &[]).await;
    let host = &env.seeded.instances[0];
    let (zone, subnet) = &env.seeded.subnets[0];
    // A Fargate pod's interface: attached (to a hidden instance in AWS; to
    // a seeded one here), found by its private address.
    let eni = env
        .ec2
        .create_network_interface()
        .subnet_id(subnet)
        .private_ip_address("10.0.1.200")
        .send()
        .await
        .unwrap()
        .network_interface
        .and_then(|n| n.network_interface_id)
        .unwrap();
    let attachment = env
        .ec2
        .attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&host.id)
        .device_index(1)
        .send()
        .await
        .unwrap()
        .attachment_id
        .unwrap();
    env.proxy.take_actions();
    let eks =
        format!("aws:///{zone}/0123456789abcdef/fargate-ip-10-0-1-200.eu-west-1.compute.internal");
    let nodes = vec![
        by_id(&eks),
        by_name("fargate-10.0.1.200"),
        by_name("fargate-ip-10-0-9-9.eu-west-1.compute.internal"),
        by_id(&host.provider_id()),
    ];
    let node = env.gateway.client("node", CLUSTER);
    let results = timed(node.get_instances(nodes.clone(), LookupPurpose::Initialize, true))
        .await
        .unwrap();
    let states: Vec<InstanceState> = results
        .iter()
        .map(|r| InstanceState::try_from(r.state).unwrap())
        .collect();
    use InstanceState::{NotFound, Running};
    assert_eq!(states, [Running, Running, NotFound, Running]);
    let fargate = results[0].instance.as_ref().unwrap();
    assert_eq!(fargate.provider_id, eks, "a provider ID is kept as it is");
    assert_eq!(fargate.zone, *zone);
    assert_eq!(fargate.region, aws::REGION);
    assert_eq!(fargate.instance_type, "", "Fargate has no instance type");
    assert_eq!(
        addresses(fargate)[0],
        ("InternalIP".into(), "10.0.1.200".into())
    );
    assert!(
        fargate
            .additional_labels
            .contains_key("topology.k8s.aws/zone-id")
    );
    let by_name = results[1].instance.as_ref().unwrap();
    assert_eq!(
        by_name.provider_id,
        format!("aws:///{zone}/fargate-10.0.1.200")
    );
    // One request for the interfaces, one for the instance.
    let actions = env.proxy.take_actions();
    assert_eq!(
        actions.get("DescribeNetworkInterfaces"),
        Some(&1),
        "{actions:?}"
    );
    assert_eq!(actions.get("DescribeInstances"), Some(&1), "{actions:?}");

    // The pod gone (its interface detached): not found.
    env.ec2
        .detach_network_interface()
        .attachment_id(attachment)
        .send()
        .await
        .unwrap();
    let results = timed(node.get_instances(nodes[..1].to_vec(), LookupPurpose::Lifecycle, true))
        .await
        .unwrap();
    assert_eq!(results[0].state, NotFound as i32);
}

async fn instance_tags(ec2: &aws_sdk_ec2::Client, id: &str) -> Vec<String> {
    aws::instance_tags(ec2, id).await.unwrap()
}

#[tokio::test]
async fn the_tagging_controllers_tags_reach_exactly_the_nodes_instances() {
    let env = env(3, &[]).await;
    let [a, b, gone] = &env.seeded.instances[..] else {
        unreachable!()
    };
    env.ec2
        .terminate_instances()
        .instance_ids(&gone.id)
        .send()
        .await
        .unwrap();
    let node = env.gateway.client("node", CLUSTER);
    let tags = std::collections::HashMap::from([
        ("team".to_owned(), "ml".to_owned()),
        ("cost-center".to_owned(), String::new()),
    ]);
    // An instance that is not the cluster's (no cluster tag).
    let (_, subnet) = &env.seeded.subnets[0];
    let stranger = env
        .ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .subnet_id(subnet)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap()
        .instances()[0]
        .instance_id()
        .unwrap()
        .to_owned();
    let nodes = vec![
        by_id(&a.provider_id()),
        by_id(&b.provider_id()),
        by_id(&gone.provider_id()),
        by_id("aws:///eu-west-1a/i-0123456789abcdef0"),
        by_id(&format!("aws:///{}/x/fargate-10.0.1.9", a.zone)),
        by_id(&format!("aws:///{}/{stranger}", a.zone)),
        by_id("eks-hybrid:///eu-west-1/c/mi-0123"),
    ];
    env.proxy.take_actions();
    let results = timed(node.tag_instances(nodes.clone(), tags.clone(), false))
        .await
        .unwrap();
    use ccm_proto::v1::TagResult::{Done, NotFound, NotTaggable};
    assert_eq!(
        results,
        [
            Done,
            Done,
            NotFound,
            NotFound,
            NotTaggable,
            NotTaggable,
            NotTaggable
        ]
    );
    assert!(
        !instance_tags(&env.ec2, &stranger)
            .await
            .contains(&"team=ml".to_owned())
    );
    let actions = env.proxy.take_actions();
    assert_eq!(
        actions.get("CreateTags"),
        Some(&1),
        "one request: {actions:?}"
    );
    for i in [a, b] {
        let have = instance_tags(&env.ec2, &i.id).await;
        assert!(have.contains(&"team=ml".to_owned()), "{have:?}");
        assert!(have.contains(&"cost-center=".to_owned()), "{have:?}");
    }

    // Removing takes away only a tag that still has the value given.
    env.ec2
        .create_tags()
        .resources(&b.id)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("team")
                .value("web")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let results = timed(node.tag_instances(nodes[..2].to_vec(), tags.clone(), true))
        .await
        .unwrap();
    assert_eq!(results, [Done, Done]);
    let have_a = instance_tags(&env.ec2, &a.id).await;
    assert!(
        !have_a
            .iter()
            .any(|t| t.starts_with("team=") || t.starts_with("cost-center")),
        "{have_a:?}"
    );
    let have_b = instance_tags(&env.ec2, &b.id).await;
    assert!(
        have_b.contains(&"team=web".to_owned()),
        "another's value stays: {have_b:?}"
    );

    assert_eq!(env.proxy.take_actions().get("DeleteTags"), Some(&1));

    // The cluster's own tags and AWS's are refused before any request.
    for key in ["kubernetes.io/cluster/other", "aws:cloudformation:stack"] {
        let bad = std::collections::HashMap::from([(key.to_owned(), "x".to_owned())]);
        let err = timed(node.tag_instances(nodes[..1].to_vec(), bad, false))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{key}: {err:?}"
        );
    }
    assert!(writes(&env.proxy.take_actions()).is_empty());
    // Other roles may not tag.
    let service = env.gateway.client("service", CLUSTER);
    let err = timed(service.tag_instances(nodes[..1].to_vec(), tags, false))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
}

#[tokio::test]
async fn malformed_aws_provider_ids_are_invalid_argument_and_reach_no_cloud() {
    let env = env(1, &[]).await;
    let node = env.gateway.client("node", CLUSTER);
    for bad in [
        "aws://host/eu-west-1a/i-0123",
        "aws:///eu-west-1a/vol-0123",
        "aws:///a/b/i-0123",
    ] {
        let err = timed(node.get_instances(vec![by_id(bad)], LookupPurpose::Initialize, true))
            .await
            .unwrap_err();
        let Error::InvalidArgument { violations, .. } = &err else {
            panic!("{bad}: {err:?}");
        };
        assert_eq!(violations[0].field, "nodes[0].provider_id", "{bad}");
    }
    // Another cloud's provider ID is not "not found" either.
    let err = timed(node.get_instances(
        vec![by_id("gce://project/zone/vm-1")],
        LookupPurpose::Lifecycle,
        true,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
    assert!(env.proxy.take_actions().is_empty());
}

fn route(target: &aws::SeededInstance, cidr: &str, by_provider_id: bool) -> Route {
    Route {
        target_node: target.name.clone(),
        target_provider_id: if by_provider_id {
            target.provider_id()
        } else {
            String::new()
        },
        destination_cidr: cidr.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn routes_for_ipv4_and_ipv6_go_to_the_clusters_tagged_table_only() {
    let env = env(2, &[]).await;
    // Another cluster's table and an untagged one in the same VPC.
    let other = aws::route_table(&env.ec2, &env.seeded.vpc, Some("other"))
        .await
        .unwrap();
    let untagged = aws::route_table(&env.ec2, &env.seeded.vpc, None)
        .await
        .unwrap();
    let [a, b] = &env.seeded.instances[..] else {
        unreachable!()
    };
    let routes = env.gateway.client("route", CLUSTER);
    assert!(aws::source_dest_check(&env.ec2, &a.id).await.unwrap());

    let created = timed(routes.create_route("uid-a", route(a, "10.244.1.0/24", true)))
        .await
        .unwrap();
    assert_eq!(created.target_provider_id, a.provider_id());
    timed(routes.create_route("uid-a", route(a, "fd00:10:0:1::/64", true)))
        .await
        .unwrap();
    // By node name alone, as for a node not initialised yet.
    timed(routes.create_route("uid-b", route(b, "10.244.2.0/24", false)))
        .await
        .unwrap();
    assert!(
        !aws::source_dest_check(&env.ec2, &a.id).await.unwrap(),
        "routed pod traffic needs the source/destination check off"
    );
    let mut in_table = aws::routes(&env.ec2, &env.seeded.route_table)
        .await
        .unwrap();
    in_table.sort();
    assert_eq!(
        in_table,
        [
            ("10.244.1.0/24".to_owned(), Some(a.id.clone())),
            ("10.244.2.0/24".to_owned(), Some(b.id.clone())),
            ("fd00:10:0:1::/64".to_owned(), Some(a.id.clone())),
        ]
    );
    let listed = timed(routes.list_routes()).await.unwrap();
    let mut seen: Vec<(String, String, String, bool)> = listed
        .iter()
        .map(|r| {
            (
                r.destination_cidr.clone(),
                r.target_node.clone(),
                r.target_provider_id.clone(),
                r.blackhole,
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (
                "10.244.1.0/24".into(),
                a.name.clone(),
                a.provider_id(),
                false
            ),
            (
                "10.244.2.0/24".into(),
                b.name.clone(),
                b.provider_id(),
                false
            ),
            (
                "fd00:10:0:1::/64".into(),
                a.name.clone(),
                a.provider_id(),
                false
            ),
        ]
    );

    // Creating again changes nothing, deleting twice succeeds.
    env.proxy.take_actions();
    timed(routes.create_route("uid-a", route(a, "10.244.1.0/24", true)))
        .await
        .unwrap();
    let actions = env.proxy.take_actions();
    assert!(
        !actions.contains_key("CreateRoute")
            && !actions.contains_key("ReplaceRoute")
            && !actions.contains_key("ModifyInstanceAttribute"),
        "{actions:?}"
    );
    for _ in 0..2 {
        timed(routes.delete_route(listed[0].clone())).await.unwrap();
    }
    let left = aws::routes(&env.ec2, &env.seeded.route_table)
        .await
        .unwrap();
    assert!(
        !left.iter().any(|(d, _)| *d == listed[0].destination_cidr),
        "{left:?}"
    );
    // A CIDR another live instance holds is a conflict, and nothing changes.
    let err = timed(routes.create_route("uid-b", route(b, "10.244.2.0/24", true))).await;
    assert!(err.is_ok(), "same target again is fine: {err:?}");
    let err = timed(routes.create_route("uid-a", route(a, "10.244.2.0/24", true)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");

    // The other cluster's and the untagged table were never touched.
    assert!(aws::routes(&env.ec2, &other).await.unwrap().is_empty());
    assert!(aws::routes(&env.ec2, &untagged).await.unwrap().is_empty());
    // And the other cluster sees none of ours.
    let theirs = env.gateway.client("route", "other");
    assert!(timed(theirs.list_routes()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_terminated_target_leaves_a_blackhole_that_create_replaces() {
    let env = env(2, &[]).await;
    let [a, b] = &env.seeded.instances[..] else {
        unreachable!()
    };
    let routes = env.gateway.client("route", CLUSTER);
    timed(routes.create_route("uid-a", route(a, "10.244.1.0/24", true)))
        .await
        .unwrap();
    env.ec2
        .terminate_instances()
        .instance_ids(&a.id)
        .send()
        .await
        .unwrap();
    let listed = timed(routes.list_routes()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].blackhole, "{listed:?}");
    env.proxy.take_actions();
    timed(routes.create_route("uid-b", route(b, "10.244.1.0/24", true)))
        .await
        .unwrap();
    assert_eq!(
        env.proxy.take_actions().get("ReplaceRoute"),
        Some(&1),
        "a blackhole is replaced in one call"
    );
    assert_eq!(
        aws::routes(&env.ec2, &env.seeded.route_table)
            .await
            .unwrap(),
        [("10.244.1.0/24".to_owned(), Some(b.id.clone()))]
    );
}

#[tokio::test]
async fn a_cluster_without_a_tagged_route_table_is_told_so() {
    let env = env(0, &[]).await;
    let err = timed(env.gateway.client("route", "nobody").list_routes())
        .await
        .unwrap_err();
    let Error::Other { code, message } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*code, tonic::Code::FailedPrecondition);
    assert!(
        message.contains("kubernetes.io/cluster/nobody"),
        "{message}"
    );
    // Tables the operator names are used tagged or not, as upstream's
    // RouteTableID; one that does not exist is said so.
    let (env2, untagged) = env_with_tables(&env, None).await;
    let routes = env2.client("route", CLUSTER);
    assert!(timed(routes.list_routes()).await.unwrap().is_empty());
    let (missing_env, _) = env_with_tables(&env, Some("rtb-0000000000000dead")).await;
    let err = timed(missing_env.client("route", CLUSTER).list_routes())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Other { code, message } if *code == tonic::Code::FailedPrecondition && message.contains("rtb-0000000000000dead")),
        "{err:?}"
    );
    assert!(!untagged.is_empty());
    env2.stop().await;
    missing_env.stop().await;
}

#[tokio::test]
async fn cluster_ids_with_dots_and_capitals_and_the_legacy_tag_are_recognised() {
    let env = env(1, &[]).await;
    let a = &env.seeded.instances[0];
    // A kops-style ID, tagged the new way; an old cluster, tagged only
    // KubernetesCluster=<id>.
    let kops = "Full-Scale.k8s_Example.internal";
    let legacy = "legacy.k8s.local";
    let kops_table = aws::route_table(&env.ec2, &env.seeded.vpc, Some(kops))
        .await
        .unwrap();
    let legacy_table = aws::route_table(&env.ec2, &env.seeded.vpc, None)
        .await
        .unwrap();
    env.ec2
        .create_tags()
        .resources(&legacy_table)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("KubernetesCluster")
                .value(legacy)
                .build(),
        )
        .send()
        .await
        .unwrap();
    for (cluster, table, cidr) in [
        (kops, &kops_table, "10.250.1.0/24"),
        (legacy, &legacy_table, "10.251.1.0/24"),
    ] {
        let routes = env.gateway.client("route", cluster);
        timed(routes.create_route("uid-a", route(a, cidr, true)))
            .await
            .unwrap();
        assert_eq!(
            aws::routes(&env.ec2, table).await.unwrap(),
            [(cidr.to_owned(), Some(a.id.clone()))],
            "{cluster}"
        );
        let listed = timed(routes.list_routes()).await.unwrap();
        assert_eq!(listed.len(), 1, "{cluster}: {listed:?}");
    }

    // A Classic ELB of the legacy cluster is its own: adopted, not refused
    // as another cluster's (its Service named in its tags, as upstream
    // tags them: one naming no Service is nobody's to take).
    let svc = service("1e1e1e1e");
    let name = ccm_provider::load_balancer_name(&svc.uid);
    let elb = aws::classic_elb_client(&env.proxy.endpoint);
    let subnets: Vec<String> = env.seeded.subnets.iter().map(|(_, s)| s.clone()).collect();
    elb.create_load_balancer()
        .load_balancer_name(&name)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("tcp")
                .load_balancer_port(80)
                .instance_protocol("tcp")
                .instance_port(30080)
                .build()
                .unwrap(),
        )
        .set_subnets(Some(subnets))
        .tags(
            aws_sdk_elasticloadbalancing::types::Tag::builder()
                .key("KubernetesCluster")
                .value(legacy)
                .build()
                .unwrap(),
        )
        .tags(
            aws_sdk_elasticloadbalancing::types::Tag::builder()
                .key("kubernetes.io/service-name")
                .value(format!("{}/{}", svc.namespace, svc.name))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let spec = classic_spec(
        "1e1e1e1e",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    let lbs = env.gateway.client("service", legacy);
    let (_, adopted) = ensure_answer(&lbs, &spec, &hosts(&env.seeded.instances)).await;
    assert!(adopted.contains("adopted the Classic ELB"), "{adopted}");
    assert_eq!(timed(lbs.list_load_balancers()).await.unwrap().len(), 1);
    // Another cluster neither lists nor touches it.
    let others = env.gateway.client("service", kops);
    assert!(
        timed(others.list_load_balancers())
            .await
            .unwrap()
            .is_empty()
    );
    timed(lbs.delete_load_balancer(svc)).await.unwrap();
    assert!(classic(&elb, "1e1e1e1e").await.is_none());
}

/// A second gateway on the same cloud, told to use only `table`, or an
/// untagged table it makes; returns it with that table.
async fn env_with_tables(env: &Env, table: Option<&str>) -> (GatewayProcess, String) {
    let table = match table {
        Some(t) => t.to_owned(),
        None => aws::route_table(&env.ec2, &env.seeded.vpc, None)
            .await
            .unwrap(),
    };
    let args: Vec<String> = [
        "--provider",
        "aws",
        "--aws-endpoint-url",
        &env.proxy.endpoint,
        "--aws-route-table-ids",
        &table,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let gateway = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &env.dir.path().join(format!("gateway-{table}")),
        &args,
        &aws::credentials_env(&env.secret, env.dir.path()),
    )
    .await
    .unwrap();
    (gateway, table)
}

#[tokio::test]
async fn throttling_slows_the_budget_and_refusals_are_never_not_found() {
    let env = env(1, &[]).await;
    let node = env.gateway.client("node", CLUSTER);
    let lookup = || {
        node.get_instances(
            vec![by_id(&env.seeded.instances[0].provider_id())],
            LookupPurpose::Lifecycle,
            true,
        )
    };

    env.proxy
        .fail(Some("DescribeInstances"), Fault::Throttle, 1);
    let err = timed(lookup()).await.unwrap_err();
    let Error::RetryAfter { reason, delay, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(reason, reason::CLOUD_THROTTLED);
    assert!(*delay >= Duration::from_millis(500), "{delay:?}");
    assert_eq!(
        env.gateway.metric("cloud_gateway_budget_throttled").await,
        1.0
    );

    for fault in [Fault::Unauthorized, Fault::AuthFailure] {
        env.proxy.fail(Some("DescribeInstances"), fault, 1);
        let err = timed(lookup()).await.unwrap_err();
        let Error::PermissionDenied { reason, .. } = &err else {
            panic!("{fault:?}: {err:?}");
        };
        assert_eq!(reason, reason::CLOUD_PERMISSION_DENIED);
    }
    env.proxy
        .fail(Some("DescribeInstances"), Fault::ServerError, 1);
    let err = timed(lookup()).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // Healthy again: found, as before.
    let results = timed(lookup()).await.unwrap();
    assert_eq!(results[0].state, InstanceState::Running as i32);
}

#[tokio::test]
async fn an_unreachable_or_unauthenticated_cloud_is_unavailable_or_refused_never_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let closed = format!(
        "http://127.0.0.1:{}",
        ccm_sandbox::ports::free_port().unwrap()
    );
    let secret = aws::secret_access_key();
    let unreachable = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &dir.path().join("unreachable"),
        &["--provider", "aws", "--aws-endpoint-url", &closed].map(String::from),
        &aws::credentials_env(&secret, dir.path()),
    )
    .await
    .unwrap();
    assert!(!unreachable.wait_ready(Duration::from_secs(2)).await);
    let err = timed(unreachable.client("node", CLUSTER).get_instances(
        vec![by_id("aws:///eu-west-1a/i-0123456789abcdef0")],
        LookupPurpose::Lifecycle,
        true,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    unreachable.stop().await;

    // No credentials anywhere in the chain.
    let moto = Moto::start(&dir.path().join("moto")).await.unwrap();
    let mut no_credentials = aws::credentials_env("unused", dir.path());
    no_credentials
        .retain(|(k, _)| !k.starts_with("AWS_ACCESS_KEY") && !k.starts_with("AWS_SECRET"));
    let anonymous = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &dir.path().join("anonymous"),
        &["--provider", "aws", "--aws-endpoint-url", &moto.endpoint].map(String::from),
        &no_credentials,
    )
    .await
    .unwrap();
    assert!(!anonymous.wait_ready(Duration::from_secs(2)).await);
    let err = timed(anonymous.client("node", CLUSTER).get_instances(
        vec![by_id("aws:///eu-west-1a/i-0123456789abcdef0")],
        LookupPurpose::Lifecycle,
        true,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    anonymous.stop().await;
}

#[tokio::test]
async fn credentials_never_reach_the_logs_even_at_debug_level() {
    let env = env(1, &["--log-level", "debug"]).await;
    let node = env.gateway.client("node", CLUSTER);
    timed(node.get_instances(
        vec![by_name(&env.seeded.instances[0].name)],
        LookupPurpose::Initialize,
        true,
    ))
    .await
    .unwrap();
    env.proxy.fail(None, Fault::AuthFailure, 1);
    let _ = timed(node.get_instances(
        vec![by_name(&env.seeded.instances[0].name)],
        LookupPurpose::Initialize,
        true,
    ))
    .await;
    let routes = env.gateway.client("route", CLUSTER);
    timed(routes.list_routes()).await.unwrap();
    let secret = env.secret.clone();
    let log = env.gateway.stop().await;
    assert!(log.contains("AWS provider configured"), "{log}");
    assert!(!log.contains(&secret), "the secret key is in the log");
    let leaks: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(aws::ACCESS_KEY_ID))
        .collect();
    assert!(
        leaks.is_empty(),
        "the access key ID is in the log: {leaks:#?}"
    );
}

#[tokio::test]
async fn an_assumed_role_is_used_for_every_call() {
    let env = env(
        1,
        &[
            "--aws-role-arn",
            "arn:aws:iam::123456789012:role/cloud-gateway",
            "--aws-external-id",
            "ccm-test",
        ],
    )
    .await;
    // The role was assumed through STS (moto answers it on the same
    // endpoint), at start, for the readiness check.
    assert_eq!(
        env.startup.get("sts:AssumeRole"),
        Some(&1),
        "{:?}",
        env.startup
    );
    let node = env.gateway.client("node", CLUSTER);
    timed(node.get_instances(
        vec![by_name(&env.seeded.instances[0].name)],
        LookupPurpose::Initialize,
        true,
    ))
    .await
    .unwrap();
    let lbs = env.gateway.client("service", CLUSTER);
    timed(lbs.list_load_balancers()).await.unwrap();
    // The assumed credentials are cached and shared by EC2, ELBv2 and
    // the Classic ELB API, not asked for per call or per service. (Both
    // load balancer APIs' listings are `DescribeLoadBalancers` to IAM.)
    let actions = env.proxy.take_actions();
    assert_eq!(actions.get("sts:AssumeRole"), None, "{actions:?}");
    assert_eq!(actions.get("DescribeInstances"), Some(&1), "{actions:?}");
    assert_eq!(
        actions.get("elasticloadbalancing:DescribeLoadBalancers"),
        Some(&2),
        "{actions:?}"
    );
}

/// The actions of the IAM policy the docs give operators
/// (`helm/aws/iam-policy.json`), as the proxy names them: EC2's bare,
/// others with their service prefix. Tagging security groups on create is
/// authorised separately by IAM but sent in the create request itself, so
/// that action is in the policy and never on the wire. (`AddTags` is both:
/// load balancers are tagged on create, and a Classic ELB made by
/// cloud-provider-aws gets the Service's UID tag afterwards.)
fn policy_actions() -> std::collections::BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/aws/iam-policy.json");
    let policy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["Action"].as_array().unwrap())
        .map(|a| {
            let a = a.as_str().unwrap();
            a.strip_prefix("ec2:").unwrap_or(a).to_owned()
        })
        .collect()
}

#[tokio::test]
async fn the_gateway_sends_exactly_the_actions_of_the_documented_iam_policy() {
    let env = env(2, &["--node-groups-refresh-interval", "1s"]).await;
    let mut seen: std::collections::BTreeSet<String> = env.startup.keys().cloned().collect();
    let [a, b] = &env.seeded.instances[..] else {
        unreachable!()
    };
    let node = env.gateway.client("node", CLUSTER);
    timed(node.get_instances(
        vec![
            by_name(&a.name),
            by_id(&b.provider_id()),
            by_name("fargate-10.0.9.9"),
        ],
        LookupPurpose::Initialize,
        true,
    ))
    .await
    .unwrap();
    // The tagging controller's tags, given and taken away.
    let tags = std::collections::HashMap::from([("team".to_owned(), "ml".to_owned())]);
    for remove in [false, true] {
        timed(node.tag_instances(vec![by_id(&a.provider_id())], tags.clone(), remove))
            .await
            .unwrap();
    }
    let routes = env.gateway.client("route", CLUSTER);
    timed(routes.create_route("uid-a", route(a, "10.244.1.0/24", true)))
        .await
        .unwrap();
    env.ec2
        .terminate_instances()
        .instance_ids(&a.id)
        .send()
        .await
        .unwrap();
    timed(routes.create_route("uid-b", route(b, "10.244.1.0/24", true)))
        .await
        .unwrap();
    let listed = timed(routes.list_routes()).await.unwrap();
    timed(routes.delete_route(listed[0].clone())).await.unwrap();

    // Every load balancer action: create, change each setting, shrink the
    // hosts, delete.
    let lbs = env.gateway.client("service", CLUSTER);
    let first = lb_spec(
        "88888888",
        vec![
            port("a", Protocol::Tcp, 80, 30080),
            port("b", Protocol::Tcp, 81, 30081),
            port("c", Protocol::Tcp, 82, 30082),
        ],
        &[
            ("cross-zone-load-balancing-enabled", "true"),
            ("target-group-attributes", "proxy_protocol_v2.enabled=true"),
            ("additional-resource-tags", "team=web"),
        ],
    );
    let live = hosts(&env.seeded.instances[1..]);
    ensure_ready(&lbs, &first, &live).await;
    let second = lb_spec(
        "88888888",
        vec![
            port("a", Protocol::Tcp, 80, 30090),
            port("c", Protocol::Tcp, 82, 30082),
        ],
        &[
            ("healthcheck-interval", "20"),
            ("additional-resource-tags", "team=shop"),
            ("security-groups", &env.seeded.node_group),
        ],
    );
    ensure_ready(&lbs, &second, &live).await;
    timed(lbs.update_load_balancer_hosts(second.clone(), Vec::new()))
        .await
        .unwrap();
    timed(lbs.delete_load_balancer(service("88888888")))
        .await
        .unwrap();
    // The same for a Classic ELB, with every setting it has.
    let certificate = aws::request_certificate(&env._moto.endpoint, "shop.example.com")
        .await
        .unwrap();
    let first = classic_spec(
        "99999999",
        vec![
            port("a", Protocol::Tcp, 80, 30080),
            port("b", Protocol::Tcp, 443, 30443),
        ],
        &[
            ("proxy-protocol", "*"),
            ("ssl-cert", &certificate),
            ("ssl-ports", "443"),
            (
                "ssl-negotiation-policy",
                "ELBSecurityPolicy-TLS-1-2-2017-01",
            ),
            ("subnets", &env.seeded.subnets[0].1),
        ],
    );
    ensure_ready(&lbs, &first, &live).await;
    let second = classic_spec(
        "99999999",
        vec![port("a", Protocol::Tcp, 80, 30090)],
        &[
            ("connection-idle-timeout", "120"),
            ("additional-resource-tags", "team=web"),
            ("subnets", &env.seeded.subnets[1].1),
            ("extra-security-groups", &env.seeded.node_group),
        ],
    );
    ensure_ready(&lbs, &second, &live).await;
    timed(lbs.update_load_balancer_hosts(second.clone(), Vec::new()))
        .await
        .unwrap();
    timed(lbs.delete_load_balancer(service("99999999")))
        .await
        .unwrap();
    // Cluster Autoscaler's node groups: listed with their templates, one
    // short of capacity, scaled, a named instance deleted.
    aws::seed_node_groups(&env._moto.endpoint, &env.seeded, CLUSTER)
        .await
        .unwrap();
    // Templates of types chosen by attributes and of an EKS managed node
    // group.
    aws::seed_template_groups(&env._moto.endpoint, &env.seeded, CLUSTER)
        .await
        .unwrap();
    env.proxy.set_types_for_requirements(&["m6g.2xlarge"]);
    let mut c = autoscaler_of(&env);
    refresh(&mut c).await;
    let running = one_more_without_capacity(&env, &mut c)
        .await
        .into_iter()
        .find(|i| !i.id.contains("placeholder"))
        .unwrap();
    timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: vec![ca_node(&running.id)],
    }))
    .await
    .unwrap();
    every_volume_action(&env, b).await;
    seen.extend(env.proxy.take_actions().into_keys());
    assert_eq!(seen, policy_actions(), "actions sent vs. the IAM policy");
}

/// Every EBS action: a volume made, grown, snapshotted, restored,
/// attached, detached and deleted, and its snapshot deleted.
async fn every_volume_action(env: &Env, instance: &aws::SeededInstance) {
    use ccm_proto::v1::{
        AttachVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest,
        DeleteVolumeRequest, DetachVolumeRequest, ExpandVolumeRequest,
    };
    let c = env.gateway.client("volume", CLUSTER);
    let create = |name: &str, snapshot: &str, gib: i64| CreateVolumeRequest {
        name: name.into(),
        size_bytes: gib << 30,
        zones: vec![instance.zone.clone()],
        source_snapshot_id: snapshot.into(),
        ..Default::default()
    };
    let volume = timed(c.create_volume(create("pvc-policy", "", 3)))
        .await
        .unwrap()
        .volume
        .unwrap()
        .id;
    timed(c.expand_volume(ExpandVolumeRequest {
        volume_id: volume.clone(),
        size_bytes: 4 << 30,
        ..Default::default()
    }))
    .await
    .unwrap();
    let snapshot = timed(c.create_snapshot(CreateSnapshotRequest {
        name: "snap-policy".into(),
        source_volume_id: volume.clone(),
        ..Default::default()
    }))
    .await
    .unwrap()
    .snapshot
    .unwrap()
    .id;
    let restored = timed(c.create_volume(create("pvc-policy-restored", &snapshot, 4)))
        .await
        .unwrap()
        .volume
        .unwrap()
        .id;
    // Attaching and detaching answer "retry" until EC2 is done.
    timed(async {
        while let Err(Error::RetryAfter { .. }) = c
            .attach_volume(AttachVolumeRequest {
                volume_id: volume.clone(),
                instance_id: instance.id.clone(),
                ..Default::default()
            })
            .await
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        while let Err(Error::RetryAfter { .. }) = c
            .detach_volume(DetachVolumeRequest {
                volume_id: volume.clone(),
                instance_id: instance.id.clone(),
                ..Default::default()
            })
            .await
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    timed(c.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snapshot,
        ..Default::default()
    }))
    .await
    .unwrap();
    for volume_id in [volume, restored] {
        timed(c.delete_volume(DeleteVolumeRequest {
            volume_id,
            ..Default::default()
        }))
        .await
        .unwrap();
    }
}

// Load balancers: Network Load Balancers, read back through the ELBv2 and
// EC2 APIs as a user would inspect them.

use aws_sdk_elasticloadbalancingv2::types::{LoadBalancer as Nlb, TargetGroup as ElbTargetGroup};
use ccm_proto::v1::{Host, LoadBalancerSpec, Protocol, ServicePort, ServiceRef, TrafficPolicy};

const NLB: &str = "service.beta.kubernetes.io/aws-load-balancer-";

fn service(uid: &str) -> ServiceRef {
    ServiceRef {
        namespace: "shop".into(),
        name: format!("web-{uid}"),
        uid: format!("{uid}-0000-0000-0000-000000000000"),
    }
}

fn port(name: &str, protocol: Protocol, port: i32, node_port: i32) -> ServicePort {
    ServicePort {
        name: name.into(),
        protocol: protocol as i32,
        port,
        node_port,
    }
}

/// A Service asking for an NLB (`type: nlb` unless `annotations` name a
/// type), the rest of its annotations named without the common prefix.
fn lb_spec(uid: &str, ports: Vec<ServicePort>, annotations: &[(&str, &str)]) -> LoadBalancerSpec {
    let mut spec = classic_spec(uid, ports, annotations);
    spec.annotations
        .entry(format!("{NLB}type"))
        .or_insert_with(|| "nlb".into());
    spec
}

/// A Service with exactly `annotations`: without a type, a Classic ELB.
fn classic_spec(
    uid: &str,
    ports: Vec<ServicePort>,
    annotations: &[(&str, &str)],
) -> LoadBalancerSpec {
    LoadBalancerSpec {
        service: Some(service(uid)),
        ports,
        annotations: annotations
            .iter()
            .map(|(k, v)| (format!("{NLB}{k}"), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

fn hosts(instances: &[aws::SeededInstance]) -> Vec<Host> {
    instances
        .iter()
        .map(|i| Host {
            name: i.name.clone(),
            provider_id: i.provider_id(),
            ..Default::default()
        })
        .collect()
}

/// Ensures until the NLB is no longer provisioning; returns its hostname.
async fn ensure_ready(
    client: &ccm_proto::GatewayClient,
    spec: &LoadBalancerSpec,
    h: &[Host],
) -> String {
    ensure_answer(client, spec, h).await.0
}

/// Ensures until the NLB is no longer provisioning; returns its hostname
/// and what the gateway said it adopted.
async fn ensure_answer(
    client: &ccm_proto::GatewayClient,
    spec: &LoadBalancerSpec,
    h: &[Host],
) -> (String, String) {
    let answer = ensure_whole(client, spec, h).await;
    let status = answer.status.unwrap_or_default();
    (status.ingress[0].hostname.clone(), answer.adopted)
}

/// Ensures until the NLB is no longer provisioning; returns the answer.
async fn ensure_whole(
    client: &ccm_proto::GatewayClient,
    spec: &LoadBalancerSpec,
    h: &[Host],
) -> ccm_proto::v1::EnsureLoadBalancerResponse {
    timed(async {
        loop {
            match client
                .ensure_load_balancer_answer(spec.clone(), h.to_vec())
                .await
            {
                Ok(answer) => return answer,
                Err(Error::RetryAfter { reason, .. }) if reason == reason::PROVISIONING => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("ensure: {e:?}"),
            }
        }
    })
    .await
}

async fn nlb(elb: &aws_sdk_elasticloadbalancingv2::Client, uid: &str) -> Option<Nlb> {
    let name = ccm_provider::load_balancer_name(&service(uid).uid);
    elb.describe_load_balancers()
        .names(name)
        .send()
        .await
        .ok()
        .and_then(|a| a.load_balancers().first().cloned())
}

async fn target_groups(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    nlb: &Nlb,
) -> Vec<ElbTargetGroup> {
    // The groups the listeners forward to (moto does not keep a group's
    // load balancers up to date when a listener moves to another group).
    let listeners = elb
        .describe_listeners()
        .load_balancer_arn(nlb.load_balancer_arn().unwrap())
        .send()
        .await
        .unwrap();
    let arns: Vec<String> = listeners
        .listeners()
        .iter()
        .flat_map(|l| l.default_actions())
        .filter_map(|a| a.target_group_arn().map(str::to_owned))
        .collect();
    if arns.is_empty() {
        return Vec::new();
    }
    let mut groups = elb
        .describe_target_groups()
        .set_target_group_arns(Some(arns))
        .send()
        .await
        .unwrap()
        .target_groups()
        .to_vec();
    groups.sort_by_key(|g| g.port());
    groups
}

async fn targets(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    group: &ElbTargetGroup,
) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = elb
        .describe_target_health()
        .target_group_arn(group.target_group_arn().unwrap())
        .send()
        .await
        .unwrap()
        .target_health_descriptions()
        .iter()
        .map(|d| {
            let t = d.target().unwrap();
            (t.id().unwrap().to_owned(), t.port().unwrap())
        })
        .collect();
    out.sort();
    out
}

/// `(protocol, port, source)` of a security group's ingress rules.
async fn ingress(ec2: &aws_sdk_ec2::Client, group: &str) -> Vec<(String, i32, String)> {
    let answer = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await
        .unwrap();
    let mut out = Vec::new();
    for p in answer.security_groups()[0].ip_permissions() {
        let proto = p.ip_protocol().unwrap().to_owned();
        let port = p.from_port().unwrap_or(-1);
        for r in p.ip_ranges() {
            out.push((proto.clone(), port, r.cidr_ip().unwrap().to_owned()));
        }
        for g in p.user_id_group_pairs() {
            out.push((proto.clone(), port, g.group_id().unwrap().to_owned()));
        }
    }
    out.sort();
    out
}

/// The nodes' group, tagged for the cluster: the one every seeded
/// instance is in.
async fn node_group(env: &Env) -> String {
    let answer = env
        .ec2
        .describe_instances()
        .instance_ids(&env.seeded.instances[0].id)
        .send()
        .await
        .unwrap();
    let groups = answer.reservations()[0].instances()[0].security_groups();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].group_id(), Some(env.seeded.node_group.as_str()));
    env.seeded.node_group.clone()
}

/// The field violations of an ensure the gateway must refuse as
/// INVALID_ARGUMENT.
async fn refused(
    client: &ccm_proto::GatewayClient,
    spec: LoadBalancerSpec,
    hosts: Vec<Host>,
) -> Vec<ccm_proto::FieldViolation> {
    match timed(client.ensure_load_balancer(spec, hosts)).await {
        Err(Error::InvalidArgument { violations, .. }) => violations,
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

fn writes(actions: &std::collections::BTreeMap<String, usize>) -> Vec<&String> {
    actions.keys().filter(|a| !a.contains("Describe")).collect()
}

#[tokio::test]
async fn a_service_gets_an_nlb_with_a_listener_target_group_and_rules_per_port() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let spec = lb_spec(
        "11111111",
        vec![
            port("web", Protocol::Tcp, 80, 30080),
            port("dns-tcp", Protocol::Tcp, 53, 30053),
            port("dns-udp", Protocol::Udp, 53, 30053),
            port("game", Protocol::Udp, 7777, 30777),
        ],
        &[],
    );
    let all = hosts(&env.seeded.instances);
    let hostname = ensure_ready(&client, &spec, &all).await;

    let lb = nlb(&elb, "11111111").await.expect("the NLB exists");
    assert_eq!(lb.dns_name(), Some(hostname.as_str()));
    assert_eq!(lb.r#type().map(|t| t.as_str()), Some("network"));
    assert_eq!(lb.scheme().map(|s| s.as_str()), Some("internet-facing"));
    let zones: Vec<&str> = lb
        .availability_zones()
        .iter()
        .filter_map(|z| z.subnet_id())
        .collect();
    assert_eq!(
        zones.len(),
        2,
        "one subnet per zone, by the role tag: {zones:?}"
    );
    let arn = lb.load_balancer_arn().unwrap();
    let tags: Vec<(String, String)> = elb_tags(&elb, arn).await.into_iter().collect();
    assert!(
        tags.contains(&(aws::cluster_tag(CLUSTER), "owned".into())),
        "{tags:?}"
    );
    assert!(
        tags.contains(&(
            "kubernetes.io/service-name".into(),
            "shop/web-11111111".into()
        )),
        "{tags:?}"
    );

    let mut listeners: Vec<(i32, String, String)> = elb
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap()
        .listeners()
        .iter()
        .map(|l| {
            (
                l.port().unwrap(),
                l.protocol().unwrap().as_str().to_owned(),
                l.default_actions()[0]
                    .target_group_arn()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    listeners.sort();
    let groups = target_groups(&elb, &lb).await;
    let shape: Vec<(i32, &str, &str, &str)> = groups
        .iter()
        .map(|g| {
            (
                g.port().unwrap(),
                g.protocol().unwrap().as_str(),
                g.health_check_protocol().unwrap().as_str(),
                g.health_check_port().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (30053, "TCP_UDP", "TCP", "traffic-port"),
            (30080, "TCP", "TCP", "traffic-port"),
            (30777, "UDP", "TCP", "traffic-port"),
        ]
    );
    let listed: Vec<(i32, &str)> = listeners
        .iter()
        .map(|(p, proto, _)| (*p, proto.as_str()))
        .collect();
    assert_eq!(listed, [(53, "TCP_UDP"), (80, "TCP"), (7777, "UDP")]);
    for (port, _, tg) in &listeners {
        let group = groups
            .iter()
            .find(|g| g.target_group_arn() == Some(tg))
            .unwrap();
        let node_port = group.port().unwrap();
        assert!(
            node_port == 30000 + port || node_port == 30000 + port % 1000,
            "{port} -> {node_port}"
        );
        let mut want: Vec<(String, i32)> = env
            .seeded
            .instances
            .iter()
            .map(|i| (i.id.clone(), node_port))
            .collect();
        want.sort();
        assert_eq!(targets(&elb, group).await, want);
    }

    // The NLB's own group admits everyone on the listener ports (and ICMP
    // for path MTU discovery); the nodes' group admits the NLB's group on
    // the node ports.
    let group = lb.security_groups()[0].clone();
    let rules = ingress(&env.ec2, &group).await;
    let world = |proto: &str, port| (proto.to_owned(), port, "0.0.0.0/0".to_owned());
    assert_eq!(
        rules,
        [
            world("icmp", 3),
            world("tcp", 53),
            world("tcp", 80),
            world("udp", 53),
            world("udp", 7777)
        ]
    );
    let node_rules = ingress(&env.ec2, &node_group(&env).await).await;
    for (proto, port) in [
        ("tcp", 30080),
        ("tcp", 30053),
        ("udp", 30053),
        ("udp", 30777),
    ] {
        assert!(
            node_rules.contains(&(proto.to_owned(), port, group.clone())),
            "{proto}/{port} not open to the NLB: {node_rules:?}"
        );
    }

    // Again, unchanged: reads only.
    env.proxy.take_actions();
    assert_eq!(ensure_ready(&client, &spec, &all).await, hostname);
    let actions = env.proxy.take_actions();
    assert!(
        writes(&actions).is_empty(),
        "a converged ensure wrote: {actions:?}"
    );

    let status = timed(client.get_load_balancer(service("11111111")))
        .await
        .unwrap();
    assert!(status.exists);
    assert_eq!(status.status.unwrap().ingress[0].hostname, hostname);
    let listed = timed(client.list_load_balancers()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].service.as_ref().unwrap().uid,
        service("11111111").uid
    );
}

#[tokio::test]
async fn host_changes_register_and_deregister_only_the_difference() {
    let env = env(3, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let spec = lb_spec("22222222", vec![port("web", Protocol::Tcp, 80, 30080)], &[]);
    let first = hosts(&env.seeded.instances[..2]);
    ensure_ready(&client, &spec, &first).await;
    env.proxy.take_actions();

    // One node goes, one comes.
    let next = hosts(&env.seeded.instances[1..]);
    timed(client.update_load_balancer_hosts(spec.clone(), next))
        .await
        .unwrap();
    let actions = env.proxy.take_actions();
    assert_eq!(
        actions.get("elasticloadbalancing:RegisterTargets"),
        Some(&1),
        "{actions:?}"
    );
    assert_eq!(
        actions.get("elasticloadbalancing:DeregisterTargets"),
        Some(&1),
        "{actions:?}"
    );
    let lb = nlb(&elb, "22222222").await.unwrap();
    let group = &target_groups(&elb, &lb).await[0];
    let mut want: Vec<(String, i32)> = env.seeded.instances[1..]
        .iter()
        .map(|i| (i.id.clone(), 30080))
        .collect();
    want.sort();
    assert_eq!(targets(&elb, group).await, want);

    // The same hosts again: nothing registered or deregistered.
    timed(client.update_load_balancer_hosts(spec.clone(), hosts(&env.seeded.instances[1..])))
        .await
        .unwrap();
    let actions = env.proxy.take_actions();
    assert!(writes(&actions).is_empty(), "{actions:?}");
}

#[tokio::test]
async fn annotations_local_traffic_and_source_ranges_shape_an_internal_nlb() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let (subnet_a, subnet_b) = (&env.seeded.subnets[0].1, &env.seeded.subnets[1].1);
    let subnets = format!("{subnet_a},{subnet_b}");
    let mut spec = lb_spec(
        "33333333",
        vec![port("web", Protocol::Tcp, 443, 30443)],
        &[
            ("type", "nlb"),
            ("internal", "true"),
            ("subnets", &subnets),
            ("private-ipv4-addresses", "10.0.1.50,10.0.2.50"),
            ("cross-zone-load-balancing-enabled", "true"),
            ("target-group-attributes", "proxy_protocol_v2.enabled=true"),
            ("additional-resource-tags", "team=checkout,cost=42"),
            ("healthcheck-interval", "30"),
            ("healthcheck-timeout", "5"),
            ("healthcheck-healthy-threshold", "3"),
            ("healthcheck-unhealthy-threshold", "4"),
        ],
    );
    spec.external_traffic_policy = TrafficPolicy::Local as i32;
    spec.health_check_node_port = 32100;
    spec.source_ranges = vec!["192.168.0.0/16".into(), "203.0.113.7/32".into()];
    ensure_ready(&client, &spec, &hosts(&env.seeded.instances)).await;

    let lb = nlb(&elb, "33333333").await.unwrap();
    assert_eq!(lb.scheme().map(|s| s.as_str()), Some("internal"));
    // Moto does not echo subnet mappings: read what the gateway asked for.
    let created = env
        .proxy
        .bodies("elasticloadbalancing:CreateLoadBalancer")
        .concat();
    for (subnet, ip) in [(subnet_a, "10.0.1.50"), (subnet_b, "10.0.2.50")] {
        assert!(created.contains(subnet), "{created}");
        assert!(
            created.contains(&format!("PrivateIPv4Address={ip}")),
            "{created}"
        );
    }
    let arn = lb.load_balancer_arn().unwrap();
    assert_eq!(
        nlb_attributes(&elb, arn).await["load_balancing.cross_zone.enabled"],
        "true"
    );
    assert_eq!(elb_tags(&elb, arn).await["team"], "checkout");

    let group = &target_groups(&elb, &lb).await[0];
    assert_eq!(
        group.health_check_protocol().map(|p| p.as_str()),
        Some("HTTP")
    );
    assert_eq!(group.health_check_port(), Some("32100"));
    assert_eq!(group.health_check_path(), Some("/healthz"));
    assert_eq!(group.health_check_interval_seconds(), Some(30));
    assert_eq!(group.health_check_timeout_seconds(), Some(5));
    assert_eq!(group.healthy_threshold_count(), Some(3));
    assert_eq!(group.unhealthy_threshold_count(), Some(4));
    let attributes = group_attributes(&elb, group.target_group_arn().unwrap()).await;
    assert_eq!(attributes["proxy_protocol_v2.enabled"], "true");
    let nlb_group = lb.security_groups()[0].clone();
    assert_eq!(
        ingress(&env.ec2, &nlb_group).await,
        [
            ("icmp".to_owned(), 3, "192.168.0.0/16".to_owned()),
            ("icmp".to_owned(), 3, "203.0.113.7/32".to_owned()),
            ("tcp".to_owned(), 443, "192.168.0.0/16".to_owned()),
            ("tcp".to_owned(), 443, "203.0.113.7/32".to_owned()),
        ]
    );
    let node_rules = ingress(&env.ec2, &node_group(&env).await).await;
    assert!(
        node_rules.contains(&("tcp".into(), 32100, nlb_group.clone())),
        "{node_rules:?}"
    );

    // Source ranges change: the group follows, nothing else is written.
    spec.source_ranges = vec!["10.0.0.0/8".into()];
    env.proxy.take_actions();
    ensure_ready(&client, &spec, &hosts(&env.seeded.instances)).await;
    assert_eq!(
        ingress(&env.ec2, &nlb_group).await,
        [
            ("icmp".to_owned(), 3, "10.0.0.0/8".to_owned()),
            ("tcp".to_owned(), 443, "10.0.0.0/8".to_owned())
        ]
    );
    let actions = env.proxy.take_actions();
    assert_eq!(
        writes(&actions),
        [
            "AuthorizeSecurityGroupIngress",
            "RevokeSecurityGroupIngress"
        ],
        "{actions:?}"
    );

    // Without the annotation cross-zone goes off, as upstream keeps it.
    spec.annotations
        .remove(&format!("{NLB}cross-zone-load-balancing-enabled"));
    ensure_ready(&client, &spec, &hosts(&env.seeded.instances)).await;
    assert_eq!(
        nlb_attributes(&elb, arn).await["load_balancing.cross_zone.enabled"],
        "false"
    );
    let actions = env.proxy.take_actions();
    assert_eq!(
        writes(&actions),
        ["elasticloadbalancing:ModifyLoadBalancerAttributes"],
        "{actions:?}"
    );

    // The scheme cannot change: said so, nothing written.
    spec.annotations
        .insert(format!("{NLB}internal"), "false".into());
    spec.annotations
        .remove(&format!("{NLB}private-ipv4-addresses"));
    let violations = refused(&client, spec.clone(), hosts(&env.seeded.instances)).await;
    assert!(
        violations[0].field.contains("aws-load-balancer-internal"),
        "{violations:?}"
    );
    assert!(
        violations[0]
            .description
            .contains("cannot change after creation"),
        "{violations:?}"
    );
    assert!(writes(&env.proxy.take_actions()).is_empty());
}

#[tokio::test]
async fn the_accounts_own_target_quotas_bind_every_load_balancer_before_any_write() {
    let env = env_with(3, &[], |proxy| {
        proxy.set_account_limit("targets-per-availability-zone-per-network-load-balancer", 1);
        proxy.set_account_limit("classic-registered-instances", 2);
    })
    .await;
    let info = timed(env.gateway.client("service", CLUSTER).provider_info())
        .await
        .unwrap();
    let kind = |name: &str| {
        info.host_limits
            .iter()
            .find(|l| l.kind == name)
            .unwrap_or_else(|| panic!("{:?}", info.host_limits))
    };
    let nlb_limits = kind("nlb");
    assert_eq!(
        (nlb_limits.per_zone, nlb_limits.per_load_balancer),
        (1, 1000)
    );
    assert_eq!(
        nlb_limits.annotation,
        "service.beta.kubernetes.io/aws-load-balancer-type"
    );
    assert!(
        nlb_limits
            .source
            .contains("targets-per-availability-zone-per-network-load-balancer 1, the account's"),
        "{}",
        nlb_limits.source
    );
    assert_eq!(kind("classic").per_load_balancer, 2);

    let client = env.gateway.client("service", CLUSTER);
    let in_zones: Vec<Host> = env
        .seeded
        .instances
        .iter()
        .map(|i| Host {
            name: i.name.clone(),
            provider_id: i.provider_id(),
            zone: i.zone.clone(),
            ..Default::default()
        })
        .collect();
    let zone = &env.seeded.instances[0].zone;
    let same_zone: Vec<Host> = in_zones
        .iter()
        .filter(|h| &h.zone == zone)
        .cloned()
        .collect();
    assert!(same_zone.len() >= 2, "seeded zones: {in_zones:?}");
    env.proxy.take_actions();
    let nlb_spec = lb_spec(
        "76767676",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[("type", "nlb")],
    );
    let err = timed(client.ensure_load_balancer(nlb_spec.clone(), same_zone.clone()))
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}").contains(&format!(
            "hosts in zone {zone} exceed the nlb quota of 1 hosts per zone"
        )),
        "{err:?}"
    );
    let classic = lb_spec(
        "78787878",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[("type", "classic")],
    );
    let err = timed(client.ensure_load_balancer(classic, in_zones.clone()))
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}")
            .contains("3 hosts exceed the classic quota of 2 hosts per load balancer"),
        "{err:?}"
    );
    let actions = env.proxy.take_actions();
    assert!(
        actions.is_empty(),
        "refused ensures reached the cloud: {actions:?}"
    );

    // An account whose quota AWS enforces below what it says: the cloud's
    // TooManyTargets is a quota error, nothing is taken for gone, and the
    // next ensure finishes the load balancer.
    env.proxy.fail(
        Some("elasticloadbalancing:RegisterTargets"),
        Fault::TooManyTargets,
        1,
    );
    let one = vec![same_zone[0].clone()];
    let err = timed(async {
        loop {
            match client
                .ensure_load_balancer(nlb_spec.clone(), one.clone())
                .await
            {
                Err(Error::RetryAfter { reason, .. }) if reason == reason::PROVISIONING => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break other.unwrap_err(),
            }
        }
    })
    .await;
    assert!(
        matches!(&err, Error::Other { code, message }
            if *code == tonic::Code::ResourceExhausted && message.contains("TooManyTargets")),
        "{err:?}"
    );
    ensure_ready(&client, &nlb_spec, &one).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let made = nlb(&elb, "76767676").await.expect("the NLB");
    let groups = target_groups(&elb, &made).await;
    assert_eq!(
        targets(&elb, &groups[0]).await,
        [(env.seeded.instances[0].id.clone(), 30080)]
    );
}

#[tokio::test]
async fn invalid_annotations_are_refused_before_any_cloud_call() {
    let env = env(1, &[]).await;
    let client = env.gateway.client("service", CLUSTER);
    let spec = lb_spec(
        "44444444",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[
            ("healthcheck-interval", "1"),
            ("extra-security-groups", "sg-0a1"),
            ("internal", "maybe"),
        ],
    );
    env.proxy.take_actions();
    let violations = refused(&client, spec, hosts(&env.seeded.instances)).await;
    assert_eq!(violations.len(), 3, "{violations:?}");
    assert!(violations.iter().any(|v| v.field.contains("healthcheck-interval") && v.description.contains("5 to 300")));
    assert!(
        violations
            .iter()
            .any(|v| v.field.contains("extra-security-groups")
                && v.description.contains("not supported for NLBs"))
    );
    let actions = env.proxy.take_actions();
    assert!(
        actions.is_empty(),
        "an invalid Service reached the cloud: {actions:?}"
    );

    // Client affinity, as upstream: refused for either kind.
    for kind in ["nlb", "classic"] {
        let mut sticky = lb_spec(
            "56565656",
            vec![port("web", Protocol::Tcp, 80, 30080)],
            &[("type", kind)],
        );
        sticky.session_affinity = ccm_proto::v1::SessionAffinity::ClientIp as i32;
        let violations = refused(&client, sticky, Vec::new()).await;
        assert!(
            violations
                .iter()
                .any(|v| v.field == "spec.session_affinity" && v.description.contains("None")),
            "{violations:?}"
        );
    }
    assert!(env.proxy.take_actions().is_empty());

    // A Service for the AWS Load Balancer Controller is someone else's.
    let theirs = lb_spec(
        "55555555",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[("type", "external")],
    );
    let err = timed(client.ensure_load_balancer(theirs, Vec::new()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::ImplementedElsewhere { .. }), "{err:?}");
    assert!(env.proxy.take_actions().is_empty());
}

#[tokio::test]
async fn delete_leaves_nothing_behind_and_clusters_never_see_each_others_nlbs() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let ours = env.gateway.client("service", CLUSTER);
    let theirs = env.gateway.client("service", "other");
    let spec = lb_spec(
        "66666666",
        vec![
            port("web", Protocol::Tcp, 80, 30080),
            port("dns", Protocol::Udp, 53, 30053),
        ],
        &[],
    );
    ensure_ready(&ours, &spec, &hosts(&env.seeded.instances)).await;
    let lb = nlb(&elb, "66666666").await.unwrap();
    let nlb_group = lb.security_groups()[0].clone();

    // Another cluster in the account sees none of it and cannot delete it.
    assert!(
        timed(theirs.list_load_balancers())
            .await
            .unwrap()
            .is_empty()
    );
    let status = timed(theirs.get_load_balancer(service("66666666")))
        .await
        .unwrap();
    assert!(!status.exists);
    timed(theirs.delete_load_balancer(service("66666666")))
        .await
        .unwrap();
    assert!(
        nlb(&elb, "66666666").await.is_some(),
        "another cluster deleted our NLB"
    );

    timed(ours.delete_load_balancer(service("66666666")))
        .await
        .unwrap();
    assert!(nlb(&elb, "66666666").await.is_none());
    let groups = elb.describe_target_groups().send().await.unwrap();
    assert!(groups.target_groups().is_empty(), "{groups:?}");
    let left = env
        .ec2
        .describe_security_groups()
        .group_ids(&nlb_group)
        .send()
        .await;
    assert!(
        left.map(|a| a.security_groups().is_empty()).unwrap_or(true),
        "the NLB's group is left"
    );
    let node_rules = ingress(&env.ec2, &node_group(&env).await).await;
    assert!(
        !node_rules.iter().any(|(_, _, source)| source == &nlb_group),
        "node rules for the deleted NLB are left: {node_rules:?}"
    );
    // Idempotent.
    timed(ours.delete_load_balancer(service("66666666")))
        .await
        .unwrap();
    assert!(timed(ours.list_load_balancers()).await.unwrap().is_empty());
}

#[tokio::test]
async fn tls_ports_get_tls_listeners_with_the_certificate_and_policy() {
    let env = env(1, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let certificate = aws::request_certificate(&env.proxy.endpoint, "shop.example.com")
        .await
        .unwrap();
    let policy = "ELBSecurityPolicy-TLS13-1-2-2021-06";
    let spec = lb_spec(
        "77777777",
        vec![
            port("http", Protocol::Tcp, 80, 30080),
            port("https", Protocol::Tcp, 443, 30443),
        ],
        &[
            ("ssl-cert", &certificate),
            ("ssl-ports", "https"),
            ("ssl-negotiation-policy", policy),
        ],
    );
    ensure_ready(&client, &spec, &hosts(&env.seeded.instances)).await;
    let lb = nlb(&elb, "77777777").await.unwrap();
    let listeners = elb
        .describe_listeners()
        .load_balancer_arn(lb.load_balancer_arn().unwrap())
        .send()
        .await
        .unwrap();
    let mut shape: Vec<(i32, String, Option<String>, Option<String>)> = listeners
        .listeners()
        .iter()
        .map(|l| {
            (
                l.port().unwrap(),
                l.protocol().unwrap().as_str().to_owned(),
                l.certificates()
                    .first()
                    .and_then(|c| c.certificate_arn())
                    .map(str::to_owned),
                l.ssl_policy()
                    .filter(|_| !l.certificates().is_empty())
                    .map(str::to_owned),
            )
        })
        .collect();
    shape.sort();
    assert_eq!(
        shape,
        [
            (80, "TCP".to_owned(), None, None),
            (
                443,
                "TLS".to_owned(),
                Some(certificate.clone()),
                Some(policy.to_owned())
            ),
        ]
    );
    // Target groups stay TCP: the NLB terminates TLS.
    let groups = target_groups(&elb, &lb).await;
    assert!(
        groups
            .iter()
            .all(|g| g.protocol().map(|p| p.as_str()) == Some("TCP"))
    );

    // A port that is not the Service's is refused, naming the annotation.
    let mut wrong = spec.clone();
    wrong
        .annotations
        .insert(format!("{NLB}ssl-ports"), "8443".into());
    let violations = refused(&client, wrong, Vec::new()).await;
    assert!(violations[0].field.contains("ssl-ports"), "{violations:?}");
}

#[tokio::test]
async fn target_node_labels_keep_unlabelled_nodes_out() {
    let env = env(3, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let info = timed(client.provider_info()).await.unwrap();
    let annotation = format!("{NLB}target-node-labels");
    assert_eq!(info.host_label_annotations, [annotation]);
    let spec = lb_spec(
        "99999999",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[("target-node-labels", "pool=edge")],
    );
    let mut labelled = hosts(&env.seeded.instances);
    labelled[0].labels.insert("pool".into(), "edge".into());
    labelled[1].labels.insert("pool".into(), "batch".into());
    ensure_ready(&client, &spec, &labelled).await;
    let lb = nlb(&elb, "99999999").await.unwrap();
    let group = &target_groups(&elb, &lb).await[0];
    let only = vec![(env.seeded.instances[0].id.clone(), 30080)];
    assert_eq!(targets(&elb, group).await, only);

    // The third node joins the pool.
    labelled[2].labels.insert("pool".into(), "edge".into());
    timed(client.update_load_balancer_hosts(spec.clone(), labelled))
        .await
        .unwrap();
    let mut both = vec![
        (env.seeded.instances[0].id.clone(), 30080),
        (env.seeded.instances[2].id.clone(), 30080),
    ];
    both.sort();
    assert_eq!(targets(&elb, group).await, both);
}

#[tokio::test]
async fn subnets_by_name_elastic_ips_and_dual_stack_reach_aws_as_asked() {
    let env = env(1, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let subnet = env.seeded.subnets[1].1.clone();
    env.ec2
        .create_tags()
        .resources(&subnet)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key("Name")
                .value("public-b")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let allocation = env
        .ec2
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc)
        .send()
        .await
        .unwrap()
        .allocation_id
        .unwrap();
    let spec = lb_spec(
        "aaaaaaaa",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[
            ("subnets", "public-b"),
            ("eip-allocations", &allocation),
            ("ip-address-type", "dualstack"),
        ],
    );
    ensure_ready(&client, &spec, &hosts(&env.seeded.instances)).await;
    let lb = nlb(&elb, "aaaaaaaa").await.unwrap();
    let zones: Vec<&str> = lb
        .availability_zones()
        .iter()
        .filter_map(|z| z.subnet_id())
        .collect();
    assert_eq!(zones, [subnet.as_str()], "the subnet named by its Name tag");
    assert_eq!(lb.ip_address_type().map(|t| t.as_str()), Some("dualstack"));
    // Moto does not echo subnet mappings: read what the gateway asked for.
    let created = env.proxy.bodies("elasticloadbalancing:CreateLoadBalancer");
    assert_eq!(created.len(), 1);
    assert!(
        created[0].contains(&format!("AllocationId={allocation}")),
        "{}",
        created[0]
    );
    // Everyone may connect, over IPv4 and IPv6.
    let answer = env
        .ec2
        .describe_security_groups()
        .group_ids(&lb.security_groups()[0])
        .send()
        .await
        .unwrap();
    let v6: Vec<&str> = answer.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ipv6_ranges())
        .filter_map(|r| r.cidr_ipv6())
        .collect();
    assert_eq!(v6, ["::/0"]);

    // A Name no subnet has is refused, naming the annotation.
    let wrong = lb_spec(
        "bbbbbbbb",
        vec![port("web", Protocol::Tcp, 80, 30080)],
        &[("subnets", "nowhere")],
    );
    let violations = refused(&client, wrong, hosts(&env.seeded.instances)).await;
    assert!(
        violations[0].field.contains("aws-load-balancer-subnets"),
        "{violations:?}"
    );
}

/// Makes a subnet in the seeded VPC with `tags`.
async fn extra_subnet(env: &Env, zone: &str, cidr: &str, tags: &[(&str, &str)]) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut spec = TagSpecification::builder().resource_type(ResourceType::Subnet);
    for (k, v) in tags {
        spec = spec.tags(Tag::builder().key(*k).value(*v).build());
    }
    env.ec2
        .create_subnet()
        .vpc_id(&env.seeded.vpc)
        .cidr_block(cidr)
        .availability_zone(zone)
        .tag_specifications(spec.build())
        .send()
        .await
        .unwrap()
        .subnet
        .and_then(|s| s.subnet_id)
        .unwrap()
}

/// The subnets an NLB is in, sorted.
async fn nlb_subnets(elb: &aws_sdk_elasticloadbalancingv2::Client, uid: &str) -> Vec<String> {
    let lb = nlb(elb, uid).await.unwrap();
    let mut subnets: Vec<String> = lb
        .availability_zones()
        .iter()
        .filter_map(|z| z.subnet_id().map(str::to_owned))
        .collect();
    subnets.sort();
    subnets
}

#[tokio::test]
async fn subnets_are_chosen_as_cloud_provider_aws_chooses_them() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let ours = aws::cluster_tag(CLUSTER);
    // The seed's subnets (zones a and b) are the cluster's, role-tagged
    // and public through the main route table. Beside them: zone c's only
    // subnet, tagged for no cluster and for no role; another cluster's
    // role-tagged subnet in zone a; and in zone b a subnet of this
    // cluster's for internal load balancers, private (its own route table
    // has no route to the internet gateway).
    let untagged = extra_subnet(&env, "eu-west-1c", "10.0.3.0/24", &[("Name", "c")]).await;
    let _foreign = extra_subnet(
        &env,
        "eu-west-1a",
        "10.0.4.0/24",
        &[
            ("kubernetes.io/cluster/other", "owned"),
            ("kubernetes.io/role/elb", "1"),
            ("kubernetes.io/role/internal-elb", "1"),
        ],
    )
    .await;
    let private = extra_subnet(
        &env,
        "eu-west-1b",
        "10.0.5.0/24",
        &[(&ours, "shared"), ("kubernetes.io/role/internal-elb", "1")],
    )
    .await;
    let table = aws::route_table(&env.ec2, &env.seeded.vpc, None)
        .await
        .unwrap();
    env.ec2
        .associate_route_table()
        .route_table_id(&table)
        .subnet_id(&private)
        .send()
        .await
        .unwrap();
    let seeded: Vec<String> = env.seeded.subnets.iter().map(|(_, s)| s.clone()).collect();

    let public = lb_spec("aaaaaaaa", vec![port("web", Protocol::Tcp, 80, 30080)], &[]);
    ensure_ready(&client, &public, &hosts(&env.seeded.instances)).await;
    let mut want = vec![seeded[0].clone(), seeded[1].clone(), untagged.clone()];
    want.sort();
    assert_eq!(
        nlb_subnets(&elb, "aaaaaaaa").await,
        want,
        "public, ours or no cluster's"
    );

    let internal = lb_spec(
        "bbbbbbbb",
        vec![port("web", Protocol::Tcp, 80, 30081)],
        &[("internal", "true")],
    );
    ensure_ready(&client, &internal, &hosts(&env.seeded.instances)).await;
    let mut want = vec![seeded[0].clone(), private.clone(), untagged.clone()];
    want.sort();
    assert_eq!(
        nlb_subnets(&elb, "bbbbbbbb").await,
        want,
        "the internal role tag decides zone b"
    );

    // With no public subnet left for the cluster, an internet-facing load
    // balancer is refused, saying what it needs.
    for subnet in seeded.iter().chain([&untagged]) {
        env.ec2
            .associate_route_table()
            .route_table_id(&table)
            .subnet_id(subnet)
            .send()
            .await
            .unwrap();
    }
    let stranded = lb_spec("cccccccc", vec![port("web", Protocol::Tcp, 80, 30082)], &[]);
    let err = client
        .ensure_load_balancer(stranded, hosts(&env.seeded.instances))
        .await
        .unwrap_err();
    assert!(format!("{err:?}").contains("public subnet"), "{err:?}");
}

#[tokio::test]
async fn the_knobs_upstream_users_set_reach_aws_as_upstream_applies_them() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let classic_elb = aws::classic_elb_client(&env.proxy.endpoint);
    let shared = tagged_group(&env, "shared-elb", "every Classic ELB's").await;
    let nodes = node_group(&env).await;
    let nodes_before = ingress(&env.ec2, &nodes).await;
    // EC2 through a second proxy: the per-API endpoint wins over the
    // common one.
    let ec2_proxy = FaultProxy::start(&env._moto.endpoint).await.unwrap();
    let args: Vec<String> = [
        "--provider",
        "aws",
        "--aws-endpoint-url",
        &env.proxy.endpoint,
        "--aws-endpoints",
        &format!("ec2={}", ec2_proxy.endpoint),
        "--aws-vpc-id",
        &env.seeded.vpc,
        "--cache-ttl",
        "0s",
        "--aws-disable-security-group-ingress",
        "true",
        "--aws-elb-security-group",
        &shared,
        "--aws-nlb-security-group-mode",
        "none",
        "--aws-cluster-health-probe",
        "shared",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let gateway = GatewayProcess::start(
        &ccm_testkit::bin_dir(),
        &env.dir.path().join("gateway-knobs"),
        &args,
        &aws::credentials_env(&env.secret, env.dir.path()),
    )
    .await
    .unwrap();
    assert!(gateway.wait_ready(TIMEOUT).await, "{}", gateway.log_text());
    env.proxy.take_actions();
    let client = gateway.client("service", CLUSTER);
    let h = hosts(&env.seeded.instances);

    // A Classic ELB uses the shared group, unchanged, checks kube-proxy,
    // and the nodes' group is left as it was.
    let spec = classic_spec("aaaaaaaa", vec![port("web", Protocol::Tcp, 80, 30080)], &[]);
    ensure_ready(&client, &spec, &h).await;
    let lb = classic(&classic_elb, "aaaaaaaa").await.unwrap();
    assert_eq!(lb.security_groups(), std::slice::from_ref(&shared));
    assert!(
        ingress(&env.ec2, &shared).await.is_empty(),
        "the shared group is never changed"
    );
    let name = ccm_provider::load_balancer_name(&service("aaaaaaaa").uid);
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None
    );
    assert_eq!(
        lb.health_check().map(|c| c.target()),
        Some("HTTP:10256/healthz")
    );

    // A new NLB gets no group; the groups a Service names have no effect
    // (an event says so), and its health check annotations neither.
    let spec = lb_spec(
        "bbbbbbbb",
        vec![port("web", Protocol::Tcp, 80, 30081)],
        &[
            ("security-groups", &shared),
            ("healthcheck-port", "traffic-port"),
        ],
    );
    let answer = ensure_whole(&client, &spec, &h).await;
    let lb = nlb(&elb, "bbbbbbbb").await.unwrap();
    assert!(lb.security_groups().is_empty(), "{lb:?}");
    assert_eq!(answer.no_effect.len(), 2, "{:?}", answer.no_effect);
    assert!(answer.no_effect[0].contains("healthcheck-port has no effect"));
    assert!(answer.no_effect[1].contains("security-groups has no effect on a new NLB"));
    let groups = target_groups(&elb, &lb).await;
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (
            groups[0].health_check_protocol().map(|p| p.as_str()),
            groups[0].health_check_port(),
            groups[0].health_check_path(),
        ),
        (Some("HTTP"), Some("10256"), Some("/healthz"))
    );
    assert_eq!(
        ingress(&env.ec2, &nodes).await,
        nodes_before,
        "nodes untouched"
    );

    // Every EC2 call went through the EC2 endpoint, none through the other.
    let common = env.proxy.take_actions();
    assert!(
        common
            .keys()
            .all(|a| a.starts_with("elasticloadbalancing:")),
        "{common:?}"
    );
    assert!(ec2_proxy.take_actions().contains_key("DescribeInstances"));

    // Deletes leave the shared group and the nodes' group as they were.
    client
        .delete_load_balancer(service("aaaaaaaa"))
        .await
        .unwrap();
    timed(async {
        while let Err(Error::RetryAfter { .. }) =
            client.delete_load_balancer(service("bbbbbbbb")).await
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(group_named(&env.ec2, "shared-elb").await.is_some());
    assert_eq!(ingress(&env.ec2, &nodes).await, nodes_before);
}

#[tokio::test]
async fn the_aws_provider_passes_the_conformance_suite() {
    let env = env(1, &[]).await;
    // Auto Scaling groups for the autoscaler's checks: one with options of
    // its own, one without.
    aws::seed_node_groups(&env._moto.endpoint, &env.seeded, CLUSTER)
        .await
        .unwrap();
    let ca = env.gateway.pki.ca_file();
    let out = gateway_conformance::run_binary(
        &ccm_testkit::bin_dir(),
        &env.gateway.address,
        &env.dir.path().join("gateway/state/tokens"),
        CLUSTER,
        &[
            "--tls-ca",
            ca.to_str().unwrap(),
            "--node",
            &env.seeded.instances[0].name,
            "--invalid-annotation",
            "service.beta.kubernetes.io/aws-load-balancer-internal=maybe",
        ],
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // AWS offers no admin hook: the checks that need one are skipped.
    assert!(stdout.contains(" 0 failed, 6 skipped"), "{stdout}");
    for skipped in [
        "provider.unimplemented",
        "request.deadline",
        "instances.lifecycle",
        "lb.provisioning",
        "routes.blackhole",
        "volumes.one-device-owner",
    ] {
        assert!(stdout.contains(&format!("SKIP {skipped}")), "{stdout}");
    }
    for passed in ["volumes.create-idempotent", "volumes.delete-missing"] {
        assert!(stdout.contains(&format!("PASS {passed}")), "{stdout}");
    }
    assert!(stdout.contains("PASS lb.invalid-annotation"), "{stdout}");
    assert!(stdout.contains("PASS lb.update-hosts"), "{stdout}");
    assert!(
        stdout.contains("PASS node-groups.both-wire-formats"),
        "{stdout}"
    );
}

// Classic ELBs: what a Service without a type annotation gets, as with
// cloud-provider-aws, read back through the ELB API.

use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription as Elb;

async fn classic(elb: &aws_sdk_elasticloadbalancing::Client, uid: &str) -> Option<Elb> {
    let name = ccm_provider::load_balancer_name(&service(uid).uid);
    elb.describe_load_balancers()
        .load_balancer_names(name)
        .send()
        .await
        .ok()
        .and_then(|a| a.load_balancer_descriptions().first().cloned())
}

/// `(port, protocol, instance port, instance protocol)` of each listener.
fn classic_listeners(lb: &Elb) -> Vec<(i32, String, i32, String)> {
    let mut out: Vec<_> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|d| d.listener())
        .map(|l| {
            (
                l.load_balancer_port(),
                l.protocol().to_uppercase(),
                l.instance_port(),
                l.instance_protocol().unwrap_or_default().to_uppercase(),
            )
        })
        .collect();
    out.sort();
    out
}

fn registered(lb: &Elb) -> Vec<String> {
    let mut ids: Vec<String> = lb
        .instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

fn ids(instances: &[aws::SeededInstance]) -> Vec<String> {
    let mut ids: Vec<String> = instances.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    ids
}

/// The group named `name`, if any.
async fn group_named(ec2: &aws_sdk_ec2::Client, name: &str) -> Option<String> {
    let answer = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(name)
                .build(),
        )
        .send()
        .await
        .unwrap();
    answer
        .security_groups()
        .first()
        .and_then(|g| g.group_id().map(str::to_owned))
}

#[tokio::test]
async fn a_service_without_a_type_gets_a_classic_elb_made_as_upstream_makes_it() {
    let env = env(2, &[]).await;
    let elb = aws::classic_elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let ports = vec![
        port("http", Protocol::Tcp, 80, 30080),
        port("admin", Protocol::Tcp, 8080, 30088),
    ];
    let mut spec = classic_spec(
        "c1c1c1c1",
        ports,
        &[
            ("proxy-protocol", "*"),
            ("connection-idle-timeout", "300"),
            ("connection-draining-enabled", "true"),
            ("connection-draining-timeout", "120"),
            ("cross-zone-load-balancing-enabled", "true"),
            ("healthcheck-interval", "30"),
        ],
    );
    let all = hosts(&env.seeded.instances);
    let hostname = ensure_ready(&client, &spec, &all).await;
    let lb = classic(&elb, "c1c1c1c1")
        .await
        .expect("the Classic ELB exists");
    assert_eq!(lb.dns_name(), Some(hostname.as_str()));
    assert_eq!(
        classic_listeners(&lb),
        [
            (80, "TCP".into(), 30080, "TCP".into()),
            (8080, "TCP".into(), 30088, "TCP".into())
        ]
    );
    assert_eq!(registered(&lb), ids(&env.seeded.instances));
    let hc = lb.health_check().unwrap();
    assert_eq!(
        (
            hc.target(),
            hc.interval(),
            hc.timeout(),
            hc.healthy_threshold(),
            hc.unhealthy_threshold()
        ),
        ("TCP:30080", 30, 5, 2, 6)
    );
    let attributes = elb
        .describe_load_balancer_attributes()
        .load_balancer_name(lb.load_balancer_name().unwrap())
        .send()
        .await
        .unwrap();
    let a = attributes.load_balancer_attributes().unwrap();
    assert_eq!(a.connection_settings().unwrap().idle_timeout(), 300);
    assert!(a.cross_zone_load_balancing().unwrap().enabled());
    let draining = a.connection_draining().unwrap();
    assert_eq!((draining.enabled(), draining.timeout()), (true, Some(120)));
    let proxied: Vec<i32> = lb
        .backend_server_descriptions()
        .iter()
        .filter(|b| {
            b.policy_names()
                .iter()
                .any(|p| p == "k8s-proxyprotocol-enabled")
        })
        .filter_map(|b| b.instance_port())
        .collect();
    assert_eq!(proxied.len(), 2, "{:?}", lb.backend_server_descriptions());
    let tags = elb
        .describe_tags()
        .load_balancer_names(lb.load_balancer_name().unwrap())
        .send()
        .await
        .unwrap();
    let tags = tags.tag_descriptions()[0].tags();
    let tag = |key: &str| tags.iter().find(|t| t.key() == key).and_then(|t| t.value());
    assert_eq!(tag("kubernetes.io/cluster/kubernetes"), Some("owned"));
    assert_eq!(tag("kubernetes.io/service-name"), Some("shop/web-c1c1c1c1"));
    // Its own group admits everyone on the listener ports and path MTU
    // discovery; the nodes' group admits all traffic from it.
    let group_name = format!("k8s-elb-{}", lb.load_balancer_name().unwrap());
    let group = group_named(&env.ec2, &group_name).await.expect("its group");
    assert_eq!(lb.security_groups(), std::slice::from_ref(&group));
    let everyone = "0.0.0.0/0".to_owned();
    assert_eq!(
        ingress(&env.ec2, &group).await,
        [
            ("icmp".into(), 3, everyone.clone()),
            ("tcp".into(), 80, everyone.clone()),
            ("tcp".into(), 8080, everyone.clone())
        ]
    );
    let node = node_group(&env).await;
    assert!(
        ingress(&env.ec2, &node)
            .await
            .contains(&("-1".into(), -1, group.clone()))
    );

    // Changes: a port goes, a node port moves, source ranges narrow, one
    // host goes; the DNS name stays.
    spec.ports = vec![port("http", Protocol::Tcp, 80, 30090)];
    spec.source_ranges = vec!["10.1.0.0/16".into()];
    env.proxy.take_actions();
    assert_eq!(ensure_ready(&client, &spec, &all).await, hostname);
    timed(client.update_load_balancer_hosts(spec.clone(), all[..1].to_vec()))
        .await
        .unwrap();
    let lb = classic(&elb, "c1c1c1c1").await.unwrap();
    assert_eq!(
        classic_listeners(&lb),
        [(80, "TCP".into(), 30090, "TCP".into())]
    );
    assert_eq!(registered(&lb), ids(&env.seeded.instances[..1]));
    assert_eq!(lb.health_check().unwrap().target(), "TCP:30090");
    let narrowed = "10.1.0.0/16".to_owned();
    assert_eq!(
        ingress(&env.ec2, &group).await,
        [
            ("icmp".into(), 3, narrowed.clone()),
            ("tcp".into(), 80, narrowed)
        ]
    );
    let actions = env.proxy.take_actions();
    assert!(
        !actions.contains_key("elasticloadbalancing:CreateLoadBalancer"),
        "{actions:?}"
    );

    // UDP needs an NLB; the type cannot change after creation.
    let mut udp = spec.clone();
    udp.ports.push(port("dns", Protocol::Udp, 53, 30053));
    let violations = refused(&client, udp, all.clone()).await;
    assert!(
        violations[0].description.contains("TCP only"),
        "{violations:?}"
    );
    let mut nlb_now = spec.clone();
    nlb_now.annotations = [(format!("{NLB}type"), "nlb".to_owned())].into();
    let violations = refused(&client, nlb_now, all.clone()).await;
    assert!(
        violations[0].field.contains("aws-load-balancer-type"),
        "{violations:?}"
    );
    assert!(
        violations[0].description.contains("is a Classic ELB"),
        "{violations:?}"
    );
    assert!(writes(&env.proxy.take_actions()).is_empty());
    assert!(
        nlb(&aws::elb_client(&env.proxy.endpoint), "c1c1c1c1")
            .await
            .is_none()
    );

    // Listed for the orphan check; deleted with its group and node rule.
    let listed = timed(client.list_load_balancers()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].service.as_ref().unwrap().uid,
        service("c1c1c1c1").uid
    );
    timed(client.delete_load_balancer(service("c1c1c1c1")))
        .await
        .unwrap();
    assert!(classic(&elb, "c1c1c1c1").await.is_none());
    assert_eq!(group_named(&env.ec2, &group_name).await, None);
    assert!(
        !ingress(&env.ec2, &node)
            .await
            .iter()
            .any(|(_, _, s)| s == &group)
    );
    assert!(
        timed(client.list_load_balancers())
            .await
            .unwrap()
            .is_empty()
    );
}

/// What cloud-provider-aws leaves for the Classic ELB of `svc` with port
/// 80 on `node_port`, made with the SDK as it makes them: its group
/// `k8s-elb-<name>` admitting everyone on 80 and ICMP for path MTU
/// discovery, the nodes' group admitting all traffic from it, the ELB with
/// its tags, health check and the first instance registered. Returns the
/// group and the ELB.
async fn upstream_classic(env: &Env, svc: &ServiceRef, node_port: i32) -> (String, Elb) {
    let elb = aws::classic_elb_client(&env.proxy.endpoint);
    let name = ccm_provider::load_balancer_name(&svc.uid);
    let cluster_tag = aws_sdk_ec2::types::Tag::builder()
        .key("kubernetes.io/cluster/kubernetes")
        .value("owned")
        .build();
    let group = env
        .ec2
        .create_security_group()
        .group_name(format!("k8s-elb-{name}"))
        .description(format!(
            "Security group for Kubernetes ELB {name} ({}/{})",
            svc.namespace, svc.name
        ))
        .vpc_id(&env.seeded.vpc)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
                .tags(cluster_tag)
                .build(),
        )
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    let everyone = aws_sdk_ec2::types::IpRange::builder()
        .cidr_ip("0.0.0.0/0")
        .build();
    env.ec2
        .authorize_security_group_ingress()
        .group_id(&group)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(everyone.clone())
                .build(),
        )
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(everyone)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let node = node_group(env).await;
    env.ec2
        .authorize_security_group_ingress()
        .group_id(&node)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&group)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let elb_tag = |k: &str, v: &str| {
        aws_sdk_elasticloadbalancing::types::Tag::builder()
            .key(k)
            .value(v)
            .build()
            .unwrap()
    };
    let subnets: Vec<String> = env.seeded.subnets.iter().map(|(_, s)| s.clone()).collect();
    elb.create_load_balancer()
        .load_balancer_name(&name)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("tcp")
                .load_balancer_port(80)
                .instance_protocol("tcp")
                .instance_port(node_port)
                .build()
                .unwrap(),
        )
        .set_subnets(Some(subnets))
        .security_groups(&group)
        .tags(elb_tag(
            "kubernetes.io/service-name",
            &format!("{}/{}", svc.namespace, svc.name),
        ))
        .tags(elb_tag("kubernetes.io/cluster/kubernetes", "owned"))
        .send()
        .await
        .unwrap();
    elb.configure_health_check()
        .load_balancer_name(&name)
        .health_check(
            aws_sdk_elasticloadbalancing::types::HealthCheck::builder()
                .target(format!("TCP:{node_port}"))
                .interval(10)
                .timeout(5)
                .healthy_threshold(2)
                .unhealthy_threshold(6)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    elb.register_instances_with_load_balancer()
        .load_balancer_name(&name)
        .instances(
            aws_sdk_elasticloadbalancing::types::Instance::builder()
                .instance_id(&env.seeded.instances[0].id)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let made = elb
        .describe_load_balancers()
        .load_balancer_names(&name)
        .send()
        .await
        .unwrap()
        .load_balancer_descriptions()[0]
        .clone();
    (group, made)
}

#[tokio::test]
async fn a_classic_elb_cloud_provider_aws_made_is_adopted_in_place() {
    let env = env(2, &[]).await;
    let elb = aws::classic_elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let name = ccm_provider::load_balancer_name(&service("adadadad").uid);

    let (group, _) = upstream_classic(&env, &service("adadadad"), 30080).await;
    let node = node_group(&env).await;
    let theirs = classic(&elb, "adadadad").await.unwrap();

    // Before our first ensure it is listed under its Service's name.
    let listed = timed(client.list_load_balancers()).await.unwrap();
    let svc = listed[0].service.clone().unwrap();
    assert_eq!(
        (svc.namespace.as_str(), svc.name.as_str(), svc.uid.as_str()),
        ("shop", "web-adadadad", "")
    );

    // Our ensure keeps it: same name and DNS name, nothing made.
    let spec = classic_spec(
        "adadadad",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    env.proxy.take_actions();
    let (hostname, adopted) = ensure_answer(&client, &spec, &hosts(&env.seeded.instances)).await;
    assert_eq!(Some(hostname.as_str()), theirs.dns_name());
    assert!(adopted.contains("adopted the Classic ELB"), "{adopted}");
    let (_, again) = ensure_answer(&client, &spec, &hosts(&env.seeded.instances)).await;
    assert_eq!(again, "", "adopted once");
    let actions = env.proxy.take_actions();
    for made in [
        "elasticloadbalancing:CreateLoadBalancer",
        "CreateSecurityGroup",
        "elasticloadbalancing:CreateLoadBalancerListeners",
    ] {
        assert!(!actions.contains_key(made), "{made}: {actions:?}");
    }
    let lb = classic(&elb, "adadadad").await.unwrap();
    assert_eq!(registered(&lb), ids(&env.seeded.instances));
    assert_eq!(lb.security_groups(), std::slice::from_ref(&group));
    let listed = timed(client.list_load_balancers()).await.unwrap();
    assert_eq!(listed.len(), 1, "never a second load balancer: {listed:?}");
    assert_eq!(
        listed[0].service.as_ref().unwrap().uid,
        service("adadadad").uid
    );

    // Its source ranges are ours to keep now; delete leaves nothing.
    narrow_to_one_range(&env, &client, &spec, &group).await;
    timed(client.delete_load_balancer(service("adadadad")))
        .await
        .unwrap();
    assert!(classic(&elb, "adadadad").await.is_none());
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None
    );
    assert!(
        !ingress(&env.ec2, &node)
            .await
            .iter()
            .any(|(_, _, s)| s == &group)
    );
}

/// `(protocol, port, source, description)` of a security group's rules
/// that carry a description.
async fn described(ec2: &aws_sdk_ec2::Client, group: &str) -> Vec<(String, i32, String, String)> {
    let answer = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await
        .unwrap();
    let mut out = Vec::new();
    for p in answer.security_groups()[0].ip_permissions() {
        for r in p.ip_ranges() {
            if let Some(d) = r.description() {
                out.push((
                    p.ip_protocol().unwrap().to_owned(),
                    p.from_port().unwrap_or(-1),
                    r.cidr_ip().unwrap().to_owned(),
                    d.to_owned(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// Ensures `spec` with one source range; its load balancer's own
/// `group` then admits that range alone, on port 80 and for path MTU
/// discovery.
async fn narrow_to_one_range(
    env: &Env,
    client: &ccm_proto::GatewayClient,
    spec: &LoadBalancerSpec,
    group: &str,
) {
    let mut narrowed = spec.clone();
    narrowed.source_ranges = vec!["192.168.0.0/24".into()];
    ensure_ready(client, &narrowed, &hosts(&env.seeded.instances)).await;
    let cidr = "192.168.0.0/24".to_owned();
    assert_eq!(
        ingress(&env.ec2, group).await,
        [("icmp".into(), 3, cidr.clone()), ("tcp".into(), 80, cidr)]
    );
}

/// What cloud-provider-aws leaves for the NLB of `svc` with port 80 on
/// `node_port` and the security groups `groups` ([`aws::upstream_nlb`]).
async fn upstream_nlb(
    env: &Env,
    svc: &ServiceRef,
    node_port: i32,
    groups: &[String],
) -> (Nlb, String) {
    let lb_name = ccm_provider::load_balancer_name(&svc.uid);
    let upstream = aws::UpstreamService {
        namespace: &svc.namespace,
        name: &svc.name,
        lb_name: &lb_name,
        node_port,
    };
    let elb = aws::elb_client(&env.proxy.endpoint);
    aws::upstream_nlb(&env.ec2, &elb, &env.seeded, CLUSTER, &upstream, groups)
        .await
        .unwrap()
}

/// Whether a target group named `name` exists.
async fn target_group_exists(elb: &aws_sdk_elasticloadbalancingv2::Client, name: &str) -> bool {
    elb.describe_target_groups()
        .names(name)
        .send()
        .await
        .is_ok_and(|a| !a.target_groups().is_empty())
}

#[tokio::test]
async fn an_nlb_cloud_provider_aws_made_without_a_group_is_adopted_with_its_cidr_rules_kept_in_step()
 {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let name = ccm_provider::load_balancer_name(&service("bdbdbdbd").uid);
    let (theirs, their_group) = upstream_nlb(&env, &service("bdbdbdbd"), 30080, &[]).await;
    assert!(theirs.security_groups().is_empty(), "{theirs:?}");
    let node = node_group(&env).await;
    let client_rule = format!("kubernetes.io/rule/nlb/client={name}");
    let health_rule = format!("kubernetes.io/rule/nlb/health={name}");
    let mtu = "kubernetes.io/rule/nlb/mtu".to_owned();

    // Before our first ensure it is listed under its Service's name.
    let listed = timed(client.list_load_balancers()).await.unwrap();
    let svc = listed[0].service.clone().unwrap();
    assert_eq!((svc.name.as_str(), svc.uid.as_str()), ("web-bdbdbdbd", ""));

    // Our ensure keeps it: same ARN and DNS name, no group made, its
    // target group replaced by ours with every host registered.
    let spec = lb_spec(
        "bdbdbdbd",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    let h = hosts(&env.seeded.instances);
    env.proxy.take_actions();
    let (hostname, adopted) = ensure_answer(&client, &spec, &h).await;
    assert_eq!(Some(hostname.as_str()), theirs.dns_name());
    assert!(
        adopted.contains("adopted the NLB") && adopted.contains("no security group"),
        "{adopted}"
    );
    let actions = env.proxy.take_actions();
    for made in [
        "elasticloadbalancing:CreateLoadBalancer",
        "CreateSecurityGroup",
    ] {
        assert!(!actions.contains_key(made), "{made}: {actions:?}");
    }
    let now = nlb(&elb, "bdbdbdbd").await.unwrap();
    assert_eq!(now.load_balancer_arn(), theirs.load_balancer_arn());
    assert!(now.security_groups().is_empty());
    let groups = target_groups(&elb, &now).await;
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_ne!(groups[0].target_group_name(), Some(their_group.as_str()));
    assert!(
        !target_group_exists(&elb, &their_group).await,
        "their group is gone once unused"
    );
    let every: Vec<(String, i32)> = ids(&env.seeded.instances)
        .into_iter()
        .map(|i| (i, 30080))
        .collect();
    assert_eq!(targets(&elb, &groups[0]).await, every);
    assert_eq!(
        described(&env.ec2, &node).await,
        [
            ("icmp".into(), 3, "0.0.0.0/0".into(), mtu.clone()),
            ("tcp".into(), 30080, "0.0.0.0/0".into(), client_rule.clone()),
        ]
    );
    let listed = timed(client.list_load_balancers()).await.unwrap();
    assert_eq!(listed.len(), 1, "never a second load balancer: {listed:?}");
    assert_eq!(
        listed[0].service.as_ref().unwrap().uid,
        service("bdbdbdbd").uid
    );

    // Source ranges and a new port reach the nodes' CIDR rules; health
    // checks come from the NLB's subnets once the clients are narrowed.
    let mut narrowed = lb_spec(
        "bdbdbdbd",
        vec![
            port("http", Protocol::Tcp, 80, 30080),
            port("https", Protocol::Tcp, 443, 30443),
        ],
        &[],
    );
    narrowed.source_ranges = vec!["192.168.0.0/24".into()];
    ensure_ready(&client, &narrowed, &h).await;
    let rules = described(&env.ec2, &node).await;
    let clients: Vec<(i32, &str)> = rules
        .iter()
        .filter(|r| r.3 == client_rule)
        .map(|r| (r.1, r.2.as_str()))
        .collect();
    assert_eq!(
        clients,
        [(30080, "192.168.0.0/24"), (30443, "192.168.0.0/24")]
    );
    let health: Vec<i32> = rules
        .iter()
        .filter(|r| r.3 == health_rule)
        .map(|r| r.1)
        .collect();
    assert_eq!(health.len(), 2 * env.seeded.subnets.len(), "{rules:?}");
    let mtus: Vec<&str> = rules
        .iter()
        .filter(|r| r.3 == mtu)
        .map(|r| r.2.as_str())
        .collect();
    assert_eq!(mtus, ["192.168.0.0/24"]);

    // Delete leaves nothing: no NLB, no target group, no rule of it.
    timed(client.delete_load_balancer(service("bdbdbdbd")))
        .await
        .unwrap();
    assert!(nlb(&elb, "bdbdbdbd").await.is_none());
    let left = elb.describe_target_groups().send().await.unwrap();
    assert!(left.target_groups().is_empty(), "{left:?}");
    assert_eq!(described(&env.ec2, &node).await, []);
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None
    );
}

#[tokio::test]
async fn an_nlb_with_upstreams_managed_group_is_adopted_with_the_nodes_opened_to_that_group() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let name = ccm_provider::load_balancer_name(&service("cececece").uid);
    // The group cloud-provider-aws makes in its "Managed" mode, named from
    // the cluster and the Service's name, namespace and UID.
    let managed = "k8s-shop-webcecec-d81a85cd20";
    let group = tagged_group(
        &env,
        managed,
        "[k8s] Managed SecurityGroup for LoadBalancer",
    )
    .await;
    env.ec2
        .authorize_security_group_ingress()
        .group_id(&group)
        .ip_permissions(aws::described_rule("tcp", 80, 80, "0.0.0.0/0", ""))
        .ip_permissions(aws::described_rule("icmp", 3, 4, "0.0.0.0/0", ""))
        .send()
        .await
        .unwrap();
    let (theirs, their_group) = upstream_nlb(
        &env,
        &service("cececece"),
        30080,
        std::slice::from_ref(&group),
    )
    .await;
    let node = node_group(&env).await;

    let spec = lb_spec(
        "cececece",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    let h = hosts(&env.seeded.instances);
    let (hostname, adopted) = ensure_answer(&client, &spec, &h).await;
    assert_eq!(Some(hostname.as_str()), theirs.dns_name());
    assert!(adopted.contains(&group), "{adopted}");
    let now = nlb(&elb, "cececece").await.unwrap();
    assert_eq!(now.load_balancer_arn(), theirs.load_balancer_arn());
    assert_eq!(now.security_groups(), std::slice::from_ref(&group));
    assert!(!target_group_exists(&elb, &their_group).await);
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None,
        "no group of ours beside theirs"
    );
    // The nodes admit the NLB's group; upstream's CIDR rules for it go.
    assert!(
        ingress(&env.ec2, &node)
            .await
            .contains(&("tcp".into(), 30080, group.clone()))
    );
    assert_eq!(described(&env.ec2, &node).await, []);
    // The group's own rules follow the source ranges.
    narrow_to_one_range(&env, &client, &spec, &group).await;

    timed(client.delete_load_balancer(service("cececece")))
        .await
        .unwrap();
    assert!(nlb(&elb, "cececece").await.is_none());
    assert_eq!(
        group_named(&env.ec2, managed).await,
        None,
        "their group goes with the NLB"
    );
    assert!(
        !ingress(&env.ec2, &node)
            .await
            .iter()
            .any(|(_, _, s)| s == &group)
    );
}

/// The Service `shop/<name>` on port 80 and `node_port`, with
/// `annotations` (named without the common prefix) and `class`, made in
/// the API server; returns it as the API server keeps it.
async fn api_service(
    api: &kube::Api<k8s_openapi::api::core::v1::Service>,
    name: &str,
    node_port: i32,
    annotations: &[(&str, &str)],
    class: Option<&str>,
) -> k8s_openapi::api::core::v1::Service {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (format!("{NLB}{k}"), serde_json::Value::from(*v)))
        .collect();
    let svc = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": class,
            "selector": {"app": name},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": node_port}],
        },
    }))
    .unwrap();
    let made = api.create(&Default::default(), &svc).await.unwrap();
    let given = made.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port;
    assert_eq!(given, Some(node_port), "the API server keeps the node port");
    made
}

/// The preflight's verdicts as `name -> (action, details)`, and its exit
/// status.
async fn preflight(
    env: &Env,
    kubeconfig: &Path,
) -> (
    std::collections::BTreeMap<String, (String, Vec<String>)>,
    Option<i32>,
) {
    let out = tokio::process::Command::new(ccm_testkit::bin_dir().join("aws-preflight"))
        .args(["--kubeconfig", &kubeconfig.display().to_string()])
        .args(["--cluster-name", CLUSTER, "-o", "json"])
        .args([
            "--provider",
            "aws",
            "--aws-endpoint-url",
            &env.proxy.endpoint,
        ])
        .args(["--aws-vpc-id", &env.seeded.vpc])
        .args([
            "--state-dir",
            &env.dir.path().join("preflight").display().to_string(),
        ])
        .envs(aws::credentials_env(&env.secret, env.dir.path()))
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "preflight answered no JSON ({e}):\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let verdicts = rows
        .iter()
        .map(|r| {
            let details = r["details"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap().to_owned())
                .collect();
            (
                r["name"].as_str().unwrap().to_owned(),
                (r["action"].as_str().unwrap().to_owned(), details),
            )
        })
        .collect();
    (verdicts, out.status.code())
}

#[tokio::test]
async fn the_preflight_tells_what_will_happen_to_each_service_and_the_ensure_does_it() {
    let env = env(2, &[]).await;
    let api = kube_test_apiserver::ApiServer::start().await.unwrap();
    let kubeconfig = env.dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let kube = api.client().await.unwrap();
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(kube.clone());
    let shop = serde_json::from_value(serde_json::json!({"metadata": {"name": "shop"}})).unwrap();
    namespaces.create(&Default::default(), &shop).await.unwrap();
    let services = kube::Api::namespaced(kube, "shop");
    let reference = |svc: &k8s_openapi::api::core::v1::Service| ServiceRef {
        namespace: "shop".into(),
        name: svc.metadata.name.clone().unwrap(),
        uid: svc.metadata.uid.clone().unwrap(),
    };

    // Each kind of load balancer cloud-provider-aws leaves, and the
    // Services a move must not go wrong on.
    let classic_svc = api_service(&services, "classic", 30081, &[], None).await;
    let (_, their_classic) = upstream_classic(&env, &reference(&classic_svc), 30081).await;
    let nlb_svc = api_service(&services, "nlb", 30082, &[("type", "nlb")], None).await;
    let (their_nlb, _) = upstream_nlb(&env, &reference(&nlb_svc), 30082, &[]).await;
    let managed_svc = api_service(&services, "managed", 30083, &[("type", "nlb")], None).await;
    let managed_group = tagged_group(
        &env,
        "k8s-shop-managed-0123456789",
        "[k8s] Managed SecurityGroup for LoadBalancer",
    )
    .await;
    upstream_nlb(
        &env,
        &reference(&managed_svc),
        30083,
        std::slice::from_ref(&managed_group),
    )
    .await;
    let switch = api_service(&services, "switch", 30084, &[("type", "nlb")], None).await;
    upstream_classic(&env, &reference(&switch), 30084).await;
    api_service(&services, "new", 30085, &[], None).await;
    let bad = [("type", "nlb"), ("healthcheck-interval", "often")];
    api_service(&services, "bad", 30086, &bad, None).await;
    api_service(&services, "other", 30087, &[], Some("service.k8s.aws/nlb")).await;
    // Its name held by an NLB upstream made for another Service (UIDs
    // alike in their first 31 digits).
    let collides = api_service(&services, "collides", 30088, &[("type", "nlb")], None).await;
    let elsewhere = ServiceRef {
        name: "elsewhere".into(),
        ..reference(&collides)
    };
    let (held, _) = upstream_nlb(&env, &elsewhere, 30088, &[]).await;

    let (verdicts, code) = preflight(&env, &kubeconfig).await;
    let action = |name: &str| verdicts[name].0.as_str();
    let said = |name: &str, words: &str| {
        let details = &verdicts[name].1;
        assert!(
            details.iter().any(|d| d.contains(words)),
            "{name}: {words:?} not in {details:#?}"
        );
    };
    assert_eq!(action("classic"), "adopt-in-place", "{verdicts:#?}");
    assert_eq!(action("nlb"), "adopt-with-changes", "{verdicts:#?}");
    said("nlb", "are replaced by ours");
    assert!(
        !verdicts["nlb"].1.iter().any(|d| d.contains("health check")),
        "upstream's NLB health check is ours too: {verdicts:#?}"
    );
    assert_eq!(action("managed"), "adopt-with-changes");
    said("managed", "in place of cloud-provider-aws's CIDR rules");
    assert_eq!(action("switch"), "refuse");
    said("switch", "the type cannot change after creation");
    assert_eq!(action("new"), "create");
    assert_eq!(action("bad"), "refuse");
    said("bad", "healthcheck-interval");
    assert_eq!(action("other"), "implemented-elsewhere");
    assert_eq!(action("collides"), "collision", "{verdicts:#?}");
    let collides_uid = collides.metadata.uid.clone().unwrap();
    said(
        "collides",
        &format!(
            "{} is the load balancer of Service shop/elsewhere: it is left untouched; this Service's load balancer is {}",
            held.load_balancer_name().unwrap(),
            ccm_provider::own_load_balancer_name(&collides_uid)
        ),
    );
    assert_eq!(code, Some(1), "refusals need a person");

    // The ensure does what was said: the same load balancers, adopted.
    let client = env.gateway.client("service", CLUSTER);
    let h = hosts(&env.seeded.instances);
    for (svc, dns) in [
        (&classic_svc, their_classic.dns_name()),
        (&nlb_svc, their_nlb.dns_name()),
    ] {
        let spec = service_controller::plan::lb_spec(svc);
        let (hostname, adopted) = ensure_answer(&client, &spec, &h).await;
        assert_eq!(Some(hostname.as_str()), dns);
        assert!(!adopted.is_empty());
    }
    let held_before = whole_lb(&env, true, held.load_balancer_name().unwrap()).await;
    let spec = service_controller::plan::lb_spec(&collides);
    let (hostname, adopted) = ensure_answer(&client, &spec, &h).await;
    assert_ne!(Some(hostname.as_str()), held.dns_name());
    assert!(adopted.is_empty(), "{adopted}");
    assert_eq!(
        whole_lb(&env, true, held.load_balancer_name().unwrap()).await,
        held_before
    );
    let (verdicts, _) = preflight(&env, &kubeconfig).await;
    assert_eq!(verdicts["classic"].0, "keep");
    assert_eq!(verdicts["nlb"].0, "keep");
    assert_eq!(verdicts["collides"].0, "collision");
}

#[tokio::test]
async fn a_type_change_replaces_the_load_balancer_only_when_the_service_allows_it() {
    let env = env(2, &[]).await;
    let elb = aws::classic_elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let name = ccm_provider::load_balancer_name(&service("e1e1e1e1").uid);
    let all = hosts(&env.seeded.instances);
    let ports = vec![port("http", Protocol::Tcp, 80, 30080)];
    let spec = classic_spec("e1e1e1e1", ports.clone(), &[]);
    let classic_dns = ensure_ready(&client, &spec, &all).await;
    let classic_group = group_named(&env.ec2, &format!("k8s-elb-{name}"))
        .await
        .unwrap();

    // Asked for an NLB: refused, with the way out named.
    let mut nlb_spec = lb_spec("e1e1e1e1", ports, &[]);
    let violations = refused(&client, nlb_spec.clone(), all.clone()).await;
    assert!(
        violations[0]
            .description
            .contains("cloudgateway.io/allow-load-balancer-replacement"),
        "{violations:?}"
    );
    nlb_spec.annotations.insert(
        "cloudgateway.io/allow-load-balancer-replacement".into(),
        "maybe".into(),
    );
    let violations = refused(&client, nlb_spec.clone(), all.clone()).await;
    assert!(
        violations[0]
            .field
            .contains("allow-load-balancer-replacement"),
        "{violations:?}"
    );

    // Allowed: the Classic ELB goes with its group and node rule, then an
    // NLB with a group of its own is made; the address changes.
    nlb_spec.annotations.insert(
        "cloudgateway.io/allow-load-balancer-replacement".into(),
        "true".into(),
    );
    let nlb_dns = ensure_ready(&client, &nlb_spec, &all).await;
    assert_ne!(nlb_dns, classic_dns);
    assert!(classic(&elb, "e1e1e1e1").await.is_none());
    let made = nlb(&aws::elb_client(&env.proxy.endpoint), "e1e1e1e1")
        .await
        .unwrap();
    assert_eq!(made.security_groups().len(), 1);
    assert_ne!(
        made.security_groups()[0],
        classic_group,
        "never the other kind's group"
    );
    let node = node_group(&env).await;
    let rules = ingress(&env.ec2, &node).await;
    assert!(
        !rules.iter().any(|(_, _, s)| s == &classic_group),
        "{rules:?}"
    );
    assert!(!rules.iter().any(|(p, _, _)| p == "-1"), "{rules:?}");
    let listed = timed(client.list_load_balancers()).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");

    timed(client.delete_load_balancer(service("e1e1e1e1")))
        .await
        .unwrap();
    assert!(
        timed(client.list_load_balancers())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None
    );
}

/// A group in the VPC tagged for the cluster (`owned`).
async fn tagged_group(env: &Env, name: &str, description: &str) -> String {
    env.ec2
        .create_security_group()
        .group_name(name)
        .description(description)
        .vpc_id(&env.seeded.vpc)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("kubernetes.io/cluster/kubernetes")
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned()
}

/// A group in the VPC named `name`, tagged for the cluster when `ours`,
/// admitting `source` on the port range `from`-`to` (a shape the gateway
/// never writes).
async fn group_naming(
    env: &Env,
    name: &str,
    ours: bool,
    source: &str,
    from: i32,
    to: i32,
) -> String {
    let id = if ours {
        tagged_group(env, name, name).await
    } else {
        let made = env
            .ec2
            .create_security_group()
            .group_name(name)
            .description(name)
            .vpc_id(&env.seeded.vpc)
            .send()
            .await
            .unwrap();
        made.group_id().unwrap().to_owned()
    };
    env.ec2
        .authorize_security_group_ingress()
        .group_id(&id)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(from)
                .to_port(to)
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(source)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    id
}

/// The message of a delete that must wait, `PROVISIONING`.
async fn delete_waits(client: &ccm_proto::GatewayClient, uid: &str) -> String {
    match timed(client.delete_load_balancer(service(uid))).await {
        Err(Error::RetryAfter {
            reason, message, ..
        }) if reason == reason::PROVISIONING => message,
        other => panic!("expected PROVISIONING, got {other:?}"),
    }
}

#[tokio::test]
async fn a_delete_held_by_a_reference_removes_the_clusters_and_names_what_it_waits_on() {
    let env = env(2, &[]).await;
    let client = env.gateway.client("service", CLUSTER);
    let all = hosts(&env.seeded.instances);
    let name = ccm_provider::load_balancer_name(&service("f1f1f1f1").uid);
    let spec = classic_spec(
        "f1f1f1f1",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    ensure_ready(&client, &spec, &all).await;
    let group = group_named(&env.ec2, &format!("k8s-elb-{name}"))
        .await
        .unwrap();
    let mine = group_naming(&env, "cluster-range", true, &group, 1000, 2000).await;
    let theirs = group_naming(&env, "someone-elses", false, &group, 3000, 4000).await;

    // AWS refuses while rules name the group: ours go, theirs is named.
    env.proxy
        .fail(Some("DeleteSecurityGroup"), Fault::DependencyViolation, 1);
    let message = delete_waits(&client, "f1f1f1f1").await;
    assert!(
        message.contains(&theirs) && message.contains("not this cluster's"),
        "{message}"
    );
    assert!(!message.contains(&mine), "{message}");
    assert!(
        !ingress(&env.ec2, &mine)
            .await
            .iter()
            .any(|(_, _, s)| s == &group)
    );
    assert!(
        ingress(&env.ec2, &theirs)
            .await
            .iter()
            .any(|(_, _, s)| s == &group)
    );

    // With no rule left, what holds it is the network interfaces.
    env.ec2
        .revoke_security_group_ingress()
        .group_id(&theirs)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(3000)
                .to_port(4000)
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&group)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    env.proxy
        .fail(Some("DeleteSecurityGroup"), Fault::DependencyViolation, 1);
    let message = delete_waits(&client, "f1f1f1f1").await;
    assert!(message.contains("network interfaces"), "{message}");
    timed(client.delete_load_balancer(service("f1f1f1f1")))
        .await
        .unwrap();
    assert_eq!(
        group_named(&env.ec2, &format!("k8s-elb-{name}")).await,
        None
    );
}

/// `(key, value)` pairs of ELBv2 attributes or tags as a map.
fn as_map<'a>(
    pairs: impl Iterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> std::collections::BTreeMap<String, String> {
    pairs
        .map(|(k, v)| {
            (
                k.unwrap_or_default().to_owned(),
                v.unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The attributes of the NLB `arn`, as AWS reports them.
async fn nlb_attributes(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> std::collections::BTreeMap<String, String> {
    let answer = elb
        .describe_load_balancer_attributes()
        .load_balancer_arn(arn)
        .send()
        .await
        .unwrap();
    as_map(answer.attributes().iter().map(|a| (a.key(), a.value())))
}

/// The attributes of the target group `arn`, as AWS reports them.
async fn group_attributes(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> std::collections::BTreeMap<String, String> {
    let answer = elb
        .describe_target_group_attributes()
        .target_group_arn(arn)
        .send()
        .await
        .unwrap();
    as_map(answer.attributes().iter().map(|a| (a.key(), a.value())))
}

/// The tags of the ELBv2 resource `arn`.
async fn elb_tags(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> std::collections::BTreeMap<String, String> {
    let answer = elb.describe_tags().resource_arns(arn).send().await.unwrap();
    as_map(
        answer.tag_descriptions()[0]
            .tags()
            .iter()
            .map(|t| (t.key(), t.value())),
    )
}

#[tokio::test]
async fn an_nlb_honours_what_upstream_honours_and_says_what_it_ignores() {
    let env = env(2, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let h = hosts(&env.seeded.instances);
    // An ingress-nginx style Service: settings upstream reads on NLBs,
    // ones it ignores there, and a key of the Load Balancer Controller.
    let annotations = [
        ("backend-protocol", "tcp"),
        ("connection-idle-timeout", "60"),
        ("proxy-protocol", "*"),
        ("access-log-enabled", "true"),
        ("access-log-s3-bucket-name", "shop-logs"),
        ("access-log-s3-bucket-prefix", "nlb"),
        (
            "target-group-attributes",
            "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=false",
        ),
        ("nlb-target-type", "instance"),
        ("additional-resource-tags", "team=web"),
    ];
    let mut spec = lb_spec(
        "a7a7a7a7",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &annotations,
    );
    let answer = ensure_whole(&client, &spec, &h).await;
    let said = |text: &str| answer.no_effect.iter().any(|n| n.contains(text));
    assert_eq!(answer.no_effect.len(), 3, "{:?}", answer.no_effect);
    assert!(said("connection-idle-timeout has no effect on an NLB"));
    assert!(said("proxy-protocol has no effect on an NLB"));
    assert!(said(
        "nlb-target-type has no effect: a setting of the AWS Load Balancer Controller"
    ));
    let lb = nlb(&elb, "a7a7a7a7").await.unwrap();
    let of_lb = nlb_attributes(&elb, lb.load_balancer_arn().unwrap()).await;
    let group = &target_groups(&elb, &lb).await[0];
    let of_group = group_attributes(&elb, group.target_group_arn().unwrap()).await;
    assert_eq!(of_lb["access_logs.s3.enabled"], "true");
    assert_eq!(of_lb["access_logs.s3.bucket"], "shop-logs");
    assert_eq!(of_lb["access_logs.s3.prefix"], "nlb");
    assert_eq!(of_group["preserve_client_ip.enabled"], "false");
    assert_ne!(
        of_group
            .get("proxy_protocol_v2.enabled")
            .map(String::as_str),
        Some("true"),
        "proxy-protocol: * turns nothing on, as upstream"
    );

    // The annotations change: logs off when no longer asked, a tag's new
    // value applied (the old key left, as upstream leaves it).
    for key in [
        "access-log-enabled",
        "access-log-s3-bucket-name",
        "access-log-s3-bucket-prefix",
    ] {
        spec.annotations.remove(&format!("{NLB}{key}"));
    }
    spec.annotations.insert(
        format!("{NLB}additional-resource-tags"),
        "team=shop,tier=edge".into(),
    );
    ensure_ready(&client, &spec, &h).await;
    let arn = lb.load_balancer_arn().unwrap();
    assert_eq!(
        nlb_attributes(&elb, arn).await["access_logs.s3.enabled"],
        "false"
    );
    let tags = elb_tags(&elb, arn).await;
    assert_eq!(tags["team"], "shop");
    assert_eq!(tags["tier"], "edge");
    assert_eq!(tags[&format!("kubernetes.io/cluster/{CLUSTER}")], "owned");
}

#[tokio::test]
async fn an_nlb_with_backend_ssl_forwards_tls_and_keeps_an_existing_listeners_policy() {
    let env = env(1, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let h = hosts(&env.seeded.instances);
    let certificate = aws::request_certificate(&env.proxy.endpoint, "shop.example.com")
        .await
        .unwrap();
    let mut spec = lb_spec(
        "a8a8a8a8",
        vec![port("https", Protocol::Tcp, 443, 30443)],
        &[("ssl-cert", &certificate), ("backend-protocol", "ssl")],
    );
    let answer = ensure_whole(&client, &spec, &h).await;
    assert!(answer.no_effect.is_empty(), "{:?}", answer.no_effect);
    let lb = nlb(&elb, "a8a8a8a8").await.unwrap();
    let group = &target_groups(&elb, &lb).await[0];
    assert_eq!(group.protocol().map(|p| p.as_str()), Some("TLS"));
    let listener = |elb: aws_sdk_elasticloadbalancingv2::Client, arn: String| async move {
        elb.describe_listeners()
            .load_balancer_arn(arn)
            .send()
            .await
            .unwrap()
            .listeners()[0]
            .clone()
    };
    let arn = lb.load_balancer_arn().unwrap().to_owned();
    let made = listener(elb.clone(), arn.clone()).await;
    assert_eq!(
        made.ssl_policy(),
        Some("ELBSecurityPolicy-TLS13-1-2-2021-06")
    );

    // A listener with another policy (as upstream leaves AWS's default)
    // keeps it while the Service names none, even when the listener moves
    // to a new target group.
    elb.modify_listener()
        .listener_arn(made.listener_arn().unwrap())
        .ssl_policy("ELBSecurityPolicy-2016-08")
        .send()
        .await
        .unwrap();
    spec.annotations.remove(&format!("{NLB}backend-protocol"));
    ensure_ready(&client, &spec, &h).await;
    let now = listener(elb.clone(), arn).await;
    assert_eq!(now.ssl_policy(), Some("ELBSecurityPolicy-2016-08"));
    let group = &target_groups(&elb, &lb).await[0];
    assert_eq!(group.protocol().map(|p| p.as_str()), Some("TCP"));
}

#[tokio::test]
async fn an_nlb_uses_the_groups_a_service_names_in_place_of_its_own() {
    let env = env(1, &[]).await;
    let elb = aws::elb_client(&env.proxy.endpoint);
    let client = env.gateway.client("service", CLUSTER);
    let h = hosts(&env.seeded.instances);
    let byo = env
        .ec2
        .create_security_group()
        .group_name("shop-edge")
        .description("the team's own")
        .vpc_id(&env.seeded.vpc)
        .send()
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_owned();
    let mut spec = lb_spec(
        "a9a9a9a9",
        vec![port("http", Protocol::Tcp, 80, 30080)],
        &[],
    );
    ensure_ready(&client, &spec, &h).await;
    let own = nlb(&elb, "a9a9a9a9").await.unwrap().security_groups()[0].clone();
    assert_ne!(own, byo);

    spec.annotations
        .insert(format!("{NLB}security-groups"), byo.clone());
    ensure_ready(&client, &spec, &h).await;
    let lb = nlb(&elb, "a9a9a9a9").await.unwrap();
    assert_eq!(lb.security_groups(), std::slice::from_ref(&byo));
    assert!(
        ingress(&env.ec2, &byo).await.is_empty(),
        "nothing is written into a named group"
    );
    let node_rules = ingress(&env.ec2, &node_group(&env).await).await;
    assert!(
        node_rules.contains(&("tcp".into(), 30080, byo.clone())),
        "{node_rules:?}"
    );
    assert!(!node_rules.iter().any(|r| r.2 == own), "{node_rules:?}");
    let left = env
        .ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-id")
                .values(&own)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert!(
        left.security_groups().is_empty(),
        "its own group is deleted"
    );

    // Named no more: a group of its own again.
    spec.annotations.remove(&format!("{NLB}security-groups"));
    ensure_ready(&client, &spec, &h).await;
    let lb = nlb(&elb, "a9a9a9a9").await.unwrap();
    assert_ne!(lb.security_groups(), [byo]);
    assert_eq!(lb.security_groups().len(), 1);
}

// Two Services whose UIDs share their first 31 hex digits: upstream's
// name is the same for both (issue #47).

/// The Service `namespace/name` with the UID `uid`.
fn service_named(name: &str, uid: &str) -> ServiceRef {
    ServiceRef {
        namespace: "default".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

const FIRST_UID: &str = "36300001-0000-0000-0000-000000000001";
const SECOND_UID: &str = "36300001-0000-0000-0000-000000000002";

/// `spec` for the Service `svc` instead of its own.
fn for_service(mut spec: LoadBalancerSpec, svc: &ServiceRef) -> LoadBalancerSpec {
    spec.service = Some(svc.clone());
    spec
}

/// Everything of the load balancer named `name` (an NLB when `nlb`, else
/// a Classic ELB) that its Service would notice changed: the load balancer
/// itself (address, listeners, instances, health check, groups), its tags,
/// its target groups with their targets, and its groups' rules. `None`
/// when there is none.
async fn whole_lb(env: &Env, nlb: bool, name: &str) -> Option<String> {
    let mut groups = Vec::new();
    let mut out = if nlb {
        let elb = aws::elb_client(&env.proxy.endpoint);
        let lb = elb
            .describe_load_balancers()
            .names(name)
            .send()
            .await
            .ok()?
            .load_balancers()
            .first()?
            .clone();
        let arn = lb.load_balancer_arn().unwrap();
        let mut out = format!("{lb:?}\n{:?}\n", elb_tags(&elb, arn).await);
        for g in target_groups(&elb, &lb).await {
            let arn = g.target_group_arn().unwrap();
            out += &format!(
                "{:?} {:?} {:?} {:?}\n",
                g.target_group_name(),
                targets(&elb, &g).await,
                elb_tags(&elb, arn).await,
                group_attributes(&elb, arn).await,
            );
        }
        groups.extend(lb.security_groups().iter().cloned());
        out
    } else {
        let elb = aws::classic_elb_client(&env.proxy.endpoint);
        let lb = elb
            .describe_load_balancers()
            .load_balancer_names(name)
            .send()
            .await
            .ok()?
            .load_balancer_descriptions()
            .first()?
            .clone();
        let tags = elb
            .describe_tags()
            .load_balancer_names(name)
            .send()
            .await
            .unwrap();
        groups.extend(lb.security_groups().iter().cloned());
        format!("{lb:?}\n{:?}\n", tags.tag_descriptions())
    };
    let node = node_group(env).await;
    for g in &groups {
        out += &format!("group {g}: {:?}\n", ingress(&env.ec2, g).await);
        let to_nodes: Vec<_> = ingress(&env.ec2, &node)
            .await
            .into_iter()
            .filter(|(_, _, source)| source == g)
            .collect();
        out += &format!("nodes admit it: {to_nodes:?}\n");
    }
    Some(out)
}

/// The second Service's ensure, host update, get and delete leave the
/// first's load balancer (`first_name`, as `before`) exactly as it was,
/// and give the second one of its own, under its own name.
async fn the_second_never_touches_the_first(
    env: &Env,
    nlb: bool,
    first: &ServiceRef,
    first_name: &str,
    before: &str,
    second: LoadBalancerSpec,
) {
    let client = env.gateway.client("service", CLUSTER);
    let second_svc = second.service.clone().unwrap();
    let own = ccm_provider::own_load_balancer_name(&second_svc.uid);
    assert_eq!(
        first_name,
        ccm_provider::load_balancer_name(&second_svc.uid)
    );
    let one = hosts(&env.seeded.instances[1..]);
    let (address, adopted) = ensure_answer(&client, &second, &one).await;
    assert!(
        adopted.is_empty(),
        "the second adopted something: {adopted}"
    );
    assert_eq!(
        whole_lb(env, nlb, first_name).await.as_deref(),
        Some(before),
        "the second Service's ensure changed the first's load balancer"
    );
    let made = whole_lb(env, nlb, &own)
        .await
        .expect("the second Service's load balancer under its own name");
    assert!(made.contains(&address), "{made}");
    assert!(!before.contains(&address), "the first's address: {address}");
    assert!(made.contains(&format!("{}/{}", second_svc.namespace, second_svc.name)));

    timed(client.update_load_balancer_hosts(second.clone(), hosts(&env.seeded.instances)))
        .await
        .unwrap();
    let (a, b) = tokio::join!(
        client.get_load_balancer(first.clone()),
        client.get_load_balancer(second_svc.clone())
    );
    let ingress_of = |g: ccm_proto::v1::GetLoadBalancerResponse| {
        g.status.unwrap_or_default().ingress[0].hostname.clone()
    };
    let (a, b) = (ingress_of(a.unwrap()), ingress_of(b.unwrap()));
    assert!(before.contains(&a), "the first's status is {a}");
    assert_eq!(b, address);
    // The first's listed as its (cloud-provider-aws's without a UID).
    let mut listed: Vec<(String, String)> = timed(client.list_load_balancers())
        .await
        .unwrap()
        .into_iter()
        .map(|lb| {
            let s = lb.service.unwrap_or_default();
            (lb.name, format!("{}/{} {}", s.namespace, s.name, s.uid))
        })
        .collect();
    listed.sort();
    let first_listed = (
        first_name.to_owned(),
        format!("{}/{} ", first.namespace, first.name),
    );
    let second_listed = (
        own.clone(),
        format!(
            "{}/{} {}",
            second_svc.namespace, second_svc.name, second_svc.uid
        ),
    );
    assert!(
        listed
            == [
                second_listed.clone(),
                (
                    first_listed.0.clone(),
                    format!("{}{}", first_listed.1, first.uid)
                )
            ]
            || listed == [second_listed, first_listed],
        "{listed:?}"
    );

    timed(client.delete_load_balancer(second_svc.clone()))
        .await
        .unwrap();
    assert!(whole_lb(env, nlb, &own).await.is_none());
    assert_eq!(
        whole_lb(env, nlb, first_name).await.as_deref(),
        Some(before),
        "the second Service's host update or delete changed the first's load balancer"
    );
    assert_eq!(group_named(&env.ec2, &format!("k8s-elb-{own}")).await, None);
    // Its delete again, and the first's: nothing of either is left.
    timed(client.delete_load_balancer(second_svc))
        .await
        .unwrap();
    timed(client.delete_load_balancer(first.clone()))
        .await
        .unwrap();
    assert!(whole_lb(env, nlb, first_name).await.is_none());
    assert!(
        timed(client.list_load_balancers())
            .await
            .unwrap()
            .is_empty()
    );
}

/// The first Service's load balancer (an NLB when `nlb`) made by an
/// ensure, then the second's beside it.
async fn two_services_beside_each_other(nlb: bool) {
    let env = env(2, &[]).await;
    let client = env.gateway.client("service", CLUSTER);
    let first = service_named("first", FIRST_UID);
    let second = service_named("second", SECOND_UID);
    let spec = |p, np| {
        let ports = vec![port("web", Protocol::Tcp, p, np)];
        if nlb {
            lb_spec("x", ports, &[])
        } else {
            classic_spec("x", ports, &[])
        }
    };
    let a = for_service(spec(80, 30080), &first);
    ensure_ready(&client, &a, &hosts(&env.seeded.instances[..1])).await;
    let name = ccm_provider::load_balancer_name(FIRST_UID);
    let before = whole_lb(&env, nlb, &name).await.unwrap();
    assert!(before.contains("default/first"), "{before}");
    let b = for_service(spec(81, 30081), &second);
    the_second_never_touches_the_first(&env, nlb, &first, &name, &before, b).await;
}

#[tokio::test]
async fn two_services_whose_uids_begin_alike_get_an_nlb_each_and_never_touch_the_others() {
    two_services_beside_each_other(true).await;
}

#[tokio::test]
async fn two_services_whose_uids_begin_alike_get_a_classic_elb_each_and_never_touch_the_others() {
    two_services_beside_each_other(false).await;
}

#[tokio::test]
async fn a_load_balancer_cloud_provider_aws_made_for_another_service_is_never_adopted() {
    let env = env(2, &[]).await;
    let first = service_named("first", FIRST_UID);
    let second = service_named("second", SECOND_UID);
    let name = ccm_provider::load_balancer_name(FIRST_UID);
    let web = |p, np| vec![port("web", Protocol::Tcp, p, np)];

    // An NLB upstream made for the first Service (its tags name it, no
    // UID tag): the second's ensure passes it over.
    upstream_nlb(&env, &first, 30080, &[]).await;
    let before = whole_lb(&env, true, &name).await.unwrap();
    let b = for_service(lb_spec("x", web(81, 30081), &[]), &second);
    the_second_never_touches_the_first(&env, true, &first, &name, &before, b).await;

    // A Classic ELB upstream made for the first, and its group.
    upstream_classic(&env, &first, 30080).await;
    let before = whole_lb(&env, false, &name).await.unwrap();
    let b = for_service(classic_spec("x", web(81, 30081), &[]), &second);
    the_second_never_touches_the_first(&env, false, &first, &name, &before, b).await;
}

// Node groups: Cluster Autoscaler's Auto Scaling groups, through the
// service a stock cluster-autoscaler calls, read back through the Auto
// Scaling API as a user would inspect them.

use ccm_proto::externalgrpc as ca;
use ccm_proto::externalgrpc::cloud_provider_client::CloudProviderClient;
use ccm_sandbox::aws::groups;
use prost::Message as _;

type Autoscaler = CloudProviderClient<ccm_proto::AuthorizedChannel>;

/// The environment with the Auto Scaling groups of
/// [`aws::seed_node_groups`], and the autoscaler's service with an
/// admin's token.
async fn with_groups() -> (Env, Autoscaler) {
    let env = env(1, &["--node-groups-refresh-interval", "1s"]).await;
    aws::seed_node_groups(&env._moto.endpoint, &env.seeded, CLUSTER)
        .await
        .unwrap();
    let c = autoscaler_of(&env);
    (env, c)
}

/// The autoscaler's service with an admin's token.
fn autoscaler_of(env: &Env) -> Autoscaler {
    let channel = env
        .gateway
        .client("admin", CLUSTER)
        .authorized_channel()
        .unwrap();
    CloudProviderClient::new(channel)
}

/// Runs the workers' zone out of capacity and asks for one more: the
/// workers as the autoscaler then sees them.
async fn one_more_without_capacity(env: &Env, c: &mut Autoscaler) -> Vec<ca::Instance> {
    env.proxy.no_capacity_for(groups::WORKERS);
    timed(
        c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: groups::WORKERS.into(),
            delta: 1,
        }),
    )
    .await
    .unwrap();
    refresh(c).await;
    nodes_of(c, groups::WORKERS).await
}

/// A Refresh that renews the gateway's snapshot (at most one a second).
async fn refresh(c: &mut Autoscaler) {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    timed(c.refresh(ca::RefreshRequest {})).await.unwrap();
}

/// The group as the Auto Scaling API has it: `(desired, instance IDs)`.
async fn group_in_aws(env: &Env, name: &str) -> (i32, Vec<String>) {
    let answer = aws::autoscaling_client(&env._moto.endpoint)
        .describe_auto_scaling_groups()
        .auto_scaling_group_names(name)
        .send()
        .await
        .unwrap();
    let group = &answer.auto_scaling_groups()[0];
    let mut ids: Vec<String> = group
        .instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_owned))
        .collect();
    ids.sort();
    (group.desired_capacity().unwrap_or(-1), ids)
}

async fn nodes_of(c: &mut Autoscaler, id: &str) -> Vec<ca::Instance> {
    timed(c.node_group_nodes(ca::NodeGroupNodesRequest { id: id.into() }))
        .await
        .unwrap()
        .into_inner()
        .instances
}

fn ca_node(provider_id: &str) -> ca::ExternalGrpcNode {
    ca::ExternalGrpcNode {
        provider_id: provider_id.into(),
        name: provider_id.rsplit('/').next().unwrap_or_default().into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn auto_scaling_groups_tagged_for_the_cluster_scale_through_their_desired_capacity_only() {
    let (env, mut c) = with_groups().await;
    let before_other = group_in_aws(&env, groups::OTHER_CLUSTER).await;
    let before_untagged = group_in_aws(&env, groups::UNTAGGED).await;
    refresh(&mut c).await;
    let listed = timed(c.node_groups(ca::NodeGroupsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    let mut bounds: Vec<(String, i32, i32)> = listed
        .iter()
        .map(|g| (g.id.clone(), g.min_size, g.max_size))
        .collect();
    bounds.sort();
    assert_eq!(
        bounds,
        vec![
            (groups::GPUS.to_owned(), 0, 2),
            (groups::WORKERS.to_owned(), 1, 4)
        ],
        "only the groups tagged for this cluster"
    );

    // Nodes map to their group; an instance of a group that is not the
    // cluster's, and one in no group, to the empty id.
    let workers = nodes_of(&mut c, groups::WORKERS).await;
    assert_eq!(workers.len(), 1, "{workers:?}");
    let first = workers[0].id.clone();
    let (_, untagged) = group_in_aws(&env, groups::UNTAGGED).await;
    for (provider_id, want) in [
        (first.clone(), groups::WORKERS),
        (format!("aws:///{}/{}", aws::ZONES[0], untagged[0]), ""),
        (env.seeded.instances[0].provider_id(), ""),
    ] {
        let group = timed(c.node_group_for_node(ca::NodeGroupForNodeRequest {
            node: Some(ca_node(&provider_id)),
        }))
        .await
        .unwrap()
        .into_inner()
        .node_group
        .map(|g| g.id)
        .unwrap_or_default();
        assert_eq!(group, want, "{provider_id}");
    }

    // Scale up: the desired capacity, and AWS launches.
    timed(
        c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: groups::WORKERS.into(),
            delta: 2,
        }),
    )
    .await
    .unwrap();
    let (desired, ids) = group_in_aws(&env, groups::WORKERS).await;
    assert_eq!((desired, ids.len()), (3, 3));
    // Past the maximum, refused before AWS is asked.
    let past = timed(
        c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: groups::WORKERS.into(),
            delta: 2,
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(past.code(), tonic::Code::InvalidArgument, "{past:?}");

    // Delete a named node: that instance terminated, the target one less.
    refresh(&mut c).await;
    let workers = nodes_of(&mut c, groups::WORKERS).await;
    assert_eq!(workers.len(), 3, "{workers:?}");
    let doomed = workers[1].id.clone();
    timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: vec![ca_node(&doomed)],
    }))
    .await
    .unwrap();
    let (desired, ids) = group_in_aws(&env, groups::WORKERS).await;
    assert_eq!(desired, 2);
    assert!(
        !ids.iter().any(|id| doomed.ends_with(id.as_str())),
        "{ids:?}"
    );
    let described = env
        .ec2
        .describe_instances()
        .instance_ids(doomed.rsplit('/').next().unwrap())
        .send()
        .await
        .unwrap();
    let state = described.reservations()[0].instances()[0]
        .state()
        .and_then(|s| s.name())
        .map(|s| s.as_str().to_owned());
    assert_eq!(state.as_deref(), Some("terminated"));

    // Both of the last two: AWS terminates the first and refuses the one
    // that would take the group below its minimum, as upstream's provider
    // leaves it to; nothing is refused before AWS is asked.
    refresh(&mut c).await;
    let workers: Vec<ca::ExternalGrpcNode> = nodes_of(&mut c, groups::WORKERS)
        .await
        .iter()
        .map(|i| ca_node(&i.id))
        .collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let below = timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: workers.clone(),
    }))
    .await
    .unwrap_err();
    assert_eq!(below.code(), tonic::Code::InvalidArgument, "{below:?}");
    assert!(below.message().contains("min size"), "{below:?}");
    let (desired, left) = group_in_aws(&env, groups::WORKERS).await;
    assert_eq!(desired, 1);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(workers[1].provider_id.ends_with(&left[0]), "{left:?}");
    // Another group's instance: refused, nothing deleted.
    let foreign = timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: vec![ca_node(&format!(
            "aws:///{}/{}",
            aws::ZONES[0],
            untagged[0]
        ))],
    }))
    .await
    .unwrap_err();
    assert_eq!(foreign.code(), tonic::Code::InvalidArgument, "{foreign:?}");
    assert_eq!(group_in_aws(&env, groups::WORKERS).await.0, 1);

    // Decreasing the target never deletes a running instance.
    let decrease = timed(c.node_group_decrease_target_size(
        ca::NodeGroupDecreaseTargetSizeRequest {
            id: groups::WORKERS.into(),
            delta: -1,
        },
    ))
    .await
    .unwrap_err();
    assert_eq!(
        decrease.code(),
        tonic::Code::InvalidArgument,
        "{decrease:?}"
    );

    // The groups that are not the cluster's were never touched.
    assert_eq!(
        group_in_aws(&env, groups::OTHER_CLUSTER).await,
        before_other
    );
    assert_eq!(group_in_aws(&env, groups::UNTAGGED).await, before_untagged);
    let writes: Vec<String> = env
        .proxy
        .take_actions()
        .into_keys()
        .filter(|a| a.contains("SetDesired") || a.contains("Terminate"))
        .collect();
    assert_eq!(
        writes,
        vec![
            "autoscaling:SetDesiredCapacity".to_owned(),
            "autoscaling:TerminateInstanceInAutoScalingGroup".to_owned()
        ]
    );
    let bodies = env.proxy.bodies("autoscaling:SetDesiredCapacity");
    assert!(
        bodies
            .iter()
            .all(|b| b.contains("AutoScalingGroupName=workers")),
        "{bodies:?}"
    );
}

#[tokio::test]
async fn templates_come_from_the_launch_template_and_tags_and_options_from_tags() {
    let (_env, mut c) = with_groups().await;
    refresh(&mut c).await;
    let node = |bytes: Vec<u8>| k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).unwrap();
    let workers = node(
        timed(
            c.node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest {
                id: groups::WORKERS.into(),
            }),
        )
        .await
        .unwrap()
        .into_inner()
        .node_bytes,
    );
    let labels = workers.metadata.clone().unwrap_or_default().labels;
    assert_eq!(labels["node.kubernetes.io/instance-type"], "m5.large");
    assert_eq!(labels["topology.kubernetes.io/zone"], aws::ZONES[0]);
    // The EBS CSI driver's zone label, so a Pod with an EBS volume can
    // scale the group up from zero, as upstream's template has it.
    assert_eq!(labels["topology.ebs.csi.aws.com/zone"], aws::ZONES[0]);
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["topology.kubernetes.io/region"], aws::REGION);
    assert_eq!(labels["pool"], "workers");
    let spec = workers.spec.clone().unwrap_or_default();
    let taints: Vec<(String, String, String)> = spec
        .taints
        .iter()
        .map(|t| {
            (
                t.key.clone().unwrap_or_default(),
                t.value.clone().unwrap_or_default(),
                t.effect.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        taints,
        vec![("dedicated".into(), "workers".into(), "NoSchedule".into())]
    );
    let capacity = |n: &k8s_pb::api::core::v1::Node| -> std::collections::BTreeMap<String, String> {
        n.status
            .clone()
            .unwrap_or_default()
            .capacity
            .into_iter()
            .map(|(k, v)| (k, v.string.unwrap_or_default()))
            .collect()
    };
    let have = capacity(&workers);
    // m5.large: 2 vCPUs and 8 GiB, as EC2 describes the type.
    assert_eq!(have["cpu"], "2");
    assert_eq!(have["memory"], "8192Mi");
    assert_eq!(have["pods"], "110");
    assert_eq!(have["ephemeral-storage"], "100Gi");
    assert!(!have.contains_key("nvidia.com/gpu"), "{have:?}");

    // A launch configuration's type, with its GPU, for a group at zero.
    let gpus = node(
        timed(
            c.node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest {
                id: groups::GPUS.into(),
            }),
        )
        .await
        .unwrap()
        .into_inner()
        .node_bytes,
    );
    let have = capacity(&gpus);
    assert_eq!(have["cpu"], "4");
    assert_eq!(have["nvidia.com/gpu"], "1");
    let labels = gpus.metadata.unwrap_or_default().labels;
    assert_eq!(labels["node.kubernetes.io/instance-type"], "g4dn.xlarge");
    // As upstream's, the template names no GPU type: the autoscaler reads
    // it from the label of real nodes only.
    assert!(
        !labels.contains_key("k8s.amazonaws.com/accelerator"),
        "{labels:?}"
    );
    let gpu_label = timed(c.gpu_label(ca::GpuLabelRequest {}))
        .await
        .unwrap()
        .into_inner()
        .label;
    assert_eq!(gpu_label, "k8s.amazonaws.com/accelerator");
    let gpu_types = timed(c.get_available_gpu_types(ca::GetAvailableGpuTypesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .gpu_types;
    for known in ["nvidia-tesla-t4", "nvidia-a10g", "nvidia-l4", "nvidia-l40s"] {
        assert!(gpu_types.contains_key(known), "{known}: {gpu_types:?}");
    }

    // Options from the group's tags, the autoscaler's defaults elsewhere.
    let defaults = ca::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded_duration: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        ..Default::default()
    };
    let options = timed(
        c.node_group_get_options(ca::NodeGroupAutoscalingOptionsRequest {
            id: groups::WORKERS.into(),
            defaults: Some(defaults),
        }),
    )
    .await
    .unwrap()
    .into_inner()
    .node_group_autoscaling_options
    .unwrap();
    assert_eq!(options.scale_down_utilization_threshold, 0.3);
    assert_eq!(options.scale_down_gpu_utilization_threshold, 0.5);
    assert_eq!(
        options.scale_down_unneeded_duration.map(|d| d.seconds),
        Some(1200)
    );
}

#[tokio::test]
async fn a_launch_aws_has_no_capacity_for_is_a_placeholder_out_of_resources() {
    let (env, mut c) = with_groups().await;
    let workers = one_more_without_capacity(&env, &mut c).await;
    assert_eq!(workers.len(), 2, "{workers:?}");
    let placeholder = workers
        .iter()
        .find(|i| i.id.contains("i-placeholder-workers-"))
        .unwrap_or_else(|| panic!("no placeholder: {workers:?}"));
    let status = placeholder.status.clone().unwrap();
    assert_eq!(
        status.instance_state,
        ca::instance_status::InstanceState::InstanceCreating as i32
    );
    let error = status.error_info.unwrap();
    // Upstream's code and class; AWS's reason in the message.
    assert_eq!(error.error_code, "placeholder-cannot-be-fulfilled");
    assert_eq!(
        error.instance_error_class, 1,
        "OutOfResourcesErrorClass: {error:?}"
    );
    assert!(
        error.error_message.contains("InsufficientInstanceCapacity"),
        "{error:?}"
    );
    // The autoscaler gives up on it: deleting the placeholder lowers the
    // target and terminates nothing.
    timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: vec![ca_node(&placeholder.id)],
    }))
    .await
    .unwrap();
    refresh(&mut c).await;
    let workers = nodes_of(&mut c, groups::WORKERS).await;
    assert_eq!(workers.len(), 1, "{workers:?}");
    assert!(
        !env.proxy
            .take_actions()
            .contains_key("autoscaling:TerminateInstanceInAutoScalingGroup")
    );
}

/// A node group's template, decoded as the autoscaler decodes it.
async fn template_of(c: &mut Autoscaler, id: &str) -> k8s_pb::api::core::v1::Node {
    let bytes = timed(
        c.node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest { id: id.into() }),
    )
    .await
    .unwrap_or_else(|e| panic!("template of {id}: {e:?}"))
    .into_inner()
    .node_bytes;
    k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).unwrap()
}

/// A template's labels and capacity.
fn shape(
    node: &k8s_pb::api::core::v1::Node,
) -> (
    std::collections::BTreeMap<String, String>,
    std::collections::BTreeMap<String, String>,
) {
    let labels = node.metadata.clone().unwrap_or_default().labels;
    let capacity = node
        .status
        .clone()
        .unwrap_or_default()
        .capacity
        .into_iter()
        .map(|(k, v)| (k, v.string.unwrap_or_default()))
        .collect();
    (labels.into_iter().collect(), capacity)
}

#[tokio::test]
async fn one_groups_unreadable_template_or_activities_are_its_own_and_the_others_are_listed() {
    let (env, mut c) = with_groups().await;
    // AWS fails every read of a launch template and of scaling
    // activities: the listing goes on, as upstream's does.
    env.proxy.fail(
        Some("DescribeLaunchTemplateVersions"),
        Fault::ServerError,
        1000,
    );
    env.proxy.fail(
        Some("autoscaling:DescribeScalingActivities"),
        Fault::ServerError,
        1000,
    );
    let workers = one_more_without_capacity(&env, &mut c).await;
    let mut listed: Vec<String> = timed(c.node_groups(ca::NodeGroupsRequest {}))
        .await
        .unwrap()
        .into_inner()
        .node_groups
        .into_iter()
        .map(|g| g.id)
        .collect();
    listed.sort();
    assert_eq!(listed, [groups::GPUS, groups::WORKERS]);
    // The missing instance is taken as coming: no error to give up on.
    let placeholder = workers
        .iter()
        .find(|i| i.id.contains("i-placeholder-workers-"))
        .unwrap_or_else(|| panic!("no placeholder: {workers:?}"));
    assert_eq!(
        placeholder
            .status
            .as_ref()
            .and_then(|s| s.error_info.clone()),
        None
    );
    // Only the group with the launch template has no template; the one
    // with a launch configuration has its own.
    let err = timed(
        c.node_group_template_node_info(ca::NodeGroupTemplateNodeInfoRequest {
            id: groups::WORKERS.into(),
        }),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let (labels, _) = shape(&template_of(&mut c, groups::GPUS).await);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "g4dn.xlarge");

    // AWS back: the template, and the failed launch's error.
    env.proxy.heal();
    refresh(&mut c).await;
    let (labels, _) = shape(&template_of(&mut c, groups::WORKERS).await);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "m5.large");
    let workers = nodes_of(&mut c, groups::WORKERS).await;
    assert!(
        workers.iter().any(|i| i
            .status
            .as_ref()
            .and_then(|s| s.error_info.as_ref())
            .is_some()),
        "{workers:?}"
    );

    // The listing itself throttled: that still fails the refresh.
    env.proxy.fail(
        Some("autoscaling:DescribeAutoScalingGroups"),
        Fault::Throttle,
        1,
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(timed(c.refresh(ca::RefreshRequest {})).await.is_err());
}

#[tokio::test]
async fn templates_match_the_nodes_of_small_types_types_by_attributes_and_eks_node_groups() {
    use ccm_sandbox::aws::template_groups as tg;
    let (env, mut c) = with_groups().await;
    aws::seed_template_groups(&env._moto.endpoint, &env.seeded, CLUSTER)
        .await
        .unwrap();
    // EC2 names this type first for the group's requirements; it has 8
    // vCPUs and 32 GiB, more than the requirements' least.
    env.proxy.set_types_for_requirements(&["m6g.2xlarge"]);
    refresh(&mut c).await;

    // t2 types name `i386` first: still amd64, as upstream. A resource
    // tag that is no quantity is left out; the others are kept.
    let (labels, capacity) = shape(&template_of(&mut c, tg::SMALL).await);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "t2.medium");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["topology.ebs.csi.aws.com/zone"], aws::ZONES[0]);
    assert_eq!(capacity["cpu"], "2");
    assert_eq!(capacity["memory"], "4096Mi");
    assert_eq!(capacity["ephemeral-storage"], "20Gi");
    assert!(!capacity.contains_key("hugepages-2Mi"), "{capacity:?}");

    // Types by attributes: EC2's first type for the image's architecture,
    // with the requirements' least CPUs and memory, as upstream.
    let (labels, capacity) = shape(&template_of(&mut c, tg::BY_ATTRIBUTES).await);
    assert_eq!(labels["node.kubernetes.io/instance-type"], "m6g.2xlarge");
    assert_eq!(labels["kubernetes.io/arch"], "arm64");
    assert_eq!(capacity["cpu"], "4");
    assert_eq!(capacity["memory"], "16384Mi");
    let asked = env
        .proxy
        .bodies("GetInstanceTypesFromInstanceRequirements")
        .join("\n");
    for part in [
        "=arm64",
        "=hvm",
        "VCpuCount.Min=4",
        "VCpuCount.Max=8",
        "MemoryMiB.Min=16384",
    ] {
        assert!(asked.contains(part), "{part} not in {asked}");
    }

    // An EKS managed node group: EKS's labels, taints and resources.
    let eks = template_of(&mut c, tg::EKS).await;
    let (labels, capacity) = shape(&eks);
    for (key, value) in [
        ("team", "ml"),
        ("eks.amazonaws.com/nodegroup", tg::EKS_NODEGROUP),
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("nodegroup-name", tg::EKS_NODEGROUP),
        ("cluster-name", CLUSTER),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{key}: {labels:?}"
        );
    }
    assert_eq!(capacity["ephemeral-storage"], "50Gi");
    let taints: Vec<(String, String, String)> = eks
        .spec
        .clone()
        .unwrap_or_default()
        .taints
        .into_iter()
        .map(|t| {
            (
                t.key.unwrap_or_default(),
                t.value.unwrap_or_default(),
                t.effect.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        taints,
        [("dedicated".into(), "ml".into(), "NoSchedule".into())]
    );
    // EKS is asked once, not once per listing.
    refresh(&mut c).await;
    let actions = env.proxy.take_actions();
    assert_eq!(
        actions.get("eks:DescribeNodegroup"),
        Some(&1),
        "{actions:?}"
    );
}

#[tokio::test]
async fn instances_on_their_way_out_count_against_the_desired_capacity_and_are_not_terminated_again()
 {
    let (env, mut c) = with_groups().await;
    timed(
        c.node_group_increase_size(ca::NodeGroupIncreaseSizeRequest {
            id: groups::WORKERS.into(),
            delta: 1,
        }),
    )
    .await
    .unwrap();
    let (_, ids) = group_in_aws(&env, groups::WORKERS).await;
    assert_eq!(ids.len(), 2);
    // A lifecycle hook holds the second on its way out.
    env.proxy.show_terminating(&ids[1]);
    refresh(&mut c).await;
    let workers = nodes_of(&mut c, groups::WORKERS).await;
    // Two instances for a desired capacity of two: no placeholder.
    assert_eq!(workers.len(), 2, "{workers:?}");
    let leaving = workers
        .iter()
        .find(|i| i.id.ends_with(&ids[1]))
        .unwrap_or_else(|| panic!("{workers:?}"));
    assert_eq!(
        leaving.status.as_ref().map(|s| s.instance_state),
        Some(ca::instance_status::InstanceState::InstanceDeleting as i32)
    );
    // Deleting it sends nothing: AWS is already terminating it.
    env.proxy.take_actions();
    timed(c.node_group_delete_nodes(ca::NodeGroupDeleteNodesRequest {
        id: groups::WORKERS.into(),
        nodes: vec![ca_node(&leaving.id)],
    }))
    .await
    .unwrap();
    let actions = env.proxy.take_actions();
    assert!(
        !actions.contains_key("autoscaling:TerminateInstanceInAutoScalingGroup"),
        "{actions:?}"
    );
    assert_eq!(group_in_aws(&env, groups::WORKERS).await, (2, ids));
}
