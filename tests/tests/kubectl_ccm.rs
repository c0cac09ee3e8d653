//! `kubectl ccm` end to end: the sandbox's processes registered as the
//! chart's Pods, the API server enforcing the chart's RBAC, and the plugin
//! run through the real kubectl by an operator bound only to the chart's
//! viewer roles. Each cause of a pending Service or an uninitialised Node
//! is made on purpose, and `kubectl ccm why` names it in its first line and
//! in `-o json`; `kubectl ccm status` exits 0 on a healthy sandbox and 1
//! when something needs a person.

use std::time::{Duration, Instant};

use ccm_sandbox::{Options, Sandbox};
use ccm_testkit::{PluginAnswer, kubectl_ccm};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube_test_apiserver::fixtures;

const LIMIT: Duration = Duration::from_secs(90);
/// The operator the chart's viewer roles are bound to.
const OPERATOR: &str = "operator";

struct Cluster {
    sandbox: Sandbox,
    kubelets: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// The simulated kubelets: each Node of a running instance Ready, every
/// other one Unknown (as the node lifecycle would mark it).
fn kubelets(sandbox: &Sandbox) -> tokio::task::JoinHandle<()> {
    let handle = sandbox.handle();
    tokio::spawn(async move {
        loop {
            let _ = handle.heartbeat().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

impl Cluster {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("chart.yaml");
        ccm_testkit::chart::render_to(
            &policy,
            &[
                "gateway.provider=sim",
                "nodeController.approveKubeletServingCSRs=true",
                "viewer.subjects=[{kind: User, name: operator}]",
            ],
        )
        .unwrap();
        let options = Options {
            nodes: 3,
            services: 1,
            replicas: 2,
            rbac: Some(policy),
            ..Options::new(dir.path().join("state"), ccm_testkit::bin_dir())
        };
        let sandbox = Sandbox::start(options).await.unwrap();
        sandbox.populate().await.unwrap();
        let kubelets = kubelets(&sandbox);
        let cluster = Self {
            sandbox,
            kubelets,
            _dir: dir,
        };
        cluster
            .until("convergence", async |c| {
                c.sandbox
                    .handle()
                    .progress()
                    .await
                    .is_ok_and(|p| p.converged(&c.sandbox.options))
            })
            .await;
        cluster
    }

    /// `kubectl ccm <args>` as the operator.
    async fn ccm(&self, args: &[&str]) -> PluginAnswer {
        let mut all = args.to_vec();
        all.extend(["--as", OPERATOR]);
        let kubeconfig = self.sandbox.kubeconfig.clone();
        let all: Vec<String> = all.into_iter().map(String::from).collect();
        let run = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = all.iter().map(String::as_str).collect();
            kubectl_ccm(&kubeconfig, &args)
        });
        tokio::time::timeout(LIMIT, run)
            .await
            .expect("kubectl ccm answered in time")
            .unwrap()
    }

    /// The verdict's cause for `object` (`-o json`).
    async fn cause(&self, object: &str) -> (String, PluginAnswer) {
        let answer = self.ccm(&["why", object, "-o", "json"]).await;
        let cause = answer
            .json()
            .pointer("/verdict/cause")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_owned();
        (cause, answer)
    }

    /// Waits until `why object` names `cause`; checks the text answer's
    /// first line then names it too (its words, `says`).
    async fn until_cause(&self, object: &str, cause: &str, says: &str) {
        let start = Instant::now();
        loop {
            let (found, answer) = self.cause(object).await;
            if found == cause {
                break;
            }
            assert!(
                start.elapsed() < LIMIT,
                "{object}: wanted {cause}, still {found}: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let text = self.ccm(&["why", object]).await;
        let first = text.stdout.lines().next().unwrap_or_default();
        assert!(first.contains(says), "{object}: {first:?} in {text:?}");
    }

    async fn until(&self, what: &str, mut check: impl AsyncFnMut(&Self) -> bool) {
        let start = Instant::now();
        while !check(self).await {
            assert!(start.elapsed() < LIMIT, "{what}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn status_code(&self) -> (Option<i32>, PluginAnswer) {
        let answer = self.ccm(&["status"]).await;
        (answer.code, answer)
    }

    async fn services(&self) -> Api<Service> {
        Api::namespaced(self.sandbox.client().await.unwrap(), "default")
    }

    async fn finish(self) {
        self.kubelets.abort();
        let report = self.sandbox.rbac_report().await.unwrap().expect("RBAC on");
        self.sandbox.stop().await;
        // Only the stranger was refused: the controllers and the operator
        // had all they asked for.
        let denied = report["denied"].as_array().cloned().unwrap_or_default();
        assert!(!denied.is_empty(), "the stranger was refused: {report:#}");
        assert!(denied.iter().all(|d| d["user"] == "stranger"), "{report:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_ccm_names_each_cause_of_a_pending_service_or_node() {
    let mut c = Cluster::start().await;
    let services = c.services().await;
    let mut sim = c
        .sandbox
        .handle()
        .gateway_client("admin")
        .unwrap()
        .sim_admin()
        .unwrap();

    // Healthy: status needs no one; a converged Service is ready.
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(0), "{status:?}");
    assert!(status.stdout.contains("nothing needs you"), "{status:?}");
    let svc = services.list(&Default::default()).await.unwrap().items[0].clone();
    let ready = format!("service/{}", svc.metadata.name.unwrap());
    c.until_cause(&ready, "ready", "ready: the load balancer answers at")
        .await;
    c.until_cause("node/node-0", "ready", "initialised: provider ID sim://")
        .await;

    // The namespace flag, as kubectl's.
    let named = c.ccm(&["why", &ready, "-n", "default", "-o", "yaml"]).await;
    assert!(named.stdout.contains("cause: ready"), "{named:?}");

    // Without the viewer binding, the plugin is refused and says so.
    let kubeconfig = c.sandbox.kubeconfig.clone();
    let refused = tokio::task::spawn_blocking(move || {
        kubectl_ccm(&kubeconfig, &["status", "--as", "stranger"])
    })
    .await
    .unwrap();
    assert_eq!(refused.code, Some(2), "{refused:?}");
    assert!(refused.stderr.contains("forbidden"), "{refused:?}");

    // An invalid annotation: refused, with the annotation named.
    let bad = fixtures::load_balancer("default", "bad")
        .annotation("sim.cloudgateway.io/algorithm", "fastest")
        .build();
    services.create(&PostParams::default(), &bad).await.unwrap();
    c.until_cause("service/bad", "refused", "refused: ").await;
    let (_, answer) = c.cause("service/bad").await;
    let summary = answer.json()["verdict"]["summary"].to_string();
    assert!(summary.contains("algorithm"), "{summary}");

    // Another controller's class.
    let other = fixtures::load_balancer("default", "other")
        .class("example.com/other")
        .build();
    services
        .create(&PostParams::default(), &other)
        .await
        .unwrap();
    c.until_cause(
        "service/other",
        "another_controller",
        "another controller owns it: loadBalancerClass example.com/other",
    )
    .await;

    // A load balancer the cloud takes a minute to provision.
    sim.set_faults(ccm_proto::v1::Faults {
        lb_provisioning_delay: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let slow = fixtures::load_balancer("default", "slow").build();
    services
        .create(&PostParams::default(), &slow)
        .await
        .unwrap();
    c.until_cause(
        "service/slow",
        "provisioning",
        "waiting for the cloud to finish provisioning",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(
        code,
        Some(1),
        "the invalid annotation needs a person: {status:?}"
    );

    // The cloud throttling every call.
    sim.set_faults(ccm_proto::v1::Faults {
        throttle_rate: 1.0,
        ..Default::default()
    })
    .await
    .unwrap();
    let busy = fixtures::load_balancer("default", "busy").build();
    services
        .create(&PostParams::default(), &busy)
        .await
        .unwrap();
    c.until_cause("service/busy", "throttling", "cloud throttling: ")
        .await;
    let (_, answer) = c.cause("service/busy").await;
    let summary = answer.json()["verdict"]["summary"].to_string();
    assert!(summary.contains("this one at high priority"), "{summary}");

    // The cloud failing every ensure.
    sim.set_faults(ccm_proto::v1::Faults {
        error_rate_by_operation: [("ensure_load_balancer".to_owned(), 1.0)].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let broken = fixtures::load_balancer("default", "broken").build();
    services
        .create(&PostParams::default(), &broken)
        .await
        .unwrap();
    c.until_cause("service/broken", "failing", "failing: ")
        .await;
    sim.set_faults(ccm_proto::v1::Faults::default())
        .await
        .unwrap();
    for name in ["bad", "other", "slow", "busy", "broken"] {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    // A Node whose instance the cloud does not have, its kubelet up (a
    // NotReady one would be deleted on the cloud's confirmed answer, so the
    // simulated kubelets, which would mark it so, pause meanwhile).
    c.kubelets.abort();
    let nodes: Api<Node> = Api::all(c.sandbox.client().await.unwrap());
    let ghost = fixtures::node("ghost").uninitialized().ready().build();
    let status = ghost.status.clone();
    nodes.create(&PostParams::default(), &ghost).await.unwrap();
    nodes
        .patch_status(
            "ghost",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"status": status})),
        )
        .await
        .unwrap();
    c.until_cause(
        "node/ghost",
        "instance_missing",
        "the cloud has no instance for this node",
    )
    .await;
    nodes
        .delete("ghost", &DeleteParams::default())
        .await
        .unwrap();
    c.kubelets = kubelets(&c.sandbox);

    // The service controller's leader killed: until the standby takes
    // over, the leader the Lease names does not answer.
    let leader = c
        .sandbox
        .leader("ccm-service-controller")
        .await
        .unwrap()
        .expect("a service-controller leads");
    c.sandbox.kill(&leader).await.unwrap();
    let waiting = fixtures::load_balancer("default", "leaderless").build();
    services
        .create(&PostParams::default(), &waiting)
        .await
        .unwrap();
    c.until_cause(
        "service/leaderless",
        "leader_unreachable",
        &format!("the service-controller leader {leader} does not answer"),
    )
    .await;
    c.sandbox.restart(&leader).unwrap();

    // The gateway stopped: the leader cannot reach it.
    c.sandbox.kill("cloud-gateway").await.unwrap();
    let orphan = fixtures::load_balancer("default", "unreached").build();
    services
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();
    c.until_cause(
        "service/unreached",
        "gateway_unreachable",
        "gateway unreachable from the service-controller leader",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(1), "{status:?}");
    assert!(
        status.stdout.contains("gateway: does not answer"),
        "{status:?}"
    );
    c.sandbox.restart("cloud-gateway").unwrap();
    c.until_cause("service/unreached", "ready", "ready: ").await;

    // Every service-controller replica stopped: no leader since the lease
    // ran out.
    for replica in ["service-controller-0", "service-controller-1"] {
        c.sandbox.kill(replica).await.unwrap();
    }
    let late = fixtures::load_balancer("default", "late").build();
    services
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    c.until_cause(
        "service/late",
        "no_leader",
        "no leader for service-controller since ",
    )
    .await;
    let (code, status) = c.status_code().await;
    assert_eq!(code, Some(1), "{status:?}");
    assert!(
        status.stdout.contains("service-controller: no leader"),
        "{status:?}"
    );
    for replica in ["service-controller-0", "service-controller-1"] {
        c.sandbox.restart(replica).unwrap();
    }
    c.until_cause("service/late", "ready", "ready: ").await;
    c.finish().await;
}
