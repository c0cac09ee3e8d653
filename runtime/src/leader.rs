//! Leader election on a `coordination.k8s.io/v1` Lease, through
//! kube-leader-election, with upstream's timing (15 s lease, 10 s renew
//! deadline, 2 s retry) and two guarantees on top:
//!
//! - Writes stop at once: [`Leadership::is_leader`] turns false the moment
//!   the renew deadline has passed since the last successful renewal, even
//!   if the renewing task is stuck. The lease lasts longer than the
//!   deadline, so no other replica can lead before this one has stopped.
//! - No two leaders: kube-leader-election takes an expired lease with a
//!   patch that has no resourceVersion precondition, so two replicas that
//!   saw it expire together may both believe they won. After acquiring,
//!   this module reads the lease again after a short settle delay and leads
//!   only if it is still the holder.
//!
//! A replica that loses the lease (another took it, or it could not renew
//! within the deadline, e.g. while the API server is down) ends its term
//! ([`Leadership::lost`]) and stands by in the same process, its caches
//! warm, campaigning again: it leads again once the API server answers,
//! with no restart (upstream exits and waits for Kubernetes to restart it,
//! which after an outage longer than the renew deadline puts every
//! replica in crash-loop backoff at once). Each term has a number, and
//! says whether it [`continues`](Term::continues) this replica's previous
//! one: no other replica held the lease in between, so what this replica
//! remembers of the cloud from then is still true.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube_leader_election::{LeaseLock, LeaseLockParams, LeaseLockResult};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Leader election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// Whether to elect at all.
    pub enabled: bool,
    pub name: String,
    pub namespace: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What this replica knows of its leadership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Not leading now; campaigning.
    Standby,
    /// Leading in `term`; the lease was last renewed at `renewed`.
    Leading { term: Term, renewed: Instant },
    /// The election has ended (shutdown); never leads again.
    Ended,
}

/// One term of leadership of this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// 1 for the first term of this process, then one more each time.
    pub number: u64,
    /// Whether no other replica held the lease since this replica's
    /// previous term (the lease's transitions and acquire time are as that
    /// term left them): false for a first term.
    pub continues: bool,
}

/// A handle on this replica's leadership; cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership {
    state: watch::Receiver<State>,
    renew_deadline: Duration,
    identity: Arc<str>,
    /// Turns true once the election has ended (and a leader released its
    /// lease).
    ended: watch::Receiver<bool>,
}

impl Leadership {
    /// A replica that always leads (leader election off).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(State::Leading {
            term: Term {
                number: 1,
                continues: false,
            },
            renewed: far_future(),
        });
        // Keep the sender alive for the life of the process.
        std::mem::forget(tx);
        Self {
            state: rx,
            renew_deadline: Duration::MAX,
            identity: "no-leader-election".into(),
            ended: watch::channel(true).1,
        }
    }

    /// A leadership driven by hand through the returned [`Control`], for
    /// tests of what runs while a replica leads; it starts on standby and
    /// gives up leading `renew_deadline` after the last [`Control::lead`].
    pub fn manual(renew_deadline: Duration) -> (Self, Control) {
        let (tx, rx) = watch::channel(State::Standby);
        let leadership = Self {
            state: rx,
            renew_deadline,
            identity: "manual".into(),
            ended: watch::channel(false).1,
        };
        (leadership, Control(tx))
    }

    /// Whether this replica may write now.
    pub fn is_leader(&self) -> bool {
        match *self.state.borrow() {
            State::Leading { renewed, .. } => renewed.elapsed() < self.renew_deadline,
            _ => false,
        }
    }

    /// Waits until the election has ended after shutdown, so a leader's
    /// release of its lease is not cut short by the process exiting; at
    /// most `limit`.
    pub async fn ended(&self, limit: Duration) {
        let mut ended = self.ended.clone();
        let _ = tokio::time::timeout(limit, ended.wait_for(|done| *done)).await;
    }

    /// This replica's identity in the lease.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this replica leads in a term after term number `after`
    /// (0 for any), within its renew deadline; that term, or `None` if it
    /// never will (the election ended).
    pub async fn next_term(&self, after: u64) -> Option<Term> {
        let mut state = self.state.clone();
        loop {
            match *state.borrow_and_update() {
                State::Leading { term, renewed }
                    if term.number > after && renewed.elapsed() < self.renew_deadline =>
                {
                    return Some(term);
                }
                State::Ended => return None,
                _ => {}
            }
            if state.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Waits until this replica leads; its term, or `None` if it never
    /// will.
    pub async fn acquired(&self) -> Option<Term> {
        self.next_term(0).await
    }

    /// Resolves once `term` is over: the lease was lost, or the renew
    /// deadline passed without a renewal, or the election ended. At once
    /// if this replica is not leading in `term` now.
    pub async fn lost(&self, term: Term) {
        let mut state = self.state.clone();
        loop {
            let deadline = match *state.borrow_and_update() {
                State::Leading { term: now, renewed } if now == term => {
                    renewed.checked_add(self.renew_deadline)
                }
                _ => return,
            };
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        changed = state.changed() => if changed.is_err() { return },
                        _ = tokio::time::sleep_until(deadline.into()) => return,
                    }
                }
                None => {
                    if state.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Drives a [`Leadership::manual`].
pub struct Control(watch::Sender<State>);

impl Control {
    /// Leads from now in term `number`.
    pub fn lead(&self, number: u64, continues: bool) {
        self.0.send_replace(State::Leading {
            term: Term { number, continues },
            renewed: Instant::now(),
        });
    }

    /// Stops leading and stands by.
    pub fn stand_by(&self) {
        self.0.send_replace(State::Standby);
    }
}

/// Marks the election ended when dropped.
struct EndOnDrop(watch::Sender<bool>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// The identity upstream uses: the host (pod) name and a unique suffix.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()))
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// What changes whenever a replica takes the lease rather than renews
/// it: its transitions and acquire time.
fn tenure(lease: &Lease) -> Option<(Option<i32>, String)> {
    let spec = lease.spec.as_ref()?;
    let acquired = spec.acquire_time.as_ref()?;
    Some((spec.lease_transitions, format!("{:?}", acquired.0)))
}

/// Starts electing; the returned handle tracks leadership until
/// `shutdown`, when a leader releases the lease so a standby takes over at
/// once.
pub fn start(
    client: kube::Client,
    settings: &LeaseSettings,
    identity: String,
    shutdown: CancellationToken,
) -> Leadership {
    if !settings.enabled {
        return Leadership::always();
    }
    let (tx, rx) = watch::channel(State::Standby);
    let (ended_tx, ended) = watch::channel(false);
    let lock = LeaseLock::new(
        client.clone(),
        &settings.namespace,
        LeaseLockParams {
            lease_name: settings.name.clone(),
            holder_id: identity.clone(),
            lease_ttl: settings.lease_duration,
        },
    );
    let leases: kube::Api<Lease> = kube::Api::namespaced(client, &settings.namespace);
    let handle = Leadership {
        state: rx,
        renew_deadline: settings.renew_deadline,
        identity: identity.clone().into(),
        ended,
    };
    let settings = settings.clone();
    tokio::spawn(async move {
        // Whichever way the task ends, the election has ended.
        let _ended = EndOnDrop(ended_tx);
        // A changed error is logged once, not every retry.
        let mut last_error = None::<String>;
        let mut note = |error: String| {
            if last_error.as_deref() != Some(error.as_str()) {
                tracing::warn!(lease = %settings.name, %error, "leader election request failed");
                last_error = Some(error);
            }
        };
        let settle = (settings.retry_period / 2).min(Duration::from_secs(1));
        let mut ticker = tokio::time::interval(settings.retry_period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last term, and the lease's tenure at its last renewal: a
        // term continues the last one only if it is unchanged.
        let mut terms = 0u64;
        let mut last_tenure = None;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shutdown.cancelled() => break,
            }
            let current = *tx.borrow();
            let leading = match current {
                State::Leading { term, .. } => Some(term),
                _ => None,
            };
            let attempt =
                tokio::time::timeout(settings.retry_period, lock.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(LeaseLockResult::Acquired(lease))) if leading.is_some() => {
                    last_tenure = tenure(&lease);
                    if let Some(term) = leading {
                        tx.send_replace(State::Leading {
                            term,
                            renewed: Instant::now(),
                        });
                    }
                }
                Ok(Ok(LeaseLockResult::Acquired(_))) => {
                    let acquired_at = Instant::now();
                    tokio::time::sleep(settle).await;
                    match leases.get(&settings.name).await {
                        Ok(lease) if holder(&lease) == Some(identity.as_str()) => {
                            terms += 1;
                            let now = tenure(&lease);
                            let continues = last_tenure.is_some() && now == last_tenure;
                            last_tenure = now;
                            tracing::info!(lease = %settings.name, %identity, term = terms, continues, "became leader");
                            tx.send_replace(State::Leading {
                                term: Term {
                                    number: terms,
                                    continues,
                                },
                                renewed: acquired_at,
                            });
                        }
                        Ok(lease) => tracing::info!(
                            lease = %settings.name,
                            holder = holder(&lease).unwrap_or_default(),
                            "another replica took the lease at the same moment; staying standby"
                        ),
                        Err(e) => {
                            tracing::warn!(error = %e, "could not confirm the lease; staying standby")
                        }
                    }
                }
                Ok(Ok(LeaseLockResult::NotAcquired(lease))) => {
                    if leading.is_some() {
                        tracing::error!(lease = %settings.name, holder = holder(&lease).unwrap_or_default(), "leader lease lost to another replica; standing by");
                        tx.send_replace(State::Standby);
                    }
                }
                Ok(Err(e)) => note(e.to_string()),
                Err(_) => note("lease request timed out".into()),
            }
            // Copy the state out: a borrow held across send_replace deadlocks.
            let state = *tx.borrow();
            if let State::Leading { renewed, .. } = state
                && renewed.elapsed() >= settings.renew_deadline
            {
                tracing::error!(lease = %settings.name, "could not renew the lease within the renew deadline; stopping work and standing by");
                tx.send_replace(State::Standby);
            }
        }
        // Shutting down: hand the lease over at once rather than letting
        // standbys wait for it to expire.
        let state = tx.send_replace(State::Ended);
        if matches!(state, State::Leading { .. }) {
            match lock.step_down().await {
                Ok(()) => tracing::info!(lease = %settings.name, "released the lease"),
                Err(e) => tracing::warn!(error = %e, "could not release the lease"),
            }
        }
    });
    handle
}
