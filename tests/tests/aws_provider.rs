//! The gateway's AWS provider over real gRPC, against moto (an AWS API
//! emulator) started by each test, through a proxy that injects AWS's
//! failures and counts the actions the gateway sends. The gateway is the
//! real binary with dummy credentials in its environment, as in a pod.

use std::path::Path;
use std::time::Duration;

use ccm_proto::v1::{InstanceState, LookupPurpose, NodeAddressType, NodeRef, Route};
use ccm_proto::{Error, reason};
use ccm_testkit::aws::{self, Fault, FaultProxy, Moto, Seeded};
use ccm_testkit::gateway::GatewayProcess;

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
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto")).await.unwrap();
    let ec2 = moto.ec2();
    let seeded = aws::seed(&ec2, CLUSTER, instances).await.unwrap();
    let proxy = FaultProxy::start(&moto.endpoint).await.unwrap();
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
        &ccm_testkit::bin_dir!(),
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
    let env = env(3, &[]).await;
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
    // The same instances by provider ID, and by a resource name.
    let first = &env.seeded.instances[0];
    let results = timed(node.get_instances(
        vec![by_id(&first.provider_id()), by_name(&first.id)],
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
    // IDs in one request, names in another: never one per node. Both are
    // charged to the budget and counted.
    assert_eq!(env.proxy.take_actions().get("DescribeInstances"), Some(&2));
    assert_eq!(
        env.gateway
            .metric("cloud_gateway_cloud_api_requests_total{operation=\"get_instances\"}")
            .await,
        2.0
    );
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
    // Explicit tables must carry the tag too.
    let env2 = env_with_tables(&env).await;
    let err = timed(env2.client("route", CLUSTER).list_routes())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Other { code, .. } if *code == tonic::Code::FailedPrecondition),
        "{err:?}"
    );
    env2.stop().await;
}

/// A second gateway on the same cloud, told to use only an untagged table.
async fn env_with_tables(env: &Env) -> GatewayProcess {
    let untagged = aws::route_table(&env.ec2, &env.seeded.vpc, None)
        .await
        .unwrap();
    let args: Vec<String> = [
        "--provider",
        "aws",
        "--aws-endpoint-url",
        &env.proxy.endpoint,
        "--aws-route-table-ids",
        &untagged,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    GatewayProcess::start(
        &ccm_testkit::bin_dir!(),
        &env.dir.path().join("gateway-2"),
        &args,
        &aws::credentials_env(&env.secret, env.dir.path()),
    )
    .await
    .unwrap()
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
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let secret = aws::secret_access_key();
    let unreachable = GatewayProcess::start(
        &ccm_testkit::bin_dir!(),
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
        &ccm_testkit::bin_dir!(),
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
    assert_eq!(env.startup.get("AssumeRole"), Some(&1), "{:?}", env.startup);
    let node = env.gateway.client("node", CLUSTER);
    timed(node.get_instances(
        vec![by_name(&env.seeded.instances[0].name)],
        LookupPurpose::Initialize,
        true,
    ))
    .await
    .unwrap();
    // The assumed credentials are cached, not asked for per call.
    let actions = env.proxy.take_actions();
    assert_eq!(actions.get("AssumeRole"), None, "{actions:?}");
    assert_eq!(actions.get("DescribeInstances"), Some(&1), "{actions:?}");
}

/// The EC2 actions of the IAM policy the docs give operators
/// (`helm/aws/iam-policy.json`).
fn policy_actions() -> std::collections::BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../helm/aws/iam-policy.json");
    let policy: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    policy["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["Action"].as_array().unwrap())
        .map(|a| a.as_str().unwrap().strip_prefix("ec2:").unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_gateway_sends_exactly_the_actions_of_the_documented_iam_policy() {
    let env = env(2, &[]).await;
    let mut seen: std::collections::BTreeSet<String> = env.startup.keys().cloned().collect();
    let [a, b] = &env.seeded.instances[..] else {
        unreachable!()
    };
    let node = env.gateway.client("node", CLUSTER);
    timed(node.get_instances(
        vec![by_name(&a.name), by_id(&b.provider_id())],
        LookupPurpose::Initialize,
        true,
    ))
    .await
    .unwrap();
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
    seen.extend(env.proxy.take_actions().into_keys());
    assert_eq!(seen, policy_actions(), "actions sent vs. the IAM policy");
}
