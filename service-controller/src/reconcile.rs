//! Reads state, asks the gateway, calls `plan`, writes: [`sync_service`]
//! (per Service, from the work queue), [`sync_hosts`] (one pass after a
//! debounced batch of node changes) and [`check_orphans`] (periodic).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use ccm_proto::Error as GatewayError;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::context::{Applied, Context, Hosts, Key};
use crate::error::{Error, Result, ServiceError};
use crate::plan;

const FIELD_MANAGER: &str = ccm_runtime::names::MANAGER_SERVICE_CONTROLLER;

async fn publish(ctx: &Context, svc: &Service, kind: EventType, reason: &str, note: String) {
    let event = Event {
        type_: kind,
        reason: reason.into(),
        note: Some(note),
        action: "Sync".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &svc.object_ref(&())).await {
        tracing::warn!(service = %svc.name_any(), error = %e, reason, "could not publish event");
    }
}

fn api(ctx: &Context, namespace: &str) -> Api<Service> {
    Api::namespaced(ctx.client.clone(), namespace)
}

/// Adds or removes our finalizer; set semantics, so other finalizers stay.
/// Returns whether the Service (this one: its UID is a precondition) still
/// exists; one that is gone must get no load balancer.
async fn set_finalizer(ctx: &Context, svc: &Service, present: bool) -> Result<bool> {
    if plan::has_finalizer(svc) == present {
        return Ok(true);
    }
    ctx.ensure_leader()?;
    let finalizer = ccm_runtime::names::FINALIZER_LB_CLEANUP;
    let uid = svc.metadata.uid.clone();
    let patch = if present {
        json!({"metadata": {"uid": uid, "finalizers": [finalizer]}})
    } else {
        // The record of what the load balancer was goes with it.
        json!({"metadata": {
            "uid": uid,
            "$deleteFromPrimitiveList/finalizers": [finalizer],
            "annotations": {ccm_runtime::names::ANNOTATION_LB_APPLIED: null},
        }})
    };
    let result = api(ctx, &svc.namespace().unwrap_or_default())
        .patch(
            &svc.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Strategic(patch),
        )
        .await;
    match result {
        Ok(_) => Ok(true),
        // Gone (or replaced by another object of the same name).
        Err(kube::Error::Api(s))
            if s.code == 404 || (s.code == 409 && s.message.contains("UID")) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records on the Service what its load balancer was just made as
/// (`Some`), or, before a write, that one is under way (`None`): a later
/// leader trusts a record only when its own ensure would ask for exactly
/// that, so no record may outlive the start of a write that could leave
/// the load balancer otherwise.
async fn record_applied(ctx: &Context, svc: &Service, fingerprint: Option<u64>) -> Result<()> {
    ctx.ensure_leader()?;
    let value = fingerprint.map(plan::fingerprint_text);
    let patch = json!({"metadata": {"annotations": {
        ccm_runtime::names::ANNOTATION_LB_APPLIED: value,
    }}});
    match api(ctx, &svc.namespace().unwrap_or_default())
        .patch(
            &svc.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether the cloud has `svc`'s load balancer with the addresses the
/// Service already shows: its status if so.
async fn confirmed(ctx: &Context, svc: &Service) -> Option<ccm_proto::v1::LoadBalancerStatus> {
    let answer = ctx
        .gateway
        .get_load_balancer(plan::service_ref(svc))
        .await
        .inspect_err(|e| tracing::debug!(error = %e, "could not confirm the load balancer"))
        .ok()?;
    let status = answer.status.filter(|_| answer.exists)?;
    (!status.ingress.is_empty() && plan::ingress(&status) == plan::current_ingress(svc))
        .then_some(status)
}

/// Writes the ingress when it changed (a merge patch replaces the list).
async fn write_ingress(
    ctx: &Context,
    svc: &Service,
    ingress: Vec<k8s_openapi::api::core::v1::LoadBalancerIngress>,
) -> Result<()> {
    if plan::current_ingress(svc) == ingress {
        return Ok(());
    }
    ctx.ensure_leader()?;
    let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
    match api(ctx, &svc.namespace().unwrap_or_default())
        .patch_status(
            &svc.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes the `LoadBalancerSynced` condition when status or reason change.
async fn write_condition(
    ctx: &Context,
    svc: &Service,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<()> {
    let status = if ok { "True" } else { "False" };
    if plan::current_condition(svc) == Some((status.into(), reason.into())) {
        return Ok(());
    }
    ctx.ensure_leader()?;
    let patch = json!({"status": {"conditions": [{
        "type": plan::CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        "observedGeneration": svc.metadata.generation,
    }]}});
    api(ctx, &svc.namespace().unwrap_or_default())
        .patch_status(
            &svc.name_any(),
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Strategic(patch),
        )
        .await?;
    Ok(())
}

/// Syncs one Service: ensures its load balancer, or deletes it and
/// releases the finalizer.
#[tracing::instrument(skip(ctx, key), fields(service = %format!("{}/{}", key.0, key.1)))]
pub async fn sync_service(ctx: &Context, key: &Key) -> Result<()> {
    // Gone, or no load balancer (a Service kept whole is one, or has our
    // finalizer).
    let view = ctx.service(key);
    let Some(svc) = view.as_deref().and_then(plan::ServiceView::service) else {
        ctx.forget(key);
        return Ok(());
    };
    if !plan::wants_load_balancer(svc, &ctx.settings.classes) || plan::needs_cleanup(svc) {
        if plan::has_finalizer(svc) {
            delete(ctx, svc).await?;
        }
        ctx.forget(key);
        return Ok(());
    }
    ensure(ctx, key, svc).await
}

/// Deletes the Service's load balancer and releases the finalizer. Unlike
/// upstream, which deletes only what GetLoadBalancer reports as existing,
/// the delete is always sent (it is idempotent): a provider whose ensure
/// takes several cloud calls (AWS: security group, target groups, then the
/// NLB) may have made parts of a load balancer that does not exist yet, and
/// only its delete finds and removes them.
async fn delete(ctx: &Context, svc: &Service) -> Result<()> {
    let service = plan::service_ref(svc);
    ctx.ensure_leader()?;
    publish(
        ctx,
        svc,
        EventType::Normal,
        "DeletingLoadBalancer",
        "Deleting load balancer".into(),
    )
    .await;
    match ctx.gateway.delete_load_balancer(service).await {
        Ok(()) | Err(GatewayError::ImplementedElsewhere { .. }) => {}
        Err(e) => {
            publish(
                ctx,
                svc,
                EventType::Warning,
                "DeleteLoadBalancerFailed",
                format!("Error deleting load balancer: {e}"),
            )
            .await;
            return Err(e.into());
        }
    }
    write_ingress(ctx, svc, Vec::new()).await?;
    set_finalizer(ctx, svc, false).await?;
    publish(
        ctx,
        svc,
        EventType::Normal,
        "DeletedLoadBalancer",
        "Deleted load balancer".into(),
    )
    .await;
    Ok(())
}

/// How often a provisioning load balancer's status is read again.
const PROVISIONING_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// What the cloud said of a load balancer it was provisioning.
enum Poll {
    /// Still provisioning.
    Pending,
    /// Ready, with its status.
    Ready(ccm_proto::v1::LoadBalancerStatus),
    /// Gone or unknown: ensure it again.
    Unknown,
}

/// What an ensure asks for ([`plan::applied_fingerprint`]).
fn fingerprint(spec: &ccm_proto::v1::LoadBalancerSpec, hosts: &Hosts) -> u64 {
    plan::applied_fingerprint(spec, hosts.full_digest)
}

/// Reads the status of a load balancer the cloud is provisioning, which the
/// gateway answers for many Services with one listing.
async fn poll_provisioning(ctx: &Context, spec: &ccm_proto::v1::LoadBalancerSpec) -> Poll {
    let Some(service) = spec.service.clone() else {
        return Poll::Unknown;
    };
    match ctx.gateway.get_load_balancer(service).await {
        Ok(r) => match r.status {
            Some(status) if r.exists && !status.ingress.is_empty() => Poll::Ready(status),
            _ if r.exists => Poll::Pending,
            _ => Poll::Unknown,
        },
        Err(e) => {
            tracing::debug!(error = %e, "could not read the provisioning load balancer; ensuring again");
            Poll::Unknown
        }
    }
}

async fn ensure(ctx: &Context, key: &Key, svc: &Service) -> Result<()> {
    ctx.ensure_leader()?;
    // The finalizer goes on before any cloud call, so a load balancer is
    // never created that nothing would clean up.
    if !set_finalizer(ctx, svc, true).await? {
        tracing::info!("the Service is gone; no load balancer");
        return Ok(());
    }
    let hosts = match ctx.hosts_for(svc).await {
        Ok(hosts) => hosts,
        // The user can fix this; nothing goes to the cloud.
        Err(problem) => return refuse(ctx, svc, problem).await,
    };
    let empty = hosts.list.is_empty();
    let had_ingress = !plan::current_ingress(svc).is_empty();
    let spec = plan::lb_spec(svc);
    let fingerprint = fingerprint(&spec, &hosts);
    if let Some(status) = ctx.applied(key, fingerprint) {
        // This replica's last ensure asked for exactly this and the cloud
        // made it: only the Service's own status may be missing.
        tracing::debug!("the load balancer is as asked; writing the Service's status only");
        return record_success(ctx, key, svc, had_ingress, &status).await;
    }
    // A new term (this replica's first, or after another led): the Service
    // records what its load balancer was last made as. When that is what
    // this ensure would ask for and the cloud confirms the load balancer
    // at the Service's addresses, there is nothing to write: a leader
    // taking over (an upgrade, a restart) costs the cloud one read, served
    // from the gateway's listing, per settled Service.
    let recorded = plan::recorded_fingerprint(svc);
    if had_ingress
        && recorded == Some(fingerprint)
        && let Some(status) = confirmed(ctx, svc).await
    {
        tracing::info!("the load balancer is as the Service records; nothing to write");
        ctx.metrics.takeovers_confirmed.inc();
        ctx.remember_hosts(key, hosts.digest);
        ctx.set_applied(
            key,
            Some(Applied {
                fingerprint,
                status: status.clone(),
            }),
        );
        return record_success(ctx, key, svc, had_ingress, &status).await;
    }
    // Cleared whatever the cache shows: it may not have seen the record
    // this replica's last write left yet.
    record_applied(ctx, svc, None).await?;
    publish(
        ctx,
        svc,
        EventType::Normal,
        "EnsuringLoadBalancer",
        "Ensuring load balancer".into(),
    )
    .await;
    if empty {
        publish(
            ctx,
            svc,
            EventType::Warning,
            "UnAvailableLoadBalancer",
            "There are no available nodes for LoadBalancer".into(),
        )
        .await;
    }
    ctx.remember_hosts(key, hosts.digest);
    let poll = if ctx.is_provisioning(key, fingerprint) {
        poll_provisioning(ctx, &spec).await
    } else {
        Poll::Unknown
    };
    let result = match poll {
        Poll::Pending => {
            return Err(ServiceError::RetryAfter {
                delay: PROVISIONING_POLL,
                reason: ccm_proto::reason::PROVISIONING.into(),
                message: "the cloud is still provisioning the load balancer".into(),
            }
            .into());
        }
        Poll::Ready(status) => Ok((status, String::new(), Vec::new())),
        Poll::Unknown => ctx
            .gateway
            .ensure_load_balancer_answer(spec, hosts.list.to_vec())
            .await
            .map(|r| (r.status.unwrap_or_default(), r.adopted, r.no_effect)),
    };
    if let Err(GatewayError::RetryAfter { reason, .. }) = &result
        && reason == ccm_proto::reason::PROVISIONING
    {
        ctx.set_provisioning(key, Some(fingerprint));
    } else {
        ctx.set_provisioning(key, None);
    }
    ctx.set_applied(
        key,
        result.as_ref().ok().map(|(status, ..)| Applied {
            fingerprint,
            status: status.clone(),
        }),
    );
    match result {
        Ok((status, adopted, no_effect)) => {
            if !adopted.is_empty() {
                tracing::info!(%adopted, "load balancer adopted");
                publish(ctx, svc, EventType::Normal, "AdoptedLoadBalancer", adopted).await;
            }
            if !no_effect.is_empty() {
                let note = plan::no_effect_note(&no_effect);
                publish(ctx, svc, EventType::Normal, "AnnotationHasNoEffect", note).await;
            }
            publish(
                ctx,
                svc,
                EventType::Normal,
                "EnsuredLoadBalancer",
                "Ensured load balancer".into(),
            )
            .await;
            record_success(ctx, key, svc, had_ingress, &status).await?;
            record_applied(ctx, svc, Some(fingerprint)).await
        }
        Err(GatewayError::ImplementedElsewhere { .. }) => Ok(()),
        Err(GatewayError::InvalidArgument {
            violations,
            message,
        }) => {
            // The user can fix this; nothing was written to the cloud.
            let detail = if violations.is_empty() {
                message
            } else {
                plan::describe_violations(&violations)
            };
            refuse(ctx, svc, detail).await
        }
        Err(GatewayError::RetryAfter {
            delay,
            reason,
            message,
        }) => {
            publish(
                ctx,
                svc,
                EventType::Normal,
                "SyncLoadBalancerFailed",
                format!("Error syncing load balancer: {message}"),
            )
            .await;
            Err(ServiceError::RetryAfter {
                delay,
                reason,
                message,
            }
            .into())
        }
        Err(e) => {
            publish(
                ctx,
                svc,
                EventType::Warning,
                "SyncLoadBalancerFailed",
                format!("Error syncing load balancer: {e}"),
            )
            .await;
            Err(e.into())
        }
    }
}

/// Refuses what the Service asks, for `detail`, which the user can fix: a
/// Warning event and the condition say why; nothing goes to the cloud.
async fn refuse(ctx: &Context, svc: &Service, detail: String) -> Result<()> {
    publish(
        ctx,
        svc,
        EventType::Warning,
        "SyncLoadBalancerFailed",
        format!("Error syncing load balancer: {detail}"),
    )
    .await;
    let reason = ccm_runtime::names::REASON_INVALID_CONFIGURATION;
    write_condition(ctx, svc, false, reason, &detail).await?;
    Err(Error::Gateway(GatewayError::InvalidArgument {
        violations: Vec::new(),
        message: detail,
    }))
}

/// Writes what a load balancer made as the Service asks means for the
/// Service: its ingress, and its condition back to synced; and times it.
async fn record_success(
    ctx: &Context,
    key: &Key,
    svc: &Service,
    had_ingress: bool,
    status: &ccm_proto::v1::LoadBalancerStatus,
) -> Result<()> {
    let ingress = plan::ingress(status);
    if let Some(created) = svc.metadata.creation_timestamp.as_ref()
        && !had_ingress
        && !ingress.is_empty()
    {
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
        ctx.metrics
            .time_to_ingress
            .observe(age.as_secs_f64().max(0.0));
    }
    let carried = ctx.take_change(key);
    write_ingress(ctx, svc, ingress).await?;
    if let Some(seen) = carried {
        ctx.metrics
            .change_to_ingress
            .observe(seen.elapsed().as_secs_f64());
    }
    if plan::current_condition(svc).is_some() {
        write_condition(
            ctx,
            svc,
            true,
            "Synced",
            "The load balancer matches the Service",
        )
        .await?;
    }
    Ok(())
}

/// One host pass: every load balancer whose host set changed gets one
/// update (of `only` those Services, when only their serving endpoints
/// changed). A failed update falls back to a full ensure of that Service.
/// A Service whose first ensure has not yet remembered its hosts is passed
/// over, and passed again once it has ([`Context::remember_hosts`]): that
/// ensure may have chosen its hosts before this change.
#[tracing::instrument(skip_all)]
pub async fn sync_hosts(ctx: &Context, only: Option<HashSet<Key>>) {
    // Changes seen from here on wait for the next pass.
    let changed_at = ctx.take_node_change();
    let services: Vec<_> = match &only {
        None => ctx.services.state(),
        Some(keys) => keys.iter().filter_map(|k| ctx.service(k)).collect(),
    }
    .into_iter()
    .filter(|view| {
        view.service().is_some_and(|s| {
            plan::wants_load_balancer(s, &ctx.settings.classes) && !plan::needs_cleanup(s)
        })
    })
    .collect();
    // What decides each one's hosts, and the digest of those it was last
    // given. A Service whose subset annotation is invalid keeps what it
    // has; its own sync says why.
    let mut kept: HashSet<Key> = HashSet::new();
    let mut asked = Vec::new();
    for view in &services {
        let Some(svc) = view.service() else { continue };
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let Ok(ask) = ctx.ask(svc) else { continue };
        kept.insert(key.clone());
        if let Some(last) = ctx.remembered_hosts_or_pass_over(&key) {
            let serving = ctx.serving_of(svc, &ask);
            asked.push((key, ask, serving, last));
        }
    }
    // Each Service's hosts, worked out again only where a change may have
    // moved them (off the runtime's threads: a Service that takes every
    // node, or a membership built anew, costs a pass over every node).
    let full = only.is_none();
    let backing = ctx.backing.clone();
    let worked_out = tokio::task::spawn_blocking(move || {
        // Without a load balancer there is nothing to work out.
        if kept.is_empty() {
            return (Vec::new(), 0);
        }
        backing.with(|m| {
            if full {
                m.retain(|key| kept.contains(key));
            }
            let changed: Vec<Key> = asked
                .into_iter()
                .filter_map(|(key, ask, serving, last)| {
                    let serving: Option<BTreeSet<&str>> = serving
                        .as_ref()
                        .map(|s| s.iter().map(String::as_str).collect());
                    (m.digest(&key, &ask, serving.as_ref()) != last).then_some(key)
                })
                .collect();
            (changed, m.len())
        })
    })
    .await;
    let (changed, nodes) = match worked_out {
        Ok(worked_out) => worked_out,
        Err(e) => {
            tracing::error!(error = %e, "the host pass could not work out the hosts");
            return;
        }
    };
    // Each update carries its own copy of the host list (the gateway's API
    // takes a whole list): at most about a million hosts in flight at once.
    let at_once = (1_000_000 / nodes.max(1)).clamp(1, 256);
    let ctx_ref = ctx;
    let updates = futures::stream::iter(changed.into_iter().map(|key| {
        async move {
            if ctx_ref.ensure_leader().is_err() {
                return false;
            }
            // Read again: an update may wait its turn for a while, and an
            // ensure may have given the load balancer newer hosts (or a
            // newer spec) meanwhile, which an old update must not undo.
            let view = ctx_ref.service(&key);
            let Some(svc) = view.as_deref().and_then(plan::ServiceView::service) else {
                return true;
            };
            if !plan::wants_load_balancer(svc, &ctx_ref.settings.classes)
                || plan::needs_cleanup(svc)
            {
                return true;
            }
            let Ok(hosts) = ctx_ref.hosts_for(svc).await else {
                return true;
            };
            if ctx_ref.remembered_hosts(&key) == Some(hosts.digest) {
                return true;
            }
            // The Service's record goes before the write (whatever the
            // cache shows), and comes back with the new hosts after it.
            if let Err(e) = record_applied(ctx_ref, svc, None).await {
                tracing::warn!(error = %e, "could not clear the load balancer's record; later");
                return false;
            }
            ctx_ref.remember_hosts(&key, hosts.digest);
            ctx_ref.metrics.host_updates.inc();
            let count = hosts.list.len();
            let spec = plan::lb_spec(svc);
            let applied = fingerprint(&spec, &hosts);
            let updated = ctx_ref
                .gateway
                .update_load_balancer_hosts(spec, hosts.list.to_vec())
                .await;
            if updated.is_ok()
                && let Err(e) = record_applied(ctx_ref, svc, Some(applied)).await
            {
                tracing::debug!(error = %e, "could not record the load balancer's hosts");
            }
            match updated {
                Ok(()) if count == 0 => {
                    publish(
                        ctx_ref,
                        svc,
                        EventType::Warning,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer".into(),
                    )
                    .await;
                    true
                }
                Ok(()) => {
                    publish(
                        ctx_ref,
                        svc,
                        EventType::Normal,
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts".into(),
                    )
                    .await;
                    true
                }
                // Handled elsewhere: nothing to update.
                Err(GatewayError::ImplementedElsewhere { .. }) => true,
                // No load balancer yet (its first ensure still in flight,
                // with the hosts of before this change) or no longer (gone
                // from the cloud): the Service needs a full ensure with
                // today's hosts. Without it, an ensure racing this pass left
                // its load balancer on the old hosts, and no later pass saw
                // a difference to send.
                Err(GatewayError::NotFound { .. }) => {
                    ctx_ref.queue.add(key);
                    false
                }
                Err(e) => {
                    ctx_ref.metrics.host_update_errors.inc();
                    publish(
                        ctx_ref,
                        svc,
                        EventType::Warning,
                        "UpdateLoadBalancerFailed",
                        format!("Error updating load balancer with new hosts ({count} nodes): {e}"),
                    )
                    .await;
                    ctx_ref.queue.add(key);
                    false
                }
            }
        }
    }))
    .buffer_unordered(at_once);
    let done: Vec<bool> = updates.collect().await;
    if let Some(at) = changed_at
        && done.iter().all(|ok| *ok)
    {
        ctx.metrics
            .host_sync_delay
            .observe(at.elapsed().as_secs_f64());
    }
}

/// Whether the load balancer of `service` (as the cloud tags it) has lost
/// its Service: none with its UID, or, for one another controller made
/// (cloud-provider-aws tags the name, and the UID comes with our first
/// ensure), none of its namespace and name.
fn is_orphan(
    service: &ccm_proto::v1::ServiceRef,
    owners: &HashSet<&str>,
    names: &HashSet<(&str, &str)>,
) -> bool {
    if service.uid.is_empty() {
        !names.contains(&(service.namespace.as_str(), service.name.as_str()))
    } else {
        !owners.contains(service.uid.as_str())
    }
}

/// Tracks load balancers of this cluster whose Service is gone.
#[derive(Default)]
pub struct Orphans {
    first_seen: HashMap<String, (Instant, std::time::SystemTime)>,
}

/// One orphan check: reports orphans, and deletes those orphaned longer
/// than the grace period when enabled. Runs only on a synced cache, or
/// every load balancer would look orphaned.
#[tracing::instrument(skip_all)]
pub async fn check_orphans(ctx: &Context, orphans: &mut Orphans) {
    let lbs = match ctx.gateway.list_load_balancers().await {
        Ok(lbs) => lbs,
        Err(e) => {
            tracing::warn!(error = %e, "orphan check: could not list load balancers");
            return;
        }
    };
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut uids: Vec<String> = Vec::new();
    ctx.services.each(|key, view| {
        if let Some((namespace, name)) = key.split_once('/') {
            keys.push((namespace.to_owned(), name.to_owned()));
        }
        uids.push(view.uid().to_owned());
    });
    let owners: HashSet<&str> = uids
        .iter()
        .map(String::as_str)
        .filter(|u| !u.is_empty())
        .collect();
    let names: HashSet<(&str, &str)> = keys
        .iter()
        .map(|(ns, n)| (ns.as_str(), n.as_str()))
        .collect();
    let orphaned: Vec<_> = lbs
        .into_iter()
        .filter(|lb| {
            lb.service
                .as_ref()
                .is_some_and(|s| is_orphan(s, &owners, &names))
        })
        .collect();
    ctx.metrics.orphans.set(orphaned.len() as i64);
    let now = Instant::now();
    orphans
        .first_seen
        .retain(|name, _| orphaned.iter().any(|lb| &lb.name == name));
    let report = orphaned
        .iter()
        .map(|lb| {
            let (_, since) = *orphans
                .first_seen
                .entry(lb.name.clone())
                .or_insert((now, std::time::SystemTime::now()));
            let service = lb.service.clone().unwrap_or_default();
            crate::context::Orphan {
                load_balancer: lb.name.clone(),
                service: format!("{}/{}", service.namespace, service.name),
                since,
            }
        })
        .collect();
    *ctx.orphaned.lock().unwrap_or_else(|e| e.into_inner()) = report;
    for lb in orphaned {
        let (since, _) = orphans.first_seen[&lb.name];
        let service = lb.service.clone().unwrap_or_default();
        tracing::warn!(load_balancer = %lb.name, service = %format!("{}/{}", service.namespace, service.name), "orphaned load balancer: its Service is gone");
        // Without its UID it cannot be named to the gateway: reported only.
        if ctx.settings.delete_orphans
            && !service.uid.is_empty()
            && now.duration_since(since) >= ctx.settings.orphan_grace
            && ctx.ensure_leader().is_ok()
        {
            match ctx.gateway.delete_load_balancer(service).await {
                Ok(()) => {
                    ctx.metrics.orphans_deleted.inc();
                    orphans.first_seen.remove(&lb.name);
                    tracing::info!(load_balancer = %lb.name, "deleted orphaned load balancer");
                }
                Err(e) => {
                    tracing::warn!(load_balancer = %lb.name, error = %e, "could not delete orphaned load balancer")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_proto::v1::ServiceRef;

    fn service(namespace: &str, name: &str, uid: &str) -> ServiceRef {
        ServiceRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_load_balancer_without_a_uid_belongs_to_the_service_of_its_name() {
        let owners = HashSet::from(["uid-web"]);
        let names = HashSet::from([("shop", "web")]);
        assert!(!is_orphan(
            &service("shop", "web", "uid-web"),
            &owners,
            &names
        ));
        assert!(is_orphan(
            &service("shop", "web", "uid-old"),
            &owners,
            &names
        ));
        assert!(!is_orphan(&service("shop", "web", ""), &owners, &names));
        assert!(is_orphan(&service("shop", "gone", ""), &owners, &names));
    }
}
