//! The API server's own failures, through the real binaries under the
//! chart's RBAC: down for a minute and back with its state, every watch
//! answered 410 Gone, updates refused with conflicts for a while, and a
//! restart with a new resourceVersion epoch. After each, every controller
//! carries on in the same process (none exits or is restarted), what
//! changed meanwhile is acted on, and the cloud sees no write storm: at
//! most one ensure per load balancer already there (when the lease moved
//! to a replica that did not make it), no host updates, deletes or route
//! writes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_proto::v1::GetStatsRequest;
use ccm_sandbox::{Handle, Sandbox};
use ccm_testkit::scenario::{LIMIT, finish, start, until};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use kube_test_apiserver::fixtures;

const LEASES: [&str; 3] = [
    "ccm-node-controller",
    "ccm-service-controller",
    "ccm-route-controller",
];

/// The cloud's write calls since the last reset, by operation, and resets.
async fn cloud_writes(h: &Handle) -> BTreeMap<String, u64> {
    let stats = h
        .gateway_client("admin")
        .unwrap()
        .sim_admin()
        .unwrap()
        .get_stats(GetStatsRequest { reset: true })
        .await
        .unwrap()
        .into_inner();
    stats
        .calls
        .into_iter()
        .filter(|(op, n)| {
            *n > 0
                && matches!(
                    op.as_str(),
                    "ensure_load_balancer"
                        | "update_load_balancer_hosts"
                        | "delete_load_balancer"
                        | "create_route"
                        | "delete_route"
                )
        })
        .collect()
}

/// Waits until the cloud sees no write for a few seconds (the host updates
/// that follow convergence are done), then resets the counters.
async fn quiet(h: &Handle) {
    let start = Instant::now();
    cloud_writes(h).await;
    loop {
        tokio::time::sleep(Duration::from_secs(3)).await;
        if cloud_writes(h).await.is_empty() {
            return;
        }
        assert!(start.elapsed() < LIMIT, "the cloud never went quiet");
    }
}

/// Every controller process still runs: none exited to be restarted.
fn none_exited(sandbox: &mut Sandbox) {
    for name in sandbox.processes() {
        if name.contains("-controller-") {
            let exited = sandbox.exited(&name).unwrap();
            assert!(
                exited.is_none(),
                "{name} exited: {exited:?}; its log ends:\n{}",
                sandbox.log_tail(&name, 25)
            );
        }
    }
}

/// Waits until each controller's lease is renewed again by a holder.
async fn every_lease_led(sandbox: &Sandbox) {
    let leases: Api<Lease> = Api::namespaced(sandbox.client().await.unwrap(), "kube-system");
    let start = Instant::now();
    for name in LEASES {
        loop {
            let renewed = leases
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.renew_time)
                .map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0));
            if renewed.is_some_and(|ago| ago.as_secs_f64() < 2.0) {
                break;
            }
            assert!(start.elapsed() < LIMIT, "{name}: nobody leads");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Sends the API server one of its faults (see its `POST /debug/faults`).
async fn api_fault(sandbox: &Sandbox, fault: serde_json::Value) {
    let client = sandbox.client().await.unwrap();
    let request = http::Request::post("/debug/faults")
        .header("content-type", "application/json")
        .body(fault.to_string().into_bytes())
        .unwrap();
    client.request_text(request).await.unwrap();
}

async fn create_service(sandbox: &Sandbox, name: &str) {
    Api::<Service>::namespaced(sandbox.client().await.unwrap(), "default")
        .create(
            &PostParams::default(),
            &fixtures::load_balancer("default", name).build(),
        )
        .await
        .unwrap();
}

/// After a fault the existing load balancers may be ensured once each (a
/// replica that did not make them took the lease), the new one once; no
/// other write reaches the cloud.
fn no_write_storm(writes: &BTreeMap<String, u64>, existing: u64) {
    let ensures = writes.get("ensure_load_balancer").copied().unwrap_or(0);
    assert!(
        (1..=existing + 1).contains(&ensures),
        "ensures: {writes:?} (at most one per load balancer)"
    );
    let others: u64 = writes
        .iter()
        .filter(|(op, _)| *op != "ensure_load_balancer")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(others, 0, "no other cloud write: {writes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_down_for_a_minute_and_back_is_recovered_from_without_a_restart() {
    let (mut sandbox, kubelets, _dir) = start(3, 3).await;
    let h = sandbox.handle();
    until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
    quiet(&h).await;

    sandbox.kill("kube-test-apiserver").await.unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    sandbox.restart("kube-test-apiserver").unwrap();
    let back = Instant::now();

    // The state came back: the same objects, every Service still served.
    let p = until(&h, "the API server back", |p| p.nodes == 3).await;
    assert_eq!(p.ips.len(), 3, "{p}");
    every_lease_led(&sandbox).await;
    let led = back.elapsed();
    create_service(&sandbox, "after-outage").await;
    until(&h, "the new Service served", |p| p.ips.len() == 4).await;
    eprintln!(
        "every lease led {led:?} after the API server was back; a new Service served after {:?}",
        back.elapsed()
    );
    none_exited(&mut sandbox);
    no_write_storm(&cloud_writes(&h).await, 3);
    finish(sandbox, kubelets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_answered_410_gone_are_listed_again_and_followed() {
    let (mut sandbox, kubelets, _dir) = start(2, 2).await;
    let h = sandbox.handle();
    until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
    quiet(&h).await;

    api_fault(&sandbox, serde_json::json!({"expireWatches": true})).await;
    // Only a controller that listed again after its watch was refused
    // sees this Service.
    create_service(&sandbox, "after-expiry").await;
    until(&h, "the new Service served", |p| p.ips.len() == 3).await;
    none_exited(&mut sandbox);
    let writes = cloud_writes(&h).await;
    assert_eq!(
        writes,
        BTreeMap::from([("ensure_load_balancer".to_owned(), 1)]),
        "listing again changed nothing else"
    );
    finish(sandbox, kubelets).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_refused_for_a_while_are_retried_without_asking_the_cloud_again() {
    let (mut sandbox, kubelets, _dir) = start(2, 1).await;
    let h = sandbox.handle();
    until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
    quiet(&h).await;

    api_fault(
        &sandbox,
        serde_json::json!({"refuseUpdates": {"resource": "services", "subresource": "status", "seconds": 20}}),
    )
    .await;
    let refused_at = Instant::now();
    create_service(&sandbox, "refused").await;
    // The load balancer is made at once; its address cannot be written.
    let start = Instant::now();
    while cloud_writes_peek(&h).await == 0 {
        assert!(start.elapsed() < LIMIT, "no ensure");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(refused_at.elapsed() < Duration::from_secs(20));
    let p = h.progress().await.unwrap();
    assert_eq!(p.ips.len(), 1, "the address waits: {p}");
    let p = until(
        &h,
        "the address written once the API server takes it",
        |p| p.ips.len() == 2,
    )
    .await;
    assert!(refused_at.elapsed() >= Duration::from_secs(20), "{p}");
    none_exited(&mut sandbox);
    assert_eq!(
        cloud_writes(&h).await,
        BTreeMap::from([("ensure_load_balancer".to_owned(), 1)]),
        "every retry wrote only the Service's status"
    );
    finish(sandbox, kubelets).await;
}

/// The ensures since the last reset, leaving the counters as they are.
async fn cloud_writes_peek(h: &Handle) -> u64 {
    h.gateway_client("admin")
        .unwrap()
        .sim_admin()
        .unwrap()
        .get_stats(GetStatsRequest { reset: false })
        .await
        .unwrap()
        .into_inner()
        .calls
        .get("ensure_load_balancer")
        .copied()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restarted_with_a_new_resource_version_epoch_is_followed() {
    let (mut sandbox, kubelets, _dir) = start(2, 2).await;
    let h = sandbox.handle();
    until(&h, "convergence", |p| p.converged(&sandbox.options)).await;
    quiet(&h).await;

    sandbox.kill("kube-test-apiserver").await.unwrap();
    sandbox
        .restart_with(
            "kube-test-apiserver",
            &["--bump-resource-version".into(), "1000000000".into()],
        )
        .unwrap();
    until(&h, "the API server back", |p| p.nodes == 2).await;
    create_service(&sandbox, "after-restore").await;
    until(&h, "the new Service served", |p| p.ips.len() == 3).await;
    let rv: u64 = Api::<Service>::namespaced(sandbox.client().await.unwrap(), "default")
        .get("after-restore")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv > 1_000_000_000, "a version of the new epoch: {rv}");
    none_exited(&mut sandbox);
    no_write_storm(&cloud_writes(&h).await, 2);
    finish(sandbox, kubelets).await;
}
