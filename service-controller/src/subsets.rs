//! Which eligible nodes back one Service's load balancer, pure. Each zone
//! gives the Service its own stable subset: every node is ranked by a
//! digest of the Service's UID and the node's name (rendezvous hashing), and
//! the best-ranked are taken, so different Services land on different
//! nodes, and a node joining or leaving changes only the Services whose
//! subset it enters or held. Draining (cordoned) nodes rank last, so they
//! leave subsets before they go. Nothing is ever taken past the cloud's
//! limits: per zone, and in all (then zone by zone, best-ranked first, so
//! the zones stay even).

use std::collections::{BTreeSet, BinaryHeap};
use std::sync::Arc;

use ccm_runtime::host_limits::Allowed;
use ccm_runtime::names;
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use crate::plan::{Fnv, NodeView};

/// How a Service's nodes are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// At most this many nodes per zone.
    Subset(u32),
    /// Every eligible node (upstream's choice), within the limits.
    All,
}

/// The most nodes per zone a subset may be asked to hold.
pub const MAX_SUBSET_SIZE: u32 = 10_000;

/// The Service's selection: its annotations', else `default_size` per
/// zone (0: every node). An invalid annotation is the problem, naming it
/// and what it accepts.
pub fn selection(svc: &Service, default_size: u32) -> Result<Selection, String> {
    let annotations = svc.annotations();
    let size = match annotations.get(names::ANNOTATION_LB_SUBSET_SIZE) {
        None => default_size,
        Some(value) => match value.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_SUBSET_SIZE).contains(&n) => n,
            _ => {
                return Err(format!(
                    "annotation {}: {} is not a number of nodes per zone from 1 to {MAX_SUBSET_SIZE}",
                    names::ANNOTATION_LB_SUBSET_SIZE,
                    ccm_runtime::config_checks::quote(value)
                ));
            }
        },
    };
    match annotations
        .get(names::ANNOTATION_LB_BACKENDS)
        .map(|v| v.trim())
    {
        None | Some("subset") if size > 0 => Ok(Selection::Subset(size)),
        None | Some("subset") | Some("all") => Ok(Selection::All),
        Some(other) => Err(format!(
            "annotation {}: {} is not one of subset, all",
            names::ANNOTATION_LB_BACKENDS,
            ccm_runtime::config_checks::quote(other)
        )),
    }
}

/// The Service's half of the ranking: a digest of its UID.
pub fn seed(svc: &Service) -> u64 {
    let mut h = Fnv::default();
    h.str(svc.metadata.uid.as_deref().unwrap_or_default());
    h.finish()
}

/// A node's place in a Service's ranking (lower is better): draining
/// last, then a mix of both digests, so that one Service's order tells
/// nothing of another's.
pub(crate) type Score = (bool, u64);

pub(crate) fn score(seed: u64, node: &NodeView) -> Score {
    score_of(seed, node.rank, node.draining)
}

/// [`score`] of a node of digest `rank`, draining or not.
pub(crate) fn score_of(seed: u64, rank: u64, draining: bool) -> Score {
    // SplitMix64's finalizer over the two.
    let mut z = seed ^ rank.rotate_left(32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (draining, z ^ (z >> 31))
}

/// How `node` compares in a Service's ranking: its score, then its name,
/// so the order is total.
pub(crate) fn ranking(seed: u64, node: &NodeView) -> (Score, &str) {
    (score(seed, node), &node.name)
}

/// A node, however it is held: what a ranking reads of it. A holder that
/// keeps these beside each other, not behind each node's pointer, makes a
/// pass over 100,000 nodes read a few MiB in order instead of missing the
/// cache at every node.
pub(crate) trait AsNode {
    fn node(&self) -> &NodeView;

    fn zone(&self) -> &Arc<str> {
        &self.node().zone
    }

    fn score(&self, seed: u64) -> Score {
        score(seed, self.node())
    }
}

impl AsNode for &NodeView {
    fn node(&self) -> &NodeView {
        self
    }
}

impl AsNode for &Arc<NodeView> {
    fn node(&self) -> &NodeView {
        self
    }
}

/// A node in a Service's ranking, ordered by [`ranking`].
struct Ranked<N>(Score, N);

impl<N: AsNode> Ord for Ranked<N> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0, &self.1.node().name).cmp(&(other.0, &other.1.node().name))
    }
}

impl<N: AsNode> PartialOrd for Ranked<N> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<N: AsNode> PartialEq for Ranked<N> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl<N: AsNode> Eq for Ranked<N> {}

/// The most nodes of `zone` a load balancer takes with `selection`
/// within `allowed` (`None`: no limit): the zone's own limit and the
/// subset's, the smaller. A node of no known zone is in a zone of its
/// own, which the cloud's zone limit does not bind.
pub(crate) fn zone_cap(selection: Selection, allowed: Allowed, zone: &str) -> Option<usize> {
    let per_zone = match selection {
        Selection::Subset(n) => Some(n),
        Selection::All => None,
    };
    let limit = if zone.is_empty() {
        None
    } else {
        allowed.per_zone
    };
    match (per_zone, limit) {
        (Some(a), Some(b)) => Some(a.min(b) as usize),
        (a, b) => a.or(b).map(|n| n as usize),
    }
}

/// A zone's name, its cap, and its best so far, the worst on top.
type Zone<N> = (Arc<str>, Option<usize>, BinaryHeap<Ranked<N>>);

/// Each zone's best-ranked nodes of `eligible` (at most `cap` of the
/// zone), by zone name, each zone's best first.
pub(crate) fn best_per_zone<N: AsNode>(
    eligible: impl IntoIterator<Item = N>,
    seed: u64,
    cap: impl Fn(&str) -> Option<usize>,
) -> Vec<(Arc<str>, Vec<N>)> {
    // Each zone's best `cap`, kept as they come: a Service's pass over
    // 100,000 nodes holds only its subset, never a copy of them all, and a
    // node ranked below a full subset's worst costs one comparison. Zones
    // are few and their names shared, so a short list found by pointer.
    let mut zones: Vec<Zone<N>> = Vec::new();
    for node in eligible {
        let zone = node.zone();
        let zone = match zones
            .iter()
            .position(|(z, ..)| Arc::ptr_eq(z, zone) || z == zone)
        {
            Some(i) => &mut zones[i],
            None => {
                zones.push((zone.clone(), cap(zone), BinaryHeap::new()));
                zones.last_mut().expect("just pushed")
            }
        };
        let (_, cap, best) = zone;
        let ranked = Ranked(node.score(seed), node);
        match cap {
            Some(cap) if best.len() >= *cap => {
                // The worst goes, if this one ranks better.
                if let Some(mut worst) = best.peek_mut()
                    && ranked < *worst
                {
                    *worst = ranked;
                }
            }
            _ => best.push(ranked),
        }
    }
    zones.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    zones
        .into_iter()
        .map(|(zone, _, best)| {
            let best = best.into_sorted_vec().into_iter().map(|r| r.1).collect();
            (zone, best)
        })
        .collect()
}

/// The nodes of `ranked` (each zone's, best first, the zones by name)
/// within `total`: zone by zone, each zone's best first, until the limit.
pub(crate) fn within_total<N: Copy>(ranked: &[Vec<N>], total: Option<u32>) -> Vec<N> {
    let count: usize = ranked.iter().map(Vec::len).sum();
    match total.map(|n| n as usize) {
        Some(most) if count > most => {
            let mut out = Vec::with_capacity(most);
            let mut rank = 0;
            while out.len() < most {
                for zone in ranked {
                    if let Some(node) = zone.get(rank)
                        && out.len() < most
                    {
                        out.push(*node);
                    }
                }
                rank += 1;
            }
            out
        }
        _ => ranked.iter().flatten().copied().collect(),
    }
}

/// The nodes of `eligible` that back a Service ranked by `seed`, with
/// `selection` and within `allowed`, sorted by name.
pub fn choose<'a>(
    eligible: impl IntoIterator<Item = &'a NodeView>,
    seed: u64,
    selection: Selection,
    allowed: Allowed,
) -> Vec<&'a NodeView> {
    let ranked: Vec<Vec<&NodeView>> =
        best_per_zone(eligible, seed, |zone| zone_cap(selection, allowed, zone))
            .into_iter()
            .map(|(_, best)| best)
            .collect();
    let mut out = within_total(&ranked, allowed.total);
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Where the node named `name` is, or would go, in `nodes` sorted by name.
pub fn position<N: std::borrow::Borrow<NodeView>>(nodes: &[N], name: &str) -> Result<usize, usize> {
    nodes.binary_search_by(|n| n.borrow().name.as_str().cmp(name))
}

/// The nodes of `eligible` that back a Service ranked by `seed`: with
/// `serving` (the nodes that serve a Local Service, each found with
/// `eligible_named`, which is `None` for one not eligible), every eligible
/// one of them within `allowed`; without, or when none of them is
/// eligible, its `selection`. `true` with the nodes when they are the
/// serving ones. A subset leaves out nodes still being initialised, unless
/// there is no other: without its zone yet, such a node would sit alone in
/// a zone of its own, enter every subset, and leave them all a moment
/// later, once its zone is known.
pub fn choose_serving<'a, I>(
    eligible: impl Fn() -> I,
    eligible_named: impl Fn(&str) -> Option<&'a NodeView>,
    seed: u64,
    selection: Selection,
    allowed: Allowed,
    serving: Option<&BTreeSet<&str>>,
) -> (Vec<&'a NodeView>, bool)
where
    I: Iterator<Item = &'a NodeView>,
{
    if let Some(serving) = serving {
        // A Service's pods are few: found by name, not by a pass over
        // every node.
        let on = serving.iter().filter_map(|name| eligible_named(name));
        let chosen = choose(on, seed, Selection::All, allowed);
        if !chosen.is_empty() {
            return (chosen, true);
        }
    }
    if let Selection::Subset(_) = selection {
        let known = choose(
            eligible().filter(|n| !n.initialising),
            seed,
            selection,
            allowed,
        );
        if !known.is_empty() {
            return (known, false);
        }
    }
    (choose(eligible(), seed, selection, allowed), false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_runtime::view::Interner;
    use kube_test_apiserver::fixtures::{load_balancer, node};
    use std::collections::BTreeMap;

    fn views(zones: &[(&str, usize)], strings: &Interner) -> Vec<NodeView> {
        let mut out = Vec::new();
        for (zone, n) in zones {
            for i in 0..*n {
                let node = node(&format!("{zone}-node-{i}"))
                    .label(names::LABEL_ZONE, zone)
                    .build();
                out.push(NodeView::of(&node, strings, false));
            }
        }
        out
    }

    fn names(chosen: &[&NodeView]) -> Vec<String> {
        chosen.iter().map(|n| n.name.clone()).collect()
    }

    fn per_zone(chosen: &[&NodeView]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for n in chosen {
            *out.entry(n.zone.to_string()).or_default() += 1;
        }
        out
    }

    const NONE: Allowed = Allowed {
        per_zone: None,
        total: None,
    };

    #[test]
    fn each_zone_gives_its_subset_and_services_spread_over_the_nodes() {
        let strings = Interner::default();
        let nodes = views(&[("a", 100), ("b", 100), ("c", 2)], &strings);
        let mut used = std::collections::BTreeSet::new();
        for uid in 0..20 {
            let chosen = choose(&nodes, uid, Selection::Subset(5), NONE);
            assert_eq!(
                per_zone(&chosen),
                BTreeMap::from([("a".into(), 5), ("b".into(), 5), ("c".into(), 2)])
            );
            used.extend(names(&chosen));
        }
        // 20 Services of 10 in the two large zones: most of their 200 nodes serve.
        assert!(used.len() > 120, "{}", used.len());
    }

    #[test]
    fn a_node_joining_or_leaving_moves_only_the_subsets_it_enters_or_held() {
        let strings = Interner::default();
        let before = views(&[("a", 50), ("b", 50)], &strings);
        let mut after = before.clone();
        let joined = views(&[("a", 51)], &strings).pop().unwrap();
        after.push(joined.clone());
        let gone = after.remove(7);
        let (mut changed, mut explained) = (0, 0);
        for uid in 0..200 {
            let old = names(&choose(&before, uid, Selection::Subset(3), NONE));
            let new = names(&choose(&after, uid, Selection::Subset(3), NONE));
            if old != new {
                changed += 1;
                let entered = new.contains(&joined.name);
                let held = old.contains(&gone.name);
                assert!(entered || held, "{old:?} -> {new:?}");
                // One node in, one out, at most: never a reshuffle.
                let moved = new.iter().filter(|n| !old.contains(n)).count();
                assert!(moved <= 2, "{old:?} -> {new:?}");
                explained += 1;
            }
        }
        assert_eq!(changed, explained);
        // About 3/50 of Services held the node that went, and as many take the new one.
        assert!(changed < 40, "{changed} of 200 Services changed");
    }

    #[test]
    fn the_clouds_limits_bind_per_zone_and_in_all_evenly() {
        let strings = Interner::default();
        let nodes = views(&[("a", 10), ("b", 10), ("c", 10), ("", 4)], &strings);
        let allowed = Allowed {
            per_zone: Some(3),
            total: None,
        };
        let chosen = choose(&nodes, 1, Selection::All, allowed);
        assert_eq!(
            per_zone(&chosen),
            BTreeMap::from([
                ("".into(), 4),
                ("a".into(), 3),
                ("b".into(), 3),
                ("c".into(), 3)
            ]),
            "nodes of no zone are not bound by the zone limit"
        );
        let allowed = Allowed {
            per_zone: Some(3),
            total: Some(7),
        };
        let chosen = choose(&nodes[..30], 1, Selection::Subset(5), allowed);
        assert_eq!(chosen.len(), 7);
        assert!(per_zone(&chosen).values().all(|n| (2..=3).contains(n)));
    }

    #[test]
    fn draining_nodes_are_the_last_a_subset_takes() {
        let strings = Interner::default();
        let mut nodes = views(&[("a", 6)], &strings);
        let first = names(&choose(&nodes, 9, Selection::Subset(2), NONE));
        for n in nodes.iter_mut().filter(|n| first.contains(&n.name)) {
            n.draining = true;
        }
        let next = names(&choose(&nodes, 9, Selection::Subset(2), NONE));
        assert!(
            next.iter().all(|n| !first.contains(n)),
            "{first:?} {next:?}"
        );
        // With no other node, they still serve.
        let all_draining: Vec<NodeView> = nodes
            .iter()
            .cloned()
            .map(|mut n| {
                n.draining = true;
                n
            })
            .collect();
        assert_eq!(
            choose(&all_draining, 9, Selection::Subset(2), NONE).len(),
            2
        );
    }

    #[test]
    fn a_node_still_being_initialised_enters_no_subset_unless_it_is_the_only_one() {
        let strings = Interner::default();
        let mut nodes = views(&[("a", 10)], &strings);
        let new = node("joining").uninitialized().build();
        let new = NodeView::of(&new, &strings, false);
        assert!(new.initialising);
        nodes.push(new.clone());
        for uid in 0..50 {
            let (chosen, _) = choose_serving(
                || nodes.iter(),
                |_| None,
                uid,
                Selection::Subset(3),
                NONE,
                None,
            );
            assert_eq!(per_zone(&chosen), BTreeMap::from([("a".into(), 3)]));
            // Every node, as upstream: it too.
            let (all, _) =
                choose_serving(|| nodes.iter(), |_| None, uid, Selection::All, NONE, None);
            assert_eq!(all.len(), 11);
        }
        let alone = [new];
        let (chosen, _) = choose_serving(
            || alone.iter(),
            |_| None,
            1,
            Selection::Subset(3),
            NONE,
            None,
        );
        assert_eq!(chosen.len(), 1, "never no target");
    }

    #[test]
    fn annotations_choose_all_or_the_size_and_bad_values_are_named() {
        let svc = |pairs: &[(&str, &str)]| {
            let mut b = load_balancer("d", "web");
            for (k, v) in pairs {
                b = b.annotation(k, v);
            }
            b.build()
        };
        assert_eq!(selection(&svc(&[]), 25), Ok(Selection::Subset(25)));
        assert_eq!(selection(&svc(&[]), 0), Ok(Selection::All));
        assert_eq!(
            selection(&svc(&[(names::ANNOTATION_LB_BACKENDS, "all")]), 25),
            Ok(Selection::All)
        );
        assert_eq!(
            selection(&svc(&[(names::ANNOTATION_LB_SUBSET_SIZE, "3")]), 25),
            Ok(Selection::Subset(3))
        );
        let err = selection(&svc(&[(names::ANNOTATION_LB_SUBSET_SIZE, "0")]), 25).unwrap_err();
        assert!(err.contains(names::ANNOTATION_LB_SUBSET_SIZE), "{err}");
        let err = selection(&svc(&[(names::ANNOTATION_LB_BACKENDS, "some")]), 25).unwrap_err();
        assert!(err.contains("subset, all"), "{err}");
    }
}
