//! The observer: every second it reads what the cloud holds (the sim's
//! database, directly: not through the gateway, which may be dead or
//! frozen, nor through what any controller believes) and what the API
//! server holds, and checks the invariants:
//!
//! - never two load balancers for one Service;
//! - never one load balancer for two Services: a load balancer that
//!   belonged to a Service in one look belongs to another in the next
//!   while the first still wants it; and, while a made-up Service whose
//!   UID collides with a real one's in the load balancer name asks for one
//!   (the churn's [`Collision`] rounds), the real Service's load balancer
//!   gone, another's, or at another address though its spec has not
//!   changed, or the made-up Service answered with the real one's address;
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
//! second read existed when its Node was already gone. A collision round
//! is only held against looks that began after it, when the real
//! Service's load balancer it names had been read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_sim::store::{LoadBalancerRecord, Snapshot, Store};
use ccm_sandbox::Handle;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::Violation;
use crate::churn::{COLLIDE, Collision, Collisions, GREEDY};

/// How long one read may take before the round is given up.
const READ: Duration = Duration::from_secs(3);

/// What the API server holds that the invariants are about.
#[derive(Debug, Default)]
pub struct Cluster {
    /// Each Node: its pod CIDR and whether it is initialised.
    pub nodes: BTreeMap<String, (Option<String>, bool)>,
    /// Each Node's Ready condition as its kubelet last wrote it (status
    /// and heartbeat), for the report of what did not converge.
    pub readiness: BTreeMap<String, String>,
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
    /// `metadata.generation`: it changes with the spec.
    pub generation: i64,
    pub load_balancer: bool,
    pub deleting: bool,
    pub ingress: bool,
}

impl ServiceState {
    /// Whether the Service lives and wants its load balancer.
    fn wants_load_balancer(&self) -> bool {
        self.load_balancer && !self.deleting
    }
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
        let readiness = nodes
            .iter()
            .map(|n| {
                let ready = n
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
                let said = ready.map_or_else(
                    || "no Ready condition".to_owned(),
                    |c| {
                        let beat = c.last_heartbeat_time.as_ref().map(|t| t.0.to_string());
                        format!("Ready {}, heartbeat {}", c.status, beat.unwrap_or_default())
                    },
                );
                (n.metadata.name.clone().unwrap_or_default(), said)
            })
            .collect();
        anyhow::Ok(Cluster {
            readiness,
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
                    generation: s.metadata.generation.unwrap_or_default(),
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
    /// Each load balancer (cluster, name) and the Service UID it was for.
    owners: BTreeMap<(String, String), String>,
    /// The generation of each Service (by UID) that wanted its load
    /// balancer.
    wanting: BTreeMap<String, i64>,
}

impl Seen {
    fn new(now: &Cluster, after: &Snapshot) -> Self {
        Self {
            nodes: now.nodes.keys().cloned().collect(),
            load_balancers: after
                .load_balancers
                .iter()
                .map(|lb| lb.service_uid.clone())
                .collect(),
            owners: after
                .load_balancers
                .iter()
                .map(|lb| {
                    (
                        (lb.cluster.clone(), lb.name.clone()),
                        lb.service_uid.clone(),
                    )
                })
                .collect(),
            wanting: now
                .services
                .iter()
                .filter(|s| s.wants_load_balancer())
                .map(|s| (s.uid.clone(), s.generation))
                .collect(),
        }
    }
}

/// The violation of a load balancer that was `service`'s (`uid`) now held
/// by `lb`'s Service.
fn taken_over(service: &str, uid: &str, lb: &LoadBalancerRecord) -> String {
    format!(
        "load balancer {} of {service} (uid {uid}) was taken over by {}/{} (uid {})",
        lb.name, lb.service_namespace, lb.service_name, lb.service_uid
    )
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
    // A Service that wanted its load balancer in both looks and whose
    // spec did not change between them gave the controller no reason to
    // delete it: its name cannot have been free for another Service.
    let mut taken = BTreeSet::new();
    for lb in &before.load_balancers {
        let Some(was) = seen.owners.get(&(lb.cluster.clone(), lb.name.clone())) else {
            continue;
        };
        if *was == lb.service_uid {
            continue;
        }
        if let Some(s) = now.services.iter().find(|s| {
            &s.uid == was && s.wants_load_balancer() && seen.wanting.get(was) == Some(&s.generation)
        }) {
            out.push(taken_over(&s.key, was, lb));
            taken.insert(was.as_str());
        }
    }
    // A load balancer taken over is not also reported as deleted.
    for uid in seen
        .load_balancers
        .iter()
        .filter(|uid| !per_service.contains_key(uid.as_str()) && !taken.contains(uid.as_str()))
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

/// The broken invariants of the collision rounds in flight, in one look
/// that began after each of them. While the real Service lives, wants its
/// load balancer and keeps the spec it had when the round began, the
/// controller has no reason to touch its load balancer's name or address:
/// so it is a violation that it is gone, held for another Service, or at
/// another address; or that the made-up Service was answered with one of
/// its addresses.
fn collision_violations(rounds: &[Collision], before: &Snapshot, now: &Cluster) -> Vec<String> {
    let mut out = Vec::new();
    for round in rounds {
        let unchanged = now.services.iter().any(|s| {
            s.uid == round.uid && s.wants_load_balancer() && s.generation == round.generation
        });
        if !unchanged {
            continue;
        }
        let lb = before
            .load_balancers
            .iter()
            .find(|lb| lb.cluster == round.cluster && lb.name == round.name);
        match lb {
            None => out.push(format!(
                "load balancer {} of {} is gone while the Service wants it, since {}/{} (uid {}) asked for one",
                round.name, round.service, round.made_up.namespace, round.made_up.name, round.made_up.uid
            )),
            Some(lb) if lb.service_uid != round.uid => {
                out.push(taken_over(&round.service, &round.uid, lb));
            }
            Some(lb) if lb.addresses != round.addresses => out.push(format!(
                "load balancer {} of {} moved from {:?} to {:?} while its spec stayed the same",
                round.name, round.service, round.addresses, lb.addresses
            )),
            Some(_) => {}
        }
        let shared: Vec<&String> = round
            .answered
            .iter()
            .flatten()
            .filter(|ip| round.addresses.iter().any(|a| a.to_string() == **ip))
            .collect();
        if !shared.is_empty() {
            out.push(format!(
                "{}/{} (uid {}) was answered with the address of {}'s load balancer {}: {shared:?}",
                round.made_up.namespace,
                round.made_up.name,
                round.made_up.uid,
                round.service,
                round.name
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
    collisions: Collisions,
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
        let began = Instant::now();
        let Some((before, now, after)) = look(&handle, &dir).await else {
            blind += 1;
            continue;
        };
        observed += 1;
        let rounds: Vec<Collision> = collisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| r.since <= began)
            .cloned()
            .collect();
        let mut broken = collision_violations(&rounds, &before, &now);
        if let Some(seen) = &seen {
            broken.extend(violations(seen, &before, &now, &after));
        }
        for what in broken {
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
        seen = Some(Seen::new(&now, &after));
    }
}

/// What is not yet as it should be once every fault is gone; empty when
/// converged: every Node has its instance and is initialised; every
/// LoadBalancer Service has its address and exactly one load balancer,
/// backed by live nodes only; no Service waits for its deletion; no load
/// balancer without a Service (the soak's made-up Services' own are
/// named as such: the churn deletes them before this is asked); one
/// route per node with a pod CIDR, to that
/// node, and no other; no certificate of a live node pending.
fn not_converged(cloud: &Snapshot, now: &Cluster) -> Vec<String> {
    let mut off = Vec::new();
    let instances: BTreeSet<&str> = cloud.instances.iter().map(|i| i.name.as_str()).collect();
    for (node, (_, initialised)) in &now.nodes {
        if !instances.contains(node.as_str()) {
            let ready = now.readiness.get(node).map_or("", String::as_str);
            off.push(format!("Node {node} remains, its instance gone ({ready})"));
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
        if lb.service_namespace == COLLIDE {
            off.push(format!(
                "load balancer {} of the soak's made-up {}/{} is still there",
                lb.name, lb.service_namespace, lb.service_name
            ));
            continue;
        }
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

#[cfg(test)]
mod tests {
    use ccm_proto::v1::ServiceRef;

    use super::*;

    const A: &str = "1234abcd-12ab-34cd-56ef-1234567890ab";
    const MADE_UP: &str = "1234abcd-12ab-34cd-56ef-1234567890ac";
    const NAME: &str = "a1234abcd12ab34cd56ef1234567890a";

    fn lb(name: &str, namespace: &str, uid: &str, ip: &str) -> LoadBalancerRecord {
        LoadBalancerRecord {
            cluster: "c".into(),
            name: name.into(),
            service_namespace: namespace.into(),
            service_name: "web".into(),
            service_uid: uid.into(),
            addresses: vec![ip.parse().unwrap()],
            internal: false,
            algorithm: String::new(),
            health_check_interval_ms: 0,
            ports: Vec::new(),
            source_ranges: Vec::new(),
            hosts: Vec::new(),
            ready_at_ms: 0,
        }
    }

    fn cloud(lbs: Vec<LoadBalancerRecord>) -> Snapshot {
        Snapshot {
            load_balancers: lbs,
            ..Default::default()
        }
    }

    fn cluster(generation: i64, load_balancer: bool, deleting: bool) -> Cluster {
        Cluster {
            services: vec![ServiceState {
                key: "default/web".into(),
                uid: A.into(),
                generation,
                load_balancer,
                deleting,
                ingress: true,
            }],
            ..Default::default()
        }
    }

    fn round(answered: Option<&str>) -> Collision {
        Collision {
            since: Instant::now(),
            service: "default/web".into(),
            uid: A.into(),
            generation: 1,
            cluster: "c".into(),
            name: NAME.into(),
            addresses: vec!["192.0.2.1".parse().unwrap()],
            made_up: ServiceRef {
                namespace: COLLIDE.into(),
                name: "web".into(),
                uid: MADE_UP.into(),
            },
            answered: answered.map(|ip| vec![ip.to_owned()]),
            until: Instant::now(),
        }
    }

    const TAKEN: &str = "load balancer a1234abcd12ab34cd56ef1234567890a of default/web (uid 1234abcd-12ab-34cd-56ef-1234567890ab) was taken over by soak-collide/web (uid 1234abcd-12ab-34cd-56ef-1234567890ac)";

    #[test]
    fn a_load_balancer_taken_over_from_a_service_that_still_wants_it_is_a_violation() {
        let ours = lb(NAME, "default", A, "192.0.2.1");
        let theirs = lb(NAME, COLLIDE, MADE_UP, "192.0.2.1");
        let seen = Seen::new(&cluster(1, true, false), &cloud(vec![ours.clone()]));
        let cases = [
            ("untouched", ours.clone(), cluster(1, true, false), None),
            (
                "taken over",
                theirs.clone(),
                cluster(1, true, false),
                Some(TAKEN),
            ),
            // A spec change, a deletion or a type change may free the
            // name; the Service's load balancer is gone all the same.
            (
                "spec changed",
                theirs.clone(),
                cluster(2, true, false),
                Some("the load balancer of default/web was deleted while the Service wants it"),
            ),
            ("deleting", theirs.clone(), cluster(1, true, true), None),
            (
                "no longer a LoadBalancer",
                theirs.clone(),
                cluster(2, false, false),
                None,
            ),
            ("Service gone", theirs, Cluster::default(), None),
        ];
        for (case, now_lb, now, want) in cases {
            let before = cloud(vec![now_lb]);
            let got = violations(&seen, &before, &now, &before);
            assert_eq!(
                got,
                want.map(str::to_owned).into_iter().collect::<Vec<_>>(),
                "{case}"
            );
        }
    }

    #[test]
    fn a_collision_round_holds_the_real_services_load_balancer_to_what_it_was() {
        let ours = lb(NAME, "default", A, "192.0.2.1");
        let own = lb(
            "a1234abcd12ab34cd56ef12-0badf00d",
            COLLIDE,
            MADE_UP,
            "192.0.2.2",
        );
        let answered = "soak-collide/web (uid 1234abcd-12ab-34cd-56ef-1234567890ac) was answered with the address of default/web's load balancer a1234abcd12ab34cd56ef1234567890a: [\"192.0.2.1\"]";
        let cases = [
            (
                "refused",
                round(None),
                vec![ours.clone()],
                cluster(1, true, false),
                vec![],
            ),
            (
                "given its own",
                round(Some("192.0.2.2")),
                vec![ours.clone(), own.clone()],
                cluster(1, true, false),
                vec![],
            ),
            (
                "taken over",
                round(Some("192.0.2.1")),
                vec![lb(NAME, COLLIDE, MADE_UP, "192.0.2.1")],
                cluster(1, true, false),
                vec![TAKEN, answered],
            ),
            (
                "answered with the real one's address",
                round(Some("192.0.2.1")),
                vec![ours.clone()],
                cluster(1, true, false),
                vec![answered],
            ),
            (
                "gone",
                round(None),
                vec![own.clone()],
                cluster(1, true, false),
                vec![
                    "load balancer a1234abcd12ab34cd56ef1234567890a of default/web is gone while the Service wants it, since soak-collide/web (uid 1234abcd-12ab-34cd-56ef-1234567890ac) asked for one",
                ],
            ),
            (
                "moved",
                round(None),
                vec![lb(NAME, "default", A, "192.0.2.9")],
                cluster(1, true, false),
                vec![
                    "load balancer a1234abcd12ab34cd56ef1234567890a of default/web moved from [192.0.2.1] to [192.0.2.9] while its spec stayed the same",
                ],
            ),
            // The real Service changed, is being deleted or is gone: its
            // load balancer may go or move, and its name be given again.
            (
                "spec changed",
                round(None),
                vec![lb(NAME, COLLIDE, MADE_UP, "192.0.2.9")],
                cluster(2, true, false),
                vec![],
            ),
            (
                "deleting",
                round(None),
                vec![own.clone()],
                cluster(1, true, true),
                vec![],
            ),
            (
                "gone with its Service",
                round(None),
                vec![own],
                Cluster::default(),
                vec![],
            ),
        ];
        for (case, round, lbs, now, want) in cases {
            let got = collision_violations(&[round], &cloud(lbs), &now);
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn the_soaks_made_up_load_balancers_are_named_as_such_when_left_over() {
        let now = cluster(1, true, false);
        let left = cloud(vec![
            lb(NAME, "default", A, "192.0.2.1"),
            lb("other", COLLIDE, MADE_UP, "192.0.2.2"),
        ]);
        let off = not_converged(&left, &now);
        assert_eq!(
            off,
            ["load balancer other of the soak's made-up soak-collide/web is still there"]
        );
    }
}
