//! Scenario 12: scenario 11's cluster through the real binaries. Nodes in
//! the sim's three zones, LoadBalancer Services (half Local, each with an
//! EndpointSlice of its pods on random nodes), the sim's quotas (AWS's NLB
//! ones); then nodes join one at a time. The harness works out each load
//! balancer's targets with the service controller's own selection code
//! and waits until the cloud holds exactly those: the time a joining node
//! takes to reach the load balancers that need it, and the target changes
//! the cloud saw.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use service_controller::plan::NodeView;
use service_controller::subsets;

use crate::targets::PODS;
use crate::{Harness, POLL, Profile, Row, Run, SUBSET_SIZE};

/// Nodes that join, and then leave, one at a time: at least this many
/// that change a load balancer (at 100,000 nodes most change none)...
const EVENTS: usize = 5;
/// ...unless this many have come and gone.
const MOST_EVENTS: usize = 30;

/// Whether `events` are enough for the means.
fn enough(events: &[Event]) -> bool {
    events.len() >= MOST_EVENTS || events.iter().filter(|e| e.changes > 0).count() >= EVENTS
}

/// Each load balancer's targets, by its Service's name.
type Targets = BTreeMap<String, BTreeSet<String>>;

/// What the harness knows of the cluster, to work out the targets.
struct Cluster {
    strings: ccm_runtime::view::Interner,
    nodes: Vec<NodeView>,
    services: Vec<Service>,
    /// The nodes each Local Service's pods run on.
    serving: BTreeMap<String, BTreeSet<String>>,
}

impl Cluster {
    /// Each load balancer's targets, as the service controller chooses them.
    fn targets(&self) -> Targets {
        self.services
            .iter()
            .map(|svc| {
                let name = svc.name_any();
                let serving: Option<BTreeSet<&str>> = self
                    .serving
                    .get(&name)
                    .map(|s| s.iter().map(String::as_str).collect());
                let targets =
                    crate::targets::chosen(&self.nodes, svc, SUBSET_SIZE, serving.as_ref());
                (name, targets)
            })
            .collect()
    }

    fn remove(&mut self, name: &str) {
        if let Ok(at) = subsets::position(&self.nodes, name) {
            self.nodes.remove(at);
        }
    }

    fn add(&mut self, node: &Node) {
        let view = NodeView::of(node, &self.strings, false);
        let at = subsets::position(&self.nodes, &view.name).unwrap_or_else(|at| at);
        self.nodes.insert(at, view);
    }
}

/// A deterministic pick of node `k` of `n` for pod `p` of Service `i`.
fn pick(i: usize, p: usize, n: usize) -> usize {
    let mut z = (i as u64) << 32 | p as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) % n as u64) as usize
}

impl Run {
    /// Each load balancer's targets in the cloud.
    async fn cloud_targets(&self) -> anyhow::Result<Targets> {
        let lbs = self.sandbox.admin()?.list_load_balancers().await?;
        Ok(lbs
            .into_iter()
            .map(|lb| {
                (
                    lb.service.unwrap_or_default().name,
                    lb.hosts.into_iter().collect(),
                )
            })
            .collect())
    }

    /// Every Node.
    async fn all_nodes(&self) -> anyhow::Result<Vec<Node>> {
        let mut out = Vec::new();
        self.each_node_page(|page| out.extend(page)).await?;
        Ok(out)
    }
}

/// How many targets differ between `a` and `b`, over every load balancer.
fn changes(a: &Targets, b: &Targets) -> usize {
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let empty = BTreeSet::new();
    names
        .into_iter()
        .map(|n| {
            let (x, y) = (a.get(n).unwrap_or(&empty), b.get(n).unwrap_or(&empty));
            x.symmetric_difference(y).count()
        })
        .sum()
}

/// One node joining or leaving, as the cloud saw it.
struct Event {
    /// Seconds until every load balancer held its targets.
    took: f64,
    /// Targets registered and deregistered.
    changes: usize,
    /// The least `took` the debounce and the budget allow.
    floor: f64,
}

impl Harness {
    /// Waits until the cloud holds `expected`, `started` being when the
    /// node joined or left: what it holds then, and the event.
    async fn settle(
        &self,
        run: &Run,
        before: &Targets,
        expected: &Targets,
        started: Instant,
    ) -> anyhow::Result<(Targets, Event)> {
        let limit = self.sizes.limit;
        let mut now = run.cloud_targets().await?;
        while now != *expected {
            anyhow::ensure!(
                started.elapsed() < limit,
                "the load balancers did not take their targets within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = run.cloud_targets().await?;
        }
        let took = started.elapsed().as_secs_f64();
        // The best the debounce and the budget allow: one host pass 1 s
        // after the Node is seen, then an update per load balancer whose
        // targets changed, the first `2 × rate` at once (the budget's
        // burst), the rest at its rate.
        let (rate, latency) = (self.cloud.budget, self.cloud.latency.as_secs_f64());
        let updates = expected
            .iter()
            .filter(|(svc, t)| before.get(*svc) != Some(*t))
            .count() as f64;
        let event = Event {
            took,
            changes: changes(before, &now),
            floor: 1.0 + latency + (updates - 2.0 * rate).max(0.0) / rate,
        };
        // The debounce's window passes before the next node comes or goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok((now, event))
    }

    /// Scenario 12 at `n` nodes and `m` Services.
    pub(crate) async fn live_targets(&mut self, n: usize, m: usize) -> anyhow::Result<Vec<Row>> {
        // Room for an address per load balancer.
        let pool = ("cloud-gateway", "--sim-lb-pool=198.18.0.0/16".to_owned());
        let run = self.start(Profile::Ours, 1, &[pool]).await?;
        run.cluster_of(n).await?;
        let nodes = run.all_nodes().await?;
        let names: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();

        // The Services, then each Local one's pods as its EndpointSlice.
        let services: Api<Service> = Api::namespaced(run.kube.clone(), "default");
        let slices: Api<EndpointSlice> = Api::namespaced(run.kube.clone(), "default");
        let mut serving = BTreeMap::new();
        for i in (1..m).step_by(2) {
            let on: BTreeSet<String> = (0..PODS)
                .map(|p| names[pick(i, p, names.len())].clone())
                .collect();
            serving.insert(format!("targets-{i}"), on);
        }
        futures::stream::iter(0..m)
            .map(|i| {
                let (services, slices) = (services.clone(), slices.clone());
                let name = format!("targets-{i}");
                let pods: Option<Vec<String>> = serving.contains_key(&name).then(|| {
                    (0..PODS)
                        .map(|p| names[pick(i, p, names.len())].clone())
                        .collect()
                });
                async move {
                    let mut svc = kube_test_apiserver::fixtures::load_balancer("default", &name);
                    if pods.is_some() {
                        svc = svc.local();
                    }
                    services
                        .create(&PostParams::default(), &svc.build())
                        .await?;
                    if let Some(pods) = pods {
                        let endpoints: Vec<(&str, bool)> =
                            pods.iter().map(|p| (p.as_str(), true)).collect();
                        let slice = kube_test_apiserver::fixtures::endpoint_slice(
                            "default",
                            &name,
                            &format!("{name}-0"),
                            &endpoints,
                        );
                        slices.create(&PostParams::default(), &slice).await?;
                    }
                    Ok::<_, anyhow::Error>(())
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await?;
        let mut cluster = Cluster {
            strings: Default::default(),
            nodes: Vec::new(),
            services: services.list(&Default::default()).await?.items,
            serving,
        };
        for node in &nodes {
            cluster.add(node);
        }

        let expected = cluster.targets();
        let limit = self.sizes.limit;
        let converged = run
            .until(
                limit,
                POLL,
                "every load balancer on its targets",
                async |r| Ok(r.cloud_targets().await? == expected),
            )
            .await;
        if let Err(e) = converged {
            // Which load balancers differ, and how: enough to tell a slow
            // controller from a wrong choice.
            let have = run.cloud_targets().await?;
            let differ: Vec<String> = expected
                .iter()
                .filter(|(svc, t)| have.get(*svc) != Some(*t))
                .map(|(svc, t)| {
                    let cloud = have.get(svc).cloned().unwrap_or_default();
                    format!(
                        "{svc}: missing {:?}, extra {:?}",
                        t.difference(&cloud).collect::<Vec<_>>(),
                        cloud.difference(t).collect::<Vec<_>>()
                    )
                })
                .collect();
            return Err(e.context(format!(
                "{} of {} load balancers differ from the selection code's choice: {}",
                differ.len(),
                expected.len(),
                differ
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        let mut before = run.cloud_targets().await?;
        let mean_targets =
            before.values().map(BTreeSet::len).sum::<usize>() as f64 / m.max(1) as f64;

        // Nodes join one at a time: from the Node's creation until every
        // load balancer holds exactly its targets again.
        let api = Api::<Node>::all(run.kube.clone());
        let mut joins = Vec::new();
        while !enough(&joins) {
            let j = joins.len();
            let prefix = format!("joining{j}");
            let ips = run.instances(&prefix, 1).await?;
            let started = Instant::now();
            run.nodes(&prefix, &ips, true, false).await?;
            // Its zone comes with its initialisation.
            let name = format!("{prefix}-0");
            let node = loop {
                let node = api.get(&name).await?;
                if node.labels().contains_key(ccm_runtime::names::LABEL_ZONE) {
                    break node;
                }
                anyhow::ensure!(started.elapsed() < limit, "{name} not initialised");
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            cluster.add(&node);
            let (now, event) = self
                .settle(&run, &before, &cluster.targets(), started)
                .await?;
            joins.push(event);
            before = now;
        }
        // Nodes spread over the cluster leave (their Node deleted), one at
        // a time.
        let mut leaves = Vec::new();
        while !enough(&leaves) {
            let name = &names[leaves.len() * names.len() / MOST_EVENTS];
            let started = Instant::now();
            api.delete(name, &Default::default()).await?;
            cluster.remove(name);
            let (now, event) = self
                .settle(&run, &before, &cluster.targets(), started)
                .await?;
            leaves.push(event);
            before = now;
        }
        run.sandbox.stop().await;

        let scenario = format!(
            "12. scenario 11 through the binaries: {n} nodes in 3 zones, {m} LoadBalancer Services (half Local, {PODS} pods each), the sim's NLB quotas"
        );
        let row = |metric: String, ours, unit, limit, note: String| Row {
            scenario: scenario.clone(),
            metric,
            ours,
            upstream: None,
            unit,
            limit,
            target: None,
            note,
        };
        let (rate, latency) = (self.cloud.budget, self.cloud.latency.as_secs_f64());
        let mut rows = vec![row(
            "targets per load balancer in the cloud (mean)".into(),
            mean_targets,
            "targets",
            None,
            "every load balancer held exactly the targets the selection code chose, read back from the sim".into(),
        )];
        for (what, events, how, timed) in [
            (
                "joining",
                &joins,
                "from the Node's creation (its initialisation included)",
                "to reach the load balancers that need it",
            ),
            (
                "leaving",
                &leaves,
                "from the Node's deletion",
                "to be taken off the load balancers it was on",
            ),
        ] {
            // Times only where a load balancer had to change: otherwise
            // there is nothing to wait for.
            let changing: Vec<&Event> = events.iter().filter(|e| e.changes > 0).collect();
            let mean = |f: fn(&Event) -> f64| {
                changing.iter().map(|e| f(e)).sum::<f64>() / changing.len().max(1) as f64
            };
            let max = changing.iter().map(|e| e.took).fold(0.0, f64::max);
            let each: Vec<String> = events.iter().map(|e| e.changes.to_string()).collect();
            if !changing.is_empty() {
                rows.push(row(
                    format!(
                        "time for a node {what} {timed} (mean of the {} of {} that changed one)",
                        changing.len(),
                        events.len()
                    ),
                    mean(|e| e.took),
                    "s",
                    Some(mean(|e| e.floor)),
                    format!(
                        "{how} until every load balancer held exactly its targets (the cloud read every 0.1 s, each read a call under the budget), at most {max:.2} s; the limit: the host pass's 1 s debounce, then one update call ({:.0} ms) per load balancer it changes, under the budget of {rate} calls/s",
                        latency * 1e3
                    ),
                ));
            }
            rows.push(row(
                format!(
                    "target changes per node {what}, counted in the cloud (mean of {})",
                    events.len()
                ),
                events.iter().map(|e| e.changes as f64).sum::<f64>() / events.len().max(1) as f64,
                "changes",
                None,
                format!(
                    "each: {}; scenario 11's model gives the mean of 20 at this size",
                    each.join(", ")
                ),
            ));
        }
        Ok(rows)
    }
}
