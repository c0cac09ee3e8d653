//! One store of events, two views: a real API server serves every event
//! through both `events.k8s.io/v1` and core `v1`. Controllers write the
//! former (kube-rs's Recorder); kubectl reads the latter (`get events`,
//! `describe`). Each write of an `events.k8s.io` event is mirrored into its
//! core form.

use serde_json::{Value, json};

use super::resources;
use super::store::Store;

/// The core/v1 form of an `events.k8s.io/v1` event.
pub fn to_core(e: &Value) -> Value {
    let count = e["series"]["count"]
        .as_i64()
        .or_else(|| e["deprecatedCount"].as_i64())
        .unwrap_or(1);
    let first = seconds(&e["deprecatedFirstTimestamp"]).or_else(|| seconds(&e["eventTime"]));
    let last = seconds(&e["series"]["lastObservedTime"])
        .or_else(|| seconds(&e["deprecatedLastTimestamp"]))
        .or_else(|| seconds(&e["eventTime"]));
    json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": e["metadata"]["name"],
            "namespace": e["metadata"]["namespace"],
            "labels": e["metadata"]["labels"],
            "annotations": e["metadata"]["annotations"],
        },
        "involvedObject": e["regarding"],
        "related": e["related"],
        "reason": e["reason"],
        "message": e["note"],
        "type": e["type"],
        "action": e["action"],
        "source": {"component": e["reportingController"]},
        "reportingComponent": e["reportingController"],
        "reportingInstance": e["reportingInstance"],
        "eventTime": e["eventTime"],
        "firstTimestamp": first,
        "lastTimestamp": last,
        "count": count,
    })
}

/// A timestamp at whole seconds, as core/v1 `Time` fields are written.
fn seconds(v: &Value) -> Option<String> {
    let t: k8s_openapi::jiff::Timestamp = v.as_str()?.parse().ok()?;
    Some(t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// Writes the core form of `event` (created or updated).
pub fn mirror(store: &Store, namespace: &str, event: &Value) {
    let core = resources::find("", "v1", "events").expect("core events are served");
    let name = event["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut converted = to_core(event);
    strip_nulls(&mut converted);
    let result = match store.get(core, namespace, &name) {
        Ok(_) => store.update(core, namespace, &name, false, |_| Ok(converted.clone())),
        Err(_) => store.create(core, namespace, converted),
    };
    if let Err(e) = result {
        tracing::warn!(event = %name, error = %e.message, "could not mirror event into core/v1");
    }
}

fn strip_nulls(v: &mut Value) {
    if let Value::Object(map) = v {
        map.retain(|_, v| !v.is_null());
        for v in map.values_mut() {
            strip_nulls(v);
        }
    }
}
