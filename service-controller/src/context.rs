//! What every part of the service controller shares.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ccm_proto::GatewayClient;
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use ccm_runtime::view::{Interner, Views};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::events::Recorder;

use crate::args::Settings;
use crate::endpoints::{Serving, SliceView};
use crate::error::{Error, Result};
use crate::membership::{Ask, How, Membership};
use crate::metrics::Metrics;
use crate::plan::{self, NodeView, ServiceView};
use crate::subsets;
use ccm_runtime::host_limits::{Allowed, HostLimits};
use kube::ResourceExt;

/// A Service's key: `(namespace, name)`.
pub use crate::membership::Key;

/// The shared state of one service controller process.
pub struct Context {
    pub client: kube::Client,
    /// What the controller keeps of each Service.
    pub services: Views<ServiceView>,
    /// What the controller keeps of each Node.
    pub nodes: Views<NodeView>,
    /// What the controller keeps of each EndpointSlice.
    pub slices: Views<SliceView>,
    /// Node names, shared between the slices.
    pub slice_nodes: Interner,
    /// Whether the slice watch has begun: a Service that becomes a Local
    /// load balancer from then on has its slices read once.
    pub slices_followed: std::sync::atomic::AtomicBool,
    /// The nodes serving each Local load balancer, from its slices.
    pub serving: Mutex<Serving>,
    /// Services whose serving nodes changed since the last host pass.
    pub serving_changed: Mutex<HashSet<Key>>,
    /// Whether the next host pass looks at every load balancer (a node
    /// changed), not only those of `serving_changed`.
    pub hosts_pass_full: std::sync::atomic::AtomicBool,
    /// Which nodes back each load balancer, kept as nodes change.
    pub backing: Arc<Backing>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    pub queue: WorkQueue<Key>,
    /// The hosts each load balancer was last given, and the Services a
    /// host pass passed over.
    pub hosts_given: HostsGiven,
    /// Wakes the host pass.
    pub hosts_due: Arc<tokio::sync::Notify>,
    /// The provider's annotations that select hosts by Node label (from
    /// GetProviderInfo, set once at start).
    pub host_label_annotations: std::sync::OnceLock<Vec<String>>,
    /// The cloud's limits on a load balancer's hosts (from
    /// GetProviderInfo, set once at start).
    pub host_limits: std::sync::OnceLock<Vec<HostLimits>>,
    /// Load balancers the cloud is still provisioning, with the fingerprint
    /// of what was asked for: while that is unchanged, the next sync asks
    /// for the status (a read the gateway batches) instead of ensuring again.
    pub provisioning: Mutex<HashMap<Key, u64>>,
    /// When the oldest node change not yet passed on to the load balancers
    /// was seen.
    pub hosts_changed_at: Mutex<Option<std::time::Instant>>,
    /// Since when each Service has had a change (its creation included)
    /// that no ensure has carried to its load balancer yet.
    pub changed_since: Mutex<HashMap<Key, std::time::Instant>>,
    /// The load balancers the last orphan check found without a Service.
    pub orphaned: Mutex<Vec<Orphan>>,
    /// What this replica's ensures made of each load balancer: the
    /// fingerprint asked for and the status the cloud answered. Kept across
    /// terms that continue each other (no other replica led in between);
    /// a Service whose ensure would ask for the same again only gets its
    /// own status written, with no cloud call: a status write the API
    /// server refused, or a term regained after an API server outage,
    /// costs the cloud nothing.
    pub applied: Mutex<HashMap<Key, Applied>>,
}

pub use crate::membership::Hosts;

/// Which nodes back each load balancer ([`Membership`]), brought up to
/// date with the nodes whose views changed since it last looked.
pub struct Backing {
    nodes: Views<NodeView>,
    changed: Mutex<Changed>,
    /// `None` until first asked (the node cache is then in).
    membership: Mutex<Option<Membership>>,
}

/// The nodes whose views changed since the membership last looked.
#[derive(Default)]
struct Changed {
    names: HashSet<String>,
    /// Every view changed (their labels were dropped).
    all: bool,
}

impl Backing {
    /// The membership of the nodes of `nodes`, as they change.
    pub fn new(nodes: Views<NodeView>) -> Self {
        Self {
            nodes,
            changed: Mutex::default(),
            membership: Mutex::default(),
        }
    }

    /// Notes that the view of the node `name` changed (or it is gone).
    pub fn note(&self, name: &str) {
        self.lock_changed().names.insert(name.to_owned());
    }

    /// Notes that every node's view changed.
    pub fn note_all(&self) {
        self.lock_changed().all = true;
    }

    fn lock_changed(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.changed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the membership, brought up to date: each node noted as
    /// changed is taken in, unless so many changed (a relist) that
    /// building it again from every node costs less. Building costs a
    /// pass over every node, and each Service its subset afterwards: call
    /// this off the runtime's threads.
    pub fn with<R>(&self, f: impl FnOnce(&mut Membership) -> R) -> R {
        let mut membership = self.membership.lock().unwrap_or_else(|e| e.into_inner());
        let changed = std::mem::take(&mut *self.lock_changed());
        match &mut *membership {
            Some(kept)
                if !changed.all && changed.names.len() <= REBUILD_AFTER.max(kept.len() / 8) =>
            {
                for name in changed.names {
                    kept.update(&name, self.nodes.get(&name));
                }
            }
            // Changes noted from here on are the views' after this read.
            _ => *membership = Some(Membership::new(self.nodes.state())),
        }
        f(membership.as_mut().expect("just built"))
    }
}

/// Node changes taken in one by one, at least; past this and an eighth of
/// the nodes, the membership is built again.
const REBUILD_AFTER: usize = 1024;

/// The digest ([`plan::hosts_digest`]) of the hosts each load balancer
/// was last given, stored before the call, and the Services a host pass
/// passed over because none were remembered for them yet: their first
/// ensure was on its way, and may have chosen its hosts before the pass's
/// change. Both under one lock, so no ensure's remembering slips between
/// a pass's look and its passing over.
#[derive(Default)]
pub struct HostsGiven(Mutex<(HashMap<Key, u64>, HashSet<Key>)>);

impl HostsGiven {
    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<Key, u64>, HashSet<Key>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers that `key`'s load balancer is given the hosts of
    /// `digest`. Whether a host pass passed it over meanwhile: then that
    /// Service must be passed again, as the hosts it was given may be
    /// those of before the pass's change.
    pub fn remember(&self, key: &Key, digest: u64) -> bool {
        let mut given = self.lock();
        given.0.insert(key.clone(), digest);
        given.1.remove(key)
    }

    /// The hosts remembered for `key`.
    pub fn get(&self, key: &Key) -> Option<u64> {
        self.lock().0.get(key).copied()
    }

    /// The hosts remembered for `key`, as a host pass asks; when there are
    /// none, the pass passes it over, and that is noted.
    pub fn get_or_pass_over(&self, key: &Key) -> Option<u64> {
        let mut given = self.lock();
        let remembered = given.0.get(key).copied();
        if remembered.is_none() {
            given.1.insert(key.clone());
        }
        remembered
    }

    /// Forgets `key`.
    pub fn forget(&self, key: &Key) {
        let mut given = self.lock();
        given.0.remove(key);
        given.1.remove(key);
    }

    /// Forgets the hosts given (another replica may have changed them).
    pub fn clear(&self) {
        self.lock().0.clear();
    }
}

/// What an ensure made of one load balancer.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// The fingerprint of the spec and hosts asked for.
    pub fingerprint: u64,
    /// The status the cloud answered.
    pub status: ccm_proto::v1::LoadBalancerStatus,
}

/// A load balancer of this cluster whose Service is gone.
#[derive(Clone, Debug)]
pub struct Orphan {
    /// The load balancer's name in the cloud.
    pub load_balancer: String,
    /// The Service it was made for, `namespace/name`.
    pub service: String,
    /// When it was first seen orphaned.
    pub since: std::time::SystemTime,
}

impl Context {
    /// Fails unless this replica leads now. Every write checks it first.
    pub fn ensure_leader(&self) -> Result<()> {
        if self.leadership.is_leader() {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// Notes a node change the next host pass must carry. Only a leader
    /// times changes: one seen on standby waited for the previous leader,
    /// and the full sync on taking the lease carries it.
    pub fn note_node_change(&self) {
        if !self.leadership.is_leader() {
            return;
        }
        self.hosts_changed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(std::time::Instant::now);
    }

    /// Takes the time of the oldest node change not yet carried.
    pub fn take_node_change(&self) -> Option<std::time::Instant> {
        self.hosts_changed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// The Service with `key`, as kept.
    pub fn service(&self, key: &Key) -> Option<Arc<ServiceView>> {
        self.services.get(&format!("{}/{}", key.0, key.1))
    }

    /// What decides which nodes back `svc`'s load balancer: its
    /// host-selecting annotations, its subset ([`subsets`]), the cloud's
    /// limits for its kind of load balancer. An invalid subset annotation
    /// is the problem.
    pub fn ask(&self, svc: &Service) -> Result<Ask, String> {
        let annotations = self.host_label_annotations.get().map(Vec::as_slice);
        Ask::of(
            svc,
            self.settings.subset_size,
            annotations.unwrap_or_default(),
            self.allowed(svc),
        )
    }

    /// The nodes that serve `svc` if it is a Local Service with a subset
    /// ([`crate::endpoints`]): those that back its load balancer, when any
    /// is eligible. `None` when none serves.
    pub fn serving_of(&self, svc: &Service, ask: &Ask) -> Option<BTreeSet<String>> {
        if !(plan::is_local(svc) && matches!(ask.selection, subsets::Selection::Subset(_))) {
            return None;
        }
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let serving = self.serving.lock().unwrap_or_else(|e| e.into_inner());
        let nodes = serving.nodes(&key, self.settings.local_grace, std::time::Instant::now())?;
        Some(nodes.into_iter().map(str::to_owned).collect())
    }

    /// The backing hosts of `svc`'s load balancer: those its
    /// host-selecting annotations select, then its subset ([`subsets`]),
    /// or with Local traffic those that serve its endpoints
    /// ([`crate::endpoints`]), within the cloud's limits for its kind of
    /// load balancer ([`Membership`] keeps what decides them). Worked out
    /// off the runtime's threads. An invalid subset annotation is the
    /// problem.
    pub async fn hosts_for(&self, svc: &Service) -> Result<Hosts, String> {
        let ask = self.ask(svc)?;
        let serving = self.serving_of(svc, &ask);
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let backing = self.backing.clone();
        let hosts = tokio::task::spawn_blocking(move || {
            let serving: Option<BTreeSet<&str>> = serving
                .as_ref()
                .map(|s| s.iter().map(String::as_str).collect());
            backing.with(|m| m.hosts(&key, &ask, serving.as_ref()).0)
        })
        .await
        .map_err(|e| format!("working out the hosts failed: {e}"))?;
        Ok(hosts)
    }

    /// Whether the nodes serving `svc` are followed: it is a Local load
    /// balancer of ours.
    pub fn follows_endpoints(&self, svc: &Service) -> bool {
        plan::is_local(svc) && plan::wants_load_balancer(svc, &self.settings.classes)
    }

    /// Whether the nodes serving the Service `key` are followed, as it is
    /// kept now.
    pub fn follows_endpoints_of(&self, key: &Key) -> bool {
        self.service(key)
            .as_deref()
            .and_then(ServiceView::service)
            .is_some_and(|svc| self.follows_endpoints(svc))
    }

    /// Notes that the nodes serving `key` changed: the next host pass
    /// looks at it.
    pub fn note_serving_change(&self, key: Key) {
        self.serving_changed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key);
    }

    /// Takes the Services whose serving nodes changed since the last call.
    pub fn take_serving_changes(&self) -> HashSet<Key> {
        std::mem::take(
            &mut *self
                .serving_changed
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// What the cloud's limits allow `svc`'s kind of load balancer.
    pub fn allowed(&self, svc: &Service) -> Allowed {
        let Some(limits) = self.host_limits.get() else {
            return Allowed::default();
        };
        let annotations = svc.annotations();
        HostLimits::of_service(limits, annotations)
            .map(|l| l.allowed(annotations))
            .unwrap_or_default()
    }

    /// Remembers the hosts `key`'s load balancer is given; if a host pass
    /// passed it over meanwhile, that Service alone is passed again.
    pub fn remember_hosts(&self, key: &Key, digest: u64) {
        if self.hosts_given.remember(key, digest) {
            self.note_serving_change(key.clone());
            self.hosts_due.notify_one();
        }
    }

    pub fn remembered_hosts(&self, key: &Key) -> Option<u64> {
        self.hosts_given.get(key)
    }

    /// The hosts remembered for `key`; when there are none, notes that a
    /// host pass passed it over ([`HostsGiven::get_or_pass_over`]).
    pub fn remembered_hosts_or_pass_over(&self, key: &Key) -> Option<u64> {
        self.hosts_given.get_or_pass_over(key)
    }

    /// Notes (`Some`) or forgets (`None`) that `key`'s load balancer is
    /// being provisioned as asked for with `fingerprint`.
    pub fn set_provisioning(&self, key: &Key, fingerprint: Option<u64>) {
        let mut map = self.provisioning.lock().unwrap_or_else(|e| e.into_inner());
        match fingerprint {
            Some(f) => map.insert(key.clone(), f),
            None => map.remove(key),
        };
    }

    /// Whether `key`'s load balancer is being provisioned as `fingerprint`
    /// asks.
    pub fn is_provisioning(&self, key: &Key, fingerprint: u64) -> bool {
        self.provisioning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            == Some(&fingerprint)
    }

    /// Starts a term of leadership: unless it continues this replica's
    /// previous one, another replica may have changed any load balancer
    /// since, so what this one remembers of them is forgotten.
    pub fn begin_term(&self, term: ccm_runtime::leader::Term) {
        if !term.continues {
            self.applied
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            self.hosts_given.clear();
        }
    }

    /// The status `key`'s load balancer got from an ensure asking for
    /// exactly `fingerprint`, if this replica made it so.
    pub fn applied(
        &self,
        key: &Key,
        fingerprint: u64,
    ) -> Option<ccm_proto::v1::LoadBalancerStatus> {
        self.applied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .filter(|a| a.fingerprint == fingerprint)
            .map(|a| a.status.clone())
    }

    /// Remembers what an ensure made of `key`'s load balancer (`Some`), or
    /// that it is unknown (`None`: the ensure failed, or it was deleted).
    pub fn set_applied(&self, key: &Key, applied: Option<Applied>) {
        let mut map = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        match applied {
            Some(a) => map.insert(key.clone(), a),
            None => map.remove(key),
        };
    }

    /// Forgets what is remembered of `key` (hosts sent, what an ensure
    /// made, provisioning, a change waiting).
    pub fn forget(&self, key: &Key) {
        self.set_applied(key, None);
        self.hosts_given.forget(key);
        self.set_provisioning(key, None);
        self.take_change(key);
    }

    /// Notes a change of `key` the next ensure must carry (the oldest such
    /// change counts); on standby, nothing (as [`Self::note_node_change`]).
    pub fn note_change(&self, key: &Key) {
        if !self.leadership.is_leader() {
            return;
        }
        self.changed_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_insert_with(std::time::Instant::now);
    }

    /// What `/debug/status` tells of this controller beyond what every
    /// controller tells: the classes it serves and the orphans it found.
    pub fn inspect(&self) -> serde_json::Value {
        use ccm_runtime::inspect::{MAX_LISTED, ago_s, rfc3339};
        let classes = &self.settings.classes;
        let orphaned = self.orphaned.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::json!({
            "classes": {"default": classes.default, "named": classes.named},
            "provisioning": self.provisioning.lock().unwrap_or_else(|e| e.into_inner()).len(),
            "orphaned_total": orphaned.len(),
            "orphaned": orphaned.iter().take(MAX_LISTED).map(|o| serde_json::json!({
                "load_balancer": o.load_balancer,
                "service": o.service,
                "since": rfc3339(o.since),
                "since_ago_s": ago_s(o.since),
            })).collect::<Vec<_>>(),
            "deletes_orphans": self.settings.delete_orphans,
        })
    }

    /// What `/debug/object` tells of one Service beyond its queue state.
    pub fn inspect_service(&self, key: &Key) -> serde_json::Value {
        let view = self.service(key);
        let svc = view.as_deref().and_then(ServiceView::service);
        let waiting = self
            .changed_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|seen| (seen.elapsed().as_secs_f64() * 10.0).round() / 10.0);
        serde_json::json!({
            "known": view.is_some(),
            "served": svc.is_some_and(|s| plan::wants_load_balancer(s, &self.settings.classes)),
            "provisioning": self.provisioning.lock().unwrap_or_else(|e| e.into_inner()).contains_key(key),
            "change_waiting_s": waiting,
            "hosts": svc.map(|s| self.explain_hosts(s)),
        })
    }

    /// How many nodes back `svc`'s load balancer, of how many eligible,
    /// and why that many, for `kubectl ccm why`.
    /// It asks the membership on the caller's thread: a question asked
    /// now and then, which at worst waits for a host pass.
    pub fn explain_hosts(&self, svc: &Service) -> serde_json::Value {
        let ask = match self.ask(svc) {
            Ok(ask) => ask,
            Err(problem) => return serde_json::json!({"why": problem}),
        };
        let serving = self.serving_of(svc, &ask);
        let serving: Option<BTreeSet<&str>> = serving
            .as_ref()
            .map(|s| s.iter().map(String::as_str).collect());
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let (used, how, eligible) = self.backing.with(|m| {
            let (hosts, how) = m.hosts(&key, &ask, serving.as_ref());
            let eligible = m.nodes().filter(|n| n.selected_by(&ask.selector)).count();
            (hosts.list.len(), how, eligible)
        });
        let selector = ask.selector;
        let mut why = match how {
            How::Local { serving } => format!(
                "externalTrafficPolicy Local: the eligible nodes of the {serving} that serve its endpoints (or did within {:?})",
                self.settings.local_grace
            ),
            How::NoneServingEligible => {
                "externalTrafficPolicy Local, but no eligible node serves its endpoints: a subset"
                    .to_owned()
            }
            How::Selection(subsets::Selection::Subset(n)) if plan::is_local(svc) => {
                format!(
                    "externalTrafficPolicy Local with no endpoint serving yet: a subset of {n} per zone"
                )
            }
            How::Selection(subsets::Selection::Subset(n)) => format!("a subset of {n} per zone"),
            How::Selection(subsets::Selection::All) => "every eligible node".to_owned(),
        };
        if !selector.is_empty() {
            why.push_str(", of the nodes its label annotation selects");
        }
        let allowed = ask.allowed;
        let mut quota = Vec::new();
        if let Some(n) = allowed.per_zone {
            quota.push(format!("{n} per zone"));
        }
        if let Some(n) = allowed.total {
            quota.push(format!("{n} in all"));
        }
        if !quota.is_empty() {
            why.push_str(&format!(
                ", within the cloud's quota of {}",
                quota.join(" and ")
            ));
        }
        serde_json::json!({"used": used, "eligible": eligible, "why": why})
    }

    /// Takes when the oldest change of `key` not yet carried was seen.
    pub fn take_change(&self, key: &Key) -> Option<std::time::Instant> {
        self.changed_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::HostsGiven;

    fn key(name: &str) -> super::Key {
        ("default".to_owned(), name.to_owned())
    }

    // The two orders of a Service's first ensure (choose the hosts, then
    // remember them before the cloud call) and a host pass after a node
    // change (look at what was remembered), each step in turn.

    #[test]
    fn a_pass_before_the_first_ensure_remembers_asks_for_another() {
        let given = HostsGiven::default();
        let web = key("web");
        // The ensure chose its hosts; the pass looks before it remembers.
        assert_eq!(given.get_or_pass_over(&web), None);
        // Remembering the hosts of before says the pass passed it over.
        assert!(given.remember(&web, 1));
        // The pass of that Service alone then compares with them.
        assert_eq!(given.get_or_pass_over(&web), Some(1));
        // Once: a later ensure asks for no pass.
        assert!(!given.remember(&web, 2));
    }

    #[test]
    fn a_pass_after_the_ensure_remembers_compares_and_asks_for_none() {
        let given = HostsGiven::default();
        let web = key("web");
        assert!(!given.remember(&web, 1));
        assert_eq!(given.get_or_pass_over(&web), Some(1));
        assert!(!given.remember(&web, 2));
        assert_eq!(given.get(&web), Some(2));
    }

    #[test]
    fn a_forgotten_service_is_no_longer_passed_over() {
        let given = HostsGiven::default();
        let web = key("web");
        assert_eq!(given.get_or_pass_over(&web), None);
        given.forget(&web);
        assert!(!given.remember(&web, 1));
    }

    #[test]
    fn a_new_term_forgets_the_hosts_but_not_a_pass_over() {
        let given = HostsGiven::default();
        let (web, api) = (key("web"), key("api"));
        assert!(!given.remember(&web, 1));
        assert_eq!(given.get_or_pass_over(&api), None);
        given.clear();
        assert_eq!(given.get(&web), None);
        // The ensure on its way in the new term still brings its pass.
        assert!(given.remember(&api, 3));
    }
}
