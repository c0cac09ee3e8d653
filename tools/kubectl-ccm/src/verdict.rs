//! The verdicts: from what was read (the object, its controller's lease,
//! the leader's and the gateway's `/debug/` answers, events), the one
//! cause an operator should act on, first. Pure: no I/O, tested with
//! tables.

use ccm_runtime::names;
use serde::Serialize;
use serde_json::Value;

/// Who holds a controller's lease.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Leader {
    /// The controller, e.g. `service-controller`.
    pub controller: String,
    /// `namespace/name` of its Lease.
    pub lease: String,
    /// Whether the Lease exists.
    pub found: bool,
    /// The holder's identity, when one holds it.
    pub holder: Option<String>,
    /// The holder's pod (its identity up to the last `_`).
    pub pod: Option<String>,
    /// Whether the holder renewed it within its duration.
    pub valid: bool,
    /// When it was last renewed (RFC 3339), and how long ago.
    pub renewed: Option<String>,
    /// When it ran out or runs out: renewed plus its duration (RFC 3339).
    pub expired: Option<String>,
    pub renewed_ago_s: Option<f64>,
    /// How long the holder has held it.
    pub held_for_s: Option<f64>,
}

/// A Service's status condition, as the service controller writes it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Condition {
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// One recent event of the object.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EventLine {
    pub age_s: Option<f64>,
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// An answer read through the API server, or why there is none.
pub type Answer = Result<Value, String>;

/// What was read about a Service.
#[derive(Debug, Serialize)]
pub struct ServiceFacts {
    /// `namespace/name`.
    pub service: String,
    #[serde(rename = "type")]
    pub type_: String,
    pub load_balancer_class: Option<String>,
    pub ingress: Vec<String>,
    pub deleting: bool,
    pub condition: Option<Condition>,
    pub leader: Leader,
    /// The leader's `/debug/status`.
    pub controller: Answer,
    /// The leader's `/debug/object` for the Service.
    pub queue: Answer,
    /// The gateway's `/debug/status`.
    pub gateway: Answer,
    /// The gateway's last calls for the Service.
    pub gateway_calls: Answer,
    /// The newest events, or why they could not be read.
    pub events: Result<Vec<EventLine>, String>,
}

/// What was read about a Node.
#[derive(Debug, Serialize)]
pub struct NodeFacts {
    pub node: String,
    pub provider_id: Option<String>,
    pub uninitialized: bool,
    pub shutdown: bool,
    pub leader: Leader,
    pub controller: Answer,
    pub queue: Answer,
    pub gateway: Answer,
    pub gateway_calls: Answer,
    /// The newest events, or why they could not be read.
    pub events: Result<Vec<EventLine>, String>,
}

/// The answer to "why".
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// A stable name of the cause, e.g. `provisioning`, `no_leader`.
    pub cause: &'static str,
    /// One line for a person.
    pub summary: String,
    /// Whether a person must act (else it resolves on its own or is fine).
    pub needs_person: bool,
}

fn verdict(cause: &'static str, summary: String, needs_person: bool) -> Verdict {
    Verdict {
        cause,
        summary,
        needs_person,
    }
}

/// Seconds as a person reads them: `40 s`, `3 min 5 s`, `2 h 10 min`.
pub fn human(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// How long ago a leader's last unanswered gateway call may be for it to
/// count: a controller with nothing to do calls nobody, and an old failure
/// says nothing of now.
const RECENT_S: f64 = 600.0;

/// Whether the leader's answer says it leads under the Lease's holder.
pub fn answer_leads(leader: &Leader, status: &Value) -> bool {
    status["leading"] == true && status["identity"].as_str() == leader.holder.as_deref()
}

/// The gateway's unanswered call, if the leader's last one is recent.
pub fn gateway_silent(status: &Value) -> Option<String> {
    let gateway = &status["gateway"];
    let recent = gateway["last_no_answer"]["ago_s"]
        .as_f64()
        .is_some_and(|ago| ago < RECENT_S);
    (gateway["reachable"] == false && recent).then(|| {
        let why = gateway["last_no_answer"]["message"]
            .as_str()
            .unwrap_or("no answer");
        let since = gateway["last_answer_ago_s"]
            .as_f64()
            .map(|s| format!(", last answer {} ago", human(s)))
            .unwrap_or_default();
        format!("{since}: {why}")
    })
}

/// The verdicts every object shares, in order: the controller has no
/// leader, its leader cannot be asked or no longer leads, the leader cannot
/// reach the gateway. The leader's own answer wins over this machine's
/// clock: a holder that answers it leads, leads.
fn controller_verdict(leader: &Leader, controller: &Answer) -> Option<Verdict> {
    let name = &leader.controller;
    if !leader.found {
        return Some(verdict(
            "no_leader",
            format!(
                "no {name} is running: its Lease {} does not exist (objects named otherwise? see --release, --ccm-namespace)",
                leader.lease
            ),
            true,
        ));
    }
    let leads = controller.as_ref().is_ok_and(|s| answer_leads(leader, s));
    if !leader.valid && !leads {
        let since = match (&leader.expired, leader.renewed_ago_s) {
            (Some(at), Some(ago)) => format!(" since {at} (last renewed {} ago)", human(ago)),
            _ => String::new(),
        };
        return Some(verdict(
            "no_leader",
            format!(
                "no leader for {name}{since}: every replica is stopped or cannot renew its Lease {}",
                leader.lease
            ),
            true,
        ));
    }
    let pod = leader.pod.as_deref().unwrap_or("?");
    let status = match controller {
        Ok(status) => status,
        Err(why) => {
            return Some(verdict(
                "leader_unreachable",
                format!("the {name} leader {pod} does not answer: {why}"),
                true,
            ));
        }
    };
    if !leads {
        return Some(verdict(
            "leader_changing",
            format!(
                "the Lease names {pod}, which does not lead now (restarted, or the lease is passing to another replica); ask again in a few seconds"
            ),
            false,
        ));
    }
    gateway_silent(status).map(|why| {
        verdict(
            "gateway_unreachable",
            format!("gateway unreachable from the {name} leader {pod}{why}"),
            true,
        )
    })
}

/// The trouble the leader's queue holds for the object, if any.
fn trouble(queue: &Answer) -> Option<&Value> {
    queue
        .as_ref()
        .ok()
        .map(|q| &q["queue"]["trouble"])
        .filter(|t| t.is_object())
}

/// The last call the gateway remembers for the object.
fn last_call(calls: &Answer) -> Option<&Value> {
    calls.as_ref().ok()?["calls"].as_array()?.last()
}

fn is_throttling(kind: &str, reason: &str) -> bool {
    let throttling = ["cloud_throttled", "budget_exhausted"];
    throttling.contains(&kind) || throttling.contains(&reason.to_lowercase().as_str())
}

/// The verdicts of the object's own work, in order: throttling,
/// provisioning, failing, queued, in flight.
fn work_verdict(queue: &Answer, gateway: &Answer, calls: &Answer) -> Option<Verdict> {
    let q = queue.as_ref().ok()?;
    let call = last_call(calls);
    let call_reason = call.and_then(|c| c["reason"].as_str()).unwrap_or_default();
    if let Some(t) = trouble(queue) {
        let kind = t["kind"].as_str().unwrap_or_default();
        let next = t["next_try_in_s"]
            .as_f64()
            .map(|s| format!(", next try in {}", human(s)))
            .unwrap_or_default();
        let so_far = t["since_ago_s"].as_f64().map(human).unwrap_or_default();
        if is_throttling(kind, call_reason) {
            let waiting = gateway.as_ref().ok().map(|g| &g["budget"]);
            let waiting_line = match waiting {
                Some(b) => format!(
                    "{} calls waiting for the budget (rate now {}/s of {}/s)",
                    b["waiting_total"], b["rate_now"], b["rate"]
                ),
                None => "the gateway's budget could not be read".to_owned(),
            };
            let priority = call
                .and_then(|c| c["priority"].as_str())
                .map(|p| format!(", this one at {p} priority"))
                .unwrap_or_default();
            return Some(verdict(
                "throttling",
                format!(
                    "cloud throttling: {waiting_line}{priority}; waiting {so_far} so far{next}"
                ),
                false,
            ));
        }
        if kind == "provisioning" {
            return Some(verdict(
                "provisioning",
                format!("waiting for the cloud to finish provisioning, {so_far} so far{next}"),
                false,
            ));
        }
        if t["waiting"] == true {
            let message = t["message"].as_str().unwrap_or_default();
            return Some(verdict(
                "waiting",
                format!(
                    "the cloud asked to come back later: {message}; waiting {so_far} so far{next}"
                ),
                false,
            ));
        }
        let failures = t["failures"].as_u64().unwrap_or_default();
        if failures > 0 {
            let message = t["message"].as_str().unwrap_or_default();
            let cause = match kind {
                "instance_not_found" => "instance_missing",
                _ => "failing",
            };
            let summary = match cause {
                "instance_missing" => format!(
                    "the cloud has no instance for this node: {message} ({failures} tries{next}); it stays uninitialised until the instance exists"
                ),
                _ => format!("failing: {message} ({failures} failures{next})"),
            };
            return Some(verdict(cause, summary, true));
        }
    }
    if q["queue"]["in_flight"] == true {
        return Some(verdict(
            "syncing",
            "being synced by the leader now".into(),
            false,
        ));
    }
    if q["queue"]["queued"] == true {
        return Some(verdict(
            "queued",
            "queued for the leader's next free worker".into(),
            false,
        ));
    }
    None
}

/// Whether the Service is not the service controller's to serve: the
/// leader's word on it (`served`), else the classes it serves.
fn another_controller(f: &ServiceFacts) -> Option<Verdict> {
    let known = f.queue.as_ref().ok().filter(|q| q["known"] == true);
    let served = match known {
        Some(q) => q["served"] == true,
        None => {
            let classes = &f.controller.as_ref().ok()?["classes"];
            match &f.load_balancer_class {
                Some(class) => classes["named"]
                    .as_array()
                    .is_some_and(|named| named.iter().any(|c| c == class.as_str())),
                None => classes["default"] != false,
            }
        }
    };
    if served {
        return None;
    }
    Some(match &f.load_balancer_class {
        Some(class) => verdict(
            "another_controller",
            format!("another controller owns it: loadBalancerClass {class} is not one service-controller serves"),
            false,
        ),
        None => verdict(
            "another_controller",
            "another controller owns it: service-controller serves no Service without a loadBalancerClass (see its --load-balancer-class)".into(),
            false,
        ),
    })
}

/// Why a Service has no load balancer address, or that it has one.
pub fn why_service(f: &ServiceFacts) -> Verdict {
    if f.type_ != "LoadBalancer" && !f.deleting {
        return verdict(
            "not_load_balancer",
            format!(
                "type {}: a cloud load balancer is only made for type LoadBalancer",
                f.type_
            ),
            false,
        );
    }
    if !f.ingress.is_empty() && !f.deleting {
        let hosts = f
            .queue
            .as_ref()
            .ok()
            .map(|q| &q["hosts"])
            .filter(|h| h["used"].is_u64())
            .map(|h| {
                format!(
                    "; it uses {} of {} eligible nodes ({})",
                    h["used"],
                    h["eligible"],
                    h["why"].as_str().unwrap_or_default()
                )
            })
            .unwrap_or_default();
        return verdict(
            "ready",
            format!(
                "ready: the load balancer answers at {}{hosts}",
                f.ingress.join(", ")
            ),
            false,
        );
    }
    if let Some(v) = another_controller(f) {
        return v;
    }
    if let Some(v) = controller_verdict(&f.leader, &f.controller) {
        return v;
    }
    // The condition is rewritten only on a change: it counts while the
    // leader's queue still holds the refusal.
    let refused_now = trouble(&f.queue).is_some_and(|t| t["kind"] == "invalid_argument");
    if let Some(c) = f.condition.as_ref().filter(|c| {
        c.status == "False" && c.reason == names::REASON_INVALID_CONFIGURATION && refused_now
    }) {
        return verdict("refused", format!("refused: {}", c.message), true);
    }
    if let Some(v) = work_verdict(&f.queue, &f.gateway, &f.gateway_calls) {
        return v;
    }
    if f.queue.as_ref().is_ok_and(|q| q["known"] == false) {
        return verdict(
            "not_seen",
            "the leader has not seen this Service yet (its cache is behind)".into(),
            false,
        );
    }
    if f.deleting {
        return verdict(
            "deleting",
            "being deleted: the load balancer goes, then the finalizer".into(),
            false,
        );
    }
    verdict(
        "unknown",
        "nothing is pending for it in the leader; the last events below say what happened".into(),
        true,
    )
}

/// Why a Node is not initialised, or what holds it back.
pub fn why_node(f: &NodeFacts) -> Verdict {
    let held = f
        .queue
        .as_ref()
        .is_ok_and(|q| q["deletion_held_back"] == true);
    if held {
        let (count, of, share) = f
            .controller
            .as_ref()
            .ok()
            .map(|s| &s["held_back_deletions"])
            .map(|h| (h["count"].clone(), h["of"].clone(), h["max_share"].clone()))
            .unwrap_or_default();
        return verdict(
            "deletion_held_back",
            format!(
                "deletion held back by the mass-deletion safeguard: {count} of {of} nodes look gone at once, above the share of {share}; check the cloud, then raise --node-deletion-max-share or delete the Nodes by hand"
            ),
            true,
        );
    }
    if !f.uninitialized {
        let id = f.provider_id.as_deref().unwrap_or("none");
        let summary = if f.shutdown {
            format!("initialised (provider ID {id}); its instance is shut down")
        } else {
            format!("initialised: provider ID {id}")
        };
        return verdict("ready", summary, false);
    }
    if let Some(v) = controller_verdict(&f.leader, &f.controller) {
        return v;
    }
    if let Some(v) = work_verdict(&f.queue, &f.gateway, &f.gateway_calls) {
        return v;
    }
    verdict(
        "unknown",
        "uninitialised, and nothing is pending for it in the leader; the last events below say what happened".into(),
        true,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn leader() -> Leader {
        Leader {
            controller: "service-controller".into(),
            lease: "kube-system/ccm-service-controller".into(),
            found: true,
            holder: Some("service-controller-0_1234".into()),
            pod: Some("service-controller-0".into()),
            valid: true,
            renewed: Some("2026-11-25T14:02:00Z".into()),
            expired: Some("2026-11-25T14:02:15Z".into()),
            renewed_ago_s: Some(1.0),
            held_for_s: Some(100.0),
        }
    }

    fn controller() -> Answer {
        Ok(
            json!({"leading": true, "identity": "service-controller-0_1234",
            "gateway": {"reachable": true}, "classes": {"default": true, "named": []}}),
        )
    }

    fn object(trouble: Value) -> Answer {
        Ok(json!({"known": true, "served": true,
                "queue": {"queued": false, "in_flight": false, "trouble": trouble}}))
    }

    fn service() -> ServiceFacts {
        ServiceFacts {
            service: "default/web".into(),
            type_: "LoadBalancer".into(),
            load_balancer_class: None,
            ingress: Vec::new(),
            deleting: false,
            condition: None,
            leader: leader(),
            controller: controller(),
            queue: object(Value::Null),
            gateway: Ok(json!({"budget": {"waiting_total": 12, "rate_now": 2.5, "rate": 20.0}})),
            gateway_calls: Ok(json!({"calls": []})),
            events: Ok(Vec::new()),
        }
    }

    fn node() -> NodeFacts {
        NodeFacts {
            node: "n1".into(),
            provider_id: None,
            uninitialized: true,
            shutdown: false,
            leader: Leader {
                controller: "node-controller".into(),
                ..leader()
            },
            controller: controller(),
            queue: object(Value::Null),
            gateway: Err("not asked".into()),
            gateway_calls: Err("not asked".into()),
            events: Ok(Vec::new()),
        }
    }

    #[test]
    fn each_cause_of_a_pending_service_is_named_first() {
        type Change = fn(&mut ServiceFacts);
        let cases: Vec<(&str, Change, &str, &str)> = vec![
            (
                "healthy",
                |f| f.ingress = vec!["203.0.113.10".into()],
                "ready",
                "203.0.113.10",
            ),
            (
                "healthy, with its subset",
                |f| {
                    f.ingress = vec!["203.0.113.10".into()];
                    f.queue = Ok(json!({"known": true, "hosts": {
                        "used": 75, "eligible": 3000,
                        "why": "a subset of 25 per zone, within the cloud's quota of 500 per zone"
                    }}));
                },
                "ready",
                "it uses 75 of 3000 eligible nodes (a subset of 25 per zone",
            ),
            (
                "cluster ip",
                |f| f.type_ = "ClusterIP".into(),
                "not_load_balancer",
                "type ClusterIP",
            ),
            (
                "other class",
                |f| {
                    f.load_balancer_class = Some("example.com/lb".into());
                    f.queue = Ok(json!({"known": true, "served": false, "queue": {}}));
                },
                "another_controller",
                "loadBalancerClass example.com/lb",
            ),
            (
                "no lease",
                |f| f.leader.found = false,
                "no_leader",
                "does not exist",
            ),
            (
                "lease expired",
                |f| {
                    f.leader.valid = false;
                    f.controller = Err("no answer".into());
                },
                "no_leader",
                "no leader for service-controller since 2026-11-25T14:02:15Z",
            ),
            (
                "expired by this clock, but the holder leads",
                |f| {
                    f.leader.valid = false;
                    f.queue = object(json!({"kind": "provisioning", "since_ago_s": 1.0}));
                },
                "provisioning",
                "provisioning",
            ),
            (
                "a restarted holder that does not lead",
                |f| {
                    f.controller =
                        Ok(json!({"leading": false, "identity": "service-controller-0_9"}))
                },
                "leader_changing",
                "does not lead now",
            ),
            (
                "leader silent",
                |f| f.controller = Err("503 connection refused".into()),
                "leader_unreachable",
                "service-controller-0 does not answer",
            ),
            (
                "gateway down",
                |f| {
                    f.controller = Ok(
                        json!({"leading": true, "identity": "service-controller-0_1234",
                        "gateway": {"reachable": false,
                        "last_no_answer": {"message": "tcp connect error", "ago_s": 2.0}}}),
                    )
                },
                "gateway_unreachable",
                "gateway unreachable from the service-controller leader service-controller-0: tcp connect error",
            ),
            (
                "annotation",
                |f| {
                    f.condition = Some(Condition {
                        status: "False".into(),
                        reason: "InvalidConfiguration".into(),
                        message: "annotation x: not a number".into(),
                    });
                    f.queue = object(json!({"kind": "invalid_argument", "failures": 1}));
                },
                "refused",
                "refused: annotation x: not a number",
            ),
            (
                "provisioning",
                |f| {
                    f.queue = object(json!({"kind": "provisioning", "failures": 0,
                        "since_ago_s": 40.0, "next_try_in_s": 5.0}))
                },
                "provisioning",
                "waiting for the cloud to finish provisioning, 40 s so far, next try in 5 s",
            ),
            (
                "a refusal the user fixed since",
                |f| {
                    f.condition = Some(Condition {
                        status: "False".into(),
                        reason: "InvalidConfiguration".into(),
                        message: "annotation x: not a number".into(),
                    });
                    f.queue = object(json!({"kind": "provisioning", "waiting": true}));
                },
                "provisioning",
                "provisioning",
            ),
            (
                "the cloud asked for time",
                |f| {
                    f.queue = object(
                        json!({"kind": "retry_after", "waiting": true, "failures": 2,
                        "message": "busy"}),
                    )
                },
                "waiting",
                "the cloud asked to come back later: busy",
            ),
            (
                "throttled",
                |f| {
                    f.queue = object(json!({"kind": "cloud_throttled", "failures": 0,
                        "since_ago_s": 3.0}));
                    f.gateway_calls =
                        Ok(json!({"calls": [{"priority": "high", "reason": "CLOUD_THROTTLED"}]}));
                },
                "throttling",
                "cloud throttling: 12 calls waiting for the budget (rate now 2.5/s of 20.0/s), this one at high priority",
            ),
            (
                "failing",
                |f| {
                    f.queue = object(json!({"kind": "unavailable", "failures": 3,
                        "message": "gateway: unavailable: boom", "next_try_in_s": 20.0}))
                },
                "failing",
                "failing: gateway: unavailable: boom (3 failures, next try in 20 s)",
            ),
            (
                "queued",
                |f| {
                    f.queue = Ok(json!({"known": true, "served": true,
                        "queue": {"queued": true, "in_flight": false, "trouble": null}}))
                },
                "queued",
                "queued",
            ),
            (
                "unseen",
                |f| {
                    f.queue = Ok(
                        json!({"known": false, "queue": {"queued": false, "in_flight": false, "trouble": null}}),
                    )
                },
                "not_seen",
                "has not seen",
            ),
        ];
        for (name, change, cause, words) in cases {
            let mut f = service();
            change(&mut f);
            let v = why_service(&f);
            assert_eq!(v.cause, cause, "{name}: {}", v.summary);
            assert!(v.summary.contains(words), "{name}: {}", v.summary);
        }
    }

    #[test]
    fn without_the_leaders_word_the_classes_it_serves_decide() {
        let mut f = service();
        f.queue = Err("no answer".into());
        f.load_balancer_class = Some("sim/internal".into());
        f.controller = Ok(
            json!({"leading": true, "identity": "service-controller-0_1234",
            "gateway": {}, "classes": {"default": true, "named": ["sim/internal"]}}),
        );
        assert_ne!(why_service(&f).cause, "another_controller");
        f.load_balancer_class = Some("example.com/x".into());
        assert_eq!(why_service(&f).cause, "another_controller");
        f.load_balancer_class = None;
        f.controller = Ok(json!({"classes": {"default": false, "named": []}}));
        let v = why_service(&f);
        assert!(v.summary.contains("without a loadBalancerClass"), "{v:?}");
    }

    #[test]
    fn each_cause_of_an_uninitialised_node_is_named_first() {
        type Change = fn(&mut NodeFacts);
        let cases: Vec<(&str, Change, &str, &str)> = vec![
            (
                "initialised",
                |f| {
                    f.uninitialized = false;
                    f.provider_id = Some("sim://z1/i-1".into());
                },
                "ready",
                "sim://z1/i-1",
            ),
            (
                "missing instance",
                |f| {
                    f.queue = object(json!({"kind": "instance_not_found", "failures": 2,
                        "message": "no instance for node n1"}))
                },
                "instance_missing",
                "the cloud has no instance for this node: no instance for node n1",
            ),
            (
                "held back",
                |f| {
                    f.uninitialized = false;
                    f.queue = Ok(json!({"deletion_held_back": true, "queue": {}}));
                    f.controller = Ok(
                        json!({"held_back_deletions": {"count": 6, "of": 10, "max_share": 0.5}}),
                    );
                },
                "deletion_held_back",
                "6 of 10 nodes",
            ),
            (
                "no leader",
                |f| {
                    f.leader.valid = false;
                    f.controller = Err("no answer".into());
                },
                "no_leader",
                "no leader for node-controller",
            ),
        ];
        for (name, change, cause, words) in cases {
            let mut f = node();
            change(&mut f);
            let v = why_node(&f);
            assert_eq!(v.cause, cause, "{name}: {}", v.summary);
            assert!(v.summary.contains(words), "{name}: {}", v.summary);
        }
    }

    #[test]
    fn durations_read_as_a_person_says_them() {
        assert_eq!(human(40.2), "40 s");
        assert_eq!(human(185.0), "3 min 5 s");
        assert_eq!(human(7800.0), "2 h 10 min");
        assert_eq!(human(-3.0), "0 s");
    }
}
