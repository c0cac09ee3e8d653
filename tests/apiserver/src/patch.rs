//! Strategic merge patch, as far as the controllers and kubectl use it:
//! maps merge recursively (null deletes a key), lists follow the field's
//! strategy ([`ListStrategy`]), and the directives `$patch` (replace,
//! delete, merge), `$deleteFromPrimitiveList/<field>`, `$retainKeys` and
//! `$setElementOrder/<field>` are honoured. JSON patches as kube-apiserver
//! applies them ([`json_patch`]).

use json_patch::{AddOperation, PatchOperation};
use serde_json::{Map, Value};

use super::resources::{ListStrategy, list_strategy};

const DELETE_FROM: &str = "$deleteFromPrimitiveList/";
const SET_ORDER: &str = "$setElementOrder/";

/// Applies a strategic merge `patch` to `doc`, an object of `kind`.
pub fn strategic_merge(kind: &str, doc: &mut Value, patch: &Value) -> Result<(), String> {
    let mut path = Vec::new();
    merge_value(kind, &mut path, doc, patch)
}

fn merge_value(
    kind: &str,
    path: &mut Vec<String>,
    doc: &mut Value,
    patch: &Value,
) -> Result<(), String> {
    match patch {
        Value::Object(patch_map) => {
            if let Some(directive) = patch_map.get("$patch") {
                match directive.as_str() {
                    Some("replace") => {
                        let mut replacement = patch_map.clone();
                        replacement.remove("$patch");
                        *doc = Value::Object(replacement);
                        return Ok(());
                    }
                    Some("delete") => {
                        *doc = Value::Null;
                        return Ok(());
                    }
                    Some("merge") => {}
                    other => return Err(format!("unknown $patch directive {other:?}")),
                }
            }
            if !doc.is_object() {
                *doc = Value::Object(Map::new());
            }
            let target = doc.as_object_mut().expect("object");
            for (key, value) in patch_map {
                if key == "$patch" || key.starts_with(SET_ORDER) || key == "$retainKeys" {
                    continue;
                }
                if let Some(field) = key.strip_prefix(DELETE_FROM) {
                    let remove: Vec<&Value> = value
                        .as_array()
                        .map(|a| a.iter().collect())
                        .unwrap_or_default();
                    if let Some(Value::Array(list)) = target.get_mut(field) {
                        list.retain(|v| !remove.contains(&v));
                    }
                    continue;
                }
                if value.is_null() {
                    target.remove(key);
                    continue;
                }
                path.push(key.clone());
                let slot = target.entry(key.clone()).or_insert(Value::Null);
                let result = match value {
                    Value::Array(items) => merge_list(kind, path, slot, items),
                    Value::Object(_) => merge_value(kind, path, slot, value),
                    _ => {
                        *slot = value.clone();
                        Ok(())
                    }
                };
                path.pop();
                result?;
                if slot.is_null() {
                    target.remove(key);
                }
            }
            if let Some(Value::Array(retain)) = patch_map.get("$retainKeys") {
                let keep: Vec<&str> = retain.iter().filter_map(Value::as_str).collect();
                target.retain(|k, _| keep.contains(&k.as_str()));
            }
            Ok(())
        }
        other => {
            *doc = other.clone();
            Ok(())
        }
    }
}

fn merge_list(
    kind: &str,
    path: &mut Vec<String>,
    doc: &mut Value,
    items: &[Value],
) -> Result<(), String> {
    let strategy = {
        let names: Vec<&str> = path.iter().map(String::as_str).collect();
        list_strategy(kind, &names)
    };
    // A `{"$patch": "replace"}` element replaces the list with the others.
    let replace = items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace || strategy == ListStrategy::Replace || !doc.is_array() {
        let kept: Vec<Value> = items
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .cloned()
            .collect();
        *doc = Value::Array(kept);
        return Ok(());
    }
    let list = doc.as_array_mut().expect("array");
    match strategy {
        ListStrategy::MergePrimitive => {
            for item in items {
                if !list.contains(item) {
                    list.push(item.clone());
                }
            }
        }
        ListStrategy::MergeByKey(key) => {
            for item in items {
                let Some(id) = item.get(key) else {
                    return Err(format!(
                        "{}: element without merge key {key:?}",
                        path.join(".")
                    ));
                };
                let position = list.iter().position(|e| e.get(key) == Some(id));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => merge_value(kind, path, &mut list[i], item)?,
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        merge_value(kind, path, &mut fresh, item)?;
                        list.push(fresh);
                    }
                }
            }
        }
        ListStrategy::Replace => unreachable!("handled above"),
    }
    Ok(())
}

/// A JSON patch as kube-apiserver applies it (with evanphx/json-patch
/// v4): RFC 6902, but for a `replace` of a member its object lacks, which
/// sets it as `add` would. external-snapshotter's sidecar relies on it: it
/// replaces `/metadata/annotations` of objects that have none. On error,
/// `doc` is left part-patched (the caller patches a copy).
pub fn json_patch(doc: &mut Value, ops: &json_patch::Patch) -> Result<(), String> {
    for (i, op) in ops.0.iter().enumerate() {
        let op = match op {
            PatchOperation::Replace(r) if doc.pointer(r.path.as_str()).is_none() => {
                let parent = r.path.as_str().rsplit_once('/').map(|(p, _)| p);
                match parent.and_then(|p| doc.pointer(p)) {
                    Some(Value::Object(_)) => PatchOperation::Add(AddOperation {
                        path: r.path.clone(),
                        value: r.value.clone(),
                    }),
                    _ => op.clone(),
                }
            }
            _ => op.clone(),
        };
        json_patch::patch_unsafe(doc, std::slice::from_ref(&op))
            .map_err(|e| format!("operation '/{i}' failed at path '{}': {}", e.path, e.kind))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn patched(kind: &str, mut doc: Value, patch: Value) -> Value {
        strategic_merge(kind, &mut doc, &patch).unwrap();
        doc
    }

    #[test]
    fn a_json_patch_replaces_a_missing_member_as_kube_apiserver_does() {
        let patch =
            |doc: &mut Value, ops: Value| json_patch(doc, &serde_json::from_value(ops).unwrap());
        let mut doc = json!({"metadata": {"name": "c"}});
        patch(
            &mut doc,
            json!([{"op": "replace", "path": "/metadata/annotations", "value": {"a": "yes"}}]),
        )
        .unwrap();
        assert_eq!(doc["metadata"]["annotations"], json!({"a": "yes"}));
        // A missing parent, an index past the end and a failed test stay
        // errors, naming the operation.
        for ops in [
            json!([{"op": "replace", "path": "/spec/size", "value": 1}]),
            json!([{"op": "add", "path": "/list", "value": []}, {"op": "replace", "path": "/list/0", "value": 1}]),
            json!([{"op": "test", "path": "/metadata/name", "value": "d"}]),
        ] {
            let mut copy = doc.clone();
            let err = patch(&mut copy, ops.clone()).unwrap_err();
            assert!(err.starts_with("operation '/"), "{ops}: {err}");
        }
    }

    #[test]
    fn maps_merge_and_null_deletes() {
        let doc = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let out = patched(
            "Node",
            doc,
            json!({"metadata": {"labels": {"b": null, "c": "3"}}}),
        );
        assert_eq!(out, json!({"metadata": {"labels": {"a": "1", "c": "3"}}}));
    }

    #[test]
    fn conditions_merge_by_type_and_taints_replace() {
        let doc = json!({
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "NetworkUnavailable", "status": "True"}]}
        });
        let out = patched(
            "Node",
            doc,
            json!({
                "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"}]}
            }),
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
        assert_eq!(
            out["status"]["conditions"][0],
            json!({"type": "Ready", "status": "False"})
        );
        assert_eq!(
            out["status"]["conditions"][1],
            json!({"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"})
        );
    }

    #[test]
    fn finalizers_are_a_set_and_can_be_deleted_from() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"]}});
        let out = patched(
            "Service",
            doc.clone(),
            json!({"metadata": {"finalizers": ["b", "c"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        let out = patched(
            "Service",
            doc,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn patch_directives_replace_and_delete() {
        let doc = json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "InternalIP", "address": "10.0.0.2"}]}});
        let out = patched(
            "Node",
            doc.clone(),
            json!({"status": {"addresses": [
                {"$patch": "replace"}, {"type": "Hostname", "address": "n1"}
            ]}}),
        );
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "Hostname", "address": "n1"}])
        );
        let out = patched(
            "Node",
            doc,
            json!({"status": {"addresses": [{"type": "InternalIP", "$patch": "delete"}]}}),
        );
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.2"}])
        );
        let out = patched(
            "Node",
            json!({"spec": {"a": 1, "b": 2}}),
            json!({"spec": {"$patch": "replace", "c": 3}}),
        );
        assert_eq!(out, json!({"spec": {"c": 3}}));
    }
}
