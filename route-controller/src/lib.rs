//! The route controller programs one cloud route per pod CIDR of every
//! node (two for dual-stack), deletes this cluster's routes nobody wants
//! (only inside `--cluster-cidr`), and reports the result in each node's
//! `NetworkUnavailable` condition. Node changes that matter trigger a
//! reconcile (at most one per `--min-route-reconcile-interval`), and a slow
//! resync catches the rest, instead of upstream's fixed 10 s poll.

pub mod args;
pub mod context;
pub mod error;
pub mod metrics;
pub mod plan;
pub mod reconcile;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use ccm_runtime::controller::{Base, lead, settle};
use ccm_runtime::gateway::Capability;
use ccm_runtime::queue::{Backoff, WorkQueue};
use ccm_runtime::view::{self, Seen, Views};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::args::Settings;
use crate::context::Context;
use crate::metrics::Metrics;

/// The name events are reported under, as upstream's.
pub const CONTROLLER_NAME: &str = "route_controller";

/// A failed reconcile retries after 1 s, doubling up to 5 minutes.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
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
    let client = base.client.clone();
    let nodes: Api<Node> = Api::all(client.clone());
    // The cache runs on every replica, so a standby is warm when it takes
    // over; only a leader acts on what it sees.
    let store = Views::default();
    let ctx = Arc::new(Context {
        nodes: nodes.clone(),
        store: store.clone(),
        gateway: base.gateway.clone(),
        recorder: base.recorder.clone(),
        metrics: base.metrics.clone(),
        leadership: base.leadership.clone(),
        settings,
        queue: WorkQueue::new(BACKOFF).with_metrics(base.metrics.queue.clone()),
        missing_since: Default::default(),
    });
    // One key: the whole route table; any object names it.
    base.inspect(
        CONTROLLER_NAME,
        &ctx.queue,
        (|_| Ok(()), |_| "routes".to_owned()),
        Box::new({
            let ctx = Arc::downgrade(&ctx);
            move || ctx.upgrade().map(|ctx| ctx.inspect()).unwrap_or_default()
        }),
        Box::new(|_| serde_json::Value::Null),
    );
    tokio::spawn({
        let (ctx, readiness) = (ctx.clone(), readiness.clone());
        view::follow(
            "node",
            view::watch(nodes.clone()),
            store,
            shutdown.clone(),
            plan::NodeInfo::of,
            move |seen| match seen {
                // A change of its own NetworkUnavailable condition (the
                // controller's write) is nothing to route.
                Seen::Changed { view, before } => {
                    if before.is_none_or(|b| b.routing() != view.routing()) {
                        ctx.note_pod_cidrs(view);
                        ctx.queue.add(())
                    }
                }
                Seen::Deleted(_) => ctx.queue.add(()),
                Seen::Synced => {
                    readiness.set(true);
                    ctx.queue.add(());
                }
                Seen::Unchanged(_) => {}
            },
        )
    });

    let task = tokio::spawn(run(ctx, shutdown));
    Ok(base.running(task))
}

async fn run(ctx: Arc<Context>, shutdown: CancellationToken) -> anyhow::Result<()> {
    // Upstream skips the controller in these cases; a Deployment that
    // exited would restart forever, so it idles (and stays ready).
    if !ctx.settings.enabled {
        tracing::info!("--configure-cloud-routes=false: not programming routes");
        shutdown.cancelled().await;
        return Ok(());
    }
    let supported = ccm_runtime::gateway::supports(&ctx.gateway, Capability::Routes, &shutdown);
    let Some(supported) = supported.await? else {
        return Ok(());
    };
    if !supported {
        tracing::warn!("the cloud provider does not support routes: not programming routes");
        shutdown.cancelled().await;
        return Ok(());
    }
    // Awaited each time this replica leads, so it may say so first.
    let caches = || {
        let ctx = ctx.clone();
        async move {
            tracing::info!(cluster_cidrs = ?ctx.settings.cluster_cidrs, "leading; reconciling routes");
            ctx.store.wait_until_ready().await.context("node cache")
        }
    };
    lead(&ctx.leadership, &ctx.queue, caches, &shutdown, |work| {
        ctx.queue.add(());
        work.worker(worker(ctx.clone()));
        work.pass({
            let ctx = ctx.clone();
            async move {
                loop {
                    tokio::time::sleep(ctx.settings.resync_period).await;
                    ctx.queue.add(());
                }
            }
        });
    })
    .await
}

/// Reconciles whenever triggered, never twice within the minimum interval.
async fn worker(ctx: Arc<Context>) {
    while let Some(key) = ctx.queue.next().await {
        let started = std::time::Instant::now();
        ctx.metrics.reconciles.inc();
        let result = reconcile::reconcile(&ctx).await;
        let errors = &ctx.metrics.reconcile_errors;
        if let Some((e, retry_in)) = settle(&ctx.queue, &key, result, errors) {
            tracing::warn!(error = %e, ?retry_in, "route reconcile failed");
        }
        ctx.metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        ctx.queue.done(&key);
        tokio::time::sleep(ctx.settings.min_interval).await;
    }
}
