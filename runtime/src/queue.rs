//! A work queue of object keys, as controllers use: a key is queued at most
//! once; a key added while a worker holds it is processed again once that
//! worker is done (never by two workers at once); failures back off
//! exponentially per key; and keys can come back after a delay. It
//! remembers, for each key that failed or waits, what went wrong and when
//! it is tried next, for an operator who asks ([`WorkQueue::status`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::Notify;

/// How deep a controller's queue is and how long keys wait in it.
#[derive(Clone, Debug)]
pub struct QueueMetrics {
    /// Keys waiting now.
    pub depth: Gauge,
    /// Time from a key's queueing to a worker taking it.
    pub wait: Histogram,
}

impl QueueMetrics {
    /// Registers `queue_depth` and `queue_wait_seconds` in `registry`
    /// (under the controller's prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            depth: Gauge::default(),
            wait: Histogram::new(crate::metrics::wait_buckets()),
        };
        registry.register(
            "queue_depth",
            "Keys waiting in the work queue",
            m.depth.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time from a key's queueing to a worker taking it",
            m.wait.clone(),
        );
        m
    }
}

/// Per-key exponential backoff bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 = first).
    pub fn delay(&self, failures: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(30))
            .min(self.max)
    }
}

/// Why a key is not done: it failed, or the cloud asked to come back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trouble {
    /// Failures in a row; a wait neither counts nor resets them.
    pub failures: u32,
    /// Whether the key waits for the cloud (its last sync was told to come
    /// back later) rather than failed.
    pub waiting: bool,
    /// The last failure's metric label, or what it waits for (e.g.
    /// `provisioning`); empty when not said.
    pub kind: String,
    /// The last failure's message, or the cloud's word on the wait.
    pub message: String,
    /// When this trouble began (the first failure in a row, or the
    /// first wait of this kind).
    pub since: Option<SystemTime>,
    /// When the key is tried next.
    pub next_try: Option<SystemTime>,
}

/// A key's state, as the work queue knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyStatus {
    /// Waiting for a worker.
    pub queued: bool,
    /// A worker holds it now.
    pub in_flight: bool,
    /// What failed or what it waits for; `None` after a success.
    pub trouble: Option<Trouble>,
}

/// The whole queue at a glance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Keys waiting for a worker.
    pub depth: usize,
    /// Keys workers hold.
    pub in_flight: usize,
    /// Keys whose last sync failed.
    pub failing: usize,
    /// Of those, keys that failed [`REPEATED`] times or more in a row.
    pub failing_repeatedly: usize,
    /// Keys waiting for the cloud, not failing.
    pub waiting: usize,
    /// How long the current term's first pass took: from the queue's
    /// (re)opening until it first had no key waiting or held, every key
    /// queued at the start tried once (`None` while it is not done, or
    /// before the first term).
    pub first_pass: Option<Duration>,
}

/// Failures in a row after which a key's trouble is no passing one.
pub const REPEATED: u32 = 3;

struct Inner<K> {
    /// Keys in order, each with when it was queued.
    queue: VecDeque<(K, Instant)>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    dirty: HashSet<K>,
    /// Keys that failed or wait, until a success forgets them.
    troubles: HashMap<K, Trouble>,
    closed: bool,
    /// When the current term opened the queue, and when its first pass
    /// was done.
    opened: Option<(Instant, Option<Duration>)>,
}

impl<K> Inner<K> {
    /// Notes the first pass done when nothing waits or is held.
    fn note_idle(&mut self) {
        if !self.closed
            && self.queue.is_empty()
            && self.processing.is_empty()
            && let Some((at, done @ None)) = &mut self.opened
        {
            *done = Some(at.elapsed());
        }
    }
}

/// The queue; cheap to clone.
pub struct WorkQueue<K> {
    inner: Arc<Mutex<Inner<K>>>,
    ready: Arc<Notify>,
    backoff: Backoff,
    metrics: Option<QueueMetrics>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            ready: self.ready.clone(),
            backoff: self.backoff,
            metrics: self.metrics.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue with `backoff` for failures.
    pub fn new(backoff: Backoff) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                troubles: HashMap::new(),
                closed: false,
                opened: None,
            })),
            ready: Arc::new(Notify::new()),
            backoff,
            metrics: None,
        }
    }

    /// Reports depth and waits into `metrics`.
    pub fn with_metrics(mut self, metrics: QueueMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` now.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.closed || inner.queued.contains(&key) {
            return;
        }
        if inner.processing.contains(&key) {
            inner.dirty.insert(key);
            return;
        }
        inner.queued.insert(key.clone());
        inner.queue.push_back((key, Instant::now()));
        if let Some(m) = &self.metrics {
            m.depth.set(inner.queue.len() as i64);
        }
        drop(inner);
        self.ready.notify_one();
    }

    /// Queues `key` after `delay`.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }

    /// A failed sync of `key`: counts it in `errors` under `kind`,
    /// remembers `message`, and queues it after its backoff; returns the
    /// delay.
    pub fn retry_failed(
        &self,
        key: K,
        errors: &crate::metrics::ErrorCounts,
        kind: &'static str,
        message: String,
    ) -> Duration {
        errors
            .get_or_create(&crate::metrics::ErrorLabels { error: kind })
            .inc();
        self.fail(key, kind, message)
    }

    /// Counts a failure of `key` and queues it after its backoff; returns
    /// the delay.
    pub fn add_failed(&self, key: K) -> Duration {
        self.fail(key, "", String::new())
    }

    fn fail(&self, key: K, kind: &str, message: String) -> Duration {
        let now = SystemTime::now();
        let delay = {
            let mut inner = self.lock();
            let trouble = inner.troubles.entry(key.clone()).or_default();
            if trouble.failures == 0 {
                trouble.since = Some(now);
            }
            trouble.failures += 1;
            trouble.waiting = false;
            let delay = self.backoff.delay(trouble.failures);
            trouble.kind = kind.to_owned();
            trouble.message = message;
            trouble.next_try = Some(now + delay);
            delay
        };
        self.add_after(key, delay);
        delay
    }

    /// `key` waits for the cloud (`kind`, e.g. `provisioning`, with the
    /// cloud's `message`): it is queued after `delay`, not counted as a
    /// failure (nor does it reset the failures' backoff); a wait of the
    /// same kind keeps its start.
    pub fn wait(&self, key: K, kind: &str, message: String, delay: Duration) {
        let now = SystemTime::now();
        {
            let mut inner = self.lock();
            let trouble = inner.troubles.entry(key.clone()).or_default();
            if !trouble.waiting || trouble.kind != kind {
                trouble.since = Some(now);
            }
            trouble.waiting = true;
            trouble.kind = kind.to_owned();
            trouble.message = message;
            trouble.next_try = Some(now + delay);
        }
        self.add_after(key, delay);
    }

    /// Forgets the failures and waits of `key` (after a success).
    pub fn forget(&self, key: &K) {
        self.lock().troubles.remove(key);
    }

    /// What the queue knows of `key`.
    pub fn status(&self, key: &K) -> KeyStatus {
        let inner = self.lock();
        KeyStatus {
            queued: inner.queued.contains(key),
            in_flight: inner.processing.contains(key),
            trouble: inner.troubles.get(key).cloned(),
        }
    }

    /// Up to `max` keys that fail or wait, those in trouble longest first,
    /// and how many there are in all.
    pub fn troubled(&self, max: usize) -> (Vec<(K, Trouble)>, usize) {
        let inner = self.lock();
        let mut all: Vec<_> = inner
            .troubles
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        let total = all.len();
        all.sort_by_key(|(_, t)| t.since);
        all.truncate(max);
        (all, total)
    }

    /// Depth, keys in flight, and keys failing or waiting.
    pub fn stats(&self) -> QueueStats {
        let inner = self.lock();
        let failing = || inner.troubles.values().filter(|t| !t.waiting);
        QueueStats {
            depth: inner.queue.len(),
            in_flight: inner.processing.len(),
            failing: failing().count(),
            failing_repeatedly: failing().filter(|t| t.failures >= REPEATED).count(),
            waiting: inner.troubles.values().filter(|t| t.waiting).count(),
            first_pass: inner.opened.and_then(|(_, done)| done),
        }
    }

    /// The next key to work on; `None` once the queue is closed. The
    /// caller must call [`Self::done`] with it.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.ready.notified();
            {
                let mut inner = self.lock();
                if let Some((key, queued_at)) = inner.queue.pop_front() {
                    inner.queued.remove(&key);
                    inner.processing.insert(key.clone());
                    let more = !inner.queue.is_empty();
                    if let Some(m) = &self.metrics {
                        m.depth.set(inner.queue.len() as i64);
                        m.wait.observe(queued_at.elapsed().as_secs_f64());
                    }
                    drop(inner);
                    if more {
                        // Let another worker take the next one.
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
                if inner.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// The next key and, without waiting, up to `max - 1` more behind it:
    /// a batch for a worker that handles several keys in one go; `None`
    /// once the queue is closed. The caller must call [`Self::done`] with
    /// every one.
    pub async fn next_batch(&self, max: usize) -> Option<Vec<K>> {
        let first = self.next().await?;
        let mut batch = vec![first];
        batch.extend(self.take(max.saturating_sub(1), |_| true));
        Some(batch)
    }

    /// Takes, without waiting, up to `max` more waiting keys that `want`
    /// (oldest first), for a worker that handles several keys in one go.
    /// Each is held as if [`Self::next`] had handed it out: the caller must
    /// call [`Self::done`] with every one.
    pub fn take(&self, max: usize, want: impl Fn(&K) -> bool) -> Vec<K> {
        let mut inner = self.lock();
        let mut taken = Vec::new();
        // Keys passed over go back in front, in their order.
        let mut passed = Vec::new();
        while taken.len() < max {
            let Some((key, queued_at)) = inner.queue.pop_front() else {
                break;
            };
            if !want(&key) {
                passed.push((key, queued_at));
                continue;
            }
            if let Some(m) = &self.metrics {
                m.wait.observe(queued_at.elapsed().as_secs_f64());
            }
            inner.queued.remove(&key);
            inner.processing.insert(key.clone());
            taken.push(key);
        }
        for entry in passed.into_iter().rev() {
            inner.queue.push_front(entry);
        }
        if let Some(m) = &self.metrics {
            m.depth.set(inner.queue.len() as i64);
        }
        taken
    }

    /// Marks `key` done; if it was added meanwhile, it is queued again.
    pub fn done(&self, key: &K) {
        let again = {
            let mut inner = self.lock();
            inner.processing.remove(key);
            let again = inner.dirty.remove(key);
            if !again {
                inner.note_idle();
            }
            again
        };
        if again {
            self.add(key.clone());
        }
    }

    /// Keys waiting now.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no key waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes keys again after [`Self::close`], for a new term of
    /// leadership; what was queued or remembered stays. The term's first
    /// pass is timed from here (see [`QueueStats::first_pass`]).
    pub fn reopen(&self) {
        let mut inner = self.lock();
        inner.closed = false;
        inner.opened = Some((Instant::now(), None));
    }

    /// Notes the first pass done if the term's start queued nothing.
    pub fn started(&self) {
        self.lock().note_idle();
    }

    /// Stops handing out keys; workers' `next` returns `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff {
            base: Duration::from_millis(5),
            max: Duration::from_millis(40),
        })
    }

    #[tokio::test]
    async fn keys_are_deduplicated_and_come_out_in_order() {
        let q = queue();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
    }

    #[tokio::test]
    async fn a_key_added_while_processing_comes_back_after_done() {
        let q = queue();
        q.add("a");
        let key = q.next().await.unwrap();
        q.add("a");
        assert!(q.is_empty(), "not handed to a second worker while held");
        q.done(&key);
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_up_to_the_cap() {
        let q = queue();
        let delays: Vec<_> = (0..5).map(|_| q.add_failed("a")).collect();
        let ms: Vec<_> = delays.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [5, 10, 20, 40, 40]);
        q.forget(&"a");
        assert_eq!(q.add_failed("a"), Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_terms_first_pass_lasts_until_every_key_it_started_with_was_tried() {
        let q = queue();
        q.reopen();
        q.add("a");
        q.add("b");
        q.started();
        let a = q.next().await.unwrap();
        q.done(&a);
        assert_eq!(q.stats().first_pass, None, "b is still queued");
        let b = q.next().await.unwrap();
        // Added while held: it comes back, so the pass is not done.
        q.add("b");
        q.done(&b);
        assert_eq!(q.stats().first_pass, None);
        let b = q.next().await.unwrap();
        q.done(&b);
        let first = q.stats().first_pass.expect("done");
        q.add("c");
        let c = q.next().await.unwrap();
        q.done(&c);
        assert_eq!(q.stats().first_pass, Some(first), "the first pass only");
        // A new term that starts with nothing to do is done at once.
        q.close();
        q.reopen();
        assert_eq!(q.stats().first_pass, None);
        q.started();
        assert!(q.stats().first_pass.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_trouble_says_why_and_when_it_is_tried_next_until_a_success() {
        let q = queue();
        let errors = crate::metrics::ErrorCounts::default();
        q.retry_failed("a", &errors, "unavailable", "the cloud is down".into());
        q.retry_failed("a", &errors, "unavailable", "still down".into());
        let trouble = q.status(&"a").trouble.unwrap();
        assert_eq!(
            (
                trouble.failures,
                trouble.kind.as_str(),
                trouble.message.as_str()
            ),
            (2, "unavailable", "still down")
        );
        let next = trouble
            .next_try
            .unwrap()
            .duration_since(trouble.since.unwrap())
            .unwrap();
        assert!(next >= Duration::from_millis(10), "{next:?}");
        q.wait(
            "b",
            "provisioning",
            "ready in 30s".into(),
            Duration::from_secs(1),
        );
        let (listed, total) = q.troubled(1);
        assert_eq!((listed.len(), total), (1, 2));
        assert_eq!(
            q.stats(),
            QueueStats {
                depth: 0,
                in_flight: 0,
                failing: 1,
                failing_repeatedly: 0,
                waiting: 1,
                first_pass: None,
            }
        );
        // A wait after failures is a new trouble that keeps their count
        // (the next failure backs off further).
        q.wait(
            "a",
            "provisioning",
            "ready soon".into(),
            Duration::from_secs(1),
        );
        let trouble = q.status(&"a").trouble.unwrap();
        assert!(trouble.waiting && trouble.failures == 2);
        assert_eq!(q.add_failed("a"), Duration::from_millis(20));
        q.forget(&"a");
        assert_eq!(q.status(&"a").trouble, None);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let status = q.status(&"b");
        assert!(status.queued && !status.in_flight);
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_arrive_after_their_delay() {
        let q = queue();
        q.add_after("a", Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(q.is_empty());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test]
    async fn a_worker_takes_more_keys_it_wants_and_leaves_the_rest_in_order() {
        let q = queue();
        for key in ["a", "b", "c", "d", "e"] {
            q.add(key);
        }
        let first = q.next().await.unwrap();
        let more = q.take(2, |k| *k != "b");
        assert_eq!((first, more.clone()), ("a", vec!["c", "d"]));
        assert_eq!(q.len(), 2);
        // Taken keys are held: added again, they wait for done.
        q.add("c");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.next().await, Some("e"));
        for key in more {
            q.done(&key);
        }
        assert_eq!(q.next().await, Some("c"));
        assert!(q.take(10, |_| true).is_empty());
    }

    #[tokio::test]
    async fn closing_releases_waiting_workers() {
        let q = queue();
        let worker = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(worker.await.unwrap(), None);
    }
}
