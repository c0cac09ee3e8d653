//! What every part of the service controller shares.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ccm_proto::GatewayClient;
use ccm_proto::v1::Host;
use ccm_runtime::leader::Leadership;
use ccm_runtime::queue::WorkQueue;
use ccm_runtime::view::{Interner, Views};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::events::Recorder;

use crate::args::Settings;
use crate::endpoints::{Serving, SliceView};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::plan::{self, NodeView, ServiceView};
use crate::subsets;
use ccm_runtime::host_limits::{Allowed, HostLimits};
use kube::ResourceExt;

/// A Service's key: `namespace/name`.
pub type Key = (String, String);

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
    /// One more at every change of a node's view.
    pub nodes_generation: AtomicU64,
    /// The nodes that may back load balancers, built once per
    /// `nodes_generation` and shared by every ensure and host pass.
    pub shared_hosts: Mutex<Option<(u64, Shared)>>,
    pub gateway: GatewayClient,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub leadership: Leadership,
    pub settings: Settings,
    pub queue: WorkQueue<Key>,
    /// The digest ([`plan::hosts_digest`]) of the hosts each load balancer
    /// was last given, stored before the call.
    pub last_hosts: Mutex<HashMap<Key, u64>>,
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

/// The nodes that may back load balancers (those that
/// [`plan::backs_load_balancers`]), sorted by name, and, once a load
/// balancer takes them all, all of them as one shared host list (with
/// subsets, few ever do).
#[derive(Clone, Debug, Default)]
pub struct Shared {
    pub nodes: Arc<Vec<Arc<NodeView>>>,
    all: Arc<std::sync::OnceLock<Hosts>>,
}

impl Shared {
    /// Every node, as one host list built at most once.
    fn all(&self) -> Hosts {
        self.all
            .get_or_init(|| {
                Hosts::of(plan::hosts(
                    self.nodes.iter().map(|n| n.as_ref()),
                    &Default::default(),
                ))
            })
            .clone()
    }
}

/// How a load balancer's hosts were chosen.
#[derive(Clone, Copy, Debug)]
enum Chosen {
    /// By the Service's selection.
    Selection(subsets::Selection),
    /// The eligible nodes among those serving a Local Service.
    Local { serving: usize },
    /// A Local Service's subset: none of the nodes serving it is eligible.
    NoneServingEligible,
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

    /// Notes a change of a node's view: the shared hosts are built again.
    pub fn note_node_view_change(&self) {
        self.nodes_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The nodes that may back load balancers: built once after each node
    /// change and shared.
    pub fn hosts(&self) -> Shared {
        let generation = self.nodes_generation.load(Ordering::SeqCst);
        let mut cached = self.shared_hosts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((built, shared)) = &*cached
            && *built == generation
        {
            return shared.clone();
        }
        let mut nodes: Vec<Arc<NodeView>> =
            self.nodes.state().into_iter().filter(|n| n.backs).collect();
        nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let shared = Shared {
            nodes: Arc::new(nodes),
            all: Arc::default(),
        };
        *cached = Some((generation, shared.clone()));
        shared
    }

    /// The Node label keys `svc`'s host-selecting annotations name.
    pub fn host_label_keys(&self, svc: &Service) -> std::collections::BTreeSet<String> {
        plan::host_label_keys(
            svc,
            self.host_label_annotations
                .get()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
    }

    /// The Node labels `svc`'s host-selecting annotations ask for.
    fn host_selector(&self, svc: &Service) -> Vec<(String, Option<String>)> {
        plan::host_selector(
            svc,
            self.host_label_annotations
                .get()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
    }

    /// The backing hosts of `svc`'s load balancer, of `shared` (from
    /// [`Context::hosts`]): those its host-selecting annotations select,
    /// then its subset ([`subsets`]), or with Local traffic those that
    /// serve its endpoints ([`crate::endpoints`]), within the cloud's
    /// limits for its kind of load balancer. An invalid subset annotation
    /// is the problem.
    pub fn hosts_for(&self, svc: &Service, shared: &Shared) -> Result<Hosts, String> {
        Ok(self.choose_hosts(svc, shared)?.0)
    }

    /// [`Self::hosts_for`], and how they were chosen.
    fn choose_hosts(&self, svc: &Service, shared: &Shared) -> Result<(Hosts, Chosen), String> {
        let selection = subsets::selection(svc, self.settings.subset_size)?;
        let selector = self.host_selector(svc);
        let keys = self.host_label_keys(svc);
        let allowed = self.allowed(svc);
        let eligible = || {
            shared
                .nodes
                .iter()
                .map(|n| n.as_ref())
                .filter(|n| n.selected_by(&selector))
        };
        // Local traffic: the eligible nodes that serve it, all of them
        // within the limits. None of them eligible, or no endpoint serving
        // yet: its subset, never no target at all.
        let local = plan::is_local(svc) && matches!(selection, subsets::Selection::Subset(_));
        let serving = local.then(|| self.serving.lock().unwrap_or_else(|e| e.into_inner()));
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let nodes = serving.as_ref().and_then(|serving| {
            serving.nodes(&key, self.settings.local_grace, std::time::Instant::now())
        });
        // Sorted by name, so a serving node is found by name.
        let eligible_named = |name: &str| {
            let i = subsets::position(&shared.nodes, name).ok()?;
            Some(shared.nodes[i].as_ref()).filter(|n| n.selected_by(&selector))
        };
        let (chosen, on_serving) = subsets::choose_serving(
            eligible,
            eligible_named,
            subsets::seed(svc),
            selection,
            allowed,
            nodes.as_ref(),
        );
        let how = match &nodes {
            Some(nodes) if on_serving => Chosen::Local {
                serving: nodes.len(),
            },
            Some(_) => Chosen::NoneServingEligible,
            None => Chosen::Selection(selection),
        };
        drop(serving);
        if keys.is_empty() && chosen.len() == shared.nodes.len() {
            return Ok((shared.all(), how));
        }
        Ok((Hosts::of(plan::hosts(chosen, &keys)), how))
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

    pub fn remember_hosts(&self, key: &Key, digest: u64) {
        self.last_hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), digest);
    }

    pub fn remembered_hosts(&self, key: &Key) -> Option<u64> {
        self.last_hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
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
            self.last_hosts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
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
        self.last_hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
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
    pub fn explain_hosts(&self, svc: &Service) -> serde_json::Value {
        let shared = self.hosts();
        let (used, how) = match self.choose_hosts(svc, &shared) {
            Ok((hosts, how)) => (hosts.list.len(), how),
            Err(problem) => return serde_json::json!({"why": problem}),
        };
        let selector = self.host_selector(svc);
        let eligible = shared
            .nodes
            .iter()
            .filter(|n| n.selected_by(&selector))
            .count();
        let mut why = match how {
            Chosen::Local { serving } => format!(
                "externalTrafficPolicy Local: the eligible nodes of the {serving} that serve its endpoints (or did within {:?})",
                self.settings.local_grace
            ),
            Chosen::NoneServingEligible => {
                "externalTrafficPolicy Local, but no eligible node serves its endpoints: a subset"
                    .to_owned()
            }
            Chosen::Selection(subsets::Selection::Subset(n)) if plan::is_local(svc) => {
                format!(
                    "externalTrafficPolicy Local with no endpoint serving yet: a subset of {n} per zone"
                )
            }
            Chosen::Selection(subsets::Selection::Subset(n)) => format!("a subset of {n} per zone"),
            Chosen::Selection(subsets::Selection::All) => "every eligible node".to_owned(),
        };
        if !selector.is_empty() {
            why.push_str(", of the nodes its label annotation selects");
        }
        let allowed = self.allowed(svc);
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
