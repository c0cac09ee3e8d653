//! Which nodes back each load balancer, kept as nodes come and go, so that
//! a node joining, leaving or changing costs work in the Services it
//! concerns, not in the cluster. [`subsets`] says which nodes a Service
//! takes; [`Membership`] keeps, per Service, what decides it:
//! - a Service with a subset keeps each zone's best-ranked nodes, best
//!   first: a new node enters only where it ranks better than the worst
//!   held (a comparison per Service), and a node leaving matters only
//!   where it was held (that zone is then ranked again, for that Service
//!   alone);
//! - a Local Service on the nodes that serve it is touched only by a change
//!   of one of those (or of its EndpointSlices: the caller passes the
//!   nodes serving it with every question);
//! - a Service that takes every node, or whose subset has no node yet, is
//!   worked out again after any change: its host list is the cluster's.
//!
//! Its answers are exactly [`subsets::choose_serving`]'s over every node;
//! the tests compare the two over random sequences of changes.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ccm_proto::v1::Host;
use ccm_runtime::host_limits::Allowed;
use k8s_openapi::api::core::v1::Service;

use crate::plan::{self, NodeView};
use crate::subsets::{self, Selection};

/// A Service's key: `(namespace, name)`.
pub type Key = (String, String);

/// A load balancer's backing hosts, shared, with their digests.
#[derive(Clone, Debug, Default)]
pub struct Hosts {
    pub list: Arc<Vec<Host>>,
    /// [`plan::hosts_digest`] without addresses: what a host pass compares.
    pub digest: u64,
    /// With addresses: what an ensure asks for.
    pub full_digest: u64,
}

impl Hosts {
    fn of(list: Vec<Host>) -> Self {
        Self {
            digest: plan::hosts_digest(&list, false),
            full_digest: plan::hosts_digest(&list, true),
            list: Arc::new(list),
        }
    }
}

/// What decides which nodes back one Service's load balancer, but for the
/// nodes serving it (asked with each question, as they change on their
/// own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// The Service's half of the ranking ([`subsets::seed`]).
    pub seed: u64,
    pub selection: Selection,
    /// The Node labels a host must have ([`plan::host_selector`]).
    pub selector: Vec<(String, Option<String>)>,
    /// The labels its hosts carry ([`plan::host_label_keys`]).
    pub label_keys: BTreeSet<String>,
    /// The cloud's limits for its kind of load balancer.
    pub allowed: Allowed,
}

impl Ask {
    /// What `svc` asks: its subset annotation's size, else `subset_size`
    /// per zone ([`subsets::selection`]); the Node labels the provider's
    /// host-selecting `annotations` on it name; and what the cloud's
    /// limits `allowed` its kind of load balancer. An invalid subset
    /// annotation is the problem.
    pub fn of(
        svc: &Service,
        subset_size: u32,
        annotations: &[String],
        allowed: Allowed,
    ) -> Result<Self, String> {
        Ok(Self {
            seed: subsets::seed(svc),
            selection: subsets::selection(svc, subset_size)?,
            selector: plan::host_selector(svc, annotations),
            label_keys: plan::host_label_keys(svc, annotations),
            allowed,
        })
    }

    fn eligible(&self, node: &NodeView) -> bool {
        node.selected_by(&self.selector)
    }

    /// Whether `node` may enter the Service's subset: eligible, and no
    /// longer being initialised ([`subsets::choose_serving`]).
    fn known(&self, node: &NodeView) -> bool {
        !node.initialising && self.eligible(node)
    }
}

/// How a load balancer's hosts were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// By the Service's selection.
    Selection(Selection),
    /// The eligible nodes among the `serving` ones of a Local Service.
    Local { serving: usize },
    /// A Local Service's subset: none of the nodes serving it is eligible.
    NoneServingEligible,
}

/// A node, found in a set by its name.
#[derive(Clone, Debug)]
struct ByName(Arc<NodeView>);

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
    }
}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name.as_str().hash(state)
    }
}

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

/// What a ranking reads of one node, kept beside the others' (see
/// [`subsets::AsNode`]).
#[derive(Clone, Debug)]
struct Slot {
    rank: u64,
    zone: Arc<str>,
    draining: bool,
    initialising: bool,
}

impl Slot {
    fn of(node: &NodeView) -> Self {
        Self {
            rank: node.rank,
            zone: node.zone.clone(),
            draining: node.draining,
            initialising: node.initialising,
        }
    }
}

/// A node of the pool as a ranking sees it.
#[derive(Clone, Copy)]
struct Pooled<'a>(&'a Slot, &'a Arc<NodeView>);

impl subsets::AsNode for Pooled<'_> {
    fn node(&self) -> &NodeView {
        self.1
    }

    fn zone(&self) -> &Arc<str> {
        &self.0.zone
    }

    fn score(&self, seed: u64) -> subsets::Score {
        subsets::score_of(seed, self.0.rank, self.0.draining)
    }
}

/// The nodes that back load balancers: what a ranking reads of each side
/// by side (a pass over 100,000 reads 3 MiB in order), each node's view at
/// the same place, and where each is by name.
#[derive(Default)]
struct Pool {
    slots: Vec<Slot>,
    views: Vec<Arc<NodeView>>,
    at: HashMap<ByName, usize>,
}

impl Pool {
    fn len(&self) -> usize {
        self.views.len()
    }

    fn get(&self, name: &str) -> Option<&Arc<NodeView>> {
        self.at.get(name).map(|i| &self.views[*i])
    }

    fn iter(&self) -> impl Iterator<Item = &NodeView> {
        self.views.iter().map(|n| n.as_ref())
    }

    /// Every node as a ranking sees it, with `ask`'s eligible ones that may
    /// enter a subset (no longer being initialised), of `zone` if given.
    fn known<'a>(
        &'a self,
        ask: &'a Ask,
        zone: Option<&'a Arc<str>>,
    ) -> impl Iterator<Item = Pooled<'a>> {
        self.slots
            .iter()
            .zip(&self.views)
            .filter(move |(slot, _)| {
                !slot.initialising
                    && zone.is_none_or(|z| Arc::ptr_eq(z, &slot.zone) || *z == slot.zone)
            })
            .filter(move |(_, view)| ask.selector.is_empty() || ask.eligible(view))
            .map(|(slot, view)| Pooled(slot, view))
    }

    fn insert(&mut self, node: Arc<NodeView>) {
        if let Some(i) = self.at.get(node.name.as_str()).copied() {
            self.slots[i] = Slot::of(&node);
            self.views[i] = node.clone();
            self.at.remove(node.name.as_str());
            self.at.insert(ByName(node), i);
            return;
        }
        self.at.insert(ByName(node.clone()), self.views.len());
        self.slots.push(Slot::of(&node));
        self.views.push(node);
    }

    fn remove(&mut self, name: &str) {
        let Some(i) = self.at.remove(name) else {
            return;
        };
        self.slots.swap_remove(i);
        self.views.swap_remove(i);
        if let Some(moved) = self.views.get(i) {
            self.at.insert(ByName(moved.clone()), i);
        }
    }
}

/// One Service's subset as it is kept: each zone's best-ranked nodes that
/// may enter it, best first, at most the zone's cap of them. A zone holds
/// fewer than its cap only when it has no other such node.
#[derive(Debug, Default)]
struct Held {
    /// By zone name.
    zones: Vec<(Arc<str>, Vec<Arc<NodeView>>)>,
    /// Zones that lost a node they need again: ranked anew before the
    /// next answer.
    refill: Vec<Arc<str>>,
}

impl Held {
    /// The subset of `ask` over every node of `pool`.
    fn build(pool: &Pool, ask: &Ask) -> Self {
        let nodes = pool.known(ask, None);
        let zones = subsets::best_per_zone(nodes, ask.seed, |zone| cap(ask, zone))
            .into_iter()
            .map(|(zone, best)| (zone, best.into_iter().map(|n| n.1.clone()).collect()))
            .collect();
        Self {
            zones,
            refill: Vec::new(),
        }
    }

    fn zone(&self, zone: &str) -> Option<usize> {
        self.zones.binary_search_by(|(z, _)| (**z).cmp(zone)).ok()
    }

    /// Takes in that a node changed from `old` to `new` (either absent);
    /// whether the subset changed.
    fn update(
        &mut self,
        ask: &Ask,
        old: Option<&Arc<NodeView>>,
        new: Option<&Arc<NodeView>>,
    ) -> bool {
        let mut changed = false;
        let new = new.filter(|n| ask.known(n));
        if let Some(old) = old.filter(|n| ask.known(n))
            && let Some(z) = self.zone(&old.zone)
        {
            let held = &mut self.zones[z].1;
            let ranking = subsets::ranking(ask.seed, old);
            if let Ok(at) = held.binary_search_by(|n| subsets::ranking(ask.seed, n).cmp(&ranking)) {
                // Ranked the same, in the same zone: only what its hosts
                // carry changed.
                if let Some(new) = new
                    && new.zone == old.zone
                    && subsets::ranking(ask.seed, new) == ranking
                {
                    held[at] = new.clone();
                    return true;
                }
                let full = cap(ask, &old.zone).is_some_and(|cap| held.len() >= cap);
                held.remove(at);
                if full && !self.refill.contains(&old.zone) {
                    self.refill.push(old.zone.clone());
                }
                changed = true;
            }
        }
        if let Some(new) = new
            && !self.refill.contains(&new.zone)
        {
            changed |= self.offer(ask, new);
        }
        changed
    }

    /// Offers `node` to its zone: it enters if the zone has room, or if it
    /// ranks better than the worst held, which then goes.
    fn offer(&mut self, ask: &Ask, node: &Arc<NodeView>) -> bool {
        let Some(cap) = cap(ask, &node.zone) else {
            return false;
        };
        let z = match self.zones.binary_search_by(|(z, _)| (**z).cmp(&*node.zone)) {
            Ok(z) => z,
            Err(z) => {
                self.zones.insert(z, (node.zone.clone(), Vec::new()));
                z
            }
        };
        let held = &mut self.zones[z].1;
        let ranking = subsets::ranking(ask.seed, node);
        let at = held
            .binary_search_by(|n| subsets::ranking(ask.seed, n).cmp(&ranking))
            .unwrap_or_else(|at| at);
        if held.len() < cap {
            held.insert(at, node.clone());
            true
        } else if at < held.len() {
            held.pop();
            held.insert(at, node.clone());
            true
        } else {
            false
        }
    }

    /// Ranks again the zones that lost a node they need: each of those
    /// takes its best of every node of the zone.
    fn settle(&mut self, pool: &Pool, ask: &Ask) {
        for zone in std::mem::take(&mut self.refill) {
            let nodes = pool.known(ask, Some(&zone));
            let best = subsets::best_per_zone(nodes, ask.seed, |zone| cap(ask, zone))
                .into_iter()
                .next()
                .map(|(_, best)| best.into_iter().map(|n| n.1.clone()).collect())
                .unwrap_or_default();
            if let Some(z) = self.zone(&zone) {
                self.zones[z].1 = best;
            }
        }
    }

    /// The subset within the cloud's limit on all hosts, sorted by name.
    fn chosen(&self, allowed: Allowed) -> Vec<&NodeView> {
        let ranked: Vec<Vec<&NodeView>> = self
            .zones
            .iter()
            .map(|(_, held)| held.iter().map(|n| n.as_ref()).collect())
            .collect();
        let mut out = subsets::within_total(&ranked, allowed.total);
        out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// A zone's cap for `ask`'s Service.
fn cap(ask: &Ask, zone: &str) -> Option<usize> {
    subsets::zone_cap(ask.selection, ask.allowed, zone)
}

/// What a change may do to a Service's hosts, by how they were chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Depends {
    /// On the nodes serving it: a change of one of those.
    Serving,
    /// On its subset: a change of what it holds, or a node ranking better.
    Subset,
    /// On every node: any change.
    Every,
}

/// What was last worked out for one Service.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    how: How,
    depends: Depends,
    digest: u64,
}

/// What is kept of one Service.
struct Kept {
    ask: Ask,
    /// The nodes serving it as last asked (a Local Service's), sorted.
    serving: Option<Vec<Box<str>>>,
    /// Its subset, while it uses it.
    held: Option<Held>,
    /// `None` once a change may have moved its hosts.
    outcome: Option<Outcome>,
}

impl Kept {
    fn serves_on(&self, name: &str) -> bool {
        self.serving
            .as_ref()
            .is_some_and(|s| s.binary_search_by(|n| (**n).cmp(name)).is_ok())
    }

    fn same_serving(&self, serving: Option<&BTreeSet<&str>>) -> bool {
        match (&self.serving, serving) {
            (None, None) => true,
            (Some(kept), Some(now)) => kept.iter().map(|n| &**n).eq(now.iter().copied()),
            _ => false,
        }
    }
}

/// Which nodes back each load balancer, kept as nodes change (see the
/// module's docs).
#[derive(Default)]
pub struct Membership {
    pool: Pool,
    services: HashMap<Key, Kept>,
    /// Every node as one host list, built at most once between changes:
    /// with subsets few load balancers take them all.
    all: Option<Hosts>,
}

impl Membership {
    /// The membership of `nodes` (those that do not back load balancers
    /// are left out), with no Service kept yet.
    pub fn new(nodes: impl IntoIterator<Item = Arc<NodeView>>) -> Self {
        let mut out = Self::default();
        for node in nodes.into_iter().filter(|n| n.backs) {
            out.pool.insert(node);
        }
        out
    }

    /// How many nodes back load balancers.
    pub fn len(&self) -> usize {
        self.pool.len()
    }

    /// Whether none does.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every node that backs load balancers.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeView> {
        self.pool.iter()
    }

    /// Takes in that the node `name` is now `now` (`None`: gone). A
    /// change to the view already kept, or between two views that do not
    /// back load balancers, costs nothing.
    pub fn update(&mut self, name: &str, now: Option<Arc<NodeView>>) {
        let now = now.filter(|n| n.backs);
        let old = self.pool.get(name).cloned();
        match (&old, &now) {
            (None, None) => return,
            (Some(old), Some(now)) if Arc::ptr_eq(old, now) => return,
            _ => {}
        }
        match &now {
            Some(now) => self.pool.insert(now.clone()),
            None => self.pool.remove(name),
        }
        self.all = None;
        for kept in self.services.values_mut() {
            let mut moved = kept.serves_on(name);
            if let Some(outcome) = &kept.outcome
                && outcome.depends == Depends::Every
            {
                moved = true;
            }
            if let Some(held) = &mut kept.held {
                moved |= held.update(&kept.ask, old.as_ref(), now.as_ref());
            }
            if moved {
                kept.outcome = None;
            }
        }
    }

    /// Forgets the Service `key`.
    pub fn forget(&mut self, key: &Key) {
        self.services.remove(key);
    }

    /// Keeps only the Services `keep` names.
    pub fn retain(&mut self, keep: impl Fn(&Key) -> bool) {
        self.services.retain(|key, _| keep(key));
    }

    /// The digest of the hosts of `key`'s load balancer, which `ask` and
    /// the nodes `serving` it (a Local Service's) choose: what a host pass
    /// compares with what was sent. Kept from the last question unless a
    /// change may have moved them.
    pub fn digest(&mut self, key: &Key, ask: &Ask, serving: Option<&BTreeSet<&str>>) -> u64 {
        self.outcome(key, ask, serving).digest
    }

    /// The hosts of `key`'s load balancer (see [`Self::digest`]), and how
    /// they were chosen.
    pub fn hosts(
        &mut self,
        key: &Key,
        ask: &Ask,
        serving: Option<&BTreeSet<&str>>,
    ) -> (Hosts, How) {
        let outcome = self.outcome(key, ask, serving);
        let kept = &self.services[key];
        let (chosen, _, _) = choose(&self.pool, kept, serving);
        if ask.label_keys.is_empty() && chosen.len() == self.pool.len() {
            let all = self.all.get_or_insert_with(|| {
                Hosts::of(plan::hosts(self.pool.iter(), &Default::default()))
            });
            return (all.clone(), outcome.how);
        }
        (Hosts::of(plan::hosts(chosen, &ask.label_keys)), outcome.how)
    }

    /// `key`'s outcome, worked out again where needed.
    fn outcome(&mut self, key: &Key, ask: &Ask, serving: Option<&BTreeSet<&str>>) -> Outcome {
        let kept = match self.services.get_mut(key) {
            Some(kept) if kept.ask == *ask => kept,
            _ => {
                let kept = Kept {
                    ask: ask.clone(),
                    serving: None,
                    held: None,
                    outcome: None,
                };
                self.services.insert(key.clone(), kept);
                self.services.get_mut(key).expect("just inserted")
            }
        };
        if !kept.same_serving(serving) {
            kept.serving = serving.map(|s| s.iter().map(|n| (*n).into()).collect());
            kept.outcome = None;
        }
        if let Some(outcome) = kept.outcome {
            return outcome;
        }
        // A Service on the nodes serving it keeps no subset; one that
        // uses its subset builds it once and keeps it from then on.
        if on_serving(&self.pool, &kept.ask, serving).is_some() {
            kept.held = None;
        } else if let Selection::Subset(_) = kept.ask.selection {
            let held = kept
                .held
                .get_or_insert_with(|| Held::build(&self.pool, &kept.ask));
            held.settle(&self.pool, &kept.ask);
        }
        let (chosen, how, depends) = choose(&self.pool, kept, serving);
        let hosts = plan::hosts(chosen, &kept.ask.label_keys);
        let outcome = Outcome {
            how,
            depends,
            digest: plan::hosts_digest(&hosts, false),
        };
        kept.outcome = Some(outcome);
        outcome
    }
}

/// The eligible nodes among those `serving` a Local Service, within the
/// cloud's limits; `None` when there are none.
fn on_serving<'a>(
    pool: &'a Pool,
    ask: &Ask,
    serving: Option<&BTreeSet<&str>>,
) -> Option<Vec<&'a NodeView>> {
    let on = serving?
        .iter()
        .filter_map(|name| pool.get(name))
        .map(|n| n.as_ref())
        .filter(|n| ask.eligible(n));
    let chosen = subsets::choose(on, ask.seed, Selection::All, ask.allowed);
    (!chosen.is_empty()).then_some(chosen)
}

/// The nodes of `pool` that back `kept`'s load balancer, how they were
/// chosen, and what a change of nodes may move them by: exactly
/// [`subsets::choose_serving`]'s choice, from its subset where it keeps
/// one.
fn choose<'a>(
    pool: &'a Pool,
    kept: &'a Kept,
    serving: Option<&BTreeSet<&str>>,
) -> (Vec<&'a NodeView>, How, Depends) {
    let ask = &kept.ask;
    if let Some(chosen) = on_serving(pool, ask, serving) {
        let how = How::Local {
            serving: serving.map_or(0, BTreeSet::len),
        };
        return (chosen, how, Depends::Serving);
    }
    let how = match serving {
        Some(_) => How::NoneServingEligible,
        None => How::Selection(ask.selection),
    };
    let eligible = || pool.iter().filter(|n| ask.eligible(n));
    if let Selection::Subset(_) = ask.selection {
        let chosen = match &kept.held {
            Some(held) => held.chosen(ask.allowed),
            None => subsets::choose(
                eligible().filter(|n| !n.initialising),
                ask.seed,
                ask.selection,
                ask.allowed,
            ),
        };
        if !chosen.is_empty() {
            return (chosen, how, Depends::Subset);
        }
    }
    let chosen = subsets::choose(eligible(), ask.seed, ask.selection, ask.allowed);
    (chosen, how, Depends::Every)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_runtime::view::Interner;
    use kube_test_apiserver::fixtures::node;
    use std::collections::BTreeMap;

    /// SplitMix64: the same sequences in every run.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn one_in(&mut self, n: usize) -> bool {
            self.below(n) == 0
        }
    }

    const ZONES: [&str; 4] = ["a", "b", "c", ""];

    /// A node of random zone, pool label, readiness and state.
    fn random_node(random: &mut Random, strings: &Interner, name: &str) -> NodeView {
        let pool = if random.one_in(3) { "gpu" } else { "general" };
        let mut view = NodeView::of(
            &node(name)
                .provider_id(&format!("sim://{name}"))
                .label("pool", pool)
                .address(
                    "InternalIP",
                    &format!("10.0.{}.{}", random.below(256), random.below(256)),
                )
                .build(),
            strings,
            true,
        );
        view.zone = strings.intern(ZONES[random.below(ZONES.len())]);
        view.backs = !random.one_in(6);
        view.draining = random.one_in(5);
        view.initialising = random.one_in(8);
        view
    }

    /// A Service's question, of random selection, selector and limits.
    fn random_ask(random: &mut Random) -> Ask {
        let seed = random.next();
        let selection = if random.one_in(5) {
            Selection::All
        } else {
            Selection::Subset(1 + random.below(4) as u32)
        };
        let (selector, label_keys) = if random.one_in(4) {
            let value = ["gpu", "general"][random.below(2)];
            (
                vec![("pool".to_owned(), Some(value.to_owned()))],
                BTreeSet::from(["pool".to_owned()]),
            )
        } else {
            (Vec::new(), BTreeSet::new())
        };
        let limit = |random: &mut Random| (!random.one_in(2)).then(|| 1 + random.below(6) as u32);
        Ask {
            seed,
            selection,
            selector,
            label_keys,
            allowed: Allowed {
                per_zone: limit(random),
                total: limit(random),
            },
        }
    }

    /// What the full pass chooses: [`subsets::choose_serving`] over every
    /// node, as the controller asked it before the membership was kept.
    fn full(
        nodes: &BTreeMap<String, Arc<NodeView>>,
        ask: &Ask,
        serving: Option<&BTreeSet<&str>>,
    ) -> (Vec<String>, bool) {
        let (chosen, on_serving) = subsets::choose_serving(
            || {
                nodes
                    .values()
                    .map(|n| n.as_ref())
                    .filter(|n| n.backs && n.selected_by(&ask.selector))
            },
            |name| {
                nodes
                    .get(name)
                    .map(|n| n.as_ref())
                    .filter(|n| n.backs && n.selected_by(&ask.selector))
            },
            ask.seed,
            ask.selection,
            ask.allowed,
            serving,
        );
        (chosen.iter().map(|n| n.name.clone()).collect(), on_serving)
    }

    /// Compares every Service's hosts with the full pass's.
    fn check(
        membership: &mut Membership,
        nodes: &BTreeMap<String, Arc<NodeView>>,
        services: &[(Key, Ask, Option<BTreeSet<String>>)],
        step: &str,
    ) {
        for (key, ask, serving) in services {
            let serving: Option<BTreeSet<&str>> = serving
                .as_ref()
                .map(|s| s.iter().map(String::as_str).collect());
            let (want, on_serving) = full(nodes, ask, serving.as_ref());
            let digest = membership.digest(key, ask, serving.as_ref());
            let (hosts, how) = membership.hosts(key, ask, serving.as_ref());
            let got: Vec<String> = hosts.list.iter().map(|h| h.name.clone()).collect();
            assert_eq!(got, want, "{step}: {key:?} {ask:?} serving {serving:?}");
            assert_eq!(digest, hosts.digest, "{step}: {key:?}");
            let chosen: Vec<&NodeView> = want.iter().map(|n| nodes[n].as_ref()).collect();
            let expected = Hosts::of(plan::hosts(chosen, &ask.label_keys));
            assert_eq!(hosts.full_digest, expected.full_digest, "{step}: {key:?}");
            let expected_how = match &serving {
                Some(s) if on_serving => How::Local { serving: s.len() },
                Some(_) => How::NoneServingEligible,
                None => How::Selection(ask.selection),
            };
            assert_eq!(how, expected_how, "{step}: {key:?}");
        }
    }

    #[test]
    fn kept_membership_chooses_exactly_what_the_full_pass_chooses_through_random_changes() {
        for run in 0..24u64 {
            let mut random = Random(run);
            let strings = Interner::default();
            let mut nodes: BTreeMap<String, Arc<NodeView>> = BTreeMap::new();
            let mut next = 0;
            for _ in 0..random.below(40) {
                let name = format!("node-{next}");
                next += 1;
                nodes.insert(
                    name.clone(),
                    Arc::new(random_node(&mut random, &strings, &name)),
                );
            }
            let mut membership = Membership::new(nodes.values().cloned());
            let mut services: Vec<(Key, Ask, Option<BTreeSet<String>>)> = (0..12)
                .map(|i| {
                    let ask = random_ask(&mut random);
                    (("default".into(), format!("svc-{i}")), ask, None)
                })
                .collect();
            for step in 0..150 {
                // A batch of changes, then every Service asked, as after a
                // host pass's debounce.
                for _ in 0..1 + random.below(3) {
                    let names: Vec<String> = nodes.keys().cloned().collect();
                    let pick = |random: &mut Random| names[random.below(names.len())].clone();
                    match random.below(9) {
                        // A node joins.
                        0 | 1 => {
                            let name = format!("node-{next}");
                            next += 1;
                            let view = Arc::new(random_node(&mut random, &strings, &name));
                            nodes.insert(name.clone(), view.clone());
                            membership.update(&name, Some(view));
                        }
                        // A node leaves.
                        2 if !names.is_empty() => {
                            let name = pick(&mut random);
                            nodes.remove(&name);
                            membership.update(&name, None);
                        }
                        // Readiness, draining, initialisation, zone,
                        // labels or addresses change.
                        3..=7 if !names.is_empty() => {
                            let name = pick(&mut random);
                            let mut view = (*nodes[&name]).clone();
                            match random.below(6) {
                                0 => view.backs = !view.backs,
                                1 => view.draining = !view.draining,
                                2 => view.initialising = !view.initialising,
                                3 => view.zone = strings.intern(ZONES[random.below(ZONES.len())]),
                                4 => {
                                    let other = random_node(&mut random, &strings, &name);
                                    view.labels = other.labels;
                                }
                                _ => view.provider_id = format!("sim://{}", random.next()),
                            }
                            let view = Arc::new(view);
                            nodes.insert(name.clone(), view.clone());
                            membership.update(&name, Some(view));
                        }
                        // A Service's serving nodes, or what it asks,
                        // change.
                        _ => {
                            let i = random.below(services.len());
                            if random.one_in(3) {
                                services[i].1 = random_ask(&mut random);
                            } else if matches!(services[i].1.selection, Selection::Subset(_)) {
                                services[i].2 = (!random.one_in(3)).then(|| {
                                    (0..random.below(4))
                                        .map(|_| format!("node-{}", random.below(next.max(1) + 2)))
                                        .collect()
                                });
                            }
                        }
                    }
                }
                check(
                    &mut membership,
                    &nodes,
                    &services,
                    &format!("run {run} step {step}"),
                );
            }
        }
    }

    #[test]
    fn a_node_joining_costs_a_comparison_per_service_and_touches_no_local_service() {
        let strings = Interner::default();
        let view = |name: &str, zone: &str| {
            let mut v = NodeView::of(&node(name).build(), &strings, false);
            v.zone = strings.intern(zone);
            Arc::new(v)
        };
        let mut membership =
            Membership::new((0..300).map(|i| view(&format!("node-{i}"), ZONES[i % 3])));
        let subset = Ask {
            seed: 7,
            selection: Selection::Subset(2),
            selector: Vec::new(),
            label_keys: BTreeSet::new(),
            allowed: Allowed::default(),
        };
        let cluster: Key = ("default".into(), "cluster".into());
        let local: Key = ("default".into(), "local".into());
        let serving = BTreeSet::from(["node-1", "node-2"]);
        membership.digest(&cluster, &subset, None);
        membership.digest(&local, &subset, Some(&serving));
        assert!(
            membership.services[&local].held.is_none(),
            "no subset kept for it"
        );
        let mut entered = 0;
        for i in 300..600 {
            membership.update(&format!("node-{i}"), Some(view(&format!("node-{i}"), "a")));
            assert!(
                membership.services[&local].outcome.is_some(),
                "a Local Service's hosts are left as they are"
            );
            if membership.services[&cluster].outcome.is_none() {
                entered += 1;
                membership.digest(&cluster, &subset, None);
            }
        }
        // A subset of 2 of a zone growing from 100 to 400 nodes: each new
        // node enters with odds of 2 in its rank, about 2 × ln 4 ≈ 3 times.
        assert!(
            (1..20).contains(&entered),
            "{entered} of 300 joins moved it"
        );
        // A node serving the Local Service leaving moves it.
        membership.update("node-1", None);
        assert!(membership.services[&local].outcome.is_none());
    }
}
