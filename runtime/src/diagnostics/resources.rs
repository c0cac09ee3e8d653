//! The resources of `diagnostics.cloudgateway.io/v1`, read-only, in kube's
//! conventions: discovery documents, objects and lists with `apiVersion`,
//! `kind` and `metadata`, `Status` errors, and `meta.k8s.io/v1` Tables so
//! `kubectl get` prints columns.
//!
//! - `ServiceDiagnosis` (`servicediagnoses`, namespaced, named as its
//!   Service) and `NodeDiagnosis` (`nodediagnoses`, cluster-scoped, named
//!   as its Node): the controller's leader, its status and the object's
//!   place in its queue, the gateway's status and its last calls for the
//!   object. `get` answers for any name; `list` holds the objects the
//!   controller is having trouble with (its status lists up to 50).
//! - `Component` (`components`, in the release's namespace): each
//!   controller's leader and status, and the gateway's status.

use serde_json::{Value, json};

use super::peers::{Answer, LeaderRef};

pub const GROUP: &str = "diagnostics.cloudgateway.io";
pub const VERSION: &str = "v1";
pub const GROUP_VERSION: &str = "diagnostics.cloudgateway.io/v1";

/// One served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
}

pub const SERVICE_DIAGNOSES: Kind = Kind {
    plural: "servicediagnoses",
    singular: "servicediagnosis",
    kind: "ServiceDiagnosis",
    namespaced: true,
    short_names: &["svcdiag"],
};

pub const NODE_DIAGNOSES: Kind = Kind {
    plural: "nodediagnoses",
    singular: "nodediagnosis",
    kind: "NodeDiagnosis",
    namespaced: false,
    short_names: &["nodiag"],
};

pub const COMPONENTS: Kind = Kind {
    plural: "components",
    singular: "component",
    kind: "Component",
    namespaced: true,
    short_names: &[],
};

pub const KINDS: [Kind; 3] = [SERVICE_DIAGNOSES, NODE_DIAGNOSES, COMPONENTS];

/// The group as `/apis` lists it and `/apis/<group>` answers.
pub fn api_group() -> Value {
    let version = json!({"groupVersion": GROUP_VERSION, "version": VERSION});
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    })
}

/// `/apis`: this server's one group.
pub fn api_group_list() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})
}

/// `/apis/<group>/v1`: the resources and their verbs.
pub fn api_resource_list() -> Value {
    let resources: Vec<Value> = KINDS
        .iter()
        .map(|k| {
            json!({
                "name": k.plural,
                "singularName": k.singular,
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "list"],
                "shortNames": k.short_names,
                "categories": [],
            })
        })
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": resources,
    })
}

/// A kube `Status` error.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// An answer as the object holds it: `{"answer": ...}` or
/// `{"error": "why"}`.
pub fn answer_field(answer: &Answer) -> Value {
    match answer {
        Ok(value) => json!({"answer": value}),
        Err(why) => json!({"error": why}),
    }
}

fn metadata(name: &str, namespace: Option<&str>, now: &str) -> Value {
    let mut meta = json!({"name": name, "creationTimestamp": now});
    if let Some(ns) = namespace {
        meta["namespace"] = ns.into();
    }
    meta
}

/// What a diagnosis holds.
pub struct Diagnosis<'a> {
    pub kind: Kind,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub served_by: &'a str,
    pub leader: &'a LeaderRef,
    /// The leader's `/debug/status`.
    pub controller: &'a Answer,
    /// The leader's `/debug/object` for this object.
    pub object: &'a Answer,
    /// The gateway's `/debug/status`.
    pub gateway: &'a Answer,
    /// The gateway's `/debug/object` for this object: its last calls.
    pub gateway_calls: &'a Answer,
}

impl Diagnosis<'_> {
    pub fn to_json(&self, now: &str) -> Value {
        json!({
            "apiVersion": GROUP_VERSION,
            "kind": self.kind.kind,
            "metadata": metadata(self.name, self.namespace, now),
            "servedBy": self.served_by,
            "leader": self.leader,
            "controller": answer_field(self.controller),
            "object": answer_field(self.object),
            "gateway": answer_field(self.gateway),
            "gatewayCalls": answer_field(self.gateway_calls),
        })
    }
}

/// A component: a controller (with its leader) or the gateway.
pub fn component(
    name: &str,
    namespace: &str,
    served_by: &str,
    leader: Option<&LeaderRef>,
    status: &Answer,
    now: &str,
) -> Value {
    let mut object = json!({
        "apiVersion": GROUP_VERSION,
        "kind": COMPONENTS.kind,
        "metadata": metadata(name, Some(namespace), now),
        "servedBy": served_by,
        "status": answer_field(status),
    });
    if let Some(leader) = leader {
        object["leader"] = json!(leader);
    }
    object
}

/// A list of `kind`'s objects.
pub fn list(kind: Kind, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": GROUP_VERSION,
        "kind": format!("{}List", kind.kind),
        "metadata": {"resourceVersion": ""},
        "items": items,
    })
}

/// Whether an `Accept` header asks for a Table, as kubectl's does.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .any(|part| part.contains("as=Table") && part.contains("g=meta.k8s.io"))
}

fn column(name: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({
        "name": name,
        "type": "string",
        "format": format,
        "description": description,
        "priority": priority,
    })
}

/// `objects` (all of `kind`) as a `meta.k8s.io/v1` Table.
pub fn table(kind: Kind, objects: &[Value]) -> Value {
    let columns = if kind == COMPONENTS {
        vec![
            column("Name", "name", "The component.", 0),
            column("Leader", "", "The Pod holding its Lease.", 0),
            column("Answered", "", "Whether it answered.", 0),
            column("Detail", "", "What its status says first.", 0),
        ]
    } else {
        vec![
            column("Name", "name", "The object.", 0),
            column("Leader", "", "The controller's leader Pod.", 0),
            column("Queue", "", "The object's place in the leader's queue.", 0),
            column("Failures", "", "Failed attempts in a row.", 0),
            column("Last Call", "", "The gateway's last call for it.", 0),
            column("Message", "", "The last failure.", 1),
        ]
    };
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let cells = if kind == COMPONENTS {
                component_cells(o)
            } else {
                diagnosis_cells(o)
            };
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"],
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": ""},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn leader_cell(o: &Value) -> Value {
    o["leader"]["pod"]
        .as_str()
        .map_or_else(|| "<none>".into(), Value::from)
}

fn diagnosis_cells(o: &Value) -> Vec<Value> {
    let queue = &o["object"]["answer"]["queue"];
    let trouble = &queue["trouble"];
    let place = if o["object"]["error"].is_string() {
        "<unknown>"
    } else if queue["in_flight"] == true {
        "in flight"
    } else if queue["queued"] == true {
        "queued"
    } else if trouble.is_object() {
        "waiting"
    } else {
        "idle"
    };
    let last_call = o["gatewayCalls"]["answer"]["calls"]
        .as_array()
        .and_then(|calls| calls.last())
        .map(|c| {
            format!(
                "{} {}",
                c["method"].as_str().unwrap_or_default(),
                c["outcome"].as_str().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "<none>".into());
    vec![
        o["metadata"]["name"].clone(),
        leader_cell(o),
        place.into(),
        trouble["failures"].as_u64().unwrap_or(0).into(),
        last_call.into(),
        trouble["message"].as_str().unwrap_or_default().into(),
    ]
}

fn component_cells(o: &Value) -> Vec<Value> {
    let status = &o["status"];
    let answered = status["answer"].is_object();
    let detail = if let Some(why) = status["error"].as_str() {
        why.to_owned()
    } else if o["leader"].is_object() {
        let s = &status["answer"];
        format!(
            "leading={} depth={} failing={}",
            s["leading"], s["queue"]["depth"], s["queue"]["failing"]
        )
    } else {
        format!("ready={}", status["answer"]["ready"])
    };
    let leader = if o["leader"].is_object() {
        leader_cell(o)
    } else {
        "-".into()
    };
    vec![
        o["metadata"]["name"].clone(),
        leader,
        if answered { "True" } else { "False" }.into(),
        detail.into(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectls_accept_header_asks_for_a_table() {
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn a_diagnosis_row_says_where_the_object_stands() {
        let leader = LeaderRef {
            controller: "service-controller".into(),
            pod: Some("ccm-service-controller-0".into()),
            ..LeaderRef::default()
        };
        let object: Answer = Ok(json!({"queue": {"queued": false, "in_flight": false,
            "trouble": {"failures": 3, "message": "quota exceeded"}}}));
        let calls: Answer =
            Ok(json!({"calls": [{"method": "EnsureLoadBalancer", "outcome": "error"}]}));
        let d = Diagnosis {
            kind: SERVICE_DIAGNOSES,
            name: "web",
            namespace: Some("default"),
            served_by: "me",
            leader: &leader,
            controller: &Err("down".into()),
            object: &object,
            gateway: &Err("down".into()),
            gateway_calls: &calls,
        }
        .to_json("2026-11-27T00:00:00Z");
        assert_eq!(d["controller"]["error"], "down");
        let t = table(SERVICE_DIAGNOSES, &[d]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "web",
                "ccm-service-controller-0",
                "waiting",
                3,
                "EnsureLoadBalancer error",
                "quota exceeded"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "default");
    }
}
