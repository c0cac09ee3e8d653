//! The service controller gives every Service of type LoadBalancer (of the
//! classes it serves) a cloud load balancer through the gateway: finalizer
//! first, then ensure, then the ingress in the Service's status; on type
//! change or deletion it deletes the load balancer and releases the
//! finalizer. Node changes are gathered for a short window and sent as one
//! host update per load balancer. Errors the user can fix (an invalid
//! annotation) become a Warning event and a Service condition, never a
//! cloud write.

pub mod args;
pub mod context;
pub mod endpoints;
pub mod error;
pub mod membership;
pub mod metrics;
pub mod plan;
pub mod reconcile;
pub mod subsets;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use ccm_runtime::controller::{Base, lead, settle};
use ccm_runtime::queue::{Backoff, WorkQueue};
use ccm_runtime::view::{self, Views};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::args::Settings;
use crate::context::Context;
use crate::error::{Error, ServiceError};
use crate::metrics::Metrics;
use crate::plan::ServiceView;

/// The name events are reported under, as upstream's.
pub const CONTROLLER_NAME: &str = "service-controller";

/// Upstream's per-Service backoff: 5 s doubling to 300 s.
const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(5),
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

    let service_stream = view::watch(Api::<Service>::all(client.clone()));
    let nodes = Views::default();
    let nodes_changed = Arc::new(Notify::new());
    let ctx = Arc::new(Context {
        client: client.clone(),
        services: Views::default(),
        nodes: nodes.clone(),
        slices: Views::default(),
        slice_nodes: Default::default(),
        slices_followed: Default::default(),
        serving: Mutex::default(),
        serving_changed: Mutex::default(),
        hosts_pass_full: Default::default(),
        backing: Arc::new(context::Backing::new(nodes)),
        gateway: base.gateway.clone(),
        recorder: base.recorder.clone(),
        metrics: base.metrics.clone(),
        leadership: base.leadership.clone(),
        settings,
        queue: WorkQueue::new(BACKOFF).with_metrics(base.metrics.queue.clone()),
        hosts_given: Default::default(),
        hosts_due: nodes_changed.clone(),
        host_label_annotations: std::sync::OnceLock::new(),
        host_limits: std::sync::OnceLock::new(),
        provisioning: Mutex::new(HashMap::new()),
        hosts_changed_at: Mutex::new(None),
        changed_since: Mutex::new(HashMap::new()),
        orphaned: Mutex::new(Vec::new()),
        applied: Mutex::new(HashMap::new()),
    });
    base.inspect(
        CONTROLLER_NAME,
        &ctx.queue,
        (ccm_runtime::inspect::namespaced_key, |(ns, name)| {
            format!("{ns}/{name}")
        }),
        Box::new({
            let ctx = Arc::downgrade(&ctx);
            move || ctx.upgrade().map(|ctx| ctx.inspect()).unwrap_or_default()
        }),
        Box::new({
            let ctx = Arc::downgrade(&ctx);
            move |key| {
                ctx.upgrade()
                    .map(|ctx| ctx.inspect_service(key))
                    .unwrap_or_default()
            }
        }),
    );

    // Services: a sync when what matters changed, or cleanup is due.
    let synced = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Readiness needs every cache (Services, Nodes, EndpointSlices); each
    // stream's first sync counts once.
    let synced_once = {
        let (synced, readiness) = (synced.clone(), readiness.clone());
        move || {
            if synced.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 2 {
                readiness.set(true);
            }
        }
    };
    tokio::spawn({
        let ctx = ctx.clone();
        let mut synced = Some(synced_once.clone());
        let hosts_due = nodes_changed.clone();
        view::follow(
            "service",
            service_stream,
            ctx.services.clone(),
            shutdown.clone(),
            ServiceView::of,
            move |seen| {
                match &seen {
                    view::Seen::Changed { view, before } => {
                        follow_endpoints_of(&ctx, *before, Some(view), &hosts_due)
                    }
                    view::Seen::Deleted(view) => {
                        follow_endpoints_of(&ctx, Some(view), None, &hosts_due)
                    }
                    _ => {}
                }
                match seen {
                    view::Seen::Changed { view, .. } | view::Seen::Unchanged(view) => {
                        let Some(svc) = view.service() else {
                            // No longer a load balancer: no change of it waits.
                            if let view::Seen::Changed {
                                before: Some(before),
                                ..
                            } = &seen
                                && let Some(svc) = before.service()
                            {
                                ctx.take_change(&(
                                    svc.namespace().unwrap_or_default(),
                                    svc.name_any(),
                                ));
                            }
                            return;
                        };
                        // Only a change of what its load balancer is made of
                        // (or a new Service) needs a sync; cleanup always.
                        let changed = match seen {
                            view::Seen::Changed { before, .. } => {
                                before.and_then(ServiceView::fingerprint) != view.fingerprint()
                            }
                            _ => false,
                        };
                        if changed || plan::needs_cleanup(svc) {
                            let key = (svc.namespace().unwrap_or_default(), svc.name_any());
                            if plan::wants_load_balancer(svc, &ctx.settings.classes) {
                                ctx.note_change(&key);
                            }
                            ctx.queue.add(key);
                        }
                    }
                    view::Seen::Synced => {
                        if let Some(mark) = synced.take() {
                            mark();
                        }
                    }
                    view::Seen::Deleted(view) => {
                        if let Some(svc) = view.service() {
                            ctx.take_change(&(svc.namespace().unwrap_or_default(), svc.name_any()));
                        }
                    }
                }
            },
        )
    });

    follow_nodes(&ctx, nodes_changed.clone(), synced_once.clone(), &shutdown);
    follow_slices(&ctx, nodes_changed.clone(), synced_once, &shutdown);
    let task = tokio::spawn(run(ctx, nodes_changed, shutdown));
    Ok(base.running(task))
}

async fn run(
    ctx: Arc<Context>,
    nodes_changed: Arc<Notify>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let info = ccm_runtime::gateway::provider_info(&ctx.gateway, &shutdown);
    let Some(info) = info.await? else {
        return Ok(());
    };
    let supported = info.load_balancers;
    // Nodes' labels are kept only where the provider selects hosts by them:
    // those the views took before it said go now.
    let labels = !info.host_label_annotations.is_empty();
    let _ = ctx
        .host_limits
        .set(ccm_runtime::gateway::host_limits(&info));
    let _ = ctx.host_label_annotations.set(info.host_label_annotations);
    if !labels {
        ctx.nodes.rewrite(plan::NodeView::without_labels);
        ctx.backing.note_all();
    }
    // Upstream skips the controller then; a Deployment that exited would
    // restart forever, so it idles (and stays ready), as the route
    // controller does without routes.
    if !supported {
        tracing::warn!(
            "the cloud provider does not support external load balancers: not managing any"
        );
        shutdown.cancelled().await;
        return Ok(());
    }
    // Awaited each time this replica leads, so it may say so first.
    let caches = || {
        let ctx = ctx.clone();
        async move {
            tracing::info!(classes = ?ctx.settings.classes, "leading; syncing load balancers");
            ctx.services
                .wait_until_ready()
                .await
                .context("service cache")?;
            ctx.nodes.wait_until_ready().await.context("node cache")?;
            ctx.slices
                .wait_until_ready()
                .await
                .context("endpoint slice cache")
        }
    };
    lead(&ctx.leadership, &ctx.queue, caches, &shutdown, |work| {
        ctx.begin_term(work.term);
        for view in ctx.services.state() {
            let Some(svc) = view.service() else {
                continue;
            };
            if plan::wants_load_balancer(svc, &ctx.settings.classes) || plan::has_finalizer(svc) {
                ctx.queue
                    .add((svc.namespace().unwrap_or_default(), svc.name_any()));
            }
        }
        for _ in 0..ctx.settings.workers {
            work.worker(worker(ctx.clone()));
        }
        work.pass({
            let (ctx, nodes_changed) = (ctx.clone(), nodes_changed.clone());
            async move {
                loop {
                    nodes_changed.notified().await;
                    // Gather what else changes within the window, then one pass.
                    tokio::time::sleep(ctx.settings.debounce).await;
                    if !ctx.leadership.is_leader() {
                        return;
                    }
                    // Node changes concern every load balancer; serving
                    // endpoints only their own Service's.
                    let full = ctx
                        .hosts_pass_full
                        .swap(false, std::sync::atomic::Ordering::SeqCst);
                    let serving = ctx.take_serving_changes();
                    reconcile::sync_hosts(&ctx, (!full).then_some(serving)).await;
                }
            }
        });
        work.pass({
            let ctx = ctx.clone();
            async move {
                let mut orphans = reconcile::Orphans::default();
                while ctx.leadership.is_leader() {
                    reconcile::check_orphans(&ctx, &mut orphans).await;
                    tokio::time::sleep(ctx.settings.orphan_period).await;
                }
            }
        });
    })
    .await
}

/// Follows every Node into the controller's views: a change of what host
/// sets are made of wakes the debounced host pass. A view keeps the Node's
/// labels unless the provider has said it selects no hosts by label (until
/// it has said, it might).
fn follow_nodes(
    ctx: &Arc<Context>,
    nodes_changed: Arc<Notify>,
    synced_once: impl FnOnce() + Send + 'static,
    shutdown: &CancellationToken,
) {
    let stream = view::watch(Api::<Node>::all(ctx.client.clone()));
    let strings = ccm_runtime::view::Interner::default();
    let ctx = ctx.clone();
    let mut synced = Some(synced_once);
    tokio::spawn(view::follow(
        "node",
        stream,
        ctx.nodes.clone(),
        shutdown.clone(),
        {
            let ctx = ctx.clone();
            move |node| {
                let labels = ctx
                    .host_label_annotations
                    .get()
                    .is_none_or(|a| !a.is_empty());
                plan::NodeView::of(node, &strings, labels)
            }
        },
        move |seen| match seen {
            view::Seen::Changed { view, before }
                if before.is_some_and(|b| b.hosting() == view.hosting()) =>
            {
                // Addresses: the host lists change, no host pass is due.
                ctx.backing.note(&view.name);
            }
            view::Seen::Changed { view, .. } | view::Seen::Deleted(view) => {
                ctx.backing.note(&view.name);
                ctx.note_node_change();
                ctx.hosts_pass_full
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                nodes_changed.notify_one()
            }
            view::Seen::Synced => {
                if let Some(mark) = synced.take() {
                    mark();
                }
                ctx.hosts_pass_full
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                nodes_changed.notify_one();
            }
            view::Seen::Unchanged(_) => {}
        },
    ));
}

/// Follows the EndpointSlices of every Local load balancer into the nodes
/// serving it ([`endpoints`]); of other Services' slices only their
/// Service is kept. A change of a Local Service's serving nodes wakes the
/// host pass for that Service alone, and a node that stopped serving wakes
/// it again once its grace period is out. The watch begins once the
/// Services are known, so each slice is seen with its Service.
fn follow_slices(
    ctx: &Arc<Context>,
    hosts_due: Arc<Notify>,
    synced_once: impl FnOnce() + Send + 'static,
    shutdown: &CancellationToken,
) {
    let config = kube::runtime::watcher::Config::default().labels(endpoints::LABEL_SERVICE_NAME);
    let api = Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::all(ctx.client.clone());
    let ctx = ctx.clone();
    let mut synced = Some(synced_once);
    let slices = ctx.slices.clone();
    let shutdown = shutdown.clone();
    let on_change = {
        let ctx = ctx.clone();
        move |slice: &endpoints::SliceView, nodes: Option<&[Arc<str>]>| {
            let now = std::time::Instant::now();
            let change = ctx.serving.lock().unwrap_or_else(|e| e.into_inner()).apply(
                &slice.service,
                &slice.name,
                nodes,
                now,
            );
            serving_changed(&ctx, &slice.service, change, &hosts_due);
        }
    };
    tokio::spawn(async move {
        if ctx.services.wait_until_ready().await.is_err() {
            return;
        }
        ctx.slices_followed
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let stream = view::watch_with(api, config);
        view::follow(
            "endpoint slice",
            stream,
            slices,
            shutdown,
            {
                let ctx = ctx.clone();
                move |slice| {
                    let follow = ctx.follows_endpoints_of(&endpoints::service_of(slice));
                    endpoints::SliceView::of(slice, &ctx.slice_nodes, follow)
                }
            },
            move |seen| match seen {
                view::Seen::Changed { view, before } => {
                    // Relabelled to another Service: gone from the first.
                    if let Some(before) = before.filter(|b| b.service != view.service) {
                        on_change(before, None);
                    }
                    on_change(view, view.nodes.as_deref())
                }
                view::Seen::Deleted(view) => on_change(view, None),
                view::Seen::Synced => {
                    if let Some(mark) = synced.take() {
                        mark();
                    }
                }
                view::Seen::Unchanged(_) => {}
            },
        )
        .await
    });
}

/// After `change` of the nodes serving `key`: the host pass for it is due,
/// and again once the grace of a node that left is out.
fn serving_changed(
    ctx: &Arc<Context>,
    key: &context::Key,
    change: endpoints::Change,
    hosts_due: &Arc<Notify>,
) {
    if change.changed {
        ctx.note_serving_change(key.clone());
        hosts_due.notify_one();
    }
    if change.left {
        let (ctx, hosts_due, key) = (ctx.clone(), hosts_due.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(ctx.settings.local_grace).await;
            let grace = ctx.settings.local_grace;
            ctx.serving
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .expire(grace, std::time::Instant::now());
            ctx.note_serving_change(key);
            hosts_due.notify_one();
        });
    }
}

/// Starts or stops following the nodes that serve a Service, as it
/// becomes a Local load balancer (`before` → `now`) or stops being one.
/// Its slices the watch saw before were kept without their nodes: once the
/// slice watch has begun, they are read again.
fn follow_endpoints_of(
    ctx: &Arc<Context>,
    before: Option<&ServiceView>,
    now: Option<&ServiceView>,
    hosts_due: &Arc<Notify>,
) {
    let follows = |v: Option<&ServiceView>| {
        v.and_then(ServiceView::service)
            .is_some_and(|svc| ctx.follows_endpoints(svc))
    };
    let (was, is) = (follows(before), follows(now));
    let Some(svc) = now.or(before).and_then(ServiceView::service) else {
        return;
    };
    let key = (svc.namespace().unwrap_or_default(), svc.name_any());
    if was && !is {
        ctx.serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&key);
    } else if is
        && !was
        && ctx
            .slices_followed
            .load(std::sync::atomic::Ordering::SeqCst)
    {
        ctx.serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .begin_relist(&key);
        tokio::spawn(read_slices(ctx.clone(), key, hosts_due.clone()));
    }
}

/// Reads the slices of the Service `key`, which became a Local load
/// balancer, into the nodes serving it; tries again while it still is one.
async fn read_slices(ctx: Arc<Context>, key: context::Key, hosts_due: Arc<Notify>) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let api = Api::<EndpointSlice>::namespaced(ctx.client.clone(), &key.0);
    let params = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        endpoints::LABEL_SERVICE_NAME,
        key.1
    ));
    let mut delay = Duration::from_millis(500);
    let read = loop {
        match api.list(&params).await {
            Ok(list) => break Some(list.items),
            Err(e) if ctx.follows_endpoints_of(&key) => {
                tracing::warn!(service = %format!("{}/{}", key.0, key.1), error = %e, ?delay, "could not read the Service's endpoint slices; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
            Err(_) => break None,
        }
    };
    let read = read.map(|slices| {
        slices
            .iter()
            .map(|s| (s.name_any(), endpoints::serving_nodes(s, &ctx.slice_nodes)))
            .collect()
    });
    let change = ctx
        .serving
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .end_relist(&key, read, std::time::Instant::now());
    serving_changed(&ctx, &key, change, &hosts_due);
}

async fn worker(ctx: Arc<Context>) {
    while let Some(key) = ctx.queue.next().await {
        let started = std::time::Instant::now();
        ctx.metrics.syncs.inc();
        match reconcile::sync_service(&ctx, &key).await {
            // The cloud said when: come back exactly then.
            Err(Error::Own(ServiceError::RetryAfter {
                delay,
                reason,
                message,
            })) => {
                let kind = match reason.as_str() {
                    "" => "retry_after".to_owned(),
                    reason => reason.to_lowercase(),
                };
                ctx.queue.wait(key.clone(), &kind, message, delay)
            }
            result => {
                let errors = &ctx.metrics.sync_errors;
                if let Some((e, retry_in)) = settle(&ctx.queue, &key, result, errors) {
                    tracing::warn!(service = %format!("{}/{}", key.0, key.1), error = %e, ?retry_in, "service sync failed");
                }
            }
        }
        ctx.metrics
            .sync_duration
            .observe(started.elapsed().as_secs_f64());
        ctx.queue.done(&key);
    }
}
