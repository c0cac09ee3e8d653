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
    use kube::ResourceExt;
    use kube::runtime::WatchStreamExt;
    let (store, writer) = kube::runtime::reflector::store();
    let stream = kube::runtime::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .modify(|obj| obj.managed_fields_mut().clear())
            .backoff(watch_backoff()),
    );
    (store, stream)
}

/// How a failed watch or list is retried: after 0.5 s, doubling to 5 s
/// (each delay jittered down by up to a half), from 0.5 s again after a
/// success. client-go's reflector (and kube-rs's default) waits up to 30 s,
/// so after an API server outage of a minute a controller stays blind for
/// up to another half minute once it is back; a controller's few watches
/// retried every 5 s cost an API server nothing.
pub(crate) fn watch_backoff() -> WatchBackoff {
    WatchBackoff {
        next: WATCH_RETRY_MIN,
    }
}

const WATCH_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(500);
const WATCH_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

pub(crate) struct WatchBackoff {
    next: std::time::Duration,
}

impl Iterator for WatchBackoff {
    type Item = std::time::Duration;

    fn next(&mut self) -> Option<std::time::Duration> {
        use std::hash::{BuildHasher, Hasher};
        let delay = self.next;
        self.next = (self.next * 2).min(WATCH_RETRY_MAX);
        // A random share in [0.5, 1.0) from the standard library's seeded
        // hasher, so replicas that failed together retry apart.
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let share = 0.5 + (random % 1000) as f64 / 2000.0;
        Some(delay.mul_f64(share))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_RETRY_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_retries_double_to_five_seconds_and_start_over_after_a_success() {
        use kube::runtime::utils::Backoff;
        let mut b = watch_backoff();
        let delays: Vec<f64> = (0..6).map(|_| b.next().unwrap().as_secs_f64()).collect();
        for (delay, full) in delays.iter().zip([0.5, 1.0, 2.0, 4.0, 5.0, 5.0]) {
            assert!((full / 2.0..full).contains(delay), "{delays:?}");
        }
        b.reset();
        assert!(b.next().unwrap() < WATCH_RETRY_MIN);
    }
}
