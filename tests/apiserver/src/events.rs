//! One store of events, two views: a real API server serves every event
//! through both `events.k8s.io/v1` and core `v1`. Controllers write the
//! former (kube-rs's Recorder); kubectl reads the latter (`get events`,
//! `describe`). Each write of an `events.k8s.io` event is mirrored into its
//! core form.

use serde_json::{Value, json};

use super::resources;
use super::store::Store;

/// The core/v1 form of an `events.k8s.io/v1` event, as kube-apiserver's
/// conversion (`pkg/apis/events/v1/conversion.go`, through the internal
/// type) makes it:
///
/// - `regarding` becomes `involvedObject`, `note` becomes `message`,
///   `reportingController` becomes `reportingComponent`;
/// - `deprecatedSource`, `deprecatedFirstTimestamp`,
///   `deprecatedLastTimestamp` and `deprecatedCount` become `source`,
///   `firstTimestamp`, `lastTimestamp` and `count`, as they are: there is
///   no fallback to `eventTime` or `series`. kube-apiserver refuses an
///   `events.k8s.io/v1` create that sets any of them ("needs to be
///   unset"), so an event written there (kube-rs's Recorder) has no
///   `firstTimestamp`, `lastTimestamp` or `count` in core/v1;
/// - `eventTime`, `series` (its `count` and `lastObservedTime`),
///   `action`, `reason`, `type`, `related` and `reportingInstance` are
///   kept.
///
/// kubectl's printers fall back to `eventTime` and `series` themselves
/// (see `table`), so `get events` and `describe` show such events' ages
/// and counts; `--sort-by=.lastTimestamp` puts them first, as on a real
/// cluster.
pub fn to_core(e: &Value) -> Value {
    let mut core = json!({
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
        "series": e["series"],
        "source": e["deprecatedSource"],
        "reportingComponent": e["reportingController"],
        "reportingInstance": e["reportingInstance"],
        "eventTime": e["eventTime"],
        "firstTimestamp": e["deprecatedFirstTimestamp"],
        "lastTimestamp": e["deprecatedLastTimestamp"],
        "count": e["deprecatedCount"],
    });
    strip_nulls(&mut core);
    if core["count"] == 0 {
        core.as_object_mut().expect("object").remove("count");
    }
    core_shape(&mut core);
    core
}

/// Gives a core/v1 Event the fields kube-apiserver always writes, however
/// it was made: Go's JSON encoding of `v1.Event` has `involvedObject` and
/// `source` (objects, `{}` when empty), `firstTimestamp`, `lastTimestamp`
/// and `eventTime` (`null` when unset) and `reportingComponent` and
/// `reportingInstance` (`""`), which have no `omitempty`. kubectl's
/// `--sort-by` finds a `null` field where it would miss an absent one.
pub fn core_shape(event: &mut Value) {
    let Some(map) = event.as_object_mut() else {
        return;
    };
    for (field, empty) in [
        ("involvedObject", json!({})),
        ("source", json!({})),
        ("firstTimestamp", Value::Null),
        ("lastTimestamp", Value::Null),
        ("eventTime", Value::Null),
        ("reportingComponent", json!("")),
        ("reportingInstance", json!("")),
    ] {
        map.entry(field).or_insert(empty);
    }
}

/// Writes the core form of `event` (created or updated).
pub fn mirror(store: &Store, namespace: &str, event: &Value) {
    let core = resources::find("", "v1", "events").expect("core events are served");
    let name = event["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let converted = to_core(event);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_events_k8s_io_event_converts_as_kube_apiserver_converts_it() {
        let event = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "n1.1", "namespace": "default", "labels": {"a": "b"}},
            "eventTime": "2026-01-01T00:00:00.123456Z",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
            "reportingController": "ccm.example.com/node-controller",
            "reportingInstance": "pod-1",
            "action": "Sync", "reason": "Synced", "type": "Normal",
            "regarding": {"kind": "Node", "name": "n1"},
            "note": "Node synced",
        });
        assert_eq!(
            to_core(&event),
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "n1.1", "namespace": "default", "labels": {"a": "b"}},
                "involvedObject": {"kind": "Node", "name": "n1"},
                "reason": "Synced", "message": "Node synced", "type": "Normal", "action": "Sync",
                "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"},
                "source": {},
                "reportingComponent": "ccm.example.com/node-controller",
                "reportingInstance": "pod-1",
                "eventTime": "2026-01-01T00:00:00.123456Z",
                "firstTimestamp": null,
                "lastTimestamp": null,
            })
        );
        // The deprecated fields, where a core/v1 writer set them, are the
        // legacy ones as they are.
        let legacy = json!({
            "metadata": {"name": "x", "namespace": "default"},
            "regarding": {"kind": "Node", "name": "n1"},
            "deprecatedSource": {"component": "kubelet", "host": "n1"},
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-01T00:05:00Z",
            "deprecatedCount": 3,
        });
        let core = to_core(&legacy);
        assert_eq!(
            core["source"],
            json!({"component": "kubelet", "host": "n1"})
        );
        assert_eq!(core["firstTimestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(core["lastTimestamp"], "2026-01-01T00:05:00Z");
        assert_eq!(core["count"], 3);
        assert_eq!(core["eventTime"], Value::Null);
        assert_eq!(core["reportingComponent"], "");
    }
}
