//! `kubectl ccm status`: each controller's leader and queue, the gateway's
//! health and budget, and what needs a person (the exit code says whether
//! anything does).

use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;

use crate::facts::{self, Install, at};
use crate::verdict::{Answer, Leader, answer_leads, gateway_silent, human};

/// Failures in a row after which an object needs a person.
const REPEATED: u64 = ccm_runtime::queue::REPEATED as u64;
use crate::{Args, Output};

/// The controllers, as their Leases name them.
const CONTROLLERS: [&str; 3] = ["node-controller", "service-controller", "route-controller"];

/// One controller's part of the report.
#[derive(Debug, Serialize)]
pub struct ControllerReport {
    pub name: &'static str,
    pub leader: Leader,
    /// The leader's `/debug/status`.
    pub status: Answer,
}

/// What Cluster Autoscaler says of itself in its status ConfigMap.
#[derive(Debug, Serialize)]
pub struct AutoscalerReport {
    /// `namespace/name` of the ConfigMap.
    pub config_map: String,
    /// Its status, parsed (1.30 on write YAML); `Err` with why it could not
    /// be read.
    pub status: Result<Value, String>,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub controllers: Vec<ControllerReport>,
    /// The gateway's `/debug/status`.
    pub gateway: Answer,
    /// Cluster Autoscaler's, where one runs (its ConfigMap exists or the
    /// gateway served it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscaler: Option<AutoscalerReport>,
    /// What needs a person; empty when all is well.
    pub problems: Vec<String>,
    /// What to know that needs no one (throttling that passes, waits).
    pub notes: Vec<String>,
}

/// What needs a person, and what is only worth knowing.
pub fn judge(controllers: &[ControllerReport], gateway: &Answer) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    for c in controllers {
        judge_controller(c, &mut problems, &mut notes);
    }
    match gateway {
        Err(why) => problems.push(format!("gateway: does not answer: {why}")),
        Ok(g) => {
            if g["ready"] == false {
                problems.push("gateway: not ready (the provider does not answer its check)".into());
            }
            let b = &g["budget"];
            if let Some(ago) = b["last_throttled_ago_s"]
                .as_f64()
                .filter(|ago| *ago < 300.0)
            {
                notes.push(format!(
                    "gateway: the cloud throttled {} ago; rate now {}/s of {}/s, {} calls waiting",
                    human(ago),
                    b["rate_now"],
                    b["rate"],
                    b["waiting_total"]
                ));
            }
        }
    }
    if let Some(mixed) = mixed_releases(controllers, gateway) {
        notes.push(mixed);
    }
    (problems, notes)
}

/// The release a process said it is (`/debug/status`'s `build`).
fn release(status: &Value) -> Option<String> {
    let build = &status["build"];
    Some(format!(
        "{} ({})",
        build["version"].as_str()?,
        build["commit"].as_str().unwrap_or("?")
    ))
}

/// A note naming each process's release when they are not all the same
/// one: an upgrade under way, or one stuck half done.
fn mixed_releases(controllers: &[ControllerReport], gateway: &Answer) -> Option<String> {
    let mut seen: Vec<(String, String)> = controllers
        .iter()
        .filter_map(|c| Some((c.name.to_owned(), release(c.status.as_ref().ok()?)?)))
        .collect();
    if let Some(g) = gateway.as_ref().ok().and_then(release) {
        seen.push(("gateway".into(), g));
    }
    let first = &seen.first()?.1;
    if seen.iter().all(|(_, r)| r == first) {
        return None;
    }
    let each: Vec<String> = seen.iter().map(|(n, r)| format!("{n} {r}")).collect();
    Some(format!(
        "releases differ (an upgrade under way?): {}",
        each.join(", ")
    ))
}

/// One controller's problems and notes. A leader's own answer wins over
/// this machine's clock; a failure or two is a note, failures again and
/// again a problem; orphans the controller deletes itself a note.
fn judge_controller(c: &ControllerReport, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    let name = c.name;
    if !c.leader.found {
        problems.push(format!("{name}: not running (no Lease {})", c.leader.lease));
        return;
    }
    let leads = c.status.as_ref().is_ok_and(|s| answer_leads(&c.leader, s));
    if !c.leader.valid && !leads {
        let ago = c
            .leader
            .renewed_ago_s
            .map(human)
            .unwrap_or_else(|| "?".into());
        problems.push(format!("{name}: no leader (Lease last renewed {ago} ago)"));
        return;
    }
    let s = match &c.status {
        Ok(s) => s,
        Err(why) => {
            problems.push(format!("{name}: the leader does not answer: {why}"));
            return;
        }
    };
    if !leads {
        notes.push(format!(
            "{name}: the Lease's holder does not lead now; the lease is passing"
        ));
        return;
    }
    if let Some(why) = gateway_silent(s) {
        problems.push(format!("{name}: cannot reach the gateway{why}"));
    }
    // A refusal (an invalid annotation) never clears on its own.
    let troubled = s["troubled"].as_array().cloned().unwrap_or_default();
    let refused: Vec<_> = troubled
        .iter()
        .filter(|t| t["kind"] == "invalid_argument")
        .collect();
    if !refused.is_empty() {
        let keys: Vec<_> = refused.iter().filter_map(|t| t["key"].as_str()).collect();
        problems.push(format!(
            "{name}: {} objects refused until someone fixes them: {} (kubectl ccm why <kind>/<name>)",
            refused.len(),
            keys.join(", ")
        ));
    }
    let refused_early = refused
        .iter()
        .filter(|t| t["failures"].as_u64().unwrap_or_default() < REPEATED)
        .count() as u64;
    let failing = s["queue"]["failing"]
        .as_u64()
        .unwrap_or_default()
        .saturating_sub(refused_early);
    let repeatedly = s["queue"]["failing_repeatedly"]
        .as_u64()
        .unwrap_or_default();
    if failing > repeatedly {
        notes.push(format!(
            "{name}: {} objects failed once or twice, retrying",
            failing - repeatedly
        ));
    }
    if repeatedly > 0 {
        let first = s["troubled"]
            .as_array()
            .and_then(|t| {
                t.iter()
                    .find(|t| t["failures"].as_u64().unwrap_or_default() >= REPEATED)
            })
            .map(|t| {
                format!(
                    ", e.g. {}: {}",
                    t["key"].as_str().unwrap_or_default(),
                    t["message"].as_str().unwrap_or_default()
                )
            })
            .unwrap_or_default();
        problems.push(format!(
            "{name}: {repeatedly} objects failing again and again{first} (kubectl ccm why <kind>/<name>)"
        ));
    }
    let waiting = s["queue"]["waiting"].as_u64().unwrap_or_default();
    if waiting > 0 {
        notes.push(format!("{name}: {waiting} objects waiting for the cloud"));
    }
    if let Some(h) = s.get("held_back_deletions").filter(|h| h.is_object()) {
        problems.push(format!(
            "{name}: node deletions held back by the mass-deletion safeguard: {} of {} nodes look gone",
            h["count"], h["of"]
        ));
    }
    let orphans = s["orphaned_total"].as_u64().unwrap_or_default();
    if orphans > 0 && s["deletes_orphans"] == true {
        notes.push(format!(
            "{name}: {orphans} orphaned load balancers, deleted once their grace period ends"
        ));
    } else if orphans > 0 {
        problems.push(format!(
            "{name}: {orphans} orphaned load balancers (their Services are gone: delete them, or turn on the controller's orphan deletion)"
        ));
    }
}

fn controller_row(c: &ControllerReport) -> String {
    let leader = match (&c.leader.pod, c.leader.valid) {
        (Some(pod), true) => pod.clone(),
        _ => "<none>".into(),
    };
    let held = c
        .leader
        .held_for_s
        .filter(|_| c.leader.valid)
        .map(human)
        .unwrap_or_else(|| "-".into());
    let num = |p: &str| {
        at(&c.status, p)
            .map(Value::to_string)
            .unwrap_or_else(|| "-".into())
    };
    format!(
        "{:<20}{:<26}{:<14}{:<8}{:<10}{:<9}{}",
        c.name,
        leader,
        held,
        num("/queue/depth"),
        num("/queue/failing"),
        num("/queue/waiting"),
        c.status
            .as_ref()
            .ok()
            .and_then(release)
            .unwrap_or_else(|| "-".into()),
    )
}

fn gateway_lines(gateway: &Answer) -> Vec<String> {
    let g = match gateway {
        Ok(g) => g,
        Err(why) => return vec![format!("does not answer: {why}")],
    };
    let b = &g["budget"];
    let hit = g["instance_cache"]["hit_rate"]
        .as_f64()
        .map(|r| format!("{:.0}%", r * 100.0))
        .unwrap_or_else(|| "-".into());
    let throttled = b["last_throttled_ago_s"]
        .as_f64()
        .map(|ago| format!("{} ago", human(ago)))
        .unwrap_or_else(|| "never".into());
    let mut lines = vec![
        format!(
            "{} on {}, release {}",
            if g["ready"] == true {
                "ready"
            } else {
                "NOT ready"
            },
            g["provider"].as_str().unwrap_or("?"),
            release(g).unwrap_or_else(|| "?".into())
        ),
        format!(
            "budget: {}/s (now {}/s), {} tokens, waiting high {} normal {} low {}, last throttled {throttled}",
            b["rate"],
            b["rate_now"],
            b["tokens"],
            b["waiting"]["high"],
            b["waiting"]["normal"],
            b["waiting"]["low"]
        ),
        format!("instance cache hit rate: {hit}"),
    ];
    if let Some(served) = served_line(g) {
        lines.push(served);
    }
    if let Some(errors) = g["provider_errors"].as_array().filter(|e| !e.is_empty()) {
        lines.push("last provider errors:".into());
        for e in errors.iter().rev().take(3) {
            lines.push(format!(
                "  {} ago {} {}: {}",
                e["ago_s"].as_f64().map(human).unwrap_or_default(),
                e["operation"].as_str().unwrap_or_default(),
                e["outcome"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            ));
        }
    }
    lines
}

/// The gRPC services' calls, the controllers' beside Cluster
/// Autoscaler's and any other tool's: `calls served: Instances 1200,
/// CloudProvider (Cluster Autoscaler) 40 (2 failed)`.
fn served_line(g: &Value) -> Option<String> {
    let served = g["served"].as_object().filter(|s| !s.is_empty())?;
    let each: Vec<String> = served
        .iter()
        .map(|(service, n)| {
            let short = service.rsplit('.').next().unwrap_or(service);
            let name = if service.starts_with("clusterautoscaler.") {
                format!("{short} (Cluster Autoscaler)")
            } else {
                short.to_owned()
            };
            let ok = n["ok"].as_u64().unwrap_or(0);
            match n["failed"].as_u64().unwrap_or(0) {
                0 => format!("{name} {ok}"),
                failed => format!("{name} {} ({failed} failed)", ok + failed),
            }
        })
        .collect();
    Some(format!("calls served: {}", each.join(", ")))
}

/// Cluster Autoscaler's status ConfigMap in `namespace`, read with the
/// caller's own rights; `None` where there is none and the gateway served
/// no autoscaler either.
async fn autoscaler(
    client: &kube::Client,
    namespace: &str,
    gateway: &Answer,
) -> Option<AutoscalerReport> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let maps: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let config_map = format!("{namespace}/{AUTOSCALER_STATUS}");
    let served = gateway.as_ref().is_ok_and(|g| {
        g["served"]
            .as_object()
            .is_some_and(|s| s.keys().any(|k| k.starts_with("clusterautoscaler.")))
    });
    // Asked first, as `kubectl auth can-i` asks: an operator without the
    // grant gets a note, and the API server no refused request.
    if !may_read(client, namespace, AUTOSCALER_STATUS).await {
        return served.then(|| AutoscalerReport {
            config_map,
            status: Err("you may not read it (get configmaps there; the chart's viewer Role grants it with autoscaler.enabled)".into()),
        });
    }
    let status = match maps.get_opt(AUTOSCALER_STATUS).await {
        Ok(Some(map)) => map
            .data
            .and_then(|mut d| d.remove("status"))
            .ok_or_else(|| "it holds no status".to_owned())
            .and_then(|text| parse_autoscaler_status(&text)),
        Ok(None) if !served => return None,
        Ok(None) => Err("it does not exist, though the gateway served Cluster Autoscaler: is its --namespace another?".into()),
        Err(e) => Err(format!("cannot read it: {e}")),
    };
    Some(AutoscalerReport { config_map, status })
}

/// Whether the caller may get the ConfigMap `namespace/name`: a
/// SelfSubjectAccessReview, which the API server answers without counting
/// a refusal.
async fn may_read(client: &kube::Client, namespace: &str, name: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let reviews: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()),
                verb: Some("get".into()),
                resource: Some("configmaps".into()),
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    reviews
        .create(&Default::default(), &review)
        .await
        .ok()
        .and_then(|r| r.status)
        .is_some_and(|s| s.allowed)
}

/// The ConfigMap Cluster Autoscaler writes its status to.
const AUTOSCALER_STATUS: &str = "cluster-autoscaler-status";

/// The status text: YAML from 1.30 on; before, lines such as
/// `Health:      Healthy (ready=3 ...)`, of which the cluster-wide health
/// is kept.
fn parse_autoscaler_status(text: &str) -> Result<Value, String> {
    if let Ok(value) = serde_norway::from_str::<Value>(text)
        && (value.get("clusterWide").is_some() || value.get("autoscalerStatus").is_some())
    {
        return Ok(value);
    }
    let health = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Health:"))
        .and_then(|h| h.split_whitespace().next())
        .ok_or_else(|| "its status reads as neither YAML nor text with a Health line".to_owned())?;
    Ok(serde_json::json!({"clusterWide": {"health": {"status": health}}}))
}

/// What needs a person in the autoscaler's report, and what to know.
fn judge_autoscaler(a: &AutoscalerReport, problems: &mut Vec<String>, notes: &mut Vec<String>) {
    let status = match &a.status {
        Ok(s) => s,
        Err(why) => {
            notes.push(format!(
                "cluster-autoscaler: status ConfigMap {}: {why}",
                a.config_map
            ));
            return;
        }
    };
    let health = status["clusterWide"]["health"]["status"].as_str();
    match health {
        Some("Healthy") | None => {}
        Some(other) => problems.push(format!(
            "cluster-autoscaler: the cluster is {other} by its count of unready nodes; it scales nothing until that passes (kubectl describe configmap -n {})",
            a.config_map.replace('/', " ")
        )),
    }
    for g in status["nodeGroups"].as_array().into_iter().flatten() {
        let name = g["name"].as_str().unwrap_or("?");
        if let Some(state) = g["health"]["status"].as_str().filter(|s| *s != "Healthy") {
            problems.push(format!(
                "cluster-autoscaler: node group {name} is {state}: its new nodes did not become ready in time"
            ));
        }
        if g["scaleUp"]["status"] == "Backoff" {
            notes.push(format!(
                "cluster-autoscaler: node group {name} backs off scale-ups (its last ones failed)"
            ));
        }
    }
}

/// The autoscaler's lines: its health and each group's.
fn autoscaler_lines(a: &AutoscalerReport) -> Vec<String> {
    let s = match &a.status {
        Ok(s) => s,
        Err(why) => return vec![format!("{}: {why}", a.config_map)],
    };
    let field = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    let mut lines = vec![format!(
        "{} ({}, written {}): scale-up {}, scale-down {}",
        field(&s["clusterWide"]["health"]["status"]),
        a.config_map,
        field(&s["time"]),
        field(&s["clusterWide"]["scaleUp"]["status"]),
        field(&s["clusterWide"]["scaleDown"]["status"]),
    )];
    for g in s["nodeGroups"].as_array().into_iter().flatten() {
        let h = &g["health"];
        lines.push(format!(
            "node group {}: {}, target {} ({}..{}), scale-up {}",
            field(&g["name"]),
            field(&h["status"]),
            h["cloudProviderTarget"],
            h["minSize"],
            h["maxSize"],
            field(&g["scaleUp"]["status"]),
        ));
    }
    lines
}

/// Runs `status`.
pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (client, _) = crate::client(args).await?;
    let install = Install {
        namespace: args.ccm_namespace.clone(),
        release: args.release.clone(),
    };
    // All four read at once: each may take up to the client's timeout.
    let (node, service, route, gateway) = tokio::join!(
        facts::controller(&client, &install, CONTROLLERS[0]),
        facts::controller(&client, &install, CONTROLLERS[1]),
        facts::controller(&client, &install, CONTROLLERS[2]),
        facts::gateway(&client, &install),
    );
    let mut controllers = Vec::new();
    for (name, answer) in CONTROLLERS.into_iter().zip([node, service, route]) {
        match answer {
            Ok((leader, status)) => controllers.push(ControllerReport {
                name,
                leader,
                status,
            }),
            Err(why) => return crate::fail(&why),
        }
    }
    let (mut problems, mut notes) = judge(&controllers, &gateway);
    let autoscaler = autoscaler(&client, &args.autoscaler_namespace, &gateway).await;
    if let Some(a) = &autoscaler {
        judge_autoscaler(a, &mut problems, &mut notes);
    }
    let report = Report {
        controllers,
        gateway,
        autoscaler,
        problems,
        notes,
    };
    if args.output == Output::Text {
        println!(
            "{:<20}{:<26}{:<14}{:<8}{:<10}{:<9}RELEASE",
            "CONTROLLER", "LEADER", "LEADS FOR", "QUEUE", "FAILING", "WAITING"
        );
        for c in &report.controllers {
            println!("{}", controller_row(c));
        }
        println!();
        println!("gateway:");
        for line in gateway_lines(&report.gateway) {
            println!("  {line}");
        }
        if let Some(a) = &report.autoscaler {
            println!();
            println!("cluster-autoscaler:");
            for line in autoscaler_lines(a) {
                println!("  {line}");
            }
        }
        println!();
        if report.problems.is_empty() {
            println!("nothing needs you");
        } else {
            println!("needs a person:");
            for p in &report.problems {
                println!("  - {p}");
            }
        }
        for n in &report.notes {
            println!("note: {n}");
        }
    } else {
        crate::print(args.output, &report)?;
    }
    Ok(ExitCode::from(u8::from(!report.problems.is_empty())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The leader's answer: `fields` from a replica that leads.
    fn leads(name: &str, fields: Value) -> Answer {
        let mut answer = json!({"leading": true, "identity": format!("{name}-0_1"),
            "gateway": {"reachable": true}, "queue": {"depth": 0, "failing": 0, "waiting": 0}});
        answer
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().cloned().unwrap_or_default());
        Ok(answer)
    }

    fn healthy(name: &'static str) -> ControllerReport {
        ControllerReport {
            name,
            leader: Leader {
                controller: name.into(),
                found: true,
                valid: true,
                holder: Some(format!("{name}-0_1")),
                pod: Some(format!("{name}-0")),
                ..Leader::default()
            },
            status: leads(name, json!({})),
        }
    }

    #[test]
    fn the_autoscalers_health_is_read_from_its_status_in_either_format() {
        let yaml = "time: 2026-11-28 00:51:54 +0000 UTC\nautoscalerStatus: Running\nclusterWide:\n  health:\n    status: Unhealthy\n  scaleUp:\n    status: NoActivity\nnodeGroups:\n- name: workers\n  health:\n    status: Healthy\n    cloudProviderTarget: 1\n    minSize: 0\n    maxSize: 5\n  scaleUp:\n    status: Backoff\n";
        let report = AutoscalerReport {
            config_map: "kube-system/cluster-autoscaler-status".into(),
            status: parse_autoscaler_status(yaml),
        };
        let (mut problems, mut notes) = (Vec::new(), Vec::new());
        judge_autoscaler(&report, &mut problems, &mut notes);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("Unhealthy"), "{problems:?}");
        assert!(notes[0].contains("workers backs off"), "{notes:?}");
        let lines = autoscaler_lines(&report);
        assert_eq!(
            lines[1],
            "node group workers: Healthy, target 1 (0..5), scale-up Backoff"
        );
        let text = "Cluster-autoscaler status at 2024-01-01 00:00:00 +0000 UTC:\nCluster-wide:\n  Health:      Healthy (ready=3 unready=0 notStarted=0 longNotStarted=0 registered=3 longUnregistered=0)\n";
        assert_eq!(
            parse_autoscaler_status(text).unwrap()["clusterWide"]["health"]["status"],
            "Healthy"
        );
    }

    #[test]
    fn the_gateway_line_names_the_autoscalers_calls_beside_the_controllers() {
        let g = json!({"served": {
            "cloudgateway.v1.Instances": {"ok": 1200, "failed": 0},
            "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider": {"ok": 38, "failed": 2},
        }});
        assert_eq!(
            served_line(&g).as_deref(),
            Some("calls served: Instances 1200, CloudProvider (Cluster Autoscaler) 40 (2 failed)")
        );
        assert_eq!(served_line(&json!({"served": {}})), None);
    }

    fn gateway() -> Answer {
        Ok(json!({"ready": true, "budget": {"rate": 20.0}}))
    }

    #[test]
    fn a_half_done_upgrade_is_a_note_naming_each_release() {
        let build = |version: &str| json!({"build": {"version": version, "commit": "abc"}});
        let mut controllers: Vec<_> = CONTROLLERS.map(healthy).into();
        for c in &mut controllers {
            c.status = leads(c.name, build("0.2.0"));
        }
        let gateway = Ok(json!({"ready": true, "build": {"version": "0.2.0", "commit": "abc"}}));
        assert_eq!(judge(&controllers, &gateway), (vec![], vec![]));
        controllers[1].status = leads("service-controller", build("0.1.0"));
        let (problems, notes) = judge(&controllers, &gateway);
        assert!(problems.is_empty());
        assert_eq!(
            notes,
            [
                "releases differ (an upgrade under way?): node-controller 0.2.0 (abc), service-controller 0.1.0 (abc), route-controller 0.2.0 (abc), gateway 0.2.0 (abc)"
            ]
        );
    }

    #[test]
    fn a_healthy_system_needs_no_one() {
        let controllers: Vec<_> = CONTROLLERS.map(healthy).into();
        assert_eq!(judge(&controllers, &gateway()), (vec![], vec![]));
    }

    #[test]
    fn each_thing_that_needs_a_person_is_named() {
        type Change = fn(&mut Vec<ControllerReport>, &mut Answer);
        let cases: Vec<(Change, &str)> = vec![
            (
                |c, _| {
                    c[1].leader.valid = false;
                    c[1].status = Err("connection refused".into());
                },
                "service-controller: no leader",
            ),
            (
                |c, _| c[0].leader.found = false,
                "node-controller: not running",
            ),
            (
                |c, _| c[2].status = Err("503".into()),
                "route-controller: the leader does not answer",
            ),
            (
                |_, g| *g = Err("no endpoints".into()),
                "gateway: does not answer",
            ),
            (
                |_, g| *g = Ok(json!({"ready": false})),
                "gateway: not ready",
            ),
            (
                |c, _| {
                    c[1].status = leads(
                        "service-controller",
                        json!({"gateway": {"reachable": false,
                        "last_no_answer": {"ago_s": 3.0, "message": "tcp connect error"}}}),
                    )
                },
                "service-controller: cannot reach the gateway: tcp connect error",
            ),
            (
                |c, _| {
                    c[1].status = leads(
                        "service-controller",
                        json!({
                        "queue": {"failing": 2, "failing_repeatedly": 1},
                        "troubled": [{"key": "default/a", "failures": 1, "message": "once"},
                            {"key": "default/web", "failures": 3, "message": "boom"}]}),
                    )
                },
                "1 objects failing again and again, e.g. default/web: boom",
            ),
            (
                |c, _| {
                    c[1].status = leads(
                        "service-controller",
                        json!({"queue": {"failing": 1}, "troubled": [
                            {"key": "default/bad", "failures": 1, "kind": "invalid_argument"}]}),
                    )
                },
                "1 objects refused until someone fixes them: default/bad",
            ),
            (
                |c, _| {
                    c[0].status = leads(
                        "node-controller",
                        json!({
                        "held_back_deletions": {"count": 6, "of": 10}}),
                    )
                },
                "held back by the mass-deletion safeguard: 6 of 10",
            ),
            (
                |c, _| c[1].status = leads("service-controller", json!({"orphaned_total": 1})),
                "1 orphaned load balancers",
            ),
        ];
        for (change, words) in cases {
            let mut controllers: Vec<_> = CONTROLLERS.map(healthy).into();
            let mut g = gateway();
            change(&mut controllers, &mut g);
            let (problems, _) = judge(&controllers, &g);
            assert!(
                problems.iter().any(|p| p.contains(words)),
                "{words}: {problems:?}"
            );
        }
    }

    #[test]
    fn what_passes_on_its_own_is_a_note() {
        type Change = fn(&mut Vec<ControllerReport>);
        let cases: Vec<(Change, &str)> = vec![
            (
                |c| c[1].status = leads("service-controller", json!({"queue": {"failing": 1}})),
                "1 objects failed once or twice",
            ),
            (
                |c| {
                    c[1].status = leads(
                        "service-controller",
                        json!({"orphaned_total": 2, "deletes_orphans": true}),
                    )
                },
                "2 orphaned load balancers, deleted once",
            ),
            (
                |c| {
                    c[1].status = leads(
                        "service-controller",
                        json!({"gateway": {"reachable": false,
                        "last_no_answer": {"ago_s": 3600.0}}}),
                    )
                },
                "",
            ),
            (
                |c| {
                    c[1].status =
                        Ok(json!({"leading": false, "identity": "service-controller-0_2"}))
                },
                "the lease is passing",
            ),
            (
                // Expired by this machine's clock, but the holder says it leads.
                |c| c[1].leader.valid = false,
                "",
            ),
        ];
        for (change, words) in cases {
            let mut controllers: Vec<_> = CONTROLLERS.map(healthy).into();
            change(&mut controllers);
            let (problems, notes) = judge(&controllers, &gateway());
            assert!(problems.is_empty(), "{words}: {problems:?}");
            assert!(
                words.is_empty() || notes.iter().any(|n| n.contains(words)),
                "{words}: {notes:?}"
            );
        }
    }

    #[test]
    fn throttling_and_waits_are_notes_not_problems() {
        let mut controllers: Vec<_> = CONTROLLERS.map(healthy).into();
        controllers[1].status = leads("service-controller", json!({"queue": {"waiting": 1}}));
        let g = Ok(
            json!({"ready": true, "budget": {"last_throttled_ago_s": 3.0,
            "rate": 20.0, "rate_now": 2.5, "waiting_total": 12}}),
        );
        let (problems, notes) = judge(&controllers, &g);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[1].contains("12 calls waiting"), "{notes:?}");
    }
}
