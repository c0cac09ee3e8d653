//! `kubectl ccm status`: each controller's leader and queue, the gateway's
//! health and budget, and what needs a person (the exit code says whether
//! anything does).

use std::process::ExitCode;

use serde::Serialize;
use serde_json::Value;

use crate::facts::{self, Install, at};
use crate::verdict::{Answer, Leader, human};
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

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    pub controllers: Vec<ControllerReport>,
    /// The gateway's `/debug/status`.
    pub gateway: Answer,
    /// What needs a person; empty when all is well.
    pub problems: Vec<String>,
    /// What to know that needs no one (throttling that passes, waits).
    pub notes: Vec<String>,
}

/// What needs a person, and what is only worth knowing.
pub fn judge(controllers: &[ControllerReport], gateway: &Answer) -> (Vec<String>, Vec<String>) {
    let (mut problems, mut notes) = (Vec::new(), Vec::new());
    for c in controllers {
        let name = c.name;
        if !c.leader.found {
            problems.push(format!("{name}: not running (no Lease {})", c.leader.lease));
            continue;
        }
        if !c.leader.valid {
            let ago = c
                .leader
                .renewed_ago_s
                .map(human)
                .unwrap_or_else(|| "?".into());
            problems.push(format!("{name}: no leader (Lease last renewed {ago} ago)"));
            continue;
        }
        let s = match &c.status {
            Ok(s) => s,
            Err(why) => {
                problems.push(format!("{name}: the leader does not answer: {why}"));
                continue;
            }
        };
        if s["gateway"]["reachable"] == false {
            let why = s["gateway"]["last_no_answer"]["message"]
                .as_str()
                .unwrap_or("no answer");
            problems.push(format!("{name}: cannot reach the gateway: {why}"));
        }
        let failing = s["queue"]["failing"].as_u64().unwrap_or_default();
        if failing > 0 {
            let first = s["troubled"]
                .as_array()
                .and_then(|t| {
                    t.iter()
                        .find(|t| t["failures"].as_u64().unwrap_or_default() > 0)
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
                "{name}: {failing} objects failing{first} (kubectl ccm why <kind>/<name>)"
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
        if orphans > 0 {
            problems.push(format!(
                "{name}: {orphans} orphaned load balancers (their Services are gone)"
            ));
        }
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
    (problems, notes)
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
        "{:<20}{:<26}{:<14}{:<8}{:<10}{}",
        c.name,
        leader,
        held,
        num("/queue/depth"),
        num("/queue/failing"),
        num("/queue/waiting"),
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
            "{} on {}",
            if g["ready"] == true {
                "ready"
            } else {
                "NOT ready"
            },
            g["provider"].as_str().unwrap_or("?")
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

/// Runs `status`.
pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let (client, _) = crate::client(args).await?;
    let install = Install {
        namespace: args.ccm_namespace.clone(),
        release: args.release.clone(),
    };
    let mut controllers = Vec::new();
    for name in CONTROLLERS {
        match facts::controller(&client, &install, name).await {
            Ok((leader, status)) => controllers.push(ControllerReport {
                name,
                leader,
                status,
            }),
            Err(why) => return crate::fail(&why),
        }
    }
    let gateway = facts::from_gateway(&client, &install, "/debug/status").await;
    let (problems, notes) = judge(&controllers, &gateway);
    let report = Report {
        controllers,
        gateway,
        problems,
        notes,
    };
    if args.output == Output::Text {
        println!(
            "{:<20}{:<26}{:<14}{:<8}{:<10}WAITING",
            "CONTROLLER", "LEADER", "LEADS FOR", "QUEUE", "FAILING"
        );
        for c in &report.controllers {
            println!("{}", controller_row(c));
        }
        println!();
        println!("gateway:");
        for line in gateway_lines(&report.gateway) {
            println!("  {line}");
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

    fn healthy(name: &'static str) -> ControllerReport {
        ControllerReport {
            name,
            leader: Leader {
                controller: name.into(),
                found: true,
                valid: true,
                pod: Some(format!("{name}-0")),
                ..Leader::default()
            },
            status: Ok(json!({"gateway": {"reachable": true},
                "queue": {"depth": 0, "failing": 0, "waiting": 0}})),
        }
    }

    fn gateway() -> Answer {
        Ok(json!({"ready": true, "budget": {"rate": 20.0}}))
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
                |c, _| c[1].leader.valid = false,
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
                |c, _| c[1].status = Ok(json!({"gateway": {"reachable": false}, "queue": {}})),
                "service-controller: cannot reach the gateway",
            ),
            (
                |c, _| {
                    c[1].status = Ok(json!({"gateway": {}, "queue": {"failing": 2},
                    "troubled": [{"key": "default/web", "failures": 3, "message": "boom"}]}))
                },
                "2 objects failing, e.g. default/web: boom",
            ),
            (
                |c, _| {
                    c[0].status = Ok(json!({"gateway": {}, "queue": {},
                    "held_back_deletions": {"count": 6, "of": 10}}))
                },
                "held back by the mass-deletion safeguard: 6 of 10",
            ),
            (
                |c, _| c[1].status = Ok(json!({"gateway": {}, "queue": {}, "orphaned_total": 1})),
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
    fn throttling_and_waits_are_notes_not_problems() {
        let mut controllers: Vec<_> = CONTROLLERS.map(healthy).into();
        controllers[1].status = Ok(json!({"gateway": {}, "queue": {"waiting": 1}}));
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
