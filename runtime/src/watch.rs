//! Following a reflector's stream the way every controller does: until
//! shutdown, telling the controller which objects changed in a way it
//! cares about (by a fingerprint it chooses), which went away, and when the
//! first full list arrived (caches synced).

use std::collections::HashMap;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

/// What happened to the watched objects.
pub enum Seen<'a, K> {
    /// An object is new, or its fingerprint changed.
    Changed(&'a K),
    /// An object was written but its fingerprint is the same.
    Unchanged(&'a K),
    /// An object was deleted.
    Deleted(&'a K),
    /// The first (or a renewed) full list is in: the cache is synced.
    Synced,
}

fn key<K: Resource>(obj: &K) -> (String, String) {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Drives `stream` until it ends or `shutdown`, calling `on` for each
/// event. Errors are logged; the stream's own backoff retries.
pub async fn follow<K, V>(
    what: &str,
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    shutdown: CancellationToken,
    fingerprint: impl Fn(&K) -> V,
    mut on: impl FnMut(Seen<'_, K>),
) where
    K: Resource,
    V: PartialEq,
{
    let mut seen: HashMap<(String, String), V> = HashMap::new();
    let mut stream = std::pin::pin!(stream);
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = shutdown.cancelled() => return,
        };
        match event {
            Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                let print = fingerprint(&obj);
                let changed = seen.get(&key(&obj)) != Some(&print);
                seen.insert(key(&obj), print);
                on(if changed {
                    Seen::Changed(&obj)
                } else {
                    Seen::Unchanged(&obj)
                });
            }
            Some(Ok(watcher::Event::Delete(obj))) => {
                seen.remove(&key(&obj));
                on(Seen::Deleted(&obj));
            }
            Some(Ok(watcher::Event::InitDone)) => on(Seen::Synced),
            Some(Ok(watcher::Event::Init)) => {}
            Some(Err(e)) => tracing::warn!(error = %e, "{what} watch failed; retrying"),
            None => return,
        }
    }
}

/// A cache of every `K` and the stream that fills it: managed fields are
/// stripped (large clusters make them matter) and failures back off. Run
/// the stream with [`follow`] on every replica, so standbys stay warm.
pub fn cached<K>(
    api: kube::Api<K>,
) -> (
    kube::runtime::reflector::Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    cached_with(api, |_| {})
}

/// The cached Nodes of every controller: [`cached`], without what no
/// controller reads (container images and volumes, most of a real Node's
/// size). Never write a cached Node back; read it from the API first.
pub fn cached_nodes(
    api: kube::Api<k8s_openapi::api::core::v1::Node>,
) -> (
    kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>,
    impl Stream<Item = Result<watcher::Event<k8s_openapi::api::core::v1::Node>, watcher::Error>> + Send,
) {
    cached_with(api, |node| {
        if let Some(status) = node.status.as_mut() {
            status.images = None;
            status.volumes_attached = None;
            status.volumes_in_use = None;
        }
    })
}

/// [`cached`], with `slim` applied to every object before it is kept.
pub fn cached_with<K>(
    api: kube::Api<K>,
    slim: impl Fn(&mut K) + Send + Sync + 'static,
) -> (
    kube::runtime::reflector::Store<K>,
    impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    use kube::ResourceExt;
    use kube::runtime::WatchStreamExt;
    let (store, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .modify(move |obj| {
                obj.managed_fields_mut().clear();
                slim(obj);
            })
            .default_backoff(),
    );
    (store, stream)
}
