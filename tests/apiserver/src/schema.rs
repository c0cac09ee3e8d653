//! Object validation against the Kubernetes API types (k8s-openapi), and
//! the small OpenAPI v3 document kubectl reads to learn that this server
//! validates fields itself (`fieldValidation`).
//!
//! An object is decoded into its typed form: a wrong type is an error. With
//! `fieldValidation=Strict`, a field the typed form does not keep is an
//! unknown field and an error; with `Warn` (the default) it is a warning.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::resources::{RESOURCES, Resource};

fn round_trip<T: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Decodes `obj` as its kind; the typed form re-encoded, or the error.
fn typed(kind: &str, group: &str, obj: &Value) -> Result<Option<Value>, String> {
    use k8s_openapi::api::{certificates, coordination, core, events};
    Ok(Some(match (group, kind) {
        ("", "Node") => round_trip::<core::v1::Node>(obj)?,
        ("", "Service") => round_trip::<core::v1::Service>(obj)?,
        ("", "Event") => round_trip::<core::v1::Event>(obj)?,
        ("", "Namespace") => round_trip::<core::v1::Namespace>(obj)?,
        ("", "Pod") => round_trip::<core::v1::Pod>(obj)?,
        ("", "Endpoints") => round_trip::<core::v1::Endpoints>(obj)?,
        ("events.k8s.io", "Event") => round_trip::<events::v1::Event>(obj)?,
        ("coordination.k8s.io", "Lease") => round_trip::<coordination::v1::Lease>(obj)?,
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            round_trip::<certificates::v1::CertificateSigningRequest>(obj)?
        }
        _ => return Ok(None),
    }))
}

/// Paths present in `given` but not in `kept`.
fn unknown_fields(prefix: &str, given: &Value, kept: &Value, out: &mut Vec<String>) {
    match (given, kept) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                match k.get(key) {
                    Some(kept_value) => unknown_fields(&path, value, kept_value, out),
                    // Nulls and empty values may be dropped on the way out.
                    None if value.is_null() || value == &json!({}) || value == &json!([]) => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                unknown_fields(&format!("{prefix}[{i}]"), gv, kv, out);
            }
        }
        _ => {}
    }
}

/// How strictly unknown fields are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("Strict") => Self::Strict,
            Some("Ignore") => Self::Ignore,
            _ => Self::Warn,
        }
    }
}

/// Checks `obj`; returns the object as it is stored (unknown fields
/// dropped, as the real server does) with warnings, or the error message.
pub fn validate(
    resource: &Resource,
    obj: &Value,
    mode: FieldValidation,
) -> Result<(Value, Vec<String>), String> {
    let Some(kept) = typed(resource.kind, resource.group, obj)? else {
        return Ok((obj.clone(), Vec::new()));
    };
    let mut unknown = Vec::new();
    unknown_fields("", obj, &kept, &mut unknown);
    unknown.retain(|f| !f.starts_with("metadata.managedFields"));
    let messages: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    match mode {
        FieldValidation::Strict if !messages.is_empty() => {
            Err(format!("strict decoding error: {}", messages.join(", ")))
        }
        FieldValidation::Warn => Ok((kept, messages)),
        _ => Ok((kept, Vec::new())),
    }
}

fn gv_path(r: &Resource) -> String {
    if r.group.is_empty() {
        format!("api/{}", r.version)
    } else {
        format!("apis/{}/{}", r.group, r.version)
    }
}

/// `/openapi/v3`: where each group version's document is.
pub fn openapi_root() -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES {
        let gv = gv_path(r);
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=0")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/<group version>`: the PATCH operations and their
/// `fieldValidation` parameter, which is what kubectl looks for.
pub fn openapi_group_version(gv: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| gv_path(r) == gv && !r.create_only)
    {
        let base = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{gv}/{}/{{name}}", r.plural)
        };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let op = json!({
            "operationId": format!("patch{}", r.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": gvk,
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(base, json!({"patch": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> &'static Resource {
        super::super::resources::find("", "v1", "nodes").unwrap()
    }

    #[test]
    fn unknown_fields_are_errors_when_strict_and_warnings_otherwise() {
        let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"podCIDR": "10.0.0.0/24", "flavour": "x"}});
        let err = validate(node(), &obj, FieldValidation::Strict).unwrap_err();
        assert!(err.contains("unknown field \"spec.flavour\""), "{err}");
        let (stored, warnings) = validate(node(), &obj, FieldValidation::Warn).unwrap();
        assert_eq!(warnings, ["unknown field \"spec.flavour\""]);
        assert!(
            stored["spec"].get("flavour").is_none(),
            "unknown fields are not stored"
        );
        assert_eq!(stored["spec"]["podCIDR"], "10.0.0.0/24");
        assert!(
            validate(node(), &obj, FieldValidation::Ignore)
                .unwrap()
                .1
                .is_empty()
        );
    }

    #[test]
    fn wrong_types_are_always_errors() {
        let obj = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"unschedulable": "yes"}});
        assert!(validate(node(), &obj, FieldValidation::Ignore).is_err());
    }
}
