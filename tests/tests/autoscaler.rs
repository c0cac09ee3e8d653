//! Cluster Autoscaler through the gateway, end to end on the sandbox.
//!
//! The proof is the stock `cluster-autoscaler` binary (1.30.0, a release
//! before the 1.35 wire format; see `ccm_testkit::cluster_autoscaler`),
//! run by the sandbox with the cloud-config the chart writes: a Pod the
//! scheduler could not place makes it scale a sim group up from zero, by
//! the group's template; the new instance's kubelet registers its Node,
//! the node controller initialises it; once the Pod is gone the
//! autoscaler scales the group down and the instance and its Node go; its
//! status ConfigMap reads Healthy throughout. On AWS (moto) it scales an
//! Auto Scaling group from zero, read back with boto3.
//!
//! Beside it, a client with none of our code
//! (`tests/tools/autoscaler_client.py`, its stubs generated from the
//! vendored proto when it starts) drives each RPC to its edges: bounds,
//! placeholders, refusals.

use std::collections::BTreeMap;
use std::process::Command;

use ccm_proto::v1::{
    CreateNodeGroupRequest, Faults, ListInstancesRequest, ListSimNodeGroupsRequest, SimTaint,
};
use ccm_proto::{ClientConfig, GatewayClient, TokenSource};
use ccm_sandbox::CloudKind;
use ccm_testkit::env::eventually;
use ccm_testkit::scenario;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const ZONE: &str = "sim-zone-b";

/// Runs `steps` (each `(rpc, request)`) through the Python client; one
/// answer per step.
fn autoscaler(config: &str, steps: &[(&str, Value)]) -> Vec<Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/autoscaler_client.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(config)
        .args(
            steps
                .iter()
                .map(|(rpc, request)| json!({"rpc": rpc, "request": request}).to_string()),
        )
        .output()
        .expect("run the autoscaler client");
    assert!(
        out.status.success(),
        "the autoscaler client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn one(config: &str, rpc: &str, request: Value) -> Value {
    autoscaler(config, &[(rpc, request)]).remove(0)
}

fn ok(answer: Value) -> Value {
    answer
        .get("ok")
        .cloned()
        .unwrap_or_else(|| panic!("refused: {answer}"))
}

/// The group's instances as NodeGroupNodes answers them after a Refresh.
fn instances(config: &str) -> Vec<Value> {
    let mut answers = autoscaler(
        config,
        &[
            ("Refresh", json!({})),
            ("NodeGroupNodes", json!({"id": "workers"})),
        ],
    );
    ok(answers.remove(1))["instances"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The workers' Nodes: name → (provider ID, initialised).
async fn worker_nodes(nodes: &Api<Node>) -> BTreeMap<String, (String, bool)> {
    nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let spec = n.spec.clone().unwrap_or_default();
            let initialised = !spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == kube_test_apiserver::fixtures::UNINITIALIZED);
            name.starts_with("workers-")
                .then(|| (name, (spec.provider_id.unwrap_or_default(), initialised)))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_scales_a_sim_node_group_and_nodes_join_and_leave() {
    let mut extra = BTreeMap::new();
    extra.insert(
        "cloud-gateway".to_owned(),
        vec!["--node-groups-refresh-interval".to_owned(), "1s".to_owned()],
    );
    let (sandbox, kubelets, _dir) = scenario::start_with(CloudKind::Sim, 2, 0, extra).await;
    let config = sandbox.endpoints["autoscaler_cloud_config"].clone();
    let admin = sandbox.admin().unwrap();
    admin
        .sim_admin()
        .unwrap()
        .create_node_group(CreateNodeGroupRequest {
            cluster_name: "kubernetes".into(),
            id: "workers".into(),
            min_size: 1,
            max_size: 3,
            target_size: 1,
            instance_type: "sim.standard-4".into(),
            zones: vec![ZONE.into()],
            labels: [("pool".to_owned(), "workers".to_owned())].into(),
            taints: vec![SimTaint {
                key: "dedicated".into(),
                value: "workers".into(),
                effect: "NoSchedule".into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(sandbox.client().await.unwrap());

    // The loop's first reads: the group, its template, an unmanaged node.
    let answers = autoscaler(
        &config,
        &[
            ("Refresh", json!({})),
            ("NodeGroups", json!({})),
            ("NodeGroupTargetSize", json!({"id": "workers"})),
            ("NodeGroupTemplateNodeInfo", json!({"id": "workers"})),
        ],
    );
    let groups = ok(answers[1].clone())["nodeGroups"].clone();
    let groups: Vec<_> = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["id"].clone(), g["minSize"].clone(), g["maxSize"].clone()))
        .collect();
    assert_eq!(
        groups,
        [(json!("workers"), json!(1), json!(3))],
        "{answers:?}"
    );
    assert_eq!(ok(answers[2].clone())["targetSize"], 1);
    assert!(
        ok(answers[3].clone())["nodeBytes"].is_string(),
        "a template node: {:?}",
        answers[3]
    );
    let unmanaged = nodes.get("node-0").await.unwrap();
    let unmanaged_id = eventually("node-0 initialised", || async {
        nodes.get("node-0").await.ok()?.spec?.provider_id
    })
    .await;
    let answer = ok(one(
        &config,
        "NodeGroupForNode",
        json!({"node": {"providerID": unmanaged_id, "name": unmanaged.metadata.name}}),
    ));
    assert_eq!(
        answer["nodeGroup"]
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or(""),
        "",
        "an unmanaged node's group is the empty id: {answer}"
    );

    // The first instance joins: its Node registered, initialised, routed.
    let first = eventually("the group's first Node initialised", || async {
        let workers = worker_nodes(&nodes).await;
        (workers.len() == 1 && workers.values().all(|(id, init)| *init && !id.is_empty()))
            .then_some(workers)
    })
    .await;
    let (first_name, (first_id, _)) = first.into_iter().next().unwrap();
    let answer = ok(one(
        &config,
        "NodeGroupForNode",
        json!({"node": {"providerID": first_id, "name": first_name}}),
    ));
    assert_eq!(answer["nodeGroup"]["id"], "workers", "{answer}");

    // Scale up by one: a second Node joins; past the maximum is refused.
    let answers = autoscaler(
        &config,
        &[
            (
                "NodeGroupIncreaseSize",
                json!({"id": "workers", "delta": 1}),
            ),
            ("NodeGroupTargetSize", json!({"id": "workers"})),
            (
                "NodeGroupIncreaseSize",
                json!({"id": "workers", "delta": 2}),
            ),
        ],
    );
    ok(answers[0].clone());
    assert_eq!(ok(answers[1].clone())["targetSize"], 2);
    assert_eq!(answers[2]["code"], "INVALID_ARGUMENT", "{answers:?}");
    let workers = eventually("two workers initialised", || async {
        let workers = worker_nodes(&nodes).await;
        (workers.len() == 2 && workers.values().all(|(_, init)| *init)).then_some(workers)
    })
    .await;
    let cloud = sandbox.options.state_dir.join("gateway");
    eventually("a route to each worker", || async {
        let routes = ccm_provider_sim::store::Store::read(&cloud).ok()?.routes;
        workers
            .keys()
            .all(|w| routes.iter().any(|r| r.target_node == *w))
            .then_some(())
    })
    .await;

    // Delete a named node: its instance goes, and the node controller
    // deletes its Node; the last one may not go below the minimum.
    let (gone_name, (gone_id, _)) = workers.iter().last().unwrap();
    let (kept_name, (kept_id, _)) = workers.iter().next().unwrap();
    let answers = autoscaler(
        &config,
        &[
            ("Refresh", json!({})),
            (
                "NodeGroupDeleteNodes",
                json!({"id": "workers", "nodes": [{"providerID": gone_id, "name": gone_name}]}),
            ),
            ("NodeGroupTargetSize", json!({"id": "workers"})),
            (
                "NodeGroupDeleteNodes",
                json!({"id": "workers", "nodes": [{"providerID": kept_id, "name": kept_name}]}),
            ),
            (
                "NodeGroupDecreaseTargetSize",
                json!({"id": "workers", "delta": -1}),
            ),
        ],
    );
    ok(answers[1].clone());
    assert_eq!(ok(answers[2].clone())["targetSize"], 1);
    assert_eq!(
        answers[3]["code"], "INVALID_ARGUMENT",
        "below the minimum: {answers:?}"
    );
    assert_eq!(
        answers[4]["code"], "INVALID_ARGUMENT",
        "decreasing the target never deletes a running node: {answers:?}"
    );
    eventually("the deleted node's instance and Node gone", || async {
        let instances = admin
            .sim_admin()
            .ok()?
            .list_instances(ListInstancesRequest {})
            .await
            .ok()?
            .into_inner()
            .instances;
        let workers = worker_nodes(&nodes).await;
        (!instances.iter().any(|i| i.name == *gone_name)
            && workers.keys().collect::<Vec<_>>() == vec![kept_name])
        .then_some(())
    })
    .await;

    // No capacity in the zone: the launch fails and shows as the
    // instance's error, out of resources, until the target drops again.
    let mut sim = admin.sim_admin().unwrap();
    sim.set_faults(Faults {
        capacity_exhausted_zones: vec![ZONE.into()],
        ..Default::default()
    })
    .await
    .unwrap();
    ok(one(
        &config,
        "NodeGroupIncreaseSize",
        json!({"id": "workers", "delta": 1}),
    ));
    let failed: Vec<Value> = instances(&config)
        .into_iter()
        .filter(|i| i["status"].get("errorInfo").is_some())
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        failed[0]["status"]["errorInfo"]["instanceErrorClass"], 1,
        "out of resources: {failed:?}"
    );
    let answers = autoscaler(
        &config,
        &[
            (
                "NodeGroupDecreaseTargetSize",
                json!({"id": "workers", "delta": -1}),
            ),
            ("NodeGroupTargetSize", json!({"id": "workers"})),
        ],
    );
    ok(answers[0].clone());
    assert_eq!(ok(answers[1].clone())["targetSize"], 1);
    assert_eq!(instances(&config).len(), 1);

    // Its certificate (of the sandbox's client CA) opens this service and
    // nothing else.
    let pki = sandbox.options.state_dir.join("client-pki");
    let mut as_autoscaler =
        ClientConfig::new(sandbox.gateway.clone(), "kubernetes", TokenSource::None);
    as_autoscaler.tls_ca = sandbox.gateway_ca.clone();
    as_autoscaler.client_cert = Some((pki.join("autoscaler.crt"), pki.join("autoscaler.key")));
    let refused = GatewayClient::new(as_autoscaler)
        .unwrap()
        .list_load_balancers()
        .await
        .expect_err("the autoscaler's certificate may not list load balancers");
    assert!(
        refused.to_string().to_lowercase().contains("permission"),
        "{refused}"
    );
    // An operator sees the autoscaler's calls beside the controllers'.
    let kubeconfig = sandbox.kubeconfig.clone();
    let status = tokio::task::spawn_blocking(move || {
        ccm_testkit::kubectl_ccm(&kubeconfig, &["status", "--as", "operator"])
    })
    .await
    .unwrap();
    let served = status
        .stdout
        .lines()
        .find(|l| l.contains("calls served:"))
        .unwrap_or_else(|| panic!("no calls served: {status:?}"));
    assert!(
        served.contains("CloudProvider (Cluster Autoscaler)") && served.contains("Instances "),
        "{served}"
    );
    scenario::finish(sandbox, kubelets).await;
}

/// The Auto Scaling group `name` as boto3 reads it from moto: `(desired
/// capacity, instance IDs)`.
fn group_by_boto3(endpoint: &str, name: &str) -> (i64, Vec<String>) {
    let script = "import boto3, json, sys\n\
        asg = boto3.client('autoscaling', endpoint_url=sys.argv[1], region_name=sys.argv[2],\n\
            aws_access_key_id='a', aws_secret_access_key='b')\n\
        g = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[sys.argv[3]])['AutoScalingGroups'][0]\n\
        print(json.dumps([g['DesiredCapacity'], sorted(i['InstanceId'] for i in g['Instances'])]))\n";
    serde_json::from_value(ccm_testkit::boto3(script, endpoint, &[name])).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_autoscaler_scales_an_aws_auto_scaling_group_read_back_with_boto3() {
    use ccm_sandbox::aws::groups;
    let mut extra = BTreeMap::new();
    extra.insert(
        "cloud-gateway".to_owned(),
        vec!["--node-groups-refresh-interval".to_owned(), "0s".to_owned()],
    );
    let (sandbox, kubelets, _dir) = scenario::start_with(CloudKind::Aws, 1, 0, extra).await;
    let config = sandbox.endpoints["autoscaler_cloud_config"].clone();
    let aws = sandbox.aws.as_ref().unwrap();
    let moto = aws.moto.endpoint.clone();
    ccm_sandbox::aws::seed_node_groups(&moto, &aws.seeded, "kubernetes")
        .await
        .unwrap();
    let untagged = group_by_boto3(&moto, groups::UNTAGGED);

    // The groups tagged for the cluster, and one more worker.
    let answers = autoscaler(
        &config,
        &[
            ("Refresh", json!({})),
            ("NodeGroups", json!({})),
            (
                "NodeGroupIncreaseSize",
                json!({"id": groups::WORKERS, "delta": 1}),
            ),
        ],
    );
    let mut ids: Vec<String> = ok(answers[1].clone())["nodeGroups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids, [groups::GPUS, groups::WORKERS], "{answers:?}");
    ok(answers[2].clone());
    let (desired, instances) = group_by_boto3(&moto, groups::WORKERS);
    assert_eq!((desired, instances.len()), (2, 2));

    // Delete one named node: gone from the group, the target one less.
    let answers = autoscaler(
        &config,
        &[
            ("Refresh", json!({})),
            ("NodeGroupNodes", json!({"id": groups::WORKERS})),
        ],
    );
    let listed = ok(answers[1].clone())["instances"].clone();
    let doomed = listed[0]["id"].as_str().unwrap().to_owned();
    ok(one(
        &config,
        "NodeGroupDeleteNodes",
        json!({"id": groups::WORKERS, "nodes": [{"providerID": doomed}]}),
    ));
    let (desired, instances) = group_by_boto3(&moto, groups::WORKERS);
    assert_eq!(desired, 1);
    assert_eq!(instances.len(), 1);
    assert!(!doomed.ends_with(&instances[0]), "{doomed} still there");
    // Below the minimum: refused, nothing deleted.
    let remaining = format!("aws:///{}/{}", aws.seeded.subnets[0].0, instances[0]);
    let answer = one(
        &config,
        "NodeGroupDeleteNodes",
        json!({"id": groups::WORKERS, "nodes": [{"providerID": remaining}]}),
    );
    assert_eq!(answer["code"], "INVALID_ARGUMENT", "{answer}");
    assert_eq!(group_by_boto3(&moto, groups::WORKERS).0, 1);
    // A group without the discovery tags was never touched.
    assert_eq!(group_by_boto3(&moto, groups::UNTAGGED), untagged);
    scenario::finish(sandbox, kubelets).await;
}

/// The autoscaler's status ConfigMap (`kube-system/cluster-autoscaler-status`),
/// parsed: what `kubectl describe` shows an operator.
async fn autoscaler_status(client: &kube::Client) -> Option<Value> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let map = maps.get("cluster-autoscaler-status").await.ok()?;
    let text = map.data?.remove("status")?;
    serde_norway::from_str(&text).ok()
}

/// Waits for `what` while asserting, at every look, that the autoscaler
/// says the cluster is healthy (once it has said anything).
async fn healthy_until<T, F, Fut>(sandbox: &ccm_sandbox::Sandbox, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let client = sandbox.client().await.unwrap();
    let start = std::time::Instant::now();
    loop {
        // Until its first loop it says only that it is initialising.
        if let Some(status) = autoscaler_status(&client)
            .await
            .filter(|s| !s["clusterWide"]["health"].is_null())
        {
            assert_eq!(
                status["clusterWide"]["health"]["status"], "Healthy",
                "while waiting for {what}: {status}"
            );
        }
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(150),
            "timed out waiting for {what}; the autoscaler's log ends:\n{}",
            sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 40)
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// A Pod kube-scheduler could not place: it selects the group's nodes and
/// asks for more than any other node has free; the condition is the one
/// kube-scheduler writes.
async fn unschedulable_pod(client: &kube::Client, name: &str, selector: (&str, &str)) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeSelector": {selector.0: selector.1},
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
        }]}})),
    )
    .await
    .unwrap();
}

/// The sim group's target, as the simulated cloud holds it.
async fn sim_target(sandbox: &ccm_sandbox::Sandbox, id: &str) -> Option<u32> {
    sandbox
        .admin()
        .ok()?
        .sim_admin()
        .ok()?
        .list_node_groups(ListSimNodeGroupsRequest {})
        .await
        .ok()?
        .into_inner()
        .node_groups
        .into_iter()
        .find(|g| g.id == id)
        .map(|g| g.target_size)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_cluster_autoscaler_scales_a_sim_group_up_from_zero_and_back_down() {
    const TEST: &str = "a_stock_cluster_autoscaler_scales_a_sim_group_up_from_zero_and_back_down";
    let Some(binary) = ccm_testkit::cluster_autoscaler(TEST) else {
        return;
    };
    use ccm_sandbox::autoscaler::{GROUP, GROUP_LABEL};
    let mut extra = BTreeMap::new();
    extra.insert(
        "cloud-gateway".to_owned(),
        vec!["--node-groups-refresh-interval".to_owned(), "1s".to_owned()],
    );
    extra.insert(
        ccm_sandbox::autoscaler::NAME.to_owned(),
        [
            "--scan-interval=2s",
            "--scale-down-unneeded-time=10s",
            "--scale-down-delay-after-add=10s",
            "--v=4",
        ]
        .map(String::from)
        .to_vec(),
    );
    let (mut sandbox, kubelets, _dir) =
        scenario::start_adjusted(CloudKind::Sim, 2, 0, extra, |o| {
            o.cluster_autoscaler = Some(binary)
        })
        .await;
    let client = sandbox.client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let log = sandbox.options.state_dir.join("cluster-autoscaler.log");

    // It runs, and sees the empty group.
    healthy_until(&sandbox, "the autoscaler to report the group", || async {
        let status = autoscaler_status(&client).await?;
        let groups = status["nodeGroups"].as_array()?;
        groups.iter().any(|g| g["name"] == GROUP).then_some(())
    })
    .await;
    assert_eq!(sim_target(&sandbox, GROUP).await, Some(0));

    // A Pod only the group's nodes could take: up from zero, by the
    // template (there is no node of the group to copy).
    unschedulable_pod(&client, "big", GROUP_LABEL).await;
    let (name, provider_id) = healthy_until(&sandbox, "a worker's Node initialised", || async {
        let workers = worker_nodes(&nodes).await;
        let (name, (id, initialised)) = workers.into_iter().next()?;
        (initialised && !id.is_empty()).then_some((name, id))
    })
    .await;
    assert_eq!(
        sim_target(&sandbox, GROUP).await,
        Some(1),
        "one node for one Pod: {}",
        sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 30)
    );
    let node = nodes.get(&name).await.unwrap();
    assert_eq!(
        node.metadata
            .labels
            .unwrap_or_default()
            .get(GROUP_LABEL.0)
            .map(String::as_str),
        Some(GROUP_LABEL.1),
        "the kubelet registers the group's labels"
    );
    // An operator with the chart's viewer roles sees it.
    let kubeconfig = sandbox.kubeconfig.clone();
    let status = tokio::task::spawn_blocking(move || {
        ccm_testkit::kubectl_ccm(&kubeconfig, &["status", "--as", "operator"])
    })
    .await
    .unwrap();
    assert!(
        status
            .stdout
            .contains("cluster-autoscaler:\n  Healthy (kube-system/cluster-autoscaler-status")
            && status
                .stdout
                .contains("node group workers: Healthy, target 1 (0..5)")
            && status.stdout.contains("CloudProvider (Cluster Autoscaler)"),
        "{status:?}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("Scale-up: setting group workers size to 1"),
        "{}",
        sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 30)
    );

    // As kube-scheduler would: the Pod runs there; then it is deleted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.patch(
        "big",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"nodeName": name}})),
    )
    .await
    .unwrap();
    pods.patch_status(
        "big",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}})),
    )
    .await
    .unwrap();
    pods.delete("big", &DeleteParams::default()).await.unwrap();

    // The empty node goes: the group back to zero, its instance and Node
    // gone.
    healthy_until(&sandbox, "the empty worker scaled down", || async {
        let instances = sandbox
            .admin()
            .ok()?
            .sim_admin()
            .ok()?
            .list_instances(ListInstancesRequest {})
            .await
            .ok()?
            .into_inner()
            .instances;
        let gone = !instances.iter().any(|i| provider_id.ends_with(&i.id));
        (gone
            && sim_target(&sandbox, GROUP).await == Some(0)
            && nodes.get_opt(&name).await.ok()?.is_none())
        .then_some(())
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("ToBeDeletedByClusterAutoscaler") && !text.contains("panic"),
        "{}",
        sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 30)
    );
    // Every request it made was understood: nothing refused for its
    // encoding, nothing it watches missing.
    assert!(
        !text.contains("cannot be sent as protobuf")
            && !text.contains("could not find the requested resource"),
        "{}",
        sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 30)
    );
    let exited = sandbox.exited(ccm_sandbox::autoscaler::NAME).unwrap();
    assert!(exited.is_none(), "the autoscaler exited: {exited:?}");
    scenario::finish(sandbox, kubelets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_cluster_autoscaler_scales_an_aws_group_up_from_zero_read_back_with_boto3() {
    const TEST: &str =
        "a_stock_cluster_autoscaler_scales_an_aws_group_up_from_zero_read_back_with_boto3";
    let Some(binary) = ccm_testkit::cluster_autoscaler(TEST) else {
        return;
    };
    use ccm_sandbox::aws::groups;
    let mut extra = BTreeMap::new();
    extra.insert(
        "cloud-gateway".to_owned(),
        vec!["--node-groups-refresh-interval".to_owned(), "0s".to_owned()],
    );
    extra.insert(
        ccm_sandbox::autoscaler::NAME.to_owned(),
        vec!["--scan-interval=2s".to_owned(), "--v=4".to_owned()],
    );
    let (sandbox, kubelets, _dir) = scenario::start_adjusted(CloudKind::Aws, 1, 0, extra, |o| {
        o.cluster_autoscaler = Some(binary)
    })
    .await;
    let client = sandbox.client().await.unwrap();
    let moto = sandbox.aws.as_ref().unwrap().moto.endpoint.clone();
    assert_eq!(group_by_boto3(&moto, groups::GPUS), (0, Vec::new()));
    // Only the GPU group's nodes are g4dn.xlarge: its template (from its
    // launch configuration) is all the autoscaler has to go by.
    unschedulable_pod(
        &client,
        "gpu-job",
        ("node.kubernetes.io/instance-type", "g4dn.xlarge"),
    )
    .await;
    healthy_until(&sandbox, "the GPU group scaled up to one", || async {
        let moto = moto.clone();
        let (desired, instances) =
            tokio::task::spawn_blocking(move || group_by_boto3(&moto, groups::GPUS))
                .await
                .ok()?;
        (desired == 1 && instances.len() == 1).then_some(())
    })
    .await;
    let text =
        std::fs::read_to_string(sandbox.options.state_dir.join("cluster-autoscaler.log")).unwrap();
    assert!(
        text.contains("Scale-up: setting group gpus size to 1") && !text.contains("panic"),
        "{}",
        sandbox.log_tail(ccm_sandbox::autoscaler::NAME, 30)
    );
    scenario::finish(sandbox, kubelets).await;
}

/// The README's install of upstream's chart gives the binary only flags it
/// has: the chart passes `cloudProvider` as `--cloud-provider` and each
/// `extraArgs.NAME` as `--NAME`, and this asks the real binary's `--help`.
#[test]
fn the_readme_installs_the_autoscaler_with_flags_the_real_binary_has() {
    const TEST: &str = "the_readme_installs_the_autoscaler_with_flags_the_real_binary_has";
    let Some(binary) = ccm_testkit::cluster_autoscaler(TEST) else {
        return;
    };
    let out = Command::new(binary).arg("--help").output().unwrap();
    let help = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"),
    )
    .unwrap();
    let start = readme
        .find("helm install cluster-autoscaler")
        .expect("the README installs upstream's chart");
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let mut flags = Vec::new();
    for set in block.split("--set ").skip(1) {
        let (key, value) = set
            .split_whitespace()
            .next()
            .unwrap()
            .split_once('=')
            .unwrap();
        let flag = match key {
            "cloudProvider" => "cloud-provider",
            _ => match key.strip_prefix("extraArgs.") {
                Some(flag) => flag,
                None => continue,
            },
        };
        assert!(
            help.contains(&format!("--{flag} ")),
            "the README passes --{flag}={value}, which the binary does not have:\n{help}"
        );
        flags.push((flag, value));
    }
    assert!(
        flags
            .iter()
            .any(|(f, v)| *f == "cloud-provider" && *v == "externalgrpc")
            && flags.iter().any(|(f, _)| *f == "cloud-config"),
        "{flags:?}"
    );
    let providers = help
        .lines()
        .find(|l| l.trim_start().starts_with("--cloud-provider "))
        .unwrap();
    assert!(providers.contains("externalgrpc"), "{providers}");
}
