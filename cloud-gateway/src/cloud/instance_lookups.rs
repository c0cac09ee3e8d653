//! Instance lookups: a short-lived cache, coalescing of identical lookups
//! in flight, and micro-batching. Lookups go to the cloud in batch calls of
//! up to `max_batch` nodes, gathered while more are coming: full batches
//! go at once, and what is left goes once a `batch_window` passes with no
//! new lookup, the lookups of the last [`MOST_WINDOWS`] windows, at their
//! pace, would not fill it before its oldest has waited that long, and no
//! next wave of requests is due by how far apart they came (see
//! `State::next_wave_due`); or once its oldest lookup has waited
//! `MOST_WINDOWS` windows. A request that says nothing more waits behind
//! it (`queue_drained`: the last of a join's Nodes) lets the batch go
//! after a quiet window, whatever the pace foretold: the wave that would
//! have been due is not coming, and waiting for it cost the last Nodes of
//! a 1,000-node join about 100 ms. A flush sends one batch, partial or
//! not; what came meanwhile gathers on. A burst
//! spread over a few windows (the Nodes of one registration, handed out to
//! many workers, who ask again as they finish their writes) is full calls,
//! not one per window; a lone lookup still goes after one window. No lookup
//! waits longer than `MOST_WINDOWS` windows (100 ms at the default 5 ms)
//! before its call asks the budget, however lookups keep coming and
//! whatever its priority. A fresh read skips the cache but may join a
//! lookup already on its way (that answer is no older than the request).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::join_all;
use opentelemetry::trace::TraceContextExt as _;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::cloud::budget::Priority;
use crate::cloud::{Admitted, Cloud};
use crate::metrics::CacheLabels;
use ccm_provider::{CloudError, Lookup, NodeRef, Operation, Result};

/// Cache and batching settings.
#[derive(Clone, Debug, PartialEq)]
pub struct LookupConfig {
    /// How long an answer is served from the cache; zero disables it.
    pub cache_ttl: Duration,
    /// How long a batch waits for one more lookup; zero sends at once.
    pub batch_window: Duration,
    /// The most nodes in one provider call.
    pub max_batch: usize,
    /// Whether identical lookups in flight share one provider answer.
    pub coalesce: bool,
}

impl Default for LookupConfig {
    fn default() -> Self {
        Self {
            cache_ttl: Duration::from_secs(10),
            batch_window: Duration::from_millis(5),
            max_batch: 100,
            coalesce: true,
        }
    }
}

/// The most windows a lookup waits in a batch that keeps gathering: past
/// it, it has waited long enough for a fuller call (100 ms with the
/// default 5 ms window). `--batch-window`'s help states it.
pub const MOST_WINDOWS: u32 = 20;

type Reply = oneshot::Sender<Result<Lookup>>;

struct Pending {
    key: String,
    node: NodeRef,
    priority: Priority,
    /// When it was queued: the oldest pending lookup bounds the gathering.
    queued: Instant,
    /// Set only without coalescing; with it, replies wait in `inflight`.
    reply: Option<Reply>,
    /// The trace of the call that asked, which the batch's span links.
    caller: opentelemetry::trace::SpanContext,
    /// Whether the request said nothing more waits behind it.
    drained: bool,
}

#[derive(Default)]
struct State {
    cache: HashMap<String, (Instant, Lookup)>,
    inflight: HashMap<String, Vec<Reply>>,
    pending: Vec<Pending>,
    last_prune: Option<Instant>,
    /// The distinct instants lookups were queued at, and how many each,
    /// over the last [`HISTORY_SPANS`] gathering spans: the last span's
    /// tell the pace a partial batch would fill at, all of them how far
    /// apart requests come.
    arrivals: std::collections::VecDeque<(Instant, usize)>,
}

/// How many gathering spans of requests tell how far apart they come.
const HISTORY_SPANS: u32 = 10;

/// The fewest gaps between waves of requests that tell how far apart
/// they come.
const FEWEST_FOR_GAPS: usize = 4;

impl State {
    /// Counts `n` lookups queued at `now`, forgetting those older than
    /// `span`.
    fn arrive(&mut self, now: Instant, n: usize, span: Duration) {
        if n > 0 {
            match self.arrivals.back_mut() {
                Some((at, count)) if *at == now => *count += n,
                _ => self.arrivals.push_back((now, n)),
            }
        }
        while let Some(&(at, _)) = self.arrivals.front() {
            if now.duration_since(at) < span * HISTORY_SPANS {
                break;
            }
            self.arrivals.pop_front();
        }
    }

    /// The lookups queued within the last `span`: how many at its first
    /// instant, how many in all, and that first instant.
    fn within(&self, now: Instant, span: Duration) -> (usize, usize, Option<Instant>) {
        let (mut at_first, mut all, mut first) = (0, 0, None);
        for &(at, n) in self.arrivals.iter().rev() {
            if now.duration_since(at) >= span {
                break;
            }
            (at_first, all, first) = (n, all + n, Some(at));
        }
        (at_first, all, first)
    }

    /// Whether the next wave of requests is due. Those asking wait for
    /// their answers and write before they ask again (a node controller's
    /// workers), so requests come in waves: a quiet window inside a wave
    /// says nothing, and one between waves says the next is on its way.
    /// Once the history holds [`FEWEST_FOR_GAPS`] gaps of a window or
    /// more between requests, at most half of `span` apart on average, the
    /// next wave is due until twice that average has passed since the last
    /// request. The remainder of a batch then waits for the next wave
    /// rather than going alone: in a 10,000-node join those remainders
    /// were a fifth of the calls. A slower trickle is left to the pace.
    fn next_wave_due(&self, now: Instant, window: Duration, span: Duration) -> bool {
        let Some((last, _)) = self.arrivals.back() else {
            return false;
        };
        let (mut waves, mut apart) = (0u32, Duration::ZERO);
        let instants = || self.arrivals.iter().map(|(at, _)| *at);
        for (a, b) in instants().zip(instants().skip(1)) {
            let gap = b.duration_since(a);
            if gap >= window {
                waves += 1;
                apart += gap;
            }
        }
        if (waves as usize) < FEWEST_FOR_GAPS {
            return false;
        }
        let gap = apart / waves;
        gap <= span / 2 && now.duration_since(*last) < 2 * gap
    }
}

/// One lookup's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// What the cloud said.
    pub lookup: Lookup,
    /// Whether it came from the cache.
    pub cached: bool,
}

/// The instance lookup path of the gateway.
pub struct InstanceLookups {
    cloud: Arc<Cloud>,
    config: LookupConfig,
    state: Mutex<State>,
    wake: Notify,
    full: Notify,
}

fn key(node: &NodeRef) -> String {
    if node.provider_id.is_empty() {
        format!("name:{}", node.name)
    } else {
        node.provider_id.clone()
    }
}

enum Slot {
    Ready(Answer),
    Waiting(oneshot::Receiver<Result<Lookup>>),
}

impl InstanceLookups {
    /// Creates the lookup path and starts its batching task.
    pub fn start(cloud: Arc<Cloud>, config: LookupConfig) -> Arc<Self> {
        let lookups = Arc::new(Self {
            cloud,
            config,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            full: Notify::new(),
        });
        tokio::spawn(Self::batcher(Arc::downgrade(&lookups)));
        lookups
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.cloud
                .metrics()
                .instance_cache
                .get_or_create(&CacheLabels { result })
                .inc_by(n);
        }
    }

    /// Forgets what is cached about an instance, by name and provider ID,
    /// after a write that changed it.
    pub fn invalidate(&self, name: &str, provider_id: &str) {
        let mut state = self.state();
        state.cache.remove(&format!("name:{name}"));
        state.cache.remove(provider_id);
    }

    /// Looks up `nodes`; one answer per node, in order. Fails as a whole if
    /// any provider call behind it failed: a partial answer could read as
    /// "not found" where nothing is known.
    pub async fn lookup(
        &self,
        nodes: &[NodeRef],
        fresh: bool,
        priority: Priority,
    ) -> Result<Vec<Answer>> {
        self.lookup_drained(nodes, fresh, priority, false).await
    }

    /// [`Self::lookup`] for a caller that says whether nothing more waits
    /// behind `nodes` (`drained`): their batch then goes once a window
    /// passes with no new lookup, without waiting for a next wave.
    #[tracing::instrument(
        target = "ccm_calls",
        name = "instance lookup",
        skip(self, nodes),
        fields(nodes = nodes.len(), fresh, priority = priority.as_str(), hits, merged, misses)
    )]
    pub async fn lookup_drained(
        &self,
        nodes: &[NodeRef],
        fresh: bool,
        priority: Priority,
        drained: bool,
    ) -> Result<Vec<Answer>> {
        let now = Instant::now();
        let caller = tracing::Span::current()
            .context()
            .span()
            .span_context()
            .clone();
        let (mut hits, mut merged, mut misses) = (0, 0, 0);
        let refreshes;
        let mut raised = 0;
        let slots: Vec<Slot> = {
            let mut state = self.state();
            // Lookups wait for the budget in the batcher's queue, not the
            // budget's: refuse at once what could not be served within the
            // budget's longest wait, as the budget would.
            // Cache hits never wait, so they are not counted (nor is the
            // budget asked when everything is cached).
            let missing = nodes
                .iter()
                .filter(|node| {
                    fresh
                        || state
                            .cache
                            .get(&key(node))
                            .is_none_or(|(at, _)| now.duration_since(*at) >= self.config.cache_ttl)
                })
                .count();
            if missing > 0 {
                let ahead = state
                    .pending
                    .iter()
                    .filter(|p| p.priority <= priority)
                    .count();
                let calls = (ahead + missing).div_ceil(self.config.max_batch);
                if let Some(retry_after) = self.cloud.budget().overflow(priority, calls) {
                    return Err(CloudError::BudgetExhausted { retry_after });
                }
            }
            // Entries read in the last part of their life are fetched again
            // in the background (see `refresh_after`); those past half
            // their life may ride in the room this request's misses leave
            // in their calls.
            let mut due = Vec::new();
            let mut aging = Vec::new();
            // Lookups this request joined, which may still wait for the
            // budget at a lower priority.
            let mut joined = std::collections::HashSet::new();
            let slots = nodes
                .iter()
                .map(|node| {
                    let key = key(node);
                    let cached = state
                        .cache
                        .get(&key)
                        .filter(|(at, _)| now.duration_since(*at) < self.config.cache_ttl);
                    if let (false, Some((at, lookup))) = (fresh, cached) {
                        hits += 1;
                        let answer = Slot::Ready(Answer {
                            lookup: lookup.clone(),
                            cached: true,
                        });
                        let age = now.duration_since(*at);
                        if self.config.coalesce && !state.inflight.contains_key(&key) {
                            if age >= self.refresh_after() {
                                due.push((key, node.clone()));
                            } else if age >= self.config.cache_ttl / 2 {
                                aging.push((key, node.clone()));
                            }
                        }
                        return answer;
                    }
                    let (tx, rx) = oneshot::channel();
                    if self.config.coalesce {
                        if let Some(waiters) = state.inflight.get_mut(&key) {
                            waiters.push(tx);
                            merged += 1;
                            if priority < Priority::Low {
                                joined.insert(key);
                            }
                            return Slot::Waiting(rx);
                        }
                        state.inflight.insert(key.clone(), vec![tx]);
                        state.pending.push(Pending {
                            key,
                            node: node.clone(),
                            priority,
                            queued: now,
                            reply: None,
                            caller: caller.clone(),
                            drained,
                        });
                    } else {
                        state.pending.push(Pending {
                            key,
                            node: node.clone(),
                            priority,
                            queued: now,
                            reply: Some(tx),
                            caller: caller.clone(),
                            drained,
                        });
                    }
                    misses += 1;
                    Slot::Waiting(rx)
                })
                .collect();
            // A lookup joined while it waits for the budget takes the
            // joiner's priority: otherwise a node's lifecycle check would
            // wait behind the address sync's refresh of the same node.
            // The scan ends once every joined lookup is found (the queue
            // holds each node once).
            if !joined.is_empty() {
                for pending in state.pending.iter_mut() {
                    if pending.priority > priority && joined.remove(&pending.key) {
                        pending.priority = priority;
                        raised += 1;
                        if joined.is_empty() {
                            break;
                        }
                    }
                }
            }
            if misses > 0 {
                // Room left in the last call the pending lookups make anyway:
                // filling it costs no call, and entries fetched together
                // expire together (500 NotReady nodes read every half
                // lifetime split into cohorts of 250 took 6 calls per
                // lifetime instead of 5).
                let batch = self.config.max_batch;
                let room = (batch - (state.pending.len() + due.len()) % batch) % batch;
                due.extend(aging.into_iter().take(room));
            }
            refreshes = self.refresh_ahead(&mut state, due, &caller);
            state.arrive(now, (misses + refreshes) as usize, self.gathering_span());
            if state.pending.len() >= self.config.max_batch {
                self.full.notify_one();
            }
            slots
        };
        self.count("hit", hits);
        self.count("merged", merged);
        self.count("miss", misses);
        self.count("refresh", refreshes);
        let span = tracing::Span::current();
        span.record("hits", hits);
        span.record("merged", merged);
        span.record("misses", misses);
        if misses + refreshes + raised > 0 {
            self.wake.notify_one();
        }
        let answers = join_all(slots.into_iter().map(|slot| async move {
            match slot {
                Slot::Ready(answer) => Ok(answer),
                Slot::Waiting(rx) => match rx.await {
                    Ok(Ok(lookup)) => Ok(Answer {
                        lookup,
                        cached: false,
                    }),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(CloudError::Internal("instance lookup was dropped".into())),
                },
            }
        }))
        .await;
        answers.into_iter().collect()
    }

    /// The age from which a cache hit also queues a fetch of the same
    /// instance, so that an entry read all the time is replaced before it
    /// expires and no caller waits for the cloud at its expiry (before,
    /// every tenth second one read of a busy node waited a cloud call: the
    /// latency tail of benchmark scenario 6). The last fifth of the
    /// lifetime, at most two seconds: enough for a batch and a cloud call.
    fn refresh_after(&self) -> Duration {
        let ttl = self.config.cache_ttl;
        ttl - (ttl / 5).min(Duration::from_secs(2))
    }

    /// Queues background fetches of the `due` entries, at low priority and
    /// only while the budget has room for them: a refresh is never worth a
    /// refusal. A lookup of the same instance arriving meanwhile joins the
    /// fetch. Returns how many were queued.
    fn refresh_ahead(
        &self,
        state: &mut State,
        due: Vec<(String, NodeRef)>,
        caller: &opentelemetry::trace::SpanContext,
    ) -> u64 {
        if due.is_empty() {
            return 0;
        }
        let ahead = state.pending.len();
        let calls = (ahead + due.len()).div_ceil(self.config.max_batch);
        if self.cloud.budget().overflow(Priority::Low, calls).is_some() {
            return 0;
        }
        let now = Instant::now();
        let mut n = 0;
        for (key, node) in due {
            // A node named twice in one request is fetched once.
            if state.inflight.contains_key(&key) {
                continue;
            }
            n += 1;
            state.inflight.insert(key.clone(), Vec::new());
            state.pending.push(Pending {
                key,
                node,
                priority: Priority::Low,
                queued: now,
                reply: None,
                caller: caller.clone(),
                drained: false,
            });
        }
        n
    }

    /// Gathers pending lookups (see the module's docs) and sends them as
    /// batch calls. Ends when the lookups are dropped.
    async fn batcher(this: std::sync::Weak<Self>) {
        loop {
            let Some(lookups) = this.upgrade() else {
                return;
            };
            // A partial batch left from the last round gathers on at once;
            // otherwise wait for a lookup, waking at least once a second to
            // notice being dropped.
            if lookups.state().pending.is_empty() {
                tokio::select! {
                    _ = lookups.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
            let mut flush = lookups.gather().await;
            // The budget is taken before the batch is made: while the budget
            // makes us wait, more lookups join, so the busier the account,
            // the fuller each call.
            while let Some(mut priority) = lookups.most_urgent() {
                // Full batches go; what is left of a burst still coming
                // gathers on.
                if !flush && lookups.state().pending.len() < lookups.config.max_batch {
                    break;
                }
                let admit = lookups.cloud.admit(priority);
                tokio::pin!(admit);
                let admitted = loop {
                    tokio::select! {
                        admitted = &mut admit => break admitted,
                        // A more urgent lookup must not wait behind a less
                        // urgent admission: ask again at its priority (a
                        // dropped admission costs nothing).
                        _ = lookups.wake.notified() => {
                            if let Some(p) = lookups.most_urgent().filter(|p| *p < priority) {
                                priority = p;
                                admit.set(lookups.cloud.admit(priority));
                            }
                        }
                    }
                };
                let batch: Vec<Pending> = {
                    let mut state = lookups.state();
                    // Most urgent first; the order is otherwise kept.
                    state.pending.sort_by_key(|p| p.priority);
                    let n = state.pending.len().min(lookups.config.max_batch);
                    state.pending.drain(..n).collect()
                };
                if batch.is_empty() {
                    break;
                }
                tokio::spawn(lookups.clone().fetch(batch, admitted));
                // What the gathering let go is on its way; lookups that
                // came while it waited for the budget gather on unless
                // they fill a batch.
                flush = false;
            }
        }
    }

    /// The longest a lookup gathers: [`MOST_WINDOWS`] windows.
    fn gathering_span(&self) -> Duration {
        self.config.batch_window * MOST_WINDOWS
    }

    /// Waits while lookups keep coming, a window at a time, until a batch
    /// is full, a window passes with none while the pace of the last
    /// [`MOST_WINDOWS`] windows would not fill the batch in the time its
    /// oldest lookup has left and no next wave is due, or that oldest
    /// lookup has waited `MOST_WINDOWS` windows. Whether the first batch
    /// goes now, partial or not (`false`: a batch filled up while more may
    /// still be coming, so only full batches go).
    ///
    /// The pace matters where those asking wait for their answers before
    /// they ask again (a node controller's workers, writing the Nodes
    /// they looked up): a window can pass with none of them asking while
    /// dozens are about to. A quiet window alone cut a 10,000-node join's
    /// batches to half their size.
    async fn gather(&self) -> bool {
        let window = self.config.batch_window;
        if window.is_zero() {
            return true;
        }
        let span = self.gathering_span();
        let (mut seen, oldest) = {
            let state = self.state();
            let oldest = state.pending.iter().map(|p| p.queued).min();
            (state.pending.len(), oldest)
        };
        let Some(oldest) = oldest else {
            return true;
        };
        // From the oldest lookup, not from this round: what a full batch
        // left behind has already waited.
        let deadline = oldest + span;
        loop {
            if seen >= self.config.max_batch {
                return false;
            }
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            // A window, cut short by a batch filling up (a wake-up left
            // from an earlier round only makes this window start again).
            let filled = tokio::select! {
                _ = tokio::time::sleep_until((now + window).min(deadline)) => false,
                _ = self.full.notified() => true,
            };
            let (pending, expected, due, drained) = {
                let mut state = self.state();
                let now = Instant::now();
                state.arrive(now, 0, span);
                let left = deadline.saturating_duration_since(now);
                // Over the time since the first of them, not the whole
                // span: a wave of lookups after a quiet spell comes at its
                // own pace. What came at that first instant came at once
                // and tells no pace (a burst, then nothing more).
                let (at_first, arrived, first) = state.within(now, span);
                let took = first.map_or(span, |at| now.duration_since(at)).max(window);
                let pace = (arrived - at_first) as f64 / took.as_secs_f64();
                (
                    state.pending.len(),
                    pace * left.as_secs_f64(),
                    state.next_wave_due(now, window, span),
                    state.pending.iter().any(|p| p.drained),
                )
            };
            let room = self.config.max_batch.saturating_sub(pending);
            if !filled && pending == seen && (drained || (expected < room as f64 && !due)) {
                return true;
            }
            seen = pending;
        }
    }

    /// The priority of the most urgent pending lookup.
    fn most_urgent(&self) -> Option<Priority> {
        self.state().pending.iter().map(|p| p.priority).min()
    }

    /// Sends one batch, whose budget `admitted` says was taken (or why
    /// not), to the provider and hands out the answers.
    async fn fetch(self: Arc<Self>, batch: Vec<Pending>, admitted: Result<Admitted>) {
        // The batch serves many calls, each in its own trace: its span is a
        // root that links every lookup riding in it.
        let span = tracing::info_span!(target: ccm_proto::CALL_SPANS, parent: None, "instance batch", size = batch.len());
        for pending in &batch {
            if pending.caller.is_valid() {
                span.add_link(pending.caller.clone());
            }
        }
        self.fetch_in(batch, admitted).instrument(span).await
    }

    async fn fetch_in(self: Arc<Self>, batch: Vec<Pending>, admitted: Result<Admitted>) {
        let nodes: Vec<NodeRef> = batch.iter().map(|p| p.node.clone()).collect();
        self.cloud
            .metrics()
            .instance_batch_size
            .observe(nodes.len() as f64);
        let result = match (admitted, self.cloud.instances()) {
            (Err(e), _) | (_, Err(e)) => Err(e),
            (Ok(admitted), Ok(instances)) => {
                instances
                    .call_admitted(admitted, Operation::GetInstances, None, |i| {
                        i.get_instances(&nodes)
                    })
                    .await
            }
        };
        let result = result.and_then(|lookups| {
            if lookups.len() == nodes.len() {
                Ok(lookups)
            } else {
                Err(CloudError::Internal(format!(
                    "provider answered {} of {} lookups",
                    lookups.len(),
                    nodes.len()
                )))
            }
        });
        let now = Instant::now();
        let mut state = self.state();
        for (i, pending) in batch.into_iter().enumerate() {
            let answer = match &result {
                Ok(lookups) => Ok(lookups[i].clone()),
                Err(e) => Err(e.clone()),
            };
            if let (Ok(lookup), false) = (&answer, self.config.cache_ttl.is_zero()) {
                state
                    .cache
                    .insert(pending.key.clone(), (now, lookup.clone()));
            }
            let replies = match pending.reply {
                Some(reply) => vec![reply],
                None => state.inflight.remove(&pending.key).unwrap_or_default(),
            };
            for reply in replies {
                let _ = reply.send(answer.clone());
            }
        }
        // Forget expired answers now and then, so nodes long gone do not
        // pile up.
        let ttl = self.config.cache_ttl;
        if state
            .last_prune
            .is_none_or(|at| now.duration_since(at) > ttl)
        {
            state
                .cache
                .retain(|_, (at, _)| now.duration_since(*at) < ttl);
            // A map keeps its room after a burst (an address sync of
            // 100,000 nodes leaves about 14 MiB of empty buckets): give it
            // back once most of it stands empty.
            let len = state.cache.len();
            if state.cache.capacity() > 4 * len.max(1024) {
                state.cache.shrink_to(2 * len);
            }
            state.last_prune = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::budget::{Budget, BudgetConfig};
    use crate::metrics::Metrics;
    use async_trait::async_trait;
    use ccm_provider::{Instances, LoadBalancers, Provider, Routes};

    fn nodes(prefix: &str, n: usize) -> Vec<NodeRef> {
        (0..n)
            .map(|i| NodeRef {
                name: format!("{prefix}-{i}"),
                provider_id: String::new(),
            })
            .collect()
    }

    #[tokio::test]
    async fn the_cache_gives_its_room_back_once_a_burst_of_answers_expires() {
        // Long enough that none expires while 20,000 are cached on a
        // loaded machine (50 ms did not, in a debug build beside a build).
        let ttl = Duration::from_secs(2);
        let (_, lookups) = counting(LookupConfig {
            cache_ttl: ttl,
            batch_window: Duration::ZERO,
            ..LookupConfig::default()
        });
        // An address sync's burst: 20,000 answers cached at once.
        let answers = lookups
            .lookup(&nodes("burst", 20_000), false, Priority::Low)
            .await
            .unwrap();
        assert_eq!(answers.len(), 20_000);
        let room = lookups.state().cache.capacity();
        assert!(room >= 20_000, "{room}");
        // Once they expired, the next answer prunes them and the table
        // shrinks to what is left.
        tokio::time::sleep(ttl + Duration::from_millis(500)).await;
        lookups
            .lookup(&nodes("after", 1), false, Priority::High)
            .await
            .unwrap();
        let state = lookups.state();
        assert_eq!(state.cache.len(), 1);
        assert!(
            state.cache.capacity() <= 4 * 1024,
            "{} slots kept for one answer (were {room})",
            state.cache.capacity()
        );
    }

    /// A cloud that notes the size of each batch call it answers.
    #[derive(Default)]
    struct Counting {
        calls: Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl Provider for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn instances(&self) -> Option<&dyn Instances> {
            Some(self)
        }
        fn load_balancers(&self) -> Option<&dyn LoadBalancers> {
            None
        }
        fn routes(&self) -> Option<&dyn Routes> {
            None
        }
        async fn check(&self) -> Result<()> {
            Ok(())
        }
    }

    #[async_trait]
    impl Instances for Counting {
        async fn get_instances(&self, nodes: &[NodeRef]) -> Result<Vec<Lookup>> {
            self.calls.lock().unwrap().push(nodes.len());
            Ok(vec![Lookup::NotFound; nodes.len()])
        }
    }

    const WINDOW: Duration = Duration::from_millis(5);

    /// Lookups as `config` says, on a cloud without instances whose
    /// budget never makes them wait.
    fn counting(config: LookupConfig) -> (Arc<Counting>, Arc<InstanceLookups>) {
        let budget = Budget::start(BudgetConfig {
            rate: 1e6,
            burst: 1e6,
            ..BudgetConfig::default()
        });
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        let provider = Arc::new(Counting::default());
        let cloud = Arc::new(Cloud::new(provider.clone(), budget, metrics));
        (provider, InstanceLookups::start(cloud, config))
    }

    /// Lookups with no cache, batched in `WINDOW`s up to `max_batch`.
    fn batching(max_batch: usize) -> (Arc<Counting>, Arc<InstanceLookups>) {
        counting(LookupConfig {
            cache_ttl: Duration::ZERO,
            batch_window: WINDOW,
            max_batch,
            coalesce: true,
        })
    }

    /// Looks `node` up `after` from now; how long the answer took.
    async fn timed_lookup(
        lookups: Arc<InstanceLookups>,
        node: NodeRef,
        after: Duration,
        priority: Priority,
    ) -> Duration {
        tokio::time::sleep(after).await;
        let asked = Instant::now();
        lookups.lookup(&[node], false, priority).await.unwrap();
        asked.elapsed()
    }

    /// Runs `test` with a limit, so a batch that never goes fails it.
    async fn within<T>(test: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(30), test)
            .await
            .expect("the lookups were not answered within 30 s")
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_spread_over_several_windows_is_one_call() {
        let (cloud, lookups) = batching(100);
        // Ten Nodes registering 3 ms apart: six windows from first to last,
        // none of them without a lookup.
        let burst = nodes("burst", 10).into_iter().enumerate().map(|(i, node)| {
            timed_lookup(
                lookups.clone(),
                node,
                Duration::from_millis(3 * i as u64),
                Priority::Normal,
            )
        });
        within(join_all(burst)).await;
        assert_eq!(*cloud.calls.lock().unwrap(), [10]);
    }

    #[tokio::test(start_paused = true)]
    async fn waves_of_lookups_further_apart_than_a_window_are_one_call() {
        let (cloud, lookups) = batching(100);
        // Sixteen lookups every 6 ms (workers asking as they finish their
        // writes): every window has a gap, yet at this pace a batch fills
        // before its oldest has waited the most windows. The first wave
        // goes alone after a window: it could have been all there was.
        let waves = nodes("wave", 96).into_iter().enumerate().map(|(i, node)| {
            timed_lookup(
                lookups.clone(),
                node,
                Duration::from_millis(6 * (i / 16) as u64),
                Priority::High,
            )
        });
        let took = within(join_all(waves)).await;
        assert_eq!(*cloud.calls.lock().unwrap(), [16, 80]);
        let longest = took.iter().max().unwrap();
        assert!(
            *longest <= WINDOW * MOST_WINDOWS,
            "a lookup waited {longest:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_coming_in_waves_wait_for_the_next_wave() {
        let (cloud, lookups) = batching(100);
        // Sixteen requests of 30 nodes, 40 ms apart (a node controller's
        // workers asking for their shares as they finish their writes):
        // at their pace none fills a batch in time, so each went alone;
        // once the waves are known, each waits for the next.
        let requests = (0..16u64).map(|r| {
            let lookups = lookups.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(40 * r)).await;
                let asked = Instant::now();
                lookups
                    .lookup(&nodes(&format!("wave{r}"), 30), false, Priority::High)
                    .await
                    .unwrap();
                asked.elapsed()
            }
        });
        let took = within(join_all(requests)).await;
        let calls = cloud.calls.lock().unwrap().clone();
        assert_eq!(calls.iter().sum::<usize>(), 480);
        assert!(calls.len() <= 10, "{} calls: {calls:?}", calls.len());
        let longest = took.iter().max().unwrap();
        assert!(
            *longest <= WINDOW * MOST_WINDOWS,
            "a lookup waited {longest:?}"
        );
    }

    /// How long the last of nine waves of 30 lookups, 40 ms apart, waits
    /// for its answer when its request says the caller's queue is drained
    /// (`drained`) or not.
    async fn last_wave_waits(drained: bool) -> Duration {
        let (_, lookups) = batching(100);
        let requests = (0..9u64).map(|r| {
            let lookups = lookups.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(40 * r)).await;
                let asked = Instant::now();
                let nodes = nodes(&format!("wave{r}"), 30);
                let last = drained && r == 8;
                lookups
                    .lookup_drained(&nodes, false, Priority::High, last)
                    .await
                    .unwrap();
                asked.elapsed()
            }
        });
        *within(join_all(requests)).await.last().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_wave_of_a_drained_queue_goes_after_one_quiet_window() {
        // Without the hint the last wave waits for a next one that the
        // pace of the others foretells; with it, a window passes with no
        // new lookup and the batch goes.
        let waited = last_wave_waits(false).await;
        assert!(waited >= 4 * WINDOW, "answered after {waited:?}");
        let drained = last_wave_waits(true).await;
        assert!(
            drained >= WINDOW && drained < 2 * WINDOW,
            "answered after {drained:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_lookup_goes_after_one_window() {
        let (cloud, lookups) = batching(100);
        let node = nodes("lone", 1).remove(0);
        let took = within(timed_lookup(
            lookups,
            node,
            Duration::ZERO,
            Priority::Normal,
        ))
        .await;
        assert!(
            took >= WINDOW && took < 2 * WINDOW,
            "answered after {took:?}"
        );
        assert_eq!(*cloud.calls.lock().unwrap(), [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_the_rest_after_a_quiet_window() {
        let (cloud, lookups) = batching(10);
        // Ten at once fill a batch: it goes without waiting a window.
        let full = nodes("full", 10)
            .into_iter()
            .map(|node| timed_lookup(lookups.clone(), node, Duration::ZERO, Priority::Normal));
        let took = within(join_all(full)).await;
        assert!(took.iter().all(|t| *t < WINDOW), "answered after {took:?}");
        // Thirteen more: one full call at once, three after a window.
        let asked = Instant::now();
        within(lookups.lookup(&nodes("more", 13), false, Priority::Normal))
            .await
            .unwrap();
        let took = asked.elapsed();
        assert!(
            took >= WINDOW && took < 2 * WINDOW,
            "answered after {took:?}"
        );
        assert_eq!(*cloud.calls.lock().unwrap(), [10, 10, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_lookup_waits_more_than_the_most_windows_while_lookups_keep_coming() {
        let (cloud, lookups) = batching(1000);
        let most = WINDOW * MOST_WINDOWS;
        // A lookup every 2 ms for twice the longest wait: no window passes
        // without one, and no batch fills.
        let stream = nodes("stream", most.as_millis() as usize)
            .into_iter()
            .enumerate()
            .map(|(i, node)| {
                timed_lookup(
                    lookups.clone(),
                    node,
                    Duration::from_millis(2 * i as u64),
                    Priority::Normal,
                )
            });
        let took = within(join_all(stream)).await;
        let longest = took.iter().max().unwrap();
        assert!(*longest <= most, "a lookup waited {longest:?}");
        // The first gathered as long as it may: the stream is a few calls,
        // not one per window.
        assert!(
            took[0] > most - WINDOW,
            "the first answered after {:?}",
            took[0]
        );
        let calls = cloud.calls.lock().unwrap().len();
        assert!(calls <= 3, "{calls} calls");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lookup_behind_full_batches_of_more_urgent_ones_waits_no_more_than_the_most_windows()
    {
        let (_, lookups) = batching(4);
        let most = WINDOW * MOST_WINDOWS;
        // A low-priority lookup, then high-priority ones, two a millisecond
        // (a full batch every 2 ms) for twice the longest wait: every full
        // batch is theirs.
        let low = timed_lookup(
            lookups.clone(),
            nodes("low", 1).remove(0),
            Duration::ZERO,
            Priority::Low,
        );
        let high = nodes("high", 4 * most.as_millis() as usize)
            .into_iter()
            .enumerate()
            .map(|(i, node)| {
                timed_lookup(
                    lookups.clone(),
                    node,
                    Duration::from_millis(1 + i as u64 / 2),
                    Priority::High,
                )
            });
        let (low, high) = within(futures::future::join(low, join_all(high))).await;
        assert!(low <= most, "the low-priority lookup waited {low:?}");
        let longest = high.iter().max().unwrap();
        assert!(
            *longest <= most,
            "a high-priority lookup waited {longest:?}"
        );
    }
}
