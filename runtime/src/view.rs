//! Caches of compact views of watched objects: each controller keeps of a
//! Node only what it reads, in a struct of its own, rather than the whole
//! object. A `k8s_openapi` Node is 1.5 KB before a single string of it, and
//! a kubelet's holds about 9 KB of JSON; a view is a few hundred bytes, so
//! a controller holds 100,000 Nodes in tens of MiB.
//!
//! [`follow`] drives a watcher stream into a [`Views`]: each object is
//! turned into its view as it arrives and dropped, and the controller is
//! told which views changed. A relist (after 410 Gone, or a restarted API
//! server) updates the views in place and then drops those not listed
//! again, so it never holds the old and the new list side by side, as
//! kube-rs's reflector store does.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// What happened to a watched object's view.
pub enum Seen<'a, T> {
    /// An object is new (`before` is `None`), or its view changed from
    /// `before`.
    Changed { view: &'a T, before: Option<&'a T> },
    /// An object was written but its view is the same.
    Unchanged(&'a T),
    /// An object was deleted (its last view).
    Deleted(&'a T),
    /// The first (or a renewed) full list is in: the cache is synced.
    Synced,
}

struct Inner<T> {
    /// Each object's view by `namespace/name` (`name` when cluster-scoped),
    /// with the list it was last seen in.
    views: HashMap<Box<str>, (Arc<T>, u64)>,
    /// The current list: one more at each relist.
    list: u64,
}

/// The views of every object of a kind; cheap to clone.
pub struct Views<T> {
    inner: Arc<RwLock<Inner<T>>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl<T> Clone for Views<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<T> Default for Views<T> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Inner {
                views: HashMap::new(),
                list: 0,
            })),
            ready: tokio::sync::watch::channel(false).0,
        }
    }
}

/// The key of an object: `namespace/name`, or `name` when cluster-scoped.
pub fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

impl<T> Views<T> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner<T>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner<T>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The view of the object with `key` (see [`key_of`]).
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.read().views.get(key).map(|(v, _)| v.clone())
    }

    /// Every view.
    pub fn state(&self) -> Vec<Arc<T>> {
        self.read().views.values().map(|(v, _)| v.clone()).collect()
    }

    /// Calls `f` with each object's key (see [`key_of`]) and view, under
    /// the cache's read lock: `f` must not wait.
    pub fn each(&self, mut f: impl FnMut(&str, &T)) {
        for (key, (view, _)) in &self.read().views {
            f(key, view);
        }
    }

    /// How many objects there are.
    pub fn len(&self) -> usize {
        self.read().views.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the first full list is in; an error if the watch ended
    /// first.
    pub async fn wait_until_ready(&self) -> anyhow::Result<()> {
        let mut ready = self.ready.subscribe();
        ready
            .wait_for(|r| *r)
            .await
            .map(drop)
            .map_err(|_| anyhow::anyhow!("the watch ended before its first list"))
    }
}

impl<T: PartialEq> Views<T> {
    /// Puts `view` under `key`: the view kept, whether it changed, and
    /// what it replaced.
    fn put(&self, key: &str, view: T) -> (Arc<T>, bool, Option<Arc<T>>) {
        let mut inner = self.write();
        let list = inner.list;
        match inner.views.get_mut(key) {
            Some((old, seen)) => {
                *seen = list;
                if **old == view {
                    return (old.clone(), false, None);
                }
                let before = std::mem::replace(old, Arc::new(view));
                (old.clone(), true, Some(before))
            }
            None => {
                let view = Arc::new(view);
                inner.views.insert(key.into(), (view.clone(), list));
                (view, true, None)
            }
        }
    }

    /// Starts a relist: what it does not list again is dropped at its end.
    fn relist(&self) {
        self.write().list += 1;
    }

    /// Ends a relist: drops the views it did not list; returns them.
    fn sweep(&self) -> Vec<Arc<T>> {
        let mut inner = self.write();
        let list = inner.list;
        let mut gone = Vec::new();
        inner.views.retain(|_, (v, seen)| {
            let keep = *seen == list;
            if !keep {
                gone.push(v.clone());
            }
            keep
        });
        gone
    }

    /// Replaces each view `f` gives a new one for (a controller that
    /// learns it needs less of every object).
    pub fn rewrite(&self, f: impl Fn(&T) -> Option<T>) {
        for (view, _) in self.write().views.values_mut() {
            if let Some(new) = f(view) {
                *view = Arc::new(new);
            }
        }
    }

    fn remove(&self, key: &str) -> Option<Arc<T>> {
        self.write().views.remove(key).map(|(v, _)| v)
    }
}

/// A reference to the Node `name` (`uid`), for the events a controller
/// publishes about it from its view.
pub fn node_reference(name: &str, uid: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// Drives `stream` (a watcher's) into `views` until it ends or `shutdown`:
/// each object becomes `view(obj)`, and `on` hears what changed. A relist
/// reports the objects it no longer finds as deleted. Errors are logged;
/// the stream's own backoff retries.
pub async fn follow<K, T>(
    what: &str,
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    views: Views<T>,
    shutdown: CancellationToken,
    view: impl Fn(&K) -> T,
    mut on: impl FnMut(Seen<'_, T>),
) where
    K: Resource,
    T: PartialEq,
{
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = shutdown.cancelled() => return,
        };
        match event {
            Some(Ok(watcher::Event::Init)) => views.relist(),
            Some(Ok(e @ (watcher::Event::Apply(_) | watcher::Event::InitApply(_)))) => {
                let (watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = e else {
                    continue;
                };
                let (v, changed, before) = views.put(&key_of(&obj), view(&obj));
                on(if changed {
                    Seen::Changed {
                        view: &v,
                        before: before.as_deref(),
                    }
                } else {
                    Seen::Unchanged(&v)
                });
            }
            Some(Ok(watcher::Event::Delete(obj))) => {
                if let Some(v) = views.remove(&key_of(&obj)) {
                    on(Seen::Deleted(&v));
                }
            }
            Some(Ok(watcher::Event::InitDone)) => {
                for v in views.sweep() {
                    on(Seen::Deleted(&v));
                }
                views.ready.send_replace(true);
                on(Seen::Synced);
            }
            Some(Err(e)) => tracing::warn!(error = %e, "{what} watch failed; retrying"),
            None => return,
        }
    }
}

/// A watcher of every `K`, retried as the caches' watches are (see
/// `watch`), for [`follow`].
pub fn watch<K>(
    api: kube::Api<K>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    watch_with(api, watcher::Config::default())
}

/// [`watch`] of the `K` that `config` selects (a label selector).
pub fn watch_with<K>(
    api: kube::Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    use kube::runtime::WatchStreamExt;
    watcher(api, config).backoff(crate::watch::watch_backoff())
}

/// Strings many views share (label keys and values, zones, reasons), kept
/// once: a label like `topology.kubernetes.io/zone=eu-west-1a` on 100,000
/// Nodes is one string, not 200,000. Strings no view holds any more are
/// let go now and then.
#[derive(Default)]
pub struct Interner {
    strings: Mutex<(HashSet<Arc<str>>, usize)>,
}

impl Interner {
    /// The shared copy of `s`.
    pub fn intern(&self, s: &str) -> Arc<str> {
        let mut guard = self.strings.lock().unwrap_or_else(|e| e.into_inner());
        let (set, purge_at) = &mut *guard;
        if let Some(known) = set.get(s) {
            return known.clone();
        }
        if set.len() >= *purge_at {
            // Those only the interner holds are unused.
            set.retain(|s| Arc::strong_count(s) > 1);
            *purge_at = (set.len() * 2).max(1024);
        }
        let new: Arc<str> = s.into();
        set.insert(new.clone());
        new
    }

    /// How many strings are kept.
    pub fn len(&self) -> usize {
        self.strings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;

    fn node(name: &str, label: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.labels_mut().insert("l".into(), label.into());
        n
    }

    fn events(
        list: Vec<watcher::Event<Node>>,
    ) -> impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>> {
        futures::stream::iter(list.into_iter().map(Ok))
    }

    #[tokio::test]
    async fn views_change_only_with_what_they_keep_and_a_relist_drops_the_unlisted() {
        use watcher::Event::*;
        let views = Views::<(String, String)>::default();
        let seen = std::sync::Mutex::new(Vec::new());
        let stream = events(vec![
            Init,
            InitApply(node("a", "1")),
            InitApply(node("b", "1")),
            InitDone,
            // A write the view does not keep (an annotation), then one it does.
            Apply({
                let mut n = node("a", "1");
                n.annotations_mut().insert("x".into(), "y".into());
                n
            }),
            Apply(node("a", "2")),
            // A relist that no longer has b.
            Init,
            InitApply(node("a", "2")),
            InitDone,
        ]);
        let view = |n: &Node| (n.name_any(), n.labels()["l"].clone());
        follow(
            "node",
            stream,
            views.clone(),
            CancellationToken::new(),
            view,
            |s| {
                seen.lock().unwrap().push(match s {
                    Seen::Changed { view: v, .. } => format!("changed {}={}", v.0, v.1),
                    Seen::Unchanged(v) => format!("same {}", v.0),
                    Seen::Deleted(v) => format!("deleted {}", v.0),
                    Seen::Synced => "synced".into(),
                })
            },
        )
        .await;
        assert_eq!(
            seen.into_inner().unwrap(),
            [
                "changed a=1",
                "changed b=1",
                "synced",
                "same a",
                "changed a=2",
                "same a",
                "deleted b",
                "synced"
            ]
        );
        assert_eq!(views.len(), 1);
        assert_eq!(views.get("a").unwrap().1, "2");
        views.wait_until_ready().await.unwrap();
        // Rewritten where asked, kept where not.
        views.rewrite(|(name, label)| (label == "2").then(|| (name.clone(), "-".into())));
        assert_eq!(views.get("a").unwrap().1, "-");
        views.rewrite(|_| None);
        assert_eq!(views.get("a").unwrap().1, "-");
    }

    #[test]
    fn interned_strings_are_shared_and_unused_ones_go() {
        let interner = Interner::default();
        let a = interner.intern("eu-west-1a");
        let b = interner.intern("eu-west-1a");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        for i in 0..2000 {
            let _ = interner.intern(&format!("node-{i}"));
        }
        assert!(interner.len() < 2000, "unused strings were let go");
    }
}
