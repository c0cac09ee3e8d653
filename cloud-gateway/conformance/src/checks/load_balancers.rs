//! Load balancers: refusals that make nothing, idempotent ensure and
//! delete, host updates that touch only the backends, and provisioning.

use std::time::{Duration, Instant};

use ccm_proto::v1::{Host, LoadBalancerSpec, LoadBalancerStatus, ServiceRef};
use ccm_proto::{Error, GatewayClient, reason};

use crate::checks::fixtures::{host, new_uid, service, spec, spec_named};
use crate::context::{Context, no_node};
use crate::outcome::{Outcome, fail};

pub(crate) async fn update_hosts_missing(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("service")?;
    match c
        .update_load_balancer_hosts(spec(&new_uid()), Vec::new())
        .await
    {
        Err(Error::NotFound { .. }) => Ok(Outcome::Pass),
        other => fail(format!("expected NOT_FOUND, got {other:?}")),
    }
}

pub(crate) async fn invalid_spec(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("service")?;
    let mut bad = spec(&new_uid());
    bad.ports.clear();
    match c.ensure_load_balancer(bad, Vec::new()).await {
        Err(Error::InvalidArgument { violations, .. })
            if violations.iter().any(|v| v.field.starts_with("spec.ports")) =>
        {
            Ok(Outcome::Pass)
        }
        other => fail(format!(
            "expected INVALID_ARGUMENT naming spec.ports, got {other:?}"
        )),
    }
}

pub(crate) async fn invalid_annotation(cx: &Context) -> Result<Outcome, String> {
    let Some((key, value)) = &cx.target.invalid_annotation else {
        return Ok(Outcome::Skip("no --invalid-annotation given".into()));
    };
    let c = cx.client("service")?;
    let uid = new_uid();
    let mut bad = spec(&uid);
    bad.annotations.insert(key.clone(), value.clone());
    let field = format!("spec.annotations[{key:?}]");
    match c.ensure_load_balancer(bad, Vec::new()).await {
        Err(Error::InvalidArgument { violations, .. })
            if violations.iter().any(|v| v.field == field) => {}
        other => {
            let _ = c.delete_load_balancer(service(&uid)).await;
            return fail(format!(
                "expected INVALID_ARGUMENT naming {field}, got {other:?}"
            ));
        }
    }
    let exists = c
        .get_load_balancer(service(&uid))
        .await
        .map_err(|e| format!("get: {e}"))?
        .exists;
    if exists || lb_count(&c, &uid).await? > 0 {
        let _ = c.delete_load_balancer(service(&uid)).await;
        return fail("the refused ensure made a load balancer");
    }
    Ok(Outcome::Pass)
}

pub(crate) async fn ensure_idempotent(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("service")?;
    let other = cx.other_client("service")?;
    let uid = new_uid();
    let s = spec(&uid);
    ensure(&c, &s, &[], cx.target.patience).await?;
    ensure(&c, &s, &[], cx.target.patience).await?;
    let n = lb_count(&c, &uid).await?;
    let seen = lb_count(&other, &uid).await?;
    let exists = other
        .get_load_balancer(service(&uid))
        .await
        .map_err(|e| format!("get: {e}"))?
        .exists;
    let _ = c.delete_load_balancer(service(&uid)).await;
    match (n, seen, exists) {
        (1, 0, false) => Ok(Outcome::Pass),
        (n, 0, false) => fail(format!("{n} load balancers after two ensures")),
        _ => fail("another cluster sees the load balancer"),
    }
}

pub(crate) async fn update_hosts(cx: &Context) -> Result<Outcome, String> {
    let Some(name) = &cx.node else {
        return Ok(no_node());
    };
    let backend = host(&cx.target, name).await?;
    let c = cx.client("service")?;
    let uid = new_uid();
    let s = spec(&uid);
    let created = ensure(&c, &s, std::slice::from_ref(&backend), cx.target.patience).await?;
    let hosts_before = lb_hosts(&c, &uid).await?;
    let updated = c.update_load_balancer_hosts(s.clone(), Vec::new()).await;
    let after = c.get_load_balancer(service(&uid)).await;
    let hosts_after = lb_hosts(&c, &uid).await;
    let count = lb_count(&c, &uid).await;
    let _ = c.delete_load_balancer(service(&uid)).await;
    updated.map_err(|e| format!("update hosts: {e}"))?;
    let after = after.map_err(|e| format!("get: {e}"))?;
    let (hosts_after, count) = (hosts_after?, count?);
    if !after.exists || count != 1 {
        return fail(format!(
            "after the update: exists {}, {count} listed",
            after.exists
        ));
    }
    if after.status.as_ref() != Some(&created) {
        return fail(format!(
            "the status changed from {created:?} to {:?}",
            after.status
        ));
    }
    // Providers that report hosts must report the new set.
    if !hosts_before.is_empty() && (hosts_before != [name.clone()] || !hosts_after.is_empty()) {
        return fail(format!(
            "hosts listed {hosts_before:?} after ensure with [{name}], {hosts_after:?} after update to none"
        ));
    }
    Ok(Outcome::Pass)
}

pub(crate) async fn provisioning(cx: &Context) -> Result<Outcome, String> {
    let hook = match &cx.hook {
        Ok(hook) => hook,
        Err(why) => return Ok(Outcome::Skip(why.clone())),
    };
    let provisioning = Duration::from_secs(2);
    let before = hook
        .faults(|f| {
            f.lb_provisioning_delay = Some(prost_types::Duration {
                seconds: 2,
                nanos: 0,
            });
        })
        .await?;
    let c = cx.client("service")?;
    let uid = new_uid();
    let s = spec(&uid);
    let first = c.ensure_load_balancer(s.clone(), Vec::new()).await;
    let during = c.get_load_balancer(service(&uid)).await;
    let done = ensure(&c, &s, &[], cx.target.patience).await;
    hook.set_faults(before).await?;
    let _ = c.delete_load_balancer(service(&uid)).await;
    match first {
        Err(Error::RetryAfter {
            reason: r, delay, ..
        }) if r == reason::PROVISIONING
            && !delay.is_zero()
            && delay <= provisioning + Duration::from_secs(1) => {}
        other => {
            return fail(format!(
                "expected UNAVAILABLE ({}) with a delay of at most {provisioning:?}, got {other:?}",
                reason::PROVISIONING
            ));
        }
    }
    match during {
        Ok(g) if g.exists && g.status.as_ref().is_none_or(|s| s.ingress.is_empty()) => {}
        other => {
            return fail(format!(
                "while provisioning, get answered {other:?}; expected exists with no ingress"
            ));
        }
    }
    match done {
        Ok(status) if !status.ingress.is_empty() => Ok(Outcome::Pass),
        other => fail(format!("once provisioned, ensure answered {other:?}")),
    }
}

pub(crate) async fn delete_idempotent(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("service")?;
    let uid = new_uid();
    let s = spec(&uid);
    ensure(&c, &s, &[], cx.target.patience).await?;
    for attempt in ["first", "second"] {
        c.delete_load_balancer(service(&uid))
            .await
            .map_err(|e| format!("{attempt} delete: {e}"))?;
    }
    if lb_count(&c, &uid).await? != 0 {
        return fail("listed after delete");
    }
    ensure(&c, &s, &[], cx.target.patience).await?;
    let n = lb_count(&c, &uid).await?;
    let _ = c.delete_load_balancer(service(&uid)).await;
    if n == 1 {
        Ok(Outcome::Pass)
    } else {
        fail(format!("{n} load balancers after ensure, delete, ensure"))
    }
}

pub(crate) async fn one_service_each(cx: &Context) -> Result<Outcome, String> {
    let c = cx.client("service")?;
    let first = new_uid();
    // The same UID but its last hex digit: upstream's name is the same.
    let last = if first.ends_with('0') { '1' } else { '0' };
    let second = format!("{}{last}", &first[..first.len() - 1]);
    let a = spec(&first);
    let mut b = spec_named(&second, "collider", 81, 30081);
    if let Some(s) = b.service.as_mut() {
        s.name = format!("collider-{}", &second[..8]);
    }
    let outcome = one_service_each_of(cx, &c, &a, &b).await;
    let _ = c.delete_load_balancer(service_of(&b)).await;
    let _ = c.delete_load_balancer(service_of(&a)).await;
    outcome
}

async fn one_service_each_of(
    cx: &Context,
    c: &GatewayClient,
    a: &LoadBalancerSpec,
    b: &LoadBalancerSpec,
) -> Result<Outcome, String> {
    let (first, second) = (service_of(a), service_of(b));
    let made = ensure(c, a, &[], cx.target.patience).await?;
    let listed_before = listed(c, &first.uid).await?;
    // The second Service: a load balancer of its own, or a refusal
    // naming the holder; either way the first's stays as it was.
    let own = match c.ensure_load_balancer(b.clone(), Vec::new()).await {
        Err(Error::AlreadyExists { .. }) => None,
        Err(Error::RetryAfter { reason: r, .. }) if r == reason::PROVISIONING => {
            Some(ensure(c, b, &[], cx.target.patience).await?)
        }
        Ok(status) => Some(status),
        Err(e) => return fail(format!("the second Service's ensure: {e}")),
    };
    if own
        .as_ref()
        .is_some_and(|s| !s.ingress.is_empty() && s.ingress == made.ingress)
    {
        return fail(format!(
            "the second Service was given the first's address {:?}",
            made.ingress
        ));
    }
    let (got_a, got_b) = tokio::join!(
        c.get_load_balancer(first.clone()),
        c.get_load_balancer(second.clone())
    );
    let got_a = got_a.map_err(|e| format!("get the first: {e}"))?;
    let got_b = got_b.map_err(|e| format!("get the second: {e}"))?;
    if got_a.status.as_ref() != Some(&made) {
        return fail(format!(
            "after the second's ensure the first's status is {:?}, was {made:?}",
            got_a.status
        ));
    }
    if got_b.exists != own.is_some()
        || (own.is_some()
            && got_b.status.as_ref().map(|s| &s.ingress) != own.as_ref().map(|s| &s.ingress))
    {
        return fail(format!(
            "get answers {got_b:?} for the second Service, whose ensure answered {own:?}"
        ));
    }
    if own.is_some() {
        c.update_load_balancer_hosts(b.clone(), Vec::new())
            .await
            .map_err(|e| format!("update the second's hosts: {e}"))?;
    }
    c.delete_load_balancer(second.clone())
        .await
        .map_err(|e| format!("delete the second: {e}"))?;
    let listed_after = listed(c, &first.uid).await?;
    let after = c
        .get_load_balancer(first)
        .await
        .map_err(|e| format!("get the first: {e}"))?;
    if listed_after != listed_before || after.status.as_ref() != Some(&made) {
        return fail(format!(
            "the second's ensure, update and delete changed the first's load balancer: listed {listed_before:?}, then {listed_after:?}; status {made:?}, then {:?}",
            after.status
        ));
    }
    if lb_count(c, &second.uid).await? != 0 {
        return fail("the second Service's load balancer is listed after its delete");
    }
    Ok(Outcome::Pass)
}

/// The Service of `spec`.
fn service_of(spec: &LoadBalancerSpec) -> ServiceRef {
    spec.service.clone().unwrap_or_default()
}

/// The load balancers listed for the Service `uid`, as (name, Service,
/// hosts).
async fn listed(
    client: &GatewayClient,
    uid: &str,
) -> Result<Vec<(String, Option<ServiceRef>, Vec<String>)>, String> {
    Ok(client
        .list_load_balancers()
        .await
        .map_err(|e| format!("list: {e}"))?
        .into_iter()
        .filter(|lb| lb.service.as_ref().is_some_and(|s| s.uid == uid))
        .map(|lb| (lb.name, lb.service, lb.hosts))
        .collect())
}

/// Ensures until the load balancer is provisioned, as a controller does:
/// PROVISIONING must come with a retry delay, and is asked again after it.
async fn ensure(
    client: &GatewayClient,
    spec: &LoadBalancerSpec,
    hosts: &[Host],
    patience: Duration,
) -> Result<LoadBalancerStatus, String> {
    let start = Instant::now();
    loop {
        match client
            .ensure_load_balancer(spec.clone(), hosts.to_vec())
            .await
        {
            Ok(status) => return Ok(status),
            Err(Error::RetryAfter {
                reason: r, delay, ..
            }) if r == reason::PROVISIONING => {
                if start.elapsed() > patience {
                    return Err(format!("still provisioning after {patience:?}"));
                }
                tokio::time::sleep(delay.min(Duration::from_secs(5))).await;
            }
            Err(e) => return Err(format!("ensure: {e}")),
        }
    }
}

/// How many load balancers the cluster lists for the Service `uid`.
async fn lb_count(client: &GatewayClient, uid: &str) -> Result<usize, String> {
    Ok(listed(client, uid).await?.len())
}

/// The hosts listed for the Service `uid`'s load balancers.
async fn lb_hosts(client: &GatewayClient, uid: &str) -> Result<Vec<String>, String> {
    Ok(listed(client, uid)
        .await?
        .into_iter()
        .flat_map(|(_, _, hosts)| hosts)
        .collect())
}

/// The provider's host limits are well formed, and an ensure past the
/// limits of the kind a Service without annotations gets is refused as
/// INVALID_ARGUMENT naming `hosts`, making nothing.
pub(crate) async fn host_limits(cx: &Context) -> Result<Outcome, String> {
    use ccm_runtime::host_limits::HostLimits;
    let Some(info) = &cx.info else {
        return fail("no provider info");
    };
    let limits = ccm_runtime::gateway::host_limits(info);
    if limits.is_empty() {
        return Ok(Outcome::Skip("the provider states no host limits".into()));
    }
    let problems = HostLimits::problems(&limits);
    if !problems.is_empty() {
        return fail(format!("host_limits: {}", problems.join("; ")));
    }
    let Some(default) = HostLimits::of_service(&limits, &std::collections::HashMap::new()) else {
        return Ok(Outcome::Skip(
            "every kind is chosen by an annotation; none to try without one".into(),
        ));
    };
    // Past the load balancer's limit with hosts of no zone, else past the
    // zone's with hosts of one zone.
    let (count, zone) = match (default.per_load_balancer, default.per_zone) {
        (0, 0) => return Ok(Outcome::Skip("the default kind has no limit".into())),
        (0, per_zone) => (per_zone as usize + 1, "conformance-zone"),
        (most, _) => (most as usize + 1, ""),
    };
    if count > 10_000 {
        return Ok(Outcome::Skip(format!(
            "{count} hosts are past the contract's 10,000 per request"
        )));
    }
    let hosts: Vec<Host> = (0..count)
        .map(|i| Host {
            name: format!("conformance-host-{i}"),
            zone: zone.into(),
            ..Default::default()
        })
        .collect();
    let c = cx.client("service")?;
    let uid = new_uid();
    let answer = c.ensure_load_balancer(spec(&uid), hosts).await;
    let made = lb_count(&c, &uid).await?;
    if made > 0 {
        let _ = c.delete_load_balancer(service(&uid)).await;
    }
    match answer {
        Err(Error::InvalidArgument { violations, .. })
            if violations.iter().any(|v| v.field == "hosts") && made == 0 =>
        {
            Ok(Outcome::Pass)
        }
        Err(Error::InvalidArgument { .. }) if made == 0 => {
            fail("INVALID_ARGUMENT, but not naming the field hosts")
        }
        _ if made > 0 => fail("the refused ensure made a load balancer"),
        other => fail(format!(
            "{count} hosts past the {} limits: expected INVALID_ARGUMENT naming hosts, got {other:?}",
            default.kind
        )),
    }
}
