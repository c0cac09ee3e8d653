//! Which nodes serve each Service with `externalTrafficPolicy: Local`.
//! Such a load balancer's traffic reaches only nodes with an endpoint of
//! the Service, so only those back it (upstream registers every node and
//! lets the health check weed them out, which costs a target per node).
//!
//! The service controller keeps, of every EndpointSlice, only its
//! Service, and of a Local load balancer's slices the nodes where one of
//! their endpoints serves (most slices are of other Services, and a
//! cluster may have tens of thousands). A Service that becomes a Local
//! load balancer has its slices read once ([`Serving::begin_relist`]).
//!
//! A node that loses its last serving endpoint keeps its place for a grace
//! period: a rolling update of the Service's pods moves endpoints from node
//! to node, and the nodes it empties usually gain a new pod soon, so the
//! targets do not flap.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_runtime::view::Interner;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

/// A Service's key, `(namespace, name)`, as the controller's queue has it.
type Key = (String, String);

/// The label the endpoint slice controller puts on each slice: the name
/// of its Service (in the slice's namespace).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// What the controller keeps of one EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceView {
    /// Its own name.
    pub name: String,
    /// Its Service.
    pub service: Key,
    /// The nodes where one of its endpoints serves, sorted, once each;
    /// `None` when its Service was no Local load balancer as it was seen.
    pub nodes: Option<Vec<Arc<str>>>,
}

impl SliceView {
    /// The view of `slice`, with its nodes if `follow`; `strings` shares
    /// node names between slices.
    pub fn of(slice: &EndpointSlice, strings: &Interner, follow: bool) -> Self {
        Self {
            name: slice.name_any(),
            service: service_of(slice),
            nodes: follow.then(|| serving_nodes(slice, strings)),
        }
    }
}

/// The Service `slice` is of, by its label.
pub fn service_of(slice: &EndpointSlice) -> Key {
    (
        slice.namespace().unwrap_or_default(),
        slice
            .labels()
            .get(LABEL_SERVICE_NAME)
            .cloned()
            .unwrap_or_default(),
    )
}

/// The nodes where one of `slice`'s endpoints serves, sorted, once each.
pub fn serving_nodes(slice: &EndpointSlice, strings: &Interner) -> Vec<Arc<str>> {
    let mut nodes: Vec<Arc<str>> = slice
        .endpoints
        .iter()
        .filter(|e| serves(e))
        .filter_map(|e| e.node_name.as_deref())
        .map(|n| strings.intern(n))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

/// Whether an endpoint takes traffic: serving (a terminating pod may still
/// serve, and kube-proxy sends to it when no ready one is left), else
/// ready; a condition left unset means it does.
fn serves(e: &k8s_openapi::api::discovery::v1::Endpoint) -> bool {
    let c = e.conditions.as_ref();
    c.and_then(|c| c.serving.or(c.ready)).unwrap_or(true)
}

/// The nodes serving each Service, with those that stopped serving within
/// the grace period.
#[derive(Debug, Default)]
pub struct Serving {
    services: HashMap<Key, Nodes>,
    /// The Services whose slices are being read, with the slices the watch
    /// has told of since: the watch's word on those is the newer.
    relisting: HashMap<Key, HashSet<String>>,
}

#[derive(Debug, Default)]
struct Nodes {
    /// Each slice's serving nodes, by slice name.
    slices: HashMap<String, Vec<Arc<str>>>,
    /// The nodes that stopped serving, and when.
    left: HashMap<Arc<str>, Instant>,
}

impl Nodes {
    fn serving(&self) -> BTreeSet<Arc<str>> {
        self.slices.values().flatten().cloned().collect()
    }
}

/// What a slice's change did to its Service's nodes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Whether the nodes serving it changed.
    pub changed: bool,
    /// Whether a node stopped serving (and leaves once its grace is out).
    pub left: bool,
}

impl Serving {
    /// Notes that slice `name` of `service` now has `nodes` serving
    /// (`None`: the slice is gone).
    pub fn apply(
        &mut self,
        service: &Key,
        name: &str,
        nodes: Option<&[Arc<str>]>,
        now: Instant,
    ) -> Change {
        if let Some(seen) = self.relisting.get_mut(service) {
            seen.insert(name.to_owned());
        }
        let entry = self.services.entry(service.clone()).or_default();
        let before = entry.serving();
        match nodes {
            Some(nodes) => entry.slices.insert(name.to_owned(), nodes.to_vec()),
            None => entry.slices.remove(name),
        };
        let after = entry.serving();
        let mut left = false;
        for gone in before.difference(&after) {
            entry.left.insert(gone.clone(), now);
            left = true;
        }
        for node in &after {
            entry.left.remove(node);
        }
        if entry.slices.is_empty() && entry.left.is_empty() {
            self.services.remove(service);
        }
        Change {
            changed: before != after,
            left,
        }
    }

    /// Notes that `service` became a Local load balancer and its slices
    /// are being read: call before the read is sent.
    pub fn begin_relist(&mut self, service: &Key) {
        self.relisting.insert(service.clone(), HashSet::new());
    }

    /// Takes in `service`'s slices as read (`None`: the read failed), but
    /// for those the watch told of since [`Self::begin_relist`], whose
    /// word is the newer (a slice changed or deleted meanwhile).
    pub fn end_relist(
        &mut self,
        service: &Key,
        read: Option<Vec<(String, Vec<Arc<str>>)>>,
        now: Instant,
    ) -> Change {
        let Some(seen) = self.relisting.remove(service) else {
            return Change::default();
        };
        let mut change = Change::default();
        for (name, nodes) in read.into_iter().flatten() {
            if !seen.contains(&name) {
                let c = self.apply(service, &name, Some(&nodes), now);
                change.changed |= c.changed;
                change.left |= c.left;
            }
        }
        change
    }

    /// Forgets `service`: it is no Local load balancer any more.
    pub fn forget(&mut self, service: &Key) {
        self.services.remove(service);
        self.relisting.remove(service);
    }

    /// Forgets the nodes that stopped serving more than `grace` ago.
    pub fn expire(&mut self, grace: Duration, now: Instant) {
        self.services.retain(|_, nodes| {
            nodes
                .left
                .retain(|_, since| now.saturating_duration_since(*since) < grace);
            !(nodes.slices.is_empty() && nodes.left.is_empty())
        });
    }

    /// The nodes that back `service`'s load balancer: those serving it,
    /// and those that stopped within `grace` (all its pods restarting at
    /// once keep their nodes). `None` once none is left (its load balancer
    /// then keeps a subset, whose health checks fail, as upstream's do).
    pub fn nodes(&self, service: &Key, grace: Duration, now: Instant) -> Option<BTreeSet<&str>> {
        let entry = self.services.get(service)?;
        let recent = entry
            .left
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) < grace)
            .map(|(n, _)| &**n);
        let nodes: BTreeSet<&str> = entry
            .slices
            .values()
            .flatten()
            .map(|n| &**n)
            .chain(recent)
            .collect();
        (!nodes.is_empty()).then_some(nodes)
    }

    /// Whether no Service has serving endpoints kept.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_test_apiserver::fixtures::endpoint_slice;

    const GRACE: Duration = Duration::from_secs(60);

    fn key() -> Key {
        ("default".into(), "web".into())
    }

    fn names(set: Option<BTreeSet<&str>>) -> Vec<String> {
        set.unwrap_or_default()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_slice_keeps_its_service_and_the_nodes_that_serve_once_each() {
        let strings = Interner::default();
        let slice = endpoint_slice(
            "default",
            "web",
            "web-abc",
            &[("n2", true), ("n1", true), ("n2", true), ("n3", false)],
        );
        let view = SliceView::of(&slice, &strings, true);
        assert_eq!(view.service, key());
        let nodes: Vec<&str> = view.nodes.iter().flatten().map(|n| &**n).collect();
        assert_eq!(nodes, ["n1", "n2"]);
        // Of a Service that is no Local load balancer: no node kept.
        assert_eq!(SliceView::of(&slice, &strings, false).nodes, None);
    }

    #[test]
    fn a_terminating_endpoint_still_serving_counts_and_unset_conditions_mean_ready() {
        let strings = Interner::default();
        let mut slice = endpoint_slice("default", "web", "web-abc", &[("n1", true), ("n2", true)]);
        let c = slice.endpoints[0].conditions.as_mut().unwrap();
        (c.ready, c.serving, c.terminating) = (Some(false), Some(true), Some(true));
        slice.endpoints[1].conditions = None;
        assert_eq!(serving_nodes(&slice, &strings).len(), 2);
    }

    #[test]
    fn a_node_that_stops_serving_stays_for_the_grace_period_and_none_serving_is_none() {
        let strings = Interner::default();
        let (n1, n2) = (strings.intern("n1"), strings.intern("n2"));
        let mut serving = Serving::default();
        let t0 = Instant::now();
        let c = serving.apply(&key(), "a", Some(&[n1.clone(), n2.clone()]), t0);
        assert_eq!(
            c,
            Change {
                changed: true,
                left: false
            }
        );
        // A rolling update: the pod on n2 goes, one comes on n3 in
        // another slice.
        let n3 = strings.intern("n3");
        serving.apply(&key(), "a", Some(std::slice::from_ref(&n1)), t0);
        serving.apply(&key(), "b", Some(std::slice::from_ref(&n3)), t0);
        assert_eq!(
            names(serving.nodes(&key(), GRACE, t0 + GRACE / 2)),
            ["n1", "n2", "n3"]
        );
        assert_eq!(
            names(serving.nodes(&key(), GRACE, t0 + GRACE)),
            ["n1", "n3"]
        );
        // Back within the grace: as if it never left.
        serving.apply(&key(), "a", Some(&[n1.clone(), n2.clone()]), t0);
        serving.expire(GRACE, t0 + GRACE * 2);
        assert_eq!(
            names(serving.nodes(&key(), GRACE, t0 + GRACE * 2)),
            ["n1", "n2", "n3"]
        );
        // Every endpoint gone at once (all pods restarting): their nodes
        // stay for the grace, then none is left.
        let t1 = t0 + GRACE * 2;
        serving.apply(&key(), "a", None, t1);
        serving.apply(&key(), "b", Some(&[]), t1);
        assert_eq!(
            names(serving.nodes(&key(), GRACE, t1 + GRACE / 2)),
            ["n1", "n2", "n3"]
        );
        assert_eq!(serving.nodes(&key(), GRACE, t1 + GRACE), None);
        serving.apply(&key(), "b", None, t1);
        serving.expire(GRACE, t1 + GRACE);
        assert!(serving.is_empty());
    }

    #[test]
    fn a_slice_that_changes_nothing_of_its_services_nodes_is_no_change() {
        let strings = Interner::default();
        let n1 = strings.intern("n1");
        let mut serving = Serving::default();
        let t0 = Instant::now();
        serving.apply(&key(), "a", Some(std::slice::from_ref(&n1)), t0);
        // The same node in a second slice: still one node serving.
        assert_eq!(
            serving.apply(&key(), "b", Some(std::slice::from_ref(&n1)), t0),
            Change::default()
        );
        assert_eq!(serving.apply(&key(), "a", None, t0), Change::default());
    }

    #[test]
    fn a_read_of_a_services_slices_yields_to_what_the_watch_told_since() {
        let strings = Interner::default();
        let (n1, n2, n3) = (
            strings.intern("n1"),
            strings.intern("n2"),
            strings.intern("n3"),
        );
        let mut serving = Serving::default();
        let t0 = Instant::now();
        serving.begin_relist(&key());
        // While the read is under way, the watch tells of slice b's
        // change and slice c's deletion.
        serving.apply(&key(), "b", Some(std::slice::from_ref(&n3)), t0);
        serving.apply(&key(), "c", None, t0);
        let read = vec![
            ("a".to_owned(), vec![n1.clone()]),
            ("b".to_owned(), vec![n2.clone()]),
            ("c".to_owned(), vec![n2.clone()]),
        ];
        let c = serving.end_relist(&key(), Some(read), t0);
        assert!(c.changed);
        assert_eq!(names(serving.nodes(&key(), GRACE, t0)), ["n1", "n3"]);
        // A read ended twice, or never begun, changes nothing.
        assert_eq!(
            serving.end_relist(&key(), Some(vec![("d".into(), vec![n2])]), t0),
            Change::default()
        );
        serving.forget(&key());
        assert!(serving.is_empty());
    }
}
