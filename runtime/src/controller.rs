//! What every controller shares: its start-up ([`Base`]: the Kubernetes
//! and gateway clients, its metrics registry behind the admin server, its
//! identity and leader election, and its event recorder), the handle of a
//! started controller ([`Running`]), leading ([`lead`]), the failures of a
//! sync ([`SyncError`]) and what a worker does with them ([`settle`]).

use std::future::Future;
use std::hash::Hash;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use ccm_proto::GatewayClient;
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::admin::Readiness;
use crate::common_args::Common;
use crate::inspect::{ControllerInspector, Extra, Inspection, Keys, ObjectExtra};
use crate::leader::Leadership;
use crate::metrics::{ErrorCounts, LeaderGauge};
use crate::queue::WorkQueue;
use crate::shutdown::or_shutdown;

/// How long a stopping controller waits for its lease to be released.
const LEASE_RELEASE: std::time::Duration = std::time::Duration::from_secs(3);

/// What a controller has once started, before its own work begins.
pub struct Base<M> {
    pub client: kube::Client,
    pub gateway: GatewayClient,
    pub metrics: M,
    /// Set when the controller's caches have synced.
    pub readiness: Readiness,
    pub admin_addr: SocketAddr,
    pub leadership: Leadership,
    /// Events reported as `controller`, instance = this replica's identity.
    pub recorder: Recorder,
    /// Who `recorder` reports as, for [`publish_once`].
    pub reporter: Reporter,
    /// What the admin server's `/debug/` answers from, once the controller
    /// sets it.
    pub inspection: Inspection,
    /// The lease this controller leads by.
    pub lease: String,
}

impl<M> Base<M> {
    /// Builds the clients, registers `metrics`, serves the admin endpoints
    /// and starts leader election, which ends with `shutdown`.
    pub async fn start(
        common: &Common,
        controller: &str,
        metrics: impl FnOnce(&mut Registry) -> M,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Self> {
        let client = crate::kube::client(common.kubeconfig.as_deref()).await?;
        let gateway = crate::gateway::client(&common.gateway)?;
        let identity = crate::leader::default_identity();
        let leadership = crate::leader::start(
            client.clone(),
            &common.lease,
            identity.clone(),
            shutdown.clone(),
        );
        let mut registry = Registry::default();
        let metrics = metrics(&mut registry);
        crate::version::register(&mut registry);
        let review_counts = crate::admin::access::register(&mut registry);
        registry
            .sub_registry_with_label(("lease".into(), common.lease.name.clone().into()))
            .register(
                "ccm_controller_leader",
                "1 while this replica holds the controller's lease (named by the label), else 0",
                LeaderGauge(leadership.clone()),
            );
        let readiness = Readiness::new();
        let inspection = Inspection::new();
        let reviews = crate::admin::access::Reviews::new(
            client.clone(),
            &common.admin.reviews,
            review_counts,
        );
        let security = crate::admin::Security {
            tls: common.admin.server_tls(shutdown)?,
            access: crate::admin::access::Access::new(
                common.admin.always_allow.clone(),
                Some(reviews.check()),
            ),
        };
        let admin_addr = crate::admin::spawn(
            common.admin_listen,
            registry,
            readiness.clone(),
            inspection.clone(),
            security,
        )
        .await
        .with_context(|| format!("bind admin address {}", common.admin_listen))?;
        if let Some(diagnostics) = &common.diagnostics {
            let bound = crate::diagnostics::spawn(
                diagnostics,
                client.clone(),
                identity.clone(),
                inspection.clone(),
                shutdown.clone(),
            )
            .await?;
            tracing::info!(address = %bound, "serving the diagnostics API");
        }
        let reporter = Reporter {
            controller: controller.into(),
            instance: Some(identity),
        };
        let recorder = Recorder::new(client.clone(), reporter.clone());
        Ok(Self {
            client,
            gateway,
            metrics,
            readiness,
            admin_addr,
            leadership,
            recorder,
            reporter,
            inspection,
            lease: common.lease.name.clone(),
        })
    }

    /// Serves `/debug/` for a controller working `queue`: what every
    /// controller tells, and its own `extra` fields.
    pub fn inspect<K: Clone + Eq + Hash + Send + Sync + 'static>(
        &self,
        controller: &'static str,
        queue: &WorkQueue<K>,
        keys: Keys<K>,
        extra: Extra,
        object_extra: ObjectExtra<K>,
    ) {
        self.inspection
            .set(std::sync::Arc::new(ControllerInspector {
                controller,
                lease: self.lease.clone(),
                leadership: self.leadership.clone(),
                gateway: self.gateway.clone(),
                queue: queue.clone(),
                parse: keys.0,
                show: keys.1,
                extra,
                object_extra,
            }));
    }

    /// The handle of the controller whose work is `task`.
    pub fn running(&self, task: JoinHandle<anyhow::Result<()>>) -> Running {
        Running {
            admin_addr: self.admin_addr,
            leadership: self.leadership.clone(),
            task,
        }
    }
}

/// A started controller.
pub struct Running {
    /// The admin server's address.
    pub admin_addr: SocketAddr,
    /// Its leadership, for tests and status.
    pub leadership: Leadership,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Waits until the controller stops: `Ok` after shutdown, an error if it
    /// lost its lease or failed.
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.task.await.context("controller task");
        // A leader that is shutting down hands its lease over first.
        self.leadership.ended(LEASE_RELEASE).await;
        result?
    }
}

/// How long a term that ended waits for its workers to finish the keys
/// they hold (their writes already refuse: this replica no longer leads)
/// before they are stopped.
const TERM_GRACE: Duration = Duration::from_secs(30);

/// What one term of leadership runs. Workers end when the term's queue
/// closes; passes are stopped when the term ends. Nothing of one term
/// runs into the next.
pub struct TermWork {
    /// Which term, and whether it continues this replica's previous one.
    pub term: crate::leader::Term,
    ended: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
}

impl TermWork {
    fn new(term: crate::leader::Term) -> Self {
        Self {
            term,
            ended: CancellationToken::new(),
            tasks: tokio::task::JoinSet::new(),
        }
    }

    /// Runs `worker`, which takes keys from the queue until it closes.
    pub fn worker(&mut self, worker: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(worker);
    }

    /// Runs `pass` (a periodic pass, a loop on a trigger) until it returns
    /// or the term ends.
    pub fn pass(&mut self, pass: impl Future<Output = ()> + Send + 'static) {
        let ended = self.ended.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = pass => {}
                _ = ended.cancelled() => {}
            }
        });
    }

    /// Ends the term: passes stop at once, workers get [`TERM_GRACE`] to
    /// finish the key in hand.
    async fn end(mut self) {
        self.ended.cancel();
        let finished = tokio::time::timeout(TERM_GRACE, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if finished.is_err() {
            tracing::warn!(
                term = self.term.number,
                "workers still busy {TERM_GRACE:?} after the term ended; stopping them"
            );
            self.tasks.shutdown().await;
        }
    }
}

/// Publishes `event` about `reference` as a new Event, outside the
/// series kube's `Recorder` makes: the recorder keeps every event it
/// published for six minutes, to count repeats, and looks through them all
/// at each publish. For an event each object gets once (a Node initialised,
/// a certificate decided), that is one kept event per object: 100,000 Nodes
/// joining left the node controller holding hundreds of MiB of them.
pub async fn publish_once(
    client: &kube::Client,
    reporter: &Reporter,
    event: &kube::runtime::events::Event,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
) -> kube::Result<()> {
    Recorder::new(client.clone(), reporter.clone())
        .publish(event, reference)
        .await
}

/// Runs the leading part of a controller, one term after another. Each
/// time this replica takes the lease it awaits `caches()` (so that future
/// may first log that this replica leads), opens `queue`, and calls
/// `start`, which queues the first keys and starts the term's workers and
/// passes. When the term ends (the lease lost, or not renewed within the
/// deadline) the queue closes, the term's work stops, and the replica
/// stands by to lead again, caches warm, with no restart. Returns `Ok` at
/// shutdown (nothing is started after it), an error if the caches fail.
pub async fn lead<K, C>(
    leadership: &Leadership,
    queue: &WorkQueue<K>,
    caches: impl Fn() -> C,
    shutdown: &CancellationToken,
    mut start: impl FnMut(&mut TermWork),
) -> anyhow::Result<()>
where
    K: Clone + Eq + Hash + Send + 'static,
    C: Future<Output = anyhow::Result<()>>,
{
    let mut last = 0;
    loop {
        let term = tokio::select! {
            term = leadership.next_term(last) => match term {
                Some(term) => term,
                None => return Ok(()),
            },
            _ = shutdown.cancelled() => return Ok(()),
        };
        let Some(synced) = or_shutdown(shutdown, caches()).await else {
            return Ok(());
        };
        synced?;
        last = term.number;
        queue.reopen();
        let mut work = TermWork::new(term);
        start(&mut work);
        queue.started();
        let shutting_down = tokio::select! {
            _ = leadership.lost(term) => false,
            _ = shutdown.cancelled() => true,
        };
        queue.close();
        if shutting_down {
            return Ok(());
        }
        tracing::warn!(
            term = term.number,
            "no longer leading: work stopped; standing by to lead again"
        );
        work.end().await;
    }
}

/// What can go wrong in a controller's sync: what can in every controller,
/// and the controller's own failures `E`. `?` turns a gateway error, a
/// Kubernetes error or an `E` into one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError<E> {
    /// A gateway call failed.
    #[error("gateway: {0}")]
    Gateway(#[from] ccm_proto::Error),
    /// A Kubernetes API call failed.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// This replica does not lead (any more); it must not write.
    #[error("not the leader")]
    NotLeader,
    /// A failure of the controller's own.
    #[error(transparent)]
    Own(E),
}

/// The failures a controller has beyond those of every controller.
pub trait OwnError: std::error::Error {
    /// A stable label for metrics.
    fn metric_label(&self) -> &'static str;
}

impl<E: OwnError> From<E> for SyncError<E> {
    fn from(e: E) -> Self {
        Self::Own(e)
    }
}

impl<E: OwnError> SyncError<E> {
    /// A stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Gateway(e) => e.metric_label(),
            Self::Kube(_) => "kubernetes",
            Self::NotLeader => "not_leader",
            Self::Own(e) => e.metric_label(),
        }
    }
}

/// What a worker does with the result of syncing `key`: a success forgets
/// the key's failures; a replica that stopped leading leaves the key to the
/// next leader; any other failure is counted in `errors` under its label,
/// and the key is queued again after its backoff. Returns that failure and
/// the delay, for the worker to log. The worker still marks the key done.
pub fn settle<K, E>(
    queue: &WorkQueue<K>,
    key: &K,
    result: Result<(), SyncError<E>>,
    errors: &ErrorCounts,
) -> Option<(SyncError<E>, Duration)>
where
    K: Clone + Eq + Hash + Send + 'static,
    E: OwnError,
{
    match result {
        Ok(()) => {
            queue.forget(key);
            None
        }
        Err(SyncError::NotLeader) => None,
        Err(e) => {
            let delay = queue.retry_failed(key.clone(), errors, e.metric_label(), e.to_string());
            Some((e, delay))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::pending;

    use super::*;
    use crate::metrics::ErrorLabels;
    use crate::queue::Backoff;

    const LIMIT: Duration = Duration::from_secs(5);

    #[derive(Debug, thiserror::Error)]
    #[error("own failure")]
    struct Own;

    impl OwnError for Own {
        fn metric_label(&self) -> &'static str {
            "own"
        }
    }

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(8),
        })
    }

    fn count(errors: &ErrorCounts, error: &'static str) -> u64 {
        errors.get_or_create(&ErrorLabels { error }).get()
    }

    #[test]
    fn labels_and_messages_are_the_shared_kinds_or_the_controllers_own() {
        let gateway = SyncError::<Own>::from(ccm_proto::Error::NotFound {
            reason: String::new(),
            message: "gone".into(),
        });
        let cases = [
            (gateway, "not_found", "gateway: not found: gone"),
            (SyncError::NotLeader, "not_leader", "not the leader"),
            (SyncError::from(Own), "own", "own failure"),
        ];
        for (error, label, message) in cases {
            assert_eq!(
                (error.metric_label(), error.to_string()),
                (label, message.into())
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_sync_is_counted_and_backs_off_until_a_success_forgets_it() {
        let (q, errors) = (queue(), ErrorCounts::default());
        let delays: Vec<_> = (0..2)
            .map(|_| settle(&q, &"a", Err(Own.into()), &errors).map(|(_, d)| d))
            .collect();
        assert_eq!(
            delays,
            [Some(Duration::from_secs(1)), Some(Duration::from_secs(2))]
        );
        assert_eq!(count(&errors, "own"), 2);
        assert!(settle::<_, Own>(&q, &"a", Ok(()), &errors).is_none());
        let (_, delay) = settle(&q, &"a", Err(Own.into()), &errors).unwrap();
        assert_eq!(
            delay,
            Duration::from_secs(1),
            "the success forgot the failures"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let next = tokio::time::timeout(LIMIT, q.next()).await.unwrap();
        assert_eq!(next, Some("a"), "queued again after its backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_stopped_leading_leaves_the_key_to_the_next_leader() {
        let (q, errors) = (queue(), ErrorCounts::default());
        assert!(settle(&q, &"a", Err(SyncError::<Own>::NotLeader), &errors).is_none());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(q.is_empty());
        assert_eq!(count(&errors, "not_leader"), 0);
    }

    #[tokio::test]
    async fn a_leader_starts_once_its_caches_are_ready_and_closes_its_queue_at_shutdown() {
        let (q, shutdown, leader) = (queue(), CancellationToken::new(), Leadership::always());
        let start = |_: &mut TermWork| {
            q.add("first");
            shutdown.cancel();
        };
        let led = lead(&leader, &q, || async { anyhow::Ok(()) }, &shutdown, start);
        tokio::time::timeout(LIMIT, led).await.unwrap().unwrap();
        assert_eq!(q.next().await, Some("first"));
        assert_eq!(q.next().await, None, "closed");
    }

    #[tokio::test]
    async fn shutdown_before_the_caches_are_ready_starts_nothing() {
        let (q, shutdown, leader) = (queue(), CancellationToken::new(), Leadership::always());
        shutdown.cancel();
        let mut started = false;
        let led = lead(
            &leader,
            &q,
            pending::<anyhow::Result<()>>,
            &shutdown,
            |_| started = true,
        );
        tokio::time::timeout(LIMIT, led).await.unwrap().unwrap();
        assert!(!started);
    }

    #[tokio::test]
    async fn caches_that_fail_fail_the_controller() {
        let (q, shutdown, leader) = (queue(), CancellationToken::new(), Leadership::always());
        let caches = || async { Err(anyhow::anyhow!("node cache")) };
        let led = lead(&leader, &q, caches, &shutdown, |_| {});
        let result = tokio::time::timeout(LIMIT, led).await.unwrap();
        assert_eq!(result.unwrap_err().to_string(), "node cache");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_loses_its_term_stops_its_work_and_leads_again_when_it_can() {
        let (leader, control) = Leadership::manual(Duration::from_secs(3600));
        let (q, shutdown) = (queue(), CancellationToken::new());
        let passes = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
        let led = tokio::spawn({
            let (leader, q, shutdown, passes) =
                (leader.clone(), q.clone(), shutdown.clone(), passes.clone());
            async move {
                lead(
                    &leader,
                    &q,
                    || async { anyhow::Ok(()) },
                    &shutdown,
                    |work| {
                        terms_tx.send(work.term).unwrap();
                        q.add("key");
                        let q = q.clone();
                        work.worker(async move {
                            while let Some(key) = q.next().await {
                                q.done(&key);
                            }
                        });
                        let passes = passes.clone();
                        work.pass(async move {
                            loop {
                                passes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                        });
                    },
                )
                .await
            }
        });
        control.lead(1, false);
        let first = tokio::time::timeout(LIMIT, terms.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((first.number, first.continues), (1, false));

        // The term ends: its pass stops, the queue takes nothing.
        control.stand_by();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let stopped_at = passes.load(std::sync::atomic::Ordering::SeqCst);
        q.add("while standing by");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            passes.load(std::sync::atomic::Ordering::SeqCst),
            stopped_at,
            "the pass of the ended term stopped"
        );

        // The same process leads again, without a restart.
        control.lead(2, true);
        let second = tokio::time::timeout(LIMIT, terms.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((second.number, second.continues), (2, true));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(passes.load(std::sync::atomic::Ordering::SeqCst) > stopped_at);
        assert!(!led.is_finished(), "still running");

        // A term past its renew deadline ends too, and is not led again.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let expired_at = passes.load(std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(passes.load(std::sync::atomic::Ordering::SeqCst), expired_at);
        assert!(terms.try_recv().is_err(), "no term started again");
        shutdown.cancel();
        tokio::time::timeout(LIMIT, led)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}
