//! Reads state, asks the gateway, calls `plan`, writes. Three entry points:
//! [`sync_nodes`] (a batch of nodes from the work queue: initialisation or label
//! reconciliation), [`sync_addresses`] (periodic, batched) and [`monitor`]
//! (the lifecycle pass, batched).

use std::time::Duration;

use ccm_proto::v1::{InstanceResult, InstanceState, LookupPurpose};
use ccm_runtime::view::Interner;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use serde_json::json;
use tracing::Instrument as _;

use crate::context::{Context, Initialised};
use crate::error::{Error, NodeError, Result};
use crate::metrics::ActionLabels;
use crate::plan::node_ref;
use crate::plan::{self, NodeView, Triage, Verdict};

const FIELD_MANAGER: &str = ccm_runtime::names::MANAGER_NODE_CONTROLLER;

/// Reads the node fresh, lets `change` modify it, and replaces it with
/// optimistic concurrency, retrying conflicts up to `attempts` times.
/// `change` returns false when there is nothing to write.
async fn update_node(
    ctx: &Context,
    name: &str,
    attempts: u32,
    mut change: impl FnMut(&mut Node) -> bool,
) -> Result<Option<Node>> {
    for attempt in 1..=attempts {
        let mut node = ctx.nodes.get(name).await?;
        if !change(&mut node) {
            return Ok(None);
        }
        ctx.ensure_leader()?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match ctx.nodes.replace(name, &params, &node).await {
            Ok(node) => return Ok(Some(node)),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < attempts => {
                // Someone else wrote in between; read again and re-apply.
                let jitter = Duration::from_millis(fastrand::u64(0..50));
                tokio::time::sleep(Duration::from_millis(50) + jitter).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    unreachable!("the last attempt returns")
}

/// The view of a Node just read from the API, for the decisions.
fn view(node: &Node) -> NodeView {
    NodeView::of(node, &Interner::default())
}

async fn publish(
    ctx: &Context,
    node: &NodeView,
    kind: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_: kind,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    // A node's initialisation happens once: no series to keep for it.
    let result = if action == ACTION_INITIALIZE {
        let reference = node.object_ref();
        ccm_runtime::controller::publish_once(&ctx.client, &ctx.reporter, &event, &reference).await
    } else {
        ctx.recorder.publish(&event, &node.object_ref()).await
    };
    if let Err(e) = result {
        tracing::warn!(node = %node.name, error = %e, reason, "could not publish event");
    }
}

/// The action of the event a Node gets when it is initialised.
const ACTION_INITIALIZE: &str = "Initialize";

/// Whether the cached node `name` waits for initialisation.
pub fn waits_for_initialisation(ctx: &Context, name: &str) -> bool {
    ctx.store
        .get(name)
        .is_some_and(|node| plan::is_uninitialized(&node))
}

/// Writes of one batch's initialisations sent at once.
const WRITES_AT_ONCE: usize = 4;

/// Syncs the named nodes, answering for each in order: those that carry
/// the uninitialized taint are looked up in one gateway call and
/// initialised, [`WRITES_AT_ONCE`] at a time, their addresses and events
/// left to the [`Finishing`](crate::context::Finishing) lane (a node is
/// schedulable once its taint is gone); the others get their topology
/// labels reconciled. `drained`: no other node waits for initialisation
/// behind these, which the gateway is told so that it sends their lookup
/// without waiting for more.
#[tracing::instrument(skip_all, fields(nodes = names.len()))]
pub async fn sync_nodes(ctx: &Context, names: &[String], drained: bool) -> Vec<Result<()>> {
    let mut results: Vec<Result<()>> = Vec::with_capacity(names.len());
    let mut waiting = Vec::new();
    for name in names {
        let node = ctx.store.get(name);
        results.push(match node {
            None => Ok(()),
            Some(node) if plan::is_uninitialized(&node) => {
                waiting.push((results.len(), node));
                Ok(())
            }
            Some(node) => reconcile_labels(ctx, &node).await,
        });
    }
    if waiting.is_empty() {
        return results;
    }
    let initialising = ctx.finishing.initialising();
    let refs = waiting.iter().map(|(_, node)| node_ref(node)).collect();
    match ctx
        .lookup(refs, LookupPurpose::Initialize, false, drained)
        .await
    {
        Ok(found) if found.len() == waiting.len() => {
            let initialised: Vec<_> = futures::stream::iter(waiting.into_iter().zip(found))
                .map(|((i, node), result)| async move {
                    let span = tracing::info_span!("initialize", node = %node.name);
                    (i, initialize(ctx, &node, result).instrument(span).await)
                })
                .buffer_unordered(WRITES_AT_ONCE)
                .collect()
                .await;
            let mut rest = Vec::new();
            for (i, result) in initialised {
                match result {
                    Ok(Some(done)) => rest.push(done),
                    Ok(None) => {}
                    Err(e) => results[i] = Err(e),
                }
            }
            drop(initialising);
            for done in rest {
                ctx.finishing.send(done).await;
            }
        }
        Ok(found) => {
            let e = format!(
                "the gateway answered {} results for {} nodes",
                found.len(),
                waiting.len()
            );
            for (i, _) in waiting {
                results[i] = Err(NodeError::Invalid(e.clone()).into());
            }
        }
        Err(e) => {
            for (i, _) in waiting {
                results[i] = Err(Error::Gateway(e.clone()));
            }
        }
    }
    results
}

/// Puts the topology labels of an initialised node right, if they drifted.
async fn reconcile_labels(ctx: &Context, node: &NodeView) -> Result<()> {
    let labels = plan::reconcile_labels(node);
    if labels.is_empty() {
        return Ok(());
    }
    ctx.ensure_leader()?;
    let patch = json!({"metadata": {"labels": labels}});
    ctx.nodes
        .patch(
            &node.name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(patch),
        )
        .await?;
    Ok(())
}

/// Addresses and events of initialised nodes written at once.
const FINISHING_AT_ONCE: usize = 8;

/// Writes the addresses and event of the nodes initialised in the term
/// that began at `term`, [`FINISHING_AT_ONCE`] at a time, until the term
/// ends.
pub async fn finish_initialised(ctx: std::sync::Arc<Context>, term: tokio::time::Instant) {
    let mut rx = ctx.finishing.receiver().await;
    futures::stream::poll_fn(|cx| rx.poll_recv(cx))
        .filter(|done| std::future::ready(done.at >= term))
        .for_each_concurrent(FINISHING_AT_ONCE, |done| {
            let span = tracing::info_span!("initialize", node = %done.node.name);
            let ctx = &ctx;
            async move {
                ctx.finishing.behind_initialisations(done.at).await;
                finish_initialising(ctx, done).await
            }
            .instrument(span)
        })
        .await;
}

/// Initialises `node` with what the gateway answered for it: labels,
/// provider ID and the taint gone, in one write planned on the cached node
/// where it has not changed since (else read fresh and planned again).
/// Returns what is left to write, unless someone else initialised it.
async fn initialize(
    ctx: &Context,
    node: &NodeView,
    result: InstanceResult,
) -> Result<Option<Initialised>> {
    let name = node.name.clone();
    let instance = match (result.state(), result.instance) {
        (InstanceState::NotFound, _) => return Err(NodeError::InstanceNotFound(name).into()),
        (_, Some(instance)) => instance,
        (state, None) => {
            return Err(NodeError::Invalid(format!(
                "the gateway answered {state:?} without metadata"
            ))
            .into());
        }
    };
    // Plan against the node as cached, so a bad node-ip fails before any write.
    let init = plan::initialize(node, &instance).map_err(NodeError::Invalid)?;
    for key in &init.discarded_labels {
        tracing::warn!(label = %key, "discarding provider label in a Kubernetes namespace");
    }
    let updated = match write_init(ctx, node, &init).await? {
        Some(updated) => Some(updated),
        None => {
            update_node(ctx, &name, 20, |fresh| {
                let seen = view(fresh);
                if !plan::is_uninitialized(&seen) {
                    return false;
                }
                // Re-plan on the fresh copy: labels present now are kept.
                let init = plan::initialize(&seen, &instance).unwrap_or_else(|_| init.clone());
                plan::apply_init(fresh, &init);
                true
            })
            .await?
        }
    };
    let Some(updated) = updated else {
        return Ok(None);
    };
    if let Some(created) = updated.metadata.creation_timestamp.as_ref() {
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
        ctx.metrics
            .taint_removal_delay
            .observe(age.as_secs_f64().max(0.0));
    }
    Ok(Some(Initialised {
        node: view(&updated),
        instance,
        at: tokio::time::Instant::now(),
    }))
}

/// Writes an initialised node's addresses and its event. Addresses go to
/// status in a write after the taint's, as upstream; a failure is logged
/// and the periodic sync mends it.
async fn finish_initialising(ctx: &Context, done: Initialised) {
    let Initialised {
        node: updated,
        instance,
        ..
    } = done;
    let name = updated.name.clone();
    match plan::desired_addresses(&updated, &plan::cloud_addresses(&instance)) {
        Ok(Some(addresses)) => {
            if let Err(e) = write_addresses(ctx, &name, &addresses).await {
                tracing::warn!(error = %e, "could not write node addresses");
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "node addresses not written"),
    }
    tracing::info!("node initialised");
    publish(
        ctx,
        &updated,
        EventType::Normal,
        "Synced",
        ACTION_INITIALIZE,
        "Node synced successfully".into(),
    )
    .await;
}

/// Writes `init` in one JSON patch conditioned on the resourceVersion of
/// the cached `node` it was planned on ([`plan::init_patch`]): the Node
/// written, or `None` where the view has no resourceVersion or the Node
/// changed since (409, or the patch's test failing: 422, or 400 from
/// servers that answer so), for the caller to read it fresh. Saves the
/// read upstream's controller does from its informer cache and ours, which
/// caches less of a Node, would do from the API server.
async fn write_init(ctx: &Context, node: &NodeView, init: &plan::Init) -> Result<Option<Node>> {
    let Some(patch) = plan::init_patch(node, init) else {
        return Ok(None);
    };
    ctx.ensure_leader()?;
    // A request of its own: kube's `Patch::Json` needs its `jsonpatch`
    // feature, which would rebuild kube for every crate of the workspace.
    let request = http::Request::patch(format!(
        "/api/v1/nodes/{}?fieldManager={FIELD_MANAGER}",
        node.name
    ))
    .header(http::header::CONTENT_TYPE, "application/json-patch+json")
    .body(patch.to_string().into_bytes())
    .map_err(|e| NodeError::Invalid(format!("the initialising patch: {e}")))?;
    match ctx.client.request::<Node>(request).await {
        Ok(node) => Ok(Some(node)),
        Err(kube::Error::Api(s)) if matches!(s.code, 400 | 409 | 422) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Replaces the node's addresses. A JSON merge patch replaces the whole
/// list; a strategic merge would merge it by address type, which is wrong.
async fn write_addresses(ctx: &Context, name: &str, addresses: &[NodeAddress]) -> Result<()> {
    ctx.ensure_leader()?;
    let patch = json!({"status": {"addresses": addresses}});
    ctx.nodes
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(patch),
        )
        .await?;
    ctx.metrics.address_updates.inc();
    Ok(())
}

/// Looks `nodes` up in batches of the configured size,
/// `--concurrent-node-status-updates` batches at a time. A batch whose
/// lookup fails is left out (and logged): nothing is known about its
/// nodes, so nothing may be done to them this round.
async fn lookup_batches<N: std::borrow::Borrow<NodeView>>(
    ctx: &Context,
    nodes: Vec<N>,
    purpose: LookupPurpose,
    fresh: bool,
) -> Vec<(N, InstanceResult)> {
    let mut nodes = nodes.into_iter();
    let chunks = std::iter::from_fn(|| {
        let chunk: Vec<N> = nodes.by_ref().take(ctx.settings.batch_size).collect();
        (!chunk.is_empty()).then_some(chunk)
    });
    // Several batches at once: one after another, the lookups of 5,000
    // NotReady nodes made a lifecycle pass nearly as long as its period, so
    // each node was checked less often than asked (BENCHMARKS.md, round
    // three).
    futures::stream::iter(chunks)
        .map(|chunk| async move {
            let refs = chunk.iter().map(|n| node_ref(n.borrow())).collect();
            match ctx.lookup(refs, purpose, fresh, false).await {
                Ok(results) => chunk.into_iter().zip(results).collect(),
                Err(e) => {
                    tracing::warn!(error = %e, nodes = chunk.len(), ?purpose, "lookup failed; these nodes are left alone this round");
                    Vec::new()
                }
            }
        })
        .buffered(ctx.settings.status_workers)
        .concat()
        .await
}

/// One pass of the periodic address sync: initialised nodes, looked up in
/// batches, addresses rewritten where they changed.
#[tracing::instrument(skip_all)]
pub async fn sync_addresses(ctx: &Context) {
    let nodes: Vec<_> = ctx
        .store
        .state()
        .into_iter()
        .filter(|n| !plan::is_uninitialized(n))
        .collect();
    let mut writes = Vec::new();
    // One batch's answers at a time: 100,000 instances held at once cost
    // the process hundreds of MiB it would keep.
    for chunk in nodes.chunks(ctx.settings.batch_size) {
        let answers = lookup_batches(ctx, chunk.to_vec(), LookupPurpose::Refresh, false).await;
        for (node, result) in answers {
            let Some(instance) = result.instance else {
                continue;
            };
            match plan::desired_addresses(&node, &plan::cloud_addresses(&instance)) {
                Ok(Some(addresses)) => writes.push((node.name.clone(), addresses)),
                Ok(None) => {}
                Err(e) => tracing::warn!(node = %node.name, error = %e, "address sync skipped"),
            }
        }
    }
    futures::stream::iter(writes)
        .for_each_concurrent(
            ctx.settings.status_workers,
            |(name, addresses)| async move {
                if let Err(e) = write_addresses(ctx, &name, &addresses).await {
                    tracing::warn!(node = %name, error = %e, "could not update node addresses");
                }
            },
        )
        .await;
}

/// Adds or removes the shutdown taint (idempotent), counting changes.
async fn set_shutdown_taint(ctx: &Context, name: &str, present: bool) {
    let result = update_node(ctx, name, 5, |node| {
        if plan::has_shutdown_taint(&view(node)) == present {
            return false;
        }
        let taints = node
            .spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new);
        if present {
            taints.push(plan::shutdown_taint());
        } else {
            taints.retain(|t| {
                !(t.key == ccm_runtime::names::TAINT_SHUTDOWN && t.effect == "NoSchedule")
            });
        }
        true
    })
    .await;
    let action = if present { "added" } else { "removed" };
    match result {
        Ok(Some(_)) => {
            ctx.metrics
                .shutdown_taints
                .get_or_create(&ActionLabels { action })
                .inc();
        }
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(node = %name, error = %e, action, "could not change the shutdown taint")
        }
    }
}

/// One lifecycle pass: ready nodes lose the shutdown taint; not-ready nodes
/// are looked up in batches; a shut-down instance taints its node; a node
/// is deleted only on a fresh, confirmed "not found", and none is when too
/// many would be.
#[tracing::instrument(skip_all)]
pub async fn monitor(ctx: &Context) {
    let nodes = ctx.store.state();
    let total = nodes.len();
    let mut ask = Vec::new();
    for node in nodes {
        match plan::triage(&node) {
            Triage::Healthy => {}
            Triage::RemoveShutdownTaint => set_shutdown_taint(ctx, &node.name, false).await,
            Triage::AskCloud => ask.push(node),
        }
    }
    // Fresh "not found" answers count; cached ones are asked again, fresh.
    let mut confirmed = Vec::new();
    let mut recheck = Vec::new();
    let asked = ask.len();
    let answers = lookup_batches(ctx, ask, LookupPurpose::Lifecycle, false).await;
    // A pass whose lookups failed says nothing of deletions held back.
    let answered = answers.len() == asked;
    for (node, result) in answers {
        match plan::verdict(&node, result.state(), result.cached) {
            Verdict::TaintShutdown => set_shutdown_taint(ctx, &node.name, true).await,
            Verdict::Delete => confirmed.push(node),
            Verdict::Keep if result.state() == InstanceState::NotFound => recheck.push(node),
            Verdict::Keep => {}
        }
    }
    for (node, result) in lookup_batches(ctx, recheck, LookupPurpose::Lifecycle, true).await {
        if plan::verdict(&node, result.state(), result.cached) == Verdict::Delete {
            confirmed.push(node);
        }
    }
    if confirmed.is_empty() {
        if answered {
            ctx.hold_back(None);
        }
        return;
    }
    if plan::hold_deletions(
        confirmed.len(),
        total,
        ctx.settings.deletion_max_share,
        ctx.settings.deletion_min_nodes,
    ) {
        ctx.metrics.deletions_held_back.inc();
        ctx.hold_back(Some(crate::context::HeldBack {
            nodes: confirmed.iter().map(|n| n.name.clone()).collect(),
            total,
            at: std::time::SystemTime::now(),
        }));
        tracing::error!(
            would_delete = confirmed.len(),
            nodes = total,
            max_share = ctx.settings.deletion_max_share,
            "the cloud reports too many instances gone at once; deleting no node this pass"
        );
        for node in &confirmed {
            let note = format!(
                "Not deleting node {}: {} of {} nodes look gone at once, above the safeguard share of {}",
                node.name,
                confirmed.len(),
                total,
                ctx.settings.deletion_max_share
            );
            publish(
                ctx,
                node,
                EventType::Warning,
                "NodeDeletionHeldBack",
                "DeleteNode",
                note,
            )
            .await;
        }
        return;
    }
    ctx.hold_back(None);
    for node in confirmed {
        delete_node(ctx, &node).await;
    }
}

async fn delete_node(ctx: &Context, node: &NodeView) {
    let name = node.name.clone();
    if ctx.ensure_leader().is_err() {
        return;
    }
    publish(
        ctx,
        node,
        EventType::Normal,
        "DeletingNode",
        "DeleteNode",
        format!("Deleting node {name} because it does not exist in the cloud provider"),
    )
    .await;
    // The precondition makes sure it is the node that was checked, not a
    // new one registered under the same name meanwhile.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(node.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match ctx.nodes.delete(&name, &params).await {
        Ok(_) => {
            ctx.metrics.nodes_deleted.inc();
            tracing::info!(node = %name, "deleted node whose instance is gone");
        }
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "could not delete node");
            publish(
                ctx,
                node,
                EventType::Warning,
                "DeletingNodeFailed",
                "DeleteNode",
                format!("Failed deleting node {name}: {e}"),
            )
            .await;
        }
    }
}
