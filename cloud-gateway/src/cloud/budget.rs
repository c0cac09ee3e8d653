//! One API budget for the whole cloud account: a token bucket shared by all
//! callers, served by priority. High-priority work (node initialisation,
//! deletion checks, load balancer create and delete) goes first; host
//! updates and routes next; periodic refreshes last. Waiting is bounded:
//! when a call would wait longer than `max_wait`, or too many calls already
//! wait, it is refused with the estimated delay instead. A throttling
//! answer from the cloud pauses the bucket and halves its rate, which then
//! recovers over about ten seconds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// The priority classes, most urgent first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Node initialisation, deletion checks, load balancer create/delete.
    High = 0,
    /// Load balancer host updates, routes.
    Normal = 1,
    /// Periodic refreshes and listings.
    Low = 2,
}

impl Priority {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }
}

/// The budget's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetConfig {
    /// Sustained cloud calls per second.
    pub rate: f64,
    /// Calls that may go at once after a quiet spell.
    pub burst: f64,
    /// The longest a call may wait for its turn.
    pub max_wait: Duration,
    /// The most calls that may wait at once.
    pub max_waiting: usize,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            rate: 20.0,
            burst: 40.0,
            max_wait: Duration::from_secs(10),
            max_waiting: 10_000,
        }
    }
}

/// A call was refused; it may be tried again after `retry_after`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// The estimated wait.
    pub retry_after: Duration,
}

struct State {
    tokens: f64,
    rate: f64,
    last: Instant,
    paused_until: Option<Instant>,
    queues: [VecDeque<oneshot::Sender<()>>; 3],
    last_throttled: Option<std::time::SystemTime>,
}

/// The budget at a glance, for an operator.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// The configured rate, calls per second.
    pub rate: f64,
    /// The rate now (lower for a while after throttling).
    pub rate_now: f64,
    pub burst: f64,
    /// Tokens in the bucket (negative after charges).
    pub tokens: f64,
    /// How long the bucket stays paused after throttling.
    pub paused_for: Duration,
    /// Calls waiting, by priority: high, normal, low.
    pub waiting: [usize; 3],
    pub max_wait: Duration,
    /// When the cloud last throttled.
    pub last_throttled: Option<std::time::SystemTime>,
}

impl State {
    fn refill(&mut self, config: &BudgetConfig, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        if self.paused_until.is_some_and(|until| now < until) {
            return;
        }
        self.paused_until = None;
        self.tokens = (self.tokens + elapsed * self.rate).min(config.burst);
        // After throttling, the rate climbs back to the configured one
        // at 5% of it per second.
        self.rate = (self.rate + config.rate * 0.05 * elapsed).min(config.rate);
    }

    fn waiting(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    /// How long until `position` more tokens exist (position 1 = next).
    fn estimate(&self, position: usize, now: Instant) -> Duration {
        let pause = self
            .paused_until
            .map(|until| until.saturating_duration_since(now))
            .unwrap_or_default();
        let deficit = (position as f64 - self.tokens).max(0.0);
        pause + Duration::from_secs_f64(deficit / self.rate.max(f64::MIN_POSITIVE))
    }
}

/// The shared budget. Create it with [`Budget::start`] inside a runtime.
pub struct Budget {
    config: BudgetConfig,
    state: Mutex<State>,
    wake: Notify,
}

impl Budget {
    /// Creates the budget and starts the task that hands out tokens.
    pub fn start(config: BudgetConfig) -> Arc<Self> {
        let budget = Arc::new(Self {
            state: Mutex::new(State {
                tokens: config.burst,
                rate: config.rate,
                last: Instant::now(),
                paused_until: None,
                queues: Default::default(),
                last_throttled: None,
            }),
            config,
            wake: Notify::new(),
        });
        tokio::spawn(dispatch(budget.clone()));
        budget
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The budget now.
    pub fn snapshot(&self) -> Snapshot {
        let now = Instant::now();
        let mut state = self.state();
        state.refill(&self.config, now);
        Snapshot {
            rate: self.config.rate,
            rate_now: state.rate,
            burst: self.config.burst,
            tokens: state.tokens,
            paused_for: state
                .paused_until
                .map(|u| u.saturating_duration_since(now))
                .unwrap_or_default(),
            waiting: [0, 1, 2].map(|i| state.queues[i].len()),
            max_wait: self.config.max_wait,
            last_throttled: state.last_throttled,
        }
    }

    /// Waits for a token at `priority`; returns how long it waited.
    pub async fn acquire(&self, priority: Priority) -> Result<Duration, Exhausted> {
        let start = Instant::now();
        let rx = {
            let mut state = self.state();
            state.refill(&self.config, start);
            let ahead: usize = state.queues[..=priority as usize]
                .iter()
                .map(VecDeque::len)
                .sum();
            if ahead == 0 && state.paused_until.is_none() && state.tokens >= 1.0 {
                state.tokens -= 1.0;
                return Ok(Duration::ZERO);
            }
            let estimate = state.estimate(ahead + 1, start);
            if estimate > self.config.max_wait || state.waiting() >= self.config.max_waiting {
                return Err(Exhausted {
                    retry_after: estimate.max(Duration::from_millis(100)),
                });
            }
            let (tx, rx) = oneshot::channel();
            state.queues[priority as usize].push_back(tx);
            rx
        };
        self.wake.notify_one();
        // Admission promised at most `max_wait`; the grace covers the
        // dispatcher's timer granularity.
        let deadline = self.config.max_wait + Duration::from_millis(250);
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(())) => Ok(start.elapsed()),
            _ => {
                let state = self.state();
                Err(Exhausted {
                    retry_after: state
                        .estimate(state.waiting() + 1, Instant::now())
                        .max(Duration::from_millis(100)),
                })
            }
        }
    }

    /// The cloud said "slow down": pause for `retry_after` and halve the
    /// rate (never below 5% of the configured rate).
    pub fn throttled(&self, retry_after: Duration) {
        let now = Instant::now();
        let mut state = self.state();
        state.refill(&self.config, now);
        let until = now + retry_after;
        state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
        state.rate = (state.rate / 2.0).max(self.config.rate * 0.05);
        state.tokens = state.tokens.min(0.0);
        state.last_throttled = Some(std::time::SystemTime::now());
        drop(state);
        self.wake.notify_one();
    }

    /// Takes `calls` more tokens for requests a provider call sent beyond
    /// the one it was admitted for; the bucket may go below zero, and the
    /// next callers wait until it has refilled.
    pub fn charge(&self, calls: u32) {
        if calls == 0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state();
        state.refill(&self.config, now);
        state.tokens -= f64::from(calls);
    }

    /// The current sustained rate, lowered after throttling.
    pub fn current_rate(&self) -> f64 {
        self.state().rate
    }

    /// Calls waiting now.
    pub fn waiting(&self) -> usize {
        self.state().waiting()
    }

    /// Whether `calls` more calls at `priority`, queued behind those
    /// waiting ahead of them, would wait longer than allowed; then the
    /// delay to suggest. For callers that queue work of their own before
    /// they [`Self::acquire`] (the lookup batcher).
    pub fn overflow(&self, priority: Priority, calls: usize) -> Option<Duration> {
        let now = Instant::now();
        let mut state = self.state();
        state.refill(&self.config, now);
        let ahead: usize = state.queues[..=priority as usize]
            .iter()
            .map(VecDeque::len)
            .sum();
        let estimate = state.estimate(ahead + calls, now);
        (estimate > self.config.max_wait).then(|| estimate.max(Duration::from_millis(100)))
    }
}

/// Hands tokens to waiters, most urgent class first, as they refill. Ends
/// soon after every other handle to the budget is dropped.
async fn dispatch(budget: Arc<Budget>) {
    const IDLE_CHECK: Duration = Duration::from_secs(1);
    while Arc::strong_count(&budget) > 1 {
        let next = {
            let now = Instant::now();
            let mut state = budget.state();
            state.refill(&budget.config, now);
            while state.paused_until.is_none() && state.tokens >= 1.0 {
                let Some(tx) = state.queues.iter_mut().find_map(VecDeque::pop_front) else {
                    break;
                };
                // A waiter that gave up has dropped its receiver; its token
                // stays in the bucket.
                if tx.send(()).is_ok() {
                    state.tokens -= 1.0;
                }
            }
            (state.waiting() > 0).then(|| state.estimate(1, now))
        };
        let delay = next.map_or(IDLE_CHECK, |d| {
            d.clamp(Duration::from_millis(1), IDLE_CHECK)
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = budget.wake.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rate: f64, burst: f64, max_wait: Duration) -> BudgetConfig {
        BudgetConfig {
            rate,
            burst,
            max_wait,
            max_waiting: 100,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_calls_wait_for_the_rate() {
        let budget = Budget::start(config(10.0, 2.0, Duration::from_secs(5)));
        assert_eq!(budget.acquire(Priority::Low).await, Ok(Duration::ZERO));
        assert_eq!(budget.acquire(Priority::Low).await, Ok(Duration::ZERO));
        let waited = budget.acquire(Priority::Low).await.unwrap();
        assert!(waited >= Duration::from_millis(90), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn high_priority_overtakes_waiting_low_priority() {
        let budget = Budget::start(config(1.0, 1.0, Duration::from_secs(30)));
        budget.acquire(Priority::High).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (i, priority) in [Priority::Low, Priority::Low, Priority::High]
            .into_iter()
            .enumerate()
        {
            let (budget, order) = (budget.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                budget.acquire(priority).await.unwrap();
                order.lock().unwrap().push(priority);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(10 * (i as u64 + 1))).await;
        }
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            vec![Priority::High, Priority::Low, Priority::Low]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_would_wait_too_long_are_refused_with_a_delay() {
        let budget = Budget::start(config(1.0, 1.0, Duration::from_secs(2)));
        budget.acquire(Priority::Low).await.unwrap();
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let budget = budget.clone();
                tokio::spawn(async move { budget.acquire(Priority::Low).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let refused = budget.acquire(Priority::Low).await.unwrap_err();
        assert!(refused.retry_after >= Duration::from_secs(2), "{refused:?}");
        for waiter in waiters {
            assert!(waiter.await.unwrap().is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn extra_requests_are_charged_to_the_next_callers() {
        let budget = Budget::start(config(10.0, 2.0, Duration::from_secs(5)));
        assert_eq!(budget.acquire(Priority::High).await, Ok(Duration::ZERO));
        // That call sent three requests: two more tokens, one of which the
        // bucket does not have.
        budget.charge(2);
        let waited = budget.acquire(Priority::High).await.unwrap();
        assert!(waited >= Duration::from_millis(190), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_pauses_and_slows_the_bucket_then_it_recovers() {
        let budget = Budget::start(config(10.0, 10.0, Duration::from_secs(30)));
        budget.throttled(Duration::from_secs(2));
        assert!((budget.current_rate() - 5.0).abs() < 1e-9);
        let waited = budget.acquire(Priority::High).await.unwrap();
        assert!(waited >= Duration::from_secs(2), "{waited:?}");
        tokio::time::sleep(Duration::from_secs(30)).await;
        budget.acquire(Priority::High).await.unwrap();
        assert!((budget.current_rate() - 10.0).abs() < 1e-9);
    }
}
