//! The node controller initialises nodes that kubelets registered with
//! `--cloud-provider=external` (provider ID, topology and instance-type
//! labels, addresses, then the uninitialized taint comes off), keeps their
//! addresses current, and removes Nodes whose instance is gone or taints
//! those whose instance is shut down. It talks to the cloud only through
//! the gateway, in batches, and writes only while it holds its lease.

pub mod args;
pub mod context;
pub mod csr;
pub mod error;
pub mod metrics;
pub mod plan;
pub mod reconcile;
pub mod serving_csrs;
pub mod tagging;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ccm_runtime::controller::{Base, lead, settle};
use ccm_runtime::gateway::Capability;
use ccm_runtime::queue::{Backoff, WorkQueue};
use ccm_runtime::view::{self, Seen, Views};
use ccm_runtime::watch::{self, follow};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::args::Settings;
use crate::context::Context;
use crate::metrics::Metrics;

/// The name events are reported under, as upstream's.
pub const CONTROLLER_NAME: &str = "cloud-node-controller";

/// Failed syncs retry after 50 ms, doubling up to 5 minutes.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(50),
    max: Duration::from_secs(300),
};

pub use ccm_runtime::controller::Running;

/// Starts the controller; it runs until `shutdown`.
pub async fn start(settings: Settings, shutdown: CancellationToken) -> anyhow::Result<Running> {
    let base = Base::start(
        &settings.common,
        CONTROLLER_NAME,
        Metrics::register,
        &shutdown,
    )
    .await?;
    let readiness = base.readiness.clone();
    let nodes: Api<Node> = Api::all(base.client.clone());
    // The cache runs on every replica, so a standby is warm when it takes
    // over; only a leader acts on what it sees.
    let store = Views::default();
    let stream = view::watch(nodes.clone());
    let csrs = settings.approve_serving_csrs.then(|| {
        let api: Api<CertificateSigningRequest> = Api::all(base.client.clone());
        let (csr_store, csr_stream) = ccm_runtime::watch::cached(api.clone());
        (serving_csrs::ServingCsrs::new(api, csr_store), csr_stream)
    });
    let (csrs, csr_stream) = match csrs {
        Some((c, stream)) => (Some(c), Some(stream)),
        None => (None, None),
    };
    let ctx = Arc::new(Context {
        nodes: nodes.clone(),
        store: store.clone(),
        gateway: base.gateway.clone(),
        recorder: base.recorder.clone(),
        client: base.client.clone(),
        reporter: base.reporter.clone(),
        metrics: base.metrics.clone(),
        leadership: base.leadership.clone(),
        tagging: tagging::Tagging::new(&settings.instance_tags),
        csrs,
        settings,
        queue: WorkQueue::new(BACKOFF).with_metrics(base.metrics.queue.clone()),
        finishing: Default::default(),
        instance_batch: Default::default(),
        held_back: std::sync::Mutex::new(None),
    });
    base.inspect(
        CONTROLLER_NAME,
        &ctx.queue,
        (ccm_runtime::inspect::cluster_key, String::clone),
        Box::new({
            let ctx = Arc::downgrade(&ctx);
            move || ctx.upgrade().map(|ctx| ctx.inspect()).unwrap_or_default()
        }),
        Box::new({
            let ctx = Arc::downgrade(&ctx);
            move |name| {
                ctx.upgrade()
                    .map(|ctx| ctx.inspect_node(name))
                    .unwrap_or_default()
            }
        }),
    );
    tokio::spawn({
        let (ctx, readiness) = (ctx.clone(), readiness.clone());
        let strings = ccm_runtime::view::Interner::default();
        // Every write may need a sync (labels, taints), so every event
        // queues its node.
        view::follow(
            "node",
            stream,
            store,
            shutdown.clone(),
            move |node| plan::NodeView::of(node, &strings),
            move |seen| match seen {
                Seen::Changed { view: node, .. } | Seen::Unchanged(node) => {
                    if ctx.leadership.is_leader() {
                        ctx.queue.add(node.name.clone());
                        if let Some(t) = ctx.tagging.as_ref().filter(|t| t.needs_tags(node)) {
                            t.tag.add(node.name.clone());
                        }
                    }
                }
                Seen::Synced => readiness.set(true),
                Seen::Deleted(node) => {
                    if let Some(t) = &ctx.tagging {
                        t.forget(&node.name);
                        if ctx.leadership.is_leader() && !node.provider_id.is_empty() {
                            t.untag.add(node.provider_id.clone());
                        }
                    }
                }
            },
        )
    });

    if let Some(stream) = csr_stream {
        let ctx = ctx.clone();
        tokio::spawn(follow(
            "certificatesigningrequest",
            stream,
            shutdown.clone(),
            |_| (),
            move |seen| {
                if let watch::Seen::Changed(c) | watch::Seen::Unchanged(c) = seen
                    && let Some(csrs) = &ctx.csrs
                    && ctx.leadership.is_leader()
                    && serving_csrs::is_pending(c)
                {
                    csrs.queue.add(c.name_any());
                }
            },
        ));
    }

    let task = tokio::spawn(run(ctx, shutdown));
    Ok(base.running(task))
}

async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let supported = ccm_runtime::gateway::supports(&ctx.gateway, Capability::Instances, &shutdown);
    let Some(supported) = supported.await? else {
        return Ok(());
    };
    if !supported {
        anyhow::bail!("the cloud provider does not support instances");
    }
    let info = ctx.gateway.provider_info().await?;
    if ctx.tagging.is_some() && !info.instance_tags {
        anyhow::bail!(
            "--instance-tags needs a cloud provider that tags instances (the gateway's does not)"
        );
    }
    ctx.instance_batch.store(
        info.instance_batch as usize,
        std::sync::atomic::Ordering::Relaxed,
    );
    if ctx.tagging.is_some() {
        // Once for the process: they act only while this replica leads.
        tokio::spawn(tagging::worker::tag_worker(ctx.clone()));
        tokio::spawn(tagging::worker::untag_worker(ctx.clone()));
    }
    if ctx.csrs.is_some() {
        tokio::spawn(serving_csrs::worker::worker(ctx.clone()));
    }
    // Awaited each time this replica leads, so it may say so first.
    let caches = || {
        let ctx = ctx.clone();
        async move {
            tracing::info!(
                "leading; starting node initialisation, address sync and lifecycle checks"
            );
            ctx.store.wait_until_ready().await.context("node cache")
        }
    };
    let led = lead(&ctx.leadership, &ctx.queue, caches, &shutdown, |work| {
        let term = tokio::time::Instant::now();
        for node in ctx.store.state() {
            ctx.queue.add(node.name.clone());
            if let Some(t) = ctx.tagging.as_ref().filter(|t| t.needs_tags(&node)) {
                t.tag.add(node.name.clone());
            }
        }
        if let Some(c) = &ctx.csrs {
            for csr in c
                .store
                .state()
                .iter()
                .filter(|c| serving_csrs::is_pending(c))
            {
                c.queue.add(csr.name_any());
            }
        }
        for _ in 0..ctx.settings.workers {
            work.worker(worker(ctx.clone()));
        }
        work.pass(reconcile::finish_initialised(ctx.clone(), term));
        work.pass(every(
            ctx.clone(),
            ctx.settings.status_period,
            |ctx| async move { reconcile::sync_addresses(&ctx).await },
        ));
        work.pass(every(
            ctx.clone(),
            ctx.settings.monitor_period,
            |ctx| async move { reconcile::monitor(&ctx).await },
        ));
    })
    .await;
    if let Some(t) = &ctx.tagging {
        t.tag.close();
        t.untag.close();
    }
    if let Some(c) = &ctx.csrs {
        c.queue.close();
    }
    led
}

/// `nodes` cut down to whole cloud calls of `per_call` nodes, when it is
/// more than one call (`per_call` 0: unknown, left as it is). A worker's
/// share of 188 nodes was a full call and one of 88 that went alone more
/// often than not; cut to 100, the other 88 go with the next worker's.
fn in_whole_calls(nodes: usize, per_call: usize) -> usize {
    if per_call == 0 || nodes <= per_call {
        nodes
    } else {
        nodes / per_call * per_call
    }
}

/// Takes a key, and with an uninitialised node a fair share of the other
/// uninitialised nodes waiting (at most a lookup batch, in whole calls of
/// the gateway's), which are looked up in one gateway call. With one node
/// per worker, at most as many lookups as workers ever waited to be
/// batched (BENCHMARKS.md, scenario 1, has the figures before and after).
/// A worker that leaves no such node waiting says so to the gateway, which
/// then sends the lookup without waiting for more (round seven).
async fn worker(ctx: Arc<Context>) {
    while let Some(name) = ctx.queue.next().await {
        let started = std::time::Instant::now();
        let mut names = vec![name];
        // Whether no other node waits for initialisation behind these.
        let mut drained = false;
        if reconcile::waits_for_initialisation(&ctx, &names[0]) {
            let waiting = ctx.queue.len();
            let per_call = ctx
                .instance_batch
                .load(std::sync::atomic::Ordering::Relaxed);
            let share = waiting
                .div_ceil(ctx.settings.workers)
                .min(ctx.settings.batch_size.saturating_sub(1));
            let share = in_whole_calls(share + 1, per_call) - 1;
            let taken = ctx.queue.take(share, |name| {
                reconcile::waits_for_initialisation(&ctx, name)
            });
            // Fewer than asked: the queue holds no other such node.
            drained = taken.len() < share || ctx.queue.is_empty();
            names.extend(taken);
        }
        let results = reconcile::sync_nodes(&ctx, &names, drained).await;
        for (name, result) in names.iter().zip(results) {
            ctx.metrics.reconciles.inc();
            let errors = &ctx.metrics.reconcile_errors;
            if let Some((e, retry_in)) = settle(&ctx.queue, name, result, errors) {
                tracing::warn!(node = %name, error = %e, ?retry_in, "node sync failed");
            }
            ctx.metrics
                .reconcile_duration
                .observe(started.elapsed().as_secs_f64());
            ctx.queue.done(name);
        }
    }
}

/// Runs `pass` now and then every `period` after the previous pass ended,
/// while this replica leads.
async fn every<F, Fut>(ctx: Arc<Context>, period: Duration, pass: F)
where
    F: Fn(Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    while ctx.leadership.is_leader() {
        pass(ctx.clone()).await;
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::in_whole_calls;

    #[test]
    fn a_share_past_one_call_is_cut_to_whole_calls() {
        assert_eq!(in_whole_calls(7, 100), 7);
        assert_eq!(in_whole_calls(100, 100), 100);
        assert_eq!(in_whole_calls(188, 100), 100);
        assert_eq!(in_whole_calls(499, 100), 400);
        assert_eq!(in_whole_calls(188, 0), 188);
        assert_eq!(in_whole_calls(3, 1), 3);
    }
}
