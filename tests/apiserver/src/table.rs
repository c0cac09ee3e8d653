//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for
//! (`Accept: application/json;as=Table;...`), with the columns a real API
//! server shows for nodes, services, events, certificate signing
//! requests, ConfigMaps, APIServices, Pods, claims, PersistentVolumes and
//! VolumeAttachments, those of their CRDs' `additionalPrinterColumns` for
//! the CSI snapshots, and name and age for the rest.

use serde_json::{Value, json};

use super::resources::Resource;

fn column(name: &str, kind: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

/// How long ago an RFC 3339 timestamp was, as kubectl writes ages.
fn age(timestamp: &str) -> String {
    let Ok(then) = timestamp.parse::<k8s_openapi::jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = k8s_openapi::jiff::Timestamp::now()
        .duration_since(then)
        .as_secs()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn node_row(o: &Value) -> Vec<Value> {
    let conditions = o["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let ready = conditions
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| text(&c["status"]));
    let mut status = match ready.as_deref() {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if o["spec"]["unschedulable"] == true {
        status.push_str(",SchedulingDisabled");
    }
    let address = |kind: &str| {
        o["status"]["addresses"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["type"] == kind))
            .map(|a| text(&a["address"]))
            .unwrap_or_else(|| "<none>".into())
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(status),
        json!("<none>"),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        json!(text_or(
            &o["status"]["nodeInfo"]["kubeletVersion"],
            "<none>"
        )),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
    ]
}

fn service_row(o: &Value) -> Vec<Value> {
    let kind = text(&o["spec"]["type"]);
    let ingress: Vec<String> = o["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|i| {
            i.iter()
                .map(|i| {
                    if i["ip"].is_string() {
                        text(&i["ip"])
                    } else {
                        text(&i["hostname"])
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let external = match (kind.as_str(), ingress.is_empty()) {
        (_, false) => ingress.join(","),
        ("LoadBalancer", true) => "<pending>".into(),
        _ => "<none>".into(),
    };
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| match p["nodePort"].as_i64() {
                    Some(np) => format!("{}:{}/{}", p["port"], np, text(&p["protocol"])),
                    None => format!("{}/{}", p["port"], text(&p["protocol"])),
                })
                .collect()
        })
        .unwrap_or_default();
    let selector: Vec<String> = o["spec"]["selector"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", text(v))).collect())
        .unwrap_or_default();
    vec![
        o["metadata"]["name"].clone(),
        json!(kind),
        json!(text(&o["spec"]["clusterIP"])),
        json!(external),
        json!(if ports.is_empty() {
            "<none>".into()
        } else {
            ports.join(",")
        }),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        json!(if selector.is_empty() {
            "<none>".into()
        } else {
            selector.join(",")
        }),
    ]
}

/// An event's row as kube-apiserver prints it: last seen is the series'
/// last observation, else `lastTimestamp`, else when it was first seen
/// (`firstTimestamp`, else `eventTime`); the count is the series', else
/// `count`, else 1 (events.k8s.io events have none); the source is the
/// legacy `source`, else the reporting controller and instance.
fn event_row(o: &Value) -> Vec<Value> {
    let since = |v: &Value| v.as_str().map(age);
    let first = since(&o["firstTimestamp"])
        .or_else(|| since(&o["eventTime"]))
        .unwrap_or_else(|| "<unknown>".into());
    let mut last = since(&o["lastTimestamp"]).unwrap_or_else(|| first.clone());
    let mut count = o["count"].as_i64().unwrap_or(0);
    if o["series"].is_object() {
        last = since(&o["series"]["lastObservedTime"]).unwrap_or_else(|| "<unknown>".into());
        count = o["series"]["count"].as_i64().unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = text(&o["involvedObject"]["kind"]).to_lowercase();
    let name = text(&o["involvedObject"]["name"]);
    let object = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    let or = |a: String, b: &Value| if a.is_empty() { text(b) } else { a };
    let component = or(text(&o["source"]["component"]), &o["reportingComponent"]);
    let instance = or(text(&o["source"]["host"]), &o["reportingInstance"]);
    let source = if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    };
    vec![
        json!(last),
        o["type"].clone(),
        o["reason"].clone(),
        json!(object),
        json!(text(&o["involvedObject"]["fieldPath"])),
        json!(source),
        json!(text(&o["message"]).trim()),
        json!(first),
        json!(count),
        o["metadata"]["name"].clone(),
    ]
}

fn csr_row(o: &Value) -> Vec<Value> {
    let conditions: Vec<String> = o["status"]["conditions"]
        .as_array()
        .map(|c| c.iter().map(|c| text(&c["type"])).collect())
        .unwrap_or_default();
    let mut condition = if conditions.is_empty() {
        "Pending".to_owned()
    } else {
        conditions.join(",")
    };
    if o["status"]["certificate"].is_string() {
        condition.push_str(",Issued");
    }
    let duration = o["spec"]["expirationSeconds"]
        .as_i64()
        .map(|s| format!("{}m", s / 60))
        .unwrap_or_else(|| "<none>".into());
    vec![
        o["metadata"]["name"].clone(),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        o["spec"]["signerName"].clone(),
        o["spec"]["username"].clone(),
        json!(duration),
        json!(condition),
    ]
}

/// An APIService's row as kube-aggregator prints it: where it is served
/// (`namespace/name` of its Service, or `Local`) and whether it is
/// available (`True`, `False (Reason)`, or `Unknown` before the first
/// check).
fn api_service_row(o: &Value) -> Vec<Value> {
    let service = &o["spec"]["service"];
    let served_by = if service.is_object() {
        format!("{}/{}", text(&service["namespace"]), text(&service["name"]))
    } else {
        "Local".to_owned()
    };
    let available = o["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
        .map_or_else(
            || "Unknown".to_owned(),
            |c| {
                let (status, reason) = (text(&c["status"]), text(&c["reason"]));
                if status == "True" || reason.is_empty() {
                    status
                } else {
                    format!("{status} ({reason})")
                }
            },
        );
    vec![
        o["metadata"]["name"].clone(),
        json!(served_by),
        json!(available),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
    ]
}

/// A ConfigMap's row: how many keys it holds, text and binary together.
fn config_map_row(o: &Value) -> Vec<Value> {
    let count = |field: &str| o[field].as_object().map_or(0, |m| m.len());
    vec![
        o["metadata"]["name"].clone(),
        json!(count("data") + count("binaryData")),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
    ]
}

/// The short names kubectl prints access modes by, comma-separated.
fn access_modes(modes: &Value) -> String {
    let short: Vec<&str> = modes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m.as_str()? {
            "ReadWriteOnce" => Some("RWO"),
            "ReadOnlyMany" => Some("ROX"),
            "ReadWriteMany" => Some("RWX"),
            "ReadWriteOncePod" => Some("RWOP"),
            _ => None,
        })
        .collect();
    short.join(",")
}

/// `status.phase`, or `Terminating` once the object is being deleted.
fn phase(o: &Value) -> String {
    if o["metadata"]["deletionTimestamp"].is_string() {
        "Terminating".into()
    } else {
        text(&o["status"]["phase"])
    }
}

/// `text`, or `placeholder` (`<none>`, `<unset>`) where empty.
fn text_or(v: &Value, placeholder: &str) -> String {
    Some(text(v))
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| placeholder.into())
}

/// A Pod's row: ready containers of all, status, restarts; wide, its IP
/// and node.
fn pod_row(o: &Value) -> Vec<Value> {
    let statuses = o["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = statuses.iter().filter(|c| c["ready"] == true).count();
    let restarts: u64 = statuses
        .iter()
        .filter_map(|c| c["restartCount"].as_u64())
        .sum();
    let status = match text(&o["status"]["reason"]) {
        reason if !reason.is_empty() && !o["metadata"]["deletionTimestamp"].is_string() => reason,
        _ => phase(o),
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts.to_string()),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        json!(text_or(&o["status"]["podIP"], "<none>")),
        json!(text_or(&o["spec"]["nodeName"], "<none>")),
        json!("<none>"),
        json!("<none>"),
    ]
}

/// A claim's row: its volume's capacity and access modes once bound.
fn claim_row(o: &Value) -> Vec<Value> {
    let bound = !text(&o["spec"]["volumeName"]).is_empty();
    let (capacity, modes) = if bound {
        (
            text(&o["status"]["capacity"]["storage"]),
            access_modes(&o["status"]["accessModes"]),
        )
    } else {
        (String::new(), String::new())
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(phase(o)),
        o["spec"]["volumeName"].clone(),
        json!(capacity),
        json!(modes),
        o["spec"]["storageClassName"].clone(),
        json!(text_or(
            &o["status"]["currentVolumeAttributesClassName"],
            "<unset>"
        )),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        json!(text_or(&o["spec"]["volumeMode"], "<unset>")),
    ]
}

/// A PersistentVolume's row: its claim as `namespace/name`.
fn volume_row(o: &Value) -> Vec<Value> {
    let claim = &o["spec"]["claimRef"];
    let claim = if claim.is_object() {
        format!("{}/{}", text(&claim["namespace"]), text(&claim["name"]))
    } else {
        String::new()
    };
    vec![
        o["metadata"]["name"].clone(),
        json!(text(&o["spec"]["capacity"]["storage"])),
        json!(access_modes(&o["spec"]["accessModes"])),
        json!(text(&o["spec"]["persistentVolumeReclaimPolicy"])),
        json!(phase(o)),
        json!(claim),
        json!(text(&o["spec"]["storageClassName"])),
        json!(text_or(&o["spec"]["volumeAttributesClassName"], "<unset>")),
        json!(text(&o["status"]["reason"])),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
        json!(text_or(&o["spec"]["volumeMode"], "<unset>")),
    ]
}

/// A VolumeAttachment's row.
fn attachment_row(o: &Value) -> Vec<Value> {
    vec![
        o["metadata"]["name"].clone(),
        json!(text(&o["spec"]["attacher"])),
        json!(text(&o["spec"]["source"]["persistentVolumeName"])),
        json!(text(&o["spec"]["nodeName"])),
        json!(o["status"]["attached"] == true),
        json!(age(&text(&o["metadata"]["creationTimestamp"]))),
    ]
}

/// A column of a CRD's `additionalPrinterColumns`: its name, its type,
/// and the field it shows (its `jsonPath`, split).
type PrinterColumn = (&'static str, &'static str, &'static [&'static str]);

/// external-snapshotter's VolumeSnapshot CRD's columns.
const VOLUME_SNAPSHOT_COLUMNS: &[PrinterColumn] = &[
    ("ReadyToUse", "boolean", &["status", "readyToUse"]),
    (
        "SourcePVC",
        "string",
        &["spec", "source", "persistentVolumeClaimName"],
    ),
    (
        "SourceSnapshotContent",
        "string",
        &["spec", "source", "volumeSnapshotContentName"],
    ),
    ("RestoreSize", "string", &["status", "restoreSize"]),
    (
        "SnapshotClass",
        "string",
        &["spec", "volumeSnapshotClassName"],
    ),
    (
        "SnapshotContent",
        "string",
        &["status", "boundVolumeSnapshotContentName"],
    ),
    ("CreationTime", "date", &["status", "creationTime"]),
    ("Age", "date", &["metadata", "creationTimestamp"]),
];

/// external-snapshotter's VolumeSnapshotContent CRD's columns.
const VOLUME_SNAPSHOT_CONTENT_COLUMNS: &[PrinterColumn] = &[
    ("ReadyToUse", "boolean", &["status", "readyToUse"]),
    ("RestoreSize", "integer", &["status", "restoreSize"]),
    ("DeletionPolicy", "string", &["spec", "deletionPolicy"]),
    ("Driver", "string", &["spec", "driver"]),
    (
        "VolumeSnapshotClass",
        "string",
        &["spec", "volumeSnapshotClassName"],
    ),
    (
        "VolumeSnapshot",
        "string",
        &["spec", "volumeSnapshotRef", "name"],
    ),
    (
        "VolumeSnapshotNamespace",
        "string",
        &["spec", "volumeSnapshotRef", "namespace"],
    ),
    ("Age", "date", &["metadata", "creationTimestamp"]),
];

/// external-snapshotter's VolumeSnapshotClass CRD's columns.
const VOLUME_SNAPSHOT_CLASS_COLUMNS: &[PrinterColumn] = &[
    ("Driver", "string", &["driver"]),
    ("DeletionPolicy", "string", &["deletionPolicy"]),
    ("Age", "date", &["metadata", "creationTimestamp"]),
];

/// The Name column, then `columns`.
fn printer_columns(columns: &[PrinterColumn]) -> Vec<Value> {
    let mut out = vec![column("Name", "string", 0)];
    out.extend(columns.iter().map(|(name, kind, _)| column(name, kind, 0)));
    out
}

/// A custom resource's row as kube-apiserver prints it from its CRD's
/// columns: the name, then each column's field; `null` where the field is
/// missing or not of the column's type (kubectl leaves the cell empty),
/// a date as an age, and any value of a string column as text.
fn printer_row(o: &Value, columns: &[PrinterColumn]) -> Vec<Value> {
    let mut cells = vec![o["metadata"]["name"].clone()];
    for (_, kind, path) in columns {
        let value = path.iter().fold(o, |v, field| &v[field]);
        cells.push(match (*kind, value) {
            (_, Value::Null) => Value::Null,
            ("string", Value::String(_)) => value.clone(),
            ("string", other) => json!(other.to_string()),
            ("date", Value::String(at)) => json!(age(at)),
            ("boolean", Value::Bool(_)) => value.clone(),
            ("integer", Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, |i| json!(i)),
            _ => Value::Null,
        });
    }
    cells
}

/// Turns an object into its row's cells.
type Row = fn(&Value) -> Vec<Value>;

/// What each row carries of its object (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Include {
    /// Nothing.
    None,
    /// Its metadata, as a `PartialObjectMetadata` (the default).
    Metadata,
    /// All of it: kubectl asks for this to sort (`--sort-by`).
    Object,
}

impl Include {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// The Table of `items` of `resource`.
pub fn table(
    resource: &Resource,
    items: &[Value],
    resource_version: &str,
    include: Include,
) -> Value {
    let (columns, row): (Vec<Value>, Row) = match (resource.group, resource.kind) {
        ("", "Node") => (
            vec![
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Roles", "string", 0),
                column("Age", "string", 0),
                column("Version", "string", 0),
                column("Internal-IP", "string", 1),
                column("External-IP", "string", 1),
            ],
            node_row,
        ),
        ("", "Service") => (
            vec![
                column("Name", "string", 0),
                column("Type", "string", 0),
                column("Cluster-IP", "string", 0),
                column("External-IP", "string", 0),
                column("Port(s)", "string", 0),
                column("Age", "string", 0),
                column("Selector", "string", 1),
            ],
            service_row,
        ),
        ("", "Event") => (
            vec![
                column("Last Seen", "string", 0),
                column("Type", "string", 0),
                column("Reason", "string", 0),
                column("Object", "string", 0),
                column("Subobject", "string", 1),
                column("Source", "string", 1),
                column("Message", "string", 0),
                column("First Seen", "string", 1),
                column("Count", "string", 1),
                column("Name", "string", 1),
            ],
            event_row,
        ),
        ("certificates.k8s.io", "CertificateSigningRequest") => (
            vec![
                column("Name", "string", 0),
                column("Age", "string", 0),
                column("SignerName", "string", 0),
                column("Requestor", "string", 0),
                column("RequestedDuration", "string", 0),
                column("Condition", "string", 0),
            ],
            csr_row,
        ),
        ("apiregistration.k8s.io", "APIService") => (
            vec![
                column("Name", "string", 0),
                column("Service", "string", 0),
                column("Available", "string", 0),
                column("Age", "string", 0),
            ],
            api_service_row,
        ),
        ("", "ConfigMap") => (
            vec![
                column("Name", "string", 0),
                column("Data", "integer", 0),
                column("Age", "string", 0),
            ],
            config_map_row,
        ),
        ("", "Pod") => (
            vec![
                column("Name", "string", 0),
                column("Ready", "string", 0),
                column("Status", "string", 0),
                column("Restarts", "string", 0),
                column("Age", "string", 0),
                column("IP", "string", 1),
                column("Node", "string", 1),
                column("Nominated Node", "string", 1),
                column("Readiness Gates", "string", 1),
            ],
            pod_row,
        ),
        ("", "PersistentVolumeClaim") => (
            vec![
                column("Name", "string", 0),
                column("Status", "string", 0),
                column("Volume", "string", 0),
                column("Capacity", "string", 0),
                column("Access Modes", "string", 0),
                column("StorageClass", "string", 0),
                column("VolumeAttributesClass", "string", 0),
                column("Age", "string", 0),
                column("VolumeMode", "string", 1),
            ],
            claim_row,
        ),
        ("", "PersistentVolume") => (
            vec![
                column("Name", "string", 0),
                column("Capacity", "string", 0),
                column("Access Modes", "string", 0),
                column("Reclaim Policy", "string", 0),
                column("Status", "string", 0),
                column("Claim", "string", 0),
                column("StorageClass", "string", 0),
                column("VolumeAttributesClass", "string", 0),
                column("Reason", "string", 0),
                column("Age", "string", 0),
                column("VolumeMode", "string", 1),
            ],
            volume_row,
        ),
        ("storage.k8s.io", "VolumeAttachment") => (
            vec![
                column("Name", "string", 0),
                column("Attacher", "string", 0),
                column("PV", "string", 0),
                column("Node", "string", 0),
                column("Attached", "boolean", 0),
                column("Age", "string", 0),
            ],
            attachment_row,
        ),
        ("snapshot.storage.k8s.io", "VolumeSnapshot") => {
            (printer_columns(VOLUME_SNAPSHOT_COLUMNS), |o| {
                printer_row(o, VOLUME_SNAPSHOT_COLUMNS)
            })
        }
        ("snapshot.storage.k8s.io", "VolumeSnapshotContent") => {
            (printer_columns(VOLUME_SNAPSHOT_CONTENT_COLUMNS), |o| {
                printer_row(o, VOLUME_SNAPSHOT_CONTENT_COLUMNS)
            })
        }
        ("snapshot.storage.k8s.io", "VolumeSnapshotClass") => {
            (printer_columns(VOLUME_SNAPSHOT_CLASS_COLUMNS), |o| {
                printer_row(o, VOLUME_SNAPSHOT_CLASS_COLUMNS)
            })
        }
        _ => (
            vec![column("Name", "string", 0), column("Age", "string", 0)],
            |o| {
                vec![
                    o["metadata"]["name"].clone(),
                    json!(age(&text(&o["metadata"]["creationTimestamp"]))),
                ]
            },
        ),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut r = json!({"cells": row(o)});
            match include {
                Include::None => {}
                Include::Metadata => {
                    r["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]});
                }
                Include::Object => r["object"] = o.clone(),
            }
            r
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// Whether the client asked for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept.contains("as=Table")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot_resource(plural: &str) -> &'static Resource {
        crate::resources::find("snapshot.storage.k8s.io", "v1", plural).unwrap()
    }

    fn names(table: &Value) -> Vec<&str> {
        table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn volume_snapshots_print_the_columns_of_their_crds() {
        let snapshot = json!({
            "metadata": {"name": "db", "namespace": "apps", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "ebs"},
            "status": {"readyToUse": true, "restoreSize": "1Gi", "boundVolumeSnapshotContentName": "snapcontent-1"},
        });
        let printed = table(
            snapshot_resource("volumesnapshots"),
            &[snapshot],
            "7",
            Include::Metadata,
        );
        assert_eq!(
            names(&printed),
            [
                "Name",
                "ReadyToUse",
                "SourcePVC",
                "SourceSnapshotContent",
                "RestoreSize",
                "SnapshotClass",
                "SnapshotContent",
                "CreationTime",
                "Age"
            ]
        );
        let cells = &printed["rows"][0]["cells"];
        assert_eq!(
            cells.as_array().unwrap()[..8],
            [
                json!("db"),
                json!(true),
                json!("data"),
                Value::Null,
                json!("1Gi"),
                json!("ebs"),
                json!("snapcontent-1"),
                Value::Null
            ]
        );
        assert!(cells[8].as_str().unwrap().ends_with('d'), "{cells}");
        assert_eq!(
            printed["rows"][0]["object"]["metadata"]["namespace"],
            "apps"
        );

        let content = json!({
            "metadata": {"name": "snapcontent-1"},
            "spec": {"driver": "ebs.csi.aws.com", "deletionPolicy": "Delete",
                "volumeSnapshotRef": {"name": "db", "namespace": "apps"}},
            "status": {"restoreSize": 1073741824},
        });
        let printed = table(
            snapshot_resource("volumesnapshotcontents"),
            &[content],
            "7",
            Include::None,
        );
        assert_eq!(
            printed["rows"][0]["cells"].as_array().unwrap()[..8],
            [
                json!("snapcontent-1"),
                Value::Null,
                json!(1_073_741_824),
                json!("Delete"),
                json!("ebs.csi.aws.com"),
                Value::Null,
                json!("db"),
                json!("apps")
            ]
        );

        let class = json!({"metadata": {"name": "ebs"}, "driver": "ebs.csi.aws.com", "deletionPolicy": "Delete"});
        let printed = table(
            snapshot_resource("volumesnapshotclasses"),
            &[class],
            "7",
            Include::None,
        );
        assert_eq!(names(&printed), ["Name", "Driver", "DeletionPolicy", "Age"]);
        assert_eq!(
            printed["rows"][0]["cells"].as_array().unwrap()[..3],
            [json!("ebs"), json!("ebs.csi.aws.com"), json!("Delete")]
        );
    }
}
