//! Scenario 11: load balancer targets by cluster size. The service
//! controller's own selection code ([`service_controller::subsets`] and
//! [`service_controller::endpoints`]) runs in this process over a modelled
//! cluster: nodes spread over three zones, Services of type LoadBalancer
//! (half `externalTrafficPolicy: Local`, each with its pods on random
//! nodes), AWS's NLB quotas. What it counts (targets, and the targets that
//! change when a node joins or leaves or pods move) is what the controller
//! would ask of the cloud; scenario 12 ([`crate::live_targets`]) runs the
//! same cluster through the real binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_runtime::host_limits::Allowed;
use ccm_runtime::names;
use ccm_runtime::view::Interner;
use k8s_openapi::api::core::v1::Service;
use kube_test_apiserver::fixtures::{load_balancer, node};
use service_controller::endpoints::Serving;
use service_controller::membership::{Ask, Membership};
use service_controller::plan::NodeView;
use service_controller::subsets::{self, Selection};

use crate::Row;

/// What the report says of scenario 11, which runs no binary.
pub const PREAMBLE: &str = "Scenario 11 is the exception: it runs the service controller's own \
selection code (`subsets.rs`, `endpoints.rs`) in the harness's process over a modelled cluster \
(nodes spread evenly over 3 zones, half the Services Local with 10 pods each on random nodes, \
AWS's NLB quotas of 500 targets per zone and 3,000 per load balancer) and counts the targets it \
chooses; its upstream column is every eligible node, as upstream registers them. Scenario 12 \
runs the same cluster through the real binaries with our defaults only (every node, upstream's \
choice, is refused by the sim's quotas past 500 nodes a zone): it reads each load balancer's \
targets back from the sim, which must be exactly those the selection code chooses, and times \
nodes joining and leaving one at a time.";

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
/// AWS's published NLB quotas (targets per zone, per load balancer).
const NLB: Allowed = Allowed {
    per_zone: Some(500),
    total: Some(3000),
};
/// Pods of each Local Service.
pub(crate) const PODS: usize = 10;
/// Pods moved by the rolling update measured.
const MOVED: usize = 100;
const GRACE: Duration = Duration::from_secs(60);

/// A deterministic stream of numbers (SplitMix64), so every run models the
/// same cluster.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

struct Model {
    strings: Interner,
    nodes: Vec<NodeView>,
    services: Vec<(Service, bool)>,
    /// Each Local Service's pods, by the node each runs on.
    pods: Vec<Vec<Arc<str>>>,
    serving: Serving,
    random: Random,
}

fn key(i: usize) -> (String, String) {
    ("default".into(), format!("svc-{i}"))
}

impl Model {
    fn new(nodes: usize, services: usize) -> Self {
        let strings = Interner::default();
        // Sorted by name, as the controller keeps them.
        let mut views: Vec<NodeView> = (0..nodes).map(|i| view(&strings, i)).collect();
        views.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let services = (0..services)
            .map(|i| {
                let mut svc = load_balancer("default", &format!("svc-{i}"));
                let local = i % 2 == 1;
                if local {
                    svc = svc.local();
                }
                let mut svc = svc.build();
                svc.metadata.uid = Some(format!("00000000-0000-0000-0000-{i:012}"));
                (svc, local)
            })
            .collect();
        let mut model = Model {
            strings,
            nodes: views,
            services,
            pods: Vec::new(),
            serving: Serving::default(),
            random: Random(nodes as u64),
        };
        let t0 = Instant::now();
        for i in 0..model.services.len() {
            let pods = (0..PODS)
                .map(|_| {
                    let n = model.random.below(model.nodes.len());
                    model.strings.intern(&model.nodes[n].name)
                })
                .collect();
            model.pods.push(pods);
            model.publish(i, t0);
        }
        model
    }

    /// Writes Service `i`'s pods as its one EndpointSlice.
    fn publish(&mut self, i: usize, now: Instant) {
        if !self.services[i].1 {
            return;
        }
        let mut nodes = self.pods[i].clone();
        nodes.sort_unstable();
        nodes.dedup();
        self.serving.apply(&key(i), "slice", Some(&nodes), now);
    }

    /// Every Service's targets, as the controller would choose them now
    /// with subsets of `subset` per zone.
    fn targets(&self, now: Instant, subset: usize) -> Vec<BTreeSet<String>> {
        self.services
            .iter()
            .enumerate()
            .map(|(i, (svc, local))| {
                let serving = local
                    .then(|| self.serving.nodes(&key(i), GRACE, now))
                    .flatten();
                chosen(&self.nodes, svc, subset, serving.as_ref())
            })
            .collect()
    }
}

/// The service controller's membership ([`Membership`]) of a model's
/// cluster, as a host pass uses it.
struct Kept {
    membership: Membership,
    asks: Vec<Ask>,
}

impl Model {
    /// What a host pass does after a node change, with `subset` per zone:
    /// each Service's question worked out from it, then its hosts' digest
    /// from the membership, which works them out again only where the
    /// change may have moved them.
    fn pass(&self, kept: &mut Kept, now: Instant, subset: usize) {
        kept.asks = self
            .services
            .iter()
            .map(|(svc, _)| ask(svc, subset))
            .collect();
        for (i, (_, local)) in self.services.iter().enumerate() {
            let serving = local
                .then(|| self.serving.nodes(&key(i), GRACE, now))
                .flatten();
            kept.membership
                .digest(&key(i), &kept.asks[i], serving.as_ref());
        }
    }

    /// Every Service's targets as the membership has them.
    fn kept_targets(&self, kept: &mut Kept, now: Instant) -> Vec<BTreeSet<String>> {
        (0..self.services.len())
            .map(|i| {
                let serving = self.services[i]
                    .1
                    .then(|| self.serving.nodes(&key(i), GRACE, now))
                    .flatten();
                let (hosts, _) = kept
                    .membership
                    .hosts(&key(i), &kept.asks[i], serving.as_ref());
                hosts.list.iter().map(|h| h.name.clone()).collect()
            })
            .collect()
    }
}

/// What `svc` asks of the membership, with subsets of `subset` per zone
/// under AWS's NLB quotas.
fn ask(svc: &Service, subset: usize) -> Ask {
    Ask::of(svc, subset as u32, &[], NLB).expect("no subset annotation")
}

/// The CPU time this thread has used.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.max(0) as u32)
}

/// The targets the service controller chooses for `svc` of `nodes`
/// (sorted by name), with subsets of `subset` per zone under AWS's NLB
/// quotas, and for a Local Service the nodes `serving` it.
pub(crate) fn chosen(
    nodes: &[NodeView],
    svc: &Service,
    subset: usize,
    serving: Option<&BTreeSet<&str>>,
) -> BTreeSet<String> {
    let (chosen, _) = subsets::choose_serving(
        || nodes.iter().filter(|n| n.backs),
        |name| {
            let i = subsets::position(nodes, name).ok()?;
            Some(&nodes[i]).filter(|n| n.backs)
        },
        subsets::seed(svc),
        Selection::Subset(subset as u32),
        NLB,
        serving,
    );
    chosen.into_iter().map(|n| n.name.clone()).collect()
}

/// Nodes joined (or left), each alone, for the mean changes per node.
const EVENTS: usize = 20;

/// What one node joining or leaving cost the membership: the host pass's
/// CPU time, and whether it chose exactly what the full pass did.
#[derive(Default)]
struct Costs {
    cpu: Vec<Duration>,
}

impl Costs {
    fn mean_ms(&self) -> f64 {
        self.cpu.iter().map(Duration::as_secs_f64).sum::<f64>() * 1e3 / self.cpu.len().max(1) as f64
    }

    fn max_ms(&self) -> f64 {
        self.cpu
            .iter()
            .map(Duration::as_secs_f64)
            .fold(0.0, f64::max)
            * 1e3
    }
}

impl Model {
    /// After a node change the full pass chose `after`: with `kept`, the
    /// membership takes in the change (the node `name`, now `view`) in a
    /// host pass, timed in `costs`, and must choose exactly `after`.
    fn follow(
        &self,
        kept: Option<(&mut Kept, &mut Costs)>,
        name: &str,
        view: Option<&NodeView>,
        after: &[BTreeSet<String>],
        now: Instant,
        subset: usize,
    ) -> anyhow::Result<()> {
        let Some((kept, costs)) = kept else {
            return Ok(());
        };
        let started = thread_cpu();
        kept.membership
            .update(name, view.map(|v| Arc::new(v.clone())));
        self.pass(kept, now, subset);
        costs.cpu.push(thread_cpu().saturating_sub(started));
        anyhow::ensure!(
            self.kept_targets(kept, now) == after,
            "the kept membership chose other targets than the full pass after {name} changed"
        );
        Ok(())
    }

    /// The mean target changes from `before` (the targets now) when a new
    /// node joins, over [`EVENTS`] nodes joining one at a time; with
    /// `kept`, what each cost the membership (see [`Self::follow`]).
    fn joins(
        &mut self,
        before: &[BTreeSet<String>],
        now: Instant,
        subset: usize,
        mut kept: Option<(&mut Kept, &mut Costs)>,
    ) -> anyhow::Result<f64> {
        let n = self.nodes.len();
        let mut total = 0;
        for j in 0..EVENTS {
            let joined = view(&self.strings, n + j);
            let at = subsets::position(&self.nodes, &joined.name).unwrap_or_else(|at| at);
            self.nodes.insert(at, joined.clone());
            let after = self.targets(now, subset);
            let reborrow = kept.as_mut().map(|(k, c)| (&mut **k, &mut **c));
            self.follow(reborrow, &joined.name, Some(&joined), &after, now, subset)?;
            self.nodes.remove(at);
            if let Some((kept, _)) = kept.as_mut() {
                kept.membership.update(&joined.name, None);
                self.pass(kept, now, subset);
            }
            total += changes(before, &after);
        }
        Ok(total as f64 / EVENTS as f64)
    }

    /// The mean target changes from `before` when a node of the cluster
    /// leaves, over [`EVENTS`] nodes spread over it leaving one at a time;
    /// with `kept`, what each cost the membership.
    fn leaves(
        &mut self,
        before: &[BTreeSet<String>],
        now: Instant,
        subset: usize,
        mut kept: Option<(&mut Kept, &mut Costs)>,
    ) -> anyhow::Result<f64> {
        let n = self.nodes.len();
        let mut total = 0;
        for j in 0..EVENTS {
            let at = j * n / EVENTS;
            let gone = self.nodes.remove(at);
            let after = self.targets(now, subset);
            let reborrow = kept.as_mut().map(|(k, c)| (&mut **k, &mut **c));
            self.follow(reborrow, &gone.name, None, &after, now, subset)?;
            if let Some((kept, _)) = kept.as_mut() {
                kept.membership
                    .update(&gone.name, Some(Arc::new(gone.clone())));
            }
            self.nodes.insert(at, gone);
            if let Some((kept, _)) = kept.as_mut() {
                self.pass(kept, now, subset);
            }
            total += changes(before, &after);
        }
        Ok(total as f64 / EVENTS as f64)
    }
}

/// The service controller's default subset size.
const SUBSET: usize = 25;

fn view(strings: &Interner, i: usize) -> NodeView {
    let node = node(&format!("node-{i}"))
        .ready()
        .label(names::LABEL_ZONE, ZONES[i % ZONES.len()])
        .build();
    NodeView::of(&node, strings, false)
}

/// The zone of a node the model named.
fn zone_of(name: &str) -> &'static str {
    let i: usize = name["node-".len()..].parse().unwrap_or(0);
    ZONES[i % ZONES.len()]
}

/// Registrations and deregistrations from `a` to `b`, over every load
/// balancer.
fn changes(a: &[BTreeSet<String>], b: &[BTreeSet<String>]) -> usize {
    a.iter()
        .zip(b)
        .map(|(a, b)| a.symmetric_difference(b).count())
        .sum()
}

/// The rows for one size.
pub fn rows(nodes: usize, services: usize) -> anyhow::Result<Vec<Row>> {
    let mut model = Model::new(nodes, services);
    let t0 = Instant::now();
    let before = model.targets(t0, SUBSET);
    // The membership from nothing, as a new leader's first host pass.
    let started = thread_cpu();
    let mut kept = Kept {
        membership: Membership::new(model.nodes.iter().map(|n| Arc::new(n.clone()))),
        asks: Vec::new(),
    };
    model.pass(&mut kept, t0, SUBSET);
    let pass = thread_cpu().saturating_sub(started);
    anyhow::ensure!(
        model.kept_targets(&mut kept, t0) == before,
        "the membership chose other targets than the full pass"
    );
    let m = services as f64;
    let local = model.services.iter().filter(|(_, l)| *l).count();
    let cluster = services - local;

    // Targets per load balancer, and those AWS would refuse.
    let sizes: Vec<usize> = before.iter().map(BTreeSet::len).collect();
    let mean = sizes.iter().sum::<usize>() as f64 / m;
    let max = sizes.iter().copied().max().unwrap_or(0);
    let per_zone = nodes.div_ceil(ZONES.len());
    let over_quota = |per_zone: usize| per_zone > NLB.per_zone.unwrap_or(u32::MAX) as usize;
    let ours_refused = before
        .iter()
        .filter(|t| {
            let mut zones: BTreeMap<&str, usize> = BTreeMap::new();
            for name in *t {
                *zones.entry(zone_of(name)).or_default() += 1;
            }
            zones.values().any(|n| over_quota(*n)) || t.len() > 3000
        })
        .count();

    let (mut joining, mut leaving) = (Costs::default(), Costs::default());
    let join = model.joins(&before, t0, SUBSET, Some((&mut kept, &mut joining)))?;
    // The best any even spread can do: a Cluster Service's subset takes the
    // new node with the odds of any node of its zone, and, once the zone
    // has more nodes than the subset, lets another go for it.
    let join_floor = if per_zone < SUBSET {
        cluster as f64
    } else {
        2.0 * cluster as f64 * SUBSET as f64 / (per_zone + 1) as f64
    };
    // Nodes of the cluster leave, one at a time (pods of Local Services on
    // them among them).
    let leave_floor = if per_zone <= SUBSET {
        cluster as f64
    } else {
        2.0 * cluster as f64 * SUBSET as f64 / per_zone as f64
    } + local as f64 * PODS as f64 / nodes as f64;
    let leave = model.leaves(&before, t0, SUBSET, Some((&mut kept, &mut leaving)))?;
    let left = before;

    // A rolling update moves 100 pods of Local Services to other nodes;
    // the nodes they leave stay for the grace, then go.
    let moved_at = t0 + Duration::from_secs(1);
    let mut moved = 0;
    let mut i = 1;
    while moved < MOVED && i < model.services.len() {
        for p in 0..PODS.min(MOVED - moved) {
            let n = model.random.below(model.nodes.len());
            model.pods[i][p] = model.strings.intern(&model.nodes[n].name);
            moved += 1;
        }
        model.publish(i, moved_at);
        i += 2;
    }
    let during = model.targets(moved_at, SUBSET);
    let after = model.targets(moved_at + GRACE, SUBSET);
    let rolling = changes(&left, &after);
    let during_grace = changes(&left, &during);

    let scenario = format!(
        "11. {nodes} nodes in 3 zones, {services} LoadBalancer Services (half Local, {PODS} pods each), AWS's NLB quotas"
    );
    let row = |metric: &str,
               ours: f64,
               upstream: Option<f64>,
               unit: &'static str,
               limit,
               note: String| Row {
        scenario: scenario.clone(),
        metric: metric.into(),
        ours,
        upstream,
        unit,
        limit,
        target: None,
        note,
    };
    let per_change = |costs: &Costs, what: &str| Row {
        target: Some(("≤ 10 ms".into(), costs.mean_ms() <= PER_CHANGE_MS)),
        ..row(
            &format!("one node {what}: the host pass's work (CPU, mean of {EVENTS})"),
            costs.mean_ms(),
            None,
            "ms",
            None,
            format!(
                "the CPU time of the service controller's host pass after the node {what} (each Service's question read from it, its targets kept or worked out again by the membership), at most {:.2} ms; its targets were exactly the full pass's each time; one core",
                costs.max_ms()
            ),
        )
    };
    Ok(vec![
        row(
            "a host pass from nothing: every load balancer's targets chosen (CPU)",
            pass.as_secs_f64(),
            None,
            "s",
            None,
            "a new leader's first pass (or after a relist): the membership built from every node, then every Service's targets; one core".into(),
        ),
        per_change(&joining, "joining"),
        per_change(&leaving, "leaving"),
        row(
            "targets per load balancer (mean)",
            mean,
            Some(nodes as f64),
            "targets",
            None,
            format!(
                "at most {max} (ours); every node is {} per zone, past the quota of 500 per zone: {} of {services} load balancers refused (upstream profile), {ours_refused} (ours)",
                per_zone,
                if over_quota(per_zone) { services } else { 0 },
            ),
        ),
        row(
            "target changes per node joining (mean of 20)",
            join,
            Some(m),
            "changes",
            Some(join_floor),
            format!(
                "the limit: a subset of {SUBSET} per zone takes a new node with the odds of any other node of its zone, and lets one go for it (2 changes); every node: one registration per load balancer"
            ),
        ),
        row(
            "target changes per node leaving (mean of 20)",
            leave,
            Some(m),
            "changes",
            Some(leave_floor),
            "only the load balancers whose subset held it (2 changes each: it and the node that takes its place) and the Local ones it served".into(),
        ),
        row(
            "target changes per 100 pods moving (rolling update)",
            rolling as f64,
            None,
            "changes",
            None,
            format!(
                "{during_grace} within the {}-s grace (registrations only), the rest once it is out; every node (upstream) changes no target here, since its {local} Local load balancers target every node whether it serves or not",
                GRACE.as_secs()
            ),
        ),
    ])
}

/// The most CPU time one node change may cost the host pass (issue #60).
const PER_CHANGE_MS: f64 = 10.0;

/// Subset sizes against what they cost, at `nodes` nodes: a Markdown
/// table of the Cluster Services' targets, the target changes a node
/// joining makes, and how many nodes carry each Service (a node lost takes
/// that share of its capacity).
pub fn sweep(nodes: usize, services: usize, sizes: &[usize]) -> anyhow::Result<String> {
    let mut model = Model::new(nodes, services);
    let t0 = Instant::now();
    let mut out = String::from(
        "| subset per zone | targets per Cluster load balancer | target changes per node joining (mean of 20) | a Service's share on one node |\n|---:|---:|---:|---:|\n",
    );
    for &k in sizes {
        let before = model.targets(t0, k);
        let join = model.joins(&before, t0, k, None)?;
        let cluster: Vec<usize> = (0..services).filter(|i| i % 2 == 0).collect();
        let targets = cluster.iter().map(|i| before[*i].len()).sum::<usize>() as f64
            / cluster.len().max(1) as f64;
        let _ = std::fmt::Write::write_fmt(
            &mut out,
            format_args!(
                "| {k} | {targets:.0} | {join:.2} | {:.1}% |\n",
                100.0 / targets.max(1.0)
            ),
        );
    }
    Ok(out)
}
