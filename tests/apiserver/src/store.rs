//! The objects the test server holds, with the semantics clients rely on:
//! one resourceVersion counter, uid / generation / creationTimestamp set by
//! the server, optimistic concurrency, status subresources, finalizers and
//! deletionTimestamp, and a bounded history of changes so watches can
//! resume from a resourceVersion (or get 410 Gone when it is too old).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::journal::{Journal, Loaded};
use super::resources::Resource;
use super::services;

/// An API error, returned to clients as a `Status` object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(resource: &Resource, name: &str) -> Self {
        Self {
            details: Some(json!({"name": name, "group": resource.group, "kind": resource.plural})),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", resource.qualified()),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn invalid(resource: &Resource, name: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            details: Some(json!({
                "name": name, "group": resource.group, "kind": resource.kind,
                "causes": [{"reason": "FieldValueInvalid", "message": message}],
            })),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {message}", resource.kind),
            )
        }
    }

    /// A 422 without details made an `Invalid` of `resource` `name`, as
    /// kube-apiserver words them; other errors as they are.
    fn for_object(self, resource: &Resource, name: &str) -> Self {
        if self.code == 422 && self.details.is_none() {
            Self::invalid(resource, name, self.message)
        } else {
            self
        }
    }

    fn conflict(resource: &Resource, name: &str) -> Self {
        Self {
            details: Some(json!({"name": name, "group": resource.group, "kind": resource.plural})),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                    resource.qualified()
                ),
            )
        }
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

impl ChangeType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug)]
pub struct Change {
    pub rv: u64,
    pub kind: ChangeType,
    pub resource: &'static Resource,
    pub namespace: String,
    /// The object after the change (its last state for a delete), shared
    /// with the store.
    pub object: Arc<Value>,
    /// The object before the change.
    pub old: Option<Arc<Value>>,
    /// `object` as JSON, written once for every watcher that sees it, as
    /// kube-apiserver's watch cache serialises an event once.
    pub json: std::sync::OnceLock<String>,
}

impl Change {
    /// `object` as JSON.
    pub fn json(&self) -> &str {
        self.json.get_or_init(|| self.object.to_string())
    }
}

type Key = (&'static str, &'static str, String, String);

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    /// Shared with the store: a page is read under its lock, so no object
    /// is copied there.
    pub items: Vec<Arc<Value>>,
    /// The store's resourceVersion when the page was read.
    pub rv: u64,
    /// Where the next page starts (after this namespace and name), if
    /// there is more.
    pub next: Option<(String, String)>,
}

/// Changes to replay, then the live feed.
pub type Subscription = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

fn key(resource: &'static Resource, namespace: &str, name: &str) -> Key {
    (
        resource.group,
        resource.plural,
        namespace.to_owned(),
        name.to_owned(),
    )
}

struct Inner {
    rv: u64,
    /// Shared with the changes that wrote them, so a write copies the
    /// object once, for its answer, not three times (copying objects took
    /// about a fifth of the server's CPU in a 10,000-node join).
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<Change>>,
    /// Watches from a resourceVersion below this get 410 Gone.
    floor: u64,
    max_history: usize,
    node_ports: BTreeSet<i64>,
    next_cluster_ip: u32,
    /// Updates of these resources still to be answered with 409 Conflict.
    injected_conflicts: BTreeMap<&'static str, u32>,
    /// Until when every update of these resources (only of their status,
    /// when the flag is set) is answered with 409 Conflict.
    conflicts_until: BTreeMap<String, (std::time::Instant, bool)>,
    /// Where every change is written, when the store keeps its state on
    /// disk.
    journal: Option<Journal>,
}

/// The store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Mutex<Inner>>,
    changes: broadcast::Sender<Arc<Change>>,
}

/// Now, as Kubernetes writes timestamps.
pub(crate) fn now() -> String {
    timestamp(unix_now())
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// `secs` since the Unix epoch as Kubernetes writes timestamps: RFC 3339
/// in UTC, whole seconds.
pub(crate) fn timestamp(secs: u64) -> String {
    let days = secs / 86_400;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let (y, mo, d) = civil_from_days(days as i64);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z")
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's
/// public-domain algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("object")
}

fn finalizers_empty(obj: &Value) -> bool {
    meta(obj)["finalizers"].as_array().is_none_or(Vec::is_empty)
}

/// Whether an update changes what `metadata.generation` counts: the spec,
/// or for a custom resource everything but its metadata (and its status,
/// where it has a status subresource), as kube-apiserver counts a CRD's
/// (a VolumeSnapshotClass has no spec).
fn generation_counts(resource: &Resource, old: &Value, new: &Value) -> bool {
    if !resource.custom {
        return new.get("spec") != old.get("spec");
    }
    let counted = |obj: &Value| {
        let mut obj = obj.clone();
        if let Some(fields) = obj.as_object_mut() {
            fields.remove("metadata");
            if resource.has_status {
                fields.remove("status");
            }
        }
        obj
    };
    counted(old) != counted(new)
}

/// A random suffix for `generateName`, from the uid generator.
fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..5].to_owned()
}

impl Store {
    /// An empty store keeping `max_history` changes for watch replay.
    pub fn new(max_history: usize) -> Self {
        let (changes, _) = broadcast::channel(65_536);
        Self {
            inner: Arc::new(Mutex::new(Inner {
                rv: 1,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                floor: 0,
                max_history,
                node_ports: BTreeSet::new(),
                next_cluster_ip: 1,
                injected_conflicts: BTreeMap::new(),
                conflicts_until: BTreeMap::new(),
                journal: None,
            })),
            changes,
        }
    }

    /// A store that keeps its state in `dir` (see `journal`): what is
    /// there already is loaded, and every change is written there. Watches
    /// from any resourceVersion before the load get 410 Gone, as from a
    /// restarted kube-apiserver's fresh watch cache. Returns whether
    /// anything was loaded.
    pub fn open(max_history: usize, dir: &std::path::Path) -> std::io::Result<(Self, bool)> {
        let (journal, Loaded { rv, objects }) = Journal::open(dir)?;
        let store = Self::new(max_history);
        let loaded = !objects.is_empty();
        {
            let mut inner = store.lock();
            inner.rv = inner.rv.max(rv);
            inner.floor = inner.rv;
            for obj in objects.values().filter(|o| o["kind"] == "Service") {
                inner.node_ports.extend(
                    services::node_ports(obj)
                        .into_iter()
                        .chain(services::hc_node_port(obj)),
                );
                if let Some(n) = cluster_ip_index(obj) {
                    inner.next_cluster_ip = inner.next_cluster_ip.max(n + 1);
                }
            }
            inner.objects = objects.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
            inner.journal = Some(journal);
        }
        Ok((store, loaded))
    }

    /// Moves resourceVersions on by `by` and forgets all history, as an
    /// etcd restored from a backup with `--bump-revision` and
    /// `--mark-compacted`: objects keep their resourceVersions, every
    /// watch must list again (410 Gone), and nothing handed out later can
    /// be mistaken for a version a client saw before.
    pub fn bump_resource_version(&self, by: u64) {
        let mut inner = self.lock();
        inner.rv += by;
        inner.history.clear();
        inner.floor = inner.rv;
        let rv = inner.rv;
        if let Some(journal) = inner.journal.as_mut()
            && let Err(e) = journal.resource_version(rv)
        {
            tracing::error!(error = %e, "could not write the resourceVersion to the store's journal");
        }
    }

    /// Answers every update of `plural` (of its status only, when
    /// `status_only`) with 409 Conflict for `duration`, as an API server
    /// with another writer winning every race would.
    pub fn refuse_updates(&self, plural: &str, status_only: bool, duration: std::time::Duration) {
        self.lock().conflicts_until.insert(
            plural.to_owned(),
            (std::time::Instant::now() + duration, status_only),
        );
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Forgets all history: watches from any earlier resourceVersion get
    /// 410 Gone, as after an etcd compaction.
    pub fn compact(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.floor = inner.rv;
    }

    /// Answers the next `count` updates of `plural` with 409 Conflict, as
    /// a busy cluster with other writers would.
    pub fn inject_conflicts(&self, plural: &'static str, count: u32) {
        self.lock().injected_conflicts.insert(plural, count);
    }

    fn record(&self, inner: &mut Inner, change: Change) {
        if let Some(journal) = inner.journal.as_mut() {
            let name = meta(&change.object)["name"].as_str().unwrap_or_default();
            let k = key(change.resource, &change.namespace, name);
            let written = match change.kind {
                ChangeType::Deleted => journal.delete(change.rv, &k),
                _ => journal.put_json(change.rv, &k, change.json()),
            };
            if let Err(e) = written {
                tracing::error!(error = %e, "could not write a change to the store's journal");
            }
            if journal.wants_rewrite(inner.objects.len())
                && let Err(e) = journal.rewrite(inner.rv, &inner.objects)
            {
                tracing::error!(error = %e, "could not rewrite the store's journal");
            }
        }
        let change = Arc::new(change);
        inner.history.push_back(change.clone());
        while inner.history.len() > inner.max_history {
            if let Some(dropped) = inner.history.pop_front() {
                inner.floor = dropped.rv;
            }
        }
        let _ = self.changes.send(change);
    }

    /// One object.
    pub fn get(
        &self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&key(resource, namespace, name))
            .map(|obj| Value::clone(obj))
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// Every object of `resource` (in `namespace`, if given), sorted by
    /// namespace and name, with the resourceVersion of the snapshot.
    pub fn list(&self, resource: &'static Resource, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let page = self.page(resource, namespace, None, usize::MAX, |_| true);
        let items = page.items.iter().map(|o| Value::clone(o)).collect();
        (items, page.rv)
    }

    /// One page of a list: up to `limit` objects of `resource` (in
    /// `namespace`, if given) that `keep`, in namespace and name order,
    /// after `after` (the namespace and name the last page ended with).
    /// Only the page's objects are visited, so listing 100,000 Nodes 500 at
    /// a time costs what one list of them costs; none is copied under the
    /// lock, which every write waits for.
    pub fn page(
        &self,
        resource: &'static Resource,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        limit: usize,
        keep: impl Fn(&Value) -> bool,
    ) -> Page {
        use std::ops::Bound;
        let inner = self.lock();
        let key = |ns: &str, name: &str| {
            (
                resource.group,
                resource.plural,
                ns.to_owned(),
                name.to_owned(),
            )
        };
        let start = match (after, namespace) {
            (Some((ns, name)), _) => Bound::Excluded(key(ns, name)),
            (None, Some(ns)) => Bound::Included(key(ns, "")),
            (None, None) => Bound::Included(key("", "")),
        };
        let mut items = Vec::new();
        let mut last = None;
        let mut more = false;
        for ((g, p, ns, name), obj) in inner.objects.range((start, Bound::Unbounded)) {
            if *g != resource.group || *p != resource.plural || namespace.is_some_and(|n| n != ns) {
                break;
            }
            if !keep(obj) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(obj.clone());
            last = Some((ns.clone(), name.clone()));
        }
        Page {
            items,
            rv: inner.rv,
            next: if more { last } else { None },
        }
    }

    /// Whether a list that began at resourceVersion `rv` may go on: not
    /// once the history since then is forgotten (410 Gone, as
    /// kube-apiserver answers a continue token that old).
    pub fn can_continue(&self, rv: u64) -> bool {
        rv >= self.lock().floor
    }

    /// Subscribes to changes after `since`: the changes to replay, then the
    /// live feed. `Err` when `since` is older than the history kept.
    pub fn watch(&self, since: u64) -> Result<Subscription, u64> {
        let inner = self.lock();
        if since < inner.floor {
            return Err(inner.floor);
        }
        let receiver = self.changes.subscribe();
        let replay = inner
            .history
            .iter()
            .filter(|c| c.rv > since)
            .cloned()
            .collect();
        Ok((replay, receiver))
    }

    fn namespace_exists(inner: &Inner, namespace: &str) -> bool {
        inner
            .objects
            .contains_key(&("", "namespaces", String::new(), namespace.to_owned()))
    }

    /// Creates an object.
    pub fn create(
        &self,
        resource: &'static Resource,
        namespace: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        if resource.namespaced && !Self::namespace_exists(&inner, namespace) {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("namespaces \"{namespace}\" not found"),
            ));
        }
        let given_ns = meta(&obj)["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if resource.namespaced && !given_ns.is_empty() && given_ns != namespace {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let mut name = meta(&obj)["name"].as_str().unwrap_or_default().to_owned();
        if name.is_empty() {
            match meta(&obj)["generateName"].as_str() {
                Some(prefix) if !prefix.is_empty() => name = format!("{prefix}{}", suffix()),
                _ => {
                    return Err(ApiError::invalid(
                        resource,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        let k = key(resource, namespace, &name);
        if inner.objects.contains_key(&k) {
            return Err(ApiError {
                details: Some(
                    json!({"name": name, "group": resource.group, "kind": resource.plural}),
                ),
                ..ApiError::new(
                    409,
                    "AlreadyExists",
                    format!("{} \"{name}\" already exists", resource.qualified()),
                )
            });
        }
        if resource.kind == "Service" && resource.group.is_empty() {
            obj["status"] = json!({});
            allocate_service(&mut inner, None, &mut obj)
                .map_err(|e| e.for_object(resource, &name))?;
        }
        inner.rv += 1;
        let rv = inner.rv;
        obj["apiVersion"] = json!(resource.api_version());
        obj["kind"] = json!(resource.kind);
        let m = meta_mut(&mut obj);
        m.insert("name".into(), json!(name));
        if resource.namespaced {
            m.insert("namespace".into(), json!(namespace));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        m.insert("resourceVersion".into(), json!(rv.to_string()));
        m.insert("creationTimestamp".into(), json!(now()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("managedFields");
        let object = Arc::new(obj);
        inner.objects.insert(k, object.clone());
        let obj = Value::clone(&object);
        self.record(
            &mut inner,
            Change {
                rv,
                kind: ChangeType::Added,
                resource,
                namespace: namespace.to_owned(),
                object,
                old: None,
                json: Default::default(),
            },
        );
        Ok(obj)
    }

    /// Replaces an object, or its status when `status` is set, after
    /// `mutate` turned the current object into the desired one. `mutate`
    /// runs under the store's lock, so read-modify-write is atomic.
    pub fn update(
        &self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
        status: bool,
        mutate: impl FnOnce(&Value) -> Result<Value, ApiError>,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let k = key(resource, namespace, name);
        let old = inner
            .objects
            .get(&k)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        if let Some(left) = inner
            .injected_conflicts
            .get_mut(resource.plural)
            .filter(|n| **n > 0)
        {
            *left -= 1;
            return Err(ApiError::conflict(resource, name));
        }
        if inner
            .conflicts_until
            .get(resource.plural)
            .is_some_and(|(until, status_only)| {
                std::time::Instant::now() < *until && (status || !status_only)
            })
        {
            return Err(ApiError::conflict(resource, name));
        }
        let mut new = mutate(&old)?;
        let old_meta = meta(&old).clone();
        let wanted_rv = meta(&new)["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !wanted_rv.is_empty()
            && wanted_rv != old_meta["resourceVersion"].as_str().unwrap_or_default()
        {
            return Err(ApiError::conflict(resource, name));
        }
        // A uid in the request is a precondition, as in the real server.
        if let (Some(want), Some(have)) = (meta(&new)["uid"].as_str(), old_meta["uid"].as_str())
            && want != have
        {
            return Err(ApiError {
                details: Some(
                    json!({"name": name, "group": resource.group, "kind": resource.plural}),
                ),
                ..ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
                    ),
                )
            });
        }
        let new_name = meta(&new)["name"].as_str().unwrap_or(name).to_owned();
        if new_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        if status {
            // The status subresource changes status only.
            let mut merged = Value::clone(&old);
            merged["status"] = new.get("status").cloned().unwrap_or(Value::Null);
            new = merged;
        } else if resource.has_status {
            new["status"] = old.get("status").cloned().unwrap_or(Value::Null);
        }
        if new.get("status") == Some(&Value::Null) {
            new.as_object_mut().expect("object").remove("status");
        }
        if resource.kind == "Service" && resource.group.is_empty() && !status {
            services::prepare_update(&old, &mut new)
                .map_err(|e| ApiError::invalid(resource, name, e))?;
            allocate_service(&mut inner, Some(&old), &mut new)
                .map_err(|e| e.for_object(resource, name))?;
        }
        new["apiVersion"] = json!(resource.api_version());
        new["kind"] = json!(resource.kind);
        {
            let m = meta_mut(&mut new);
            for field in [
                "uid",
                "creationTimestamp",
                "namespace",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(field) {
                    Some(v) => m.insert(field.into(), v.clone()),
                    None => m.remove(field),
                };
            }
            m.insert("name".into(), json!(name));
            m.insert(
                "resourceVersion".into(),
                old_meta["resourceVersion"].clone(),
            );
            m.remove("managedFields");
        }
        if generation_counts(resource, &old, &new) {
            let generation = old_meta["generation"].as_i64().unwrap_or(1) + 1;
            meta_mut(&mut new).insert("generation".into(), json!(generation));
        }
        let deleting = !old_meta["deletionTimestamp"].is_null();
        if deleting && finalizers_empty(&new) {
            // The last finalizer is gone: the object goes.
            inner.objects.remove(&k);
            if resource.kind == "Service" && resource.group.is_empty() {
                release_service(&mut inner, &new);
            }
            inner.rv += 1;
            let rv = inner.rv;
            meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
            let object = Arc::new(new);
            let new = Value::clone(&object);
            self.record(
                &mut inner,
                Change {
                    rv,
                    kind: ChangeType::Deleted,
                    resource,
                    namespace: namespace.to_owned(),
                    object,
                    old: Some(old),
                    json: Default::default(),
                },
            );
            return Ok(new);
        }
        if new == *old {
            // No change, no new resourceVersion and no event.
            return Ok(new);
        }
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(rv.to_string()));
        let object = Arc::new(new);
        inner.objects.insert(k, object.clone());
        let new = Value::clone(&object);
        self.record(
            &mut inner,
            Change {
                rv,
                kind: ChangeType::Modified,
                resource,
                namespace: namespace.to_owned(),
                object,
                old: Some(old),
                json: Default::default(),
            },
        );
        Ok(new)
    }

    /// Deletes an object: at once without finalizers, else it gets a
    /// deletionTimestamp and goes when the last finalizer is removed.
    /// `preconditions` are the uid and resourceVersion the caller expects.
    pub fn delete(
        &self,
        resource: &'static Resource,
        namespace: &str,
        name: &str,
        preconditions: (Option<String>, Option<String>),
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let k = key(resource, namespace, name);
        let old = inner
            .objects
            .get(&k)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        let (uid, rv) = preconditions;
        if uid.is_some_and(|u| Some(u.as_str()) != meta(&old)["uid"].as_str())
            || rv.is_some_and(|r| Some(r.as_str()) != meta(&old)["resourceVersion"].as_str())
        {
            return Err(ApiError::conflict(resource, name));
        }
        inner.rv += 1;
        let rv = inner.rv;
        let mut obj = Value::clone(&old);
        if !finalizers_empty(&old) {
            if !meta(&old)["deletionTimestamp"].is_null() {
                inner.rv -= 1;
                return Ok(obj);
            }
            let m = meta_mut(&mut obj);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            let object = Arc::new(obj);
            inner.objects.insert(k, object.clone());
            let obj = Value::clone(&object);
            self.record(
                &mut inner,
                Change {
                    rv,
                    kind: ChangeType::Modified,
                    resource,
                    namespace: namespace.to_owned(),
                    object,
                    old: Some(old),
                    json: Default::default(),
                },
            );
            return Ok(obj);
        }
        inner.objects.remove(&k);
        if resource.kind == "Service" {
            release_service(&mut inner, &old);
        }
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let object = Arc::new(obj);
        let obj = Value::clone(&object);
        self.record(
            &mut inner,
            Change {
                rv,
                kind: ChangeType::Deleted,
                resource,
                namespace: namespace.to_owned(),
                object,
                old: Some(old),
                json: Default::default(),
            },
        );
        Ok(obj)
    }
}

const NODE_PORTS: std::ops::RangeInclusive<i64> = 30000..=32767;

fn next_node_port(inner: &mut Inner) -> Result<i64, ApiError> {
    let port = NODE_PORTS
        .clone()
        .find(|p| !inner.node_ports.contains(p))
        .ok_or_else(|| ApiError::new(500, "InternalError", "no node ports left"))?;
    inner.node_ports.insert(port);
    Ok(port)
}

/// The defaults and allocations the real API server makes for a Service
/// it creates, or updates from `old` (after `services::prepare_update`):
/// the defaults (`services::default`), IP families and a cluster IP
/// unless it is an ExternalName, node ports for NodePort and
/// LoadBalancer (unless `allocateLoadBalancerNodePorts` is false) and a
/// health check node port for a LoadBalancer with
/// `externalTrafficPolicy: Local`. Node ports the Service asks for that
/// another holds are refused; those it held and no longer has are
/// released.
fn allocate_service(
    inner: &mut Inner,
    old: Option<&Value>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    if !obj["spec"].is_object() {
        return Err(ApiError::bad_request("spec is required"));
    }
    services::default(obj);
    services::validate(obj).map_err(|e| ApiError::new(422, "Invalid", e))?;
    let needs_cluster_ip = services::needs_cluster_ip(obj);
    let spec = obj["spec"].as_object_mut().expect("an object");
    if needs_cluster_ip {
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
        let unset = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v == "" || v == &json!([]));
        if unset(spec.get("clusterIP")) {
            let n = inner.next_cluster_ip;
            inner.next_cluster_ip += 1;
            let ip = format!("10.96.{}.{}", n / 250, n % 250 + 1);
            spec.insert("clusterIP".into(), json!(ip));
            spec.insert("clusterIPs".into(), json!([ip]));
        } else if unset(spec.get("clusterIPs")) {
            let ip = spec["clusterIP"].clone();
            spec.insert("clusterIPs".into(), json!([ip]));
        }
    }
    // The node ports this Service holds already, and those it asks for.
    let held: BTreeSet<i64> = old
        .map(|o| {
            services::node_ports(o)
                .into_iter()
                .chain(services::hc_node_port(o))
                .collect()
        })
        .unwrap_or_default();
    let ports = services::node_ports(obj);
    for (i, np) in ports.iter().enumerate() {
        if !held.contains(np) && (inner.node_ports.contains(np) || ports[..i].contains(np)) {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "spec.ports[{i}].nodePort: Invalid value: {np}: provided port is already allocated"
                ),
            ));
        }
    }
    let hc = services::hc_node_port(obj);
    if let Some(hc) = hc.filter(|hc| !held.contains(hc) && inner.node_ports.contains(hc)) {
        return Err(ApiError::new(
            422,
            "Invalid",
            format!(
                "spec.healthCheckNodePort: Invalid value: {hc}: provided port is already allocated"
            ),
        ));
    }
    inner.node_ports.extend(ports.iter().copied().chain(hc));
    let allocate = services::needs_node_port(obj)
        && obj["spec"]["allocateLoadBalancerNodePorts"] != json!(false);
    if allocate && let Some(ports) = obj["spec"]["ports"].as_array_mut() {
        for port in ports {
            let p = port
                .as_object_mut()
                .ok_or_else(|| ApiError::bad_request("ports must be objects"))?;
            if p.get("nodePort").and_then(Value::as_i64).unwrap_or(0) == 0 {
                p.insert("nodePort".into(), json!(next_node_port(inner)?));
            }
        }
    }
    if services::needs_hc_node_port(obj) && hc.is_none() {
        obj["spec"]["healthCheckNodePort"] = json!(next_node_port(inner)?);
    }
    let now: BTreeSet<i64> = services::node_ports(obj)
        .into_iter()
        .chain(services::hc_node_port(obj))
        .collect();
    for gone in held.difference(&now) {
        inner.node_ports.remove(gone);
    }
    Ok(())
}

/// The index of the cluster IP `allocate_service` gave `svc`, if it is
/// one it gives.
fn cluster_ip_index(svc: &Value) -> Option<u32> {
    let ip = svc["spec"]["clusterIP"].as_str()?;
    let (a, b) = ip.strip_prefix("10.96.")?.split_once('.')?;
    let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
    Some(a * 250 + b.checked_sub(1)?)
}

fn release_service(inner: &mut Inner, obj: &Value) {
    if let Some(ports) = obj["spec"]["ports"].as_array() {
        for p in ports {
            if let Some(np) = p["nodePort"].as_i64() {
                inner.node_ports.remove(&np);
            }
        }
    }
    if let Some(hc) = obj["spec"]["healthCheckNodePort"].as_i64() {
        inner.node_ports.remove(&hc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_custom_resource_s_generation_counts_every_change_but_metadata_and_status() {
        let store = Store::new(100);
        let find = |plural| super::super::resources::find("snapshot.storage.k8s.io", "v1", plural);
        let classes = find("volumesnapshotclasses").unwrap();
        let class = json!({"metadata": {"name": "ebs"}, "driver": "ebs.csi.aws.com", "deletionPolicy": "Delete"});
        store.create(classes, "", class).unwrap();
        let retain = store
            .update(classes, "", "ebs", false, |old| {
                let mut new = old.clone();
                new["deletionPolicy"] = json!("Retain");
                Ok(new)
            })
            .unwrap();
        assert_eq!(retain["metadata"]["generation"], 2);
        let contents = find("volumesnapshotcontents").unwrap();
        let content = json!({"metadata": {"name": "c"}, "spec": {"driver": "ebs.csi.aws.com"}});
        store.create(contents, "", content).unwrap();
        let ready = store
            .update(contents, "", "c", true, |old| {
                let mut new = old.clone();
                new["status"] = json!({"readyToUse": true});
                Ok(new)
            })
            .unwrap();
        assert_eq!(ready["status"]["readyToUse"], true);
        assert_eq!(ready["metadata"]["generation"], 1);
    }

    #[test]
    fn dates_are_rfc3339() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_779), (2026, 11, 22));
        assert!(now().ends_with('Z') && now().len() == 20);
    }
}
