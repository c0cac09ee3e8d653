//! The observer: every second it reads what the cloud holds (the sim's
//! database, directly: not through the gateway, which may be dead or
//! frozen, nor through what any controller believes) and what the API
//! server holds, and checks the invariants:
//!
//! - never two load balancers for one Service;
//! - never a Service's load balancer deleted while the Service lives and
//!   wants it (a load balancer decision on a guess);
//! - never a Node deleted while its instance exists (running or stopped);
//! - never a route whose pod CIDR belongs to another node;
//! - never a certificate approved that names another node's address.
//!
//! The cloud is read before and after the API server in each round, so a
//! change racing the reads can never look like a violation: a load
//! balancer gone by the first read had its Service's deletion begun before
//! it (visible in the API read after), and an instance still there at the
//! second read existed when its Node was already gone.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_sim::store::{Snapshot, Store};
use ccm_sandbox::Handle;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::Violation;
use crate::churn::GREEDY;

/// How long one read may take before the round is given up.
const READ: Duration = Duration::from_secs(3);

/// What the API server holds that the invariants are about.
#[derive(Debug, Default)]
pub struct Cluster {
    /// Each Node: its pod CIDR and whether it is initialised.
    pub nodes: BTreeMap<String, (Option<String>, bool)>,
    pub services: Vec<ServiceState>,
    /// Each CSR: its name, the node it asks for, and its decision
    /// (`Approved`, `Denied` or empty while pending).
    pub csrs: Vec<(String, String, String)>,
}

/// A Service as the invariants see it.
#[derive(Debug)]
pub struct ServiceState {
    pub key: String,
    pub uid: String,
    pub load_balancer: bool,
    pub deleting: bool,
    pub ingress: bool,
}

async fn cloud(dir: &Path) -> Option<Snapshot> {
    let dir = dir.to_path_buf();
    let read = tokio::task::spawn_blocking(move || Store::read(&dir));
    match tokio::time::timeout(READ, read).await {
        Ok(Ok(Ok(snapshot))) => Some(snapshot),
        _ => None,
    }
}

async fn cluster(handle: &Handle) -> Option<Cluster> {
    let read = async {
        let client = ccm_runtime::kube::client(Some(&handle.kubeconfig)).await?;
        let nodes = Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await?
            .items;
        let services = Api::<Service>::all(client.clone())
            .list(&Default::default())
            .await?
            .items;
        let csrs = Api::<CertificateSigningRequest>::all(client)
            .list(&Default::default())
            .await?
            .items;
        anyhow::Ok(Cluster {
            nodes: nodes
                .into_iter()
                .map(|n| {
                    let initialised =
                        !n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|t| {
                                t.iter()
                                    .any(|t| t.key == kube_test_apiserver::fixtures::UNINITIALIZED)
                            });
                    let cidr = n.spec.as_ref().and_then(|s| s.pod_cidr.clone());
                    (n.metadata.name.unwrap_or_default(), (cidr, initialised))
                })
                .collect(),
            services: services
                .into_iter()
                .map(|s| ServiceState {
                    key: format!(
                        "{}/{}",
                        s.metadata.namespace.clone().unwrap_or_default(),
                        s.metadata.name.clone().unwrap_or_default()
                    ),
                    uid: s.metadata.uid.clone().unwrap_or_default(),
                    load_balancer: s.spec.as_ref().and_then(|s| s.type_.as_deref())
                        == Some("LoadBalancer"),
                    deleting: s.metadata.deletion_timestamp.is_some(),
                    ingress: s
                        .status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|l| l.ingress.as_ref())
                        .is_some_and(|i| !i.is_empty()),
                })
                .collect(),
            csrs: csrs
                .into_iter()
                .map(|c| {
                    let node = c
                        .spec
                        .username
                        .as_deref()
                        .and_then(|u| u.strip_prefix("system:node:"))
                        .unwrap_or_default()
                        .to_owned();
                    let decision = c
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Approved" || c.type_ == "Denied")
                        .map(|c| c.type_)
                        .unwrap_or_default();
                    (c.metadata.name.unwrap_or_default(), node, decision)
                })
                .collect(),
        })
    };
    match tokio::time::timeout(READ, read).await {
        Ok(Ok(cluster)) => Some(cluster),
        _ => None,
    }
}

/// One consistent look: the cloud, the API server, the cloud again.
async fn look(handle: &Handle, dir: &Path) -> Option<(Snapshot, Cluster, Snapshot)> {
    let before = cloud(dir).await?;
    let cluster = cluster(handle).await?;
    let after = cloud(dir).await?;
    Some((before, cluster, after))
}

/// What was seen in the last round, to compare the next one with.
#[derive(Default)]
struct Seen {
    nodes: BTreeSet<String>,
    /// The Service UIDs that had a load balancer.
    load_balancers: BTreeSet<String>,
}

/// The broken invariants in one look, given the last one.
fn violations(seen: &Seen, before: &Snapshot, now: &Cluster, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    let mut per_service = BTreeMap::<&str, usize>::new();
    for lb in &before.load_balancers {
        *per_service.entry(lb.service_uid.as_str()).or_default() += 1;
    }
    for (uid, n) in &per_service {
        if *n > 1 {
            out.push(format!("{n} load balancers for the Service with uid {uid}"));
        }
    }
    for uid in seen
        .load_balancers
        .iter()
        .filter(|uid| !per_service.contains_key(uid.as_str()))
    {
        if let Some(s) = now
            .services
            .iter()
            .find(|s| &s.uid == uid && s.load_balancer && !s.deleting)
        {
            out.push(format!(
                "the load balancer of {} was deleted while the Service wants it",
                s.key
            ));
        }
    }
    for gone in seen.nodes.iter().filter(|n| !now.nodes.contains_key(*n)) {
        if let Some(i) = after.instances.iter().find(|i| &i.name == gone) {
            out.push(format!(
                "Node {gone} was deleted while its instance {} exists (running: {})",
                i.id, i.running
            ));
        }
    }
    for route in &before.routes {
        for (node, (cidr, _)) in &now.nodes {
            if cidr.as_deref() == Some(route.destination_cidr.as_str())
                && *node != route.target_node
            {
                out.push(format!(
                    "the route for {} goes to {}, but it is {node}'s pod CIDR",
                    route.destination_cidr, route.target_node
                ));
            }
        }
    }
    for (name, _, decision) in &now.csrs {
        if name.starts_with(GREEDY) && decision == "Approved" {
            out.push(format!(
                "certificate {name}, naming another node's address, was approved"
            ));
        }
    }
    out
}

/// Checks every invariant each second until `done`; returns the rounds it
/// saw both sides and the rounds it could not.
pub async fn watch(
    handle: Handle,
    dir: PathBuf,
    started: Instant,
    found: Arc<Mutex<Vec<Violation>>>,
    done: CancellationToken,
) -> (u64, u64) {
    let (mut observed, mut blind) = (0, 0);
    let mut seen: Option<Seen> = None;
    let mut reported = BTreeSet::new();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = done.cancelled() => return (observed, blind),
        }
        let Some((before, now, after)) = look(&handle, &dir).await else {
            blind += 1;
            continue;
        };
        observed += 1;
        if let Some(seen) = &seen {
            for what in violations(seen, &before, &now, &after) {
                if reported.insert(what.clone()) {
                    tracing::error!(%what, "invariant violated");
                    found
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Violation {
                            at: started.elapsed(),
                            what,
                        });
                }
            }
        }
        seen = Some(Seen {
            nodes: now.nodes.keys().cloned().collect(),
            load_balancers: after
                .load_balancers
                .iter()
                .map(|lb| lb.service_uid.clone())
                .collect(),
        });
    }
}

/// What is not yet as it should be once every fault is gone; empty when
/// converged: every Node has its instance and is initialised; every
/// LoadBalancer Service has its address and exactly one load balancer,
/// backed by live nodes only; no Service waits for its deletion; no load
/// balancer without a Service; one route per node with a pod CIDR, to that
/// node, and no other; no certificate of a live node pending.
fn not_converged(cloud: &Snapshot, now: &Cluster) -> Vec<String> {
    let mut off = Vec::new();
    let instances: BTreeSet<&str> = cloud.instances.iter().map(|i| i.name.as_str()).collect();
    for (node, (_, initialised)) in &now.nodes {
        if !instances.contains(node.as_str()) {
            off.push(format!("Node {node} remains, its instance gone"));
        } else if !initialised {
            off.push(format!("Node {node} not initialised"));
        }
    }
    let wanted: BTreeMap<&str, &ServiceState> = now
        .services
        .iter()
        .filter(|s| s.load_balancer && !s.deleting)
        .map(|s| (s.uid.as_str(), s))
        .collect();
    for s in now.services.iter().filter(|s| s.deleting) {
        off.push(format!("{} still being deleted", s.key));
    }
    for s in wanted.values() {
        let lbs: Vec<_> = cloud
            .load_balancers
            .iter()
            .filter(|lb| lb.service_uid == s.uid)
            .collect();
        if !s.ingress {
            off.push(format!("{} has no address", s.key));
        }
        if lbs.len() != 1 {
            off.push(format!("{} has {} load balancers", s.key, lbs.len()));
        }
        for lb in lbs {
            for host in lb.hosts.iter().filter(|h| !now.nodes.contains_key(*h)) {
                off.push(format!("{}'s load balancer still sends to {host}", s.key));
            }
        }
    }
    for lb in cloud
        .load_balancers
        .iter()
        .filter(|lb| !wanted.contains_key(lb.service_uid.as_str()))
    {
        off.push(format!(
            "load balancer {} of {}/{} leaked",
            lb.name, lb.service_namespace, lb.service_name
        ));
    }
    let mut routed = BTreeSet::new();
    for route in &cloud.routes {
        match now.nodes.get(&route.target_node) {
            Some((Some(cidr), _)) if *cidr == route.destination_cidr => {
                routed.insert(route.target_node.as_str());
            }
            _ => off.push(format!(
                "route {} to {} leaked",
                route.destination_cidr, route.target_node
            )),
        }
    }
    for (node, (cidr, _)) in &now.nodes {
        if cidr.is_some() && !routed.contains(node.as_str()) {
            off.push(format!("Node {node} has no route"));
        }
    }
    for (name, node, decision) in &now.csrs {
        if decision.is_empty() && now.nodes.contains_key(node) {
            off.push(format!("certificate {name} of {node} still pending"));
        }
    }
    off
}

/// Waits until everything has converged, at most `limit`; else what was
/// still off at the end.
pub async fn wait_converged(handle: &Handle, dir: &Path, limit: Duration) -> Result<(), String> {
    let start = Instant::now();
    let mut last = vec!["nothing could be read".to_owned()];
    while start.elapsed() < limit {
        if let Some((_, now, after)) = look(handle, dir).await {
            last = not_converged(&after, &now);
            if last.is_empty() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    last.truncate(10);
    Err(last.join("; "))
}
